"""Decoder stepper: the decoder generating one token at a time under its look-ahead mask.

Inference: greedy decoding from <start> (or from the prompt, for a decoder-only model) to
<end> or the maximum length; step t shows the prefix, the mask M, the masked scores
QKᵀ/√d_k + M, the weights, the cross-attention over the source and the next-token
distribution. Teacher forcing: the whole typed target at once under the same mask (seed
003), with the check that its rows equal the inference rows for the same prefix.
All steps come from models.get_steps (computed once, cached): moving between steps does
no model work. The step's controls and maps are one fragment (viz/decoder/stepper_panel.py), so a
step reruns only that part of the page.
"""

import streamlit as st

import core
from viz.decoder import figures as decoder_figures
from viz.ui import models, training_panel, url_state, widgets
from viz.decoder import stepper_panel as stepper

DECODER_KINDS = ("encoder-decoder", "decoder")
MODES = {"inference": "Inference (greedy, one token per step)", "teacher": "Teacher forcing (whole target at once)"}
PLAYING, PREFILL, GENERATED = stepper.PLAYING, "decoder._prefill", stepper.GENERATED

widgets.header("decoder")
st.caption("The decoder writes its output one token at a time. At every step it reads the tokens so far, "
           "a look-ahead mask stops each position from seeing the ones after it, and the last row's output "
           "becomes a distribution over the next token (Lecture 10: masked self-attention and cross-attention; "
           "Transformers handout: inference from <start> to <end>, and teacher forcing).")
state = url_state.PageState("decoder", fields=("model", "text", "mode", "target", "layer", "head", "step", "step_train",
                                                "browser"))
ss = st.session_state

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
    if decoder_only:
        text = widgets.text_box("Prompt (the decoder's prefix)", text_key,
                                help="The prompt is the decoder's input; generated tokens follow it.")
    else:
        text = widgets.text_box("Source sentence", text_key)

examples = [widgets.NOTES_EXAMPLES["Show me the money"]] if not decoder_only else []
examples += [e for e in model.examples[:5] if e.lower() not in {x.lower() for x in examples}][: 5 - len(examples)]
ex_cols = st.columns(len(examples) + 1)
ex_cols[0].caption("Examples:")
for i, sentence in enumerate(examples):
    label = sentence.replace("\n", " ⏎ ")
    label = label if len(label) <= 40 else label[:39] + "…"
    ex_cols[i + 1].button(label, key=f"decoder-ex-{i}", on_click=_use_example, args=(sentence,), width="stretch")

def _end_here(**url) -> None:
    """Nothing to step through: Play stops, and the page ends with its URL and messages."""
    ss[PLAYING] = False
    state.end_here(**url)


mode = st.radio("Mode", list(MODES), key=mode_key, format_func=MODES.get, horizontal=True, on_change=_mode_changed)

# ------------------------------------------------------------------ all steps, once (cached)
run_model = training_panel.training_step(state, model_name, model, text, "decoder")  # toy-translate: a training step
run_text, cut = models.step_prompt(run_model, text)  # a long prompt keeps its last tokens (models.step_limit)
steps = models.get_steps(run_model, run_text)
if not steps:
    if steps is not None:  # ran, but generated nothing (max length 0)
        st.warning("The model generated no tokens for that input (it is already at the maximum length).")
    _end_here(model=model_name, text=text, mode=mode)

first = steps[0]
prefix_len = int(first.meta.get("prefix_len", 1))
end_token = model.target_strings([model.end_id])[0] if model.end_id is not None else "<end>"
out_ids = decoder_figures.generated_ids(steps)
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
    target = widgets.text_box(target_label, target_key, where=tcols[0],
                              help="Teacher forcing feeds the whole target at once; the look-ahead mask keeps it "
                                "autoregressive. It starts as the model's own greedy output.")
    tcols[1].button("Use the greedy output", key="decoder-use-greedy", on_click=_use_generated, width="stretch")
    if not (target or "").strip():
        st.warning("Type a target to see teacher forcing, or press “Use the greedy output”.")
        _end_here(model=model_name, text=text, mode=mode)
    full = models.get_trace(run_model, run_text, target=target)
    if full is None:
        _end_here(model=model_name, text=text, mode=mode, target=target)
else:
    target = None
    state.ignored_if_given("target", "the target is read in teacher forcing (mode=teacher); this is inference")
    models.show_trace_notes(first)

# ------------------------------------------------------------------ the step: controls and maps (a fragment)
state.show_messages()  # the URL's model, text, mode and target; the fragment says its own (layer, head, step)
stepper.stepper(stepper.Run(model_name, model, *stepper.light(steps, full), prefix_len, decoder_only, end_token, mode_key,
                            cut,
                            url=dict(model=model_name, text=text, mode=mode, **({"target": target} if full is not None
                                                                                 else {})),
                            run_key=(run_model, run_text, target)),
                extra=dict(state.extra))
