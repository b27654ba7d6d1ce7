"""Download sizes are told before the download (viz.ui.download_sizes): the estimate from one layer's
shapes matches the arrays actually written, and one layer alone is offered."""

import io

import numpy as np
import pytest

import core
from core import trace_names as tn
from viz.ui import download_sizes as vd


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


SEQ2SEQ = ("marian", "bart", "t5")  # tiny checkpoints of the families the app reads from disk
HF = ("bert", "gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "gpt_neox", "phi3")
GEMMA = ("gemma2", "gemma3_text", "modernbert")  # soft-capping, post norms, QK-norm, local/global layers


def _model(name, tmp_path):
    if name in SEQ2SEQ:
        from test_hf_seq2seq import _build

        from core.loaders import hf_seq2seq

        _build(name, tmp_path)
        return hf_seq2seq.load(tmp_path, device="cpu")
    if name in HF:
        from hf_builders import build, save

        save(build(name, tmp_path, **({"sliding_window": 4} if name == "mistral" else {}))[0], tmp_path)
        return core.load_model(str(tmp_path), device="cpu")
    if name in GEMMA:
        from gemma_builders import build as build_gemma
        from hf_builders import save

        save(build_gemma(name, tmp_path)[0], tmp_path)
        return core.load_model(str(tmp_path), device="cpu")
    if not core.MODELS[name].available():
        pytest.skip(f"{name}'s weight package is not installed")
    return core.load_model(name, device="cpu")


@pytest.mark.parametrize("name", ["toy-translate", "minilm", "smollm2", *SEQ2SEQ, *HF, *GEMMA])
def test_sizes_come_from_shapes_without_computing_a_layer(name, tmp_path):
    """Sizing a download computes no layer (a long input's layer is GBs of maps): the sizes
    come from the configuration and token counts, and equal the arrays once computed, for
    every family the app reads (T5's position bias, GQA's key/value heads, windows, ...)."""
    m = _model(name, tmp_path)
    tr = m.trace("the small dog sees the cat", **({"target": "a dog"} if name in SEQ2SEQ else {}))
    runner = tr._runner

    def refuse(*a, **k):
        raise AssertionError("a layer was computed to size a download")

    real = runner.layer, runner.logits
    runner.layer = runner.logits = refuse
    try:
        sizes = vd.trace_bytes(tr)
    finally:
        runner.layer, runner.logits = real
    for stack in tr.stacks():
        for layer in {0, tr.layers(stack) - 1}:
            computed = sum(tr[n].numel() * tr[n].element_size() for n in tr.names(tn.layer(stack, layer) + "."))
            assert sizes[f"layer:{stack}"] == computed, (stack, layer)


def test_download_budget_is_stated():
    budget, why = vd.download_budget()
    assert 0 < budget <= vd.DOWNLOAD_CAP_BYTES and vd.human(budget) in why


def test_whole_trace_over_the_budget_is_not_offered(app_test, monkeypatch):
    """A download bigger than the budget is not offered; the page says its size against the
    budget, and the layer alone (which fits) still is."""
    text = "the small dog sees the cat"
    m = core.load_model("toy-translate", device="cpu")
    sizes = vd.trace_bytes(m.trace(text))

    def buttons(at):
        return {b.proto.id.rsplit("-", 1)[-1]: b for b in at.get("download_button") if "explore-dl-" in b.proto.id}

    at = app_test("explore", text=text)
    at.run()
    assert {"csv", "layer", "npz"} <= set(buttons(at))
    monkeypatch.setattr(vd, "DOWNLOAD_CAP_BYTES", sizes["layer:encoder"] + 1)
    at = app_test("explore", text=text)
    at.run()
    got = buttons(at)
    assert "npz" not in got and "layer" in got and not got["layer"].proto.disabled
    said = " ".join(c.value for c in at.caption)
    assert "Whole trace not offered" in said and f"≈{vd.human(sizes['total'])}" in said
    assert vd.human(sizes["layer:encoder"] + 1) in said
