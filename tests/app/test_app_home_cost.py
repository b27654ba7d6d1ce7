"""Start here's stop on the cost of attention: the notes' count for the model's own width, the
user's sentence marked at its length, the memory sentence in numbers, and the recall curves of the
models shipped in assets/recall."""

import base64
import json

import numpy as np
import pytest

from core.net.cost import mixing_cost
from core.toy import recall_task

pytestmark = pytest.mark.app


def _values(v):
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return v


def test_cost_stop_marks_the_sentence(app_test):
    at = app_test("", model="toy-translate", text="the small dog sees the cat", stop="6")
    at.run()
    assert not at.exception and not at.error
    assert at.subheader[0].value.startswith("6. The cost of attention")
    figs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    cost = figs[0]
    mine = next(t for t in cost["data"] if t["name"].startswith("your sentence"))
    n = 6
    assert _values(mine["x"]) == [n, n]
    want = mixing_cost(np.array([n]), 128, 32)
    assert np.allclose(_values(mine["y"]), [want["linear"][0], want["softmax"][0]])
    curve = next(t for t in cost["data"] if t["name"].startswith("softmax"))
    assert n in _values(curve["x"])  # the marked sentence lies on the curves, not left of them
    assert cost["layout"]["xaxis"]["dtick"] == 1 and cost["layout"]["yaxis"]["dtick"] == 1  # decades only
    text = " ".join(m.value for m in at.markdown)
    assert "D = 128" in text and f"{int(want['cache'][0]):,} numbers" in text
    curves = recall_task.shipped_curves()
    if curves:
        recall = figs[1]
        assert {t["name"] for t in recall["data"]} == {
            {"softmax": "softmax attention", "gated_delta": "Gated DeltaNet", "mamba2": "Mamba2"}[m] for m in curves}
