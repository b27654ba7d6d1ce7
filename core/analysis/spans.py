"""Attention between spans of a long input, and full-resolution blocks of one head's map,
read a tile of query rows and one head at a time (core/head_maps.py), so no n x n map of more
than one head is held: what Explore's long-document views (sentence x sentence mass, a
clicked block of the overview) ask for.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from ..head_maps import MAPS, TILE_ROWS, _cached, layer_maps, split_name, tileable


def _heads_of(trace, stack: str, heads) -> List[int]:
    n_heads = trace.n_heads(stack)
    heads = list(range(n_heads)) if heads is None else [int(h) for h in ([heads] if isinstance(heads, int) else heads)]
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise IndexError(f"heads {bad} out of range: {stack} has heads 0-{n_heads - 1}")
    return heads


def _row_tiles(trace, name: str, h: int, rows: int = TILE_ROWS):
    """(r0, r1, tile, c0) of head h's weights map `name`: rows r0:r1 over the keys c0 onwards
    that they may see (LayerMaps.narrow), else from the full map of that head (short-context
    cases, c0 = 0)."""
    stack, i, kind, what = split_name(name)
    if tileable(trace, stack, kind) and what == "weights" and not trace.is_stored(name) and not _cached(trace, name):
        lm = layer_maps(trace, stack, i)
        for r0 in range(0, lm.n, rows):
            r1 = min(lm.n, r0 + rows)
            t, _, c0, _ = lm.narrow(h, r0, r1, what)
            yield r0, r1, t, c0
        return
    full = trace[name][h]
    for r0 in range(0, full.shape[0], rows):
        yield r0, min(full.shape[0], r0 + rows), full[r0:r0 + rows], 0


def span_mass(trace, name: str, span_of: Sequence[int], heads=None) -> torch.Tensor:
    """S x S attention mass between spans of tokens (sentences, paragraphs): entry [a, b] is
    the mean over the queries of span a of the weight summed over the keys of span b (rows
    sum to 1), averaged over `heads` (an index, a list, or None for every head). span_of[t]
    is token t's span (0..S-1, non-decreasing). Tile by tile, one head at a time."""
    stack = split_name(name)[0]
    heads = _heads_of(trace, stack, heads)
    ids = torch.as_tensor(list(span_of), dtype=torch.long)
    s = int(ids.max()) + 1 if len(ids) else 0
    out = torch.zeros(s, s, dtype=torch.float64)
    with torch.inference_mode():
        for h in heads:
            for r0, r1, t, c0 in _row_tiles(trace, name, h):
                cols = torch.zeros(r1 - r0, s, dtype=torch.float64).index_add_(1, ids[c0:c0 + t.shape[1]], t.double())
                out.index_add_(0, ids[r0:r1], cols)
    rows = torch.bincount(ids, minlength=s).double().clamp_min(1)
    return out / rows[:, None] / max(1, len(heads))


def block(trace, name: str, rows: Tuple[int, int], cols: Tuple[int, int], heads=None) -> torch.Tensor:
    """The full-resolution block rows[0]:rows[1] x cols[0]:cols[1] of the map `name`, for one
    head or the mean of `heads`: only those query rows are computed (the zoom of an overview)."""
    stack, i, kind, what = split_name(name)
    heads = _heads_of(trace, stack, heads)
    r0, r1 = rows
    c0, c1 = cols
    acc = None
    with torch.inference_mode():
        for h in heads:
            if tileable(trace, stack, kind) and what in MAPS and not trace.is_stored(name) and not _cached(trace, name):
                one = layer_maps(trace, stack, i).tile(h, r0, r1, what)[0][:, c0:c1].double()
            else:
                one = trace[name][h][r0:r1, c0:c1].double()
            acc = one if acc is None else acc + one
    return (acc / len(heads)).float()
