"""Mamba2 and the short convolution as token mixers of our network (core/net/mixer.py's kinds
"mamba2" and "short_conv"), on small random networks:

- a mixer layer has `mixer` (the kind named in cfg.mixer), records `{stack}.{i}.mixer.*` names
  that parse and print back, in the order recorded_names() says; Mamba2 blocks without an FFN
  (cfg.mixer["ffn"] False) have the sub-layer "mixer" alone;
- a trace lists the mixer layers (the short convolution's too, which has no heads) and reads
  the names it does not store by running the layer again;
- greedy decoding through the cache (the recurrent forms, one token at a time) gives the logits
  of the whole pass;
- layer_info says what each layer is: its mixer, its heads, its fixed-size state, its FFN.
"""

from __future__ import annotations

import pytest
import torch

import core
from core import trace_names as tn
from core.net.config import ModelConfig
from core.net.model import Transformer
from core.net.recorder import Recorder

BASE = dict(kind="decoder", d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_ff=48, n_layers=3, tgt_vocab_size=50,
            positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False, final_norm=True)
HYBRID = ["linear_attention", "full_attention", "linear_attention"]
MAMBA = {"kind": "mamba2", "heads": 4, "head_dim": 16, "d_state": 8, "groups": 2, "chunk": 8}
CONFIGS = {
    "mamba2+attention": dict(layer_types=HYBRID, mixer=MAMBA),
    "short_conv+attention": dict(layer_types=HYBRID, mixer={"kind": "short_conv", "conv": 3}),
    "mamba2 blocks": dict(layer_types=["linear_attention"] * 3, mixer=dict(MAMBA, ffn=False)),
}
N = 21


def _net(name: str) -> Transformer:
    torch.manual_seed(0)
    net = Transformer(ModelConfig(**BASE, **CONFIGS[name])).eval()
    with torch.no_grad():
        for layer in net.decoder:
            if layer.mixer is not None and layer.mixer.kind == "mamba2":
                layer.mixer.dt_bias.copy_(torch.linspace(-2.0, 1.0, 4))
                layer.mixer.A_log.copy_(torch.linspace(-1.0, 1.0, 4))
    return net


@pytest.mark.parametrize("name", list(CONFIGS))
def test_names_order_and_sublayers(name):
    net = _net(name)
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(1))
    rec = Recorder()
    with torch.no_grad():
        net(tgt=ids, rec=rec)
    for n in rec.tensors:
        p = tn.parse(n)  # a ValueError for a name the contract does not know
        if p.part == tn.MIXER:
            assert tn.mixer(p.stack, p.layer, p.step) == n
    layer = net.decoder[0]
    kind = CONFIGS[name]["mixer"]["kind"]
    assert layer.self_attn is None and layer.mixer.kind == kind
    mixer_names = [n.split(".")[-1] for n in rec.tensors if n.startswith("decoder.0.mixer.")]
    assert mixer_names == layer.mixer.recorded_names()
    assert layer.sublayers() == (["mixer"] if name == "mamba2 blocks" else ["mixer", "ffn"])
    layer_names = [n[len("decoder.0."):] for n in rec.tensors if n.startswith("decoder.0.")]
    assert layer_names == layer.recorded_names()
    if name == "mamba2 blocks":
        assert layer.ffn is None and not any(".ffn." in n for n in rec.tensors)
        assert net.layer_info("decoder")[0]["ffn"] == "none"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generation_with_the_cache(name):
    net = _net(name)
    ids = torch.randint(0, 50, (1, N), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = net.project(net.decode(ids))
        cache = {}
        steps = [net.project(net.decode(ids[:, :7], cache=cache))]
        for t in range(7, N):
            steps.append(net.project(net.decode(ids[:, t:t + 1], cache=cache)))
    d = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert d < 1e-4, f"cached vs full logits: {d:.2e}"
    state = cache[0]["mixer"]
    assert {k: tuple(v.shape[1:]) for k, v in state.items()} == net.decoder[0].mixer.state_shapes()


def test_trace_reads_mixer_layers():
    model = core.load_model("random", device="cpu", config=ModelConfig(**BASE, **CONFIGS["short_conv+attention"]),
                            seed=0)
    from bench.common import trace_from_ids

    ids = list(range(3, 3 + N))
    tr = trace_from_ids(model, ids, [str(i) for i in ids])
    assert tr.mixer_layers("decoder") == [0, 2] and tr.attention_kinds("decoder") == ["self_attn"]
    f = tr[tn.mixer("decoder", 0, "filter")]
    assert torch.equal(f, model.net.decoder[0].mixer.filter().detach())
    assert tr[tn.mixer("decoder", 2, "out")].shape == (N, BASE["d_model"])
    info = model.layer_kinds()
    assert [k["mixer"] for k in info] == ["short_conv", "softmax", "short_conv"]
    assert info[0]["heads"] == 0 and info[0]["state"] == {"conv": (BASE["d_model"], 2)}


def test_short_conv_has_no_head_map():
    net = _net("short_conv+attention")
    with pytest.raises(ValueError, match="no head map"):
        net.decoder[0].self_weights(torch.zeros(1, 4, BASE["d_model"]))


def test_embedding_multiplier_is_applied_and_said():
    """ModelConfig.embed_multiplier (GraniteMoeHybrid, Falcon-H1): the recorded token embeddings
    are the table's rows times it, and the Inside page's embedding step says so."""
    from bench.common import trace_from_ids
    from viz.inside.step_model import layer_steps, steps_by_key

    cfg = ModelConfig(**dict(BASE, n_layers=1), embed_multiplier=2.5)
    model = core.load_model("random", device="cpu", config=cfg, seed=0)
    ids = list(range(3, 3 + 6))
    tr = trace_from_ids(model, ids, [str(i) for i in ids])
    table = model.net.tgt_embed.tok.weight.detach()
    assert torch.allclose(tr[tn.embed("decoder", "tokens")], 2.5 * table[ids])
    step = steps_by_key(layer_steps(tr, "decoder", "self_attn", 0, 0, config=cfg))["x"]
    assert "2.5" in step.explain and "2.5" in step.latex_rows


def test_lfm2_config_names():
    """LFM2's config.json as Liquid AI writes it (block_ff_dim, full_attn_idxs, tie_embedding)
    reads as transformers reads it: the FFN width by its rounding rule, the attention layers."""
    from core.loaders.families import lfm2

    hf = {"model_type": "lfm2", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 50, "block_ff_dim": 96, "block_multiple_of": 32,
          "block_ffn_dim_multiplier": 1.0, "full_attn_idxs": [2], "tie_embedding": True, "conv_L_cache": 3,
          "norm_eps": 1e-5}
    cfg = lfm2.config(hf)
    assert cfg.d_ff == 64  # int(2 * 96 / 3) = 64, a multiple of 32
    assert cfg.layer_types == ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    assert cfg.tie_embeddings and cfg.mixer == {"kind": "short_conv", "conv": 3, "bias": False}
    assert lfm2.config(dict(hf, block_ff_dim=100)).d_ff == 96  # 66, up to a multiple of 32
