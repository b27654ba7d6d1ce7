"""Download sizes are told before the download (viz.downloads): the estimate from one layer's
shapes matches the arrays actually written, and one layer alone is offered."""

import io

import numpy as np
import pytest

import core
from viz import downloads as vd


@pytest.fixture(scope="module")
def trace():
    return core.load_model("toy-translate", device="cpu").trace("the small dog sees the cat")


def test_whole_trace_estimate_matches_what_save_writes(trace):
    buf = io.BytesIO()
    trace.save(buf)
    with np.load(io.BytesIO(buf.getvalue())) as z:
        written = sum(z[k].nbytes for k in z.files if not k.startswith("tokens.") and k not in ("next.tokens", "meta"))
    est = vd.trace_bytes(trace, at={"encoder": 2, "decoder": 1})
    assert est["total"] == written


def test_layer_npz_holds_that_layer_only(trace):
    with np.load(io.BytesIO(vd.layer_npz(trace, "encoder", 1))) as z:
        names = [k for k in z.files if k.startswith("encoder.")]
        assert names and all(k.startswith("encoder.1.") for k in names)
        np.testing.assert_array_equal(z["encoder.1.self_attn.weights"], trace["encoder.1.self_attn.weights"].numpy())
        assert sum(z[k].nbytes for k in names) == vd.trace_bytes(trace)["layer:encoder"]
        assert list(z["tokens.source"]) == trace.tokens("source")
