"""The random model's presets in a real browser (Chromium), with nothing downloaded: Explore on
random:sinks draws each row's learned sink as a column of its own, and on random:chunked
shades the chunked mask; the numbers plotly holds in the page are the core's, and screenshots
are written for a person to look at."""

import urllib.parse

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from core import trace_names as tn

pytestmark = [pytest.mark.browser]

TEXT = "the small dog sees the cat and the old man sleeps near the river"


def _grid(values):
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)


def _open(page, server, **params):
    page.goto(f"{server.url}/explore?" + urllib.parse.urlencode({"text": TEXT, "attn": "decoder.self_attn", **params}))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)


def test_sinks_preset_draws_the_sink_column(server, page):
    _open(page, server, model="random:sinks:3", layer="2", head="1")
    assert page.get_by_text("are random").count() >= 1  # the page says the weights are random
    fig = chart_data(page, "explore-heatmap")
    sink = next(t for t in fig["data"] if t.get("name") == "sink")
    keys = _grid(fig["data"][0]["z"])
    col = _grid(sink["z"])[:, 0]
    tr = core.load_model("random:sinks:3", device="cpu").trace(TEXT)
    np.testing.assert_allclose(col, tr[tn.attn("decoder", 2, "self_attn", "sink")][1].numpy(), atol=1e-5)
    np.testing.assert_allclose(keys.sum(1) + col, 1.0, atol=1e-4)
    assert fig["layout"]["xaxis"]["ticktext"][-1] == "sink"
    page.locator(".st-key-explore-heatmap").scroll_into_view_if_needed()
    page.locator(".st-key-explore-heatmap").screenshot(path=str(SCREENSHOTS / "preset-sinks-map.png"))
    page.screenshot(path=str(SCREENSHOTS / "preset-sinks.png"), full_page=True)


def test_chunked_preset_shades_the_chunked_mask(server, page):
    _open(page, server, model="random:chunked", layer="1", head="0", shade="1")
    fig = chart_data(page, "explore-heatmap")
    shade = next(t for t in fig["data"] if t.get("name") == "mask")
    shown = ~np.isnan(_grid(shade["z"]))
    n = shown.shape[0]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    np.testing.assert_array_equal(shown, (j > i) | (i // 5 != j // 5))
    assert "chunked 5" in fig["layout"]["title"]["text"]
    page.locator(".st-key-explore-heatmap").scroll_into_view_if_needed()
    page.locator(".st-key-explore-heatmap").screenshot(path=str(SCREENSHOTS / "preset-chunked-map.png"))
    page.screenshot(path=str(SCREENSHOTS / "preset-chunked.png"), full_page=True)


def test_model_view_names_the_masks_and_draws_the_sinks(server, page):
    _open(page, server, model="random:sinks", tab="model")
    fig = chart_data(page, "explore-grid")
    assert fig["layout"]["yaxis"]["ticktext"][0] == "L0 · sliding 4 · RoPE · learned sink"
    assert "head 0 · sink" in fig["data"][0]["x"]
    page.locator(".st-key-explore-grid").scroll_into_view_if_needed()
    page.locator(".st-key-explore-grid").screenshot(path=str(SCREENSHOTS / "preset-sinks-model-view.png"))


def test_nope_layer_beside_a_rope_layer(server, page):
    _open(page, server, model="random:nope", layer="0", head="2", beside="3")
    fig = chart_data(page, "explore-beside-map")
    assert "causal · NoPE" in fig["layout"]["title"]["text"]
    tr = core.load_model("random:nope", device="cpu").trace(TEXT)
    np.testing.assert_allclose(_grid(fig["data"][0]["z"]), tr[tn.attn("decoder", 3, "self_attn", "weights")][2].numpy(),
                               atol=1e-5)
    page.locator(".st-key-explore-beside-map").scroll_into_view_if_needed()
    page.locator(".st-key-explore-beside-map").screenshot(path=str(SCREENSHOTS / "preset-nope-beside.png"))


def test_positions_and_kvcache_on_presets(server, page):
    page.goto(f"{server.url}/positions?model=random:nope&text=" + urllib.parse.quote(TEXT))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    bar = chart_data(page, "positions-layers")["data"][0]
    assert bar["customdata"] == ["RoPE", "RoPE", "RoPE", "NoPE"]
    page.locator(".st-key-positions-layers").scroll_into_view_if_needed()
    page.locator(".st-key-positions-layers").screenshot(path=str(SCREENSHOTS / "preset-nope-positions.png"))
    page.goto(f"{server.url}/kvcache?model=random:sinks&budget=8&sinks=2&text=" + urllib.parse.quote(" ".join([TEXT] * 3)))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    bars = chart_data(page, "kvcache-learned-sink")["data"]
    assert [b["name"].split(" ")[0] for b in bars] == ["learned", "first"] and len(bars[0]["y"]) == 4
    assert page.get_by_text("Here the learned sink").count() == 1
    page.locator(".st-key-kvcache-learned-sink").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "preset-sinks-kvcache.png"), full_page=True)
    page.locator(".st-key-kvcache-learned-sink").screenshot(path=str(SCREENSHOTS / "preset-sinks-kvcache-chart.png"))
