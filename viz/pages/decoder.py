"""Decoder stepper: the decoder generating one token at a time under its look-ahead mask.

Inference: greedy decoding from <start> (or from the prompt, for a decoder-only model) to
<end> or the maximum length; step t shows the prefix, the mask M, the masked scores
QKᵀ/√d_k + M, the weights, the cross-attention over the source and the next-token
distribution. Teacher forcing: the whole typed target at once under the same mask (seed
003), with the check that its rows equal the inference rows for the same prefix.
All steps come from common.get_steps (computed once, cached): moving between steps does
no model work.
"""

import time

import numpy as np
import streamlit as st

import core
from viz import decoder as dv
from viz.pages import charts, common, dl, training_panel

DECODER_KINDS = ("encoder-decoder", "decoder")
PLAY_DELAY_S = 0.7
THREE_UP_TO, TWO_UP_TO = 4, 24  # matrices three to a row up to this many tokens, then two, then one
MODES = {"inference": "Inference (greedy, one token per step)", "teacher": "Teacher forcing (whole target at once)"}
PLAYING, GOTO, PREFILL, GENERATED = "decoder._playing", "decoder._goto", "decoder._prefill", "decoder._generated"
RESUME = "decoder._resume"

st.title("Decoder stepper")
st.caption("The decoder writes its output one token at a time. At every step it reads the tokens so far, "
           "a look-ahead mask stops each position from seeing the ones after it, and the last row's output "
           "becomes a distribution over the next token (Lecture 10: masked self-attention and cross-attention; "
           "Transformers handout: inference from <start> to <end>, and teacher forcing).")
state = common.PageState("decoder", fields=("model", "text", "mode", "target", "layer", "head", "step", "step_train"))
ss = st.session_state
# Play advances one step per rerun and marks each of its reruns; any other run (a click, a page
# switch and back, a reload) pauses it, so coming back to the page never jumps to the end.
_resumed = bool(ss.pop(RESUME, False))
if ss.get(PLAYING) and not _resumed:
    ss[PLAYING] = False

allowed = [n for n, spec in core.MODELS.items() if spec.kind in DECODER_KINDS]
allowed += [n for n, m in common.local_models().items() if m.kind in DECODER_KINDS]
model_name, model, text_col = common.model_header(
    state, allowed=allowed, needs="the decoder stepper needs a model that generates text (a decoder or an encoder-decoder)")
if model is None:
    st.stop()
if model.kind not in DECODER_KINDS:  # the registry's kind said otherwise; the loaded model decides
    st.error(f"{model_name} is an {model.kind} model: it does not generate text. Pick a decoder model.")
    st.stop()
decoder_only = model.kind == "decoder"

text_key = state.seed("text", model.examples[0] if model.examples else common.NOTES_EXAMPLES["Show me the money"])
has_url_target = bool(state.qp.get("target"))
mode_key = state.seed("mode", "teacher" if has_url_target else "inference", valid=lambda v: v in MODES,
                      why=f"modes: {', '.join(MODES)}")
if ss.get(mode_key) not in MODES:
    ss[mode_key] = "inference"


def _use_example(sentence: str) -> None:
    ss[text_key] = sentence
    ss[PLAYING] = False
    ss[PREFILL] = True  # a new sentence: teacher forcing starts from its greedy output


def _mode_changed() -> None:
    ss[PLAYING] = False
    typed = ss.get(state.key("target")) or ss.get("_shared", {}).get("target") or ""
    if ss.get(mode_key) == "teacher" and not typed.strip():
        ss[PREFILL] = True


with text_col:
    if decoder_only:  # prompts may hold newlines (chat templates): a text area keeps them
        text = st.text_area("Prompt (the decoder's prefix; press Ctrl+Enter)", key=text_key, height=80,
                            help="The prompt is the decoder's input; generated tokens follow it.")
    else:
        text = st.text_input("Source sentence (press Enter)", key=text_key, help="Type a sentence and press Enter.")

examples = [common.NOTES_EXAMPLES["Show me the money"]] if not decoder_only else []
examples += [e for e in model.examples[:5] if e.lower() not in {x.lower() for x in examples}][: 5 - len(examples)]
ex_cols = st.columns(len(examples) + 1)
ex_cols[0].caption("Examples:")
for i, sentence in enumerate(examples):
    label = sentence.replace("\n", " ⏎ ")
    label = label if len(label) <= 40 else label[:39] + "…"
    ex_cols[i + 1].button(label, key=f"decoder-ex-{i}", on_click=_use_example, args=(sentence,), width="stretch")

mode = st.radio("Mode", list(MODES), key=mode_key, format_func=MODES.get, horizontal=True, on_change=_mode_changed)

# ------------------------------------------------------------------ all steps, once (cached)
run_model = training_panel.training_step(state, model_name, model, text, "decoder")  # toy-translate: a training step
run_text = common.step_prompt(run_model, text)  # capped where every step's trace is large
steps = common.get_steps(run_model, run_text)
if not steps:
    if steps is not None:  # ran, but generated nothing (max length 0)
        st.warning("The model generated no tokens for that input (it is already at the maximum length).")
    state.publish(model=model_name, text=text, mode=mode)
    state.show_messages()
    ss[PLAYING] = False
    st.stop()

first = steps[0]
prefix_len = int(first.meta.get("prefix_len", 1))
end_token = model.target_strings([model.end_id])[0] if model.end_id is not None else "<end>"
out_ids = dv.generated_ids(steps)
if steps[-1].meta.get("ended"):
    out_ids = out_ids[:-1]
decode_text = getattr(model.target_tokenizer, "decode_text", None)
generated_text = decode_text(out_ids) if decode_text else " ".join(model.target_strings(out_ids))
ss[GENERATED] = generated_text

# ------------------------------------------------------------------ teacher forcing: the typed target
full = None
if mode == "teacher":
    target_key = state.seed("target", "")
    if ss.pop(PREFILL, False) or ss.get(target_key) is None:
        ss[target_key] = generated_text

    def _use_generated() -> None:
        ss[target_key] = ss.get(GENERATED, "")

    tcols = st.columns([5, 1.2])
    target_label = "Continuation (appended to the prompt)" if decoder_only else "Target (the decoder input after <start>)"
    target_widget = tcols[0].text_area if decoder_only else tcols[0].text_input
    target = target_widget(target_label, key=target_key,
                           help="Teacher forcing feeds the whole target at once; the look-ahead mask keeps it "
                                "autoregressive. It starts as the model's own greedy output.")
    tcols[1].button("Use the greedy output", key="decoder-use-greedy", on_click=_use_generated, width="stretch")
    if not (target or "").strip():
        st.warning("Type a target to see teacher forcing, or press “Use the greedy output”.")
        state.publish(model=model_name, text=text, mode=mode)
        state.show_messages()
        ss[PLAYING] = False
        st.stop()
    full = common.get_trace(run_model, run_text, target=target)
    if full is None:
        state.publish(model=model_name, text=text, mode=mode, target=target)
        state.show_messages()
        ss[PLAYING] = False
        st.stop()
    if full.meta.get("target_unknown"):
        words = ", ".join(f"“{w}”" for w in full.meta["target_unknown"][:20])
        st.warning(f"Not in {model_name}'s target vocabulary, shown as <unk>: {words}")
else:
    target = None
    state.ignored_if_given("target", "the target is read in teacher forcing (mode=teacher); this is inference")
    common.show_trace_notes(first)

# ------------------------------------------------------------------ layer, head, step
n_layers = first.layers("decoder")
n_heads = first["decoder.0.self_attn.weights"].shape[0]
if full is not None:
    n_rows = len(full.tokens("target"))
    n_steps = dv.n_teacher_steps(n_rows, prefix_len)
else:
    n_steps = len(steps)
layer_key = common.int_from_url(state, "layer", 0, 0, n_layers - 1, of=f"{model_name}'s decoder")
head_key = common.int_from_url(state, "head", 0, 0, n_heads - 1, of=f"{model_name}'s decoder")
step_key = common.int_from_url(state, "step", 1, 1, n_steps,
                               of="this generation" if full is None else "teacher forcing on this target")
if GOTO in ss:
    ss[step_key] = min(max(int(ss.pop(GOTO)), 1), n_steps)


def _move(delta: int, n: int) -> None:
    ss[PLAYING] = False
    ss[step_key] = min(max(int(ss.get(step_key, 1)) + delta, 1), n)


def _play_pause(n: int) -> None:
    if ss.get(PLAYING):
        ss[PLAYING] = False
        return
    ss[PLAYING] = ss[RESUME] = True
    if int(ss.get(step_key, 1)) >= n:
        ss[step_key] = 1  # from the end, play again from the start


def _check_with_teacher() -> None:
    ss[PLAYING] = False
    ss[mode_key] = "teacher"
    ss[state.key("target")] = ss.get(GENERATED, "")


c = st.columns([1, 1, 5])
layer = c[0].selectbox("Decoder layer", list(range(n_layers)), key=layer_key)
head = c[1].selectbox("Head", list(range(n_heads)), key=head_key)
with c[2]:
    if n_steps > 1:
        step = st.slider("Step", 1, n_steps, key=step_key,
                         help="Step t runs the decoder on the tokens so far (the prefix) and picks the next one.")
    else:
        step = 1
        ss[step_key] = 1
        st.caption("Step 1 of 1: there is only one step.")
playing = bool(ss.get(PLAYING)) and step < n_steps
played_to_end = bool(ss.get(PLAYING)) and not playing and n_steps > 1
ss[PLAYING] = playing
b = st.columns([1, 1, 1, 4])
b[0].button("Previous", key="decoder-btn-prev", on_click=_move, args=(-1, n_steps), disabled=step <= 1, width="stretch")
b[1].button("Next", key="decoder-btn-next", on_click=_move, args=(1, n_steps), disabled=step >= n_steps, width="stretch")
# one button (one key) that reads Play or Pause, so no stale twin is left on the page while it plays
b[2].button("Pause" if playing else "Play", key="decoder-btn-play", on_click=_play_pause, args=(n_steps,),
            disabled=n_steps <= 1 and not playing, type="primary" if playing else "secondary", width="stretch",
            icon=":material/pause:" if playing else ":material/play_arrow:",
            help="Animate through every step to the end; any other click pauses.")
b[3].markdown(f"**Step {step} of {n_steps}**")
if played_to_end:
    st.success(f"Played all {n_steps} steps.")

state.show_messages()
publish = dict(model=model_name, text=text, mode=mode, layer=layer, head=head, step=step)
if mode == "teacher":
    publish["target"] = target
state.publish(**publish)

# ------------------------------------------------------------------ generation status
# how the whole run ended, as a summary line under the output (not a box beside the step counter)
level, msg = dv.ending_message(len(steps), bool(steps[-1].meta.get("ended")), model.max_new_tokens, end_token)
st.markdown("Greedy output: " + (dv.chips_markdown(model.target_strings(dv.generated_ids(steps))) or "(nothing)"))
st.caption(("" if level == "success" else ":material/warning: ") + "Whole run: " + msg, help=None)

# ------------------------------------------------------------------ what this step shows
if full is None:
    tr = steps[step - 1]
    row = dv.newest_row(tr)
    q_tokens = tr.tokens("target")
    next_tokens = tr.tokens("next")
    next_probs = dv.to_numpy(tr["next.probs"]).tolist()
    chosen, forced, forced_prob = tr.meta["chosen"], None, None
    n_prefix = len(q_tokens)
    st.markdown(f"**Decoder input at step {step}** ({'prompt + ' if decoder_only else ''}{n_prefix - prefix_len} "
                f"generated token{'s' if n_prefix - prefix_len != 1 else ''}), current token in bold, "
                f"then the token it chooses:")
    st.markdown(dv.chips_markdown(q_tokens, current=row) + " → " + dv.chips_markdown([chosen]))
else:
    tr = full
    q_tokens = full.tokens("target")
    row = dv.step_row(step, prefix_len)
    probs_row = full["probs"][row]
    ids, p = dv.top_k(probs_row, 10)
    next_tokens, next_probs = model.alternative_strings(ids), p
    chosen = next_tokens[0]
    # the teacher's next token: the next decoder input, or <end> after the last one (encoder-decoder)
    forced_id = None
    if decoder_only:
        t_enc = model.tokenizer.encode(target)
        dec_ids = (list(model.encode(run_text).ids) + [i for i, s in zip(t_enc.ids, t_enc.special) if not s])
        dec_ids = dec_ids[: model.config.max_len]
        ends_with = None
    else:
        dec_ids = [model.start_id] + list(model.target_tokenizer.encode(target).ids)
        ends_with = model.end_id
    if model.target_strings(dec_ids) != q_tokens:  # our reading of the target disagrees with the trace's
        dec_ids = None
    if dec_ids is not None:
        forced_id = dec_ids[row + 1] if row + 1 < len(dec_ids) else ends_with
    forced = model.target_strings([forced_id])[0] if forced_id is not None else None
    forced_prob = float(probs_row[forced_id]) if forced_id is not None else None
    st.markdown(f"**Teacher forcing:** the decoder gets all {len(q_tokens)} input tokens at once; step {step} is "
                f"row {row} (bold), whose output predicts the next token:")
    st.markdown(dv.chips_markdown(q_tokens, current=row)
                + (" → teacher's next: " + dv.chips_markdown([forced]) if forced is not None else ""))

mask = dv.head_matrix(tr, f"decoder.{layer}.self_attn.mask", head)
masked = dv.head_matrix(tr, f"decoder.{layer}.self_attn.masked", head)
weights = dv.head_matrix(tr, f"decoder.{layer}.self_attn.weights", head)
n = len(q_tokens)
where = f"layer {layer} · head {head}"
shown_tokens, shown_row = q_tokens, row
if n > dv.MAX_SIDE:  # long prompts: the three n x n maps in blocks (the newest row's block outlined)
    mask, masked, weights, shown_tokens, shown_row = dv.in_blocks(mask, masked, weights, q_tokens, row)
    st.caption(f"{n} positions are drawn in {len(shown_tokens)} blocks per side: weights summed over each block "
               "of keys and averaged over its queries (rows still sum to 1); scores and the mask averaged over "
               "each block's cells (−∞ where all are masked). Hover gives each block's range; Explore shows any map.")
# Margins fit the labels of the longest decoder input of this run, so they stay put from
# step to step (viz.decoder._tidy); the maps themselves grow with the step.
run_tokens = q_tokens if full is not None else steps[-1].tokens("target")
fit_self = (run_tokens, run_tokens)
height = int(min(900, max(360, 170 + 34 * n)))
per_row = 3 if n <= THREE_UP_TO else 2 if n <= TWO_UP_TO else 1


def _mask_panel() -> None:
    charts.chart(dv.look_ahead_mask_figure(mask, shown_tokens, highlight_row=shown_row, height=height,
                                   fit=fit_self if shown_tokens is q_tokens else (shown_tokens, shown_tokens),
                                           title=f"Look-ahead mask M ({n}×{n})"),
                 key="decoder-mask", width="stretch")
    st.caption("M(i, j) = 0 if j ≤ i, −∞ if j > i (Lecture 10's M, Transformers handout's B): the same in every layer and head.")


def _masked_panel() -> None:
    charts.chart(dv.masked_scores_figure(masked, shown_tokens, highlight_row=shown_row, height=height,
                                   fit=fit_self if shown_tokens is q_tokens else (shown_tokens, shown_tokens),
                                         title=f"Masked scores QKᵀ/√d_k + M · {where}"),
                 key="decoder-masked", width="stretch")
    st.caption("Scaled scores plus the mask: −∞ wherever a query would see a later token (adding M before or "
               "after dividing by √d_k gives the same matrix).")


def _weights_panel() -> None:
    charts.chart(dv.weights_figure(weights, shown_tokens, highlight_row=shown_row, height=height,
                                   fit=fit_self if shown_tokens is q_tokens else (shown_tokens, shown_tokens),
                                   title=f"Weights S' = softmax(…) · {where}"),
                 key="decoder-weights", width="stretch")
    st.caption("softmax of each row: every row sums to 1 and is exactly 0 above the diagonal, so no token "
               "attends to a later one. " + (
                   f"The outlined row {row} ({dv.chip(q_tokens[row])}) is the newest position; its output gives "
                   f"the next token." if full is None else f"The outlined row {row} ({dv.chip(q_tokens[row])}) is "
                   f"the one step {step} of inference adds."))


def _cross_panel() -> None:
    if dv.has_cross_attention(tr):
        src = tr.tokens("source")
        cross = dv.head_matrix(tr, f"decoder.{layer}.cross_attn.weights", head)
        charts.chart(dv.cross_attention_figure(cross, q_tokens, src, highlight_row=row, height=height, fit=(run_tokens, src),
                                               title=f"Cross-attention over the source · {where}"),
                     key="decoder-cross", width="stretch")
        best = int(np.argmax(cross[row]))
        st.caption(f"Queries from the decoder, keys and values from the encoder's output (Lecture 10). "
                   f"Row {row} ({dv.chip(q_tokens[row])}) looks most at source token {best} "
                   f"({dv.chip(src[best])}, weight {cross[row, best]:.2f}).")
    else:
        st.info("Decoder-only model: the prompt is the prefix and there is no encoder, so there is no "
                "cross-attention. Everything the model knows about the prompt comes through the masked "
                "self-attention.")


def _next_panel() -> None:
    title = (f"Next token after step {step} (top {len(next_tokens)})" if full is None
             else f"Row {row}'s next-token distribution (top {len(next_tokens)})")
    charts.chart(dv.next_token_figure(next_tokens, next_probs, chosen=chosen, forced=forced,
                                      forced_prob=forced_prob, title=title),
                 key="decoder-next", width="stretch")
    if full is None:
        st.caption(f"Linear layer + softmax over the vocabulary (Lecture 10); greedy decoding takes the most "
                   f"likely token (red) and appends it to the input of step {step + 1}.")
    else:
        st.caption("Red: the model's most likely token; green: the teacher's token, which the next row gets as "
                   "input whatever the model preferred.")


layout = {  # rows of panels: the equation M -> QKᵀ/√d_k + M -> softmax reads left to right
    3: [[_mask_panel, _masked_panel, _weights_panel], [_cross_panel, _next_panel]],
    2: [[_mask_panel, _masked_panel], [_weights_panel, _cross_panel], [_next_panel]],
    1: [[p] for p in (_mask_panel, _masked_panel, _weights_panel, _cross_panel, _next_panel)],
}[per_row]
for panels in layout:
    cols = st.columns(max(len(panels), min(per_row, 2))) if per_row > 1 else [st.container()]
    for col, panel in zip(cols, panels):
        with col:
            panel()

# ------------------------------------------------------------------ teacher forcing = inference on the same prefix
if full is not None:
    greedy_input = steps[-1].tokens("target") + ([] if steps[-1].meta.get("ended") else [steps[-1].meta["chosen"]])
    equal = full.tokens("target") == greedy_input
    diff = dv.prefix_difference(steps[step - 1], full) if step <= len(steps) else None
    parts = ", ".join(f"{k} {v:.1e}" for k, v in (diff or {}).items() if k != "max")
    if step > len(steps):
        st.info(f"Inference stopped after {len(steps)} steps (maximum length), so row {row} has no inference step "
                f"to compare with.")
    elif diff is not None:
        lead = ("Your target is the greedy output, so teacher forcing gives the same rows as inference: "
                if equal else "This step's prefix is the same in inference and under your target, so its rows match: ")
        st.success(f"{lead}max |Δ| = {diff['max']:.1e} between step {step}'s rows and the teacher-forced rows "
                   f"0–{len(steps[step - 1].tokens('target')) - 1}, over all {n_layers} layers and {n_heads} heads "
                   f"({parts}).")
    else:
        full_toks = full.tokens("target")
        k = next((i for i, (a, b2) in enumerate(zip(full_toks, greedy_input)) if a != b2),
                 min(len(full_toks), len(greedy_input)))
        st.info(f"Your target and the greedy output differ from decoder input {k} on, so from step "
                f"{k - prefix_len + 2} on the rows come from different inputs and are not expected to match "
                f"inference. Steps before that share the prefix and give the same rows; press "
                f"“Use the greedy output” to compare every step.")
    if dec_ids is not None:
        argmax_all = model.alternative_strings(dv.to_numpy(full["probs"]).argmax(-1).tolist())
        start_row = prefix_len - 1
        next_ids = [dec_ids[i + 1] if i + 1 < len(dec_ids) else ends_with for i in range(len(dec_ids))]
        frame, ce = dv.teacher_forcing_rows(
            full["probs"][start_row:], q_tokens[start_row:],
            [model.target_strings([j])[0] if j is not None else None for j in next_ids[start_row:]],
            next_ids[start_row:], argmax_all[start_row:])
        frame.index = frame.index + start_row
        with st.expander("Every position at once (what training computes in one pass)", expanded=False):
            if ce is not None:
                n_known = int(frame["p(teacher's next)"].notna().sum())
                st.markdown(f"Cross-entropy −log p(teacher's token), averaged over {n_known} positions: "
                            f"**{ce:.3f}** nats.")
            st.dataframe(frame, width="stretch")
else:
    st.button("Check against teacher forcing →", key="decoder-to-teacher", on_click=_check_with_teacher,
              help="Feed the greedy output back as the target, all at once, and compare the rows.")

dl.offer(tr, weights, q_tokens, q_tokens, model=model_name, stack="decoder", kind="self_attn", layer=layer, head=head,
         key="decoder-dl", suffix=f"-step{step}")

# ------------------------------------------------------------------ Play: one step per rerun, to the end
if playing:
    time.sleep(PLAY_DELAY_S)
    ss[GOTO] = step + 1
    ss[RESUME] = True
    st.rerun()
