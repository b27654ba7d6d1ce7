"""The Inside page's checks (viz.inside.step_checks) against viz.figures.reference, the float64 numpy layer, on every
family the loaders support: on the model as it is every check holds; with the core computing one
projection wrong (a forward hook scales W_k's output by 1.02, the checkpoint's weight left as
it is) the checks of K and everything after it fail, while the numpy side, which reads the
weight itself, does not move."""

import pytest
import torch

import core
from hf_builders import build
from viz.inside.step_checks import layer_checks

pytest.importorskip("transformers")

TEXT = "the small dog sees the old cat near the river bank"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 10000.0}
HF = {
    "bert": ("bert", {}),
    "roberta": ("roberta", {}),
    "distilbert": ("distilbert", {}),
    "gpt2": ("gpt2", {}),
    "llama-gqa-llama3": ("llama", {"rope_parameters": LLAMA3}),
    "mistral-window4": ("mistral", {"sliding_window": 4}),
    "qwen2": ("qwen2", {}),
    "qwen3-qknorm": ("qwen3", {}),
    "olmo2-postnorm-qknorm": ("olmo2", {}),
    "gpt_neox-parallel-partial-rotary": ("gpt_neox", {}),
    "phi3-partial-rotary-window4": ("phi3", {"sliding_window": 4}),
}
SEQ2SEQ = ("marian", "bart", "t5")


def _views(trace):
    return [(s, k) for s in trace.stacks() for k in trace.attention_kinds(s)]


def _all(trace, head=1):
    out = {}
    for stack, kind in _views(trace):
        for layer in range(trace.layers(stack)):
            out[(stack, kind, layer)] = layer_checks(trace, stack, kind, layer, head)
    return out


def _failing(checks):
    return [(k, c.text()) for k, cs in checks.items() for c in cs if not c.ok]


def _assert_hold_then_catch(model, target=None):
    trace = model.trace(TEXT, target=target) if target else model.trace(TEXT)
    for where, checks in _all(trace).items():
        assert checks.note is None, checks.note
        assert not _failing(checks), (where, _failing(checks))
        assert {"q", "k", "v", "scores", "scaled", "mask", "masked", "weights", "out"} <= set(checks), where
    stack = trace.stacks()[0]
    attn = model.net.layers(stack)[0].self_attn

    def faulty(module):
        handle = module.register_forward_hook(lambda mod, inp, out: out * 1.02)  # the core's K is 2 % off
        try:
            bad = model.trace(TEXT, target=target) if target else model.trace(TEXT)
            checks = layer_checks(bad, stack, "self_attn", 0, 1)
        finally:
            handle.remove()
        return checks, {k for k, cs in checks.items() for c in cs if not c.ok}

    if attn.k_norm is not None:
        # QK-norm's RMSNorm undoes a scale on W_k's output: the fault shows in the projection
        # before the norm, and a fault in the norm itself shows in K and everything after it
        checks, failed = faulty(attn.w_k)
        assert "qknorm" in failed and "q" not in failed, _failing(checks)
        checks, failed = faulty(attn.k_norm)
    else:
        checks, failed = faulty(attn.w_k)
    assert {"k", "scores", "scaled", "masked"} <= failed, _failing(checks)
    assert "q" not in failed and "v" not in failed  # the fault is where it is, not everywhere
    assert any("✗ FAILED" in c.text() for c in checks["k"])


@pytest.mark.parametrize("case", list(HF))
def test_hf_families(tmp_path, case):
    family, over = HF[case]
    hf, folder = build(family, tmp_path / case, **over)
    hf.save_pretrained(str(folder))
    model = core.load_model(str(folder), device="cpu")
    if family == "mistral":
        assert model.config.sliding_window == 4
    _assert_hold_then_catch(model)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_seq2seq_families(tmp_path, family):
    pytest.importorskip("sentencepiece")
    from test_hf_seq2seq import _build

    from core.loaders import hf_seq2seq

    _build(family, tmp_path)
    model = hf_seq2seq.load(tmp_path, device="cpu")
    _assert_hold_then_catch(model, target="the dog sees the cat")


def test_toy_translate(toy):
    _assert_hold_then_catch(toy)


def test_padding_and_ablation_are_in_the_reference():
    """A padded encoder input (padding columns of M) and a switched-off head (its slice of
    Concat(heads) zeroed before W_o) are rebuilt on the numpy side too."""
    cfg = core.ModelConfig(kind="encoder", n_layers=2, d_model=32, n_heads=4, d_ff=64, max_len=64)
    m = core.load_model("random", device="cpu", config=cfg, seed=1)
    tr = m.trace("the small dog sees the cat", pad_to=9, ablate=[("encoder", 0, 2)], ablation="mean")
    checks = layer_checks(tr, "encoder", "self_attn", 0, 2)
    assert not _failing(checks), _failing(checks)
    assert "padding" in checks["mask"][0].label


@pytest.mark.slow
def test_smollm2(smollm2):
    """RoPE (interleaved, from GGUF), grouped-query attention, pre-norm RMSNorm, SwiGLU."""
    trace = smollm2.trace(TEXT)
    for layer in (0, trace.layers("decoder") - 1):
        checks = layer_checks(trace, "decoder", "self_attn", layer, 4)
        assert not _failing(checks), _failing(checks)
        assert {"qhat", "khat"} <= set(checks)


def test_trace_from_a_file_shows_values_without_ticks(toy, tmp_path):
    path = tmp_path / "t.npz"
    toy.trace(TEXT).save(path)
    loaded = core.Trace.load(path)
    checks = layer_checks(loaded, "encoder", "self_attn", 1, 0)
    assert "no model to recompute from" in checks.note
    assert "q" not in checks and "scores" not in checks  # no tick without an independent side
    assert all(c.ok for cs in checks.values() for c in cs)
    assert torch.is_tensor(loaded["encoder.1.self_attn.q"])


@pytest.mark.parametrize("family", ["gemma2", "modernbert"])
def test_gemma2_and_modernbert(tmp_path, family):
    """Soft-capping, norms after the sub-layers, alternating local/global layers (causal and
    symmetric windows, two RoPE bases), ModernBERT's layer 0 without an attention norm."""
    from gemma_builders import build as build_gemma

    hf, folder = build_gemma(family, tmp_path / family)
    hf.save_pretrained(str(folder))
    model = core.load_model(str(folder), device="cpu")
    _assert_hold_then_catch(model)
    trace = model.trace(TEXT)
    stack = trace.stacks()[0]
    checks = _all(trace)
    if family == "gemma2":
        assert {"capped", "post_norm1", "post_norm2"} <= set(checks[(stack, "self_attn", 1)])
    assert any("window" in c.label for c in checks[(stack, "self_attn", 1 if family == "modernbert" else 0)]["mask"])


def test_gemma3_qk_norm_hides_a_scaled_k_and_the_check_before_it_sees_it(tmp_path):
    """With QK-norm a W_k that is 2 % off leaves K itself unchanged (RMSNorm removes a scale):
    the checks of K stay green and the check of the projection before the norm fails."""
    from gemma_builders import build as build_gemma

    hf, folder = build_gemma("gemma3_text", tmp_path / "g3")
    hf.save_pretrained(str(folder))
    model = core.load_model(str(folder), device="cpu")
    good = _all(model.trace(TEXT))
    for where, checks in good.items():
        assert not _failing(checks), (where, _failing(checks))
    assert {"qknorm", "qhat", "khat"} <= set(good[("decoder", "self_attn", 0)])
    handle = model.net.decoder[0].self_attn.w_k.register_forward_hook(lambda mod, inp, out: out * 1.02)
    try:
        bad = layer_checks(model.trace(TEXT), "decoder", "self_attn", 0, 1)
    finally:
        handle.remove()
    failed = {k for k, cs in bad.items() for c in cs if not c.ok}
    assert "qknorm" in failed and "k" not in failed and "q" not in failed


def test_norms_after_only_full_qk_norm_caps_and_layer_kinds_on_a_random_decoder():
    """The variants no family here combines, on a random decoder: norms after the sub-layers
    only (no norm{j}), QK-norm over the whole projection, soft-capping, sliding and global
    layers with two RoPE bases. The numpy layer agrees on every check of every layer."""
    cfg = core.ModelConfig(kind="decoder", n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, max_len=64,
                           positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False,
                           pre_sublayer_norm=False, post_sublayer_norm=True, qk_norm="full", attn_softcap=2.0,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=3,
                           rope_theta_local=100.0, tgt_vocab_size=0)
    m = core.load_model("random", device="cpu", config=cfg, seed=1)
    tr = m.trace(TEXT)
    names = tr.names("decoder.0.")
    assert "decoder.0.norm1" not in names and "decoder.0.post_norm1" in names and "decoder.0.self_attn.capped" in names
    assert tr["decoder.0.self_attn.q_pre_norm"].shape == tr["decoder.0.self_attn.q"].shape
    for where, checks in _all(tr).items():
        assert not _failing(checks), (where, _failing(checks))
        assert {"qknorm", "capped", "post_norm1", "post_norm2"} <= set(checks), where


def test_gemma4_shared_kv_k_eq_v_per_layer_inputs(tmp_path):
    """Gemma 4 (tests/gemma_builders.py): per-layer head sizes, K = V, the v-norm, proportional
    RoPE, per-layer inputs and layer scalars are written out in the numpy layer too, and every
    check of every layer holds; a layer that reuses layer 3's keys and values is checked against
    layer 3's own weights, so a W_k of layer 3 that is 2 % off fails layer 4's checks of K
    (behind the QK-norm: its projection before the norm) while its Q stays green."""
    from gemma_builders import build as build_gemma

    hf, folder = build_gemma("gemma4_text", tmp_path / "g4")
    hf.save_pretrained(str(folder))
    model = core.load_model(str(folder), device="cpu")
    _assert_hold_then_catch(model)
    trace = model.trace(TEXT)
    checks = _all(trace)
    assert {"post_norm3", "residual3", "out"} <= set(checks[("decoder", "self_attn", 4)])
    handle = model.net.decoder[3].self_attn.k_norm.register_forward_hook(lambda mod, inp, out: out * 1.02)
    try:
        bad = layer_checks(model.trace(TEXT), "decoder", "self_attn", 4, 1)
    finally:
        handle.remove()
    failed = {k for k, cs in bad.items() for c in cs if not c.ok}
    assert {"k", "scores"} <= failed and "q" not in failed, _failing({"layer 4": [c for cs in bad.values() for c in cs]})
