"""The random model's presets (random:sinks, chunked, nope, sliding, moe) on the pages that show
what they are: a learned sink's column on every map, each layer's mask kind and the mask's
shading, a NoPE layer's map beside a RoPE layer's, which layers rotate on Positions, the learned
sink beside StreamingLLM's sinks on the KV cache page. Every number read from a chart is
compared with the core's trace or with numpy written here."""

import json
import re

import numpy as np
import pytest
import torch

import core
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from core import trace_names as tn
from core.registry import RANDOM_PRESETS, preset_config, random_preset, random_preset_names

TEXT = "the small dog sees the cat and the old man sleeps near the river"


def _model(name):
    return core.load_model(name, device="cpu")


def _data(at, key):
    return figure(chart_by_key(at, key))["data"]


def _trace_named(data, name):
    got = [d for d in data if d.get("name") == name]
    assert got, f"no trace named {name!r}: {[d.get('name') for d in data]}"
    return got[0]


def _no_problems(at):
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert not at.warning, [w.value for w in at.warning]


# ------------------------------------------------------------------ the registry
def test_preset_names_parse_and_refuse():
    assert random_preset_names() == [f"random:{p}" for p in RANDOM_PRESETS]
    assert random_preset("random:sinks") == ("sinks", 0) and random_preset("random:nope:7") == ("nope", 7)
    assert random_preset("random") is None and random_preset("smollm2") is None
    with pytest.raises(ValueError, match="no random preset 'bogus'; the presets are sinks, chunked"):
        random_preset("random:bogus")
    with pytest.raises(ValueError, match="must be a whole number"):
        random_preset("random:sinks:x")
    with pytest.raises(ValueError, match="no random preset"):
        core.load_model("random:bogus", device="cpu")


def test_each_preset_has_its_mechanism():
    kinds = {p: _model(f"random:{p}").layer_kinds("decoder") for p in RANDOM_PRESETS}
    assert all(k["sink"] for k in kinds["sinks"]) and [k["mask"] for k in kinds["sinks"]] == ["sliding 4", "causal"] * 2
    assert [k["mask"] for k in kinds["chunked"]] == ["chunked 5"] * 3 + ["causal"]
    assert [k["positions"] for k in kinds["chunked"]] == ["rope"] * 3 + ["none"]
    assert kinds["chunked"][3]["scale"] == "per position" and kinds["chunked"][0]["qk_norm"] == "l2"
    assert [k["positions"] for k in kinds["nope"]] == ["rope"] * 3 + ["none"]
    assert [k["mask"] for k in kinds["sliding"]] == ["sliding 4"] * 3 + ["causal"]
    assert all(k["ffn"] == "moe" and k["experts"] == 4 and k["top_k"] == 2 for k in kinds["moe"])
    assert not any(k["sink"] for p in ("chunked", "nope", "sliding", "moe") for k in kinds[p])
    assert preset_config("nope").n_layers == 4 and preset_config("nope").d_model == 64


def test_a_seed_draws_other_weights_and_the_same_seed_the_same():
    a, b, c = _model("random:sinks"), _model("random:sinks:0"), _model("random:sinks:5")
    sa, sb, sc = (m.net.decoder[0].self_attn.sinks.detach() for m in (a, b, c))
    assert torch.equal(sa, sb) and not torch.allclose(sa, sc)
    assert float(sa.abs().max()) > 0.1  # the sink logits are drawn, not left at zero
    wa, wc = (m.net.decoder[1].self_attn.w_q.weight.detach() for m in (a, c))
    assert not torch.allclose(wa, wc)
    assert c.name == "random:sinks:5" and "seed 5" in c.description


# ------------------------------------------------------------------ Explore
def test_explore_draws_the_sink_column_and_says_the_weights_are_random(app_test):
    at = app_test("explore", model="random:sinks:3", text=TEXT, attn="decoder.self_attn", layer="2", head="1")
    at.run()
    _no_problems(at)
    assert any("weights of random:sinks:3 are random" in i.value for i in at.info)
    tr = _model("random:sinks:3").trace(TEXT)
    data = _data(at, "explore-heatmap")
    keys = decode_array(data[0]["z"]).astype(float)
    sink = decode_array(_trace_named(data, "sink")["z"]).astype(float)[:, 0]
    np.testing.assert_allclose(keys, tr[tn.attn("decoder", 2, "self_attn", "weights")][1].numpy(), atol=1e-6)
    np.testing.assert_allclose(sink, tr[tn.attn("decoder", 2, "self_attn", "sink")][1].numpy(), atol=1e-6)
    np.testing.assert_allclose(keys.sum(1) + sink, 1.0, atol=1e-5)  # a row and its sink make the whole softmax
    assert sink.min() > 0.01
    n = keys.shape[1]
    assert _trace_named(data, "sink")["x"] == [n + 1]  # one empty column between the keys and the sink
    lay = figure(chart_by_key(at, "explore-heatmap"))["layout"]
    assert lay["xaxis"]["ticktext"][-1] == "sink" and lay["xaxis"]["tickvals"][-1] == n + 1
    assert any(s.get("x0") == n for s in lay.get("shapes", []))  # the red line sets it apart
    assert "sliding 4 · RoPE · learned sink" in lay["title"]["text"]


def test_explore_a_model_without_sinks_draws_no_sink_column(app_test):
    at = app_test("explore", model="random:sliding", text=TEXT, attn="decoder.self_attn")
    at.run()
    _no_problems(at)
    assert [d.get("name") for d in _data(at, "explore-heatmap") if d["type"] == "heatmap"] == [None]


def test_explore_shades_the_chunked_mask_and_names_it(app_test):
    at = app_test("explore", model="random:chunked", text=TEXT, attn="decoder.self_attn", layer="1", shade="1")
    at.run()
    _no_problems(at)
    data = _data(at, "explore-heatmap")
    shade = decode_array(_trace_named(data, "mask")["z"]).astype(float)
    n = shade.shape[0]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    forbidden = (j > i) | (i // 5 != j // 5)  # Llama 4: causal within the query's own chunk of 5
    np.testing.assert_array_equal(~np.isnan(shade), forbidden)
    assert forbidden[5:, :5].all() and not forbidden[7, 5]  # the chunk boundary bites on this sentence
    weights = decode_array(data[0]["z"]).astype(float)
    assert (weights[forbidden] == 0).all() and (weights[~forbidden] > 0).all()
    assert "chunked 5 · RoPE" in figure(chart_by_key(at, "explore-heatmap"))["layout"]["title"]["text"]
    assert at.query_params["shade"] == "1"


def test_explore_puts_a_nope_layer_beside_a_rope_layer(app_test):
    at = app_test("explore", model="random:nope", text=TEXT, attn="decoder.self_attn", layer="0", head="2", beside="3")
    at.run()
    _no_problems(at)
    tr = _model("random:nope").trace(TEXT)
    beside = figure(chart_by_key(at, "explore-beside-map"))
    np.testing.assert_allclose(decode_array(beside["data"][0]["z"]).astype(float),
                               tr[tn.attn("decoder", 3, "self_attn", "weights")][2].numpy(), atol=1e-6)
    assert "layer 3 · head 2 · causal · NoPE" in beside["layout"]["title"]["text"]
    assert "causal · RoPE" in figure(chart_by_key(at, "explore-heatmap"))["layout"]["title"]["text"]
    assert at.query_params["beside"] == "3"
    at = app_test("explore", model="random:nope", text=TEXT, attn="decoder.self_attn", beside="9")
    at.run()
    assert any("beside" in w.value for w in at.warning), [w.value for w in at.warning]


def test_model_view_names_each_layers_mask_and_draws_each_maps_sink(app_test):
    at = app_test("explore", model="random:sinks", text=TEXT, attn="decoder.self_attn", tab="model")
    at.run()
    _no_problems(at)
    fig = figure(chart_by_key(at, "explore-grid"))
    assert fig["layout"]["yaxis"]["ticktext"] == [
        "L0 · sliding 4 · RoPE · learned sink", "L1 · causal · RoPE · learned sink",
        "L2 · sliding 4 · RoPE · learned sink", "L3 · causal · RoPE · learned sink"]
    heat = fig["data"][0]
    z = decode_array(heat["z"]).astype(float)
    tr = _model("random:sinks").trace(TEXT)
    for layer, h in ((0, 0), (3, 2)):
        rows = [r for r, y in enumerate(heat["y"]) if str(y).startswith(f"layer {layer} · ")]
        col = heat["x"].index(f"head {h} · sink")
        np.testing.assert_allclose(z[rows, col], tr[tn.attn("decoder", layer, "self_attn", "sink")][h].numpy(),
                                   atol=1e-6)
        assert np.isnan(z[rows, col - 1]).all()  # the blank column before it
    lines = [s for s in fig["layout"].get("shapes", []) if s.get("type") == "line"]
    assert len(lines) == 4  # one red line per head
    enlarged = _data(at, "explore-enlarged")
    assert _trace_named(enlarged, "sink")


# ------------------------------------------------------------------ Inside, Heads, Positions, KV cache
@pytest.mark.parametrize("name, layer", [("random:sinks", 0), ("random:chunked", 1), ("random:chunked", 3),
                                         ("random:nope", 3), ("random:sliding", 0)])
def test_inside_checks_hold_on_every_preset(app_test, name, layer):
    """The Inside page's numpy reference writes out sinks, chunks, NoPE, temperature tuning and
    the L2 QK-norm: every check is green (a wrong formula there shows as a red error)."""
    at = app_test("inside", model=name, text=TEXT, attn="decoder.self_attn", layer=str(layer))
    at.run()
    _no_problems(at)
    passed = [c.value for c in at.caption if c.value.startswith(":green[✓")]
    assert any("A = softmax(masked)" in c for c in passed), passed
    said = " ".join(c.value for c in at.caption)
    if name == "random:chunked" and layer == 1:
        assert "Layer 1 is a chunked layer (Llama 4): the positions are cut into chunks of 5" in said
        assert "layer 1 is chunked: its own chunk of 5 positions, RoPE base 10000" in said
    if layer == 3 and name == "random:chunked":
        assert "layer 3 is global: full attention, without positions (NoPE" in said
    if layer == 3 and name == "random:nope":
        assert "layer 3 is without positions (NoPE: q and k never rotated; layers 3 of 4 have none)" in said
    if name == "random:sinks":
        assert any("plus its learned sink sums to 1" in c for c in passed)
        assert any("learned sink's share" in c for c in passed)
        tr = _model(name).trace(TEXT)
        sink = decode_array(_trace_named(_data(at, "inside-weights-fig"), "sink")["z"]).astype(float)[:, 0]
        np.testing.assert_allclose(sink, tr[tn.attn("decoder", 0, "self_attn", "sink")][0].numpy(), atol=1e-6)


def test_inside_says_a_mixture_of_experts_has_no_reference(app_test):
    at = app_test("inside", model="random:moe", text=TEXT)
    at.run()
    assert_no_exception(at)
    assert not at.error
    assert any("mixture of experts" in i.value for i in at.info)


def test_reference_layer_matches_the_core_on_every_preset():
    from viz.figures.reference import NoReference, reference_layer

    for p in ("sinks", "chunked", "nope", "sliding"):
        tr = _model(f"random:{p}:1").trace(TEXT)
        for i in range(4):
            ref = reference_layer(tr, "decoder", i, {"self_attn": 3})
            maps = ref["self_attn.maps3"]
            for step in ("scaled", "weights"):
                np.testing.assert_allclose(maps[step], tr[tn.attn("decoder", i, "self_attn", step)][3].double().numpy(),
                                           atol=1e-5, err_msg=f"{p} layer {i} {step}")
            np.testing.assert_allclose(ref["out"], tr[tn.out("decoder", i)].double().numpy(), atol=1e-4)
    with pytest.raises(NoReference, match="mixture of experts"):
        reference_layer(_model("random:moe").trace(TEXT), "decoder", 0)


def test_heads_scores_each_heads_learned_sink(app_test):
    at = app_test("heads", model="random:sinks", text=TEXT)
    at.run()
    _no_problems(at)
    z = decode_array(_data(at, "heads-learned-sink")[0]["z"]).astype(float)
    tr = _model("random:sinks").trace(TEXT)
    want = np.stack([tr[tn.attn("decoder", i, "self_attn", "sink")].double().mean(-1).numpy() for i in range(4)])
    np.testing.assert_allclose(z, want, atol=1e-6)


def test_positions_shows_which_layers_rotate(app_test):
    at = app_test("positions", model="random:nope", text=TEXT)
    at.run()
    _no_problems(at)
    bar = _data(at, "positions-layers")[0]
    assert bar["customdata"] == ["RoPE", "RoPE", "RoPE", "NoPE"]
    assert bar["text"] == ["RoPE θ=10000"] * 3 + ["NoPE"]
    assert any("no positions" in i.value and "L3" in i.value for i in at.info)
    links = at.get("page_link")
    assert any("layer 3's map (NoPE) beside layer 0's (RoPE)" in link.proto.label for link in links)
    assert any("weights of random:nope are random" in i.value for i in at.info)


def test_kvcache_sets_the_learned_sink_beside_the_first_tokens(app_test):
    text = " ".join([TEXT] * 3)
    at = app_test("kvcache", model="random:sinks", text=text, budget="8", sinks="2")
    at.run()
    _no_problems(at)
    bars = _data(at, "kvcache-learned-sink")
    learned, first = (decode_array(b["y"]).astype(float) for b in bars)
    m = _model("random:sinks")
    tr = m.trace(text)
    want_learned = [float(tr[tn.attn("decoder", i, "self_attn", "sink")].double().mean()) for i in range(4)]
    want_first = [float(tr[tn.attn("decoder", i, "self_attn", "weights")][..., :2].double().sum(-1).mean())
                  for i in range(4)]
    np.testing.assert_allclose(learned, want_learned, atol=1e-6)
    np.testing.assert_allclose(first, want_first, atol=1e-5)
    verdict = [md.value for md in at.markdown if "learned sink" in md.value and md.value.startswith("Here")]
    assert len(verdict) == 1
    replaces = np.mean(want_learned) > np.mean(want_first) and 2 * sum(
        a > b for a, b in zip(want_learned, want_first)) >= 4
    assert verdict[0].startswith("Here the learned sink replaces them" if replaces
                                 else "Here the learned sink does not replace them")
    assert f"{np.mean(want_learned):.3f}" in verdict[0] and f"{np.mean(want_first):.3f}" in verdict[0]
    kept_map = _data(at, "kvcache-map")
    np.testing.assert_allclose(decode_array(_trace_named(kept_map, "sink")["z"]).astype(float)[:, 0],
                               tr[tn.attn("decoder", 0, "self_attn", "sink")][0].numpy(), atol=1e-6)


def test_kvcache_without_learned_sinks_draws_no_such_chart(app_test):
    at = app_test("kvcache", model="random:sliding", text=TEXT, budget="8", sinks="2")
    at.run()
    _no_problems(at)
    assert not [e for e in at.get("plotly_chart") if "kvcache-learned-sink" in e.proto.id]


def test_the_verdict_follows_the_numbers():
    import pandas as pd

    from viz.kvcache import figures as kf

    more = pd.DataFrame({"layer": [0, 1], "learned sink": [0.5, 0.4], "first tokens": [0.1, 0.2]})
    less = pd.DataFrame({"layer": [0, 1], "learned sink": [0.05, 0.3], "first tokens": [0.6, 0.2]})
    assert kf.learned_sink_verdict(more, 4).startswith("Here the learned sink replaces them: in 2 of 2 layers")
    assert kf.learned_sink_verdict(less, 4).startswith("Here the learned sink does not replace them")


# ------------------------------------------------------------------ the picker
def test_the_picker_lists_the_presets_and_a_seed_box_reseeds(app_test):
    at = app_test("explore", model="random:chunked", text=TEXT)
    at.run()
    _no_problems(at)
    picker = at.selectbox(key="explore.model")
    labels = {f"{n} (random weights)" for n in random_preset_names()}  # the picker shows models_label's text
    assert labels <= set(picker.options) and not [o for o in picker.options if o.startswith("random ")]
    seed = at.number_input(key="explore._seed")
    assert seed.value == 0
    seed.set_value(4).run()
    _no_problems(at)
    assert at.query_params["model"] == "random:chunked:4"
    assert any("weights of random:chunked:4 are random" in i.value for i in at.info)
    at = app_test("explore", model="toy-translate")
    at.run()
    assert not any("are random" in i.value for i in at.info)
    assert not [n for n in at.get("number_input") if n.key == "explore._seed"]


def test_a_bad_preset_in_the_url_is_refused_with_the_reason(app_test):
    at = app_test("explore", model="random:bogus")
    at.run()
    assert_no_exception(at)
    said = " ".join(w.value for w in at.warning)
    assert "the random model's presets are sinks, chunked, nope, sliding, moe" in said
    assert at.query_params["model"] == "toy-translate"
    at = app_test("explore", model="random:sinks:-1](http://127.0.0.1:9/x.png)")
    at.run()
    assert_no_exception(at)
    assert at.query_params["model"] == "toy-translate"
    said = [re.sub(r"`[^`]*`", "", w.value) for w in at.warning]  # outside the quote of the URL's value
    assert said and not [w for w in said if "](" in w or "http" in w], said


def test_sink_column_refuses_a_wrong_length():
    from viz.figures.heatmaps import add_sink_column, attention_heatmap

    fig = attention_heatmap(np.full((3, 3), 1 / 3), ["a", "b", "c"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="the sink has 2 values, the map 3 rows"):
        add_sink_column(fig, np.zeros(2))
    json.dumps(add_sink_column(fig, np.zeros(3)).to_plotly_json(), default=str)
