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
    page.goto(f"{server.url}/attribution?model=smollm2&steps=16&fix_first=1&faithful=1&text=" + urllib.parse.quote(TEXT))
    wait_idle(page, timeout=240_000)
    assert no_exception(page)
    data = chart_data(page, "attribution-text", timeout=240_000)
    rows = {t["meta"]: np.array(t["z"], dtype=float).reshape(-1) for t in data["data"]}
    assert list(rows) == list(ca.ATTRIBUTION_METHODS)
    model = core.load_model("smollm2", device="cpu")
    want = ca.attribute(model, TEXT, "occlusion")["score"].to_numpy()
    np.testing.assert_allclose(rows["occlusion"], want, rtol=1e-4, atol=1e-5)
    curves = chart_data(page, "attribution-curves")
    assert len([t for t in curves["data"] if t.get("meta") != "random-band"]) == len(ca.ATTRIBUTION_METHODS) + 1
    page.get_by_text("Which picture is faithful").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "attribution.png"), full_page=True)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
    # fix_first is on by default for decoders: the URL leaves it out
    assert q["steps"] == ["16"] and "fix_first" not in q and q["model"] == ["smollm2"]


def test_explore_norms_switch_redraws_the_heatmap_with_value_norms(server, page):
    """Explore's "Weights -> what is added (norms)" switch, clicked in the page: the heatmap then
    holds the core's value norms ||a_ij v_j W_o^h|| of that head (not its weights), the URL keeps
    norms=1, and switching back draws the weights again. Screenshot: explore-norms.png."""
    text = "the small dog sees the old cat"
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace(text)
    vn, w = tr["encoder.1.self_attn.value_norms"][2].numpy(), tr["encoder.1.self_attn.weights"][2].numpy()
    page.goto(f"{server.url}/explore?model=toy-translate&layer=1&head=2&text=" + urllib.parse.quote(text))
    wait_idle(page)
    z = np.array(chart_data(page, "explore-heatmap")["data"][0]["z"], dtype=float)
    np.testing.assert_allclose(z, w, atol=1e-5)
    page.get_by_text("Weights → what is added (norms)").click()
    page.wait_for_function("() => location.search.includes('norms=1')", timeout=60_000)
    wait_idle(page)
    fig = chart_data(page, "explore-heatmap")
    z = np.array(fig["data"][0]["z"], dtype=float)
    np.testing.assert_allclose(z, vn, rtol=1e-4, atol=1e-6)
    assert "value norms" in fig["layout"]["title"]["text"] and page.get_by_text("Rows do not sum to 1").count()
    assert not np.allclose(z, w, atol=1e-3) and no_exception(page)
    page.get_by_text("Showing", exact=False).first.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "explore-norms.png"))
    page.get_by_text("Weights → what is added (norms)").click()
    page.wait_for_function("() => !location.search.includes('norms=1')", timeout=60_000)
    wait_idle(page)
    z = np.array(chart_data(page, "explore-heatmap")["data"][0]["z"], dtype=float)
    np.testing.assert_allclose(z, w, atol=1e-5)
