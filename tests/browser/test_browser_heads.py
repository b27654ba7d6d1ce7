"""Heads in a real browser: a click on a head-score cell opens that head in Explore, and
clicks on the model view switch heads off (the URL keeps them; a reload restores them)."""

import urllib.parse

import pytest

from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = pytest.mark.browser

TEXT = "the small dog sees the cat"


def _click_target(page, key, layer, head, trace_index=1):
    """Click the click-target marker of (layer, head) in chart `key`, at its pixel centre."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=60_000)
    page.locator(sel).scroll_into_view_if_needed()
    xy = page.eval_on_selector(sel, """(e, [layer, head, k]) => {
        const t = e.data[k], fl = e._fullLayout;
        const cd = Array.from(t.customdata, r => Array.from(r));
        const i = cd.findIndex(c => c[0] === layer && c[1] === head);
        const box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + fl.xaxis.d2p(t.x[i]), box.top + fl.yaxis.d2p(t.y[i])]; }""", [layer, head, trace_index])
    page.mouse.move(xy[0] + 2, xy[1] + 2)
    page.mouse.click(xy[0] + 2, xy[1] + 2)


def test_score_cell_opens_the_head_in_explore(server, page):
    page.goto(f"{server.url}/heads?text=" + urllib.parse.quote(TEXT))
    wait_idle(page)
    assert no_exception(page)
    page.screenshot(path=str(SCREENSHOTS / "heads.png"))
    _click_target(page, "heads-induction", 2, 3)
    page.wait_for_url("**/explore?**", timeout=60_000)
    wait_idle(page)
    assert no_exception(page)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert q["layer"] == ["2"] and q["head"] == ["3"] and q["attn"] == ["encoder.self_attn"] and q["text"] == [TEXT]
    title = chart_data(page, "explore-heatmap")["layout"]["title"]["text"]
    assert "layer 2" in title and "head 3" in title


def test_model_view_clicks_switch_heads_off(server, page):
    page.goto(f"{server.url}/explore?text=" + urllib.parse.quote(TEXT))
    wait_idle(page)
    page.get_by_role("tab", name="Model view (all layers × heads)").click()
    wait_idle(page)
    page.get_by_text("More: switch heads off, patch this head, the logit lens").click()  # behind one "more"
    page.get_by_text("Clicks switch heads off", exact=True).click()
    wait_idle(page)
    _click_target(page, "explore-grid", 0, 1)
    page.wait_for_function("() => location.search.includes('ablate=encoder.0.1')", timeout=60_000)
    wait_idle(page)
    _click_target(page, "explore-grid", 1, 3)
    page.wait_for_function("() => decodeURIComponent(location.search).includes('ablate=encoder.0.1,encoder.1.3')",
                           timeout=60_000)
    wait_idle(page)
    assert no_exception(page)
    assert page.get_by_text("What changed with 2 heads switched off").count() >= 1
    marks = chart_data(page, "explore-grid")["data"][2]["customdata"]
    assert sorted((int(r[0]), int(r[1])) for r in marks) == [(0, 1), (1, 3)]
    page.screenshot(path=str(SCREENSHOTS / "explore-ablation.png"))
    page.reload()
    wait_idle(page)
    assert "ablate=encoder.0.1" in urllib.parse.unquote(page.url)
    assert page.get_by_text("What changed with 2 heads switched off").count() >= 1
