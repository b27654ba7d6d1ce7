"""Choosing what to show from a Trace: which attention maps it holds, their token labels,
one map (a head or the mean of heads) with or without special tokens. Pure functions, no
Streamlit. (Values from the URL are read by viz/ui/url_state.py's PageState.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from core import trace_names as tn

SPECIAL_TOKENS = {"[CLS]", "[SEP]", "[PAD]", "<pad>", "<start>", "<end>", "<s>", "</s>", "<|endoftext|>",
                  "<|im_start|>", "<|im_end|>"}


@dataclass
class View:
    """Which attention map: stack (encoder|decoder), kind (self_attn|cross_attn), layer, head
    (an int, or None for the average over heads); what: "weights", or "value_norms" (what
    each key adds, ||a_ij v_j W_o^h||)."""

    stack: str
    kind: str
    layer: int
    head: Optional[int]
    what: str = "weights"

    @property
    def name(self) -> str:
        return tn.attn(self.stack, self.layer, self.kind, self.what)

    def label(self) -> str:
        head = "mean of heads" if self.head is None else f"head {self.head}"
        return f"{self.stack} {self.kind.replace('_', '-')} · layer {self.layer} · {head}"


def attention_views(trace) -> List[Tuple[str, str]]:
    """(stack, kind) pairs present in a trace, encoder first."""
    out = []
    for stack in trace.stacks():
        for kind in trace.attention_kinds(stack):
            out.append((stack, kind))
    return out


def axis_tokens(trace, stack: str, kind: str) -> Tuple[List[str], List[str]]:
    """Query and key token labels for a (stack, kind)."""
    if stack == "encoder":
        toks = trace.tokens("source")
        return toks, toks
    tgt = trace.tokens("target")
    return tgt, (trace.tokens("source") if kind == "cross_attn" else tgt)


def attention_matrix(trace, view: View, hide_special: bool = False):
    """(n_q x n_k matrix, query labels, key labels) for a view. With hide_special, rows and
    columns of special tokens are dropped and rows renormalised to sum to 1."""
    w = trace[view.name]  # H x n_q x n_k
    m = w.mean(0) if view.head is None else w[view.head]
    q_toks, k_toks = axis_tokens(trace, view.stack, view.kind)
    if hide_special:
        return drop_special(m, q_toks, k_toks, [t in SPECIAL_TOKENS for t in q_toks],
                            [t in SPECIAL_TOKENS for t in k_toks], renormalise=view.what == "weights")
    return m, q_toks, k_toks


def drop_special(m, q_labels, k_labels, q_special, k_special, renormalise: bool = True):
    """Rows and columns flagged special dropped from an n_q x n_k attention matrix and the rows
    renormalised to sum to 1 (not for value norms: renormalise=False); unchanged when that would
    leave no row or no column."""
    qi = [i for i, sp in enumerate(q_special) if not sp]
    ki = [j for j, sp in enumerate(k_special) if not sp]
    if not (qi and ki):
        return m, list(q_labels), list(k_labels)
    m = m[qi][:, ki]
    if renormalise:
        m = m / m.sum(-1, keepdim=True).clamp_min(1e-12)
    return m, [q_labels[i] for i in qi], [k_labels[j] for j in ki]


def sink_of(trace, view: View):
    """The learned sink's mass of a view's rows (n_q: one head's, or the mean of heads), the
    share of each row's softmax that no key owns (gpt-oss); None where the layer has no
    learned sink or the view is not of attention weights."""
    if view.what != "weights" or view.kind != "self_attn":
        return None
    name = tn.attn(view.stack, view.layer, view.kind, "sink")
    if name not in trace:
        return None
    s = trace[name]  # H x n_q
    return s.mean(0) if view.head is None else s[view.head]


def mask_of(trace, view: View):
    """The view's additive mask (n_q x n_k: 0 or -inf), or None where the trace has none."""
    name = tn.attn(view.stack, view.layer, view.kind, "mask")
    return trace[name] if name in trace else None


POSITION_WORDS = {"rope": "RoPE", "none": "NoPE", "sinusoidal": "sinusoidal", "learned": "learned positions",
                  "relative": "relative bias"}


def layer_note(info: Optional[dict]) -> str:
    """A layer's kind in a few words, from one entry of model.layer_kinds(stack): its mask
    ("causal", "sliding 4", "chunked 5", ...), its positions ("RoPE", "NoPE", ...), a
    learned sink, a scale that varies by position, keys and values read from another layer
    ("keys and values from layer 1", Gemma 4) or values that are the keys ("K = V"), a latent
    ("latent rank 8", DeepSeek V3), a sparse selection ("top-4 keys", V3.2), an output gate
    (Qwen3.5); "" for None."""
    if not info:
        return ""
    parts = [info.get("mask", ""), POSITION_WORDS.get(info.get("positions"), info.get("positions") or "")]
    if info.get("sink"):
        parts.append("learned sink")
    if info.get("scale") == "per position":
        parts.append("scale by position")
    if info.get("shared_kv") is not None:
        parts.append(f"keys and values from layer {info['shared_kv']}")
    if "k = v" in str(info.get("kv", "")):
        parts.append("K = V")
    if info.get("latent"):
        parts.append(str(info["latent"]))
    if str(info.get("selection", "")).startswith("top-k "):
        parts.append(f"top-{info['selection'][6:]} keys")
    if info.get("output_gate"):
        parts.append("output gate")
    return " · ".join(p for p in parts if p)
