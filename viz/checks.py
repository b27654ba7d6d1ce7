"""Numerical identities checked on a trace's recorded tensors, shown beside the steps of
the Inside page (viz/steps.py): QKᵀ = scores, softmax rows sum to 1, A V = head output,
residual = input + sub-layer output, and the fused forward pass against the explicit one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List

import numpy as np

from core.positional import apply_rope, rope_angles
from viz.figures import to_numpy
from viz.step import ROWS, kv_head
from viz.steps import layer_input_name, sublayers

_np = to_numpy


@dataclass
class Check:
    """A numerical identity checked on the recorded tensors."""

    label: str
    error: float
    tol: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error) and self.error <= self.tol)

    def text(self) -> str:
        mark = "✓" if self.ok else "✗"
        return f"{mark} {self.label} (max abs error {self.error:.1e})"



def row_sum_error(weights) -> float:
    """max_i |sum_j A_ij - 1| for a (..., n_q, n_k) weight tensor."""
    w = to_numpy(weights).astype(np.float64)
    return float(np.abs(w.sum(-1) - 1.0).max()) if w.size else 0.0


def max_abs_diff(a, b) -> float:
    """Largest |a - b| over cells where both are finite; inf when the -inf patterns differ."""
    a = to_numpy(a).astype(np.float64)
    b = to_numpy(b).astype(np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not np.array_equal(np.isneginf(a), np.isneginf(b)):
        return float("inf")
    fin = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[fin] - b[fin]).max()) if fin.any() else 0.0


def softmax_rows(x) -> np.ndarray:
    x = to_numpy(x).astype(np.float64)
    top = np.max(np.where(np.isneginf(x), -np.inf, x), axis=-1, keepdims=True)
    e = np.exp(x - top)
    return e / e.sum(-1, keepdims=True)


def _tol(ref) -> float:
    r = to_numpy(ref).astype(np.float64)
    fin = r[np.isfinite(r)]
    scale = float(np.abs(fin).max()) if fin.size else 1.0
    return 1e-4 * max(1.0, scale)



# ------------------------------------------------------------------ checks
def head_checks(trace, stack: str, kind: str, layer: int, head: int, config=None,
                notation: str = ROWS) -> Dict[str, List[Check]]:
    """Numerical identities on the recorded tensors of one head, keyed by step key:
    QKᵀ = scores, scores/√d_k = scaled, scaled + M = masked, softmax(masked) = weights,
    rows of A sum to 1, A is 0 where masked, A V = head, and RoPE(Q̂) = Q where used."""
    p = f"{stack}.{layer}.{kind}"
    w = _np(trace[f"{p}.weights"][head]).astype(np.float64)
    n_heads, n_kv = trace[f"{p}.weights"].shape[0], trace[f"{p}.k"].shape[0]
    kv = kv_head(head, n_heads, n_kv)
    q = _np(trace[f"{p}.q"][head]).astype(np.float64)
    k = _np(trace[f"{p}.k"][kv]).astype(np.float64)
    v = _np(trace[f"{p}.v"][kv]).astype(np.float64)
    scores = _np(trace[f"{p}.scores"][head]).astype(np.float64)
    scaled = _np(trace[f"{p}.scaled"][head]).astype(np.float64)
    masked = _np(trace[f"{p}.masked"][head]).astype(np.float64)
    mask = _np(trace[f"{p}.mask"]).astype(np.float64)
    heads = _np(trace[f"{p}.heads"][head]).astype(np.float64)
    d_k = q.shape[-1]
    checks: Dict[str, List[Check]] = {}
    qk = q @ k.T
    checks["scores"] = [Check("QKᵀ recomputed from Q and K equals the recorded scores", max_abs_diff(qk, scores),
                              _tol(scores))]
    scale = trace.meta.get("config", {}).get("attn_scale") if config is None else getattr(config, "attn_scale", None)
    if scale is None:
        checks["scaled"] = [Check(f"scaled = scores / √{d_k}", max_abs_diff(scores / math.sqrt(d_k), scaled),
                                  _tol(scaled))]
    else:
        checks["scaled"] = [Check(f"scaled = {scale:.4g} × scores", max_abs_diff(scores * scale, scaled), _tol(scaled))]
    if f"{p}.position_bias" in trace:
        bias = _np(trace[f"{p}.position_bias"][head]).astype(np.float64)
        checks["masked"] = [Check("masked = scaled + position bias + M (same -∞ cells)",
                                  max_abs_diff(scaled + bias + mask, masked), _tol(masked))]
    else:
        checks["masked"] = [Check("masked = scaled + M (same -∞ cells)", max_abs_diff(scaled + mask, masked),
                                  _tol(masked))]
    blocked = np.isneginf(mask)
    checks["weights"] = [
        Check("each row of A sums to 1" if notation == ROWS else "each column of Aᵀ sums to 1", row_sum_error(w), 1e-5),
        Check("A = softmax(masked), recomputed", max_abs_diff(softmax_rows(masked), w), 1e-5),
        Check("A is exactly 0 where M = -∞", float(np.abs(w[blocked]).max()) if blocked.any() else 0.0, 0.0),
    ]
    checks["heads"] = [Check(f"A V{'' if n_kv == n_heads else f' (kv head {kv})'} equals head {head}'s output as the "
                             "forward pass's fused kernel computed it", max_abs_diff(w @ v, heads), _tol(heads))]
    if f"{p}.q_pre_rope" in trace:
        import torch

        cfg = config
        if cfg is None:
            from core.config import ModelConfig

            cfg = ModelConfig.from_dict(trace.meta["config"])
        qh = trace[f"{p}.q_pre_rope"][head].double()
        kh = trace[f"{p}.k_pre_rope"][kv].double()
        ang = rope_angles(qh.shape[0], d_k, cfg.rope_theta).to(torch.float64)
        angk = rope_angles(kh.shape[0], d_k, cfg.rope_theta).to(torch.float64)
        q_rot = apply_rope(qh, ang, cfg.rope_layout)
        k_rot = apply_rope(kh, angk, cfg.rope_layout)
        checks["q"] = [Check("rotating Q̂ by φ gives the recorded Q", max_abs_diff(q_rot, q), _tol(q))]
        checks["k"] = [Check("rotating K̂ by φ gives the recorded K", max_abs_diff(k_rot, k), _tol(k))]
    return checks


def residual_checks(trace, stack: str, layer: int, config=None) -> Dict[str, List[Check]]:
    """residual_j = (stream before sub-layer j) + (sub-layer j's output), for each sub-layer;
    and, where the trace stored the layer's output from its fused forward pass and computes
    the rest by running the layer again explicitly (core/trace.py), that the two agree."""
    cfg = config
    if cfg is None:
        from core.config import ModelConfig

        cfg = ModelConfig.from_dict(trace.meta["config"])
    pre = cfg.norm_placement == "pre"
    p = f"{stack}.{layer}"
    x_name = layer_input_name(trace, stack, layer)
    out: Dict[str, List[Check]] = {}
    for j, sub in enumerate(sublayers(trace, stack, layer), start=1):
        f_name = f"{p}.{sub}.out"
        r_name = f"{p}.residual{j}"
        if x_name in trace and f_name in trace and r_name in trace:
            x, f, r = (_np(trace[n]).astype(np.float64) for n in (x_name, f_name, r_name))
            out[f"residual{j}"] = [Check("input + sub-layer output equals the recorded residual",
                                         max_abs_diff(x + f, r), _tol(r))]
        x_name = r_name if pre else f"{p}.norm{j}"
    stored = f"{p}.out"
    if trace.is_stored(stored) and not trace.is_stored(f"{p}.norm1"):
        try:
            rerun = trace.recomputed(stored)  # this layer again, on the explicit path
        except KeyError:  # a trace without its model: nothing to re-run
            rerun = None
        if rerun is not None:
            out["out"] = [Check(f"layer {layer} run again with the explicit formula gives the output the fused forward "
                                "pass stored (the next layer's input)", max_abs_diff(rerun, trace[stored]),
                                _tol(trace[stored]))]
    return out

