"""The Playground's computations and figures: pure functions, no Streamlit.

1. attention by hand (Transformers handout's appendix, "help me!")
2. parameter-free self-attention Y = softmax(X X^T) X (Bishop ch. 12)
3. symmetric softmax(X U U^T X^T) vs learned W_q != W_k attention (Missaoui)
4. why scores are scaled: Var(q.k) = d_k (Missaoui)
5. hyper-parameters d, d_k, m, H, L and the parameter count (Chapter 9)
6. measured cost against O(N^2 D) + O(N D^2) (Missaoui)

All attention goes through core.scaled_dot_product_attention with a record callback. The
parameter count and the timed forward passes of parts 5 and 6 are core's (core/net/cost.py);
they are re-exported here under the names the Playground page uses.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

import core
from core import trace_names as tn
from core.net.cost import (  # noqa: F401
    cost_grid, cost_model, fit_cost, layer_formula, meta_model, param_formula, weight_shapes,
)
from viz.figures.heatmaps import fix_margins

# ================================================================== 1. attention by hand
D_K_HAND = 16
HAND_TOKENS = ["help", "me"]
LABEL = "token"  # the text column that names each row; every other column is a number


def help_me_example() -> Dict[str, pd.DataFrame]:
    """Q, K, V for "help me!" with d_k = 16 and q1.k1 = 6, q1.k2 = 4, q2.k1 = 3, q2.k2 = 8.

    Construction: the keys mark features. k1 is 1 on features 1-6, k2 is 1 on features 7-10,
    both 0 on 11-16. A query's dot product with a key is then the sum of its entries on that
    key's features: q1 = 1 on features 1-10 gives 6 and 4; q2 = 0.5 on 1-6 and 2 on 7-10 gives
    3 and 8. Every entry is exact in binary floating point, so the scores are exactly 6, 4, 3, 8.
    The values are illustrative: v1 = (1, 0, 1), v2 = (0, 1, 1); the third column of A is then
    the row sum of S, always 1.
    """
    cols = [str(c) for c in range(1, D_K_HAND + 1)]
    k1 = [1.0] * 6 + [0.0] * 10
    k2 = [0.0] * 6 + [1.0] * 4 + [0.0] * 6
    q1 = [1.0] * 10 + [0.0] * 6
    q2 = [0.5] * 6 + [2.0] * 4 + [0.0] * 6

    def frame(prefix, rows, columns):
        df = pd.DataFrame(rows, columns=columns)
        df.insert(0, LABEL, [f"{prefix}{i + 1} ({t})" for i, t in enumerate(HAND_TOKENS)])
        return df

    return {"Q": frame("q", [q1, q2], cols), "K": frame("k", [k1, k2], cols),
            "V": frame("v", [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], ["1", "2", "3"])}


MAX_URL_ROWS, MAX_URL_COLS = 64, 64  # a matrix in the URL: at most this many rows and numeric columns


def frame_to_url(df: pd.DataFrame) -> str:
    """A Q, K or V table as the URL keeps it: JSON rows [label, x1, x2, ...], an empty cell as
    null. frame_from_url reads it back."""
    import json

    num = [c for c in df.columns if c != LABEL]
    rows = []
    for r in range(len(df)):
        label = df[LABEL].iloc[r] if LABEL in df.columns else None
        cells = [_cell(df[c].iloc[r]) for c in num]
        rows.append([label if isinstance(label, str) else None] + cells)
    return json.dumps(rows, separators=(",", ":"), ensure_ascii=False)


def _cell(value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return (int(v) if v.is_integer() and abs(v) < 2**53 else v) if math.isfinite(v) else None


def frame_from_url(raw: str) -> pd.DataFrame:
    """The table frame_to_url wrote (columns: the label, then "1".."n"). Raises ValueError
    saying what is wrong with it."""
    import json

    try:
        rows = json.loads(raw)
    except (TypeError, ValueError):
        raise ValueError("it is not a table (JSON rows [label, numbers…])") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and len(r) >= 2 for r in rows):
        raise ValueError("it is not a table (JSON rows [label, numbers…], each with a number)")
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise ValueError("its rows differ in length")
    if len(rows) > MAX_URL_ROWS or width - 1 > MAX_URL_COLS:
        raise ValueError(f"it is larger than {MAX_URL_ROWS} rows × {MAX_URL_COLS} columns")
    labels = [r[0] if isinstance(r[0], str) else None for r in rows]
    cells = [[_cell(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in r[1:]]
             for r in rows]
    df = pd.DataFrame(cells, columns=[str(c) for c in range(1, width)], dtype="float64")
    df.insert(0, LABEL, labels)
    return df


def row_labels(df: pd.DataFrame, prefix: str) -> List[str]:
    """The label column's text, or prefix + row number where it is empty (added rows)."""
    raw = df[LABEL].tolist() if LABEL in df.columns else [None] * len(df)
    return [str(v).strip() if isinstance(v, str) and v.strip() else f"{prefix}{i + 1}" for i, v in enumerate(raw)]


def to_matrix(df: pd.DataFrame, name: str) -> Tuple[Optional[np.ndarray], List[str]]:
    """The numeric columns of a DataFrame (all but the label column) as a float64 array, or
    (None, messages) naming the bad cells."""
    if df is None:
        return None, [f"{name} is empty: it needs at least one row and one column."]
    num = df.drop(columns=[LABEL]) if LABEL in df.columns else df
    if num.shape[0] == 0 or num.shape[1] == 0:
        return None, [f"{name} is empty: it needs at least one row and one column."]
    labels = row_labels(df, name.lower())
    bad = []
    out = np.zeros(num.shape, dtype=np.float64)
    for c, col in enumerate(num.columns):
        for r, raw in enumerate(num[col].tolist()):
            try:
                val = float(str(raw).strip()) if isinstance(raw, str) else float(raw)
            except (TypeError, ValueError):
                val = math.nan
            if not math.isfinite(val):
                bad.append(f"row {labels[r]}, column {col!s} ({'empty' if _blank(raw) else repr(str(raw)[:20])})")
            out[r, c] = val
    if bad:
        shown = "; ".join(bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else "")
        return None, [f"{name} has cells that are not finite numbers: {shown}. Type a number in each."]
    return out, []


def _blank(raw) -> bool:
    if raw is None:
        return True
    if isinstance(raw, float) and math.isnan(raw):
        return True
    return isinstance(raw, str) and not raw.strip()


def check_shapes(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> List[str]:
    msgs = []
    if Q.shape[1] != K.shape[1]:
        msgs.append(f"Q has {Q.shape[1]} columns and K has {K.shape[1]}: q·k needs the same d_k.")
    if K.shape[0] != V.shape[0]:
        msgs.append(f"K has {K.shape[0]} rows and V has {V.shape[0]}: each key needs exactly one value.")
    return msgs


def attention_by_hand(Q, K, V, scaled: bool = True) -> Dict[str, np.ndarray]:
    """softmax(Q K^T / sqrt(d_k)) V through core.scaled_dot_product_attention, every step kept.

    Returns scores (Q K^T), scaled (F), weights (S) and output (A = S V), all float64."""
    q, k, v = (torch.tensor(np.array(a, dtype=np.float64)) for a in (Q, K, V))
    steps: Dict[str, torch.Tensor] = {}
    scale = None if scaled else 1.0
    out = core.scaled_dot_product_attention(q, k, v, record=lambda name, t: steps.__setitem__(name, t), scale=scale)
    res = {name: steps[name].numpy() for name in ("scores", "scaled", "weights")}
    res["output"] = out.numpy()
    res["scale"] = np.array(1.0 / math.sqrt(q.shape[-1]) if scaled else 1.0)
    return res


def weighted_sum_text(weights: np.ndarray, q_labels: Sequence[str], v_names: Sequence[str],
                      digits: int = 4) -> List[str]:
    """'A_1 = 0.6225 v1 + 0.3775 v2' per query row."""
    lines = []
    for i, row in enumerate(weights):
        terms = " + ".join(f"{w:.{digits}f} {v}" for w, v in zip(row, v_names))
        lines.append(f"A{i + 1} ({q_labels[i]}) = {terms}")
    return lines



def number_frame(a, rows, cols, digits: int = 4) -> pd.DataFrame:
    """A matrix as a table with row and column labels, rounded for the page."""
    return pd.DataFrame(np.asarray(a), index=list(rows), columns=list(cols)).round(digits)

# ================================================================== 2. parameter-free self-attention
def parameter_free_attention(X, scale: float = 1.0) -> Dict[str, np.ndarray]:
    """Y = softmax(X X^T * scale) X (Bishop ch. 12 with scale = 1): queries, keys and values are X."""
    x = torch.tensor(np.array(X, dtype=np.float64))
    steps: Dict[str, torch.Tensor] = {}
    y = core.scaled_dot_product_attention(x, x, x, record=lambda name, t: steps.__setitem__(name, t), scale=scale)
    return {"scores": steps["scores"].numpy(), "weights": steps["weights"].numpy(), "Y": y.numpy()}


def diagonal_stats(X, scores: np.ndarray, weights: np.ndarray) -> Dict[str, float]:
    """Why softmax(X X^T) is dominated by its diagonal: numbers for the page's note."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    sq = (X * X).sum(1)  # |x_n|^2, the diagonal of X X^T
    off = scores[~np.eye(n, dtype=bool)] if n > 1 else np.array([0.0])
    norms = np.sqrt(sq)
    cos = scores / np.maximum(np.outer(norms, norms), 1e-12)
    off_cos = cos[~np.eye(n, dtype=bool)] if n > 1 else np.array([0.0])
    return {
        "n": float(n),
        "mean_sq_norm": float(sq.mean()),
        "mean_off_dot": float(off.mean()),
        "max_off_cos": float(off_cos.max()),
        "mean_off_cos": float(off_cos.mean()),
        "mean_diag_weight": float(np.diag(weights).mean()),
        "diag_is_row_max": float((weights.argmax(1) == np.arange(n)).mean()),
    }



def self_copy_table(X, result: Dict[str, np.ndarray], tokens: Sequence[str]) -> pd.DataFrame:
    """Per token of parameter_free_attention(X)'s `result`: the weight on itself, |x_n|², and
    how close y_n stays to x_n (their cosine)."""
    Y = result["Y"]
    cos_yx = (Y * X).sum(1) / np.maximum(np.linalg.norm(Y, axis=1) * np.linalg.norm(X, axis=1), 1e-12)
    return pd.DataFrame({"token": tokens, "a_nn (weight on itself)": np.diag(result["weights"]),
                         "|x_n|²": (X * X).sum(1), "cos(y_n, x_n)": cos_yx})

# ================================================================== 3. symmetric vs learned
def symmetric_vs_learned(q, k, mask=None, scale=None) -> Dict[str, np.ndarray]:
    """Scores and weights of one head with its learned W_k, and with W_k replaced by W_q.

    q, k: n x d_k, the head's queries X W_q and keys X W_k. Symmetric (Missaoui): K := Q, so
    the scores Q Q^T / sqrt(d_k) = X U U^T X^T / sqrt(d_k) with U = W_q. Both go through
    core.scaled_dot_product_attention; mask (n x n, additive) is applied to both. scale: the
    model's factor on Q K^T (None: 1/sqrt(d_k); Gemma 2's query_pre_attn_scalar^-1/2)."""
    q = torch.tensor(np.array(q, dtype=np.float64))
    k = torch.tensor(np.array(k, dtype=np.float64))
    m = None if mask is None else torch.tensor(np.array(mask, dtype=np.float64))
    out = {}
    for label, keys in (("sym", q), ("learned", k)):
        steps: Dict[str, torch.Tensor] = {}
        core.scaled_dot_product_attention(q, keys, keys, mask=m, record=lambda name, t: steps.__setitem__(name, t),
                                          scale=scale)
        out[f"{label}_scores"] = steps["scaled"].numpy()
        out[f"{label}_weights"] = steps["weights"].numpy()
    out["sym_asymmetry"] = np.array(asymmetry(out["sym_scores"]))
    out["learned_asymmetry"] = np.array(asymmetry(out["learned_scores"]))
    return out


def asymmetry(S: np.ndarray) -> float:
    """||S - S^T||_F / ||S||_F: 0 for a symmetric matrix."""
    S = np.asarray(S, dtype=np.float64)
    S = np.where(np.isfinite(S), S, 0.0)
    den = np.linalg.norm(S)
    return float(np.linalg.norm(S - S.T) / den) if den > 0 else 0.0


def head_qk(trace, stack: str, layer: int, head: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, k, mask) of one self-attention head from a trace; grouped-query heads share k."""
    q_all, k_all = trace[tn.self_attn(stack, layer, "q")], trace[tn.self_attn(stack, layer, "k")]
    group = q_all.shape[0] // k_all.shape[0]
    mask_name = tn.self_attn(stack, layer, "mask")
    mask = trace[mask_name].double().numpy() if mask_name in trace else None
    return q_all[head].double().numpy(), k_all[head // group].double().numpy(), mask



def room_for_title(fig: go.Figure) -> go.Figure:
    """Fixed margins that fit the rotated key labels, and the title at the very top, above the
    axis title: side-by-side maps with long titles then never run into their labels."""
    fix_margins(fig, min_top=110)
    fig.update_layout(title=dict(y=1.0, yanchor="top", yref="container", pad=dict(t=6)))
    return fig

# ================================================================== 4. scaling
def scaling_demo(d_ks: Sequence[int] = (4, 8, 16, 32, 64, 128, 256, 512, 1024), n_keys: int = 16,
                 n_samples: int = 256, seed: int = 0) -> pd.DataFrame:
    """With q, k ~ N(0, 1) i.i.d.: the spread of q.k and the softmax entropy, with and without 1/sqrt(d_k).

    One row per d_k: std of the logits (unscaled grows like sqrt(d_k), scaled stays ~1), mean
    softmax entropy over n_keys keys in nats (max log n_keys) and the mean largest weight."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for d_k in d_ks:
        q = torch.randn(n_samples, 1, d_k, generator=gen, dtype=torch.float64)  # (S, 1, d_k)
        k = torch.randn(n_samples, n_keys, d_k, generator=gen, dtype=torch.float64)  # (S, n, d_k)
        v = torch.zeros(n_samples, n_keys, 1, dtype=torch.float64)
        row = {"d_k": d_k, "sqrt_d_k": math.sqrt(d_k)}
        for label, scale in (("unscaled", 1.0), ("scaled", None)):
            steps: Dict[str, torch.Tensor] = {}
            core.scaled_dot_product_attention(q, k, v, record=lambda name, t: steps.__setitem__(name, t), scale=scale)
            logits, w = steps["scaled"][:, 0], steps["weights"][:, 0]  # (S, n)
            ent = -(w * torch.log(w.clamp_min(1e-300))).sum(-1)
            row[f"std_{label}"] = float(logits.std())
            row[f"entropy_{label}"] = float(ent.mean())
            row[f"max_weight_{label}"] = float(w.max(-1).values.mean())
        rows.append(row)
    return pd.DataFrame(rows)


def scaling_figures(df: pd.DataFrame, n_keys: int) -> Tuple[go.Figure, go.Figure]:
    std = go.Figure()
    std.add_trace(go.Scatter(x=df.d_k, y=df.std_unscaled, mode="lines+markers", name="std of q·k (unscaled)"))
    std.add_trace(go.Scatter(x=df.d_k, y=df.std_scaled, mode="lines+markers", name="std of q·k / √d_k"))
    std.add_trace(go.Scatter(x=df.d_k, y=df.sqrt_d_k, mode="lines", name="√d_k (theory)",
                             line=dict(dash="dot", color="#d62728", width=2)))
    ticks = [int(v) for v in df.d_k]
    log_x = dict(type="log", title="d_k", tickvals=ticks, ticktext=[str(v) for v in ticks])
    std_ticks = [v for v in (0.5, 1, 2, 4, 8, 16, 32, 64) if v <= 2 * max(df.std_unscaled.max(), 1)]
    std.update_layout(title=dict(text="Spread of the logits", x=0), height=380, margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=log_x, yaxis=dict(type="log", title="standard deviation", tickvals=std_ticks,
                                              ticktext=[f"{v:g}" for v in std_ticks]),
                      legend=dict(orientation="h", y=-0.25))
    ent = go.Figure()
    ent.add_trace(go.Scatter(x=df.d_k, y=df.entropy_unscaled, mode="lines+markers", name="softmax(q·k): unscaled"))
    ent.add_trace(go.Scatter(x=df.d_k, y=df.entropy_scaled, mode="lines+markers", name="softmax(q·k / √d_k)"))
    ent.add_hline(y=math.log(n_keys), line_dash="dash", line_color="grey",
                  annotation_text=f"uniform: log {n_keys} = {math.log(n_keys):.2f}")
    ent.update_layout(title=dict(text=f"Entropy of the attention over {n_keys} keys", x=0), height=380,
                      margin=dict(l=10, r=10, t=50, b=10), xaxis=log_x,
                      yaxis=dict(title="entropy (nats)", rangemode="tozero"), legend=dict(orientation="h", y=-0.25))
    return std, ent



# ================================================================== 5. hyper-parameters
def heads_options(d_model: int) -> List[int]:
    """The head counts H offered for a width d: those that divide it (d_k = d/H)."""
    return [h for h in (1, 2, 4, 8, 16) if d_model % h == 0]

# ================================================================== 6. measured cost
def cost_figure(df: pd.DataFrame, fit: Dict[str, float]) -> go.Figure:
    fig = go.Figure()
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for i, (D, part) in enumerate(df.groupby("D")):
        colour = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=part.N, y=part.seconds * 1000, mode="markers", marker=dict(size=9, color=colour),
                                 name=f"measured, D = {D}"))
        Ns = np.linspace(part.N.min(), part.N.max(), 60)
        fig.add_trace(go.Scatter(x=Ns, y=cost_model(fit, Ns, D) * 1000, mode="lines", line=dict(dash="dash", color=colour),
                                 name=f"model, D = {D}"))
    title = "Forward time against N: measured (dots) and c₀ + a·N²D + b·N·D² (dashes)"
    fig.update_layout(title=dict(text=title, x=0),
                      height=460, margin=dict(l=10, r=10, t=50, b=10),
                      xaxis=dict(type="log", title="N (tokens)", tickvals=sorted(df.N.unique().tolist())),
                      yaxis=dict(type="log", title="milliseconds (log scale)"), legend=dict(orientation="h", y=-0.2))
    return fig
