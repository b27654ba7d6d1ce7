"""The "training step" slider through AppTest: it swaps toy-translate's checkpoint on explore,
inside and the decoder stepper, keeps the step in the URL (step_train), and its alignment maps
are the core's cross-attention at that step. The panel starts collapsed (open when the URL names
an earlier step) and draws its charts only while open; a chosen step outlives closing it."""

import numpy as np
import pytest

import core
from conftest import assert_no_exception, chart_by_key, figure, heatmap_z
from core.toy import toy_steps, toy_task
from viz.ui.training_panel import open_key

TEXT = "the small dog sees the cat"
SLIDER = "{page}.step_train"


@pytest.fixture(scope="module")
def steps():
    return toy_steps.available_steps()


def _cross(step, layer=1, head=0):
    target, _ = toy_task.translate(TEXT.split())
    m = core.load_model("toy-translate", step=step)  # the app's default device
    return m.trace(TEXT, target=" ".join(target))[f"decoder.{layer}.cross_attn.weights"][head].numpy()


def _open_panel(at, page: str):
    """Open the page's training panel (collapsed by default, drawn only when open) and rerun."""
    at.session_state[open_key(page)] = True
    at.run()
    assert_no_exception(at)


def test_panel_starts_closed_and_draws_nothing_until_opened(app_test, steps):
    at = app_test("explore", text=TEXT)
    at.run()
    assert_no_exception(at)
    ids = [c.proto.id for c in at.get("plotly_chart")]
    assert not any("training-curve" in i or "-align-" in i for i in ids), ids
    assert any("explore-heatmap" in i for i in ids)
    assert at.query_params["step_train"] == str(steps[-1])
    _open_panel(at, "explore")
    ids = [c.proto.id for c in at.get("plotly_chart")]
    assert any("explore-training-curve" in i for i in ids) and any("explore-align-0" in i for i in ids)


def test_a_step_survives_closing_the_panel(app_test, steps):
    at = app_test("explore", text=TEXT)
    at.run()
    _open_panel(at, "explore")
    at.select_slider(key=SLIDER.format(page="explore")).set_value(steps[0]).run()
    at.session_state[open_key("explore")] = False
    at.run()
    at.run()  # a second run: a widget not drawn in the one before would have lost its value here
    assert_no_exception(at)
    assert at.query_params["step_train"] == str(steps[0])
    m0 = core.load_model("toy-translate", step=steps[0])
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-heatmap")),
                               m0.trace(TEXT)["encoder.0.self_attn.weights"][0].numpy(), atol=1e-6)
    _open_panel(at, "explore")
    assert at.select_slider(key=SLIDER.format(page="explore")).value == steps[0]


def test_explore_slider_swaps_the_checkpoint(app_test, steps):
    at = app_test("explore", text=TEXT)
    at.run()
    assert_no_exception(at)
    _open_panel(at, "explore")
    slider = at.select_slider(key=SLIDER.format(page="explore"))
    assert list(slider.options) == [str(s) for s in steps[:-1]] + [f"{steps[-1]} (final)"]
    assert slider.value == steps[-1] and at.query_params["step_train"] == str(steps[-1])
    final_map = heatmap_z(chart_by_key(at, "explore-align-0"))
    np.testing.assert_allclose(final_map, _cross(steps[-1]), atol=1e-6)

    slider.set_value(steps[0]).run()
    assert_no_exception(at)
    assert at.query_params["step_train"] == str(steps[0])
    early_map = heatmap_z(chart_by_key(at, "explore-align-0"))
    np.testing.assert_allclose(early_map, _cross(steps[0]), atol=1e-6)
    assert np.abs(early_map - final_map).max() > 0.1
    # the page's own heatmap runs the same checkpoint
    m0 = core.load_model("toy-translate", step=steps[0])
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-heatmap")),
                               m0.trace(TEXT)["encoder.0.self_attn.weights"][0].numpy(), atol=1e-6)
    # the curve marks the step; the second map is the best unsupervised head of metrics.json
    curve = figure(chart_by_key(at, "explore-training-curve"))
    assert [sh["x0"] for sh in curve["layout"]["shapes"] if sh.get("x0") == sh.get("x1")] == [steps[0]]
    row = next(r for r in toy_steps.load_metrics()["steps"] if r["step"] == steps[0])
    b = row["best_unsupervised"]
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-align-1")), _cross(steps[0], b["layer"], b["head"]),
                               atol=1e-6)
    outlined = [sh for sh in figure(chart_by_key(at, "explore-align-0"))["layout"]["shapes"] if sh.get("name") == "alignment"]
    assert len(outlined) == len(TEXT.split())


@pytest.mark.parametrize("page", ["inside", "decoder"])
def test_step_from_the_url_on_other_pages(app_test, steps, page):
    at = app_test(page, model="toy-translate", text=TEXT, step_train=str(steps[1]))
    at.run()
    assert_no_exception(at)
    assert at.select_slider(key=SLIDER.format(page=page)).value == steps[1]
    assert at.query_params["step_train"] == str(steps[1])
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, f"{page}-align-0")), _cross(steps[1]), atol=1e-6)


def test_bad_url_step_warns_and_shows_the_final(app_test, steps):
    at = app_test("explore", text=TEXT, step_train="7")
    at.run()
    assert_no_exception(at)
    assert any("step_train" in w.value for w in at.warning)
    _open_panel(at, "explore")  # the final step: the panel starts closed
    assert at.select_slider(key=SLIDER.format(page="explore")).value == steps[-1]


def test_outside_the_grammar_no_maps_but_the_slider_works(app_test, steps):
    at = app_test("explore", text="hello there", step_train=str(steps[0]))  # not a sentence of the toy grammar
    at.run()
    assert_no_exception(at)
    assert any("toy grammar" in i.value for i in at.info)
    assert not [c for c in at.get("plotly_chart") if "explore-align" in c.proto.id]
    assert at.query_params["step_train"] == str(steps[0])


def test_no_slider_for_other_models(app_test):
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm's weight package is not installed")
    at = app_test("explore", model="minilm", text=TEXT, step_train="0")
    at.run()
    assert_no_exception(at)
    assert not [s for s in at.get("select_slider") if s.key == SLIDER.format(page="explore")]
    assert "step_train" not in at.query_params
