"""The corpus page in a real browser: the scatter of the bundled corpus is drawn, hovering a
point names its token in its sentence, and a click opens that sentence in Explore."""

import re
import urllib.parse

import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from core.cli.corpus_data import load as load_bundled

pytestmark = pytest.mark.browser


VIEWPORT = (1400, 1600)  # the page fixture's (conftest.py)


SEL = '.st-key-corpus-scatter[data-stale="false"] .js-plotly-plot'


def test_scatter_hover_and_click_opens_explore(server, page):
    page.goto(f"{server.url}/corpus?model=toy-translate&layer=2&head=1&projection=pca")
    wait_idle(page, timeout=180_000)
    fig = chart_data(page, "corpus-scatter", timeout=180_000)
    assert [t["type"] for t in fig["data"]] == ["scatter", "scatter"]  # the first view: up to SVG_MAX_POINTS, SVG
    assert len(fig["data"][0]["x"]) > 1000 and len(fig["data"][0]["x"]) == len(fig["data"][1]["x"])
    assert no_exception(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "corpus.png"))

    # the query point farthest from any other point, so that hover and click find it alone
    import numpy as np
    from scipy.spatial import cKDTree

    qs, ks = fig["data"]
    pts = np.array([qs["x"] + ks["x"], qs["y"] + ks["y"]], dtype=float).T
    dist, _ = cKDTree(pts).query(pts[: len(qs["x"])], k=2)
    i = int(dist[:, 1].argmax())
    want_sid, want_pos = (int(v) for v in qs["customdata"][i][:2])
    point = [qs["x"][i], qs["y"][i]]
    xy = page.eval_on_selector(SEL, """(e, [x, y]) => {
        const fl = e._fullLayout, box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + fl.xaxis.d2p(x), box.top + fl.yaxis.d2p(y)]; }""", point)
    page.mouse.move(xy[0] + 1, xy[1] + 1)
    page.mouse.move(xy[0], xy[1])
    label = page.locator(f"{SEL} .hoverlayer .hovertext").first
    label.wait_for(timeout=20_000)
    hover = label.text_content()
    m = re.search(r"sentence (\d+) · position (\d+)", hover)
    assert m, hover
    sid, pos = int(m.group(1)), int(m.group(2))
    sentence = load_bundled()[sid]
    tokens = core.load_model("toy-translate", device="cpu").encode(sentence).tokens
    assert (sid, pos) == (want_sid, want_pos) and hover.startswith("query")
    assert f"[{tokens[pos]}]" in hover  # the hovered token, marked in its sentence

    page.mouse.click(xy[0], xy[1])
    page.wait_for_url("**/explore**", timeout=60_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    params = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert params["text"] == [sentence] and params["layer"] == ["2"] and params["head"] == ["1"]
    assert page.get_by_label("Sentence (press Ctrl+Enter)", exact=True).input_value() == sentence
    enlarged = chart_data(page, "explore-heatmap")
    assert "layer 2" in enlarged["layout"]["title"]["text"] and "head 1" in enlarged["layout"]["title"]["text"]
