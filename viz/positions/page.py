"""Positions: the sinusoidal encoding (Lecture 10, Transformers handout and Missaoui), its relative-distance property, the
notes' "Show me the money" example recomputed in radians, and a model's own positions on the
user's sentence. Numbers come from core; figures from viz.positions.figures and (the formula and
the P heatmap, which the home path draws too) viz.figures.sinusoid."""

import streamlit as st

from viz.figures import sinusoid
from viz.positions import figures as vp
from viz.positions import layers_panel
from viz.ui import charts, models, url_state, url_switches, widgets

widgets.header("positions")
state = url_state.PageState("positions", fields=("model", "text", "d", "n", "bias_head", "degrees"))
st.caption("Self-attention is permutation invariant: without positions, “dog bites man” and “man bites dog” "
           "look the same to it. The sinusoidal encoding adds a fixed vector PE_i to the embedding of the token "
           "at position i (Transformers handout, eq. 2–3, angles in radians):")
st.latex(r"\mathrm{PE}_{i,2j}=\sin\!\left(\frac{i}{10000^{2j/d}}\right),\qquad "
         r"\mathrm{PE}_{i,2j+1}=\cos\!\left(\frac{i}{10000^{2j/d}}\right),\qquad X = X' + P")

# ------------------------------------------------------------------ 1. the matrix
st.subheader("1 · The matrix P (positions × dimensions)")
d_key = url_state.int_from_url(state, "d", 128, 2, vp.MAX_D)
n_key = url_state.int_from_url(state, "n", 64, 1, vp.MAX_N)
if st.session_state[d_key] % 2:
    fixed = st.session_state[d_key] + 1 if st.session_state[d_key] < vp.MAX_D else st.session_state[d_key] - 1
    if "d" in state.from_url:
        state.overridden("d", st.session_state[d_key], fixed, "d must be even (sin/cos pairs)")
    else:
        state.say(f"d must be even (sin/cos pairs); showing d = {fixed} instead of {st.session_state[d_key]}.")
    st.session_state[d_key] = fixed
c = st.columns(2)
d = c[0].slider("d, the embedding dimension", 2, vp.MAX_D, step=2, key=d_key,
                help="Even, so every frequency has its sine and its cosine.")
n = c[1].slider("length, the number of positions", 1, vp.MAX_N, key=n_key)
state.show_messages()

P = sinusoid.pe_matrix(n, d)
rows, cols = vp.stride_indices(n), vp.stride_indices(d, pairs=True)
shown = P[rows][:, cols]
title = f"P for n = {n} positions, d = {d}"
if len(rows) < n or len(cols) < d:
    title += f" (every {rows[1] - rows[0] if len(rows) > 1 else 1}th position, every "\
             f"{(cols[2] - cols[0]) // 2 if len(cols) > 2 else 1}th sin/cos pair shown)"
charts.chart(sinusoid.positional_heatmap(shown, rows, cols, title=title), key="positions-pe", width="stretch")
st.caption("Left columns (small j) oscillate fast, right columns slowly: wavelengths run from 2π to 2π·10000 "
           "in a geometric progression, so every position gets a different pattern of values in [−1, 1]."
           + (" Large matrices are shown strided: the cells shown are exact values at the labelled indices."
              if len(rows) < n or len(cols) < d else ""))

# ------------------------------------------------------------------ 2. chosen dimensions
st.subheader("2 · Chosen dimensions as curves over position")
dims_key = "positions.dims"
if dims_key not in st.session_state:
    st.session_state[dims_key] = [x for x in dict.fromkeys([0, 1, 8, 32]) if x < d]
else:  # d may have shrunk since the dimensions were picked
    st.session_state[dims_key] = [x for x in st.session_state[dims_key] if isinstance(x, int) and 0 <= x < d]
dims = st.multiselect("Dimensions", list(range(d)), key=dims_key,
                      help="Even dimensions are sines, odd ones cosines of the same frequency.")
if dims:
    charts.chart(vp.dimension_curves(P, dims, title=f"PE[i, dim] for i = 0..{n - 1}"), key="positions-curves",
                 width="stretch")
else:
    st.info("Pick one or more dimensions to draw them.")

# ------------------------------------------------------------------ 3. relative positions
st.subheader("3 · PE_i · PE_j depends only on the distance i − j")
G = vp.pe_dot_matrix(P)
g_idx = vp.stride_indices(n)
c = st.columns(2)
with c[0]:
    fig = vp.dot_heatmap(G[g_idx][:, g_idx], g_idx, d, title=f"PE_i · PE_j (n = {n}, d = {d})")
    charts.chart(fig, key="positions-dot", width="stretch")
with c[1]:
    anchors = sorted(set([0, n // 4, n // 2]))
    charts.chart(vp.offset_figure(vp.dot_by_offset(P, anchors), d,
                                  title="PE_i · PE_{i+δ} against δ, from three starting positions i"),
                 key="positions-offset", width="stretch")
st.caption("Each pair (2j, 2j+1) contributes sin(iω)sin(kω) + cos(iω)cos(kω) = cos((i−k)ω), so "
           "PE_i · PE_k = Σ_j cos((i−k)ω_j): the same along every diagonal of the matrix, and the curves from "
           "different i lie on top of each other. This is the notes' linear map M: PE_{i+δ} is a rotation of PE_i "
           "that depends only on δ.")
widgets.show_checks([vp.toeplitz_check(G)])

# ------------------------------------------------------------------ 4. Show me the money
st.subheader("4 · “Show me the money” with d = 4, recomputed")
tables = vp.money_tables(4)
fmt = "{:.4f}"
c = st.columns(3)
# 4 × 4 numbers each: static tables (an interactive data grid per table was a heavy mount)
c[0].markdown("**x′: the notes' embeddings** (inputs)")
c[0].table(tables["x"].style.format(fmt))
c[1].markdown("**PE (radians), computed here**")
c[1].table(tables["pe"].style.format(fmt))
c[2].markdown("**x = x′ + PE, computed here**")
c[2].table(tables["sum"].style.format(fmt))
money = tables["sum"].iloc[3].tolist()
st.latex(r"x_{\text{money}} = x'_{\text{money}} + \mathrm{PE}_3 = ["
         + ",\\ ".join(f"{v:.4f}" for v in money) + "]")
st.info(vp.money_note())
degrees_key = url_switches.flag(state, "degrees")  # the section open or shut is part of the view (URL degrees=1)
degrees = st.expander("The same formula with the angles read as degrees (how the notes' numbers arise)",
                      key=degrees_key, on_change="rerun")
if degrees.open:  # drawn only while open: a closed expander's content is mounted all the same
    degrees.table(tables["pe_degrees"].style.format(fmt))
    degrees.caption("sin and cos of angles under 3° are close to 0 and 1, so in degrees the four positions get "
                    "nearly the same vector. The formula, as in Vaswani et al. (2017), is in radians.")

# ------------------------------------------------------------------ 5. a model's positions on your sentence
st.subheader("5 · Your sentence: the model's own X′, P and X = X′ + P")
top = st.columns([1, 3])
with top[0]:
    model_name = widgets.model_picker(state)
widgets.random_note(model_name)
model = models.get_model(model_name)
widgets.sidebar(model)
text_key = state.seeded_key("text", widgets.NOTES_EXAMPLES["Show me the money"])
with top[1]:
    text = widgets.text_box("Sentence", text_key)
state.show_messages()

trace = models.get_trace(model_name, text) if model is not None else None
if trace is not None:
    info = vp.model_positions(trace)
    toks = info["tokens"]
    labels = [f"{i}: {t}" for i, t in enumerate(toks)]
    widgets.token_chips(toks, title=f"{len(toks)} tokens into the {info['stack']}")
    scheme = info["scheme"]
    if info["P"] is None:
        cfg = model.config
        if scheme == "rope":
            st.info(f"{model_name} uses rotary position embeddings (RoPE): nothing is added to the embeddings, "
                    f"so X = X′ and there is no P to show. Instead, in every layer each pair of query/key features "
                    f"is rotated by the angle i·θ^(−2j/d_k) (θ = {cfg.rope_theta:g}, d_k = {cfg.d_head}), so "
                    "q_i·k_j depends on the offset i − j. The angles for your sentence:")
            ang = vp.rope_angle_matrix(len(toks), cfg.d_head, cfg.rope_theta)
            charts.chart(vp.rope_angle_figure(ang, labels), key="positions-rope", width="stretch")
            layers_panel.layers(model, model_name, text, info["stack"])
        elif scheme == "relative" and vp.position_bias(trace) is not None:
            bias = vp.position_bias(trace)
            n_heads = bias["bias"].shape[0]
            st.info(f"{model_name} adds no position vectors (X = X′). Instead every head learns one number per "
                    f"bucket of the distance j − i between key and query, added to the attention scores before the "
                    f"softmax (T5's relative position bias; {cfg.rel_buckets} buckets, exact for short distances, "
                    f"logarithmic up to {cfg.rel_max_distance}). It is computed once per stack and shared by all its "
                    f"layers; the {bias['stack']}'s buckets "
                    + ("tell keys before the query from keys after it." if bias["stack"] == "encoder"
                       else "only look back."))
            head_key = url_state.int_from_url(state, "bias_head", 0, 0, n_heads - 1, of=f"{model_name}'s position bias")
            bias_head = st.slider("Head", 0, n_heads - 1, key=head_key)
            state.show_messages()
            charts.chart(vp.bias_heatmap(bias, bias_head, labels), key="positions-bias", width="stretch")
            charts.chart(vp.bias_by_distance_figure(bias, title="Every head's bias against the distance j − i"),
                            key="positions-bias-distance", width="stretch")
            st.caption("Each diagonal of the heatmap is one distance, so it holds one value (largest spread along "
                       f"a diagonal here: {bias['diagonal_spread']:.1e}). Heads differ: some prefer nearby keys, "
                       "some keys before or after the query. Inside a head shows the bias added to the scores.")
        else:
            st.info(f"{model_name} has no positional encoding (positional = {scheme!r}): X = X′.")
    else:
        scale_note = " (scaled by √d)" if info["embed_scale"] else ""
        height = int(min(640, 200 + 16 * len(toks)))
        for key, z, title in [
            ("positions-model-tokens", info["tokens_emb"], f"X′: token embeddings{scale_note}"),
            ("positions-model-pe", info["P"], f"P: {scheme} positions added by {model_name} ({info['stack']})"),
            ("positions-model-sum", info["X"], "X = X′ + P: the input to layer 0"),
        ]:
            charts.chart(sinusoid.positional_heatmap(z, title=title, y_title="position: token", y_labels=labels,
                                                     height=height), key=key, width="stretch")
        notes = []
        if info["embed_scale"]:
            notes.append(f"This model multiplies its token embeddings by √d = {info['d'] ** 0.5:.2f} before adding P "
                         "(Vaswani et al.), so the positions are a small perturbation of the words.")
        if scheme == "sinusoidal" and info["sinusoid_layout"] == "half":
            notes.append("Its P holds the formula's sines in the first half of the dimensions and the cosines in "
                         "the second half (Marian's layout) instead of interleaving them: the same numbers, "
                         "columns reordered.")
        if info["embed_norm"] or info["types"]:
            notes.append("X here is LayerNorm(X′ + P + token-type embedding), as in BERT, so X ≠ X′ + P exactly.")
        if notes:
            st.caption(" ".join(notes))
        if info["checks"]:
            widgets.show_checks(info["checks"])
        else:
            st.info("This trace has no model to read the position table from (loaded from a file), so its P and X "
                    "are shown without a check.")
        if scheme == "learned":
            Gm = vp.pe_dot_matrix(info["P"])
            charts.chart(vp.learned_dot_figure(Gm, labels), key="positions-model-dot", width="stretch")
            st.caption("Learned positions are trained freely; compare their dot products with the banded pattern of "
                       "the sinusoidal matrix in section 3.")

if trace is not None and vp.position_bias(trace) is None:
    state.ignored_if_given("bias_head", f"{model_name} has no relative position bias (T5 has)")
    state.show_messages()
bias_key = state.key("bias_head")
state.publish(model=model_name, text=text, d=d, n=n, degrees=url_switches.flag_url(st.session_state[degrees_key]),
              bias_head=st.session_state.get(bias_key) if trace is not None and vp.position_bias(trace) else None)
