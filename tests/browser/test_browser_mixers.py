"""Token mixers in a real browser (Chromium): the gated_delta preset's map on Explore as plotly
holds it in the page (signed, centred on zero, nothing above the diagonal, equal to the core's
implicit attention), its recurrence on Inside a head (every check green, the state at the chosen
step), and the short_conv preset's filter. Screenshots go to test-artifacts/screenshots/."""

import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from core import trace_names as tn

pytestmark = [pytest.mark.browser]

TEXT = "the small dog sees the cat and the old man sleeps"


def _z(trace_dict) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in trace_dict["z"]], dtype=float)


def _open(page, server, path: str, **params):
    page.goto(f"{server.url}/{path}?" + urllib.parse.urlencode({**params, "text": TEXT}))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)


def _click_every_svg(page, at_least: int) -> None:
    """Click every chart's SVG download on the page (keys `<chart key>-svg`): each must arrive."""
    buttons = page.locator("div[class*='st-key-'][class*='-svg'] button:visible")
    n = buttons.count()
    assert n >= at_least, f"{n} SVG downloads on the page, expected {at_least} or more"
    for i in range(n):
        with page.expect_download(timeout=120_000) as svg:
            buttons.nth(i).click()
        assert svg.value.suggested_filename.endswith(".svg") and svg.value.failure() is None
        assert Path(svg.value.path()).read_bytes().lstrip().startswith((b"<svg", b"<?xml"))


def test_explore_draws_the_gated_delta_map_signed(server, page):
    _open(page, server, "explore", model="random:gated_delta", attn="decoder.mixer", layer="1", head="2")
    fig = chart_data(page, "explore-mixer-map")
    z = _z(fig["data"][0])
    want = core.load_model("random:gated_delta", device="cpu").trace(TEXT)[tn.mixer("decoder", 1, "weights")][2]
    np.testing.assert_allclose(z, want.numpy(), atol=1e-6)
    assert (z < 0).any() and (z > 0).any()  # signed: the delta rule subtracts
    assert np.all(np.triu(z, 1) == 0)  # nothing above the diagonal
    assert fig["data"][0]["zmid"] == 0
    page.locator(".st-key-explore-mixer-map").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "mixers-explore-gated-delta.png"), full_page=True)
    page.locator(".st-key-explore-mixer-map").screenshot(path=str(SCREENSHOTS / "mixers-explore-gated-delta-map.png"))
    # the charts' SVGs (the kinds strip, the map), then the popover's CSV (the signed map, every
    # cell), the layer's tensors and the whole trace
    _click_every_svg(page, at_least=2)
    page.locator(".st-key-explore-mixer-dl-pop button").first.click()
    with page.expect_download(timeout=60_000) as csv:
        page.locator(".st-key-explore-mixer-dl-csv button").first.click()
    assert csv.value.suggested_filename.endswith("-decoder-mixer-layer1-head2-map.csv")
    frame = pd.read_csv(csv.value.path(), index_col=0)
    np.testing.assert_allclose(frame.to_numpy(), want.numpy(), atol=1e-6)
    for key, name in (("explore-mixer-dl-layer", "layer1-all-heads.npz"), ("explore-mixer-dl-npz", "whole-trace-all-layers.npz")):
        with page.expect_download(timeout=120_000) as dl:
            page.locator(f".st-key-{key} button").first.click()
        assert dl.value.suggested_filename.endswith(name) and dl.value.failure() is None
        with np.load(dl.value.path(), allow_pickle=False) as z:
            got = z[tn.mixer("decoder", 1, "weights")]
        np.testing.assert_allclose(got[2], want.numpy(), atol=1e-6)


def test_inside_steps_through_the_recurrence(server, page):
    _open(page, server, "inside", model="random:gated_delta", attn="decoder.mixer", layer="1", head="3")
    state = chart_data(page, "inside-mixer-state")
    gates = chart_data(page, "inside-mixer-gates")
    beside = chart_data(page, "inside-mixer-beside")
    assert np.array(_z(state["data"][0])).shape == (16, 16)
    tr = core.load_model("random:gated_delta", device="cpu").trace(TEXT)
    np.testing.assert_allclose(gates["data"][0]["y"], np.exp(tr[tn.mixer("decoder", 1, "decay")][3].numpy()),
                               atol=1e-6)
    soft = _z(beside["data"][1])
    np.testing.assert_allclose(np.nansum(soft, 1), 1.0, atol=1e-6)  # the softmax beside it: rows of 1
    assert page.get_by_text("failed on this view").count() == 0
    assert page.get_by_text("o_t = S_tᵀ q_t, the state stepped in numpy").count() >= 1
    page.screenshot(path=str(SCREENSHOTS / "mixers-inside-gated-delta.png"), full_page=True)
    _click_every_svg(page, at_least=3)


def test_explore_shows_the_short_convolutions_filter(server, page):
    _open(page, server, "explore", model="random:short_conv", attn="decoder.mixer", layer="0")
    fig = chart_data(page, "explore-filter")
    z = _z(fig["data"][0])
    want = core.load_model("random:short_conv", device="cpu").trace(TEXT)[tn.mixer("decoder", 0, "filter")]
    np.testing.assert_allclose(z, want.numpy(), atol=1e-6)
    assert page.get_by_text("A short convolution has no head map").count() >= 1
    page.locator(".st-key-explore-filter").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "mixers-explore-short-conv.png"), full_page=True)
    _click_every_svg(page, at_least=2)


def test_inside_steps_through_kimi_delta_attention(server, page):
    """The kda preset (Kimi Linear): Inside a head's recurrence with a decay per key channel, its
    gates as plotly holds them equal to the trace's decay, every check green."""
    _open(page, server, "inside", model="random:kda", attn="decoder.mixer", layer="1", head="1")
    gates = chart_data(page, "inside-mixer-gates")
    tr = core.load_model("random:kda", device="cpu").trace(TEXT)
    decay = np.exp(tr[tn.mixer("decoder", 1, "decay")][1].numpy())  # n x d_k: a decay per key channel
    assert decay.ndim == 2 and decay.std(1).max() > 0  # the channels differ
    curves = {d["name"]: np.array(d["y"], dtype=float) for d in gates["data"]}
    np.testing.assert_allclose(curves["decay exp(g_t), mean over the key channels"], decay.mean(1), atol=1e-6)
    np.testing.assert_allclose(curves["fastest channel"], decay.min(1), atol=1e-6)
    assert page.get_by_text("failed on this view").count() == 0
    assert page.get_by_text("the decay per key channel").count() >= 1
    page.screenshot(path=str(SCREENSHOTS / "mixers-inside-kimi-delta.png"), full_page=True)
    _click_every_svg(page, at_least=3)
