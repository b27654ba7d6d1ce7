"""What heads do: each head of a model scored on standard patterns (core.analysis.head_scores).

Only self-attention maps are read (`{stack}.{i}.self_attn.weights`), one layer at a time; past
core.head_maps.LONG_LAYER_BYTES the text's scores come from the tile-by-tile head profiles."""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch

from . import _checks as checks
from ..head_maps import TILE_ROWS, layer_summary, long_layer
from ..net.recorder import Recorder
from .. import trace_names as tn

SCORES = ("previous_token", "first_token", "self", "induction", "duplicate_token")
DEFAULT_SENTENCE = "The quick brown fox jumps over the lazy dog because the dog was lazy and the fox was quick."
REPEAT_LENGTH = 20  # R: random tokens per copy of the induction sequence
_SPECIAL = re.compile(r"^(<[^<>\s]*>|\[[^\[\]\s]*\]|<\|[^|]*\|>)$")  # <pad>, [CLS], [unused3], <|im_end|>


# ------------------------------------------------------------------ per-map scores
def _diag_mean(w: torch.Tensor, offset: int, rows: Sequence[int]) -> np.ndarray:
    """Mean over query rows i in `rows` of w[:, i, i + offset] (H x n x n -> H)."""
    rows = [i for i in rows if 0 <= i + offset < w.shape[-1]]
    if not rows:
        return np.full(w.shape[0], np.nan)
    idx = torch.tensor(rows)
    return w[:, idx, idx + offset].double().mean(-1).numpy()


def map_scores(w) -> dict:
    """previous_token, first_token and self of one layer's H x n x n self-attention weights."""
    w = torch.as_tensor(w).float()
    n = w.shape[-1]
    later = range(1, n)
    first = w[:, 1:, 0].double().mean(-1).numpy() if n > 1 else np.full(w.shape[0], np.nan)
    return {"previous_token": _diag_mean(w, -1, later), "first_token": first, "self": _diag_mean(w, 0, range(n))}


def repeat_scores(w, start: int, r: int) -> dict:
    """induction and duplicate_token of one layer's H x n x n weights on a sequence whose
    second copy of r random tokens occupies positions start .. start + r - 1."""
    w = torch.as_tensor(w).float()
    second = range(start, start + r)
    return {"induction": _diag_mean(w, 1 - r, second), "duplicate_token": _diag_mean(w, -r, second)}


# ------------------------------------------------------------------ the random repeat
def ordinary_ids(tokenizer, exclude: Iterable[Optional[int]] = ()) -> np.ndarray:
    """Ids of the tokenizer's ordinary vocabulary: every id but control tokens
    (tokenizer.control_ids), the ids in `exclude` and tokens spelled like markers
    (<pad>, [CLS], [unused7], <|im_end|>) or empty."""
    bad = {int(i) for i in exclude if i is not None} | {int(i) for i in getattr(tokenizer, "control_ids", ())}
    keep = []
    for i in range(len(tokenizer)):
        if i in bad:
            continue
        s = tokenizer.token_str(i)
        if s and s.strip() and not _SPECIAL.match(s.strip()):
            keep.append(i)
    return np.array(keep, dtype=np.int64)


def _added_specials(model) -> Tuple[List[int], List[int]]:
    """The special ids the tokenizer puts before and after any text by itself ([CLS] ... [SEP])."""
    enc = model.tokenizer.encode("a")
    special = list(enc.special)
    lead = 0
    while lead < len(special) and special[lead]:
        lead += 1
    trail = 0
    while trail < len(special) - lead and special[len(special) - 1 - trail]:
        trail += 1
    ids = list(enc.ids)
    return ids[:lead], ids[len(ids) - trail:]


def repeated_sequence(model, r: int = REPEAT_LENGTH, seed: int = 0) -> dict:
    """The seeded random sequence for induction/duplicate scores, per stack.

    Returns {stack: (ids, start)}: ids = prefix + x + x (+ suffix), x being r ids drawn
    uniformly (with a torch.Generator seeded with `seed`) from the ordinary vocabulary of
    the stack's tokenizer; start is the position of the second copy's first token. The
    prefix/suffix are the special tokens the model's tokenizer adds around any text
    ([CLS] / [SEP]) and, for an encoder-decoder's decoder, its <start>."""
    gen = torch.Generator().manual_seed(int(seed))
    out = {}
    specials = (model.start_id, model.end_id, model.config.pad_id)

    def draw(tokenizer):
        pool = ordinary_ids(tokenizer, specials)
        if len(pool) == 0:
            raise ValueError("the tokenizer has no ordinary tokens to draw from")
        return pool[torch.randint(len(pool), (r,), generator=gen).numpy()].tolist()

    if model.config.has_encoder:
        lead, trail = _added_specials(model)
        x = draw(model.tokenizer)
        out["encoder"] = (lead + x + x + trail, len(lead) + r)
    if model.config.has_decoder:
        if model.kind == "encoder-decoder":
            lead = [model.start_id]
            x = draw(model.target_tokenizer)
        else:
            lead, _ = _added_specials(model)
            x = draw(model.tokenizer)
        out["decoder"] = (lead + x + x, len(lead) + r)
    return out


def ids_text(tokenizer, ids: Sequence[int]) -> str:
    """The text a sequence of ordinary ids spells (what one would type to get them back)."""
    ids = [int(i) for i in ids]
    if hasattr(tokenizer, "decode_text"):
        return tokenizer.decode_text(ids)
    if hasattr(tokenizer, "_tk"):  # a tokenizers.Tokenizer read from the checkpoint (WordPiece, ...)
        return tokenizer._tk.decode(ids, skip_special_tokens=True)
    return " ".join(tokenizer.decode(ids))  # whole words


def repeated_text(model, stack: Optional[str] = None, r: int = REPEAT_LENGTH, seed: int = 0) -> dict:
    """The repeated sequence of `stack` (default: the model's first) as text, to open it where a
    text is typed: {'stack', 'text', 'ids' (the scored ids), 'start', 'r', 'same_ids' (whether
    the text re-tokenises to exactly those ids), 'why' (when it does not, or no text exists)}.
    The text spells the 2r random tokens without the special tokens the tokenizer adds itself;
    an encoder-decoder's decoder repeat is target-side tokens, which no source text gives."""
    seqs = repeated_sequence(model, r, seed)
    stack = stack or next(iter(seqs))
    ids, start = seqs[stack]
    out = {"stack": stack, "text": None, "ids": ids, "start": start, "r": r, "same_ids": False, "why": ""}
    if model.kind == "encoder-decoder" and stack == "decoder":
        out["why"] = "the decoder's repeat is of target tokens after <start>, which no typed source text gives"
        return out
    out["text"] = ids_text(model.tokenizer, ids[start - r:start + r])
    got = list(model.tokenizer.encode(out["text"]).ids)
    out["same_ids"] = got == list(ids)
    if not out["same_ids"]:
        out["why"] = (f"the text re-tokenises to {len(got)} tokens that differ from the {len(ids)} scored ones "
                      "(neighbouring random pieces merge), so scores read on it differ")
    return out


@torch.inference_mode()
def _repeat_weights(model, seqs: dict) -> dict:
    """{name: H x n x n} self-attention weights of every layer on the repeated sequences."""
    cfg = model.config
    names = []
    for stack in seqs:
        n_layers = cfg.n_layers if stack == "encoder" or cfg.kind == "decoder" else cfg.n_decoder_layers
        names += [tn.self_attn(stack, i, "weights") for i in range(n_layers)]
    rec = Recorder(names=names)

    def ids(stack):
        return torch.tensor([seqs[stack][0]], dtype=torch.long, device=model.device)

    src = ids("encoder") if "encoder" in seqs else None
    tgt = ids("decoder") if "decoder" in seqs else None
    model.net(src, tgt, rec=rec)
    return {k: v.detach().float().cpu() for k, v in rec.tensors.items()}


# ------------------------------------------------------------------ head scores
def head_scores(model, text: Optional[str] = None, r: int = REPEAT_LENGTH, seed: int = 0,
                trace=None) -> pd.DataFrame:
    """One row per (stack, layer, head) of self-attention, with these scores (A is the
    head's softmax weights, rows = queries i, columns = keys j, positions from 0):

    - previous_token: mean over query positions i >= 1 of A[i, i-1];
    - first_token: mean over i >= 1 of A[i, 0] (attention to the first token, the "sink");
    - self: mean over all i of A[i, i];
    - induction: on a sequence of r random tokens x repeated twice (seeded; see
      repeated_sequence), mean over the positions i of the second copy of A[i, i-r+1]: the
      token after the current token's earlier occurrence (Olsson et al. 2022);
    - duplicate_token: on the same sequence, mean over the second copy of A[i, i-r]: the
      current token's earlier occurrence.

    previous_token, first_token and self are read on `text` (DEFAULT_SENTENCE when None;
    or on `trace`, a trace the caller already has of it); induction and duplicate_token on
    the random repeat, drawn from the model's ordinary vocabulary without special tokens.
    For an encoder-decoder the decoder's rows are read on its target side (the greedy
    translation of `text`, and a repeat of random target tokens after <start>). Cross-attention
    is not scored. Scores with no query position to average over (a one-token text) are NaN.
    """
    r = checks.whole(r, "r (the repeated sequence's length)", lo=1)
    if trace is None:
        trace = model.trace(DEFAULT_SENTENCE if text is None else text)
    seqs = repeated_sequence(model, r, seed)
    rep = _repeat_weights(model, seqs)
    rows = []
    for stack in trace.stacks():
        if stack not in seqs:
            continue
        start = seqs[stack][1]
        for i in range(trace.layers(stack)):
            name = tn.self_attn(stack, i, "weights")
            if name not in trace:  # a token mixer's layer (core/net/mixer.py): no softmax heads to score
                continue
            if long_layer(trace, stack):  # from the tiles, one head at a time (core/head_maps.py)
                prof = layer_summary(trace, stack, i, TILE_ROWS)[1]
                scores = {"previous_token": np.array(prof["previous"]), "first_token": np.array(prof["first_later"]),
                          "self": np.array(prof["self"])}
            else:
                scores = map_scores(trace[name])
            scores.update(repeat_scores(rep[name], start, r))
            for h in range(len(scores["self"])):
                rows.append({"stack": stack, "layer": i, "head": h, **{s: float(scores[s][h]) for s in SCORES}})
    return pd.DataFrame(rows, columns=["stack", "layer", "head", *SCORES])


def top_heads(scores: pd.DataFrame, score: str, k: int = 5) -> pd.DataFrame:
    """The k heads with the highest `score` (stack, layer, head, score)."""
    return scores.nlargest(checks.whole(k, "k (heads)", lo=0), score)[["stack", "layer", "head", score]].reset_index(drop=True)
