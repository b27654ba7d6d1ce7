"""A document of more than 2,000 tokens opened in a real browser on a tiny random Gemma 2
checkpoint (soft-capping, a window of 4 keys on layer 0, norms after the sub-layers): the long
path (one head and a tile of rows at a time, core/head_maps.py) draws the head's overview, and
the overview equals the block means of the full map, the explicit path's whole layer
(tests/parity/test_one_formula.py holds the same equality for every family at small sizes)."""

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, require_browser, start_server, wait_idle
from core.head_maps import long_layer, pool_full
from viz.figures.text import clean_text

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SENTENCES = ["the small dog sees the cat near the old river bank.", "a cat sat on the mat because it was tired.",
             "alice gave bob the book because he asked for it.", "one two three four five six seven eight nine ten."]


def document(n_sentences: int = 90) -> str:  # ~2,350 tokens of the tiny tokenizer
    return " ".join(SENTENCES[i % len(SENTENCES)] for i in range(n_sentences))


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from gemma_builders import build

    root = tmp_path_factory.mktemp("browser-long-models")
    hf, folder = build("gemma2", root / "tiny-gemma2", max_position_embeddings=4096)
    hf.save_pretrained(str(folder))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, models_dir):
    """The app with the models folder listed (ATTENTION_LAB_MODELS), stopped by its pid."""
    require_browser()
    srv = start_server(tmp_path_factory.mktemp("server"), env_extra={"ATTENTION_LAB_MODELS": str(models_dir)})
    yield srv
    srv.stop()


def test_gemma2_long_overview_is_the_full_maps_block_means(server, page, models_dir):
    text = document()
    model = core.load_model(str(models_dir / "tiny-gemma2"), device="cpu")
    tr = model.trace(clean_text(text)[0])
    n = len(tr.tokens("target"))
    assert n > 2000 and long_layer(tr, "decoder"), n  # the page reads this layer one head and tile at a time
    full = tr["decoder.0.self_attn.weights"][0]  # the page's layer 0 (a sliding, soft-capped layer), head 0
    page.goto(f"{server.url}/explore?model=tiny-gemma2&tab=long")
    wait_idle(page, timeout=600_000)
    box = page.get_by_label("Sentence (press Ctrl+Enter)", exact=True)
    box.fill(text)
    box.press("Control+Enter")
    page.wait_for_function("() => (new URLSearchParams(location.search).get('text') || '').length > 3000",
                           timeout=600_000)
    wait_idle(page, timeout=900_000)
    assert no_exception(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "explore-long-gemma2-typed.png"), full_page=True)
    page.get_by_role("tab", name="Heatmap").click()
    wait_idle(page, timeout=600_000)
    assert no_exception(page)
    over = np.array([[np.nan if v is None else v for v in row]
                     for row in chart_data(page, "explore-heatmap", timeout=600_000)["data"][0]["z"]], dtype=float)
    size = -(-n // over.shape[0])
    # the overview draws each block's mass per query row: the block mean times the key block's width
    widths = np.array([min(size, n - b * size) for b in range(-(-n // size))], dtype=float)
    want = pool_full(full, size).numpy() * widths[None, :]
    assert over.shape == want.shape, (over.shape, want.shape, size)
    np.testing.assert_allclose(np.nan_to_num(over), want, atol=1e-5)
    assert float(np.abs(want - want.mean()).max()) > 1e-3  # not a uniform map: the comparison can fail
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "explore-long-gemma2-overview.png"), full_page=True)
