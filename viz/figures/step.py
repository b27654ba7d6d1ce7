"""One step of the Inside page: the `Step` record (a real tensor with its formula in both
notations of the lecture notes, its explanation and its shape), the two notations, and
the small helpers every step list uses. The step lists are in viz/figures/steps.py (a layer) and
viz/figures/head_steps.py (one attention head).

Notation. Seeds 000, 001, 003 and 004 put tokens in ROWS: X is n x d, Q = X W_q,
A = softmax(Q K^T / sqrt(d_k)), head = A V. Seed 002 puts tokens in COLUMNS: X is d x n,
Q = W_q^T X, Z = V softmax(. / sqrt(p)) with p = d_k. Every matrix is stored here in the
row form (the core's); the column form of a picture is its transpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from viz.figures.heatmaps import to_numpy

ROWS, COLS = "rows", "cols"
NOTATIONS = {
    ROWS: "tokens as rows (seeds 000/001/003/004)",
    COLS: "tokens as columns (seed 002)",
}
KIND_TEXT = {"self_attn": "self-attention", "cross_attn": "cross-attention"}


@dataclass
class Step:
    """One picture of the pipeline. `matrix` is in the row form (tokens first)."""

    key: str  # unique within a pipeline, e.g. "q", "scores", "weights"
    group: str  # section it belongs to
    title: str
    matrix: Optional[np.ndarray]  # None: a text-only step (e.g. "no positional vector here")
    name: Optional[str] = None  # the Trace name it comes from (None if computed here)
    latex_rows: str = ""
    latex_cols: str = ""
    explain: str = ""
    dims: Tuple[str, str] = ("n", "d")  # symbols of the row-form shape
    axes: Tuple[str, str] = ("token", "feature")  # what the row-form axes index
    row_labels: List[str] = field(default_factory=list)
    col_labels: List[str] = field(default_factory=list)
    style: str = "signed"  # signed | attention | mask | angle | softcap
    value_name: str = "value"
    extra: dict = field(default_factory=dict)  # what a style needs beside the matrix (softcap: scaled, cap, mask)

    def latex(self, notation: str = ROWS) -> str:
        """The formula, centred lines: parts separated by ',\\quad' (or a top-level '\\\\')
        go on separate lines so that narrow columns fit."""
        tex = self.latex_cols if notation == COLS and self.latex_cols else self.latex_rows
        if not tex:
            return ""
        return r"\begin{gathered} " + r" \\ ".join(tex.split(r",\quad ")) + r" \end{gathered}"

    def shape(self, notation: str = ROWS) -> Tuple[int, int]:
        r, c = self.matrix.shape
        return (c, r) if notation == COLS else (r, c)

    def shape_latex(self, notation: str = ROWS) -> str:
        """E.g. 'n \\times d_k = 6 \\times 32' (swapped in column notation)."""
        a, b = self.dims if notation == ROWS else self.dims[::-1]
        if self.matrix is None:
            return ""
        r, c = self.shape(notation)
        return rf"{a} \times {b} = {r} \times {c}"



# ------------------------------------------------------------------ small helpers
def kv_head(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The key/value head that query head `head` reads under grouped-query attention."""
    return head // (n_heads // n_kv_heads)


def mask_kind(mask) -> str:
    """'none' (all 0), 'causal' (-inf exactly above the diagonal), 'padding' (-inf in whole
    key columns), 'causal+padding' or 'custom'."""
    m = to_numpy(mask)
    blocked = np.isneginf(m)
    if not blocked.any():
        return "none"
    n_q, n_k = m.shape
    q_pos = np.arange(n_k - n_q, n_k)[:, None]
    causal = np.arange(n_k)[None, :] > q_pos
    if np.array_equal(blocked, causal):
        return "causal"
    cols = blocked.all(0)
    if np.array_equal(blocked, np.broadcast_to(cols, blocked.shape)):
        return "padding"
    if np.array_equal(blocked, causal | cols[None, :]):
        return "causal+padding"
    return "custom"


def feature_labels(n: int, prefix: str = "") -> List[str]:
    return [f"{prefix}{j}" for j in range(n)]
