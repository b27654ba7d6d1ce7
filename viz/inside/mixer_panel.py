"""Inside a head on a layer whose token mixer is not softmax attention: the recurrence step by
step on the user's sentence (Gated DeltaNet: the state S_t, the decay exp(g_t), the write
strength beta_t, the key removal, the output o_t = S_tᵀ q_t; Kimi Delta Attention the same with
a decay per key channel; Mamba2: the decay exp(dt a), B_t,
C_t, the state), each value recomputed in float64 numpy (viz/inside/recurrence.py) and checked
against the trace, then the layer's implicit attention beside the softmax it replaces."""

from __future__ import annotations

import math

import numpy as np
import streamlit as st
import torch

from core import trace_names as tn
from core.net.attention import scaled_dot_product_attention
from viz.figures import model_view as mv
from viz.figures.mixer import filter_figure
from viz.inside import mixer_figures as mf
from viz.inside import recurrence
from viz.ui import charts, widgets

STEP_KEY = "inside.mixer_step"


def softmax_of(q, k) -> np.ndarray:
    """softmax(q kᵀ/√d_k + causal mask) of one head's q, k (n x d_k), by the core's own attention."""
    got = {}
    q, k = torch.as_tensor(q, dtype=torch.float32), torch.as_tensor(k, dtype=torch.float32)
    scaled_dot_product_attention(q[None], k[None], k[None], record=lambda name, t: got.__setitem__(name, t),
                                 scale=1.0 / math.sqrt(q.shape[-1]), is_causal=True)
    return got["weights"][0].double().numpy()


def mixer_input(model, trace, stack: str, layer: int):
    """What the layer's mixer reads (n x d): its first sub-layer's norm (norm1) where the layer
    norms before its sub-layers (Layer.reads_norm), else the layer's input itself."""
    if model.net.layers(stack)[layer].reads_norm:
        return trace[tn.norm(stack, layer, 1)]
    return trace.layer_input(stack, layer)


def _step(n: int, tokens) -> int:
    if st.session_state.get(STEP_KEY, n - 1) not in range(n):
        st.session_state[STEP_KEY] = n - 1
    st.session_state.setdefault(STEP_KEY, n - 1)
    return st.select_slider("Step t (the token the recurrence has just read)", list(range(n)), key=STEP_KEY,
                            format_func=lambda i: f"{i}: {tokens[i]}")


def _checks(checks) -> None:
    failed = [c for c in checks if not c.ok]
    if failed:
        st.error(f"{len(failed)} check{'s' if len(failed) > 1 else ''} failed on this view: the model's recorded "
                 "tensors differ from the independent recomputation. The failing values below are marked ✗.")
    widgets.show_checks(checks)


def _scaled(c: float) -> str:
    """'' for 1, else the factor and a space ("2 ")."""
    return "" if c == 1 else f"{c:g} "


def show(model, trace, stack: str, layer: int, head: int, kind: str) -> None:
    """The recurrence of `layer`'s mixer (`kind`: "gated_delta", "kimi_delta", "mamba2", "short_conv")."""
    tokens = trace.tokens("target") or trace.tokens("source")
    mixer = model.net.layers(stack)[layer].mixer
    if kind == "short_conv":
        st.info("**A short convolution has no recurrence to step through and no head map**: each channel adds the "
                "last few tokens with fixed weights (its filter), the same on every sentence; gates around it "
                "depend on the token. Its filter:")
        w = trace[tn.mixer(stack, layer, "filter")].float().numpy()
        charts.chart(filter_figure(w, f"layer {layer} · short convolution filter"), key="inside-mixer-filter")
        return
    name = lambda s: tn.mixer(stack, layer, s)  # noqa: E731
    q, k, v = (trace[name(s)][head] for s in ("q", "k", "v"))
    decay, heads, weights = trace[name("decay")][head], trace[name("heads")][head], trace[name("weights")][head]
    n = len(tokens)
    t = _step(n, tokens)
    tol = f"{recurrence.TOL:.0e} × max(1, largest |value|)"
    st.caption(f"Checks: each ✓ compares the trace's value (float32, the chunked form) with the same value "
               f"recomputed step by step in float64 numpy (viz/inside/recurrence.py), within {tol}; a failure is "
               "shown as a red error box.")
    if kind in ("gated_delta", "kimi_delta"):
        kda = kind == "kimi_delta"  # a decay per key channel: g_t is a vector of d_k
        beta = trace[name("beta")][head]
        ref = recurrence.gated_delta_steps(q, k, v, decay, beta)
        x = mixer_input(model, trace, stack, layer)
        if kda:
            gates = recurrence.kimi_delta_gates(x, mixer.w_fa.weight, mixer.w_fb.weight, mixer.w_b.weight,
                                                mixer.A_log, mixer.dt_bias)
            g_label = ("the decay per key channel g_t = −exp(A_log) softplus(x W_fa W_fb + dt_bias), from the "
                       "layer's input and the checkpoint's weights")
        else:
            gates = recurrence.gated_delta_gates(x, mixer.w_a.weight, mixer.w_b.weight, mixer.A_log, mixer.dt_bias,
                                                 getattr(mixer, "beta_scale", 1.0))
            g_label = ("the decay g_t = −exp(A_log) softplus(x W_a + dt_bias), from the layer's input and "
                       "the checkpoint's weights")
        checks = [
            recurrence.check(g_label, decay, gates["g"][head]),
            recurrence.check(f"the write strength β_t = {_scaled(getattr(mixer, 'beta_scale', 1.0))}sigmoid(x W_b)",
                             beta, gates["beta"][head]),
            recurrence.check("o_t = S_tᵀ q_t, the state stepped in numpy, against the trace's heads (every t)",
                             heads, ref["out"]),
            recurrence.check("A[t, s] = β_s k_s · P_{s+1} … P_t q_t, the product in numpy, against the trace's "
                             "weights", weights, ref["A"]),
        ]
        _checks(checks)
        st.markdown(r"**The recurrence** (per head; $S_t$ is $d_k \times d_v$, $q$ already scaled by "
                    r"$d_k^{-1/2}$, $k$ L2-normed):")
        if kda:
            st.latex(r"S_t = (I - \beta_t k_t k_t^{\top})\,\mathrm{diag}(e^{g_t})\,S_{t-1} + \beta_t k_t v_t^{\top} "
                     r"= \mathrm{diag}(e^{g_t}) S_{t-1} + \beta_t k_t\,(v_t - r_t)^{\top},\quad "
                     r"r_t = S_{t-1}^{\top} (e^{g_t} \odot k_t),\quad o_t = S_t^{\top} q_t")
            e = ref["decay"]  # n x d_k: each key channel's share kept
            series = {"decay exp(g_t), mean over the key channels": e.mean(1), "slowest channel": e.max(1),
                      "fastest channel": e.min(1), "write strength β_t": ref["beta"]}
            kept = (f"exp(g_t) keeps {e[t].min():.4f} … {e[t].max():.4f} (mean {e[t].mean():.4f}) of each key "
                    "channel's row of S_(t−1)")
        else:
            st.latex(r"S_t = e^{g_t}\,(I - \beta_t k_t k_t^{\top})\,S_{t-1} + \beta_t k_t v_t^{\top} "
                     r"= e^{g_t} S_{t-1} + \beta_t k_t\,(v_t - r_t)^{\top},\quad r_t = e^{g_t} S_{t-1}^{\top} k_t,"
                     r"\quad o_t = S_t^{\top} q_t")
            series = {"decay exp(g_t)": ref["decay"], "write strength β_t": ref["beta"]}
            kept = f"exp(g_t) = {ref['decay'][t]:.4f} keeps that share of S_(t−1)"
        charts.chart(mf.gates_figure(series, tokens, t,
                                     f"layer {layer} · head {head}: how much of the state survives, how hard it writes"),
                     key="inside-mixer-gates")
        st.caption(f"At t = {t} ({tokens[t]!r}): {kept}; "
                   f"β_t = {ref['beta'][t]:.4f} is how much of the new value replaces what the state held for k_t.")
        c = st.columns(2)
        with c[0]:
            charts.chart(mf.state_figure(ref["S"][t], f"the state S_{t} (d_k × d_v)", "key feature", "value feature"),
                         key="inside-mixer-state")
        with c[1]:
            charts.chart(mf.vectors_figure({"v_t (new value)": _n(v[t]), "r_t (key removal: what S held for k_t)":
                                            ref["removal"][t]}, f"step {t}: what is written, what is removed",
                                           "value feature"), key="inside-mixer-removal")
        charts.chart(mf.vectors_figure({"o_t = S_tᵀ q_t (numpy)": ref["out"][t], "heads[t] (trace)": _n(heads[t])},
                                       f"step {t}: the output", "value feature"), key="inside-mixer-out")
        soft_q = _n(q) * math.sqrt(q.shape[-1])  # the rule's q without its d_k^-1/2: softmax scales it itself
    else:  # mamba2
        a = float(-torch.exp(mixer.A_log.detach().float()[head]))
        skip = name("skip") in trace
        d = float(mixer.D.detach().float()[head]) if skip and hasattr(mixer, "D") else None
        ref = recurrence.mamba2_steps(q, k, v, decay, a, d)
        H = mixer.A_log.numel()
        proj_bias = getattr(mixer.in_proj, "bias", None)  # in_proj's dt rows are its last H
        dt_bias = mixer.dt_bias.detach() + (0 if proj_bias is None else proj_bias.detach()[-H:])
        want = recurrence.mamba2_decay(mixer_input(model, trace, stack, layer), mixer.in_proj.weight[-H:], dt_bias,
                                       mixer.A_log, mixer.spec.dt_limit)
        checks = [
            recurrence.check("the log decay dt_t a = clamp(softplus(x W_dt + dt_bias)) (−exp(A_log)), from the "
                             "layer's input and the checkpoint's weights", decay, want[head]),
            recurrence.check("y_t = S_t C_t + D x_t, the state stepped in numpy, against the trace's heads (every t)",
                             heads, ref["out"]),
            recurrence.check("A[t, s] = (C_t · B_s) exp(Σ dt_r a) dt_s, in numpy, against the trace's weights",
                             weights, ref["A"]),
        ]
        _checks(checks)
        st.markdown(r"**The scan** (per head; $S_t$ is $P \times N$, $a = -e^{A_{\log}} = $" + f" {a:.4f}):")
        st.latex(r"S_t = e^{\Delta_t a}\,S_{t-1} + \Delta_t\,x_t B_t^{\top},\quad y_t = S_t C_t + D\,x_t")
        charts.chart(mf.gates_figure({"decay exp(dt_t a)": ref["decay"], "step dt_t": ref["dt"]}, tokens, t,
                                     f"layer {layer} · head {head}: how much of the state survives, the step size"),
                     key="inside-mixer-gates")
        c = st.columns(2)
        with c[0]:
            charts.chart(mf.vectors_figure({"B_t (what is written: key)": _n(k[t]), "C_t (what is read: query)":
                                            _n(q[t])}, f"step {t}: B_t and C_t", "state feature"),
                         key="inside-mixer-bc")
        with c[1]:
            charts.chart(mf.state_figure(ref["S"][t], f"the state S_{t} (P × N)", "channel", "state feature"),
                         key="inside-mixer-state")
        charts.chart(mf.vectors_figure({"y_t (numpy)": ref["out"][t], "heads[t] (trace)": _n(heads[t])},
                                       f"step {t}: the output", "channel"), key="inside-mixer-out")
        soft_q = _n(q)
    soft = softmax_of(soft_q, _n(k))
    st.markdown("**Beside the softmax it replaces**")
    za, zt, _, fq, _ = mv.reduce_map(_n(weights), tokens, tokens)  # a long input in blocks, as Explore draws it
    zs = mv.reduce_map(soft, tokens, tokens)[0]
    charts.chart(mf.beside_figure(np.asarray(za), np.asarray(zs), zt, widgets.MIXER_LABEL.get(kind, kind), t // fq),
                 key="inside-mixer-beside")
    if fq > 1:
        st.caption(f"Long input ({len(tokens)} tokens): both maps drawn in blocks of up to {fq} neighbouring tokens "
                   "(keys summed within a block, queries averaged); the dotted line is step t's block.")
    neg = int((_n(weights) < 0).sum())
    sums = _n(weights).sum(1)
    st.caption(f"Left, the mixer's exact implicit attention: o_t = Σ_s A[t, s] v_s. Right, what softmax attention "
               f"would make of the same q and k. Softmax rows are positive and sum to 1; here {neg} weights are "
               f"negative and the rows sum to {sums.min():+.3f} … {sums.max():+.3f}: the mixer forgets by decay "
               "and overwrites by subtraction instead of normalising, and its cost per token stays fixed however "
               "long the text.")


def _n(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
