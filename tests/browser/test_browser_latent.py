"""DeepSeek's attentions in a real browser (Chromium), with nothing downloaded: Inside on
random:mla draws the latent compression step by step (the latent's numbers in the page are the
core's), and Explore on random:dsa outlines the keys the indexer kept beside the dense map it
replaced. Screenshots are written for a person to look at."""

import urllib.parse

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from core import trace_names as tn

pytestmark = [pytest.mark.browser]

TEXT = "the small dog sees the cat and the old man sleeps near the river"


def _open(page, server, path, **params):
    page.goto(f"{server.url}/{path}?" + urllib.parse.urlencode({"text": TEXT, "attn": "decoder.self_attn", **params}))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)


def _shot(page, key, name):
    page.locator(f".st-key-{key}").scroll_into_view_if_needed()
    page.locator(f".st-key-{key}").screenshot(path=str(SCREENSHOTS / name))


def test_inside_draws_the_latent_step(server, page):
    _open(page, server, "inside", model="random:mla", layer="1", head="2")
    fig = chart_data(page, "inside-latent-latent-fig")
    tr = core.load_model("random:mla", device="cpu").trace(TEXT)
    np.testing.assert_allclose(np.array(fig["data"][0]["z"], dtype=float),
                               tr[tn.attn("decoder", 1, "self_attn", "latent")].numpy(), atol=1e-5)
    assert page.get_by_text("✗ FAILED").count() == 0
    assert page.get_by_text("c_KV = RMSNorm(X W_DKV)").count() >= 1
    _shot(page, "inside-latent-latent-fig", "latent-mla-step.png")
    page.screenshot(path=str(SCREENSHOTS / "latent-mla-inside.png"), full_page=True)


def test_explore_outlines_the_sparse_selection(server, page):
    _open(page, server, "explore", model="random:dsa", layer="2", head="1")
    fig = chart_data(page, "explore-heatmap")
    box = next(t for t in fig["data"] if t.get("name") == "selected")
    xs, ys = list(fig["data"][0]["x"]), list(fig["data"][0]["y"])
    bx, by = (np.array([np.nan if v is None else v for v in box[a]], dtype=float) for a in ("x", "y"))
    got = {(int(np.argmin(np.abs(np.array(ys, dtype=float) - by[i:i + 4].mean()))),
            int(np.argmin(np.abs(np.array(xs, dtype=float) - bx[i:i + 4].mean())))) for i in range(0, len(bx), 6)}
    assert len(got) == len(bx) // 6  # one square per cell
    tr = core.load_model("random:dsa", device="cpu").trace(TEXT)
    sel = tr[tn.attn("decoder", 2, "self_attn", "selected")].numpy()
    assert got == set(zip(*np.nonzero(sel)))
    dense = chart_data(page, "explore-dense-map")
    assert next(t for t in dense["data"] if t.get("name") == "selected")
    assert "top-4 keys" in fig["layout"]["title"]["text"]
    _shot(page, "explore-heatmap", "latent-dsa-map.png")
    _shot(page, "explore-dense-map", "latent-dsa-dense.png")
    _shot(page, "explore-outside", "latent-dsa-outside.png")
