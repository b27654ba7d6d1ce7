"""Long axes made drawable: the one block reduction and the one tick thinner every figure uses.

A token axis longer than a figure's budget is cut into contiguous blocks of f = ⌈n / max⌉
tokens (`blocks`). A matrix is reduced block by block (`block_means`): the mean of each
block's finite cells, or, for attention (`sum_columns=True`), the mean over a block of
queries of the weight summed over a block of keys, so that drawn rows still sum to 1 and
the 0-1 colour scale keeps its meaning. A long tick axis names every k-th label
(`tick_indices`). Pure numpy/torch; downloads always keep the full matrices.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np
import torch

Groups = List[List[int]]


def block_size(n: int, max_side: int) -> int:
    """How many consecutive positions one block holds so that n positions fit in max_side."""
    return max(1, int(math.ceil(n / max(1, max_side))))


def blocks(n: int, max_side: int) -> Groups:
    """Contiguous blocks of positions 0..n-1, as few as keep the count <= max_side."""
    f = block_size(n, max_side)
    return [list(range(i, min(i + f, n))) for i in range(0, n, f)]


def _indicator(n: int, f: int, like: torch.Tensor) -> torch.Tensor:
    """(n, ⌈n/f⌉) matrix with a 1 where position i falls in block b."""
    return (torch.arange(n)[:, None] // f == torch.arange(-(-n // f))[None, :]).to(like.dtype)


def block_means(m, fr: int, fc: int, sum_columns: bool = False):
    """Mean of the finite cells of each fr x fc block of the last two axes of m (..., n_r,
    n_c); -inf where a block has none. A numpy array comes back as float64 numpy, a tensor
    as a tensor of its own floating dtype.

    sum_columns=True: the mean over the block's rows of the sum over its columns, so an
    attention matrix keeps rows that sum to 1 (weight of a block of keys, averaged over a
    block of queries)."""
    is_numpy = not torch.is_tensor(m)
    t = torch.from_numpy(np.asarray(m, dtype=np.float64)) if is_numpy else m
    if not t.is_floating_point():
        t = t.float()
    n_r, n_c = t.shape[-2], t.shape[-1]
    if t.numel() and bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
        # every cell finite (the extremes are): block sums by a reshape of the zero-padded map
        nbr, nbc = -(-n_r // fr), -(-n_c // fc)
        padded = torch.nn.functional.pad(t, (0, nbc * fc - n_c, 0, nbr * fr - n_r))
        s = padded.reshape(*t.shape[:-2], nbr, fr, nbc, fc).sum((-3, -1))
        per_row = torch.full((nbr, 1), float(fr), dtype=t.dtype, device=t.device)
        per_row[-1] = n_r - fr * (nbr - 1)
        per_col = torch.full((1, nbc), float(fc), dtype=t.dtype, device=t.device)
        per_col[0, -1] = n_c - fc * (nbc - 1)
        out = s / (per_row if sum_columns else per_row * per_col)
        return out.numpy() if is_numpy else out
    fin = torch.isfinite(t)
    rows, cols = _indicator(n_r, fr, t), _indicator(n_c, fc, t)
    s = rows.T @ torch.where(fin, t, torch.zeros((), dtype=t.dtype)) @ cols
    per_row = rows.sum(0)[:, None]  # real rows per block
    count = rows.T @ fin.to(t.dtype) @ cols  # finite cells per block
    div = per_row.expand_as(count) if sum_columns else count
    out = torch.where(count > 0, s / div.clamp(min=1), torch.full((), -math.inf, dtype=t.dtype))
    return out.numpy() if is_numpy else out


def reduce_to(m, max_side: int):
    """An attention map (..., n_q, n_k) as at most max_side blocks per side (block_means
    with sum_columns); unchanged when it already fits."""
    n_q, n_k = m.shape[-2], m.shape[-1]
    if max(n_q, n_k) <= max_side:
        return m
    return block_means(m, block_size(n_q, max_side), block_size(n_k, max_side), sum_columns=True)


def tick_indices(n: int, most: int, doubling: bool = False) -> List[int]:
    """Which of n tick labels to show so that at most `most` are: every k-th from the first,
    k = ⌈n / most⌉ (doubling=True: the smallest power of two that fits)."""
    if doubling:
        step = 1
        while n / step > most:
            step *= 2
    else:
        step = block_size(n, most)
    return list(range(0, n, step))


def thinned(labels: Sequence[str], most: int, doubling: bool = False):
    """(tick positions, their labels) of tick_indices."""
    idx = tick_indices(len(labels), most, doubling)
    return idx, [labels[i] for i in idx]
