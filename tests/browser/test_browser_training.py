"""The training-step slider in a real browser: moving it swaps toy-translate's checkpoint and
the cross-attention map of the supervised head redraws with that step's numbers."""

import urllib.parse

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle, watched_context
from core.toy import toy_steps, toy_task

pytestmark = pytest.mark.browser

TEXT = "the small dog sees the cat"
MAP = "explore-align-0"


@pytest.fixture
def page(browser):
    ctx = watched_context(browser, viewport={"width": 1400, "height": 2400})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _z(page):
    return np.array(chart_data(page, MAP)["data"][0]["z"], dtype=float)


def test_moving_the_slider_changes_the_cross_attention_map(server, page):
    steps = toy_steps.available_steps()
    page.goto(f"{server.url}/explore?text={urllib.parse.quote(TEXT)}&step_train={steps[1]}")
    wait_idle(page)
    before = _z(page)
    thumb = page.locator('[data-testid="stSlider"]').filter(has_text="Training step").get_by_role("slider")
    thumb.focus()
    thumb.press("End")  # to the final step
    page.wait_for_function(f"() => window.location.search.includes('step_train={steps[-1]}')", timeout=60_000)
    wait_idle(page)
    after = _z(page)
    assert after.shape == before.shape and np.abs(after - before).max() > 0.1
    target, _ = toy_task.translate(TEXT.split())
    final = core.load_model("toy-translate", device="cpu").trace(TEXT, target=" ".join(target))
    assert np.abs(after - final["decoder.1.cross_attn.weights"][0].numpy()).max() < 1e-5
    assert no_exception(page)
    thumb.focus()
    thumb.press("Home")  # back to step 0 for the README's picture: attention before any learning
    page.wait_for_function("() => window.location.search.includes('step_train=0')", timeout=60_000)
    wait_idle(page)
    assert np.abs(_z(page) - after).max() > 0.1
    page.locator('[data-testid="stExpander"]').filter(has_text="Training step").screenshot(
        path=str(SCREENSHOTS / "training-step.png"))
