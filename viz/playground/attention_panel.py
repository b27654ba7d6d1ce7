"""The Playground's first four tabs, about attention itself: attention by hand (the
Transformers handout's “help me!”), parameter-free attention softmax(X Xᵀ) X (Bishop ch. 12),
symmetric against learned scores and why scores are scaled (Missaoui). Each tab is one
function, drawn inside its st.tab by viz/playground/page.py; the numbers and figures come
from viz.figures.by_hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from core import trace_names as tn
from viz.figures import by_hand
from viz.figures.checks import scaled_check
from viz.figures.heatmaps import DIVERGING, attention_heatmap, matrix_heatmap
from viz.ui import charts, url_state
from viz.playground.controls_panel import CHOICES
from viz.figures.reference import NoReference


def _need_trace(trace) -> bool:
    if trace is None:
        st.info("Type a sentence at the top of the page (and pick a model that loads) to see this.")
        return False
    return True


def _reset_hand() -> None:
    st.session_state["playground.hand_ver"] = st.session_state.get("playground.hand_ver", 0) + 1
    st.session_state["playground.hand_reset"] = True


# ================================================================== 1. attention by hand
def hand_tab(keys: dict, base: dict) -> dict:
    """Tab 1: edit Q, K and V (starting from `base`, playground_controls.hand_tables) and see
    every step of softmax(Q Kᵀ / √d_k) V. Returns the edited tables."""
    st.markdown("Transformers handout's appendix works “help me!” through by hand: two tokens, d_k = 16, scores "
                "q₁·k₁, q₁·k₂, q₂·k₁, q₂·k₂ given, then scaling by 1/√d_k, softmax and the weighted sum of "
                "values. "
                "The notes give only the dot products; the vectors below are one choice that has them. **Edit any "
                "cell** under “Edit Q, K and V” (add or delete rows too): everything below is recomputed by "
                "`core.scaled_dot_product_attention`.")
    st.caption("Construction: the keys mark features — k₁ is 1 on features 1–6, k₂ is 1 on features 7–10. "
               "A query's score against a key is then the sum of its entries on that key's features: q₁ = 1 on "
               "features 1–10 scores 6 and 4; q₂ = 0.5 on features 1–6 and 2 on features 7–10 scores 3 and 8. "
               "Values are illustrative: v₁ = (1, 0, 1), v₂ = (0, 1, 1), so A's first two columns are the "
               "weights and its third is their sum, always 1.")
    ver = st.session_state.setdefault("playground.hand_ver", 0)
    c = st.columns([1, 1, 2])
    c[0].button("Reset to the notes' example", on_click=_reset_hand, key="playground.hand_reset")
    scaled = c[1].toggle("Scale by 1/√d_k", key=keys["hand_scaled"])
    edited = {}
    # The editors (data grids) sit in a popover: they run on every pass, so the edits and the URL are
    # kept, but a closed popover mounts nothing; the page shows the current tables as static tables.
    with c[2].popover("Edit Q, K and V", icon=":material/edit:", key="playground.hand_edit"):
        for name in ("Q", "K", "V"):
            st.markdown(f"**{name}**")
            config = {c: st.column_config.NumberColumn(c, width=46 if name != "V" else 90)
                      for c in base[name].columns if c != by_hand.LABEL}
            config[by_hand.LABEL] = st.column_config.TextColumn(by_hand.LABEL, width=90)
            edited[name] = st.data_editor(base[name], key=f"playground.{name}.v{ver}", num_rows="dynamic",
                                          column_config=config, hide_index=True, width="content")
    for name in ("Q", "K", "V"):
        st.markdown(f"**{name}** ({'queries' if name == 'Q' else 'keys' if name == 'K' else 'values'}, one row per token)")
        st.table(edited[name].set_index(by_hand.LABEL) if by_hand.LABEL in edited[name].columns else edited[name])
    mats, msgs = {}, []
    for name in ("Q", "K", "V"):
        mats[name], m = by_hand.to_matrix(edited[name], name)
        msgs += m
    if not msgs:
        msgs = by_hand.check_shapes(mats["Q"], mats["K"], mats["V"])
    if msgs:
        for m in msgs:
            st.warning(m)
        st.caption("Your edits are kept; fix the cells above and the results come back.")
    else:
        Q, K, V = mats["Q"], mats["K"], mats["V"]
        res = by_hand.attention_by_hand(Q, K, V, scaled=scaled)
        ql, kl = by_hand.row_labels(edited["Q"], "q"), by_hand.row_labels(edited["K"], "k")
        vl = [label.split(" ")[0] for label in by_hand.row_labels(edited["V"], "v")]
        d_k = Q.shape[1]
        # A few numbers each: static tables and plain text, not data grids and a code block (each
        # grid mounts a canvas; st.code loads the syntax highlighter, ~0.2 s of the first load).
        c = st.columns([1, 1, 1, 1.3])
        c[0].markdown("**Scores Q Kᵀ**")
        c[0].table(by_hand.number_frame(res["scores"], ql, kl))
        c[1].markdown(f"**Scaled F = Q Kᵀ / √{d_k}**" if scaled else "**Unscaled F = Q Kᵀ**")
        c[1].table(by_hand.number_frame(res["scaled"], ql, kl))
        c[2].markdown("**S = softmax(F), row by row**")
        c[2].table(by_hand.number_frame(res["weights"], ql, kl))
        c[3].markdown("**A = S V**")
        c[3].table(by_hand.number_frame(res["output"], ql, [f"A·{j + 1}" for j in range(V.shape[1])]))
        c = st.columns(2)
        c[0].text("\n".join(by_hand.weighted_sum_text(res["weights"], ql, vl)))
        w = res["weights"]
        if w.shape == (2, 2):
            c[0].caption(f"To two decimals the weights are {w[0, 0]:.2f} / {w[0, 1]:.2f} and {w[1, 0]:.2f} / "
                       f"{w[1, 1]:.2f}." + ("" if scaled else " Without the 1/√d_k the same scores give a much "
                                            "peakier softmax: turn scaling back on to compare."))
        with c[1]:
            charts.chart(attention_heatmap(w, ql, kl, title="S: attention weights", show_values=True, height=320),
                         key="playground-hand-weights", width="stretch")
    return edited


# ================================================================== 2. parameter-free
def parameter_free(trace, keys: dict) -> None:
    """Tab 2: Y = softmax(X Xᵀ) X on the trace's embeddings, and why the diagonal wins."""
    st.markdown("Bishop ch. 12's first attempt: let every token be its own query, key and value, with no learned "
                "parameters at all.")
    st.latex(r"Y = \mathrm{softmax}(X X^{\mathsf T})\,X,\qquad a_{nm} = "
             r"\frac{\exp(x_n^{\mathsf T}x_m)}{\sum_{m'}\exp(x_n^{\mathsf T}x_{m'})}")
    if _need_trace(trace):
        stack = "encoder" if tn.embed("encoder", "sum") in trace else "decoder"
        toks = trace.tokens("source" if stack == "encoder" else "target")
        c = st.columns([2, 1])
        which = c[0].radio("Rows of X", CHOICES["pf_x"][1], horizontal=True, key=keys["pf_x"],
                           format_func=lambda v: {"sum": f"{tn.embed(stack, 'sum')} (X′ + P: the input to layer 0)",
                                                  "tokens": f"{tn.embed(stack, 'tokens')} (token embeddings only)"}[v])
        div = c[1].toggle("Divide by √D", key=keys["pf_scale"],
                          help="Not in Bishop ch. 12; shows how a temperature softens the diagonal.")
        X = trace[tn.embed(stack, which)].double().numpy()
        D = X.shape[1]
        pf = by_hand.parameter_free_attention(X, scale=1 / math.sqrt(D) if div else 1.0)
        stats = by_hand.diagonal_stats(X, pf["scores"], pf["weights"])
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
        table = by_hand.self_copy_table(X, pf, toks)
        with st.expander("Per token: weight on itself, |x_n|², and how close y_n stays to x_n"):
            st.dataframe(table.style.format({"a_nn (weight on itself)": "{:.4f}", "|x_n|²": "{:,.2f}",
                                             "cos(y_n, x_n)": "{:.4f}"}), width="stretch")


# ================================================================== 3. symmetric vs learned
def symmetric(state: url_state.PageState, trace, model, model_name: str, keys: dict) -> None:
    """Tab 3: one head's learned scores against the symmetric ones with W_k := W_q."""
    st.markdown("Missaoui: to learn the attention, project with one matrix U — queries and keys both XU — and the "
                "scores become X U Uᵀ Xᵀ: a **symmetric** matrix (how much *i* attends to *j* is scored the same as "
                "*j* to *i*). “Unfortunately symmetric, we want asymmetry support”, hence separate W_q ≠ W_k. "
                "Below, one head of the chosen model with its learned W_k, and with W_k replaced by its W_q (U = W_q).")
    if _need_trace(trace):
        c = st.columns(3)
        sym_stack = c[0].selectbox("Self-attention of", trace.stacks(), key=keys["sym_stack"])
        n_layers = trace.layers(sym_stack)
        n_heads = trace.n_heads(sym_stack)
        of = f"{model_name}'s {sym_stack} self-attention"
        layer_key = url_state.int_from_url(state, "layer", 0, 0, n_layers - 1, of=of)
        head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=of)
        layer = c[1].selectbox("Layer", list(range(n_layers)), key=layer_key)
        head = c[2].selectbox("Head", list(range(n_heads)), key=head_key)
        state.show_messages()
        toks = trace.tokens("source" if sym_stack == "encoder" else "target")
        q, k, mask = by_hand.head_qk(trace, sym_stack, layer, head)
        sv = by_hand.symmetric_vs_learned(q, k, mask, scale=model.config.attn_scale if model is not None else None)
        lim = float(max(np.abs(sv["sym_scores"]).max(), np.abs(sv["learned_scores"]).max(), 1e-6))
        panels = [("sym", "symmetric", "Q Qᵀ / √d_k (symmetric: W_k := W_q)", "{:.2e}"),
                  ("learned", "learned", "Q Kᵀ / √d_k (learned W_k)", "{:.2f}")]
        for col, (name, label, formula, fmt) in zip(st.columns(2), panels):
            with col:
                st.metric(f"asymmetry ‖F − Fᵀ‖ / ‖F‖, {label}", fmt.format(float(sv[f"{name}_asymmetry"])))
                scores = matrix_heatmap(sv[f"{name}_scores"], toks, toks, title=f"scores {formula}", zmin=-lim,
                                        zmax=lim, colorscale=DIVERGING, x_title="key", y_title="query",
                                        value_name="score")
                charts.chart(by_hand.room_for_title(scores), key=f"playground-{name}-scores", width="stretch")
                weights = attention_heatmap(sv[f"{name}_weights"], toks, toks, title=f"softmax of the {label} scores")
                charts.chart(by_hand.room_for_title(weights), key=f"playground-{name}-weights", width="stretch")
        rope = model is not None and model.config.positional == "rope"
        st.caption(
            "The symmetric score matrix equals its transpose (asymmetry 0 up to rounding); the learned one does not, "
            "so a verb can look at its subject without the subject having to look back at the verb. The softmax "
            "rows of the symmetric map are not a symmetric matrix themselves — each row is normalised by its own "
            "sum — but w_ij·Z_i = w_ji·Z_j: the pull between two tokens is mutual. Its diagonal q_i·q_i = |q_i|² "
            "also tends to win, as in the parameter-free version (tab 2)."
            + (" The masked (causal) cells are left out of both softmaxes."
               if mask is not None and np.isneginf(mask).any() else "")
            + (" This model uses RoPE: q and k are taken after the rotation, and q_i·q_j is still symmetric."
               if rope else ""))
        try:
            chk = scaled_check(trace, sym_stack, layer, head, sv["learned_scores"])
        except NoReference as exc:
            st.caption(f"The learned scores are not checked here: {exc}.")
        else:
            if chk.ok:
                st.success(chk.text())
            else:
                st.error(chk.text() + " The learned map above does not match the model's weights.")


# ================================================================== 4. scaling
@st.cache_data(show_spinner=False, max_entries=8)
def _scaling(n_keys: int, seed: int) -> pd.DataFrame:
    return by_hand.scaling_demo(n_keys=n_keys, seed=seed)


def scaling(keys: dict) -> None:
    """Tab 4: Var(q·k) = d_k, sampled, with and without the 1/√d_k."""
    st.markdown("Missaoui: if q and k have independent entries with mean 0 and variance 1, then E[q·k] = 0 and "
                "Var(q·k) = d_k, so the logits spread like √d_k and softmax saturates — nearly one-hot, with tiny "
                "gradients. Dividing by √d_k keeps the spread at 1 whatever d_k is. Sampled here with "
                "q, k ~ N(0, 1), through `core.scaled_dot_product_attention` with scale 1 and 1/√d_k:")
    c = st.columns(2)
    n_keys = c[0].select_slider("Keys per query", CHOICES["sc_keys"][1], key=keys["sc_keys"])
    seed = int(c[1].number_input("Random seed", 0, 10_000, key=keys["sc_seed"]))
    with st.spinner("Sampling…"):
        df = _scaling(int(n_keys), seed)
    std_fig, ent_fig = by_hand.scaling_figures(df, int(n_keys))
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
