"""The hook points of core/net/hooks.py: a value read at a point is the value the pass
computed, a value put there is what the rest of the pass continues from, and head ablation
(now a set of hook functions) still equals the explicit formula."""

import pytest
import torch

import core
from core.net.head_ablation import Ablation
from core.net.hooks import Hooks, attach, point
from core.net.recorder import Recorder


@pytest.fixture(scope="module")
def dec():
    return core.load_model("random", device="cpu", kind="decoder", n_layers=3, positional="rope",
                           norm="rmsnorm", norm_placement="pre", activation="swiglu", seed=3)


def _ids(model, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, model.config.tgt_vocab_size, (1, n), generator=g)


def _logits(model, ids, rec=None):
    with torch.inference_mode():
        return model.net.project(model.net.decode(ids, rec=rec))


def test_reading_a_point_gives_the_recorded_value_and_changes_nothing(dec):
    ids = _ids(dec)
    seen = {}
    plain = _logits(dec, ids)
    hooked = _logits(dec, ids, Hooks({"decoder.1.ffn.out": lambda t: seen.setdefault("v", t.clone()) * 1}))
    assert torch.equal(plain, hooked)
    rec = Recorder(names={"decoder.1.ffn.out"}, maps=False)
    _logits(dec, ids, rec)
    assert torch.allclose(seen["v"][0], rec.tensors["decoder.1.ffn.out"], atol=0, rtol=0)


def test_patching_the_whole_stream_entering_a_layer_gives_the_other_runs_output(dec):
    clean, corrupt = _ids(dec, seed=1), _ids(dec, seed=2)
    rec = Recorder(names={"decoder.1.out"}, maps=False)
    clean_logits = _logits(dec, clean, rec)
    stream = rec.tensors["decoder.1.out"][None]  # the input of layer 2 in the clean run
    patched = _logits(dec, corrupt, Hooks({"decoder.2.in": lambda t: stream}))
    assert torch.allclose(patched, clean_logits, atol=1e-5)
    # patching one position changes the output from that position on, never before it
    one = _logits(dec, corrupt, Hooks({"decoder.2.in": lambda t: torch.cat([t[:, :4], stream[:, 4:5], t[:, 5:]], 1)}))
    base = _logits(dec, corrupt)
    assert torch.equal(one[:, :4], base[:, :4])
    assert not torch.allclose(one[:, 4:], base[:, 4:])


def test_a_recorder_inside_hooks_sees_the_value_before_it_is_replaced(dec):
    ids = _ids(dec)
    rec = Recorder(names={"decoder.0.self_attn.heads", "decoder.0.self_attn.out"}, maps=True)
    _logits(dec, ids, Hooks({"decoder.0.self_attn.heads": torch.zeros_like}, inner=rec))
    assert rec.tensors["decoder.0.self_attn.heads"].abs().sum() > 0  # as computed
    bias = dec.net.decoder[0].self_attn.w_o.bias
    expect = torch.zeros_like(rec.tensors["decoder.0.self_attn.out"]) + (0 if bias is None else bias)
    assert torch.allclose(rec.tensors["decoder.0.self_attn.out"], expect)  # downstream of the hook


def test_embedding_point_carries_gradients(dec):
    ids = _ids(dec)
    e = dec.net.tgt_embed.tok(ids).detach().requires_grad_(True)
    logits = dec.net.project(dec.net.decode(ids, rec=Hooks({"embed.decoder.tokens": lambda t: e})))
    logits[0, -1, 5].backward()
    assert e.grad is not None and e.grad[0, -1].abs().sum() > 0


def test_ablation_through_hooks_equals_zeroing_by_hand(dec):
    ids = _ids(dec)
    intact = _logits(dec, ids)

    abl = Ablation([("decoder", 1, 0), ("decoder", 1, 2)])
    with torch.inference_mode():
        ours = dec.net.project(dec.net.decode(ids, ablate=abl))
    keep = torch.ones(dec.config.n_heads, 1, 1)
    keep[[0, 2]] = 0
    by_hand = _logits(dec, ids, Hooks({"decoder.1.self_attn.heads": lambda t: t * keep}))
    assert torch.allclose(ours, by_hand, atol=0)
    assert not torch.allclose(ours, intact)


def test_hooks_compose_and_refuse_a_wrong_shape(dec):
    ids = _ids(dec)
    two = attach(Hooks({"decoder.0.ffn.out": lambda t: t * 2}), {"decoder.0.ffn.out": lambda t: t * 3})
    six = _logits(dec, ids, Hooks({"decoder.0.ffn.out": lambda t: t * 6}))
    assert torch.allclose(_logits(dec, ids, two), six, atol=1e-5)
    with pytest.raises(ValueError, match="decoder.0.ffn.out"):
        _logits(dec, ids, Hooks({"decoder.0.ffn.out": lambda t: t[:, :1]}))
    assert point(None, "x", ids) is ids
