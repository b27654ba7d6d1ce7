"""Decoder stepper: the decoder generating one token at a time under its look-ahead mask.

Inference: greedy decoding from <start> (or from the prompt, for a decoder-only model) to
<end> or the maximum length; step t shows the prefix, the mask M, the masked scores
QKᵀ/√d_k + M, the weights, the cross-attention over the source and the next-token
distribution. Teacher forcing: the whole typed target at once under the same mask (seed
003), with the check that its rows equal the inference rows for the same prefix.
All steps come from models.get_steps (computed once, cached): moving between steps does
no model work.
"""

import time

import streamlit as st

import core
from viz import decoder as dv
from viz.pages import decoder_view, dl, models, training_panel, url_state, widgets

DECODER_KINDS = ("encoder-decoder", "decoder")
PLAY_DELAY_S = 0.7
MODES = {"inference": "Inference (greedy, one token per step)", "teacher": "Teacher forcing (whole target at once)"}
PLAYING, GOTO, PREFILL, GENERATED = "decoder._playing", "decoder._goto", "decoder._prefill", "decoder._generated"
RESUME = "decoder._resume"

st.title("Decoder stepper")
st.caption("The decoder writes its output one token at a time. At every step it reads the tokens so far, "
           "a look-ahead mask stops each position from seeing the ones after it, and the last row's output "
           "becomes a distribution over the next token (Lecture 10: masked self-attention and cross-attention; "
           "Transformers handout: inference from <start> to <end>, and teacher forcing).")
state = url_state.PageState("decoder", fields=("model", "text", "mode", "target", "layer", "head", "step", "step_train"))
ss = st.session_state
# Play advances one step per rerun and marks each of its reruns; any other run (a click, a page
# switch and back, a reload) pauses it, so coming back to the page never jumps to the end.
_resumed = bool(ss.pop(RESUME, False))
if ss.get(PLAYING) and not _resumed:
    ss[PLAYING] = False

allowed = [n for n, spec in core.MODELS.items() if spec.kind in DECODER_KINDS]
allowed += [n for n, m in models.local_models().items() if m.kind in DECODER_KINDS]
model_name, model, text_col = widgets.model_header(
    state, allowed=allowed, needs="the decoder stepper needs a model that generates text (a decoder or an encoder-decoder)")
if model is None:
    st.stop()
if model.kind not in DECODER_KINDS:  # the registry's kind said otherwise; the loaded model decides
    st.error(f"{model_name} is an {model.kind} model: it does not generate text. Pick a decoder model.")
    st.stop()
decoder_only = model.kind == "decoder"

text_key = state.seeded_key("text", model.examples[0] if model.examples else widgets.NOTES_EXAMPLES["Show me the money"])
has_url_target = bool(state.qp.get("target"))
mode_key = state.seeded_key("mode", "teacher" if has_url_target else "inference", valid=lambda v: v in MODES,
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

examples = [widgets.NOTES_EXAMPLES["Show me the money"]] if not decoder_only else []
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
run_text = models.step_prompt(run_model, text)  # capped where every step's trace is large
steps = models.get_steps(run_model, run_text)
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
    target_key = state.seeded_key("target", "")
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
    full = models.get_trace(run_model, run_text, target=target)
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
    models.show_trace_notes(first)

# ------------------------------------------------------------------ layer, head, step
n_layers = first.layers("decoder")
n_heads = first["decoder.0.self_attn.weights"].shape[0]
if full is not None:
    n_rows = len(full.tokens("target"))
    n_steps = dv.n_teacher_steps(n_rows, prefix_len)
else:
    n_steps = len(steps)
layer_key = url_state.int_from_url(state, "layer", 0, 0, n_layers - 1, of=f"{model_name}'s decoder")
head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=f"{model_name}'s decoder")
step_key = url_state.int_from_url(state, "step", 1, 1, n_steps,
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

# ------------------------------------------------------------------ what this step shows (viz/pages/decoder_view.py)
tr, weights, q_tokens = decoder_view.show_step(model, steps, full, step=step, layer=layer, head=head,
                                               prefix_len=prefix_len, decoder_only=decoder_only)
if full is None:
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
