""""Why here?" in a real browser: a click on a cell of a smollm2 head's map on Explore opens
the cell's score taken apart, and the five terms the page words first are the API's."""

import urllib.parse

import pytest

import core
import core.analysis as ca
from browser_utils import SCREENSHOTS, no_exception, wait_idle
from viz.figures import why as wf

pytestmark = pytest.mark.browser

TEXT = "When Mary and John went to the store, John gave a drink to"
LAYER, HEAD, QUERY, KEY = 5, 2, 12, 3


def _click_cell(page, key, row, col):
    """Click the click target of cell (row, col) (viz.figures.why.add_cell_targets) in chart `key`."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=60_000)
    page.locator(sel).scroll_into_view_if_needed()
    xy = page.eval_on_selector(sel, """(e, [row, col]) => {
        const t = e.data.find(d => d.name === 'cells'), fl = e._fullLayout;
        const cd = Array.from(t.customdata, r => Array.from(r));
        const i = cd.findIndex(c => c[0] === row && c[1] === col);
        const box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + fl.xaxis.d2p(t.x[i]), box.top + fl.yaxis.d2p(t.y[i]), t.y[i], fl.yaxis.type]; }""",
                               [row, col])
    page.mouse.move(xy[0], xy[1])
    page.mouse.click(xy[0], xy[1])
    return xy


def test_a_click_on_a_cell_opens_the_apis_terms(server, page):
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's weight package is not installed")
    q = urllib.parse.urlencode({"model": "smollm2", "text": TEXT, "attn": "decoder.self_attn", "layer": LAYER,
                                "head": HEAD})
    page.goto(f"{server.url}/explore?{q}")
    wait_idle(page)
    assert no_exception(page)
    assert page.locator(".st-key-explore-why").count() == 0  # nothing open before the click
    where = _click_cell(page, "explore-heatmap", QUERY, KEY)
    page.wait_for_selector(".st-key-explore-why", timeout=90_000)
    wait_idle(page)
    assert no_exception(page)
    url = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert url["why"] == [f"{QUERY},{KEY}"], where
    panel = page.locator(".st-key-explore-why")
    items = [t.strip() for t in panel.locator("ol").first.locator("li").all_inner_texts()]
    model = core.load_model("smollm2", device="cpu")
    tr = model.trace(TEXT)
    df = ca.score_attribution(tr, "decoder", LAYER, HEAD, QUERY, KEY, group="layer")
    toks = tr.tokens("target")
    assert items[:5] == wf.term_sentences(df, toks[QUERY], toks[KEY], 5)
    assert "The terms add up to the model's own score" in panel.inner_text()
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "why-here.png"), full_page=True)
    panel.screenshot(path=str(SCREENSHOTS / "why-here-panel.png"))


def test_the_heads_page_shows_a_heads_pattern_attribution(server, page):
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's weight package is not installed")
    q = urllib.parse.urlencode({"model": "smollm2", "text": "the small dog sees the cat", "pa": "3,2"})
    page.goto(f"{server.url}/heads?{q}")
    wait_idle(page)
    assert no_exception(page)
    section = page.locator(".st-key-heads-pa-terms")
    section.wait_for(timeout=90_000)
    section.scroll_into_view_if_needed()
    assert "The terms add up to the model's own attention-weighted score" in page.inner_text("body")
    page.screenshot(path=str(SCREENSHOTS / "heads-pattern-attribution.png"), full_page=False)
