"""One head's map and pooled maps (core/head_maps.py, Trace.head / Trace.pooled): parity with
the full maps of the explicit re-run at short lengths, on every masking the core has
(look-ahead, sliding window, key padding, grouped-query heads), and the memory rule at a long
length (no tensor larger than one head's tile is made)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.api import AttentionModel
from core.head_maps import LayerMaps, TILE_ROWS, pool_full, profiles
from core.net.config import ModelConfig
from core.net.model import Transformer


def tiny_llama(max_len: int = 4096, window=None, n_layers: int = 2, seed: int = 0) -> AttentionModel:
    """A random Llama-shaped decoder (grouped-query: 4 query heads on 2 kv heads) with a long context."""
    torch.manual_seed(seed)
    cfg = ModelConfig(kind="decoder", d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_ff=64, n_layers=n_layers,
                      tgt_vocab_size=97, max_len=max_len, positional="rope", rope_theta=10000.0, norm="rmsnorm",
                      norm_placement="pre", activation="swiglu", bias=False, final_norm=True,
                      sliding_window=window)
    net = Transformer(cfg)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.3)
    return AttentionModel("tiny-llama", net, _Ids(), device=torch.device("cpu"))


class _Ids:
    """A tokenizer stand-in: token i is spelled str(i) (the tests pass ids, never text)."""

    def token_str(self, i):
        return str(int(i))


def trace_ids(model, ids, src=False):
    tensors, _, runner = model._run_traced(ids, None) if src else model._run_traced(None, ids)
    toks = [str(i) for i in ids]
    return model._finish(tensors, {"source": toks, "target": toks}, {"model": model.name,
                                                                      "config": model.config.to_dict()}, runner)


def fresh(trace):
    from core.head_maps import derived

    trace._cache.clear()
    derived(trace).clear()
    return trace


@pytest.mark.parametrize("window", [None, 5])
def test_head_and_pooled_equal_the_full_map(window):
    model = tiny_llama(window=window)
    ids = torch.randint(0, 97, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    tr = trace_ids(model, ids)
    for layer in (0, 1):
        for what in ("scores", "scaled", "masked", "weights"):
            name = f"decoder.{layer}.self_attn.{what}"
            full = tr.recomputed(name)  # the explicit re-run of the whole layer
            for h in (0, 3):
                fresh(tr)
                one = tr.head(name, h)
                assert one.shape == full[h].shape
                ok = torch.isfinite(full[h])
                assert torch.equal(ok, torch.isfinite(one))
                assert (one[ok] - full[h][ok]).abs().max() < 1e-5
            for size in (1, 7, 64, 128, 400):
                fresh(tr)
                p = tr.pooled(name, size=size, heads=[0, 3])
                nb = math.ceil(300 / size)
                assert p.shape == (2, nb, nb)
                for j, h in enumerate((0, 3)):
                    off = torch.isinf(tr.recomputed(f"decoder.{layer}.self_attn.mask"))  # the layer's own mask
                    ref = pool_full(full[h].masked_fill(off, float("-inf")) if what != "weights" else full[h], size,
                                    what)  # block means of the full map, its masked cells left out
                    fin = torch.isfinite(ref)
                    assert torch.equal(fin, torch.isfinite(p[j]))
                    assert (p[j][fin] - ref[fin]).abs().max() < 1e-5 * max(1.0, ref[fin].abs().max().item())


def test_pooled_rules_by_hand():
    """The contract's rules on a map small enough to write out: masked cells count 0 in
    weights and are left out of the means of scores (a block with none allowed is -inf)."""
    model = tiny_llama()
    tr = trace_ids(model, list(range(5)))
    w = tr.recomputed("decoder.0.self_attn.weights")[1]
    s = tr.recomputed("decoder.0.self_attn.scores")[1]
    pw = fresh(tr).pooled("decoder.0.self_attn.weights", size=2, heads=[1])[0]
    assert pw[0, 0] == pytest.approx(float(w[0, 0] + w[1, 0] + w[1, 1]) / 4, abs=1e-6)  # w[0, 1] = 0 counted
    assert pw[0, 1] == 0 and pw[2, 2] == pytest.approx(float(w[4, 4]), abs=1e-6)
    ps = fresh(tr).pooled("decoder.0.self_attn.scores", size=2, heads=[1])[0]
    assert ps[0, 0] == pytest.approx(float(s[0, 0] + s[1, 0] + s[1, 1]) / 3, abs=1e-5)  # s[0, 1] left out
    assert ps[0, 1] == float("-inf")  # every cell of the block is after its query


def test_encoder_padding_and_bundled_models(minilm):
    """An encoder with padded keys (columns -inf in every row) and grouped heads of the real model."""
    tr = minilm.trace("the bank of the river was steep and muddy", pad_to=16)
    for what in ("weights", "masked"):
        name = f"encoder.2.self_attn.{what}"
        full = tr.recomputed(name)
        fresh(tr)
        p = tr.pooled(name, size=3)
        for h in range(full.shape[0]):
            ref = pool_full(full[h], 3, what)
            fin = torch.isfinite(ref)
            assert torch.equal(fin, torch.isfinite(p[h]))
            assert (p[h][fin] - ref[fin]).abs().max() < 1e-5
        fresh(tr)
        assert (tr.head(name, 5)[torch.isfinite(full[5])] - full[5][torch.isfinite(full[5])]).abs().max() < 1e-5


def test_a_weights_read_runs_no_more_than_the_weights(minilm):
    """trace[...weights] computes the layer up to its softmax alone (no values, W_o or FFN):
    nothing else of the layer is made, and the weights equal the explicit re-run's."""
    tr = minilm.trace("the cat sat on the mat")
    called = []
    real = tr.runner.layer
    tr.runner.layer = lambda *a, **k: called.append(a) or real(*a, **k)
    w = tr["encoder.3.self_attn.weights"]
    assert not called
    assert torch.equal(w, tr.recomputed("encoder.3.self_attn.weights"))


def test_profiles_match_the_full_maps():
    model = tiny_llama()
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    tr = trace_ids(model, ids)
    prof = profiles(tr, "decoder", size=16)
    for layer in (0, 1):
        w = tr.recomputed(f"decoder.{layer}.self_attn.weights").double()
        n = w.shape[-1]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        dist = (i - j).abs().double()
        ent = -(torch.special.xlogy(w, w).sum(-1).mean(-1)) / math.log(2)
        ref = {"distance": (w * dist).sum(-1).mean(-1), "first": w[:, :, 0].mean(-1),
               "local": (w * (dist < 64)).sum(-1).mean(-1), "entropy": ent,
               "self": torch.diagonal(w, dim1=-2, dim2=-1).mean(-1),
               "previous": torch.diagonal(w, offset=-1, dim1=-2, dim2=-1).mean(-1),
               "first_later": w[:, 1:, 0].mean(-1)}
        for k, v in ref.items():
            assert torch.allclose(prof[k][layer], v, atol=1e-5, rtol=1e-5), k


class LargestTensor(TorchDispatchMode):
    """The largest tensor any torch operation makes while it is on (bytes of its storage)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def test_one_heads_pooled_map_never_makes_more_than_one_heads_tile():
    """At 4,096 tokens one head's map is 64 MB; reading its pooled map makes no tensor larger
    than one head's tile (TILE_ROWS x n floats, 2 MB), and the full read does (the check can fail)."""
    n = 4096
    model = tiny_llama(max_len=n, n_layers=1)
    ids = torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(3)).tolist()
    tr = trace_ids(model, ids)
    tile = TILE_ROWS * n * 4
    with LargestTensor() as seen:
        p = tr.pooled("decoder.0.self_attn.weights", size=128, heads=[2])
    assert p.shape == (1, 32, 32)
    assert 0 < seen.largest <= tile, (seen.largest, tile)
    with LargestTensor() as seen:
        LayerMaps(tr, "decoder", 0).head(1, "weights")  # one head whole: n x n, and no more
    assert seen.largest <= n * n * 4
    with LargestTensor() as seen:
        tr["decoder.0.self_attn.weights"]  # every head at once
    assert seen.largest >= 4 * n * n * 4


def test_span_mass_and_blocks_equal_the_full_map():
    from core.analysis.spans import block, span_mass

    model = tiny_llama()
    ids = torch.randint(0, 97, (300,), generator=torch.Generator().manual_seed(4)).tolist()
    tr = trace_ids(model, ids)
    name = "decoder.1.self_attn.weights"
    full = tr.recomputed(name).double()
    span_of = [0] * 40 + [1] * 100 + [2] * 1 + [3] * 159
    for heads in (2, [0, 3], None):
        hs = [heads] if isinstance(heads, int) else list(range(4)) if heads is None else heads
        w = full[hs].mean(0)
        fresh(tr)
        got = span_mass(tr, name, span_of, heads)
        edges = [0, 40, 140, 141, 300]
        ref = torch.tensor([[w[edges[a]:edges[a + 1], edges[b]:edges[b + 1]].sum(1).mean() for b in range(4)]
                            for a in range(4)])
        assert torch.allclose(got, ref, atol=1e-6)
        assert torch.allclose(got.sum(1), torch.ones(4, dtype=torch.float64), atol=1e-6)
        fresh(tr)
        z = block(tr, name, (130, 260), (5, 200), heads)
        assert torch.allclose(z.double(), w[130:260, 5:200], atol=1e-6)


def test_long_paths_of_rollout_and_head_scores_agree_with_the_full_maps(minilm, monkeypatch):
    """Rollout in blocks of one token is the rollout; head scores read from the tile profiles
    (the path past LONG_LAYER_BYTES) equal those read from the full maps."""
    import numpy as np

    import core.head_maps as hm
    from core.analysis import attention_flow
    from core.analysis import head_scoring as hs

    tr = minilm.trace("the bank of the river was steep and the water was cold and deep")
    assert np.abs(attention_flow.rollout(tr, "encoder") - attention_flow.rollout(tr, "encoder", size=1)).max() < 1e-9
    blocks = attention_flow.rollout(tr, "encoder", size=4)
    assert blocks.shape[1:] == (4, 4) and np.allclose(blocks.sum(-1), 1)
    cols = ["previous_token", "first_token", "self"]
    full = hs.head_scores(minilm, trace=tr)[cols].values
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    fresh(tr)
    tiled = hs.head_scores(minilm, trace=tr)[cols].values
    assert np.abs(full - tiled).max() < 1e-6
