"""The Playground's last two tabs, about cost: what the hyper-parameters cost in parameters
(core's count against the formula written out by hand, and a model built with them) and what
sequence length and width cost in time (timed forward passes fitted to O(N²D) + O(N·D²)).
Each tab is one function, drawn inside its st.tab by viz/playground/page.py; the counts,
timings and figures come from core/net/cost.py through viz.figures.by_hand."""

from __future__ import annotations

import json
import math

import streamlit as st

from core import trace_names as tn
import core
from core.toy import toy_task
from core.errors import InputError
from viz.figures import by_hand
from viz.figures.heatmaps import attention_heatmap
from viz.ui import charts, url_state
from viz.playground.controls_panel import CHOICES
from viz.figures.text import clean_text

BUILD_LIMIT = 60_000_000  # parameters: larger models are counted, not built


@st.cache_resource(show_spinner=False, max_entries=2)
def _random_model(cfg_json: str, seed: int):
    return core.load_model("random", config=core.ModelConfig.from_dict(json.loads(cfg_json)), seed=seed)


# ================================================================== 5. hyper-parameters
def hyper_parameters(state: url_state.PageState, keys: dict, text: str) -> bool:
    """Tab 5: the parameter count of the chosen d, H, m, L and the rest, by core and by hand,
    and the model built with random weights and run on `text`. Returns whether that built model
    is shown (for the URL's hp_built)."""
    ss = st.session_state
    st.markdown("The notes' hyper-parameters: d (model width), H heads of size d_k = d/H, m (FFN width), L layers. "
                "Shapes and the parameter count come from `core.Transformer(cfg)` (built on PyTorch's meta device: "
                "shapes without memory); the formula beside it is written out by hand.")
    c = st.columns(5)
    kind = c[0].selectbox("kind", CHOICES["hp_kind"][1], key=keys["hp_kind"])
    d_model = c[1].select_slider("d", CHOICES["hp_d"][1], key=keys["hp_d"])
    heads_opts = by_hand.heads_options(d_model)
    if ss[keys["hp_H"]] not in heads_opts:  # d changed under it
        ss[keys["hp_H"]] = heads_opts[-1]
    n_heads = c[2].select_slider("H", heads_opts, key=keys["hp_H"])
    d_ff = c[3].select_slider("m", CHOICES["hp_m"][1], key=keys["hp_m"])
    n_layers_hp = c[4].slider("L", 1, 12, key=keys["hp_L"])
    c = st.columns(5)
    positional = c[0].selectbox("positions", CHOICES["hp_pos"][1], key=keys["hp_pos"])
    placement = c[1].selectbox("norm placement", CHOICES["hp_place"][1], key=keys["hp_place"])
    norm = c[2].selectbox("norm", CHOICES["hp_norm"][1], key=keys["hp_norm"])
    activation = c[3].selectbox("FFN", CHOICES["hp_act"][1], key=keys["hp_act"])
    bias = c[4].toggle("biases", key=keys["hp_bias"])
    vocab = len(toy_task.source_vocab())  # the random model's words (core.registry.load_random)
    try:
        cfg = core.ModelConfig(kind=kind, d_model=int(d_model), n_heads=int(n_heads), d_ff=int(d_ff),
                               n_layers=int(n_layers_hp), positional=positional, norm_placement=placement, norm=norm,
                               activation=activation, bias=bool(bias), src_vocab_size=vocab, tgt_vocab_size=vocab,
                               max_len=256)
    except ValueError as exc:
        st.error(f"That combination is not a valid model: {exc}")
        cfg = None
    if cfg is not None:
        net = by_hand.meta_model(cfg)
        counted = net.num_parameters()
        formula = by_hand.param_formula(cfg)
        total = int(formula.total.sum())
        st.markdown(f"d = {cfg.d_model}, H = {cfg.n_heads}, **d_k = d/H = {cfg.d_head}**, m = {cfg.d_ff}, "
                    f"L = {cfg.n_layers}, vocabulary V = {vocab} (toy-translate's words), max_len = {cfg.max_len}.")
        c = st.columns(3)
        c[0].metric("core: Transformer(cfg).num_parameters()", f"{counted:,}")
        c[1].metric("the formula below", f"{total:,}")
        c[2].metric("difference", f"{counted - total:,}")
        if counted == total:
            st.success("The hand-written formula and core's count agree.")
        else:
            st.error("The formula and core's count differ: one of them is wrong.")
        if kind == "encoder" and placement == "post" and activation == "relu" and norm == "layernorm" and bias:
            st.caption("One post-norm encoder layer of the notes (attention 4d² + 4d, FFN 2dm + m + d, two "
                       f"LayerNorms 4d): {by_hand.layer_formula(cfg)}.")
        st.dataframe(formula.rename(columns={"each": "count (each)", "total": "count (total)"})
                     .style.format({"count (each)": "{:,}", "count (total)": "{:,}"}), width="stretch", hide_index=True)
        with st.expander(f"Every weight tensor ({len(list(net.parameters()))} tensors)"):
            st.dataframe(by_hand.weight_shapes(net), width="stretch", hide_index=True, height=360)

        cfg_json = json.dumps(cfg.to_dict(), sort_keys=True)
        build_id = (cfg_json, 0)
        if "hp_built" in state.from_url and ss[keys["hp_built"]]:  # a link to a built model
            st.session_state["playground.built"] = build_id
        if counted > BUILD_LIMIT:
            st.info(f"{counted:,} parameters: too large to build here (limit {BUILD_LIMIT:,}); the count above needs "
                    "no weights.")
        elif st.button("Build this model (random weights, seed 0) and run it on the sentence",
                       key="playground.hp_build"):
            st.session_state["playground.built"] = build_id
        if st.session_state.get("playground.built") == build_id and counted <= BUILD_LIMIT:
            try:
                with st.spinner("Building the random model…"):
                    rnd = _random_model(cfg_json, 0)
                st.caption(f"Built: {rnd.net.num_parameters():,} parameters on {rnd.device}.")
                clean, _ = clean_text(text)
                rtrace = rnd.trace(clean)
                rstack = rtrace.stacks()[0]
                rtoks = rtrace.tokens("source" if rstack == "encoder" else "target")
                charts.chart(attention_heatmap(rtrace[tn.self_attn(rstack, 0, "weights")][0], rtoks, rtoks,
                                               title=f"random model: {rstack} layer 0, head 0 "
                                                     f"({rtrace.meta['timings']['forward_ms']:.1f} ms forward)"),
                             key="playground-random-attn", width="stretch")
                st.caption("Untrained: the pattern reflects only the random projections (and positions).")
            except InputError as exc:
                st.warning(f"{exc} (needed to run the random model)")
            except Exception as exc:
                st.error(f"Could not build or run that model: {exc}")
    return cfg is not None and ss.get("playground.built") == build_id and counted <= BUILD_LIMIT


# ================================================================== 6. cost
def cost(keys: dict) -> None:
    """Tab 6: forward passes timed over N and D (only when asked) and the fitted cost model."""
    st.markdown("Missaoui: one transformer layer costs O(N²D) for the scores and the value mix plus O(ND²) for "
                "the projections and the FFN. Here a one-layer random core encoder (H = 4, m = 4D, tracing off, "
                "on CPU) is timed for each sequence length N and width D, and "
                "t = c₀ + a·N²D + b·N·D² is fitted to the times.")
    c = st.columns(3)
    max_n = c[0].select_slider("Largest N", CHOICES["cost_n"][1], key=keys["cost_n"])
    max_d = c[1].select_slider("Largest D", CHOICES["cost_d"][1], key=keys["cost_d"])
    Ns = [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= max_n]
    Ds = [d for d in (64, 128, 256, 512, 1024) if d <= max_d]
    budget = 8.0
    if c[2].button(f"Measure ({len(Ns) * len(Ds)} points, at most {budget:.0f} s)", key="playground.cost_run"):
        bar = st.progress(0.0, text="Timing…")
        try:
            df_cost, finished = by_hand.cost_grid(Ns, Ds, budget_s=budget,
                                             progress=lambda f, msg: bar.progress(min(1.0, f), text=msg))
            st.session_state["playground.cost"] = {"df": df_cost, "finished": finished}
        except Exception as exc:
            st.error(f"Timing failed: {exc}")
        bar.empty()
    result = st.session_state.get("playground.cost")
    if result is None:
        st.info("Press Measure to time the forward passes (nothing runs until you do).")
    elif len(result["df"]) < 4:
        st.warning("Too few points were measured in the time budget to fit the model; try a smaller largest N or D.")
    else:
        df_cost = result["df"]
        if not result["finished"]:
            st.warning(f"Stopped at the {budget:.0f} s budget after {len(df_cost)} points; the fit uses those.")
        fit = by_hand.fit_cost(df_cost)
        charts.chart(by_hand.cost_figure(df_cost, fit), key="playground-cost", width="stretch")
        cross = fit["b"] / fit["a"] if fit["a"] > 0 else math.inf
        st.markdown(
            f"Fitted: c₀ = {fit['c0'] * 1e3:.3f} ms, a = {fit['a']:.3g} s per N²D, b = {fit['b']:.3g} s per N·D² "
            f"(rms relative error {fit['rel_rms']:.0%} over {fit['n']} points). "
            + (f"The attention term a·N²D overtakes b·N·D² when N > (b/a)·D ≈ {cross:.1f}·D. "
               if math.isfinite(cross) else "At these sizes the N²D term is too small to separate from the rest. ")
            + "Counting multiply-adds, the scores and value mix take 2·N²·D and the projections and FFN 4·N·D² + "
              "2·N·D·m = 12·N·D², so the crossover in arithmetic is N ≈ 6D; measured times also include memory "
              "traffic and the fixed overhead c₀ of every call, which dominates small inputs. On a busy machine the "
              "times are noisy: each point is the fastest of several runs.")
        with st.expander("The measurements"):
            st.dataframe(df_cost.assign(ms=df_cost.seconds * 1000).drop(columns="seconds").round(4), width="stretch",
                         hide_index=True)
