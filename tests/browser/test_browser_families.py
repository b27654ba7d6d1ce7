"""A later model family in a real browser: a models folder holding a tiny random Gemma 2
checkpoint (soft-capped attention, a window shorter than the sentence, norms after the
sub-layers) is listed, Explore draws the core's own attention map of it, and Inside a head
opens on it with its soft-capping step and every check holding."""

import urllib.parse

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, require_browser, start_server, wait_idle

pytestmark = pytest.mark.browser

TEXT = "the small dog sees the cat near the river bank"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from gemma_builders import build

    root = tmp_path_factory.mktemp("browser-models")
    hf, folder = build("gemma2", root / "tiny-gemma2")
    hf.save_pretrained(str(folder))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, models_dir):
    """The app with the models folder listed (ATTENTION_LAB_MODELS), stopped by its pid."""
    require_browser()
    srv = start_server(tmp_path_factory.mktemp("server"), env_extra={"ATTENTION_LAB_MODELS": str(models_dir)})
    yield srv
    srv.stop()


def test_gemma2_in_explore_and_inside(server, page, models_dir):
    model = core.load_model(str(models_dir / "tiny-gemma2"), device="cpu")
    tr = model.trace(TEXT)
    want = tr["decoder.1.self_attn.weights"][1].numpy()
    assert model.config.attn_softcap is not None and model.config.sliding_window < len(tr.tokens("target"))

    page.goto(f"{server.url}/explore?model=tiny-gemma2&layer=1&head=1&text=" + urllib.parse.quote(TEXT))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    z = np.array([[np.nan if v is None else v for v in row] for row in chart_data(page, "explore-heatmap")["data"][0]["z"]],
                 dtype=float)
    assert z.shape == want.shape
    np.testing.assert_allclose(np.nan_to_num(z), want, atol=1e-5)  # the drawn map is the core's map
    assert (want[np.triu_indices_from(want, 1)] == 0).all()  # causal, and the window masks far keys too
    page.screenshot(path=str(SCREENSHOTS / "families-explore-gemma2.png"))

    page.goto(f"{server.url}/inside?model=tiny-gemma2&layer=1&head=1&text=" + urllib.parse.quote(TEXT))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    body = page.locator('[data-testid="stMain"]').inner_text()
    assert "soft-capped" in body.lower() or "soft-cap" in body.lower(), body[:2000]
    assert "FAILED" not in body
    page.screenshot(path=str(SCREENSHOTS / "families-inside-gemma2.png"))
