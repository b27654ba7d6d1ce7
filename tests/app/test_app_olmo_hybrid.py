"""Inside a head and Explore on an OLMo Hybrid checkpoint (tests/hf_builders.py OLMO_HYBRID; a tiny
random one built by transformers): its mixer layers are pre-norm and its attention layer has
norms after the sub-layers only, without positions. Inside a head steps through a GDN layer's
recurrence with every check holding (the decay and beta recomputed from the mixer's actual input,
beta up to 2) and opens the attention layer's step view cleanly; Explore draws the mixer's exact
map and the model view; the decoder page's step check holds the softmax layers' weights and the
next-token probabilities to the prefix run alone."""

import numpy as np
import pytest

import core
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from core import trace_names as tn

TEXT = "the small dog sees the cat and the old man sleeps"
NAME = "tiny-olmo-hybrid"


def _clean(at):
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_builders import build

    root = tmp_path_factory.mktemp("olmo-hybrid-models")
    hf, folder = build("olmo_hybrid", root / NAME)
    hf.save_pretrained(str(folder))
    return root


@pytest.fixture(scope="module")
def ours(models_root):
    return core.load_model(str(models_root / NAME), device="cpu")


def test_inside_steps_through_a_pre_norm_gdn_layer(app_test, monkeypatch, models_root, ours):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_root))
    at = app_test("inside", model=NAME, text=TEXT, attn="decoder.mixer", layer="3", head="4")
    at.run()
    _clean(at)
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    assert len(passed) == 4 and any("write strength" in c for c in passed), passed
    beta = ours.trace(TEXT)[tn.mixer("decoder", 3, "beta")][4].double().numpy()
    gates = figure(chart_by_key(at, "inside-mixer-gates"))["data"]
    np.testing.assert_allclose(decode_array(gates[1]["y"]).astype(float), beta, atol=1e-6)


def test_inside_opens_the_post_norm_attention_layer(app_test, monkeypatch, models_root):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_root))
    at = app_test("inside", model=NAME, text=TEXT, layer="2", head="1")
    at.run()
    _clean(at)


def test_explore_draws_the_mixers_map(app_test, monkeypatch, models_root, ours):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_root))
    at = app_test("explore", model=NAME, text=TEXT, attn="decoder.mixer", layer="1", head="2")
    at.run()
    _clean(at)
    z = decode_array(figure(chart_by_key(at, "explore-mixer-map"))["data"][0]["z"]).astype(float)
    want = ours.trace(TEXT)[tn.mixer("decoder", 1, "weights")][2].numpy()
    np.testing.assert_allclose(z, want, atol=1e-7)
    assert np.all(np.triu(z, 1) == 0)
    at = app_test("explore", model=NAME, text=TEXT, tab="model")
    at.run()
    _clean(at)
    grid = figure(chart_by_key(at, "explore-mixed-grid"))
    rows = [a["text"] for a in grid["layout"]["annotations"] if a["text"].startswith("L")]
    assert rows == ["L0 · gated delta", "L1 · gated delta", "L2 · softmax", "L3 · gated delta"], rows


def test_decoder_page_checks_a_hybrids_step(app_test, monkeypatch, models_root, ours):
    """The step check runs the decoder on the step's prefix alone and compares the softmax layers'
    weights (a mixer layer has none) and the next-token probabilities."""
    from viz.ui import prefix_check as pc

    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_root))
    at = app_test("decoder", model=NAME, text=TEXT)
    at.run()
    _clean(at)
    view = ours.steps(TEXT, max_new_tokens=2)[1]
    check = pc.prefix_difference(view, ours.trace_decoder_input(TEXT, view.meta["target_ids"]))
    assert check.ok and "self-attention weights" in check.diffs and check.n_heads == 4
