"""The Playground's Recall tab in a real browser (Chromium): for every shipped recall model, the
map plotly holds in the page is that model's map of the layer (read here from a fresh trace),
and the outline the page draws sits on the answer key's cell in the query's row (the sequence
rebuilt here from core.toy.recall_task); screenshots of each model's map and of the whole tab
are written for a person to look at."""

import random
import urllib.parse

import numpy as np
import pytest

import core
from browser_utils import SCREENSHOTS, chart_data, no_exception, wait_idle
from core.toy import recall_model, recall_task

pytestmark = [pytest.mark.browser]

MIXERS = recall_model.available()
PAIRS, SEED, LAYER, QUERY = 8, 4, 1, 3


def _grid(values):
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float)


def test_each_model_outlines_the_answer_key(server, page):
    assert "softmax" in MIXERS
    page.goto(f"{server.url}/playground?" + urllib.parse.urlencode(
        {"tab": "recall", "rc_pairs": PAIRS, "rc_seed": SEED, "rc_layer": LAYER, "rc_query": QUERY}))
    wait_idle(page, timeout=120_000)
    assert no_exception(page)
    ex = recall_task.make_example(PAIRS, random.Random(SEED))
    q, k = ex.query_positions[QUERY], ex.answer_key_positions[QUERY]
    assert ex.tokens[q] == ex.tokens[k]
    for mixer in MIXERS:
        key = f"playground-recall-{mixer}"
        fig = chart_data(page, key)
        trace = core.load_model(f"recall-{mixer}", device="cpu").trace(ex.text())
        want, signed = recall_model.layer_map(trace, LAYER)
        want = want.numpy()
        heads = [t for t in fig["data"] if t["type"] == "heatmap"]
        assert len(heads) == want.shape[0], mixer
        for h, t in enumerate(heads):
            z = _grid(t["z"])
            low = np.tril(np.ones(z.shape, dtype=bool))
            np.testing.assert_allclose(z[low], want[h][low], atol=2e-5, err_msg=f"{mixer} head {h}")
            assert np.isnan(z[~low]).all()
            xref = "x" if h == 0 else f"x{h + 1}"
            box = next(s for s in fig["layout"]["shapes"] if s.get("name") == "answer key" and s["xref"] == xref)
            assert ((box["y0"] + box["y1"]) / 2, (box["x0"] + box["x1"]) / 2) == (q, k), (mixer, h, box)
            assert box["x1"] - box["x0"] == 1 and box["y1"] - box["y0"] == 1  # one cell
        scale = heads[0]
        if signed:  # a mixer's map: signed, centred on 0
            assert scale["zmin"] == -scale["zmax"] and scale.get("zmid") == 0
        else:
            assert (scale["zmin"], scale["zmax"]) == (0, 1)
        page.locator(f".st-key-{key}").scroll_into_view_if_needed()
        page.locator(f".st-key-{key}").screenshot(path=str(SCREENSHOTS / f"recall-{mixer}-map.png"))
    curve = chart_data(page, "playground-recall-curve")
    assert sum(str(t.get("name", "")).endswith(", now") for t in curve["data"]) == len(MIXERS)
    page.screenshot(path=str(SCREENSHOTS / "recall.png"), full_page=True)
