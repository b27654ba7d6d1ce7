"""Issue 41 in a real browser: on smollm2's indirect-object sentence, ' Mary' picked from the
Attribution page's top-10 list is the token explained (id 5099, not 'Mary' 25653), its leading
space survives the URL and a reload; and the faithfulness table reads as ties against random
on "The capital of France is"."""

import urllib.parse

import pytest

import core
from browser_utils import no_exception, wait_idle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="smollm2 is not installed")]

IOI = "When Mary and John went to the store, John gave a drink to"


def _main(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def test_the_picked_token_is_the_token_explained_and_kept(server, page):
    page.goto(f"{server.url}/attribution?model=smollm2&steps=8&contrast=%20John&text=" + urllib.parse.quote(IOI))
    wait_idle(page, timeout=300_000)
    main = page.locator('[data-testid="stMain"]')
    main.get_by_role("combobox", name="Target: the model's top 10").first.click()
    page.get_by_role("option", name="' Mary'", exact=False).first.click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('target') === ' Mary'", timeout=120_000)
    wait_idle(page, timeout=300_000)
    assert no_exception(page)
    body = _main(page)
    assert "f = logit[' Mary'] − logit[' John']" in body and "target id 5099" in body, body[:600]
    assert "logit['Mary']" not in body
    page.reload()
    wait_idle(page, timeout=300_000)
    assert page.locator(".st-key-attribution-target input").first.input_value() == " Mary"
    assert "target id 5099" in _main(page)


def test_ties_with_random_read_as_ties(server, page):
    page.goto(f"{server.url}/attribution?model=smollm2&steps=8&faithful=1&text=" + urllib.parse.quote("The capital of France is"))
    wait_idle(page, timeout=300_000)
    assert no_exception(page)
    body = _main(page)
    assert "no method is distinguishable from random" in body and "20 seeded random rankings" in body
