"""The Lens page in a real browser: a click on a head's cell of the attribution map opens that
head in Explore."""

import urllib.parse

import pytest

from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = pytest.mark.browser

IOI = "When Mary and John went to the store, John gave a drink to"


def test_attribution_cell_opens_the_head_in_explore(server, page):
    page.goto(f"{server.url}/lens?model=smollm2&target=%20Mary&baseline=%20John&text=" + urllib.parse.quote(IOI))
    wait_idle(page)
    assert no_exception(page)
    sel = '.st-key-lens-attribution[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=90_000)
    page.locator(sel).scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "lens.png"), full_page=True)
    fig = chart_data(page, "lens-attribution")
    cd = fig["data"][1]["customdata"]
    layer, head = 23, 3
    assert any(int(c[0]) == layer and int(c[1]) == head for c in cd)
    xy = page.eval_on_selector(sel, """(e, [layer, head]) => {
        const t = e.data[1], fl = e._fullLayout;
        const cd = Array.from(t.customdata, r => Array.from(r));
        const i = cd.findIndex(c => c[0] === layer && c[1] === head);
        const box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + fl.xaxis.d2p(t.x[i]), box.top + fl.yaxis.d2p(t.y[i])]; }""", [layer, head])
    page.mouse.move(xy[0] + 1, xy[1] + 1)
    page.mouse.click(xy[0] + 1, xy[1] + 1)
    page.wait_for_url("**/explore?**", timeout=60_000)
    wait_idle(page)
    assert no_exception(page)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert q["layer"] == [str(layer)] and q["head"] == [str(head)] and q["attn"] == ["decoder.self_attn"]
    assert q["model"] == ["smollm2"] and q["text"] == [IOI]
    title = chart_data(page, "explore-heatmap")["layout"]["title"]["text"]
    assert f"layer {layer}" in title and f"head {head}" in title
