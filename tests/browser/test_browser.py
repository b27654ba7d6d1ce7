"""The app in a real browser: headless Debian Chromium driven by Playwright against a
running server. Screenshots of every page go to test-artifacts/screenshots/; `make screenshots`
takes them again into docs/screenshots/ (the README shows them)."""

import json
import os
import time
import urllib.parse

import pytest

import core
from browser_utils import ROOT, SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = pytest.mark.browser

PAGES = ["explore", "inside", "positions", "decoder", "compare", "playground"]


def _ticktext(fig, axis="xaxis"):
    return list(fig["layout"][axis]["ticktext"])


def test_type_sentence_updates_heatmap(server, page):
    page.goto(f"{server.url}/explore")
    wait_idle(page)
    before = _ticktext(chart_data(page, "explore-heatmap"))
    box = page.get_by_label("Sentence (press Ctrl+Enter)", exact=True)
    box.fill("the happy farmer finds the green book")
    box.press("Control+Enter")
    page.wait_for_function(
        """() => { const e = document.querySelector('.st-key-explore-heatmap[data-stale="false"] .js-plotly-plot');
                   return e && e.layout.xaxis.ticktext.includes('farmer'); }""", timeout=60_000)
    wait_idle(page)
    fig = chart_data(page, "explore-heatmap")
    assert _ticktext(fig) == "the happy farmer finds the green book".split() != before
    # the drawn numbers are the core's numbers for the same input
    import numpy as np

    model = core.load_model("toy-translate", device="cpu")
    expected = model.trace("the happy farmer finds the green book")["encoder.0.self_attn.weights"][0].numpy()
    z = np.array(fig["data"][0]["z"], dtype=float)
    assert np.abs(z - expected).max() < 1e-5
    assert no_exception(page)
    assert "text=the+happy+farmer" in page.url or "text=the%20happy%20farmer" in page.url


def test_nothing_leaves_the_machine(server, page):
    """The page fixture fails a test whose page asks another host (the favicon was once a
    ":material/...:" icon, which the browser fetched from fonts.gstatic.com on every load). Here
    the watch itself is seen to catch such a request, and the home page to make none."""
    page.goto(f"{server.url}/explore")
    wait_idle(page)
    assert page.outside == []
    assert page.evaluate("() => document.querySelector('link[rel~=\"icon\"]').href").startswith("data:")
    with page.context.expect_event("request", lambda r: "fonts.gstatic.com" in r.url):
        page.evaluate("() => fetch('https://fonts.gstatic.com/x.svg', {mode: 'no-cors'}).catch(() => 0)")
    assert page.outside == ["https://fonts.gstatic.com/x.svg"]
    page.outside.clear()  # seen: the fixture's own check at teardown is for the app's requests


def test_navigation_and_screenshots(server, page):
    """Every page opens from the sidebar without an exception; its screenshot goes to
    SCREENSHOTS, under test-artifacts/ unless `make screenshots` asked for docs/screenshots."""
    if not os.environ.get("ATTENTION_LAB_SCREENSHOTS"):
        assert SCREENSHOTS == ROOT / "test-artifacts" / "screenshots"
    t0 = time.time()
    page.goto(f"{server.url}/explore?text=" + urllib.parse.quote("the small dog sees the cat"))
    wait_idle(page)
    for name in PAGES:
        link = page.locator(f'[data-testid="stSidebarNav"] a[href$="/{name}"]')
        link.first.click()
        page.wait_for_url(f"**/{name}**", timeout=30_000)
        wait_idle(page, timeout=180_000)
        assert no_exception(page), name
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
        assert (SCREENSHOTS / f"{name}.png").stat().st_mtime >= t0 - 1


def _weights(page):
    import numpy as np

    fig = chart_data(page, "decoder-weights")
    z = fig["data"][0]["z"]
    return np.array([[np.nan if v is None else v for v in row] for row in z], dtype=float)


def _check_causal(w):
    import numpy as np

    assert np.allclose(np.nansum(w, axis=1), 1.0, atol=1e-5)
    upper = np.triu(np.nan_to_num(w, nan=0.0), 1)
    assert (upper == 0).all()


def test_decoder_step_next_and_play(server, page):
    text = urllib.parse.quote("the small dog sees the cat")
    page.goto(f"{server.url}/decoder?model=toy-translate&text={text}&step=2")
    wait_idle(page)
    w = _weights(page)
    assert w.shape == (2, 2)
    _check_causal(w)
    page.locator(".st-key-decoder-btn-next button").first.click()
    page.wait_for_function(
        """() => { const e = document.querySelector('.st-key-decoder-weights[data-stale="false"] .js-plotly-plot');
                   return e && (e.data[0].z._inputArray || e.data[0].z).length === 3; }""", timeout=60_000)
    wait_idle(page)
    w = _weights(page)
    assert w.shape == (3, 3)
    _check_causal(w)
    assert "step=3" in page.url
    n_steps = len(core.load_model("toy-translate", device="cpu").steps("the small dog sees the cat"))
    page.locator(".st-key-decoder-btn-play button").first.click()
    page.wait_for_function(
        f"""() => {{ const e = document.querySelector('.st-key-decoder-weights[data-stale="false"] .js-plotly-plot');
                   return e && (e.data[0].z._inputArray || e.data[0].z).length === {n_steps}; }}""", timeout=120_000)
    wait_idle(page)
    assert _weights(page).shape == (n_steps, n_steps)
    assert f"step={n_steps}" in page.url
    assert no_exception(page)


def test_decoder_steps_in_the_browser(server, page):
    """"Step in the browser": a click on the all-steps figure's slider redraws the three maps
    for that step in the page, with no Streamlit run; the maps are the step's own (the core's
    steps for the same sentence), and the labels name only the tokens seen so far."""
    import numpy as np

    from bench.browser_bench import SLIDER_STEP_AT_JS
    from viz.decoder.steps import ZWSP
    from viz.figures.heatmaps import safe_labels

    sentence = "the small dog sees the cat"
    page.goto(f"{server.url}/decoder?model=toy-translate&step=2&text=" + urllib.parse.quote(sentence))
    wait_idle(page)
    page.locator(".st-key-decoder-in-browser label").first.click()
    chart_data(page, "decoder-steps")
    wait_idle(page)
    page.locator(".st-key-decoder-steps").scroll_into_view_if_needed()
    sent = page.evaluate("window.__al.sent")  # messages to the server so far (bench/app_server.py WATCH_JS)
    x, y = page.evaluate(SLIDER_STEP_AT_JS, 4)
    page.mouse.click(x, y)
    page.wait_for_function("""() => { const e = document.querySelector('.st-key-decoder-steps .js-plotly-plot');
        return e && e.layout.title.text.startsWith('Step 4 of'); }""", timeout=30_000)
    fig = chart_data(page, "decoder-steps")
    # drawn in the page: the click sent the server nothing (a widget sends its value as it changes,
    # before the frame that redraws), so no script run was asked for
    assert page.evaluate("window.__al.sent") == sent
    steps = core.load_model("toy-translate", device="cpu").steps(sentence)
    want = steps[3]["decoder.0.self_attn.weights"][0].numpy()
    z = np.array([[np.nan if v is None else v for v in row] for row in fig["data"][2]["z"]], dtype=float)
    np.testing.assert_allclose(z[:4, :4], want, atol=1e-4)
    assert np.isnan(z[4:]).all() and np.isnan(z[:, 4:]).all()
    keys = [k.replace(ZWSP, "") for k in fig["data"][2]["x"]]
    assert keys[:4] == safe_labels(steps[3].tokens("target")) and set(keys[4:]) == {""}
    assert no_exception(page)


def test_model_view_click_selects_a_map(server, page):
    """Clicking a map of the model view (one tiled heatmap) makes it the selected layer and
    head: the pickers, the red outline and the enlarged map follow, with the core's numbers."""
    import numpy as np

    text = "the small dog sees the cat"
    page.goto(f"{server.url}/explore?text=" + urllib.parse.quote(text))
    wait_idle(page)
    page.get_by_role("tab", name="Model view (all layers × heads)").click()
    wait_idle(page)
    sel = '.st-key-explore-grid[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=60_000)
    # the pixel centre of encoder layer 2, head 3, from plotly's own axes
    xy = page.eval_on_selector(sel, """(e, [layer, head]) => {
        const t = e.data[1], fl = e._fullLayout, i = t.customdata.findIndex(c => c[0] === layer && c[1] === head);
        const box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + fl.xaxis.d2p(t.x[i]), box.top + fl.yaxis.d2p(t.y[i])]; }""", [2, 3])
    page.mouse.move(xy[0] + 3, xy[1] + 4)  # off-centre: anywhere on the map will do
    page.mouse.click(xy[0] + 3, xy[1] + 4)
    page.wait_for_function("""() => { const e = document.querySelector('.st-key-explore-enlarged[data-stale="false"] .js-plotly-plot');
                               return e && e.layout.title.text.includes('layer 2') && e.layout.title.text.includes('head 3'); }""",
                           timeout=60_000)
    wait_idle(page)
    assert no_exception(page)
    assert "layer=2" in page.url and "head=3" in page.url
    model = core.load_model("toy-translate", device="cpu")
    expected = model.trace(text)["encoder.2.self_attn.weights"][3].numpy()
    z = np.array(chart_data(page, "explore-enlarged")["data"][0]["z"], dtype=float)
    assert np.abs(z - expected).max() < 1e-5
    shapes = chart_data(page, "explore-grid")["layout"]["shapes"]
    assert len(shapes) == 1  # the outline moved to the clicked map
    page.screenshot(path=str(SCREENSHOTS / "explore-model-view.png"))


def test_block_map_hover_names_both_blocks(page):
    """A long prefix's weights in blocks read their hover labels from the category axes: the
    browser's hover over cell (40, 10) names block 40 (query) and block 10 (key), and the
    outlined row is block 40."""
    import torch
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from viz.decoder import figures as decoder_figures

    n = 300
    mask = core.causal_mask(n).numpy()
    masked = torch.randn(n, n, generator=torch.Generator().manual_seed(1)).numpy() + mask
    weights = torch.softmax(torch.from_numpy(masked), dim=-1).numpy()
    _, _, w, labels, _ = decoder_figures.in_blocks(mask, masked, weights, [f"t{i}" for i in range(n)], n - 1, max_side=96)
    fig = decoder_figures.weights_figure(w, labels, highlight_row=40, height=900)
    assert fig.data[0].customdata is None
    page.set_content(fig.to_html(include_plotlyjs=True, full_html=True))
    page.wait_for_selector(".js-plotly-plot .nsewdrag")
    box = page.locator(".nsewdrag").first.bounding_box()
    n_b = len(labels)
    x, y = box["x"] + box["width"] * (10.5 / n_b), box["y"] + box["height"] * (40.5 / n_b)
    page.mouse.move(x - 15, y - 15)
    page.mouse.move(x, y, steps=4)
    # plotly throttles hover: the label of an earlier point of the path can show first, and the
    # last point's label follows. Wait for the last one; if it never comes, the assert says what showed.
    hover_js = "() => Array.from(document.querySelectorAll('.hoverlayer text')).map(e => e.textContent).join(' ')"
    try:
        page.wait_for_function(f"() => ({hover_js})().includes({json.dumps('query: ' + labels[40])})", timeout=10_000)
    except PlaywrightTimeout:
        pass
    hover = page.evaluate(hover_js)
    assert f"query: {labels[40]}" in hover and f"key: {labels[10]}" in hover, hover
    assert f"{w[40, 10]:.4f}" in hover
    outline = page.evaluate("() => { const e = document.querySelector('.js-plotly-plot'); const s = e._fullLayout.shapes[0];"
                            " return [e._fullLayout.yaxis.d2p(40), e._fullLayout.yaxis.l2p((s.y0 + s.y1) / 2)]; }")
    assert abs(outline[0] - outline[1]) < 1.0  # the outline sits on block 40's row


def test_svg_download_is_named_like_the_csv(server, page):
    """The heatmap's SVG file carries the CSV's descriptive name, not the chart's key."""
    page.goto(f"{server.url}/explore?layer=1&head=2")
    wait_idle(page)
    chart_data(page, "explore-heatmap")
    with page.expect_download(timeout=120_000) as svg:
        page.locator(".st-key-explore-heatmap-svg button").first.click()
    page.locator(".st-key-explore-dl-pop button").first.click()  # the map's data downloads: one popover
    with page.expect_download(timeout=60_000) as csv:
        page.locator(".st-key-explore-dl-csv button").first.click()
    assert csv.value.suggested_filename == "toy-translate-encoder-self-attn-layer1-head2-map.csv"
    assert svg.value.suggested_filename == "toy-translate-encoder-self-attn-layer1-head2-map.svg"


def test_full_resolution_hover_names_the_tokens(page):
    """A map of more than HOVER_LABEL_CELLS cells (a long input drawn whole) hovers with the
    tokens' names and positions, though its tokens repeat: the browser's hover over cell
    (120, 35) names both tokens."""
    import numpy as np

    from viz.figures.heatmaps import HOVER_LABEL_CELLS, attention_heatmap

    n = 210
    words = "the river bank was closed so she walked".split()
    toks = [words[i % len(words)] for i in range(n)]
    w = np.random.default_rng(0).dirichlet(np.ones(n), size=n)
    assert n * n > HOVER_LABEL_CELLS
    fig = attention_heatmap(w, toks, toks, height=900)
    page.set_content(fig.to_html(include_plotlyjs=True, full_html=True))
    page.wait_for_selector(".js-plotly-plot .nsewdrag")
    box = page.locator(".nsewdrag").first.bounding_box()
    x, y = box["x"] + box["width"] * (35.5 / n), box["y"] + box["height"] * (120.5 / n)
    page.mouse.move(x - 15, y - 15)
    page.mouse.move(x, y, steps=4)
    hover_js = "() => Array.from(document.querySelectorAll('.hoverlayer text')).map(e => e.textContent).join(' ')"
    want = f"query: {toks[120]} (120)"
    try:
        page.wait_for_function(f"() => ({hover_js})().includes({json.dumps(want)})", timeout=10_000)
    except Exception:
        pass
    hover = page.evaluate(hover_js)
    assert want in hover and f"key: {toks[35]} (35)" in hover and f"{w[120, 35]:.4f}" in hover, hover
