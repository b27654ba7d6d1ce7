"""Explore's long-document views through the real page (AppTest): what each chart draws equals
what core computes on the same trace by another path (the explicit re-run of the layer, or
core.head_maps on a trace of our own). The long-input path is taken on short inputs by
lowering core.head_maps.LONG_LAYER_BYTES, so these tests cost seconds; the long lengths
themselves are in tests/core/test_head_maps.py (memory), tests/parity/test_smollm2.py (8,000 tokens) and
tests/browser/test_browser_longdoc.py."""

import numpy as np
import pytest
import torch

import core.head_maps as hm
from conftest import assert_no_exception, chart_by_key, decode_array, figure, heatmap_z
from viz.figures import long_maps as lm

TEXT = ("The river bank was steep. Children played near the water! Their parents watched from the bridge. "
        "Was the current strong? Nobody knew.\n\nA second paragraph starts here. It has two sentences.")


def _long(monkeypatch):
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)  # every input takes the long-input path


def _z(at, key):
    return np.array(heatmap_z(chart_by_key(at, key)), dtype=float)


def test_spans_and_profiles_draw_what_core_computes(app_test, minilm, monkeypatch):
    _long(monkeypatch)
    at = app_test("explore", model="minilm", text=TEXT, tab="long", layer="2", head="5")
    at.run()
    assert_no_exception(at)
    tr = minilm.trace(TEXT)
    name = "encoder.2.self_attn.weights"
    full = tr.recomputed(name)[5].double()  # the explicit re-run of the whole layer
    span_of, ranges, labels = lm.split_spans(TEXT, tr.meta["offsets"], "sentences")
    assert len(ranges) == 7, labels  # five sentences, then two after the blank line
    edges = lm.span_token_ranges(span_of)
    ref = np.array([[full[a:b, c:d].sum(1).mean().item() for c, d in edges] for a, b in edges])
    np.testing.assert_allclose(_z(at, "explore-spans"), ref, atol=1e-6)
    # head profiles: every layer x head, against the full maps of each layer (the tab's own tabs are lazy:
    # only the open one runs and is drawn)
    assert not [c for c in at.get("plotly_chart") if "profiles" in str(c.proto.id)]
    at.session_state["explore.section"] = "Head profiles"
    at.run()
    assert_no_exception(at)
    assert at.query_params["section"] == "profiles"  # a shared link opens this section
    fig = figure(chart_by_key(at, "explore-profiles"))
    dist, first, local = (np.array(decode_array(fig["data"][k]["z"]), dtype=float) for k in range(3))
    assert dist.shape == (6, 12)
    for layer in (0, 5):
        w = tr.recomputed(f"encoder.{layer}.self_attn.weights").double()
        n = w.shape[-1]
        d = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
        np.testing.assert_allclose(dist[layer], (w * d).sum(-1).mean(-1).numpy(), atol=1e-5)
        np.testing.assert_allclose(first[layer], w[:, :, 0].mean(-1).numpy(), atol=1e-6)
        np.testing.assert_allclose(local[layer], (w * (d < 64)).sum(-1).mean(-1).numpy(), atol=1e-6)
    # a box over one cell (as the chart's box selection writes it) zooms to those two spans' tokens
    at.session_state["explore.section"] = "Spans"
    at.session_state["explore.span_cell"] = (3, 3, 1, 1)
    at.run()
    assert_no_exception(at)
    (a, b), (c, d) = edges[3], edges[1]
    np.testing.assert_allclose(_z(at, "explore-span-zoom"), full[a:b, c:d].numpy(), atol=1e-6)
    # a box over sentences 2-3 x 0-1 (what a drag writes) zooms to all their tokens
    at.session_state["explore.span_cell"] = (2, 3, 0, 1)
    at.run()
    assert_no_exception(at)
    (a, _), (_, b), (c, _), (_, d) = edges[2], edges[3], edges[0], edges[1]
    np.testing.assert_allclose(_z(at, "explore-span-zoom"), full[a:b, c:d].numpy(), atol=1e-6)
    # the text shaded by what the chosen sentence gives each sentence: the tooltips carry its row
    at.selectbox(key=f"explore.span_from.sentences.{len(ranges)}").set_value(3).run()
    shaded = next(d.value for d in at.dataframe if "mass from the chosen span" in d.value.columns)
    np.testing.assert_allclose(shaded["mass from the chosen span"].to_numpy(), ref[3], atol=1e-6)
    assert list(shaded["text"])[3].startswith("Was the current strong?")
    at.session_state["explore.section"] = "Surprisal"
    at.run()
    assert "decoder" in " ".join(i.value for i in at.info)  # surprisal asks for a decoder


def test_paragraphs_are_the_users_blank_lines():
    span_of, ranges, labels = lm.split_spans(TEXT, [(i, i + 1) for i in range(len(TEXT))], "paragraphs")
    assert len(ranges) == 2 and TEXT[ranges[1][0]:].startswith("A second paragraph")
    assert span_of == sorted(span_of)


def test_long_heatmap_overview_zoom_and_surprisal_on_a_decoder(app_test, smollm2, monkeypatch):
    _long(monkeypatch)
    text = " ".join([TEXT] * 4)
    at = app_test("explore", model="smollm2", text=text, layer="7", head="2")
    at.run()
    assert_no_exception(at)
    tr = smollm2.trace(text)
    n = len(tr.tokens("target"))
    name = "decoder.7.self_attn.weights"
    full = tr.recomputed(name)[2].double()
    size = -(-n // 128)
    over = _z(at, "explore-heatmap")  # the overview: block means, keys summed within a block
    ref = hm.pool_full(full, size).double().numpy() * np.array([min(size, n - b * size) for b in range(-(-n // size))])
    np.testing.assert_allclose(over, ref, atol=1e-5)
    np.testing.assert_allclose(over.sum(1), 1.0, atol=1e-4)
    at.session_state["explore.zoom"] = (3, 3, 1, 1)  # what a box over block (3, 1) alone writes
    at.run()
    assert_no_exception(at)
    np.testing.assert_allclose(_z(at, "explore-zoom"), full[3 * size:4 * size, size:2 * size].numpy(), atol=1e-6)
    shape = figure(chart_by_key(at, "explore-heatmap"))["layout"]["shapes"][0]  # the open box, outlined
    assert (shape["x0"], shape["x1"], shape["y0"], shape["y1"]) == (0.5, 1.5, 2.5, 3.5)
    at.session_state["explore.zoom"] = (2, 5, 0, 3)  # a box over query blocks 2-5 x key blocks 0-3
    at.run()
    assert_no_exception(at)
    np.testing.assert_allclose(_z(at, "explore-zoom"), full[2 * size:min(n, 6 * size), 0:4 * size].numpy(), atol=1e-6)
    assert not [c for c in at.caption if "its first" in c.value]
    from viz.ui import longdoc
    monkeypatch.setattr(longdoc, "ZOOM_TOKENS", 5)  # the same box, past the zoom's limit: cut, and said so
    at.run()
    assert_no_exception(at)
    np.testing.assert_allclose(_z(at, "explore-zoom"), full[2 * size:2 * size + 5, 0:5].numpy(), atol=1e-6)
    assert [c for c in at.caption if "more than 5 tokens a side: its first 5 are drawn" in c.value]
    monkeypatch.setattr(longdoc, "ZOOM_TOKENS", 400)
    # surprisal of every token, against log-softmax of the trace's logits
    at.query_params["tab"] = "long"
    at2 = app_test("explore", model="smollm2", text=text, layer="7", head="2", tab="long", section="surprisal")
    at2.run()
    assert_no_exception(at2)
    fig = figure(chart_by_key(at2, "explore-surprisal"))
    got = np.array(decode_array(fig["data"][0]["z"]), dtype=float).ravel()[:n]
    lp = torch.log_softmax(tr["logits"].double(), -1)
    ids = tr.meta["target_ids"]
    ref = [np.nan] + [-lp[t - 1, ids[t]].item() / np.log(2) for t in range(1, n)]
    np.testing.assert_allclose(got, ref, atol=1e-5)  # the first token has no prediction: NaN


def test_a_long_input_is_announced_with_its_expected_time(app_test, smollm2, monkeypatch):
    """Before a long trace the page says how long it will take (tokens x the measured cost per
    token) and draws a progress bar; the same input, cached, is not announced again."""
    from viz.ui import longdoc

    monkeypatch.setattr(longdoc, "WARN_SECONDS", 0.0)
    monkeypatch.setitem(longdoc._COST, "smollm2", (100, 0.5))  # 5 ms per token, as if measured
    text = " ".join(["The cat sat on the mat and looked at the dog."] * 100)  # ~1,200 tokens
    at = app_test("explore", model="smollm2", text=text, tab="long")
    at.run()
    assert_no_exception(at)
    # the warning is gone once the run ended (issue 41): a caption says what the pass took against the estimate
    assert "tokens long" not in " ".join(w.value for w in at.warning)
    said = " ".join(c.value for c in at.caption)
    n = len(smollm2.tokenizer.encode(text).ids)
    assert f"This input is {n:,} tokens long: the traced pass took" in said and "5.0 ms per token" in said, said
    expected = longdoc.expected_seconds(smollm2, n, (100, 0.5))  # in proportion to the FLOPs at each length
    assert f"expected about {longdoc._human(expected)}" in said, said
    at.run()
    assert "tokens long" not in " ".join(w.value for w in at.warning)


def test_span_map_on_a_log_scale_keeps_the_mass_in_its_hover():
    mass = np.array([[1.0, 0.0], [0.9, 0.1]])
    fig = lm.span_figure(mass, ["a", "b"], log_scale=True)
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), np.log10(np.maximum(mass, 1e-5)))
    np.testing.assert_allclose(np.array(fig.data[0].customdata)[..., 2].astype(float), mass)
    assert len(fig.data) == 1 and fig.layout.dragmode == "select"  # no click targets: a box picks spans


def test_a_box_dragged_over_the_span_map_names_every_cell_it_touches():
    # cell k covers [k - 0.5, k + 0.5): a drag inside one cell is that cell
    assert lm.box_cells({"box": [{"x": [1.6, 2.2], "y": [3.2, 3.4]}]}, 10) == (3, 3, 2, 2)
    assert lm.box_cells({"box": [{"x": [2.2, 0.6], "y": [4.6, 2.4]}]}, 10) == (2, 5, 1, 2)  # any drag direction
    assert lm.box_cells({"box": [{"x": [-3, 40], "y": [8.7, 12]}]}, 10) == (9, 9, 0, 9)  # clamped to the map
    assert lm.box_cells({"box": []}, 10) is None and lm.box_cells({}, 10) is None
    # the overview's box: the boxed blocks' tokens, the last block cut at n, each side at most `most` tokens
    assert lm.zoom_rows((2, 5, 0, 3), 63, 300) == ((126, 300), (0, 252))
    assert lm.zoom_rows((2, 5, 0, 3), 63, 300, most=100) == ((126, 226), (0, 100))
    assert lm.zoom_rows((4, 4, 4, 4), 63, 300) == ((252, 300), (252, 300))


def test_the_time_warnings_cost_model_counts_what_torch_counts(smollm2):
    """flops(): 2 x parameters per token plus causal attention. The linear part against torch's own
    FLOP counter on a real forward (where attention is a few per cent at 64 tokens); the estimate
    passes through its measured point and grows with the FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    from viz.ui import longdoc

    n = 64
    ids = torch.arange(10, 10 + n)[None]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        smollm2.net.project(smollm2.net.decode(ids))  # the traced pass projects every position to logits
    counted = counter.get_total_flops()
    ours = longdoc.flops(smollm2, n)
    attention = ours - n * 2.0 * sum(p.numel() for p in smollm2.net.parameters())
    assert 0 < attention < 0.05 * ours
    assert abs(ours - counted) / counted < 0.05, (ours, counted)
    cost = (512, 2.0, 1e-11)
    assert longdoc.expected_seconds(smollm2, 512, cost) == pytest.approx(2.0)
    assert longdoc.expected_seconds(smollm2, 8000, cost) > longdoc.expected_seconds(smollm2, 4000, cost) * 2
    assert longdoc.expected_seconds(smollm2, 1024, (512, 2.0)) == pytest.approx(
        2.0 * longdoc.flops(smollm2, 1024) / longdoc.flops(smollm2, 512))
