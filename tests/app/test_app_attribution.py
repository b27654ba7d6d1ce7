"""The attribution page through AppTest: what the coloured rows draw is what
core.analysis.attribute computes, the faithfulness table is sorted and complete, controls
live in the URL, a faulty integration shows its completeness warning (and the steps can be
raised from it), minilm is told why there is nothing to attribute; and Explore's
"what is added (norms)" switch draws the trace's value_norms."""

import numpy as np
import pytest

import core
import core.analysis as ca
from conftest import assert_no_exception, chart_by_key, decode_array, figure, grid_tile, heatmap_z
from core.analysis import input_attribution as A

TEXT = "the small dog sees the cat"
TAB_MODEL = "Model view (all layers × heads)"


def _rows(at):
    """method -> the scores drawn in its row of the coloured text."""
    fig = figure(chart_by_key(at, "attribution-text"))
    return {t["meta"]: decode_array(t["z"]).astype(float).reshape(-1) for t in fig["data"]}


def test_drawn_scores_are_the_core_attributions_and_the_table_is_sorted(app_test, toy):
    at = app_test("attribution", model="toy-translate", text=TEXT, steps="16", position="0", faithful="1")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    rows = _rows(at)
    assert list(rows) == list(ca.ATTRIBUTION_METHODS)
    for method in ca.ATTRIBUTION_METHODS:
        want = ca.attribute(toy, TEXT, method, steps=16)["score"].to_numpy()
        np.testing.assert_allclose(rows[method], want, rtol=1e-5, atol=1e-7, err_msg=method)
    table = at.table[0].value
    assert set(table["method"]) == set(ca.ATTRIBUTION_METHODS) | {"random"}
    assert list(table["difference"]) == sorted(table["difference"], reverse=True)
    curves = figure(chart_by_key(at, "attribution-curves"))
    assert len([t for t in curves["data"] if t.get("meta") != "random-band"]) == len(table)
    assert at.query_params["steps"] == "16" and at.query_params["model"] == "toy-translate"
    assert at.query_params["position"] == "0"  # not the default text's measured position (2)
    assert any("completeness error" in c.value for c in at.caption)


def test_url_controls_round_trip_and_change_what_is_explained(app_test, toy):
    at = app_test("attribution", model="toy-translate", text=TEXT, target="robi", contrast="bevin",
                  baseline="<end>", steps="8", fix_first="1", words="1", position="1")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    qp = dict(at.query_params)
    for k, v in dict(target="robi", contrast="bevin", baseline="<end>", steps="8", fix_first="1", words="1",
                     position="1").items():
        assert qp[k] == v, (k, qp)
    want = ca.attribute(toy, TEXT, "occlusion", target="robi", baseline="bevin", baseline_token="<end>", position=1)
    np.testing.assert_allclose(_rows(at)["occlusion"], want["score"].to_numpy(), rtol=1e-5, atol=1e-7)
    assert any("logit['robi'] − logit['bevin']" in m.value for m in at.markdown)


def test_a_faulty_integration_shows_the_warning_and_the_steps_can_be_raised(app_test, toy, monkeypatch):
    real = A._path_grad_sum

    def doubled(s, e, b, alphas):
        return real(s, e, b, alphas) * 2  # the integral off by 100%, at every refinement

    monkeypatch.setattr(A, "_path_grad_sum", doubled)
    at = app_test("attribution", model="toy-translate", text="the cat sees the small dog", steps="16")
    at.run()
    assert_no_exception(at)
    warns = [w.value for w in at.warning]
    assert any("not complete" in w for w in warns), warns
    button = next(b for b in at.button if b.label.startswith("Raise the steps to 32"))
    button.click().run()
    assert_no_exception(at)
    assert at.query_params["steps"] == "32"


def test_a_target_outside_the_vocabulary_is_a_warning_with_its_replacement(app_test, toy):
    """As on the Lens page: the URL's token is named, with what is used instead, and the page runs."""
    at = app_test("attribution", model="toy-translate", text=TEXT, target="chat")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert any("target='chat'" in w.value and "not in toy-translate's vocabulary" in w.value for w in at.warning)
    assert "target" not in at.query_params  # the default (the top-1) is what the page explains
    at.text_input(key="attribution.target").set_value("chat").run()  # typed: said, the box keeps it
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert any("not in toy-translate's vocabulary" in w.value and "top-1 instead" in w.value for w in at.warning)
    assert at.query_params["target"] == "chat"  # the user's input is kept


def test_an_encoder_without_an_output_is_pointed_to_compare(app_test):
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm is not installed")
    at = app_test("attribution", model="minilm")
    at.run()
    assert_no_exception(at)
    assert any("needs an output" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_word_scores_sum_pieces():
    from viz.attribution.figures import word_scores

    scores, labels = word_scores([1.0, 2.0, 3.0, 4.0], ["[CLS]", "em", "##bed", "cat"], [None, 0, 0, 1],
                                 [True, False, False, False])
    assert scores.tolist() == [1.0, 5.0, 4.0] and labels == ["[CLS]", "em##bed", "cat"]


def test_explore_norms_switch_draws_value_norms(app_test, toy):
    at = app_test("explore", model="toy-translate", text=TEXT, layer="1", head="2", norms="1")
    at.run()
    assert_no_exception(at)
    tr = toy.trace(TEXT)
    vn = tr["encoder.1.self_attn.value_norms"]
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-heatmap")), vn[2].numpy(), rtol=1e-5)
    assert not np.allclose(vn[2].numpy(), tr["encoder.1.self_attn.weights"][2].numpy(), atol=1e-3)
    assert at.query_params["norms"] == "1"
    at.session_state["explore.tab"] = TAB_MODEL
    at.run()
    assert_no_exception(at)
    grid = figure(chart_by_key(at, "explore-grid"))
    np.testing.assert_allclose(grid_tile(grid, 1, 2), (vn[2] / vn.max()).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-enlarged")), vn[2].numpy(), rtol=1e-5)
    at.toggle(key="explore.norms").set_value(False).run()  # back to the weights
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "explore-enlarged")),
                               tr["encoder.1.self_attn.weights"][2].numpy(), atol=1e-6)


def test_the_faithfulness_test_waits_for_its_switch(app_test, toy, monkeypatch):
    """The first load computes every method's scores, not the faithfulness table (hundreds of
    passes): the page says how to ask for it, and its switch runs it and keeps faithful=1 in the URL."""
    from viz.attribution import run_panel

    ran = []
    real = run_panel._table
    monkeypatch.setattr(run_panel, "_table", lambda *a: ran.append(1) or real(*a))
    at = app_test("attribution", model="toy-translate", text="the old man sees the cat", steps="8")
    at.run()
    assert_no_exception(at)
    assert not ran and not at.table and "attribution-curves" not in str([c.proto.id for c in at.get("plotly_chart")])
    assert any("Test which method is faithful" in i.value for i in at.info)
    chart_by_key(at, "attribution-text")  # the scores are drawn all the same
    at.toggle(key="attribution.faithful").set_value(True).run()
    assert_no_exception(at)
    assert ran and len(at.table) == 1 and at.query_params["faithful"] == "1"
    chart_by_key(at, "attribution-curves")
