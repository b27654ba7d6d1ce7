"""Circuits in a real browser: from a head on Explore to its circuit; a click on a head of the graph
expands it; "Check by patching" writes the result on the edge; the CSV and SVG downloads; collapse."""

import urllib.parse

import pytest

from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = pytest.mark.browser

TEXT = "the small dog sees the small cat"


def _graph(page):
    return chart_data(page, "circuits-graph")


def _click_node(page, name):
    """Click the node `name` of the circuit graph (the trace named "components"), at its pixel centre."""
    sel = '.st-key-circuits-graph[data-stale="false"] .js-plotly-plot'
    page.wait_for_selector(sel, timeout=60_000)
    page.locator(sel).scroll_into_view_if_needed()
    xy = page.eval_on_selector(sel, """(e, name) => {
        const t = e.data.find(d => d.name === 'components'), fl = e._fullLayout;
        const i = Array.from(t.customdata).indexOf(name);
        const box = e.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + fl.xaxis.d2p(t.x[i]), box.top + fl.yaxis.d2p(t.y[i])]; }""", name)
    page.mouse.move(xy[0], xy[1])
    page.mouse.click(xy[0], xy[1])


def test_open_from_explore_expand_a_head_and_check_an_edge_by_patching(server, page):
    page.goto(f"{server.url}/explore?layer=2&head=1&text=" + urllib.parse.quote(TEXT))
    wait_idle(page)
    page.get_by_text("More: switch heads off, patch this head, the logit lens").click()
    page.get_by_text("Circuit of layer 2 · head 1").click()
    page.wait_for_url("**/circuits?**", timeout=60_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert q["layer"] == ["2"] and q["head"] == ["1"] and q["text"] == [TEXT]
    fig = _graph(page)
    nodes = next(t for t in fig["data"] if t.get("name") == "components")
    assert nodes["customdata"][0] == "L2H1"
    heads = [n for n in nodes["customdata"][1:] if n.startswith("L") and "H" in n and "." not in n]
    assert heads, nodes["customdata"]
    page.screenshot(path=str(SCREENSHOTS / "circuits.png"), full_page=True)
    # a click on a head of the graph expands it: its own edges join the graph, and the URL keeps it
    target = heads[0]
    _click_node(page, target)
    page.wait_for_function(f"() => decodeURIComponent(location.search).includes('open={target}')", timeout=120_000)
    wait_idle(page, timeout=120_000)
    fig = _graph(page)
    hovers = [h for t in fig["data"] if t.get("name", "").endswith("side") for h in t["hovertext"]]
    assert any(f"→ {target} (" in h for h in hovers), hovers[:5]  # edges into the expanded head
    assert all("weight" in h and "share" in h for h in hovers)
    # check the chosen edge by patching: the result is written on the edge and under the button
    page.get_by_role("button", name="Check by patching").click()
    page.wait_for_function("() => location.search.includes('checked=')", timeout=180_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    fig = _graph(page)
    notes = [a["text"] for a in fig["layout"].get("annotations", [])]
    assert any(n.startswith("patched:") for n in notes), notes
    assert page.get_by_text("patched (drop").count() >= 1
    page.screenshot(path=str(SCREENSHOTS / "circuits-patched.png"), full_page=True)
    # the downloads: the edges as CSV, the graph as SVG
    with page.expect_download(timeout=60_000) as csv:
        page.locator(".st-key-circuits-csv button").first.click()
    assert csv.value.suggested_filename == "toy-translate-encoder-L2H1-circuit.csv"
    with page.expect_download(timeout=120_000) as svg:
        page.locator(".st-key-circuits-graph-svg button").first.click()
    assert svg.value.suggested_filename == "toy-translate-encoder-L2H1-circuit.svg"
    # a reload keeps the expanded head and the check
    page.reload()
    wait_idle(page, timeout=120_000)
    assert any(n.startswith("patched:") for n in [a["text"] for a in _graph(page)["layout"].get("annotations", [])])
    page.get_by_role("button", name="Collapse every expanded head").click()
    page.wait_for_function("() => !location.search.includes('open=')", timeout=60_000)
    wait_idle(page)
    assert no_exception(page)
