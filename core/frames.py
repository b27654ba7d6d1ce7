"""Attention maps as long pandas DataFrames: one row per (head, query, key).

`frame(trace, name)` takes any attention name of docs/design.md's table,
`{stack}.{i}.{attn}.scores|scaled|mask|masked|weights`, and returns

    stack, layer, attn, head, query_index, query_token, key_index, key_token, <value>

with stack, layer and attn parsed from the name, and the value column named after what it
holds: `score`, `scaled`, `mask`, `masked` or `weight`. Rows run head by head, then query
by query, then key by key, so `df[value].to_numpy().reshape(H, n_q, n_k)` is the tensor.

`mask` is n_q x n_k (one mask for every head): its rows carry head = -1, so frames of
different names concatenate into one table with the same columns. Masked entries hold -inf
(in `mask` and `masked`), as in the trace.

Query tokens are the target's for the decoder and the source's for the encoder; keys are
the source's for cross-attention and the query side's otherwise.

`frames(trace, names)` concatenates several names into one table (what
`python -m core trace --format csv|parquet` writes); `attention_names(trace, what)` lists
the names of one quantity. Everything is built with numpy (no Python loop over cells).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable, List, Sequence, Tuple

import numpy as np
import pandas as pd

from . import trace_names as tn

# The attention maps of docs/design.md and the column each one's values go in.
VALUE_COLUMNS = {"scores": "score", "scaled": "scaled", "mask": "mask", "masked": "masked", "weights": "weight"}
COLUMNS = ["stack", "layer", "attn", "head", "query_index", "query_token", "key_index", "key_token"]



def _map_name(name: str):
    """The parsed name (core.trace_names.parse) of an attention name frame() takes, else None."""
    try:
        p = tn.parse(name)
    except ValueError:
        return None
    return p if p.part in tn.ATTNS and p.step in VALUE_COLUMNS else None


def parse_name(name: str) -> Tuple[str, int, str, str]:
    """(stack, layer, attn, quantity) of an attention name; ValueError for any other name."""
    p = _map_name(name)
    if p is None:
        raise ValueError(f"{name!r} is not an attention map name: expected "
                         f"{{stack}}.{{layer}}.{{attn}}.{{{'|'.join(VALUE_COLUMNS)}}}, "
                         f"e.g. {tn.self_attn('encoder', 0, 'weights')}")
    return p.stack, p.layer, p.part, p.step


def _axis_tokens(trace, stack: str, attn: str, n_q: int, n_k: int) -> Tuple[List[str], List[str]]:
    """Query and key tokens of a map (the same rule as the app's views)."""
    source, target = list(trace.tokens("source")), list(trace.tokens("target"))
    queries = source if stack == "encoder" else target
    keys = source if (attn == "cross_attn" or stack == "encoder") else queries
    if len(queries) != n_q or len(keys) != n_k:
        raise ValueError(f"{stack}.{attn}: the map is {n_q} x {n_k} but the trace has "
                         f"{len(queries)} query and {len(keys)} key tokens")
    return queries, keys


def frame(trace, name: str) -> pd.DataFrame:
    """One attention name of `trace` as a long DataFrame (see the module docstring)."""
    stack, layer, attn, what = parse_name(name)
    try:
        tensor = trace[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in this trace; its attention names: "
                       f"{', '.join(attention_names(trace, what)[:6]) or 'none'}") from None
    values = tensor.detach().float().cpu().numpy()
    if what == "mask":
        values = values[None]  # 1 x n_q x n_k: one mask for every head
    if values.ndim != 3:
        raise ValueError(f"{name}: expected an H x n_q x n_k map, got shape {tuple(values.shape)}")
    h, n_q, n_k = values.shape
    q_tokens, k_tokens = _axis_tokens(trace, stack, attn, n_q, n_k)
    head, qi, ki = (a.ravel() for a in np.meshgrid(np.arange(h), np.arange(n_q), np.arange(n_k), indexing="ij"))
    if what == "mask":
        head = np.full_like(head, -1)
    n = values.size
    return pd.DataFrame({
        "stack": np.full(n, stack, dtype=object),
        "layer": np.full(n, layer, dtype=np.int64),
        "attn": np.full(n, attn, dtype=object),
        "head": head.astype(np.int64),
        "query_index": qi.astype(np.int64),
        "query_token": np.asarray(q_tokens, dtype=object)[qi],
        "key_index": ki.astype(np.int64),
        "key_token": np.asarray(k_tokens, dtype=object)[ki],
        VALUE_COLUMNS[what]: values.ravel(),
    })


def _all_attention_names(trace) -> List[str]:
    """Every attention name of the trace, in its order. Read from `trace.names()`; a trace
    that lists only what it stores is asked name by name for each stack, layer and kind."""
    found = [n for n in trace.names() if _map_name(n) is not None]
    if found:
        return found
    every = (tn.attn(stack, i, attn, what) for stack in trace.stacks() for i in range(trace.layers(stack))
             for attn in tn.ATTNS for what in VALUE_COLUMNS)
    return [n for n in every if n in trace]


def attention_names(trace, what: str = "weights") -> List[str]:
    """Every attention name of one quantity (`weights`, `scores`, ...) in a trace, in order."""
    if what not in VALUE_COLUMNS:
        raise ValueError(f"unknown attention quantity {what!r}; one of {', '.join(VALUE_COLUMNS)}")
    return [n for n in _all_attention_names(trace) if n.endswith("." + what)]


def select_names(trace, patterns: Sequence[str]) -> List[str]:
    """Attention names matching any of `patterns` (exact names or shell-style wildcards such
    as `decoder.*.cross_attn.weights`), in the trace's order. ValueError when one pattern
    matches nothing."""
    every = _all_attention_names(trace)
    chosen = []
    for pat in patterns:
        hits = [n for n in every if fnmatchcase(n, pat)]
        if not hits:
            if not any(c in pat for c in "*?["):
                parse_name(pat)  # a plain name that is no attention name: say what one looks like
            raise ValueError(f"{pat!r} matches no attention name of this trace "
                             f"(e.g. {', '.join(every[:4])})")
        chosen += [n for n in hits if n not in chosen]
    return [n for n in every if n in chosen]


def frames(trace, names: Iterable[str]) -> pd.DataFrame:
    """Several attention names in one long DataFrame. Names of different quantities give a
    column per quantity, empty (NaN) on the other quantities' rows."""
    parts = [frame(trace, n) for n in names]
    if not parts:
        raise ValueError("no attention names to put in a table")
    return pd.concat(parts, ignore_index=True)
