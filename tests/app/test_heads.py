"""The heads page and its figures (viz.heads.figures): the drawn numbers are core.analysis's, a click
on a score cell opens that head in Explore, and the URL holds model and text."""

from __future__ import annotations

import urllib.parse

import numpy as np
import pandas as pd
import pytest

import core
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from core import analysis
from viz.heads import figures as hv
from viz.figures.heatmaps import CHAR_PX

TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def toy_scores(toy):
    return analysis.head_scores(toy, TEXT)


# ------------------------------------------------------------------ figures
def test_score_heatmap_is_the_table(toy_scores):
    fig = figure_dict(hv.score_heatmap(toy_scores, "self", "decoder", selected=(1, 2)))
    z = decode_array(fig["data"][0]["z"]).astype(float)
    rows = toy_scores[toy_scores["stack"] == "decoder"]
    assert z.shape == (rows["layer"].max() + 1, rows["head"].max() + 1)
    for r in rows.itertuples():
        assert z[r.layer, r.head] == pytest.approx(r.self, abs=1e-12)
    custom = decode_array(fig["data"][1]["customdata"]) if isinstance(fig["data"][1]["customdata"], dict) \
        else np.array(fig["data"][1]["customdata"], dtype=float)
    for layer, head, value in custom:
        assert value == pytest.approx(z[int(layer), int(head)], abs=1e-12)
    assert len(custom) == z.size
    shape = fig["layout"]["shapes"][0]
    assert (shape["x0"], shape["y0"]) == (1.5, 0.5)


def test_score_matrix_leaves_missing_heads_nan():
    df = pd.DataFrame({"stack": ["encoder"] * 3, "layer": [0, 0, 1], "head": [0, 1, 1], "self": [0.1, 0.2, 0.3]})
    z = hv.score_matrix(df, "self", "encoder")
    assert np.isnan(z[1, 0]) and z[1, 1] == 0.3 and z[0, 1] == 0.2


def test_head_pick_and_explore_params():
    assert hv.head_pick({"customdata": [3, 4, 0.9], "x": 4, "y": 3}) == (3, 4)
    assert hv.head_pick({"x": 2, "y": 5}) == (5, 2)
    assert hv.head_pick({}) is None
    from viz.ui.explore_links import explore_params

    assert explore_params("smollm2", "hi", "decoder", 18, 6) == {
        "model": "smollm2", "text": "hi", "attn": "decoder.self_attn", "layer": "18", "head": "6"}
    assert explore_params("smollm2", "hi", "decoder", 18, -1)["head"] == "0"  # a layer cell: its first head
    assert explore_params("gpt2", "hi", "decoder", 1, 2, "cross_attn")["attn"] == "decoder.cross_attn"


def test_rollout_heatmap_and_side_by_side_show_the_rows(toy):
    trace = toy.trace(TEXT)
    rolled = analysis.rollout(trace, "encoder")
    tokens = trace.tokens("source")
    fig = figure_dict(hv.rollout_heatmap(rolled, tokens, query=2))
    np.testing.assert_allclose(decode_array(fig["data"][0]["z"]), rolled[:, 2, :], atol=1e-12)
    assert fig["layout"]["xaxis"]["ticktext"] == tokens  # "the" twice, two columns

    raw = trace["encoder.2.self_attn.weights"].mean(0)[2].numpy()
    fl = analysis.flow(trace, "encoder", query=2)[-1, 2]
    fig = figure_dict(hv.side_by_side(raw, rolled[-1, 2], fl, tokens, 2))
    bars = [decode_array(d["x"]) for d in fig["data"]]
    np.testing.assert_allclose(bars[0], raw, atol=1e-7)
    np.testing.assert_allclose(bars[1], rolled[-1, 2], atol=1e-12)
    np.testing.assert_allclose(bars[2], fl, atol=1e-12)
    no_flow = figure_dict(hv.side_by_side(raw, rolled[-1, 2], None, tokens, 2))
    assert len(no_flow["data"]) == 2 and "not computed" in str(no_flow["layout"]["annotations"])


def figure_dict(fig) -> dict:
    import json

    return json.loads(fig.to_json())


# ------------------------------------------------------------------ the page
def test_page_draws_the_scores_and_keeps_the_url(app_test, toy):
    at = app_test("heads", text=TEXT)
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert at.query_params["model"] == "toy-translate" and at.query_params["text"] == TEXT
    expected = analysis.head_scores(toy, TEXT)
    enc = expected[expected["stack"] == "encoder"]
    for score in analysis.SCORES:
        z = decode_array(figure(chart_by_key(at, f"heads-{score}"))["data"][0]["z"]).astype(float)
        for r in enc.itertuples():
            assert z[r.layer, r.head] == pytest.approx(getattr(r, score), abs=1e-6), (score, r)
    # the decoder's own scores one click on the stack radio away
    at.radio(key="heads.stack").set_value("decoder").run()
    assert_no_exception(at)
    dec = expected[expected["stack"] == "decoder"]
    z = decode_array(figure(chart_by_key(at, "heads-induction"))["data"][0]["z"]).astype(float)
    r = dec.iloc[5]
    assert z[r["layer"], r["head"]] == pytest.approx(r["induction"], abs=1e-6)
    # rollout / flow for the chosen token
    at.selectbox(key="heads.token").set_value(3).run()
    trace = toy.trace(TEXT)
    rolled = analysis.rollout(trace, "decoder")
    comp = figure(chart_by_key(at, "heads-compare"))
    np.testing.assert_allclose(decode_array(comp["data"][1]["x"]), rolled[-1, 3], atol=1e-9)
    np.testing.assert_allclose(decode_array(figure(chart_by_key(at, "heads-rollout"))["data"][0]["z"]),
                               rolled[:, 3], atol=1e-9)


def test_top_heads_link_to_explore(app_test, toy):
    at = app_test("heads", text=TEXT)
    at.run()
    links = [l for l in at.get("page_link") if l.proto.page == "explore"]
    assert len(links) == 10  # induction: each head on the sentence, then on the repeated sequence
    assert [l.proto.page for l in at.get("page_link")].count("lens") == 1  # and the logit lens of the sentence
    assert [l.proto.page for l in at.get("page_link")].count("patching") == 1  # and patching its heads
    rep = analysis.repeated_text(toy, "encoder")
    top = analysis.top_heads(analysis.head_scores(toy, TEXT).query("stack == 'encoder'"), "induction", 5)
    for link, row in zip(links[1::2], top.itertuples()):
        assert urllib.parse.parse_qs(link.proto.query_string)["text"] == [rep["text"]]
        assert urllib.parse.parse_qs(link.proto.query_string)["layer"] == [str(row.layer)]
    for link, row in zip(links[::2], top.itertuples()):
        assert link.proto.label.startswith(f"layer {row.layer} · head {row.head}:")
        assert link.proto.page == "explore"
        assert urllib.parse.parse_qs(link.proto.query_string) == {
            "model": ["toy-translate"], "text": [TEXT], "attn": ["encoder.self_attn"],
            "layer": [str(row.layer)], "head": [str(row.head)]}


def test_clicked_head_opens_in_explore(app_test, toy):
    at = app_test("heads", text=TEXT)
    at.run()
    from viz.ui.explore_links import explore_params

    at.session_state["heads._open"] = explore_params("toy-translate", TEXT, "encoder", 2, 3)
    at.run()
    assert_no_exception(at)
    assert at.query_params["layer"] == "2" and at.query_params["head"] == "3"
    assert at.query_params["attn"] == "encoder.self_attn"
    z = decode_array(figure(chart_by_key(at, "explore-heatmap"))["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(z, toy.trace(TEXT)["encoder.2.self_attn.weights"][3].numpy(), atol=1e-6)


def test_long_input_draws_rollout_without_flow(app_test, toy):
    text = " ".join([TEXT] * 10)  # 60 tokens: above the page's flow limit
    at = app_test("heads", text=text)
    at.run()
    assert_no_exception(at)
    assert any("maximum-flow problem per input token" in i.value for i in at.info)
    comp = figure(chart_by_key(at, "heads-compare"))
    assert len(comp["data"]) == 2  # attention and rollout, no flow
    rolled = analysis.rollout(toy.trace(text), "encoder")
    np.testing.assert_allclose(decode_array(comp["data"][1]["x"]), rolled[-1, 1], atol=1e-9)


def test_bad_input_is_a_warning(app_test):
    at = app_test("heads", text="   ")
    at.run()
    assert_no_exception(at)
    assert at.warning and not at.get("plotly_chart")


def test_smollm2_page_notes_induction_heads(app_test):
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's weight package is not installed")
    at = app_test("heads", model="smollm2", text="The cat sat on the mat.")
    at.run()
    assert_no_exception(at)
    assert any("Induction heads" in i.value for i in at.info)
    z = decode_array(figure(chart_by_key(at, "heads-induction"))["data"][0]["z"]).astype(float)
    assert z.shape == (30, 9) and np.nanmax(z) > 0.5


def test_induction_link_opens_the_repeated_sequence(app_test):
    """Beside each induction link, one that opens Explore on the repeated sequence the score was
    read on; at that head, the score recomputed from the opened map is the head score."""
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's weight package is not installed")
    m = core.load_model("smollm2", device="cpu")
    rep = analysis.repeated_text(m)
    at = app_test("heads", model="smollm2", text="The cat sat on the mat.")
    at.run()
    assert_no_exception(at)
    links = [urllib.parse.parse_qs(l.proto.query_string, keep_blank_values=True) for l in at.get("page_link")
             if l.proto.page == "explore"]
    on_repeat = [q for q in links if q["text"] == [rep["text"]]]
    assert len(on_repeat) == 5 and len(links) == 10  # one per top head, beside its link on the sentence
    scores = analysis.head_scores(m, "The cat sat on the mat.")
    best = analysis.top_heads(scores, "induction", 1).iloc[0]
    q = on_repeat[0]
    assert (q["layer"], q["head"]) == ([str(best["layer"])], [str(best["head"])])
    ex = app_test("explore", **{k: v[0] for k, v in q.items()})
    ex.run()
    assert_no_exception(ex)
    z = decode_array(figure(chart_by_key(ex, "explore-heatmap"))["data"][0]["z"]).astype(float)
    r, start = rep["r"], rep["start"]
    assert z.shape == (len(rep["ids"]),) * 2
    stripe = np.mean([z[i, i - r + 1] for i in range(start, start + r)])
    assert stripe == pytest.approx(best["induction"], abs=1e-4) and stripe > 0.5


def test_head_labels_stay_level_and_apart():
    """12 heads (minilm) in a third of the page: the head labels stay horizontal (upright ones
    ran into the chart's title) and only as many are written as fit side by side."""
    rows = [{"stack": "encoder", "layer": l, "head": h, **{s: 0.5 for s in analysis.SCORES}}
            for l in range(6) for h in range(12)]
    fig = hv.score_heatmap(pd.DataFrame(rows), "self", "encoder")
    ax = fig.layout.xaxis
    assert ax.tickangle == 0 and list(ax.tickvals) == [0, 2, 4, 6, 8, 10]
    assert list(ax.ticktext) == ["H0", "H2", "H4", "H6", "H8", "H10"]
    width = len(ax.ticktext) * (CHAR_PX * 3 + 4)  # each label's width, at most "H10"
    assert width <= hv.HEAD_AXIS_PX
