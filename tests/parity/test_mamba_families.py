"""The families whose token mixers are Mamba2 or a short convolution, against transformers'
torch code (no kernels) on tiny random checkpoints saved to a folder and loaded through
core.load_model:

- mamba2: a stack of Mamba2 blocks (no attention, no FFN);
- granitemoehybrid: Mamba2 and attention layers by layer_types, a dense FFN, and every
  multiplier away from 1 (embedding, residual (ours folded into each sub-layer's last
  projection, so a mixer's out is r times transformers'), attention, logits scaling); and the same
  with a mixture of 4 experts (top 2) beside the shared MLP (granitemoehybrid_moe);
- falcon_h1: attention and Mamba2 side by side in every layer, every muP multiplier away from
  1 (ours folded into the weights; a mixer's out is ssm_out_multiplier times transformers');
- lfm2: short gated convolutions and softmax attention with QK-norm, each with a SwiGLU FFN
  (its width by transformers' rounding rule); a convolution layer's out equals transformers'
  (hooked) and its filter is the checkpoint's, and the attention layer's weights equal
  transformers' eager attention maps;

Per family: the logits within 1e-4 of transformers'; layer_kinds() names each layer's mixer.
Per Mamba2 layer (the checks of tests/parity/test_mamba2_mixer.py, on the loaded model's own
trace): the mixer's out and heads equal transformers' (its mixer's output, and what it hands its
gated norm, read by hooks) within 1e-4; the implicit attention has nothing above the diagonal and
A @ v + skip rebuilds heads within 1e-4 of heads' largest entry.
"""

from __future__ import annotations

import pytest
import torch

import core
from core import trace_names as tn
from mixer_builders import build

tf = pytest.importorskip("transformers")

TEXT = "the small dog sees the old cat near the river bank because it was tired of walking"
TOL = 1e-4


def _hf_mixers(model):
    """transformers' Mamba2 mixers by layer index (the modules whose output and norm input we hook)."""
    found = {}
    for name, m in model.named_modules():
        if type(m).__name__ in ("Mamba2Mixer", "GraniteMoeHybridMambaLayer", "FalconH1Mixer", "Lfm2ShortConv"):
            found[int(name.split("layers.")[1].split(".")[0])] = m
    return found


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    cache = {}

    def get(family):
        if family not in cache:
            folder = tmp_path_factory.mktemp(family)
            hf, _ = build(family, folder)
            ours = core.load_model(str(folder), device="cpu")
            tr = ours.trace(TEXT)
            ids = torch.tensor([tr.meta["target_ids"]])
            seen, hooks = {}, []
            for i, m in _hf_mixers(hf).items():
                hooks.append(m.register_forward_hook(lambda mod, a, out, i=i: seen.__setitem__(("out", i), out[0])))
                if hasattr(m, "norm"):
                    hooks.append(m.norm.register_forward_pre_hook(
                        lambda mod, a, i=i: seen.__setitem__(("heads", i), a[0][0])))
            hf.config._attn_implementation = "eager"
            with torch.no_grad():
                out = hf(ids, output_attentions=family != "mamba2")
            logits = out.logits[0]
            seen["attentions"] = [None if a is None else a[0] for a in (getattr(out, "attentions", None) or [])]
            for h in hooks:
                h.remove()
            cache[family] = (hf, ours, tr, logits, seen)
        return cache[family]

    return get


@pytest.mark.parametrize("family", ["mamba2", "lfm2", "granitemoehybrid", "granitemoehybrid_moe", "falcon_h1"])
def test_logits_match_transformers(zoo, family):
    _, _, tr, logits, _ = zoo(family)
    ours = tr[tn.LOGITS]
    assert logits.abs().max() > 0.5
    assert (ours - logits).abs().max().item() < TOL


@pytest.mark.parametrize("family", ["mamba2", "granitemoehybrid", "granitemoehybrid_moe", "falcon_h1"])
def test_each_mamba2_layer(zoo, family):
    hf, ours, tr, _, seen = zoo(family)
    layers = [i for i, k in enumerate(ours.layer_kinds()) if "mamba2" in (k["mixer"], k.get("beside", {}).get("mixer"))]
    assert layers and layers == sorted(_hf_mixers(hf))
    for i in layers:
        m = ours.net.decoder[i].mixer
        heads = tr[tn.mixer("decoder", i, "heads")]  # (H, n, P)
        want = seen[("heads", i)].view(heads.shape[1], m.n_heads, -1).transpose(0, 1)
        assert (heads - want).abs().max().item() < TOL, f"layer {i} heads"
        # Granite's residual multiplier and Falcon-H1's ssm_out_multiplier, folded into our out_proj
        r = getattr(hf.config, "residual_multiplier", None) or getattr(hf.config, "ssm_out_multiplier", 1.0)
        assert (tr[tn.mixer("decoder", i, "out")] - r * seen[("out", i)]).abs().max().item() < TOL, f"layer {i} out"
        A = tr[tn.mixer("decoder", i, "weights")]
        assert A.triu(1).abs().max().item() == 0.0
        rebuilt = A @ tr[tn.mixer("decoder", i, "v")] + tr[tn.mixer("decoder", i, "skip")]
        assert (rebuilt - heads).abs().max().item() < TOL * heads.abs().max().item(), f"layer {i} A @ v + skip"


def test_mamba2_kinds(zoo):
    _, ours, tr, _, _ = zoo("mamba2")
    kinds = ours.layer_kinds()
    assert [k["mixer"] for k in kinds] == ["mamba2"] * 3 and {k["ffn"] for k in kinds} == {"none"}
    assert tr.mixer_layers("decoder") == [0, 1, 2] and tr.attention_kinds("decoder") == []


def test_lfm2_layers(zoo):
    hf, ours, tr, _, seen = zoo("lfm2")
    kinds = ours.layer_kinds()
    assert [k["mixer"] for k in kinds] == ["short_conv", "softmax", "short_conv", "short_conv"]
    assert kinds[1]["qk_norm"] == "head" and kinds[0]["state"] == {"conv": (24, 2)}
    assert ours.net.decoder[0].ffn.w_1.weight.shape[0] == 64  # int(2 * 80 / 3) = 53, up to a multiple of 16
    for i in (0, 2, 3):
        assert (tr[tn.mixer("decoder", i, "out")] - seen[("out", i)]).abs().max().item() < TOL
        filt = hf.model.layers[i].conv.conv.weight[:, 0, :]
        assert torch.equal(tr[tn.mixer("decoder", i, "filter")], filt.detach())
    attn = [a for a in seen["attentions"] if a is not None]
    assert len(attn) == 1
    assert (tr[tn.self_attn("decoder", 1, "weights")] - attn[0]).abs().max().item() < TOL


def test_granite_kinds_and_refusals(zoo, tmp_path):
    import json

    from core.loaders.checkpoint import CheckpointError

    _, ours, _, _, _ = zoo("granitemoehybrid")
    kinds = ours.layer_kinds()
    assert [k["mixer"] for k in kinds] == ["mamba2", "softmax", "mamba2"] and {k["ffn"] for k in kinds} == {"dense"}
    assert kinds[1]["positions"] == "rope" and ours.config.attn_scale == pytest.approx(0.3)
    _, moe, tr, _, _ = zoo("granitemoehybrid_moe")
    assert {(k["ffn"], k["experts"], k["top_k"]) for k in moe.layer_kinds()} == {("moe", 4, 2)}
    routes = tr[tn.ffn("decoder", 0, "router")].topk(2, dim=-1).indices
    assert len({tuple(sorted(r)) for r in routes.tolist()}) > 1  # tokens reach different experts
    _, folder = build("granitemoehybrid", tmp_path / "biased")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["attention_bias"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="attention biases"):
        core.load_model(str(folder), device="cpu")


def test_falcon_h1_side_by_side(zoo):
    """Every layer has the attention and the Mamba2 mixer on the same input: both recorded, the
    attention's weights equal transformers' eager maps, residual1 = x + mixer.out + self_attn.out,
    and cached generation (KV cache and the mixer's state) gives the uncached tokens and logits."""
    _, ours, tr, _, seen = zoo("falcon_h1")
    kinds = ours.layer_kinds()
    assert all(k["mixer"] == "softmax" and k["beside"]["mixer"] == "mamba2" for k in kinds)
    assert tr.mixer_layers("decoder") == [0, 1, 2] and tr.attention_kinds("decoder") == ["self_attn"]
    attn = [a for a in seen["attentions"] if a is not None]
    assert len(attn) == 3
    for i in range(3):
        assert (tr[tn.self_attn("decoder", i, "weights")] - attn[i]).abs().max().item() < TOL
        x = tr[tn.embed("decoder", "sum")] if i == 0 else tr[tn.out("decoder", i - 1)]
        parts = x + tr[tn.mixer("decoder", i, "out")] + tr[tn.self_attn("decoder", i, "out")]
        assert (parts - tr[tn.residual("decoder", i, 1)]).abs().max().item() < 1e-5
    names = [n.split(".", 2)[2] for n in tr.names("decoder.0.")]
    assert names.index("mixer.out") < names.index("self_attn.q") < names.index("residual1")
    ids, _, cached = ours.greedy_run("the small dog sees the cat", 4, use_cache=True)
    plain_ids, _, plain = ours.greedy_run("the small dog sees the cat", 4, use_cache=False)
    assert ids == plain_ids and (cached - plain).abs().max().item() < TOL


def test_mamba2_older_embedding_name(zoo, tmp_path):
    """A Mamba2 checkpoint whose table is saved as backbone.embedding (as transformers renames on
    load) gives the same logits."""
    from safetensors.torch import load_file, save_file

    _, ours, tr, _, _ = zoo("mamba2")
    _, folder = build("mamba2", tmp_path / "old")
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
    save_file(tensors, str(path), metadata={"format": "pt"})
    again = core.load_model(str(folder), device="cpu").trace(TEXT)
    assert torch.equal(again[tn.LOGITS], tr[tn.LOGITS])


def test_falcon_h1_inside_checks(zoo):
    """The Inside page's numpy reference (viz/figures/reference.py) recomputes a Falcon-H1 layer:
    its attention, residual1 (with the mixer's recorded output beside it) and the FFN match the
    trace; without the mixer's term residual1 would be off by the mixer's whole output."""
    from viz.figures.reference import reference_layer

    _, _, tr, _, _ = zoo("falcon_h1")
    for i in range(3):
        ref = reference_layer(tr, "decoder", i)
        for name in ("self_attn.out", "residual1", "ffn.out", "out"):
            got = tr[f"decoder.{i}.{name}"].double().numpy()
            assert abs(ref[name] - got).max() < 1e-4, (i, name)
        assert abs(tr[tn.mixer("decoder", i, "out")]).max() > 1e-2  # the term is there to miss
