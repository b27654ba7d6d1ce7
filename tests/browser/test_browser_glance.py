"""Issue 54's last three gaps, as a person sees them in Chromium: Attribution's first load on
smollm2 draws complete scores without running the faithfulness test (its switch runs it), a
layer axis reads the layers by their numbers, and a URL value a page cannot use is named with
what is used instead. Screenshots: attribution-first-load.png, attribution-faithfulness.png and
circuits-layers.png in SCREENSHOTS; look at them."""

import re
import time
import urllib.parse

import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = pytest.mark.browser

VIEWPORT = (1400, 2400)
TEXT = "the small dog sees the cat"


def _open(page, server, path, timeout=180_000, **params) -> float:
    t0 = time.perf_counter()
    page.goto(f"{server.url}/{path}?" + urllib.parse.urlencode(params))
    wait_idle(page, timeout=timeout)
    assert no_exception(page)
    return time.perf_counter() - t0


def _alerts(page, kind):
    return page.locator(f'[data-testid="stAlertContent{kind}"]').all_inner_texts()


def _tick_texts(page, key, axis):
    """The tick labels as the browser draws them."""
    sel = f'.st-key-{key}[data-stale="false"] .js-plotly-plot .{axis}tick text'
    page.wait_for_selector(sel, timeout=60_000)
    return page.eval_on_selector_all(sel, "els => els.map(e => e.textContent)")


def test_attribution_first_load_on_smollm2_is_complete_and_leaves_the_table_to_its_switch(server, page):
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2 is not installed")
    seconds = _open(page, server, "attribution", timeout=300_000, model="smollm2")
    chart_data(page, "attribution-text")
    main = page.locator('[data-testid="stMain"]').inner_text()
    m = re.search(r"completeness error\s+([\d.]+)%", main)
    print(f"first load of /attribution?model=smollm2 in the browser: {seconds:.1f} s (the model loaded in it), "
          f"completeness error {m.group(1) if m else '?'}%")
    assert m and float(m.group(1)) <= 5.0, main[:2000]  # complete within 5% at the defaults
    assert not [w for w in _alerts(page, "Warning") if "not complete" in w]
    # the first load ran the scores alone: the faithfulness test waits for its switch
    assert page.locator(".st-key-attribution-table").count() == 0
    assert any("Test which method is faithful" in i for i in _alerts(page, "Info")), _alerts(page, "Info")
    page.screenshot(path=str(SCREENSHOTS / "attribution-first-load.png"), full_page=True)
    page.get_by_text("Test which method is faithful").first.click()
    page.wait_for_function("() => location.search.includes('faithful=1')", timeout=60_000)
    wait_idle(page, timeout=300_000)
    page.wait_for_selector(".st-key-attribution-table table", timeout=300_000)
    chart_data(page, "attribution-curves")
    assert no_exception(page)
    page.locator(".st-key-attribution-table").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "attribution-faithfulness.png"), full_page=True)
    # the table's download, shown only once the switch is on, gives the table the page shows
    with page.expect_download(timeout=120_000) as got:
        page.get_by_role("button", name="Faithfulness table (CSV)").click()
    csv = open(got.value.path(), encoding="utf-8").read().splitlines()
    shown = page.locator(".st-key-attribution-table table tbody tr").count()
    assert len(csv) == shown + 1 and "method" in csv[0].lower(), (csv[:3], shown)


def test_a_circuit_reads_its_layers_and_heads_by_number(server, page):
    _open(page, server, "circuits", model="toy-translate", text=TEXT)
    layers = _tick_texts(page, "circuits-graph", "y")
    heads = _tick_texts(page, "circuits-graph", "x")
    assert layers[0] == "embed" and layers[1:] == [str(i) for i in range(len(layers) - 1)], layers
    assert heads == [str(h) for h in range(len(heads))], heads  # no tick left of head 0, none between two
    page.locator(".st-key-circuits-graph").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "circuits-layers.png"), full_page=True)


def test_url_values_a_page_cannot_use_are_named_with_what_is_used_instead(server, page):
    # the notes page keeps nothing in its URL: each value given is named
    _open(page, server, "notes", model="toy-translate", layer="3")
    said = " ".join(_alerts(page, "Warning"))
    assert "The URL's model='toy-translate' is ignored" in said and "The URL's layer=3 is ignored" in said, said
    # Patching: a token the model cannot read is a warning with the default used, the grid drawn,
    # as on Lens and Attribution (not an error that ends the page); a lone layer is named
    _open(page, server, "patching", model="toy-translate", text=TEXT, corrupt="the small cat sees the dog",
          answer="zzqq", layer="1")
    said = " ".join(_alerts(page, "Warning"))
    assert "The URL's answer='zzqq' is replaced by the model's own choice" in said, said
    assert "The URL's layer=1 is ignored" in said, said
    assert not _alerts(page, "Error")
    chart_data(page, "patching-map")
    # Circuits: an edge its graph does not have is named, with the edge checked instead
    _open(page, server, "circuits", model="toy-translate", text=TEXT, edge="L0H0>L9H9:key")
    said = " ".join(_alerts(page, "Warning"))
    assert "The URL's edge='L0H0>L9H9:key' is replaced by L" in said, said
