"""The Lens page under AppTest: what it draws equals what core.analysis computes, its controls
live in the URL, and models the analyses do not apply to get a warning saying why."""

import numpy as np
import pytest

import core.analysis as ca
from conftest import assert_no_exception, chart_by_key, heatmap_z
from viz.lens import figures as lf

IOI = "When Mary and John went to the store, John gave a drink to"
URL = {"model": "smollm2", "text": IOI, "target": " Mary", "baseline": " John"}


@pytest.fixture(scope="module")
def ioi_trace(smollm2):
    return smollm2.trace(IOI)


def _run(app_test, **params):
    at = app_test("lens", **params)
    at.run()
    assert_no_exception(at)
    return at


def test_values_drawn_are_the_values_computed(app_test, ioi_trace):
    at = _run(app_test, **URL)
    lens = ca.lens(ioi_trace, target=" Mary")
    z = heatmap_z(chart_by_key(at, "lens-grid"))
    want, _, _ = lf.lens_matrix(lens, "target_prob")
    assert z.shape == (31, len(ioi_trace.tokens("target"))) and np.abs(z - want).max() < 1e-6
    assert want[-1, -1] > 0.5  # the output puts " Mary" on top: a grid of zeros would fail
    attr = ca.logit_attribution(ioi_trace, " Mary", baseline=" John")
    drawn = heatmap_z(chart_by_key(at, "lens-attribution"))
    heads = attr[attr.kind == "head"]
    assert np.abs(drawn[1 + heads.layer.to_numpy(), heads["head"].to_numpy()] - heads.contribution.to_numpy()).max() < 1e-6
    mlp = attr[attr.kind == "mlp"]
    assert np.abs(drawn[1 + mlp.layer.to_numpy(), -1] - mlp.contribution.to_numpy()).max() < 1e-6
    assert abs(drawn[0, 0] - attr[attr.kind == "embed"].contribution.iloc[0]) < 1e-6
    assert not at.error and any("Contributions add up to the model's own logit" in s.value for s in at.success)
    top = lf.top_heads(attr).iloc[0]
    assert any(f"layer {top.layer} · head {top['head']}" in str(el.proto.label) for el in at.get("page_link"))


def test_url_round_trip_and_colour(app_test, ioi_trace):
    at = _run(app_test, **URL, color="kl")
    assert at.radio(key="lens.color").value == "kl"
    assert dict(at.query_params) == {**URL, "color": "kl"}
    lens = ca.lens(ioi_trace, target=" Mary")
    z = heatmap_z(chart_by_key(at, "lens-grid"))
    assert np.abs(z - lf.lens_matrix(lens, "kl")[0]).max() < 1e-6
    at.text_input(key="lens.baseline").set_value("").run()  # no baseline: the logit alone, left out of the URL
    assert_no_exception(at)
    assert "baseline" not in dict(at.query_params) and dict(at.query_params)["target"] == " Mary"
    assert any("logit( Mary) " in s.value and "−" not in s.value.split("own")[1].split("(from")[0]
               for s in at.success)


def test_a_pick_from_the_top_ten_sets_the_target(app_test, ioi_trace):
    at = _run(app_test, model="smollm2", text=IOI)
    second = ioi_trace.tokens("next")[1]
    at.selectbox(key="lens.pick-baseline").set_value(second).run()
    assert_no_exception(at)
    assert at.text_input(key="lens.baseline").value == second and dict(at.query_params)["baseline"] == second


def test_post_norm_and_headless_models_get_a_warning(app_test):
    """A post-norm model gets the lens and a note (not a warning: nothing failed) on why the
    attribution does not decompose; a model with no output head gets warnings and no chart."""
    at = _run(app_test, model="toy-translate", text="the small dog sees the cat")
    assert any("does not apply to toy-translate" in w.value and "post-norm" in w.value for w in at.info)
    assert not any("does not apply" in w.value for w in at.warning)
    chart_by_key(at, "lens-grid")  # the lens applies to a post-norm model (its stream is normed every layer)
    at = _run(app_test, model="minilm", text="The cat sat on the mat.")
    warnings = [w.value for w in at.warning]
    assert any("logit lens does not apply to minilm" in w and "masked-LM head" in w for w in warnings)
    assert any("Direct logit attribution does not apply to minilm" in w for w in warnings)
    assert not at.get("plotly_chart")


def test_a_target_of_several_tokens_is_said_and_replaced(app_test):
    at = _run(app_test, model="smollm2", text=IOI, target="Mary had a little lamb")
    assert any("target" in w.value and "not one" in w.value for w in at.warning)
    assert "target" not in dict(at.query_params)
    chart_by_key(at, "lens-attribution")
