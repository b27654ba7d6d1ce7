"""Inside a head: one head of one layer, step by step, on the user's own sentence.

X -> (+P) -> Q, K, V -> QKᵀ -> /√d_k -> +M -> softmax -> AV -> Concat(heads) Wᴼ -> add & norm
-> FFN -> add & norm, in the order the model computes them (post- or pre-norm), each step
the real recorded tensor with its formula in the notes' notation (tokens as rows, or as
columns like Lecture 10), its shape, and numerical checks. Steps come from viz.inside.step_model,
checks from viz.inside.step_checks, figures from viz.inside.figures.
"""

import streamlit as st

from core import trace_names as tn
from viz.figures import why as why_figures
from viz.figures.citations import cite_text
from viz.figures.select import axis_tokens
from viz.figures.sparse import add_selection_outline, selection_of
from viz.inside import latent_panel
from viz.inside.figures import MAX_TOKENS_DRAWN, drawn_matrix, step_figure
from viz.inside.step_checks import layer_checks
from viz.inside.step_model import NOTATIONS, ROWS, Step, block_notes, groups, kv_head, layer_steps, shapes_table
from viz.ui import charts, downloads, models, training_panel, url_state, vocab, why_panel, widgets
from viz.ui.download_sizes import human, layer_bytes

CLICKABLE = ("scores", "scaled", "masked", "weights")  # maps whose cells open "Why here?"
INSIDE_LAYER_BYTES = 3 * 2**30 // 2  # one layer's every name above this is not computed here (long inputs)

widgets.header("inside")
st.caption("One attention head of one layer, computed step by step on your sentence. Every picture is the real "
           "tensor the model recorded; every formula is the one that produced it.")
state = url_state.PageState("inside", fields=("model", "text", "target", "attn", "layer", "head", "notation", "step_train")
                              + why_panel.FIELDS)

model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()

examples = vocab.dedupe_examples(list(widgets.NOTES_EXAMPLES.items()) + [(s, s) for s in model.examples[:4]])
text_key = state.seeded_key("text", model.examples[0] if model.examples else widgets.NOTES_EXAMPLES["help me!"])
target_key = state.seeded_key("target", "")


def _use_example(sentence: str) -> None:
    st.session_state[text_key] = sentence
    st.session_state[target_key] = ""


with text_col:
    text = widgets.text_box("Sentence", text_key)
target = ""
if model.kind == "encoder":
    state.ignored_if_given("target", f"{model_name} is an encoder: it reads no target")
if model.kind == "encoder-decoder":
    target = widgets.text_box("Target (optional, teacher forcing; empty = the model's own greedy translation)",
                             target_key)
elif model.kind == "decoder":
    target = widgets.text_box("Continuation (optional, appended to the prompt)", target_key)
widgets.example_buttons(examples, "inside-ex", _use_example, max_cols=6)
run_model = training_panel.training_step(state, model_name, model, text, "inside")  # toy-translate: a training step

trace = models.get_trace(run_model, text, target or None)
if trace is None:
    state.end_here(model=model_name, text=text, target=target or None)

vocab.offer_reader(state, model_name, trace, key="inside-reader")
widgets.token_chips(trace.tokens("source"), title=f"{len(trace.tokens('source'))} source tokens")
if trace.tokens("target") and model.kind == "encoder-decoder":
    widgets.token_chips(trace.tokens("target"), title=f"decoder input ({trace.meta.get('mode', '')})")

# ------------------------------------------------------------------ what to show
c = st.columns([2, 1, 1, 2.4])
attn, stack, kind, layer, head, layer_key, head_key = widgets.attention_picker(state, trace, c)
n_layers, n_heads = trace.layers(stack), trace.n_heads(stack)
notation_key = state.seeded_key("notation", ROWS, valid=lambda v: v in NOTATIONS,
                          why=f"notations: {', '.join(NOTATIONS)}")
notation = c[3].radio("Notation", list(NOTATIONS), key=notation_key,
                      format_func=lambda v: cite_text(NOTATIONS[v]))
q_side, k_side = axis_tokens(trace, stack, kind)
why_keys = why_panel.seed(state, len(q_side), len(k_side), causal=stack == "decoder" and kind == "self_attn")
state.show_messages()
state.publish(model=model_name, text=text, target=target or None, attn=attn, layer=layer, head=head,
              notation=notation, **why_panel.url(why_keys))

cfg = model.config
if (need := layer_bytes(trace, stack)) > INSIDE_LAYER_BYTES:  # every step of a layer, every head: sized from shapes
    st.warning(f"Inside a head computes every step of layer {layer} for all its heads: {human(need)} at this length, "
               f"more than this page holds ({human(INSIDE_LAYER_BYTES)}). Explore reads long inputs one head and a tile "
               "of rows at a time (its Long document tab too); or shorten the text.")
    st.stop()
try:
    steps = layer_steps(trace, stack, kind, layer, head, cfg)
    checks = layer_checks(trace, stack, kind, layer, head, notation)
except (KeyError, IndexError, ValueError) as exc:  # a trace without the names this page reads
    st.error(f"This trace lacks a tensor the step-by-step view needs ({exc}). Try another attention or model.")
    st.stop()

# ------------------------------------------------------------------ header notes
sym = shapes_table(trace, stack, kind, cfg)
st.caption("Sizes, in the notes' symbols: " + " · ".join(f"${r.symbol}$ = {r.value} ({cite_text(r.meaning)})"
                                                          for r in sym.itertuples()))
place = ("post-norm (Chapter 9 and Transformers handout: Norm after each residual add)" if cfg.norm_placement == "post"
         else "pre-norm (Norm before each sub-layer, residual added after; the order shown below)")
if cfg.norm_placement == "pre" and cfg.post_sublayer_norm:
    place = ("norms after the sub-layers (each sub-layer's output normed before the residual add"
             + ("; and before it" if cfg.pre_sublayer_norm else "; none before it") + "; the order shown below)")
if cfg.parallel_block:
    place = "parallel block (attention and FFN both read the layer's input, X + attention + FFN; shown below)"
extras = ([f"QK-norm ({'per head' if cfg.qk_norm in ('head', 'l2') else 'whole projection'})"] if cfg.qk_norm else []) + (
    [f"partial rotary ({cfg.rotary_dim} of {cfg.d_head} features)"] if cfg.rotary_dim else [])
if extras:
    place += "; " + "; ".join(extras)
st.caption(f"{model_name}: {place}; {cfg.norm}; FFN activation {cfg.activation}; positions {cfg.positional}.")
if block_notes(cfg, trace, stack, layer):
    st.caption(f"This model's block: {block_notes(cfg, trace, stack, layer)} (the steps below follow that order).")
if notation == ROWS:
    st.info(r"Tokens as rows, as in Bishop ch. 12, Chapter 9, Transformers handout and Missaoui: $X \in \mathbb{R}^{n \times d}$, $Q = XW_q$, "
            r"$A = \operatorname{softmax}(QK^T/\sqrt{d_k} + M)$, $\text{head} = AV$. Switch the notation to see "
            "Lecture 10's column form: every picture transposed, every formula rewritten.")
else:
    st.info(r"Tokens as columns, as in Lecture 10 (which writes $p$ for $d_k$): $X = [x_1, \dots, x_n] \in "
            r"\mathbb{R}^{d \times n}$, $Q = W_Q^T X$, $Z = V \operatorname{softmax}(\cdot)$. Every picture is the "
            r"transpose of the row form. Lecture 10 writes $Z = V \operatorname{softmax}(Q^T K/\sqrt{p})$; $Q^T K$ has "
            r"one row per query, so for $V \operatorname{softmax}(\cdot)$ to average the values over the keys the "
            r"matrix must be read as $K^T Q/\sqrt{p}$, normalised column by column: that is what is drawn (the same "
            "numbers as the row view, transposed).")
n_kv = trace[tn.attn(stack, layer, kind, "k")].shape[0]
if n_kv != n_heads:
    g = kv_head(head, n_heads, n_kv)
    st.caption(f"Grouped-query attention: {n_heads} query heads, {n_kv} key/value heads; query head {head} reads "
               rf"key/value head $\lfloor {head} / ({n_heads}/{n_kv}) \rfloor$ = {g}.")
drawn = {s.key: drawn_matrix(s, notation)[5] for s in steps if s.matrix is not None}
n_tokens = max(len(q_toks_all) for q_toks_all in axis_tokens(trace, stack, kind))
if n_tokens > MAX_TOKENS_DRAWN:
    st.info(f"Long input ({n_tokens} tokens): to keep the page responsive, token axes are drawn as block means of "
            f"neighbouring tokens (at most {MAX_TOKENS_DRAWN} blocks) and wide feature axes show their "
            "first features only; each step says what it draws. The checks and the downloads use the full tensors.")
elif any(drawn.values()):
    st.caption("Wide matrices show their first features only (each step says so); the checks and downloads use "
               "the full tensors.")

failed = [c for cs in checks.values() for c in cs if not c.ok]
if failed:
    st.error(f"{len(failed)} check{'s' if len(failed) > 1 else ''} failed on this view: the model's recorded tensors "
             "differ from the independent recomputation. The failing steps below are marked ✗.")
st.caption("Checks: each ✓ compares the core's recorded tensor with the same quantity computed again in float64 "
           "numpy from the layer's stored input and the checkpoint's own weights (viz/figures/reference.py; T5's position "
           "bias read from the trace), A V with the fused kernel's head output, or the explicit re-run with the "
           "fused pass, within 10⁻⁴ × max(1, largest |value|) for float32 weights (the mask and A's zeros exactly, "
           "row sums to 10⁻⁵); each line gives its error and tolerance, and a failure is shown as a red error box.")
if checks.note:
    st.info(checks.note)

# ------------------------------------------------------------------ the steps
q_toks, k_toks = axis_tokens(trace, stack, kind)
if kind == tn.SELF and getattr(cfg, "mla", None) is not None:
    latent_panel.latent_section(trace, stack, layer, head, q_toks)
if kind == tn.SELF:
    latent_panel.shared_kv_section(model, stack, layer)
    latent_panel.gate_section(trace, stack, layer, q_toks)


def show_step(i: int, step: Step) -> None:
    st.markdown(f"**{i}. {cite_text(step.title)}**")
    left, right = st.columns([5, 6])
    with left:
        if step.latex(notation):
            st.latex(step.latex(notation))
        shape = ("  \n" + f"shape ${step.shape_latex(notation)}$" + (f" · trace name `{step.name}`" if step.name else "")
                 + (f" · drawn: {drawn[step.key]}" if drawn.get(step.key) else "")) if step.matrix is not None else ""
        st.caption(cite_text(step.explain) + shape)  # one element: each one mounted costs the browser
        widgets.show_checks(checks.get(step.key, []))
    with right:
        if step.matrix is None:
            st.info("Nothing to draw at this step for this model.")
        else:
            fig_key = f"inside-{step.key}-fig"
            fig = step_figure(step, notation, title="")
            if step.key == "weights" and not drawn.get(step.key) and kind == tn.SELF:
                sel = selection_of(trace, stack, layer, head)
                if sel is not None:  # a sparse layer: the keys the indexer kept, outlined
                    add_selection_outline(fig, sel["selected"], transposed=notation != ROWS)
            if step.key in CLICKABLE and not drawn.get(step.key) and why_figures.add_cell_targets(fig, notation != ROWS):
                charts.chart(fig, key=fig_key, width="stretch",  # a click on a cell opens "Why here?"
                             selection_mode="points",
                             on_select=lambda k=fig_key: why_panel.pick(k, why_keys["why"], transposed=notation != ROWS))
                st.caption("Click a cell: why does the head give it this score?")
            else:
                charts.chart(fig, key=fig_key, width="stretch")
    if step.key == "weights":
        full = trace[tn.attn(stack, layer, kind, "weights")][head]
        downloads.offer(trace, full, q_toks, k_toks, model=model_name, stack=stack, kind=kind, layer=layer, head=head,
                 key="inside-dl")
        st.caption("The CSV has one row per query (the row form), whatever the notation.")
        if kind == tn.SELF:
            latent_panel.selection_section(trace, stack, layer, head, q_toks, k_toks)
        why_panel.panel(state, why_keys, trace, model_name, text, stack, kind, layer, head, q_side, k_side,
                        key="inside")


def _remember_open(key: str) -> None:
    st.session_state[f"{key}.open"] = bool(st.session_state.get(key))


# Each group is an expander drawn only while open: the input and the weights' group start open,
# the others closed (the page mounted some twenty charts at once). A closed group's failed
# check still shows, as an error under it. Whether a group is open is kept under `<key>.open`:
# its label names the head, so the expander is a new element when the head changes.
i = 0
for gi, (group, members) in enumerate(groups(steps), start=1):
    group_key = f"inside.group-{gi}"
    first_open = gi == 1 or any(s.key == "weights" for s in members)
    box = st.expander(f"{gi}. {group}", expanded=st.session_state.setdefault(f"{group_key}.open", first_open),
                      key=group_key, on_change=_remember_open, args=(group_key,))
    if box.open is False:
        failed = [c for s in members for c in checks.get(s.key, []) if not c.ok]
        if failed:
            st.error(f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed in “{gi}. {group}” (closed; "
                     "open it to see): " + "; ".join(cite_text(c.text()) for c in failed))
        i += len(members)
        continue
    with box:
        for step in members:
            i += 1
            show_step(i, step)
