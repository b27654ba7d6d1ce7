"""The Playground's Recall tab through AppTest: for every shipped recall model, the map drawn is
the layer's map of that model's own trace of the sequence, the outline sits on the answer key's
column in the query's row (the sequence rebuilt here from core.toy.recall_task), the prediction
said is the model's, and the URL keeps the tab's fields."""

import random

import numpy as np
import pytest
import torch

import core
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from core import trace_names as tn
from core.toy import recall_model, recall_task

NAMES = [f"recall-{m}" for m in recall_model.available()]


def _open(app_test, **params):
    at = app_test("playground", tab="recall", **params)
    at.run()
    assert_no_exception(at)
    return at


def _shape(fig: dict, name: str, xref: str):
    s = next(s for s in fig["layout"]["shapes"] if s.get("name") == name and s.get("xref") == xref)
    return (s["y0"] + s["y1"]) / 2, (s["x0"] + s["x1"]) / 2


def _model_map(name: str, text: str, layer: int) -> np.ndarray:
    """The layer's map from a fresh load of the model, read independently of the page: softmax
    weights computed here in numpy from the recorded q and k, a mixer's implicit attention from
    the trace."""
    model = core.load_model(name, device="cpu")
    trace = model.trace(text)
    if layer in trace.mixer_layers("decoder"):
        return trace[tn.mixer("decoder", layer, "weights")].numpy()
    q = trace[tn.self_attn("decoder", layer, "q")].double().numpy()
    k = trace[tn.self_attn("decoder", layer, "k")].double().numpy()
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[1:], dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("pairs,seed,layer,query", [(6, 3, 1, 2), (12, 7, 0, 11)])
def test_each_model_outlines_the_answer_key(app_test, pairs, seed, layer, query):
    assert NAMES and "recall-softmax" in NAMES
    at = _open(app_test, rc_pairs=str(pairs), rc_seed=str(seed), rc_layer=str(layer), rc_query=str(query))
    ex = recall_task.make_example(pairs, random.Random(seed))
    q, k = ex.query_positions[query], ex.answer_key_positions[query]
    assert ex.tokens[q] == ex.tokens[k] and ex.tokens[k + 1] == ex.answers[query]
    text = " ".join(ex.tokens)
    for name in NAMES:
        fig = figure(chart_by_key(at, f"playground-recall-{name.removeprefix('recall-')}"))
        heads = [t for t in fig["data"] if t["type"] == "heatmap"]
        want = _model_map(name, text, layer)
        assert len(heads) == want.shape[0]
        for h, t in enumerate(heads):
            z = decode_array(t["z"]).astype(float)
            assert z.shape == want.shape[1:]
            low = np.tril(np.ones_like(z, dtype=bool))
            assert np.isnan(z[~low]).all()  # nothing drawn above the diagonal
            np.testing.assert_allclose(z[low], want[h][low], atol=2e-5, err_msg=f"{name} head {h}")
            xref = "x" if h == 0 else f"x{h + 1}"
            assert _shape(fig, "answer key", xref) == (q, k), (name, h)
            assert _shape(fig, "answer value", xref) == (q, k + 1), (name, h)
        for h, c in enumerate(np.abs(want[:, q, : q + 1]).argmax(-1)):  # the row's largest entry, named
            said_at = {k: "the answer's key", k + 1: "the answer's value"}.get(int(c), f"position {c} ({ex.tokens[c]})")
            assert any(f"head {h}: {said_at}" in m.value for m in at.markdown if "Largest" in m.value), (name, h)
        model = core.load_model(name, device="cpu")
        with torch.inference_mode():
            said = recall_task.vocab()[int(model.net(None, torch.tensor([[recall_task.vocab().index(t) for t in ex.tokens]]))[0, q].argmax())]
        verdict = "right" if said == ex.answers[query] else "wrong"
        assert any(f"Predicts **{said}** after **{ex.tokens[q]}**: {verdict}" in m.value for m in at.markdown), name
    assert at.query_params["rc_pairs"] == str(pairs) and at.query_params["rc_query"] == str(query)


def test_softmax_finds_the_answer_and_the_curve_is_drawn(app_test):
    at = _open(app_test, rc_pairs="8", rc_seed="1")
    assert any("Predicts **" in m.value and ": right" in m.value and "softmax" in m.value for m in at.markdown)
    fig = figure(chart_by_key(at, "playground-recall-curve"))
    shipped = recall_task.shipped_curves()
    lines = {t["name"]: t for t in fig["data"] if t.get("mode") == "lines+markers"}
    assert len(lines) == len(shipped)
    now = [t for t in fig["data"] if str(t.get("name", "")).endswith(", now")]
    assert len(now) == len(NAMES) and all(list(t["x"]) == [8] for t in now)
    softmax_now = next(t for t in now if t["name"].startswith("softmax"))
    assert softmax_now["y"][0] >= 0.95  # the softmax model recalls (its shipped curve is >= 99%)


def test_bad_values_are_clamped_with_a_message(app_test):
    at = _open(app_test, rc_pairs="3", rc_query="9", rc_layer="x", rc_seed="-4")
    assert at.session_state["playground.rc_query"] == 2
    assert at.session_state["playground.rc_layer"] == 1 and at.session_state["playground.rc_seed"] == 0
    said = " ".join(m.value for m in [*at.warning, *at.info])
    assert all(f in said for f in ("rc_query", "rc_layer", "rc_seed")), said
    at = _open(app_test, rc_pairs="99")
    assert at.session_state["playground.rc_pairs"] == 16 and any("rc_pairs" in w.value for w in at.warning)


@pytest.mark.parametrize("name", NAMES)
def test_each_recall_model_opens_in_explore(app_test, name):
    """Every recall model is offered by the pickers and opens in Explore on a recall sequence with
    no warning: the softmax one on its attention, the mixers on their exact maps (the mixer view)."""
    from viz.ui import models

    assert name in models.model_names()
    text = recall_task.make_example(4, random.Random(0)).text()
    at = app_test("explore", model=name, text=text)
    at.run()
    assert_no_exception(at)
    assert not at.warning, [w.value for w in at.warning]
    assert at.query_params["model"] == name
    assert at.get("plotly_chart"), "no map drawn"
