"""Playground: attention by hand, parameter-free and symmetric attention, why scores are
scaled, what the hyper-parameters cost in parameters, and what sequence length costs in time.

Computation lives in viz.playground (pure functions over core); this page reads widgets and
lays results out."""

import json
import math

import numpy as np
import pandas as pd
import streamlit as st

import core
from core import toy_task
from core.errors import InputError
from viz import playground as vg
from viz.figures import DIVERGING, attention_heatmap, fix_margins, matrix_heatmap
from viz.pages import charts, models, url_state, urlflags, widgets
from viz.text import clean_text

PLAY_TABS = {"hand": "1 · Attention by hand", "free": "2 · Parameter-free", "symmetric": "3 · Symmetric vs learned",
             "scale": "4 · Why scale", "sizes": "5 · Hyper-parameters", "cost": "6 · Cost"}
# Every control inside the tabs is in the URL under its own name (session key "playground.<name>"),
# written only where it differs from its default, so that a copied link draws the same figures.
CHOICES = {  # name: (default, options) for selectboxes, radios and select sliders
    "pf_x": ("sum", ["sum", "tokens"]),
    "sc_keys": (16, [2, 4, 8, 16, 32, 64, 128, 256]),
    "hp_kind": ("encoder", ["encoder", "decoder", "encoder-decoder"]),
    "hp_d": (64, [16, 32, 64, 128, 256, 512, 1024]),
    "hp_m": (256, [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]),
    "hp_pos": ("sinusoidal", ["sinusoidal", "learned", "rope", "none"]),
    "hp_place": ("post", ["post", "pre"]),
    "hp_norm": ("layernorm", ["layernorm", "rmsnorm"]),
    "hp_act": ("relu", ["relu", "gelu", "swiglu"]),
    "cost_n": (512, [128, 256, 512, 1024]),
    "cost_d": (512, [128, 256, 512, 1024]),
}
NUMBERS = {"sc_seed": (0, 0, 10_000), "hp_L": (2, 1, 12)}  # name: (default, lowest, highest)
SWITCHES = {"hand_scaled": True, "pf_scale": False, "hp_bias": True, "hp_built": False}
HAND = {"Q": "hand_q", "K": "hand_k", "V": "hand_v"}  # tab 1's tables: JSON rows, when edited


def heads_options(d_model: int) -> list:
    return [h for h in (1, 2, 4, 8, 16) if d_model % h == 0]


def hand_tables(state: url_state.PageState) -> dict:
    """Tab 1's Q, K and V to edit: the notes' example, or the tables of the URL (or of this
    session, coming back to the page). The editors start again from them (a new version of
    their keys) only when the URL brings tables."""
    ss = st.session_state
    example = vg.help_me_example()
    ver = ss.setdefault("playground.hand_ver", 0)
    fresh = f"playground.Q.v{ver}" not in ss  # the editors were not on the page's last run
    given = state.external and any(f in state.qp for f in HAND.values())
    if "playground.hand_base" in ss and not (fresh or given):
        return ss["playground.hand_base"]
    reset = ss.pop("playground.hand_reset", False)
    base = {}
    for name, field in HAND.items():
        raw = None if reset else state.qp.get(field, state.shared.get(field))
        base[name] = example[name]
        if raw:
            try:
                base[name] = vg.frame_from_url(raw)
            except ValueError as exc:
                state.overridden(field, raw, None, str(exc), used_text=f"the notes' {name}")
    ss["playground.hand_base"] = base
    if given:
        ss["playground.hand_ver"] = ver + 1
    return base


st.title("Playground")
state = url_state.PageState("playground", fields=("model", "text", "tab", "layer", "head", "sym_stack", *CHOICES, *NUMBERS,
                                               "hp_H", *SWITCHES, *HAND.values()))
ss = st.session_state

model_name, model, text_col = widgets.model_header(state)
default_text = model.examples[0] if model is not None and model.examples else widgets.NOTES_EXAMPLES["bank (river)"]
text_key = state.seeded_key("text", default_text)
with text_col:
    text = st.text_input("Sentence (press Enter); used by tabs 2, 3 and 5", key=text_key)
trace = models.get_trace(model_name, text) if model is not None else None

keys = {name: urlflags.option(state, name, default, options) for name, (default, options) in CHOICES.items()}
keys.update({name: url_state.int_from_url(state, name, *spec) for name, spec in NUMBERS.items()})
keys.update({name: urlflags.flag(state, name, default) for name, default in SWITCHES.items()})
keys["hp_H"] = urlflags.option(state, "hp_H", 4, heads_options(ss[keys["hp_d"]]))
if trace is not None:
    stacks = trace.stacks()
    keys["sym_stack"] = urlflags.option(state, "sym_stack", stacks[0], stacks)
hand_base = hand_tables(state)
tab_key = urlflags.tab(state, "tab", PLAY_TABS)
state.show_messages()
tabs = st.tabs(list(PLAY_TABS.values()), key=tab_key, on_change="rerun")


def _room(fig):
    """Fixed margins that fit the rotated key labels, and the title at the very top, above the
    axis title: side-by-side maps with long titles then never run into their labels."""
    fix_margins(fig, min_top=110)
    fig.update_layout(title=dict(y=1.0, yanchor="top", yref="container", pad=dict(t=6)))
    return fig


def fmt_frame(a, rows, cols, digits=4) -> pd.DataFrame:
    return pd.DataFrame(np.asarray(a), index=list(rows), columns=list(cols)).round(digits)


# ================================================================== 1. attention by hand
with tabs[0]:
    st.markdown("Transformers handout's appendix works “help me!” through by hand: two tokens, d_k = 16, scores "
                "q₁·k₁, q₁·k₂, q₂·k₁, q₂·k₂ given, then scaling by 1/√d_k, softmax and the weighted sum of "
                "values. "
                "The notes give only the dot products; the vectors below are one choice that has them. **Edit any "
                "cell** (add or delete rows too): everything below is recomputed by "
                "`core.scaled_dot_product_attention`.")
    st.caption("Construction: the keys mark features — k₁ is 1 on features 1–6, k₂ is 1 on features 7–10. "
               "A query's score against a key is then the sum of its entries on that key's features: q₁ = 1 on "
               "features 1–10 scores 6 and 4; q₂ = 0.5 on features 1–6 and 2 on features 7–10 scores 3 and 8. "
               "Values are illustrative: v₁ = (1, 0, 1), v₂ = (0, 1, 1), so A's first two columns are the "
               "weights and its third is their sum, always 1.")
    ver = st.session_state.setdefault("playground.hand_ver", 0)

    def _reset_hand() -> None:
        st.session_state["playground.hand_ver"] = st.session_state.get("playground.hand_ver", 0) + 1
        st.session_state["playground.hand_reset"] = True

    c = st.columns([1, 1, 2])
    c[0].button("Reset to the notes' example", on_click=_reset_hand, key="playground.hand_reset")
    scaled = c[1].toggle("Scale by 1/√d_k", key=keys["hand_scaled"])
    base = hand_base
    edited = {}
    for name in ("Q", "K", "V"):
        st.markdown(f"**{name}** ({'queries' if name == 'Q' else 'keys' if name == 'K' else 'values'}, one row per token)")
        config = {c: st.column_config.NumberColumn(c, width=46 if name != "V" else 90)
                  for c in base[name].columns if c != vg.LABEL}
        config[vg.LABEL] = st.column_config.TextColumn(vg.LABEL, width=90)
        edited[name] = st.data_editor(base[name], key=f"playground.{name}.v{ver}", num_rows="dynamic",
                                      column_config=config, hide_index=True, width="content")
    mats, msgs = {}, []
    for name in ("Q", "K", "V"):
        mats[name], m = vg.to_matrix(edited[name], name)
        msgs += m
    if not msgs:
        msgs = vg.check_shapes(mats["Q"], mats["K"], mats["V"])
    if msgs:
        for m in msgs:
            st.warning(m)
        st.caption("Your edits are kept; fix the cells above and the results come back.")
    else:
        Q, K, V = mats["Q"], mats["K"], mats["V"]
        res = vg.attention_by_hand(Q, K, V, scaled=scaled)
        ql, kl = vg.row_labels(edited["Q"], "q"), vg.row_labels(edited["K"], "k")
        vl = [label.split(" ")[0] for label in vg.row_labels(edited["V"], "v")]
        d_k = Q.shape[1]
        c = st.columns([1, 1, 1, 1.3])
        c[0].markdown("**Scores Q Kᵀ**")
        c[0].dataframe(fmt_frame(res["scores"], ql, kl), width="stretch")
        c[1].markdown(f"**Scaled F = Q Kᵀ / √{d_k}**" if scaled else "**Unscaled F = Q Kᵀ**")
        c[1].dataframe(fmt_frame(res["scaled"], ql, kl), width="stretch")
        c[2].markdown("**S = softmax(F), row by row**")
        c[2].dataframe(fmt_frame(res["weights"], ql, kl), width="stretch")
        c[3].markdown("**A = S V**")
        c[3].dataframe(fmt_frame(res["output"], ql, [f"A·{j + 1}" for j in range(V.shape[1])]), width="stretch")
        c = st.columns(2)
        c[0].code("\n".join(vg.weighted_sum_text(res["weights"], ql, vl)), language=None)
        w = res["weights"]
        if w.shape == (2, 2):
            c[0].caption(f"To two decimals the weights are {w[0, 0]:.2f} / {w[0, 1]:.2f} and {w[1, 0]:.2f} / "
                       f"{w[1, 1]:.2f}." + ("" if scaled else " Without the 1/√d_k the same scores give a much "
                                            "peakier softmax: turn scaling back on to compare."))
        with c[1]:
            charts.chart(attention_heatmap(w, ql, kl, title="S: attention weights", show_values=True, height=320),
                         key="playground-hand-weights", width="stretch")


# ================================================================== 2. parameter-free
def need_trace() -> bool:
    if trace is None:
        st.info("Type a sentence at the top of the page (and pick a model that loads) to see this.")
        return False
    return True


with tabs[1]:
    st.markdown("Bishop ch. 12's first attempt: let every token be its own query, key and value, with no learned "
                "parameters at all.")
    st.latex(r"Y = \mathrm{softmax}(X X^{\mathsf T})\,X,\qquad a_{nm} = "
             r"\frac{\exp(x_n^{\mathsf T}x_m)}{\sum_{m'}\exp(x_n^{\mathsf T}x_{m'})}")
    if need_trace():
        stack = "encoder" if "embed.encoder.sum" in trace else "decoder"
        toks = trace.tokens("source" if stack == "encoder" else "target")
        c = st.columns([2, 1])
        which = c[0].radio("Rows of X", CHOICES["pf_x"][1], horizontal=True, key=keys["pf_x"],
                           format_func=lambda v: {"sum": f"embed.{stack}.sum (X′ + P: the input to layer 0)",
                                                  "tokens": f"embed.{stack}.tokens (token embeddings only)"}[v])
        div = c[1].toggle("Divide by √D", key=keys["pf_scale"],
                          help="Not in Bishop ch. 12; shows how a temperature softens the diagonal.")
        X = trace[f"embed.{stack}.{which}"].double().numpy()
        D = X.shape[1]
        pf = vg.parameter_free_attention(X, scale=1 / math.sqrt(D) if div else 1.0)
        stats = vg.diagonal_stats(X, pf["scores"], pf["weights"])
        charts.chart(attention_heatmap(pf["weights"], toks, toks,
                                       title=f"softmax(X Xᵀ{' / √D' if div else ''}) on {len(toks)} tokens, D = {D}"),
                     key="playground-pfree", width="stretch")
        st.markdown(
            f"**Why the diagonal wins.** The diagonal score is x_n·x_n = |x_n|² (here {stats['mean_sq_norm']:,.1f} on "
            f"average), an off-diagonal one is |x_n||x_m| cos θ_nm. Different words' embeddings point in different "
            f"directions (mean cos θ between different tokens here {stats['mean_off_cos']:.2f}; largest "
            f"{stats['max_off_cos']:.2f}), so off-diagonal scores are much smaller (mean {stats['mean_off_dot']:,.1f}). "
            f"Softmax exponentiates the gap: the diagonal is the row's largest weight for "
            f"{stats['diag_is_row_max']:.0%} of tokens and gets {stats['mean_diag_weight']:.1%} of the weight on "
            "average, so Y ≈ X: each token mostly copies itself. Only a repeated word (same x) or a near-copy can "
            "compete. That is why Missaoui adds learned projections W_q, W_k, W_v — and the 1/√d_k scaling.")
        Y = pf["Y"]
        cos_yx = (Y * X).sum(1) / np.maximum(np.linalg.norm(Y, axis=1) * np.linalg.norm(X, axis=1), 1e-12)
        table = pd.DataFrame({"token": toks, "a_nn (weight on itself)": np.diag(pf["weights"]),
                              "|x_n|²": (X * X).sum(1), "cos(y_n, x_n)": cos_yx})
        with st.expander("Per token: weight on itself, |x_n|², and how close y_n stays to x_n"):
            st.dataframe(table.style.format({"a_nn (weight on itself)": "{:.4f}", "|x_n|²": "{:,.2f}",
                                             "cos(y_n, x_n)": "{:.4f}"}), width="stretch")


# ================================================================== 3. symmetric vs learned
with tabs[2]:
    st.markdown("Missaoui: to learn the attention, project with one matrix U — queries and keys both XU — and the "
                "scores become X U Uᵀ Xᵀ: a **symmetric** matrix (how much *i* attends to *j* is scored the same as "
                "*j* to *i*). “Unfortunately symmetric, we want asymmetry support”, hence separate W_q ≠ W_k. "
                "Below, one head of the chosen model with its learned W_k, and with W_k replaced by its W_q (U = W_q).")
    if need_trace():
        c = st.columns(3)
        sym_stack = c[0].selectbox("Self-attention of", stacks, key=keys["sym_stack"])
        n_layers = trace.layers(sym_stack)
        n_heads = trace[f"{sym_stack}.0.self_attn.weights"].shape[0]
        of = f"{model_name}'s {sym_stack} self-attention"
        layer_key = url_state.int_from_url(state, "layer", 0, 0, n_layers - 1, of=of)
        head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=of)
        layer = c[1].selectbox("Layer", list(range(n_layers)), key=layer_key)
        head = c[2].selectbox("Head", list(range(n_heads)), key=head_key)
        state.show_messages()
        toks = trace.tokens("source" if sym_stack == "encoder" else "target")
        q, k, mask = vg.head_qk(trace, sym_stack, layer, head)
        sv = vg.symmetric_vs_learned(q, k, mask)
        recorded = trace[f"{sym_stack}.{layer}.self_attn.scaled"][head].double().numpy()
        lim = float(max(np.abs(sv["sym_scores"]).max(), np.abs(sv["learned_scores"]).max(), 1e-6))
        panels = [("sym", "symmetric", "Q Qᵀ / √d_k (symmetric: W_k := W_q)", "{:.2e}"),
                  ("learned", "learned", "Q Kᵀ / √d_k (learned W_k)", "{:.2f}")]
        for col, (name, label, formula, fmt) in zip(st.columns(2), panels):
            with col:
                st.metric(f"asymmetry ‖F − Fᵀ‖ / ‖F‖, {label}", fmt.format(float(sv[f"{name}_asymmetry"])))
                charts.chart(_room(matrix_heatmap(sv[f"{name}_scores"], toks, toks, title=f"scores {formula}",
                                                  zmin=-lim, zmax=lim, colorscale=DIVERGING, x_title="key",
                                                  y_title="query", value_name="score")),
                             key=f"playground-{name}-scores", width="stretch")
                charts.chart(_room(attention_heatmap(sv[f"{name}_weights"], toks, toks,
                                                     title=f"softmax of the {label} scores")),
                             key=f"playground-{name}-weights", width="stretch")
        rope = model is not None and model.config.positional == "rope"
        st.caption(
            "The symmetric score matrix equals its transpose (asymmetry 0 up to rounding); the learned one does not, "
            "so a verb can look at its subject without the subject having to look back at the verb. The softmax "
            "rows of the symmetric map are not a symmetric matrix themselves — each row is normalised by its own "
            "sum — but w_ij·Z_i = w_ji·Z_j: the pull between two tokens is mutual. Its diagonal q_i·q_i = |q_i|² "
            "also tends to win, as in the parameter-free version (tab 2). "
            f"Learned scores agree with the trace's recorded `scaled` to "
            f"{np.abs(sv['learned_scores'] - recorded).max():.1e}."
            + (" The masked (causal) cells are left out of both softmaxes."
               if mask is not None and np.isneginf(mask).any() else "")
            + (" This model uses RoPE: q and k are taken after the rotation, and q_i·q_j is still symmetric."
               if rope else ""))


# ================================================================== 4. scaling
@st.cache_data(show_spinner=False, max_entries=8)
def _scaling(n_keys: int, seed: int) -> pd.DataFrame:
    return vg.scaling_demo(n_keys=n_keys, seed=seed)


with tabs[3]:
    st.markdown("Missaoui: if q and k have independent entries with mean 0 and variance 1, then E[q·k] = 0 and "
                "Var(q·k) = d_k, so the logits spread like √d_k and softmax saturates — nearly one-hot, with tiny "
                "gradients. Dividing by √d_k keeps the spread at 1 whatever d_k is. Sampled here with "
                "q, k ~ N(0, 1), through `core.scaled_dot_product_attention` with scale 1 and 1/√d_k:")
    c = st.columns(2)
    n_keys = c[0].select_slider("Keys per query", CHOICES["sc_keys"][1], key=keys["sc_keys"])
    seed = int(c[1].number_input("Random seed", 0, 10_000, key=keys["sc_seed"]))
    with st.spinner("Sampling…"):
        df = _scaling(int(n_keys), seed)
    std_fig, ent_fig = vg.scaling_figures(df, int(n_keys))
    c = st.columns(2)
    charts.chart(std_fig, key="playground-scaling-std", width="stretch", where=c[0])
    charts.chart(ent_fig, key="playground-scaling-entropy", width="stretch", where=c[1])
    last, first = df.iloc[-1], df.iloc[0]
    st.caption(f"From d_k = {int(first.d_k)} to {int(last.d_k)} the unscaled spread grows from "
               f"{first.std_unscaled:.2f} to {last.std_unscaled:.2f} (√d_k: {first.sqrt_d_k:.0f} → {last.sqrt_d_k:.0f}) and "
               f"the largest weight from {first.max_weight_unscaled:.2f} to {last.max_weight_unscaled:.2f}; scaled, the "
               f"spread stays {df.std_scaled.min():.2f}–{df.std_scaled.max():.2f} and the entropy "
               f"{df.entropy_scaled.min():.2f}–{df.entropy_scaled.max():.2f} nats. Scaling preserves the ranking of "
               "the keys; it only removes the over-confidence.")
    with st.expander("The numbers"):
        st.dataframe(df.round(4), width="stretch")


# ================================================================== 5. hyper-parameters
@st.cache_resource(show_spinner=False, max_entries=2)
def _random_model(cfg_json: str, seed: int):
    return core.load_model("random", config=core.ModelConfig.from_dict(json.loads(cfg_json)), seed=seed)


BUILD_LIMIT = 60_000_000  # parameters: larger models are counted, not built

with tabs[4]:
    st.markdown("The notes' hyper-parameters: d (model width), H heads of size d_k = d/H, m (FFN width), L layers. "
                "Shapes and the parameter count come from `core.Transformer(cfg)` (built on PyTorch's meta device: "
                "shapes without memory); the formula beside it is written out by hand.")
    c = st.columns(5)
    kind = c[0].selectbox("kind", CHOICES["hp_kind"][1], key=keys["hp_kind"])
    d_model = c[1].select_slider("d", CHOICES["hp_d"][1], key=keys["hp_d"])
    heads_opts = heads_options(d_model)
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
        net = vg.meta_model(cfg)
        counted = net.num_parameters()
        formula = vg.param_formula(cfg)
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
                       f"LayerNorms 4d): {vg.layer_formula(cfg)}.")
        st.dataframe(formula.rename(columns={"each": "count (each)", "total": "count (total)"})
                     .style.format({"count (each)": "{:,}", "count (total)": "{:,}"}), width="stretch", hide_index=True)
        with st.expander(f"Every weight tensor ({len(list(net.parameters()))} tensors)"):
            st.dataframe(vg.weight_shapes(net), width="stretch", hide_index=True, height=360)

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
                charts.chart(attention_heatmap(rtrace[f"{rstack}.0.self_attn.weights"][0], rtoks, rtoks,
                                               title=f"random model: {rstack} layer 0, head 0 "
                                                     f"({rtrace.meta['timings']['forward_ms']:.1f} ms forward)"),
                             key="playground-random-attn", width="stretch")
                st.caption("Untrained: the pattern reflects only the random projections (and positions).")
            except InputError as exc:
                st.warning(f"{exc} (needed to run the random model)")
            except Exception as exc:
                st.error(f"Could not build or run that model: {exc}")


# ================================================================== 6. cost
with tabs[5]:
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
            df_cost, finished = vg.cost_grid(Ns, Ds, budget_s=budget,
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
        fit = vg.fit_cost(df_cost)
        charts.chart(vg.cost_figure(df_cost, fit), key="playground-cost", width="stretch")
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

# ------------------------------------------------------------------ URL
example = vg.help_me_example()
defaults = {**{name: spec[0] for name, spec in CHOICES.items()}, **{name: spec[0] for name, spec in NUMBERS.items()}}
in_tabs = {name: urlflags.changed(ss[keys[name]], default) for name, default in defaults.items()}
in_tabs.update({name: urlflags.flag_url(ss[keys[name]], default) for name, default in SWITCHES.items()})
in_tabs["hp_H"] = urlflags.changed(ss[keys["hp_H"]], 4)
in_tabs["hp_built"] = urlflags.flag_url(cfg is not None and ss.get("playground.built") == build_id
                                        and counted <= BUILD_LIMIT)
if trace is not None:
    in_tabs["sym_stack"] = urlflags.changed(ss[keys["sym_stack"]], trace.stacks()[0])
for name, field in HAND.items():
    in_tabs[field] = urlflags.changed(vg.frame_to_url(edited[name]), vg.frame_to_url(example[name]))
state.publish(model=model_name, text=text, layer=st.session_state.get(state.key("layer")),
              head=st.session_state.get(state.key("head")), tab=urlflags.tab_url(state, "tab", PLAY_TABS), **in_tabs)
