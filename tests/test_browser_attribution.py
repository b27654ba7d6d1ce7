"""The attribution page in a real browser on smollm2: the coloured rows hold the core's
occlusion scores, the faithfulness table and the deletion curves are drawn, the URL keeps
the controls. Screenshot: test-artifacts/screenshots/attribution.png."""

import urllib.parse

import numpy as np
import pytest

import core
import core.analysis as ca
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle

pytestmark = pytest.mark.browser

TEXT = "The capital of France is"


def test_attribution_page_draws_the_core_scores(server, page):
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2 is not installed")
    page.goto(f"{server.url}/attribution?model=smollm2&steps=16&fix_first=1&text=" + urllib.parse.quote(TEXT))
    wait_idle(page, timeout=240_000)
    assert no_exception(page)
    data = chart_data(page, "attribution-text", timeout=240_000)
    rows = {t["meta"]: np.array(t["z"], dtype=float).reshape(-1) for t in data["data"]}
    assert list(rows) == list(ca.ATTRIBUTION_METHODS)
    model = core.load_model("smollm2", device="cpu")
    want = ca.attribute(model, TEXT, "occlusion")["score"].to_numpy()
    np.testing.assert_allclose(rows["occlusion"], want, rtol=1e-4, atol=1e-5)
    curves = chart_data(page, "attribution-curves")
    assert len(curves["data"]) == len(ca.ATTRIBUTION_METHODS) + 1
    page.get_by_text("Which picture is faithful").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "attribution.png"), full_page=True)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    assert q["steps"] == ["16"] and q["fix_first"] == ["1"] and q["model"] == ["smollm2"]
