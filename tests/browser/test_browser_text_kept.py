"""A 50,000-character document in a real browser (issue 41): pasted into Explore's box, it comes
back whole after Back, a reload and in a new tab opened with the page's link (the URL carries
its first part and a key; the server keeps the whole text, viz.ui.text_store); a link whose key
this server does not hold says so and shows what the URL carries."""

import urllib.parse

import pytest

from browser_utils import no_exception, require_browser, start_server, wait_idle
from viz.ui import text_store
from viz.figures.text import url_text

pytestmark = pytest.mark.browser

LONG = "".join(f"Line {i}: the small dog sees the cat near the old river bank.\n" for i in range(1000))[:50_000]


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("texts")


@pytest.fixture(scope="module")
def server(tmp_path_factory, store_dir):
    require_browser()
    srv = start_server(tmp_path_factory.mktemp("server"), env_extra={"ATTENTION_LAB_TEXT_STORE": str(store_dir)})
    yield srv
    srv.stop()


def _box(page):
    return page.locator(".st-key-explore-text textarea").first


def _query(page) -> dict:
    return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query).items()}


def test_a_long_document_survives_back_reload_and_a_new_tab(server, page, store_dir, monkeypatch):
    assert len(LONG) == 50_000 and len(url_text(LONG)) < len(LONG)
    page.goto(f"{server.url}/explore?model=toy-translate")
    wait_idle(page, timeout=120_000)
    _box(page).fill(LONG)
    _box(page).press("Control+Enter")
    page.wait_for_function("() => location.search.includes('text_key=')", timeout=120_000)
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    q = _query(page)
    assert len(q["text"]) < len(LONG) and LONG.startswith(q["text"])
    monkeypatch.setenv("ATTENTION_LAB_TEXT_STORE", str(store_dir))
    assert text_store.get(q["text_key"]) == LONG  # the server kept the whole text
    link = page.url
    assert "cut" in page.locator('[data-testid="stMain"]').inner_text()  # the model's context cut is said

    page.goto(f"{server.url}/lens?model=toy-translate")  # elsewhere, then Back
    wait_idle(page, timeout=120_000)
    for _ in range(3):  # the Lens page may have pushed its own URL: Back until Explore's
        page.go_back()
        wait_idle(page, timeout=120_000)
        if "/explore" in page.url:
            break
    assert "/explore" in page.url and "text_key=" in page.url, page.url[:200]
    assert _box(page).input_value() == LONG

    page.reload()
    wait_idle(page, timeout=120_000)
    assert _box(page).input_value() == LONG

    tab = page.context.new_page()
    tab.goto(link)
    wait_idle(tab, timeout=120_000)
    assert _box(tab).input_value() == LONG and no_exception(tab)

    other = link.replace(q["text_key"], "0" * text_store.KEY_CHARS)  # a key this server does not hold
    tab.goto(other)
    wait_idle(tab, timeout=120_000)
    body = tab.locator('[data-testid="stMain"]').inner_text()
    assert "does not hold that key" in body and f"first {len(q['text']):,} characters" in body
    assert _box(tab).input_value() == q["text"]
    tab.close()
