"""Checks shown beside the steps of the Inside page (viz/inside/step_model.py), each comparing two
independently computed values with a stated tolerance (viz.figures.checks.Check):

- the core's recorded tensors of one layer (q, k, v, RoPE's Q̂/K̂, scores, scaled, mask, masked,
  weights, the attention and FFN outputs, residuals, norms) against the same layer computed
  again in float64 numpy from its stored input and the checkpoint's own weights
  (viz/figures/reference.py, which shares no code with the core's forward pass);
- A V from the recorded weights and values against the head output the fused kernel stored;
- the layer run again on the explicit path against the output the fused pass stored;
- each row of the recorded A sums to 1, and A is exactly 0 where the numpy mask is -∞.

A trace without its model (loaded from .npz) gets the last three only; `CheckSet.note` says why."""

from __future__ import annotations

from typing import Optional

import numpy as np

from core import trace_names as tn
from core.head_maps import derived as per_trace
from viz.figures.checks import NUMPY, Check, max_abs_diff, rtol_of, tolerance
from viz.figures.heatmaps import to_numpy
from viz.figures.reference import NoReference, reference_layer
from viz.inside.step_model import ROWS, kv_head, sublayers

_np = to_numpy


class CheckSet(dict):
    """{step key: [Check]}, with `note`: why some checks could not be made (or None)."""

    note: Optional[str] = None


def row_sum_error(weights) -> float:
    """max_i |sum_j A_ij - 1| for a (..., n_q, n_k) weight tensor."""
    w = to_numpy(weights).astype(np.float64)
    return float(np.abs(w.sum(-1) - 1.0).max()) if w.size else 0.0


def _reference(trace, stack: str, layer: int, kind: str, head: int):
    """(the layer recomputed by viz.figures.reference, None) or (None, why not)."""
    try:
        return reference_layer(trace, stack, layer, {kind: head}), None
    except NoReference as exc:
        return None, f"No independent recomputation for this trace: {exc}. Its values are shown without a check."


def _inputs(trace, stack: str, layer: int, kind: str, pre: bool) -> str:
    j = sublayers(trace, stack, layer).index(kind) + 1
    cfg = trace.model.config
    first = j == 1 or getattr(cfg, "parallel_block", False)  # the parallel block: every sub-layer reads x
    src = "the layer's stored input" if first else f"the stream after sub-layer {j - 1}"
    x = f"Norm{j}({src})" if pre and getattr(cfg, "pre_sublayer_norm", True) else src
    return x


def layer_checks(trace, stack: str, kind: str, layer: int, head: int, notation: str = ROWS) -> CheckSet:
    """Every check of one head's view of a layer, keyed by step key (viz.inside.step_model), computed once
    per trace and view (kept with the trace: core.head_maps.derived)."""
    key = ("checks", stack, kind, layer, head, notation)
    memo = per_trace(trace)
    if key not in memo:
        ref = _reference(trace, stack, layer, kind, head)  # one numpy layer for both
        out = CheckSet(head_checks(trace, stack, kind, layer, head, notation=notation, reference=ref))
        res = residual_checks(trace, stack, layer, kind=kind, reference=ref)
        for k, v in res.items():
            out.setdefault(k, []).extend(v)
        out.note = getattr(res, "note", None)
        memo[key] = out
    return memo[key]


def head_checks(trace, stack: str, kind: str, layer: int, head: int, notation: str = ROWS,
                reference=None) -> CheckSet:
    """One head's checks, keyed by step key: the recorded Q̂, K̂ (RoPE), Q, K, V, QKᵀ, scaled,
    M, masked and A against viz.figures.reference's float64 recomputation; rows of A sum to 1; A is 0
    where the recomputed M is -∞; A V (recorded) against the head output the fused pass stored."""
    def nm(step):  # this attention's trace name of `step`
        return tn.attn(stack, layer, kind, step)

    w = _np(trace[nm("weights")][head]).astype(np.float64)
    n_heads, n_kv = trace.n_heads(stack), trace[nm("k")].shape[0]
    kv = kv_head(head, n_heads, n_kv)
    v = _np(trace[nm("v")][kv]).astype(np.float64)
    heads = _np(trace[nm("heads")][head]).astype(np.float64)
    checks = CheckSet()
    sums = "each row of A sums to 1" if notation == ROWS else "each column of Aᵀ sums to 1"
    sink = _np(trace[nm("sink")][head]).astype(np.float64) if nm("sink") in trace else None
    if sink is not None:  # learned sinks: the keys' weights and the sink's share make the whole
        sums = sums.replace("sums to 1", "plus its learned sink sums to 1")
        w_all = np.concatenate([w, sink[:, None]], -1)
    checks["weights"] = [Check(sums, row_sum_error(w if sink is None else w_all), 1e-5)]
    checks["heads"] = [Check(f"A V{'' if n_kv == n_heads else f' (kv head {kv})'} from the recorded A and V equals "
                             f"head {head}'s output as the forward pass's fused kernel computed it",
                             max_abs_diff(w @ v, heads), tolerance(heads))]
    ref, why = reference or _reference(trace, stack, layer, kind, head)
    if ref is None:
        checks.note = why
        return checks
    rtol = rtol_of(trace)
    cfg = trace.model.config
    src = _inputs(trace, stack, layer, kind, cfg.norm_placement == "pre")
    rope = nm("q_pre_rope") in trace
    maps = ref[tn.local(kind, f"maps{head}")]
    d_k = ref[tn.local(kind, "q")].shape[-1]
    scale = f"1/√{d_k}" if cfg.attn_scale is None else f"{float(cfg.attn_scale):.4g}"

    def cmp(label, mine, name, i=head):
        recorded = trace[name][i]
        return Check(f"{label} ({NUMPY}) equals the recorded `{name.rsplit('.', 1)[-1]}`", max_abs_diff(mine, recorded),
                     tolerance(recorded, rtol))

    b = " + b" if cfg.qkv_bias else ""
    if nm("q_pre_norm") in trace:  # QK-norm: the projections before their RMSNorm
        over = "each head's d_k features" if cfg.qk_norm in ("head", "l2") else "the whole projection"
        checks["qknorm"] = [cmp(f"X W_q{b} before QK-norm, X = {src}", ref[tn.local(kind, "q_pre_norm")][head], nm("q_pre_norm"))]
        if nm("k_pre_norm") in trace:  # absent where the keys are another layer's (Gemma 4)
            checks["qknorm"].append(cmp(f"X W_k{b} before QK-norm", ref[tn.local(kind, "k_pre_norm")][kv], nm("k_pre_norm"), kv))
        b = f"{b}, RMSNorm over {over}"
    if rope:
        checks["qhat"] = [cmp(f"Q̂ = X W_q{b}, X = {src}", ref[tn.local(kind, "q_pre_rope")][head], nm("q_pre_rope"))]
        if nm("k_pre_rope") in trace:
            checks["khat"] = [cmp(f"K̂ = X W_k{b}", ref[tn.local(kind, "k_pre_rope")][kv], nm("k_pre_rope"), kv)]
    kinds = trace.meta.get("layer_kinds")
    local = bool(kinds) and kinds[layer] == "local" and kind == "self_attn"
    theta = cfg.rope_theta_local if local and getattr(cfg, "rope_theta_local", None) is not None else cfg.rope_theta
    rot = f" rotated by RoPE ({cfg.rope_layout} layout, θ = {theta:g})" if rope else ""
    checks["q"] = [cmp(f"Q = X W_q{b}{rot}, X = {src}", ref[tn.local(kind, "q")][head], nm("q"))]
    y, of_y = ("X", "") if kind == "self_attn" else ("Y", ", Y = the stored encoder output")
    attn = getattr(trace.model.net.layers(stack)[layer], kind)
    source = getattr(attn, "kv_source", None)
    k_label, v_label = f"K = {y} W_k{b}{rot}{of_y}", f"V = {y} W_v{b}{of_y}"
    if source is not None:  # Gemma 4: the keys and values of an earlier layer
        k_label = f"K = layer {source}'s keys (its X W_k, QK-norm, RoPE), reused"
        v_label = f"V = layer {source}'s values, reused"
    elif getattr(attn, "k_is_v", False):
        v_label = f"V = {y} W_k (K = V: the key projection before its norm and RoPE)"
    if source is None and getattr(attn, "v_norm", None) is not None:
        v_label += ", RMS-normed over each head without a gain"
    checks["k"] = [cmp(k_label, ref[tn.local(kind, "k")][kv], nm("k"), kv)]
    checks["v"] = [cmp(v_label, ref[tn.local(kind, "v")][kv], nm("v"), kv)]
    checks["scores"] = [cmp("QKᵀ of the recomputed Q and K", maps["scores"], nm("scores"))]
    checks["scaled"] = [cmp(f"{scale} × QKᵀ (the model's scale)", maps["scaled"], nm("scaled"))]
    if "capped" in maps:
        c = float(cfg.attn_softcap)
        checks["capped"] = [cmp(f"{c:g}·tanh(scaled / {c:g}) (soft-capping)", maps["capped"], nm("capped"))]
    windowed = bool(cfg.sliding_window) and (local if kinds else stack == "decoder")
    what = {"self_attn": ("look-ahead mask" if stack == "decoder" else "padding mask (none without padding)")
            + ((f" with a {cfg.sliding_window}-token sliding window" if stack == "decoder" else
                f" with a window of ±{cfg.sliding_window // 2} tokens") if windowed else ""),
            "cross_attn": "padding mask of the source (none without padding)"}[kind]
    m = ref[tn.local(kind, "mask")]
    checks["mask"] = [Check(f"M built in numpy as the {what} equals the recorded `mask` (same -∞ cells)",
                            max_abs_diff(m, trace[nm("mask")]), 0.0)]
    bias = " + T5's position bias (read from the trace)" if nm("position_bias") in trace else ""
    checks["masked"] = [cmp(f"{'capped' if 'capped' in maps else 'scaled'} + M{bias}", maps["masked"], nm("masked"))]
    blocked = np.isneginf(m)
    checks["weights"] += [
        cmp("A = softmax(masked)" + (" with the head's sink logit beside the keys" if sink is not None else ""),
            maps["weights"], nm("weights")),
        Check("A is exactly 0 where the numpy mask M is -∞", float(np.abs(w[blocked]).max()) if blocked.any() else 0.0,
              0.0),
    ]
    if sink is not None and "sink" in maps:
        checks["weights"].append(cmp("the learned sink's share, 1 - the row sums of the recomputed A", maps["sink"],
                                     nm("sink")))
    return checks


def residual_checks(trace, stack: str, layer: int, kind: str = "self_attn", reference=None) -> CheckSet:
    """The layer's other recorded names against viz.figures.reference's float64 recomputation, keyed by
    step key: each attention's Concat(heads) W_o, the FFN, every residual and norm, the output;
    and, where the trace stored the layer's output from its fused forward pass and computes the
    rest by running the layer again explicitly (core/trace.py), that the two agree."""
    out = CheckSet()
    ref, why = reference or _reference(trace, stack, layer, kind, 0)
    if ref is None:
        out.note = why
    else:
        rtol = rtol_of(trace)

        def cmp(label, key, name):
            recorded = trace[tn.at(stack, layer, name)]
            out.setdefault(key, []).append(Check(f"{label} ({NUMPY}) equals the recorded `{name}`",
                                                 max_abs_diff(ref[name], recorded), tolerance(recorded, rtol)))

        for j, sub in enumerate(sublayers(trace, stack, layer), start=1):
            if sub == "ffn":
                cmp("the FFN's hidden layer", "ffn-hidden", tn.local(tn.FFN, "hidden"))
                cmp("the FFN's output", "ffn-out", tn.local(tn.FFN, "out"))
            else:
                cmp(f"Concat(heads) Wᴼ of the {sub.replace('_attn', '-attention')}",
                    "attn-out" if sub == kind else f"{sub}-out", tn.local(sub, "out"))
            if tn.post_norm(stack, layer, j) in trace:
                cmp(f"the norm on sub-layer {j}'s output", f"post_norm{j}", f"post_norm{j}")
            cmp(f"residual {j} (input + sub-layer output)", f"residual{j}", f"residual{j}")
            if tn.norm(stack, layer, j) in trace:
                cmp(f"norm {j}", f"norm{j}", f"norm{j}")
        if getattr(trace.model.net.layers(stack)[layer], "ple_gate", None) is not None:  # Gemma 4's per-layer input
            cmp("the per-layer input's normed write", "post_norm3", "post_norm3")
            cmp("residual 3 (the stream + the per-layer input's write)", "residual3", "residual3")
        if trace.is_stored(tn.out(stack, layer)):
            out.setdefault("out", []).append(Check(
                f"the layer's output ({NUMPY}) equals the output the fused forward pass stored",
                max_abs_diff(ref["out"], trace[tn.out(stack, layer)]), tolerance(trace[tn.out(stack, layer)], rtol)))
    stored = tn.out(stack, layer)
    if trace.is_stored(stored) and not trace.is_stored(tn.norm(stack, layer, 1)):
        try:
            rerun = trace.recomputed(stored)  # this layer again, on the explicit path
        except KeyError:  # a trace without its model: nothing to re-run
            rerun = None
        if rerun is not None:
            out.setdefault("out", []).append(Check(
                f"layer {layer} run again with the explicit formula gives the output the fused forward pass stored "
                "(the next layer's input)", max_abs_diff(rerun, trace[stored]), tolerance(trace[stored])))
    return out
