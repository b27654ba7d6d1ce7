"""The random presets of the attentions DeepSeek V3 / V3.2, Gemma 4 and Qwen3.5 ship (random:mla,
dsa, shared_kv, gated_attn) on the pages that show them: every page opens on each, Inside's
numpy reference writes out the output gate, and each number read from a chart is compared with
the core's trace or with numpy written here."""

import numpy as np
import pytest

import core
from conftest import assert_no_exception
from core import trace_names as tn
from core.registry import RANDOM_PRESETS

TEXT = "the small dog sees the cat and the old man sleeps near the river"
NEW = ("mla", "dsa", "shared_kv", "gated_attn")
PAGES = ("inside", "explore", "kvcache", "heads", "positions", "circuits")


def _model(name):
    return core.load_model(name, device="cpu")


def test_each_new_preset_has_its_mechanism():
    assert set(NEW) <= set(RANDOM_PRESETS)
    mla, dsa = _model("random:mla"), _model("random:dsa")
    assert mla.config.mla["kv_lora_rank"] == 8 and mla.config.d_model == 64 and mla.config.moe is None
    assert dsa.config.mla["index"]["topk"] == 4
    sel = dsa.trace(TEXT)[tn.attn("decoder", 1, "self_attn", "selected")].numpy()
    assert (sel.sum(-1) == np.minimum(np.arange(1, sel.shape[0] + 1), 4)).all()  # top 4 of the causal keys
    kv = _model("random:shared_kv").config
    assert kv.kv_source == [None, None, 0, 1] and kv.k_eq_v
    tr = _model("random:gated_attn").trace(TEXT)
    g = tr[tn.attn("decoder", 2, "self_attn", "gate")].numpy()
    assert g.shape == (4, len(tr.tokens("target")), 16) and 0 < g.min() and g.max() < 1


@pytest.mark.parametrize("preset", NEW)
def test_every_page_opens_on_the_new_presets(app_test, preset):
    for page in PAGES:
        at = app_test(page, model=f"random:{preset}", text=TEXT)
        at.run()
        assert_no_exception(at)
        assert any(f"weights of random:{preset} are random" in i.value for i in at.info), (page, preset)


def test_reference_writes_out_the_output_gate_and_shared_keys():
    from viz.figures.reference import reference_layer

    for p in ("gated_attn", "shared_kv"):
        tr = _model(f"random:{p}:1").trace(TEXT)
        for i in range(4):
            ref = reference_layer(tr, "decoder", i, {"self_attn": 2})
            np.testing.assert_allclose(ref["self_attn.maps2"]["weights"],
                                       tr[tn.attn("decoder", i, "self_attn", "weights")][2].double().numpy(), atol=1e-5)
            if p == "gated_attn":
                np.testing.assert_allclose(ref["self_attn.gate"], tr[tn.attn("decoder", i, "self_attn", "gate")].double()
                                           .numpy(), atol=1e-6)
            np.testing.assert_allclose(ref["out"], tr[tn.out("decoder", i)].double().numpy(), atol=1e-4)
