"""One word in two sentences: pure functions for the Compare page (no Streamlit).

Bishop ch. 12's example: "bank" by a river and "bank" with cash. Chapter 9: cosine similarity
cos(u, v) = u^T v / (|u| |v|), and the difference between a static embedding (one vector
per word, whatever the sentence) and a contextual one (a vector per occurrence).

For a word present in both sentences this module finds its token positions (a word may be
several word pieces, via core.tokens.words), reads its vector at every depth of the stack,

    depth 0       embed.{stack}.sum       the input of layer 0 (token embedding + positions)
    depth i + 1   {stack}.{i}.out         the output of layer i

and compares the two sentences' vectors with the cosine. A word of several pieces is the
MEAN of its pieces' vectors (as core.tokens.words averages a word's query rows). The attention FROM
the word is the mean of its pieces' query rows; read in words, each key word is the SUM of
its pieces' columns, so the weights still sum to 1.

The stack is the encoder for encoder and encoder-decoder models (the typed sentence is the
source) and the decoder for decoder-only models (the prompt is the decoder's input).
"""

from __future__ import annotations

import html
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from core import trace_names as tn
from core.tokens.words import merge_attention, word_groups, word_labels
from viz.figures.heatmaps import CHAR_PX, MAX_LABEL_CHARS, safe_label, to_numpy
from viz.figures.reduce import thinned
from viz.figures.select import SPECIAL_TOKENS
from viz.figures.text import html_text

BANK_A = "I swam across the river to get to the other bank."
BANK_B = "I walked across the road to get cash from the bank."
# toy-translate's vocabulary has bank, river, cash and road; "bank" is word 8 in both.
TOY_A = "the man swims in the river near the bank"
TOY_B = "the man takes the cash at the big bank"
DEFAULT_WORD = "bank"
POSITION_SCHEMES_ADDED = ("learned", "sinusoidal")  # positions added into embed.{stack}.sum

WORD_COLOUR = "#d62728"
OTHER_COLOUR = "#4c78a8"
BASELINE_COLOUR = "#9a9a9a"


IT_A = "The animal didn't cross the street because it was too tired."
IT_B = "The animal didn't cross the street because it was too wide."
TOY_DOG_A = "the small dog sees the cat near the river"
TOY_DOG_B = "the old man sees the dog near the bank"


def default_pair(model_name: str) -> Tuple[str, str, str]:
    """(sentence A, sentence B, word) shown when the page opens with this model."""
    if model_name == "toy-translate":
        return TOY_A, TOY_B, DEFAULT_WORD
    return BANK_A, BANK_B, DEFAULT_WORD


def example_pairs(model_name: str) -> Dict[str, Tuple[str, str, str]]:
    """Example (sentence A, sentence B, word) pairs for a model, by button label."""
    pairs = {"bank: river vs cash (Bishop ch. 12)": (BANK_A, BANK_B, DEFAULT_WORD)}
    if model_name == "toy-translate":
        pairs["bank (toy words)"] = (TOY_A, TOY_B, DEFAULT_WORD)
        pairs["the (toy words)"] = (TOY_DOG_A, TOY_DOG_B, "the")
    else:
        pairs["it: tired vs wide"] = (IT_A, IT_B, "it")
    return pairs


_MD_SPECIAL = set("\\`*_{}[]()#+-.!|<>~$:")


def md_escape(text: str) -> str:
    """User text made literal inside Streamlit Markdown (no emphasis, links, LaTeX or HTML)."""
    return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text)).replace("\n", " ")


# ------------------------------------------------------------------ words of a trace
def normalize(word: str) -> str:
    """The form words are matched in: typed text without surrounding spaces, lower-case,
    accents removed (BERT's tokenizer strips them too)."""
    w = unicodedata.normalize("NFKD", str(word).strip().lower())
    return "".join(ch for ch in w if not unicodedata.category(ch).startswith("M"))


@dataclass
class Word:
    """One typed word of a sentence: its label, matching form, and token positions."""

    index: int  # the word's index among the sentence's words (core.tokens.words groups)
    label: str  # typed text (or the joined pieces)
    key: str  # normalize(label)
    positions: List[int]  # token positions of its pieces
    pieces: List[str] = field(default_factory=list)  # the piece strings
    special: bool = False  # [CLS], [SEP], <start>, ... (never matched)


def stack_of(trace) -> str:
    """The stack that reads the typed sentence: 'encoder' unless the model is decoder-only."""
    return "encoder" if "encoder" in trace.stacks() else "decoder"


def stack_tokens(trace, stack: Optional[str] = None) -> List[str]:
    stack = stack or stack_of(trace)
    return trace.tokens("source") if stack == "encoder" else trace.tokens("target")


def is_word_like(key: str) -> bool:
    """A word worth comparing: it has a letter or a digit (not bare punctuation)."""
    return any(ch.isalnum() for ch in key)


def sentence_words(trace, text: Optional[str] = None, stack: Optional[str] = None) -> List[Word]:
    """The typed words of the sentence a trace was run on, in order, from the tokenizer's
    word ids (core.tokens.words.word_groups); `text` gives labels in the typed spelling."""
    stack = stack or stack_of(trace)
    tokens = stack_tokens(trace, stack)
    meta = trace.meta
    special = list(meta.get("special") or [])
    groups = word_groups(meta.get("word_ids") or [], len(tokens), special)
    labels = word_labels(groups, tokens, meta.get("offsets"), text)
    out = []
    for g, (pos, label) in enumerate(zip(groups, labels)):
        is_special = len(pos) == 1 and (
            (pos[0] < len(special) and special[pos[0]])
            or pos[0] >= len(special)
            or tokens[pos[0]] in SPECIAL_TOKENS
        )
        out.append(Word(g, label, normalize(label), list(pos), [tokens[p] for p in pos], is_special))
    return out


def occurrences(words: Sequence[Word], word: str) -> List[Word]:
    """Every occurrence of `word` (matched after normalize) among a sentence's words."""
    key = normalize(word)
    return [w for w in words if not w.special and w.key == key]


def common_words(words_a: Sequence[Word], words_b: Sequence[Word]) -> List[str]:
    """Words (normalized) present in both sentences, in their order in sentence A, each once."""
    in_b = {w.key for w in words_b if not w.special}
    seen, out = set(), []
    for w in words_a:
        if not w.special and w.key in in_b and w.key not in seen and is_word_like(w.key):
            seen.add(w.key)
            out.append(w.key)
    return out


def context_label(words: Sequence[Word], word: Word, width: int = 2) -> str:
    """A short window of words around an occurrence, e.g. 'the river near [the] bank'."""
    lo, hi = max(0, word.index - width), min(len(words), word.index + width + 1)
    parts = []
    for w in words[lo:hi]:
        if w.special:
            continue
        parts.append(f"[{w.label.strip()}]" if w.index == word.index else w.label.strip())
    return " ".join(parts)


# ------------------------------------------------------------------ vectors and cosines
def depth_names(trace, stack: Optional[str] = None) -> List[str]:
    """embed.{stack}.sum, then {stack}.{i}.out for every layer."""
    stack = stack or stack_of(trace)
    return [tn.embed(stack, "sum")] + [tn.out(stack, i) for i in range(trace.layers(stack))]


def depth_labels(n_layers: int) -> List[str]:
    return ["embedding"] + [f"layer {i}" for i in range(n_layers)]


def word_vector(trace, name: str, positions: Sequence[int]) -> torch.Tensor:
    """The word's vector in tensor `name` (n x d): the mean over its pieces' rows."""
    x = trace[name]  # (n, d)
    return x[list(positions)].double().mean(0)  # (d,)


def cosine(u: torch.Tensor, v: torch.Tensor) -> float:
    """u^T v / (|u| |v|) (Chapter 9, eq. 9.1); 0 when either vector is zero."""
    u, v = u.double(), v.double()
    den = float(u.norm() * v.norm())
    return float(u @ v) / den if den > 0 else 0.0


def cosine_table(trace_a, word_a: Word, trace_b, word_b: Word,
                 words_b: Optional[Sequence[Word]] = None) -> pd.DataFrame:
    """One row per depth: depth (0 = embedding), label, trace name, the cosine of the word's
    vectors in A and B, their norms, and (when words_b is given) the baseline: the mean
    cosine between A's word and B's OTHER words (specials and the word itself left out)."""
    stack = stack_of(trace_a)
    if stack_of(trace_b) != stack:
        raise ValueError("the two traces come from different kinds of model")
    names = depth_names(trace_a, stack)
    labels = depth_labels(len(names) - 1)
    others = [w for w in (words_b or []) if not w.special and w.key != word_b.key and is_word_like(w.key)]
    rows = []
    for depth, (name, label) in enumerate(zip(names, labels)):
        u = word_vector(trace_a, name, word_a.positions)
        v = word_vector(trace_b, name, word_b.positions)
        row = {"depth": depth, "where": label, "trace name": name, "cosine": cosine(u, v),
               "|A|": float(u.norm()), "|B|": float(v.norm())}
        if words_b is not None:
            row["baseline"] = (float(np.mean([cosine(u, word_vector(trace_b, name, w.positions)) for w in others]))
                               if others else float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


def token_embedding_cosine(trace_a, word_a: Word, trace_b, word_b: Word) -> Optional[float]:
    """The cosine of the token embeddings alone (embed.{stack}.tokens, no positions)."""
    name = tn.embed(stack_of(trace_a), "tokens")
    if name not in trace_a or name not in trace_b:
        return None
    return cosine(word_vector(trace_a, name, word_a.positions), word_vector(trace_b, name, word_b.positions))


def positions_added(trace) -> bool:
    """Whether positional encodings are added into embed.{stack}.sum (not RoPE / none)."""
    return (trace.meta.get("config") or {}).get("positional") in POSITION_SCHEMES_ADDED


def input_note(trace_a, word_a: Word, trace_b, word_b: Word, cos0: float) -> str:
    """Why the two input vectors (depth 0) are or are not identical, as Markdown (user text escaped)."""
    word = md_escape(word_a.label.strip())
    same_pieces = word_a.pieces == word_b.pieces
    same_pos = word_a.positions == word_b.positions
    tok_cos = token_embedding_cosine(trace_a, word_a, trace_b, word_b)
    if not same_pieces:
        pa, pb = (md_escape(" ".join(map(repr, w.pieces))) for w in (word_a, word_b))
        return (f"“{word}” is tokenized differently in the two sentences ({pa} vs {pb}), so even the input vectors "
                f"differ (cosine {cos0:.4f}).")
    if not positions_added(trace_a):
        scheme = (trace_a.meta.get("config") or {}).get("positional", "none")
        return (f"Same token(s), so the same input vector: cosine {cos0:.6f} at the embedding layer. This model adds "
                f"no position vector to its input ({scheme}; RoPE rotates q and k inside attention instead), so the "
                "input is identical wherever the word stands.")
    if same_pos:
        return (f"Same token(s) at the same position ({', '.join(map(str, word_a.positions))}), so the input vector "
                f"is identical: cosine {cos0:.6f} at the embedding layer — a static embedding, one vector per word.")
    extra = f" The token embeddings alone are identical (cosine {tok_cos:.6f})." if tok_cos is not None else ""
    return (f"“{word}” stands at different positions (A: {', '.join(map(str, word_a.positions))}, B: "
            f"{', '.join(map(str, word_b.positions))}), and this model adds a position vector to each token, so the "
            f"input vectors differ slightly (cosine {cos0:.4f}).{extra}")


# ------------------------------------------------------------------ attention from the word
def attention_from(trace, word: Word, layer: int, head: Optional[int], words: Optional[Sequence[Word]] = None,
                   stack: Optional[str] = None) -> Tuple[np.ndarray, List[str], List[int]]:
    """The attention FROM `word` in self-attention of `layer` (one head, or the mean over
    heads when head is None): (weights over keys, key labels, indices of the word itself).

    Rows of a word's pieces are averaged; with `words` (the sentence's words) key pieces
    are summed into their word, so the weights still sum to 1."""
    stack = stack or stack_of(trace)
    w = trace[tn.self_attn(stack, layer, "weights")]  # (H, n_q, n_k)
    m = w.mean(0) if head is None else w[head]  # (n_q, n_k)
    row = m[list(word.positions)].double().mean(0)  # (n_k,)
    if words is None:
        labels = stack_tokens(trace, stack)
        return to_numpy(row).astype(float), list(labels), list(word.positions)
    groups = [w_.positions for w_ in words]
    merged = merge_attention(row[None, :], [[0]], groups)[0]  # (W,)
    return to_numpy(merged).astype(float), [w_.label.strip() or w_.label for w_ in words], [word.index]


def top_attended(weights: Sequence[float], labels: Sequence[str], skip: Sequence[int] = (),
                 k: int = 3) -> List[Tuple[str, float]]:
    """The k most attended keys (label, weight), leaving out the indices in `skip`."""
    order = [int(i) for i in np.argsort(-np.asarray(weights)) if int(i) not in set(skip)]
    return [(labels[i], float(weights[i])) for i in order[:k]]


# ------------------------------------------------------------------ figures
def attention_bar(weights, labels: Sequence[str], highlight: Sequence[int] = (), *, title: str = "",
                  y_max: Optional[float] = None, height: int = 340) -> go.Figure:
    """Attention from one word over a sentence's tokens (or words) as bars; the word itself
    in red. Numeric x with token tick labels, so repeated words keep their own bars."""
    w = np.asarray(weights, dtype=float)
    n = len(w)
    shown = [safe_label(t) for t in labels]
    colours = [WORD_COLOUR if i in set(highlight) else OTHER_COLOUR for i in range(n)]
    idx, text = thinned(shown, 48)
    # Fixed margins that fit the labels (plotly's automargin measures every tick label in the
    # browser and draws the chart again when the margins move), in one constructor call.
    longest = min(MAX_LABEL_CHARS, max((len(html.unescape(t)) for t in text), default=1))
    no_auto = dict(automargin=False, ticklabeloverflow="allow")
    return go.Figure(go.Bar(
        x=list(range(n)), y=w, marker_color=colours, customdata=shown,
        hovertemplate="key %{customdata} (%{x})<br>weight %{y:.4f}<extra></extra>",
    ), layout=dict(
        xaxis=dict(tickvals=idx, ticktext=text, tickangle=-45, **no_auto),
        yaxis=dict(title="attention weight", range=[0, y_max if y_max else max(1e-6, float(w.max()) * 1.1)], **no_auto),
        title=dict(text=title, x=0, font=dict(size=14)), height=height, bargap=0.15,
        margin=dict(l=NUMBER_AXIS_PX, r=10, t=50 if title else 20, b=10 + int(CHAR_PX * longest * 0.71 + 9) + 8)))


NUMBER_AXIS_PX = 75  # a y axis of numbers like 0.25 with its title
TITLE_PX = 22  # an axis title's line


def cosine_figure(table: pd.DataFrame, word: str, *, mark_layer: Optional[int] = None, title: str = "") -> go.Figure:
    """Cosine of the word's vectors (A vs B) at every depth; depth 0 is the input embedding.
    A dashed grey line shows the baseline (A's word vs B's other words) when present."""
    x = table["depth"].tolist()
    word_s = html_text(word)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=x, y=table["cosine"].to_numpy(dtype=float), mode="lines+markers",
        name=f"“{word_s}” in A vs “{word_s}” in B",
        line=dict(color=WORD_COLOUR, width=3), customdata=table["trace name"].tolist(),
        hovertemplate="%{customdata}<br>cosine %{y:.4f}<extra></extra>",
    ))
    if "baseline" in table and table["baseline"].notna().any():
        fig.add_trace(go.Scatter(
            x=x, y=table["baseline"].to_numpy(dtype=float), mode="lines+markers",
            name=f"“{word_s}” in A vs B's other words (mean)", line=dict(color=BASELINE_COLOUR, width=2, dash="dash"),
            hovertemplate="baseline %{y:.4f}<extra></extra>",
        ))
    if mark_layer is not None and 0 <= mark_layer + 1 <= x[-1]:
        fig.add_vline(x=mark_layer + 1, line=dict(color="#555", width=1, dash="dot"),
                      annotation_text=f"layer {mark_layer} (attention above)", annotation_position="bottom right")
    lo = float(np.nanmin(table[[c for c in ("cosine", "baseline") if c in table]].to_numpy(dtype=float)))
    # fixed margins, axes not measured by plotly (see attention_bar); the depth labels are
    # upright while they fit side by side, at -45° beyond
    where = table["where"].tolist()
    slanted = len(where) > 12
    longest = max((len(t) for t in where), default=1)
    labels_px = int(CHAR_PX * longest * 0.71 + 9) if slanted else 18
    no_auto = dict(automargin=False, ticklabeloverflow="allow")
    fig.update_layout(title=dict(text=title, x=0, y=0.98, yanchor="top", font=dict(size=14)), height=440,
                      margin=dict(l=NUMBER_AXIS_PX, r=10, t=90 if title else 50, b=10 + labels_px + TITLE_PX + 8),
                      legend=dict(orientation="h", yanchor="bottom", y=1.03, x=0),
                      xaxis=dict(tickvals=x, ticktext=where, tickangle=-45 if slanted else 0,
                                 title="depth (input of layer 0, then each layer's output)", **no_auto),
                      yaxis=dict(title="cosine similarity", range=[min(0.0, lo - 0.05), 1.05], **no_auto))
    return fig


def table_for_display(table: pd.DataFrame) -> pd.DataFrame:
    """The numbers as shown under the chart (rounded, depth as the index)."""
    cols = [c for c in ("where", "trace name", "cosine", "baseline", "|A|", "|B|") if c in table]
    return table[cols].set_index("where").round(4)


def summary(table: pd.DataFrame) -> Dict[str, float]:
    """The cosine at the input, at the last layer, and its minimum (with where)."""
    cos = table["cosine"].to_numpy(dtype=float)
    i = int(np.argmin(cos))
    return {"input": float(cos[0]), "last": float(cos[-1]), "min": float(cos[i]), "min_at": str(table["where"][i])}
