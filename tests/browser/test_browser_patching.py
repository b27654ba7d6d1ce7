"""The patching page in a real browser: the indirect-object example's head map draws, and a click
on a head's cell opens that head in Explore (screenshot of the page kept)."""

import urllib.parse

import pytest

from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from test_browser_heads import _click_target

pytestmark = pytest.mark.browser


def test_head_cell_opens_the_head_in_explore(server, page):
    page.goto(f"{server.url}/patching?model=smollm2&what=head")
    wait_idle(page, timeout=180_000)
    assert no_exception(page)
    fig = chart_data(page, "patching-map", timeout=180_000)
    assert len(fig["data"][0]["z"]) == 30 and len(fig["data"][0]["z"][0]) == 9  # layers x heads
    page.screenshot(path=str(SCREENSHOTS / "patching.png"), full_page=True)
    _click_target(page, "patching-map", 23, 3)
    page.wait_for_url("**/explore?**", timeout=60_000)
    wait_idle(page)
    assert no_exception(page)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert q["layer"] == ["23"] and q["head"] == ["3"] and q["attn"] == ["decoder.self_attn"]
    assert q["model"] == ["smollm2"] and q["text"] == ["When Mary and John went to the store, John gave a drink to"]
    title = chart_data(page, "explore-heatmap")["layout"]["title"]["text"]
    assert "layer 23" in title and "head 3" in title
