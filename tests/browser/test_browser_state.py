"""A model switch in a real browser, where the widgets keep their own state: the Heads page's
Token selectbox sends back the label it still shows, and widgets the last run did not draw
come back at their own default unless the server sends the value. test_app_state.py checks the
same with AppTest's model of the browser; this checks the model."""

import re
import urllib.parse

import pytest

import core
from browser_utils import no_exception, wait_idle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not all(core.MODELS[m].available() for m in ("minilm", "smollm2")),
                                 reason="a bundled model's weight package is not installed")]

TEXT = "the cat sees the small dog"


def _pick(page, label, option):
    page.locator('[data-testid="stMain"]').get_by_role("combobox", name=label, exact=True).first.click()
    page.get_by_role("option", name=option, exact=True).first.click()
    wait_idle(page, timeout=120_000)


def _box(page, key):
    return page.locator(f".st-key-{key} input, .st-key-{key} textarea").first


def test_model_switch_keeps_the_page_working_and_its_controls_true(server, page):
    page.goto(f"{server.url}/heads?model=smollm2&text=" + urllib.parse.quote("The capital of France is"))
    wait_idle(page, timeout=120_000)
    _pick(page, "Model", "minilm")
    slider = page.locator('[data-testid="stMain"]').get_by_role("slider").first  # any rerun after the switch
    slider.focus()
    slider.press("ArrowRight")
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    assert page.get_by_text("Attention through the layers").count() == 1

    page.goto(f"{server.url}/decoder?model=toy-translate")
    wait_idle(page, timeout=120_000)
    _box(page, "decoder-text").fill(TEXT)
    _box(page, "decoder-text").press("Control+Enter")  # the text area applies on Ctrl+Enter
    wait_idle(page, timeout=120_000)
    page.locator(".st-key-decoder-btn-next button").first.click()
    wait_idle(page, timeout=120_000)
    _pick(page, "Model", "smollm2")
    assert _box(page, "decoder-text").input_value() == TEXT
    _pick(page, "Model", "toy-translate")
    assert no_exception(page)
    assert _box(page, "decoder-text").input_value() == TEXT
    main = page.locator('[data-testid="stMain"]')
    main.get_by_text("Training step: watch the attention learn").first.click()  # the panel starts closed
    wait_idle(page, timeout=120_000)
    shown = [s.get_attribute("aria-valuetext") or s.get_attribute("aria-valuenow")
             for s in main.get_by_role("slider").all()]
    body = main.inner_text()
    assert re.search(r"Step 2500\s+of 2500", body) and re.search(r"Step 2 of \d+", body), body[:400]
    assert shown[:2] == ["2500 (final)", "2"], shown  # the sliders say what the page says
    page.locator(".st-key-decoder-btn-next button").first.click()
    wait_idle(page, timeout=120_000)
    assert re.search(r"Step 3 of \d+", main.inner_text())
