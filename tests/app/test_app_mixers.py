"""The pages on models whose token mixers are not softmax attention: the random presets
gated_delta, mamba2 and short_conv, and a model of Mamba2 layers alone (a tiny checkpoint built
by transformers; every page on each: tests/app/test_app_mixer_pages.py). Explore draws a mixer's map signed
and centred on zero and a short convolution's filter; Inside a head steps through the
recurrence, its values checked against float64 numpy written here, and shows a visible failure
when the core is wrong; the KV cache page compares each mixer's fixed state with a cache."""

import math

import numpy as np
import pytest

import core
import core.net.gated_delta
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from core import trace_names as tn

TEXT = "the small dog sees the cat and the old man sleeps"
PRESETS = ["random:gated_delta", "random:mamba2", "random:short_conv", "random:kda"]


def _model(name):
    return core.load_model(name, device="cpu")


def _clean(at):
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def pure_mamba(tmp_path_factory):
    pytest.importorskip("transformers")
    from mixer_builders import build

    root = tmp_path_factory.mktemp("mixer-models")
    build("mamba2", root / "tiny-mamba2")
    build("falcon_h1", root / "tiny-falcon")  # Mamba2 beside the attention in every layer
    return root


def test_presets_have_their_mixers():
    kinds = {p: [k.get("mixer") for k in _model(p).layer_kinds("decoder")] for p in PRESETS}
    assert kinds["random:gated_delta"] == ["gated_delta"] * 3 + ["softmax"]
    assert kinds["random:mamba2"] == ["mamba2", "mamba2", "softmax", "mamba2"]
    assert kinds["random:short_conv"] == ["short_conv", "softmax"] * 2
    assert kinds["random:kda"] == ["kimi_delta"] * 3 + ["softmax"]
    assert _model("random:gated_delta").layer_kinds("decoder")[3]["output_gate"]
    assert _model("random:gated_delta").config.d_model == 64


def test_layer_picker_offers_the_layers_a_view_applies_to(app_test):
    at = app_test("explore", model="random:gated_delta", text=TEXT, layer="0")
    at.run()
    _clean(at)
    layer = next(s for s in at.selectbox if s.label == "Layer")
    assert list(layer.options) == ["3"] and layer.value == 3
    assert any("layer 0 has no decoder self-attention" in w.value for w in at.warning), [w.value for w in at.warning]
    at = app_test("explore", model="random:gated_delta", text=TEXT, attn="decoder.mixer")
    at.run()
    layer = next(s for s in at.selectbox if s.label == "Layer")
    assert list(layer.options) == ["0", "1", "2"]


def test_explore_draws_a_mixers_map_signed_and_causal(app_test):
    at = app_test("explore", model="random:gated_delta", text=TEXT, attn="decoder.mixer", layer="1", head="2")
    at.run()
    _clean(at)
    fig = figure(chart_by_key(at, "explore-mixer-map"))
    heat = fig["data"][0]
    z = decode_array(heat["z"]).astype(float)
    want = _model("random:gated_delta").trace(TEXT)[tn.mixer("decoder", 1, "weights")][2].numpy()
    np.testing.assert_allclose(z, want, atol=1e-7)
    assert (z < 0).any()  # the delta rule subtracts: negative weights are drawn, not clipped
    assert np.all(np.triu(z, 1) == 0)  # nothing above the diagonal
    assert heat["zmid"] == 0 and math.isclose(heat["zmin"], -heat["zmax"]) and heat["zmax"] >= np.abs(z).max()
    assert "negative weight subtracts" in heat["hovertemplate"]
    kinds = figure(chart_by_key(at, "explore-kinds"))["data"][0]
    assert kinds["text"] == [["gated delta"] * 3 + ["softmax"]]


def test_explore_draws_a_long_input_in_blocks(app_test):
    """A mixer's map of a long input is drawn as Explore's other maps are: in blocks (keys summed,
    queries averaged), with the reason in an st.info, and the model view's thumbnails pooled; the
    blocks are the exact map's block sums. Inside a head draws its map beside the softmax so too."""
    from viz.figures.model_view import MAX_GRID_SIDE, MAX_HEATMAP_SIDE
    from viz.figures.reduce import reduce_to

    long_text = " ".join([TEXT] * 16)
    at = app_test("explore", model="random:gated_delta", text=long_text, attn="decoder.mixer", layer="1", head="2")
    at.run()
    _clean(at)
    assert any("Long input" in i.value and "blocks" in i.value for i in at.info)
    z = decode_array(figure(chart_by_key(at, "explore-mixer-map"))["data"][0]["z"]).astype(float)
    full = _model("random:gated_delta").trace(long_text)[tn.mixer("decoder", 1, "weights")][2]
    assert full.shape[-1] > MAX_HEATMAP_SIDE and max(z.shape) <= MAX_HEATMAP_SIDE
    np.testing.assert_allclose(z, reduce_to(full, MAX_HEATMAP_SIDE).numpy(), atol=1e-6)
    at = app_test("explore", model="random:gated_delta", text=long_text, tab="model")
    at.run()
    _clean(at)
    heats = [d for d in figure(chart_by_key(at, "explore-mixed-grid"))["data"] if d["type"] == "heatmap"]
    assert max(max(decode_array(h["z"]).shape) for h in heats) <= MAX_GRID_SIDE
    at = app_test("inside", model="random:gated_delta", text=long_text, attn="decoder.mixer", layer="1", head="2")
    at.run()
    _clean(at)
    beside = figure(chart_by_key(at, "inside-mixer-beside"))
    za = decode_array(beside["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(za, reduce_to(full, MAX_HEATMAP_SIDE).numpy(), atol=1e-6)
    assert beside["layout"]["height"] <= 1200


def test_explore_model_view_marks_kinds_on_a_softmax_layer(app_test):
    at = app_test("explore", model="random:mamba2", text=TEXT, tab="model")
    at.run()
    _clean(at)
    grid = figure(chart_by_key(at, "explore-mixed-grid"))
    rows = [a["text"] for a in grid["layout"]["annotations"] if a["text"].startswith("L")]
    assert rows == ["L0 · Mamba2", "L1 · Mamba2", "L2 · softmax", "L3 · Mamba2"]
    tr = _model("random:mamba2").trace(TEXT)
    assert grid["layout"]["coloraxis2"]["cmid"] == 0
    heats = [d for d in grid["data"] if d["type"] == "heatmap"]
    assert heats[0]["coloraxis"] == "coloraxis2" and heats[8]["coloraxis"] == "coloraxis"  # layer 2: softmax
    np.testing.assert_allclose(decode_array(heats[8]["z"]).astype(float),
                               tr[tn.attn("decoder", 2, "self_attn", "weights")][0].numpy(), atol=1e-7)


def test_explore_model_view_draws_both_sides_of_falcon_layers(app_test, monkeypatch, pure_mamba):
    """Falcon-H1 runs Mamba2 beside softmax attention in every layer: the model view has a row for
    each, the softmax maps 0 to 1 and the mixer's signed, both the trace's own."""
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(pure_mamba))
    at = app_test("explore", model="tiny-falcon", text=TEXT, tab="model")
    at.run()
    _clean(at)
    grid = figure(chart_by_key(at, "explore-mixed-grid"))
    rows = [a["text"] for a in grid["layout"]["annotations"] if a["text"].startswith("L")]
    n_layers = len(rows) // 2
    assert rows == [r for i in range(n_layers) for r in (f"L{i} · softmax", f"L{i} · Mamba2 beside")]
    heats = [d for d in grid["data"] if d["type"] == "heatmap"]
    per_row = len(heats) // len(rows)
    m = core.load_model(str(pure_mamba / "tiny-falcon"), device="cpu")
    tr = m.trace(TEXT)
    np.testing.assert_allclose(decode_array(heats[per_row]["z"]).astype(float),
                               tr[tn.mixer("decoder", 0, "weights")][0].numpy(), atol=1e-6)
    np.testing.assert_allclose(decode_array(heats[0]["z"]).astype(float),
                               tr[tn.attn("decoder", 0, "self_attn", "weights")][0].numpy(), atol=1e-6)
    assert heats[per_row]["coloraxis"] == "coloraxis2" and heats[0]["coloraxis"] == "coloraxis"


def test_explore_shows_a_short_convolutions_filter_and_why(app_test):
    at = app_test("explore", model="random:short_conv", text=TEXT, attn="decoder.mixer", layer="2")
    at.run()
    _clean(at)
    assert any("A short convolution has no head map" in i.value for i in at.info)
    z = decode_array(figure(chart_by_key(at, "explore-filter"))["data"][0]["z"]).astype(float)
    w = _model("random:short_conv").trace(TEXT)[tn.mixer("decoder", 2, "filter")].numpy()
    assert z.shape == (64, 3)
    np.testing.assert_allclose(z, w, atol=1e-7)


# ------------------------------------------------------------------ Inside a head
def _numpy_delta(q, k, v, g, beta):
    """The gated delta rule, state by state, written again here: (states, outputs)."""
    S = np.zeros((k.shape[1], v.shape[1]))
    states, outs = [], []
    for t in range(k.shape[0]):
        S = math.exp(g[t]) * (np.eye(k.shape[1]) - beta[t] * np.outer(k[t], k[t])) @ S + beta[t] * np.outer(k[t], v[t])
        states.append(S.copy())
        outs.append(S.T @ q[t])
    return np.array(states), np.array(outs)


def test_inside_steps_through_the_gated_delta_rule(app_test):
    at = app_test("inside", model="random:gated_delta", text=TEXT, attn="decoder.mixer", layer="1", head="3")
    at.session_state["inside.mixer_step"] = 4
    at.run()
    _clean(at)
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    assert len(passed) == 4 and any("o_t = S_tᵀ q_t" in c for c in passed), passed
    tr = _model("random:gated_delta").trace(TEXT)
    get = lambda s: tr[tn.mixer("decoder", 1, s)][3].double().numpy()  # noqa: E731
    states, outs = _numpy_delta(get("q"), get("k"), get("v"), get("decay"), get("beta"))
    shown = decode_array(figure(chart_by_key(at, "inside-mixer-state"))["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(shown, states[4], atol=1e-6)
    gates = figure(chart_by_key(at, "inside-mixer-gates"))["data"]
    np.testing.assert_allclose(decode_array(gates[0]["y"]).astype(float), np.exp(get("decay")), atol=1e-6)
    np.testing.assert_allclose(decode_array(gates[1]["y"]).astype(float), get("beta"), atol=1e-6)
    out = figure(chart_by_key(at, "inside-mixer-out"))["data"]
    np.testing.assert_allclose(decode_array(out[0]["y"]).astype(float), outs[4], atol=1e-6)
    beside = figure(chart_by_key(at, "inside-mixer-beside"))["data"]
    soft = decode_array(beside[1]["z"]).astype(float)
    q, k = get("q") * math.sqrt(16), get("k")
    s = q @ k.T / math.sqrt(16) + np.triu(np.full((len(q), len(q)), -np.inf), 1)
    want = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(soft, want / want.sum(1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(decode_array(beside[0]["z"]).astype(float), get("weights"), atol=1e-7)


def test_inside_steps_through_the_kimi_delta_rule(app_test):
    """Kimi Delta Attention: a decay per key channel. The checks pass (the decay recomputed from
    the layer's input, beta, the outputs, the map), the state drawn is the per-channel rule's
    (written again here) and the gates figure draws the channels' mean, slowest and fastest decay."""
    at = app_test("inside", model="random:kda", text=TEXT, attn="decoder.mixer", layer="1", head="2")
    at.session_state["inside.mixer_step"] = 5
    at.run()
    _clean(at)
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    assert len(passed) == 4 and any("per key channel" in c for c in passed), passed
    tr = _model("random:kda").trace(TEXT)
    get = lambda s: tr[tn.mixer("decoder", 1, s)][2].double().numpy()  # noqa: E731
    q, k, v, g, beta = (get(s) for s in ("q", "k", "v", "decay", "beta"))
    assert g.shape == (len(q), 16)
    S = np.zeros((16, 16))
    for t in range(6):
        S = (np.eye(16) - beta[t] * np.outer(k[t], k[t])) @ (np.exp(g[t])[:, None] * S) + beta[t] * np.outer(k[t], v[t])
    shown = decode_array(figure(chart_by_key(at, "inside-mixer-state"))["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(shown, S, atol=1e-6)
    gates = figure(chart_by_key(at, "inside-mixer-gates"))["data"]
    np.testing.assert_allclose(decode_array(gates[0]["y"]).astype(float), np.exp(g).mean(1), atol=1e-6)
    np.testing.assert_allclose(decode_array(gates[2]["y"]).astype(float), np.exp(g).min(1), atol=1e-6)
    out = figure(chart_by_key(at, "inside-mixer-out"))["data"]
    np.testing.assert_allclose(decode_array(out[0]["y"]).astype(float), S.T @ q[5], atol=1e-6)


def test_inside_latent_layer_without_positions(app_test):
    """The kda preset's latent attention layer has no positions: Inside a head's latent steps
    recompute its shared key part and q unrotated, and every check passes."""
    at = app_test("inside", model="random:kda", text=TEXT, attn="decoder.self_attn", layer="3", head="1")
    at.run()
    _clean(at)
    assert any("k_rope = X W_KR" in c.value and c.value.startswith(":green[✓") for c in at.caption)
    assert not any(c.value.startswith(":red[✗") for c in at.caption)


def test_inside_steps_through_mamba2(app_test):
    at = app_test("inside", model="random:mamba2", text=TEXT, attn="decoder.mixer", layer="3", head="1")
    at.run()
    _clean(at)
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    assert len(passed) == 3 and any("the log decay dt_t a" in c for c in passed), passed
    m = _model("random:mamba2")
    tr = m.trace(TEXT)
    get = lambda s: tr[tn.mixer("decoder", 3, s)][1].double().numpy()  # noqa: E731
    a = -math.exp(float(m.net.decoder[3].mixer.A_log.detach()[1]))
    B, x, ld = get("k"), get("v"), get("decay")
    S = np.zeros((x.shape[1], B.shape[1]))
    for t in range(len(ld)):
        S = math.exp(ld[t]) * S + (ld[t] / a) * np.outer(x[t], B[t])
    shown = decode_array(figure(chart_by_key(at, "inside-mixer-state"))["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(shown, S, atol=1e-6)  # the last step by default
    bc = figure(chart_by_key(at, "inside-mixer-bc"))["data"]
    np.testing.assert_allclose(decode_array(bc[0]["y"]).astype(float), B[-1], atol=1e-6)


def test_inside_shows_a_fault_in_the_core(app_test, monkeypatch):
    """The rule's output 1 % off inside the core: the page's numpy recurrence disagrees, visibly."""
    orig = core.net.gated_delta.chunked_rule
    monkeypatch.setattr(core.net.gated_delta, "chunked_rule",
                        lambda *a, **kw: (lambda out: (out[0] * 1.01, out[1]))(orig(*a, **kw)))
    from viz.ui import models

    models.trace_cache().clear()  # a clean cached trace must not hide the fault
    at = app_test("inside", model="random:gated_delta:7", text=TEXT, attn="decoder.mixer", layer="0")
    at.run()
    assert_no_exception(at)
    errors = [e.value for e in at.error]
    assert any("failed on this view" in e for e in errors), errors
    assert any("✗ FAILED" in e and "o_t = S_tᵀ q_t" in e for e in errors), errors
    monkeypatch.setattr(core.net.gated_delta, "chunked_rule", orig)
    models.trace_cache().clear()
    at = app_test("inside", model="random:gated_delta:7", text=TEXT, attn="decoder.mixer", layer="0")
    at.run()
    _clean(at)  # the fault removed: every check holds again


def test_inside_says_why_a_short_convolution_has_no_recurrence(app_test):
    at = app_test("inside", model="random:short_conv", text=TEXT, attn="decoder.mixer")
    at.run()
    _clean(at)
    assert any("no recurrence to step through" in i.value for i in at.info)


# ------------------------------------------------------------------ KV cache
def test_kv_cache_page_sets_the_state_against_the_cache(app_test):
    at = app_test("kvcache", model="random:gated_delta", text=TEXT)
    at.run()
    _clean(at)
    data = figure(chart_by_key(at, "kvcache-mixer-state"))["data"]
    state, cache = (decode_array(d["y"]).astype(float) for d in data)
    n = len(_model("random:gated_delta").trace(TEXT).tokens("target"))
    # a gated delta layer: conv (2 * 2 heads * 16 + 4 * 16) x 3 taps + state 4 x 16 x 16, float32
    assert list(state) == [4 * ((2 * 32 + 64) * 3 + 4 * 16 * 16)] * 3
    assert list(cache) == [4 * 2 * n * 64] * 3
    assert any("per sequence whatever the length" in c.value for c in at.caption)
    # the cache counts only the softmax layer (1 of 4): 2 H d_k floats a token, float32
    assert any("512 bytes a token over the 1 layer that keeps a cache" in c.value
               and "3 keep a token mixer's fixed state instead" in c.value for c in at.caption)


def test_reference_writes_out_the_output_gate():
    """The gated softmax layer of the gated_delta preset (Qwen3.5's output gate): the numpy
    reference's gate and layer output equal the core's (without the gate the output differs)."""
    from viz.figures.reference import reference_layer

    tr = _model("random:gated_delta:1").trace(TEXT)
    ref = reference_layer(tr, "decoder", 3, {"self_attn": 1})
    np.testing.assert_allclose(ref["self_attn.gate"], tr[tn.attn("decoder", 3, "self_attn", "gate")].double().numpy(),
                               atol=1e-6)
    assert ref["self_attn.gate"].min() < 0.9  # a gate that bites
    np.testing.assert_allclose(ref["out"], tr[tn.out("decoder", 3)].double().numpy(), atol=1e-4)


def test_lens_draws_each_mixers_logit_attribution_as_a_column(app_test, monkeypatch, pure_mamba):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(pure_mamba))
    at = app_test("lens", model="tiny-mamba2", text=TEXT)
    at.run()
    _clean(at)
    fig = figure(chart_by_key(at, "lens-attribution"))
    heat = fig["data"][0]
    assert fig["layout"]["xaxis"]["ticktext"] == ["mixer", "MLP"]  # no heads: one mixer term per layer (and the MLP column)
    z = decode_array(heat["z"]).astype(float)
    tr = core.load_model(str(pure_mamba / "tiny-mamba2"), device="cpu").trace(TEXT)
    import core.analysis as ca

    df = ca.logit_attribution(tr, tr.tokens("next")[0])
    mixer = df[df["kind"] == "mixer"].sort_values("layer")["contribution"].to_numpy()
    assert len(mixer) == 3
    col = z[1:1 + 3, 0]
    np.testing.assert_allclose(col, mixer, atol=1e-5)
