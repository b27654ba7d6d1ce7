"""OLMo Hybrid (core/loaders/families/olmo_hybrid.py): Gated DeltaNet layers, pre-norm, between
OLMo-3 attention layers with their norms after the sub-layers, against transformers' own code.

Tiny random checkpoints saved by transformers (tests/hf_builders.py OLMO_HYBRID: linear, linear,
full, linear; two key heads for six value heads; beta up to 2 (linear_allow_neg_eigval); decays
from a few steps to the whole text), one without positions (the released checkpoints' NoPE) and
one with RoPE on the attention layer; ~30 tokens:
- each loads through core.load_model; logits within 1e-4 of transformers' eager float32 pass;
  the attention layer's weights within 1e-4 of transformers' attentions;
- every GDN layer: A has nothing above the diagonal, A @ v equals `.heads` within 1e-4 of its
  largest entry, `.heads` equals what transformers' GDN hands its gated norm (o_norm's input,
  hooked) within 1e-4, and beta is 2 sigmoid(x W_b) (above 1 somewhere); the chunked and
  recurrent forms agree on the layer's own input;
- greedy decoding with the cache (the recurrent form) gives the tokens and logits of decoding
  without it, and transformers' own greedy tokens;
- the norms sit where each layer kind puts them (norm{j} on the mixer layers, post_norm{j} on
  the attention layer), and the Inside-a-head mixer panel's recomputation of g and beta from
  the mixer's input matches the trace;
- settings the family does not read are refused with a CheckpointError naming them.
The worst figures are printed.
"""

from __future__ import annotations

import pytest
import torch

import core
from core import trace_names as tn
from core.net.config import ModelConfig
from core.net.gated_delta import chunked_rule, recurrent_rule
from hybrid_zoo import TEXT, eager_run, greedy_three_ways, saved, zoo_getter

TOL = 1e-4
CASES = {"nope": {}, "rope": {"rope_theta": 10000.0}}
FOLDERS = {}  # case -> the folder its checkpoint was saved in


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return zoo_getter(tmp_path_factory, lambda case, folder: saved("olmo_hybrid", folder, **CASES[case]), _hf_run,
                      FOLDERS)


def _hf_run(hf, ids):
    """transformers' eager pass: logits, the attention layers' weights by layer, and each
    GatedDeltaNet's heads (its o_norm's input, H x n x d_v)."""
    heads, n = {}, len(ids)
    hooks = [(layer.linear_attn.o_norm, lambda m, a, o, i=i, la=layer.linear_attn: heads.__setitem__(
        i, a[0].view(n, la.num_v_heads, -1).transpose(0, 1)))
        for i, layer in enumerate(hf.model.layers) if hasattr(layer, "linear_attn")]
    logits, weights = eager_run(hf, ids, hooks)
    return logits, weights, heads


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(zoo, case):
    hf, ours, tr, ids, (logits, weights, heads) = zoo(case)
    assert 20 <= len(ids) <= 40
    d = float((tr["logits"] - logits).abs().max())
    print(f"olmo_hybrid {case}: logits max |diff| {d:.3g}")
    assert d < TOL, f"logits off by {d:.3g}"
    kinds = ours.layer_kinds()
    assert [k["mixer"] for k in kinds] == ["gated_delta", "gated_delta", "softmax", "gated_delta"]
    assert ours.net.cfg.positional == ("none" if case == "nope" else "rope")
    assert list(weights) == [2] and sorted(heads) == [0, 1, 3]
    for i, a in weights.items():
        dw = float((tr[tn.self_attn("decoder", i, "weights")] - a).abs().max())
        print(f"olmo_hybrid {case} layer {i}: attention weights max |diff| {dw:.3g}")
        assert dw < TOL
    for i, want in heads.items():
        got = tr[tn.mixer("decoder", i, "heads")]
        dh = float((got - want).abs().max())
        A, v = tr[tn.mixer("decoder", i, "weights")], tr[tn.mixer("decoder", i, "v")]
        dav = float((A @ v - got).abs().max()) / float(got.abs().max())
        print(f"olmo_hybrid {case} layer {i}: heads vs transformers {dh:.3g}; A @ v vs heads {dav:.3g} of the max")
        assert dh < TOL * max(1.0, float(want.abs().max()))
        assert dav < TOL
        assert float(A.triu(1).abs().max()) == 0.0
        assert A.shape == (6, len(ids), len(ids))


@pytest.mark.parametrize("case", list(CASES))
def test_beta_and_decays(zoo, case):
    """beta = 2 sigmoid(x W_b) from the mixer's input (norm1: these layers are pre-norm), and
    decays neither all ~0 nor all ~1."""
    hf, ours, tr, ids, _ = zoo(case)
    for i in ours.net.cfg.mixer_layers():
        m = ours.net.decoder[i].mixer
        x = tr[tn.norm("decoder", i, 1)]
        want = 2.0 * torch.sigmoid(x @ m.w_b.weight.detach().T).T
        beta = tr[tn.mixer("decoder", i, "beta")]
        assert float((beta - want).abs().max()) < 1e-5 and float(beta.max()) > 1.0
        keep = tr[tn.mixer("decoder", i, "decay")].exp()
        assert float(keep.min()) < 0.2 and float(keep.max()) > 0.9


@pytest.mark.parametrize("case", list(CASES))
def test_forms_agree(zoo, case):
    hf, ours, tr, ids, _ = zoo(case)
    worst = 0.0
    for i in ours.net.cfg.mixer_layers():
        m = ours.net.decoder[i].mixer
        with torch.no_grad():
            q, k, v, g, beta = m.rule_inputs(tr[tn.norm("decoder", i, 1)][None])
            a, sa = chunked_rule(q, k, v, g, beta, 8)
            b, sb = recurrent_rule(q, k, v, g, beta)
        worst = max(worst, float((a - b).abs().max()), float((sa - sb).abs().max()))
    print(f"olmo_hybrid {case}: chunked vs recurrent, max |diff| {worst:.3g}")
    assert worst < 1e-5


@pytest.mark.parametrize("case", list(CASES))
def test_generation_with_the_cache(zoo, case):
    hf, ours, tr, ids, _ = zoo(case)
    with_cache, without, theirs, d = greedy_three_ways(hf, ours, ids)
    print(f"olmo_hybrid {case}: greedy logits with the cache vs without, max |diff| {d:.3g}")
    assert with_cache == without == theirs and d < TOL


def test_norms_by_layer_kind(zoo):
    """The mixer layers record norm1 / norm2 and no post norms; the attention layer post_norm1 /
    post_norm2 and no norm before its sub-layers. The mixer panel's recomputation of g and beta
    (viz/inside/recurrence.py, from the mixer's actual input) matches the trace."""
    from viz.inside import recurrence
    from viz.inside.mixer_panel import mixer_input

    hf, ours, tr, ids, _ = zoo("nope")
    for i in range(4):
        names = ours.net.decoder[i].recorded_names()
        if i == 2:
            assert "post_norm1" in names and "post_norm2" in names and "norm1" not in names
            assert not ours.net.decoder[i].reads_norm
        else:
            assert "norm1" in names and "norm2" in names and not any(n.startswith("post_norm") for n in names)
            assert ours.net.decoder[i].reads_norm
        for n in names:
            assert tn.at("decoder", i, n) in tr, n
    for i in ours.net.cfg.mixer_layers():
        m = ours.net.decoder[i].mixer
        x = mixer_input(ours, tr, "decoder", i)
        assert torch.equal(x, tr[tn.norm("decoder", i, 1)])
        gates = recurrence.gated_delta_gates(x, m.w_a.weight, m.w_b.weight, m.A_log, m.dt_bias, m.beta_scale)
        for key, name in (("g", "decay"), ("beta", "beta")):
            got = tr[tn.mixer("decoder", i, name)].double().numpy()
            assert abs(gates[key] - got).max() < 1e-4 * max(1.0, abs(got).max()), (i, key)


def test_mixer_sublayer_norms_config():
    base = dict(kind="decoder", d_model=16, n_heads=2, d_ff=16, n_layers=2, tgt_vocab_size=10, norm="rmsnorm",
                norm_placement="pre", bias=False, layer_types=["linear_attention", "full_attention"],
                mixer={"kind": "gated_delta", "heads": 2, "d_k": 4, "d_v": 4, "conv": 2},
                pre_sublayer_norm=False, post_sublayer_norm=True)
    cfg = ModelConfig(**base, mixer_sublayer_norms=[True, False])
    assert cfg.sublayer_norms(0) == (True, False) and cfg.sublayer_norms(1) == (False, True)
    assert ModelConfig.from_dict(cfg.to_dict()).mixer_sublayer_norms == (True, False)
    assert ModelConfig(**base).sublayer_norms(0) == (False, True)  # without it: as every layer
    with pytest.raises(ValueError, match="pair"):
        ModelConfig(**base, mixer_sublayer_norms=(True,))
    with pytest.raises(ValueError, match="norm_placement 'pre'"):
        ModelConfig(**dict(base, norm_placement="post", pre_sublayer_norm=True, post_sublayer_norm=False),
                    mixer_sublayer_norms=(True, False))
    from core.net.model import Transformer
    with pytest.raises(ValueError, match="beta_scale must be positive"):
        Transformer(ModelConfig(**dict(base, mixer=dict(base["mixer"], beta_scale=0.0))))


HF = {"model_type": "olmo_hybrid", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
      "intermediate_size": 48, "num_hidden_layers": 4, "vocab_size": 50, "hidden_act": "silu",
      "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 8,
      "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4}


def test_config_defaults():
    """transformers' defaults: every 4th layer attention, RoPE at 10000 when nothing says
    otherwise, NoPE where rope_theta is null, beta up to 2, the gated norm's eps 1e-5."""
    from core.loaders.families import olmo_hybrid

    cfg = olmo_hybrid.config(HF)
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg.positional == "rope" and cfg.rope_theta == 10000.0
    assert cfg.mixer["beta_scale"] == 2.0 and cfg.mixer["norm_eps"] == 1e-5
    assert olmo_hybrid.config(dict(HF, num_hidden_layers=2)).layer_types == ["linear_attention", "full_attention"]
    for nope in ({"rope_theta": None}, {"rope_parameters": {"rope_type": "default", "rope_theta": None}}):
        assert olmo_hybrid.config(dict(HF, **nope)).positional == "none"
    assert olmo_hybrid.config(dict(HF, linear_allow_neg_eigval=False)).mixer["beta_scale"] == 1.0


@pytest.mark.parametrize("change, match", [({"hidden_act": "gelu"}, "hidden_act"),
                                           ({"attention_bias": True}, "attention biases"),
                                           ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
                                           ({"linear_num_value_heads": 5}, "multiple of linear_num_key_heads"),
                                           ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                 "partial_rotary_factor": 0.5}}, "partial rotary")])
def test_settings_refused(change, match):
    from core.loaders.checkpoint import CheckpointError
    from core.loaders.families import olmo_hybrid

    with pytest.raises(CheckpointError, match=match):
        olmo_hybrid.config(dict(HF, **change))


def test_transformers_names_load(zoo, tmp_path):
    """The checkpoint as transformers names its tensors in memory (conv1d whole, input_layernorm,
    post_attention_layernorm) loads to the same model as the stored OLMo-core names (q_conv1d,
    k_conv1d, v_conv1d; attention_layer_norm, feedforward_layer_norm) that save_pretrained writes."""
    import json
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    hf, ours, tr, ids, _ = zoo("nope")
    src = FOLDERS["nope"]
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        assert "model.layers.0.linear_attn.q_conv1d.weight" in f.keys()
        assert "model.layers.0.attention_layer_norm.weight" in f.keys()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    state = {k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.linear_attn.conv1d.weight" in state and "model.layers.0.input_layernorm.weight" in state
    save_file(state, str(tmp_path / "model.safetensors"))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "olmo_hybrid"
    again = core.load_model(str(tmp_path), device="cpu").trace(TEXT)
    assert torch.equal(again["logits"], tr["logits"])
