"""The home page's path, as a first-time student walks it in Chromium: / opens the path on the
default sentence; each stop's link opens its full page on the same sentence and model with no
warning box; Next moves along and the URL keeps the stop. Screenshots of every stop go to
SCREENSHOTS (path-stop1.png ...)."""

import urllib.parse

import pytest

from browser_utils import SCREENSHOTS, no_exception, wait_idle
from viz.home import path as hp
from viz.ui import registry

pytestmark = pytest.mark.browser

SENTENCE = "the old man sees the small dog"
MODEL = "toy-translate"


def _alerts(page, kind):
    return page.locator(f'[data-testid="stAlertContent{kind}"]').all_inner_texts()


def _params(url):
    return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlparse(url).query).items()}


def test_root_opens_the_path_and_each_stop_links_to_its_page(server, page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{server.url}/?" + urllib.parse.urlencode({"model": MODEL, "text": SENTENCE}))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    assert page.get_by_role("heading", name=registry.page("home").heading).count() == 1
    for i, stop in enumerate(hp.STOPS, start=1):
        if i > 1:
            page.get_by_role("button", name="Next →").click()
            page.wait_for_function("want => new URLSearchParams(location.search).get('stop') === want", arg=str(i),
                                   timeout=60_000)
            wait_idle(page, timeout=120_000)
        assert page.get_by_role("heading", name=f"{i}. {stop.title}").count() == 1, i
        assert no_exception(page) and not _alerts(page, "Warning") and not _alerts(page, "Error"), i
        page.wait_for_selector('.st-key-home-fig[data-stale="false"] .js-plotly-plot .main-svg', timeout=60_000)
        page.screenshot(path=str(SCREENSHOTS / f"path-stop{i}.png"), full_page=True)
        here = page.url
        # the stop's links, in order: its own page first, then the others it names
        targets = [stop.page] + [k for k, _ in stop.extra]
        for key in targets:
            link = page.locator(", ".join(f'[data-testid="stPageLink-NavLink"][href{op}"{v}"]' for op, v in
                                          (("=", key), ("^=", f"{key}?"), ("$=", f"/{key}"), ("*=", f"/{key}?"))))
            assert link.count() == 1, (i, key, link.count())
            link.first.click()
            page.wait_for_url(f"**/{key}?**", timeout=30_000)
            wait_idle(page, timeout=180_000)
            assert no_exception(page), (i, key)
            params = _params(page.url)
            assert params.get("model") == MODEL and params.get("text") == SENTENCE, (i, key, params)
            warnings = _alerts(page, "Warning") + _alerts(page, "Error")
            assert not warnings, (i, key, warnings)
            heading = registry.page(key).heading
            assert page.get_by_role("heading", name=heading).count() >= 1, (i, key)
            page.goto(here)
            wait_idle(page, timeout=120_000)
        assert _params(page.url).get("stop", "1") == str(i)


def test_a_reload_keeps_the_stop_and_an_example_brings_its_model(server, page):
    page.goto(f"{server.url}/?stop=3")
    wait_idle(page, timeout=120_000)
    assert page.get_by_role("heading", name=f"3. {hp.STOPS[2].title}").count() == 1
    page.reload()
    wait_idle(page, timeout=120_000)
    assert page.get_by_role("heading", name=f"3. {hp.STOPS[2].title}").count() == 1
    page.get_by_role("button", name="bank (river)", exact=True).click()  # the notes' sentence, on minilm
    page.wait_for_function("() => new URLSearchParams(location.search).get('model') === 'minilm'", timeout=120_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page) and not _alerts(page, "Warning")
    assert "river" in _params(page.url)["text"]
