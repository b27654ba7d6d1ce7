"""Switching heads off on the Explore page, through AppTest: two heads off change the
prediction panel and the maps downstream, the URL holds the list, and a fresh session
opened on that URL restores it."""

from __future__ import annotations

import numpy as np
import pytest

import core
from conftest import switch_page, assert_no_exception, chart_by_key, decode_array, figure, heatmap_z
from viz.explore import knockout

TEXT = "the small dog sees the cat"
TAB_MODEL = "Model view (all layers × heads)"


def _need(model):
    if not core.MODELS[model].available():
        pytest.skip(f"{model}'s weight package is not installed")


def _text_areas(at):
    return {t.label: t.value for t in at.get("text_area")}


def test_toy_two_heads_off_and_back_from_the_url(app_test):
    toy = core.load_model("toy-translate")
    off = [("encoder", 0, 1), ("encoder", 1, 3)]
    at = app_test("explore", text=TEXT, layer="2", head="0")
    at.run()
    assert_no_exception(at)
    assert not [e for e in at.expander if "What changed" in e.label]
    plain = heatmap_z(chart_by_key(at, "explore-heatmap"))
    at.multiselect(key="explore.ablate").select("encoder.1.3").select("encoder.0.1").run()
    assert_no_exception(at)
    assert at.query_params["ablate"] == "encoder.0.1,encoder.1.3"
    expected = toy.trace(TEXT, ablate=off)
    z = heatmap_z(chart_by_key(at, "explore-heatmap"))
    np.testing.assert_allclose(z, expected["encoder.2.self_attn.weights"][0].numpy(), atol=1e-6)
    assert np.abs(z - plain).max() > 1e-3  # layer 2 reads what layers 0 and 1 no longer write
    areas = _text_areas(at)
    assert areas["translation before"] == " ".join(toy.trace(TEXT).tokens("target")[1:])
    assert areas["translation after"] == " ".join(expected.tokens("target")[1:])
    # a fresh session on the URL restores the list and the same maps
    url = dict(at.query_params)
    again = app_test("explore", **url)
    again.run()
    assert_no_exception(again)
    assert again.multiselect(key="explore.ablate").value == ["encoder.0.1", "encoder.1.3"]
    np.testing.assert_allclose(heatmap_z(chart_by_key(again, "explore-heatmap")), z, atol=1e-7)
    # the model view crosses the switched-off heads out
    again.session_state["explore.tab"] = TAB_MODEL
    again.run()
    marks = figure(chart_by_key(again, "explore-grid"))["data"][2]["customdata"]
    marks = decode_array(marks) if isinstance(marks, dict) else np.array(marks)
    assert sorted((int(r[0]), int(r[1])) for r in marks) == [(0, 1), (1, 3)]
    # switched back on: the plain maps again and no ablate in the URL
    again.multiselect(key="explore.ablate").set_value([]).run()
    assert "ablate" not in again.query_params
    again.session_state["explore.tab"] = "Heatmap"
    again.run()
    np.testing.assert_allclose(heatmap_z(chart_by_key(again, "explore-heatmap")), plain, atol=1e-7)


def test_smollm2_next_token_panel_changes(app_test):
    _need("smollm2")
    text = "The capital of France is"
    off = [("decoder", 17, 4), ("decoder", 18, 6)]
    model = core.load_model("smollm2")
    at = app_test("explore", model="smollm2", text=text)
    at.run()
    at.multiselect(key="explore.ablate").set_value(["decoder.17.4", "decoder.18.6"]).run()
    assert_no_exception(at)
    assert at.query_params["ablate"] == "decoder.17.4,decoder.18.6"
    table = at.dataframe[0].value
    before, after = model.trace(text), model.trace(text, ablate=off)
    np.testing.assert_allclose(table["p before"], before["next.probs"].numpy(), atol=1e-6)
    np.testing.assert_allclose(table["p after"], after["next.probs"].numpy(), atol=1e-6)
    assert np.abs(table["p before"].to_numpy() - table["p after"].to_numpy()).max() > 1e-3
    areas = _text_areas(at)
    assert areas["before"] == "".join(model.generate(text, max_new_tokens=20)[0])
    assert areas["after"] == "".join(model.generate(text, max_new_tokens=20, ablate=off)[0])
    again = app_test("explore", **dict(at.query_params))
    again.run()
    assert again.multiselect(key="explore.ablate").value == ["decoder.17.4", "decoder.18.6"]
    np.testing.assert_allclose(again.dataframe[0].value["p after"], table["p after"], atol=1e-7)


def test_minilm_cosines_with_mean_ablation(app_test):
    _need("minilm")
    text = "I swam across the river to get to the other bank."
    at = app_test("explore", model="minilm", text=text, ablate="encoder.0.2,encoder.2.9", ablation="mean")
    at.run()
    assert_no_exception(at)
    assert at.selectbox(key="explore.ablation").value == "mean"
    model = core.load_model("minilm")
    off = [("encoder", 0, 2), ("encoder", 2, 9)]
    cos = knockout.token_cosines(model.trace(text)["encoder.5.out"].numpy(),
                           model.trace(text, ablate=off, ablation="mean")["encoder.5.out"].numpy())
    drawn = decode_array(figure(chart_by_key(at, "explore-changed-cosine"))["data"][0]["y"])
    np.testing.assert_allclose(drawn, cos, atol=1e-6)
    assert cos.min() < 0.999


def test_bad_ablate_in_url_warns(app_test):
    at = app_test("explore", text=TEXT, ablate="decoder.9.9,encoder.0.1")
    at.run()
    assert_no_exception(at)
    assert any("ablate=" in w.value for w in at.warning), [w.value for w in at.warning]
    assert at.multiselect(key="explore.ablate").value == [] and "ablate" not in at.query_params


def test_mode_survives_a_trip_to_another_page(app_test):
    """Back on Explore after another page, the switched-off heads are still "zeroed" (not an
    empty choice): a field left out of the URL is no value to carry between pages."""
    at = app_test("explore", text=TEXT)
    at.run()
    assert at.selectbox(key="explore.ablation").value == "zero"
    switch_page(at, "positions").run()
    chart_by_key(at, "positions-pe")  # the trip really reached Positions
    switch_page(at, "explore").run()
    assert_no_exception(at)
    assert at.selectbox(key="explore.ablation").value == "zero"
    at.multiselect(key="explore.ablate").select("encoder.0.1").run()
    assert_no_exception(at)
    assert at.query_params["ablate"] == "encoder.0.1" and "ablation" not in at.query_params
