"""The decoder stepper's controls and step view, as one fragment of the page (viz/decoder/page.py).

The page above it picks the model, the prompt and the mode and computes every step once
(cached). What a step changes (the layer, the head, the step slider, Previous / Next / Play,
the maps, the downloads) lives in `stepper`, an `st.fragment`: clicking one of its controls
reruns only this part, so a step neither reruns the page's top (the model picker, the
prompt box, the training panel) nor makes the browser redraw it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import streamlit as st
from streamlit.errors import StreamlitAPIException
from streamlit.runtime.scriptrunner import get_script_run_ctx

from viz.decoder import figures as decoder_figures
from viz.decoder import view_panel as decoder_view
from viz.ui import admission, downloads, models, result_getter, url_state, url_switches, widgets

PLAY_DELAY_S = 0.7
PLAYING, GOTO, GENERATED, RESUME = "decoder._playing", "decoder._goto", "decoder._generated", "decoder._resume"
TO_TEACHER = "decoder._to_teacher"
IN_BROWSER = "decoder-in-browser"  # the toggle (URL browser=1): every step in one figure, stepped in the browser


@dataclass
class Run:
    """What the page computed once for the fragment: the model, the steps, the URL values of its top.

    Streamlit keeps a fragment's arguments (this Run) until the session's next full run, however
    long the tab stays idle: so it holds no trace, only getters (viz.ui.result_getter: the steps and
    the teacher-forced trace while they live, else from the trace cache, else computed again through
    the gate). What stays is the model's name, the shared model, the prompt in `url` and `run_key`
    and a few numbers. A run of the fragment holds what it draws from (admission.fragment_run)."""
    model_name: str
    model: object
    get_steps: Callable[[], List]  # the steps (one traced pass's views), from getters
    get_full: Callable[[], Optional[object]]  # teacher forcing: the whole target's trace; inference: None
    prefix_len: int
    decoder_only: bool
    end_token: str
    mode_key: str
    cut: int = 0  # tokens cut from the start of a long prompt (models.step_prompt)
    url: dict = field(default_factory=dict)  # model, text, mode (and target): published with the step
    run_key: tuple = ()  # (model key, prompt, target): what the steps (target None) or `full` were made from (the checks)


def _move(delta: int, step_key: str, n: int) -> None:
    st.session_state[PLAYING] = False
    st.session_state[step_key] = min(max(int(st.session_state.get(step_key, 1)) + delta, 1), n)


def _play_pause(step_key: str, n: int) -> None:
    ss = st.session_state
    if ss.get(PLAYING):
        ss[PLAYING] = False
        return
    ss[PLAYING] = True
    ss[RESUME] = "click"  # the run this click starts plays on
    if int(ss.get(step_key, 1)) >= n:
        ss[step_key] = 1  # from the end, play again from the start


def _check_with_teacher(mode_key: str, target_key: str) -> None:
    ss = st.session_state
    ss[PLAYING] = False
    ss[mode_key] = "teacher"
    ss[target_key] = ss.get(GENERATED, "")
    ss[TO_TEACHER] = True  # the mode is the page's: the whole page reruns (see stepper)


def _play_on() -> None:
    """Rerun only the fragment, marked as Play's own rerun; in a full-page run (the first, or any
    AppTest run), where a fragment-scoped rerun is refused, the whole page."""
    ss = st.session_state
    ss[RESUME] = "fragment"
    try:
        st.rerun(scope="fragment")
    except StreamlitAPIException:
        ss[RESUME] = "page"
        st.rerun()


def _resumed() -> bool:
    """Whether this run is Play's next step. Play's fragment rerun can lose to a click that came
    during its delay (a page switch): its mark is then still set when the page is next opened, in
    a full run, which must pause. So a mark made for a fragment rerun counts in a fragment run only."""
    mark = st.session_state.pop(RESUME, None)
    if mark == "fragment":
        ctx = get_script_run_ctx()
        return bool(ctx is not None and ctx.fragment_ids_this_run)
    return mark in ("click", "page")


def light(steps: list, full) -> tuple:
    """(get_steps, get_full) for Run: getters that do not keep the steps or the trace alive."""
    each = [result_getter.getter(s) for s in steps]
    get_full = result_getter.getter(full) if full is not None else (lambda: None)
    return (lambda: [g() for g in each]), get_full


@st.fragment
def stepper(run: Run, extra: dict) -> None:
    """Layer, head and step controls, then what the step shows. `extra`: fields the page's
    other panels add to the URL (the training step). The steps and the trace it draws from count
    against the memory budget while it runs (admission.fragment_run), alone or within the page's run."""
    with admission.fragment_run():
        steps, full = run.get_steps(), run.get_full()
        admission.hold(result_getter.whole(steps[0]), models._size_of(steps))  # the cache's own list, counted once
        if full is not None:
            admission.hold(full, models._size_of(full))
        _stepper(run, steps, full, extra)


def _stepper(run: Run, steps: list, full, extra: dict) -> None:
    ss = st.session_state
    if ss.pop(TO_TEACHER, False):
        st.rerun()  # "Check against teacher forcing" changed the page's mode
    # Play advances one step per rerun and marks each of its reruns; any other run (a click, a page
    # switch and back, a reload) pauses it, so coming back to the page never jumps to the end.
    resumed = _resumed()
    if ss.get(PLAYING) and not resumed:
        ss[PLAYING] = False
    # the URL as it is now (a fragment rerun reads its own); the toggle keeps its own key
    state = url_state.PageState("decoder", keys={"browser": IN_BROWSER})
    state.extra.update(extra)
    first = steps[0]
    n_layers = first.layers("decoder")
    n_heads = first.n_heads("decoder")
    if full is not None:
        n_steps = decoder_figures.n_teacher_steps(len(full.tokens("target")), run.prefix_len)
    else:
        n_steps = len(steps)
    name = run.model_name
    softmax_layers = widgets.view_layers(first, "decoder", "self_attn")  # a token mixer's layers have no mask
    if not softmax_layers:
        widgets.no_softmax_info(name, first, "The decoder stepper")
        return
    layer_key = url_state.int_from_url(state, "layer", softmax_layers[0], 0, n_layers - 1, of=f"{name}'s decoder")
    if ss[layer_key] not in softmax_layers:
        ss[layer_key] = softmax_layers[0]
    head_key = url_state.int_from_url(state, "head", 0, 0, n_heads - 1, of=f"{name}'s decoder")
    step_key = url_state.int_from_url(state, "step", 1, 1, n_steps,
                                   of="this generation" if full is None else "teacher forcing on this target")
    if GOTO in ss:
        ss[step_key] = min(max(int(ss.pop(GOTO)), 1), n_steps)

    c = st.columns([1, 1, 1.4, 3.6])
    layer = c[0].selectbox("Decoder layer", softmax_layers, key=layer_key,
                           help="The layers with softmax attention (a token mixer's layers have no look-ahead mask "
                                "to show).")
    head = c[1].selectbox("Head", list(range(n_heads)), key=head_key)
    with c[2]:
        st.write("")  # lines the toggle up with the selectboxes' boxes
        in_browser = st.toggle("Step in the browser", key=url_switches.flag(state, "browser"), disabled=full is not None,
                               help="Every step of this run in one figure with its own slider: a step is redrawn in "
                                    "the page, with no round trip to the server." if full is None else
                               "Inference only: teacher forcing has its rows all at once.")
    if in_browser and full is None:  # the figure's own slider steps; the server's controls would only rerun
        ss[PLAYING] = False
        state.show_messages()
        state.publish(**run.url, layer=layer, head=head, step=ss.get(step_key, 1), browser=url_switches.flag_url(True))
        decoder_view.show_all_steps(steps, layer=layer, head=head, step=int(ss.get(step_key, 1)))
        return
    with c[3]:
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
    b[0].button("Previous", key="decoder-btn-prev", on_click=_move, args=(-1, step_key, n_steps), disabled=step <= 1,
                width="stretch")
    b[1].button("Next", key="decoder-btn-next", on_click=_move, args=(1, step_key, n_steps), disabled=step >= n_steps,
                width="stretch")
    # one button (one key) that reads Play or Pause, so no stale twin is left on the page while it plays
    b[2].button("Pause" if playing else "Play", key="decoder-btn-play", on_click=_play_pause, args=(step_key, n_steps),
                disabled=n_steps <= 1 and not playing, type="primary" if playing else "secondary", width="stretch",
                icon=":material/pause:" if playing else ":material/play_arrow:",
                help="Animate through every step to the end; any other click pauses.")
    b[3].markdown(f"**Step {step} of {n_steps}**")
    if played_to_end:
        st.success(f"Played all {n_steps} steps.")

    state.show_messages()
    # the switch is in the URL where it shows (inference); teacher forcing leaves it out
    state.publish(**run.url, layer=layer, head=head, step=step,
                  browser=url_switches.flag_url(in_browser) if full is None else None)

    # how the whole run ended, as a summary line under the output (not a box beside the step counter)
    model = run.model
    level, msg = decoder_figures.ending_message(len(steps), bool(steps[-1].meta.get("ended")), model.max_new_tokens, run.end_token)
    st.markdown("Greedy output: " + (decoder_figures.chips_markdown(model.target_strings(decoder_figures.generated_ids(steps))) or "(nothing)"))
    st.caption(("" if level == "success" else ":material/warning: ") + "Whole run: " + msg, help=None)
    decoder_view.generation_check(model, steps, run.run_key)  # the KV cache against no cache

    # what this step shows (viz/decoder/view_panel.py)
    tr, weights, q_tokens = decoder_view.show_step(model, steps, full, step=step, layer=layer, head=head,
                                                   prefix_len=run.prefix_len, decoder_only=run.decoder_only,
                                                   cut=run.cut, run_key=run.run_key)
    if full is None:
        st.button("Check against teacher forcing →", key="decoder-to-teacher", on_click=_check_with_teacher,
                  args=(run.mode_key, state.key("target")),
                  help="Feed the greedy output back as the target, all at once, and compare the rows.")
    downloads.offer(tr, weights, q_tokens, q_tokens, model=name, stack="decoder", kind="self_attn", layer=layer, head=head,
             key="decoder-dl", suffix=f"-step{step}")

    if playing:  # Play: one step per rerun of this fragment, to the end
        time.sleep(PLAY_DELAY_S)
        ss[GOTO] = step + 1
        _play_on()
