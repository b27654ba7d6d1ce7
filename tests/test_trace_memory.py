"""Memory: what a trace keeps (stored vs derived names), float16 attention maps, and the
app's byte-bounded trace cache (viz.cache.ByteLRU). No timings here: the benchmarks in
bench/ print those."""

import math
import pickle
import threading
import time

import pytest
import torch

import core
from core import ModelConfig, Recorder, Transformer
from core.trace import Derived, Trace, for_cache
from viz.cache import ByteLRU

PER_ATTN = ["q", "k", "v", "scores", "scaled", "mask", "masked", "weights", "heads", "out"]


# ------------------------------------------------------------------ helpers
def _model(kind="encoder-decoder", n_kv_heads=None, positional="sinusoidal", seed=0):
    cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, d_ff=64, n_layers=2, kind=kind,
                      src_vocab_size=40, tgt_vocab_size=40, positional=positional, max_len=64)
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def _traces(net, src=None, tgt=None, src_pad=None):
    """The same forward pass recorded lazily (derived names) and eagerly (every tensor)."""
    out = []
    for lazy in (True, False):
        rec = Recorder(lazy=lazy)
        with torch.inference_mode():
            net(src, tgt, src_pad=src_pad, rec=rec)
        out.append(Trace(rec.entries(), {"source": []}))
    return out


def _cases():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (1, 9), generator=g)
    tgt = torch.randint(4, 40, (1, 6), generator=g)
    pad = torch.tensor([[False] * 6 + [True] * 3])
    yield "encoder-decoder", _model(), dict(src=src, tgt=tgt)
    yield "encoder-decoder, padded source", _model(), dict(src=src, tgt=tgt, src_pad=pad)
    yield "encoder", _model("encoder"), dict(src=src)
    yield "decoder, RoPE + grouped-query", _model("decoder", n_kv_heads=2, positional="rope"), dict(tgt=tgt)


CASES = list(_cases())


# ------------------------------------------------------------------ stored vs derived
@pytest.mark.parametrize("label,net,inputs", CASES, ids=[c[0] for c in CASES])
def test_derived_names_equal_the_recorded_tensors(label, net, inputs):
    lazy, eager = _traces(net, **inputs)
    assert list(lazy) == list(eager)  # same names, same order
    derived = [n for n in lazy if lazy.is_derived(n)]
    assert derived and all(n.endswith((".scores", ".scaled", ".masked", ".mask")) or n == "probs" for n in derived)
    assert not any(lazy.is_derived(n) for n in lazy if n.endswith(".weights"))
    for name in eager:
        a, b = lazy[name], eager[name]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        # the same operations on the same values: equal (to float rounding at most)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, equal_nan=True, msg=name)


@pytest.mark.parametrize("label,net,inputs", CASES, ids=[c[0] for c in CASES])
def test_relations_hold_in_a_lazy_trace(label, net, inputs):
    tr, _ = _traces(net, **inputs)
    for base in {n.rsplit(".", 1)[0] for n in tr if n.endswith(".weights")}:
        q, k, mask = tr[f"{base}.q"], tr[f"{base}.k"], tr[f"{base}.mask"]
        scores, scaled, masked, w = (tr[f"{base}.{s}"] for s in ("scores", "scaled", "masked", "weights"))
        k_rep = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        assert torch.equal(scores, q @ k_rep.transpose(-2, -1)), base
        assert torch.equal(scaled, scores * (1 / math.sqrt(q.shape[-1]))), base  # exactly the forward's op
        torch.testing.assert_close(scaled, scores / math.sqrt(q.shape[-1]), rtol=1e-6, atol=1e-6)
        assert torch.equal(masked, scaled + mask), base
        torch.testing.assert_close(torch.softmax(masked, -1), w, rtol=0, atol=1e-6)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), rtol=0, atol=1e-6)
        assert (w[torch.isneginf(mask).expand_as(w)] == 0).all()


def test_a_lazy_trace_keeps_fewer_bytes_and_counts_shared_memory_once():
    net = _model("encoder")
    src = torch.randint(4, 40, (1, 30))
    lazy, eager = _traces(net, src=src)
    assert lazy.nbytes() < eager.nbytes()
    # eager: masked IS scaled (no mask) -- one block, counted once
    assert eager.stored("encoder.0.self_attn.masked").data_ptr() == eager.stored("encoder.0.self_attn.scaled").data_ptr()
    att = 2 * 4 * 30 * 30 * 4  # two layers of H x n x n float32 weights
    assert lazy.attention_nbytes() == att
    # post-norm: a layer's out IS its norm2 (one tensor, two names): counted once; the
    # sinusoidal positions are a slice of a 64-row table: counted as the slice
    assert lazy.stored("encoder.0.out").data_ptr() == lazy.stored("encoder.0.norm2").data_ptr()
    blocks = {lazy.stored(n).data_ptr(): lazy.stored(n).numel() * 4 for n in lazy if not lazy.is_derived(n)}
    assert lazy.nbytes() == sum(blocks.values())
    assert lazy.nbytes() < sum(lazy.stored(n).numel() * 4 for n in lazy if not lazy.is_derived(n))
    # derived names cost nothing and are not kept after reading them
    before = lazy.nbytes()
    _ = [lazy[n] for n in lazy]
    assert lazy.nbytes() == before
    assert lazy.derivation("encoder.1.self_attn.scores") == "encoder.1.self_attn.q @ encoder.1.self_attn.k^T"
    assert lazy.derivation("encoder.1.self_attn.weights") is None


def test_model_trace_is_lazy_and_every_design_name_reads_as_a_tensor():
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace("the small dog sees the cat")
    for stack, kinds, n_layers in (("encoder", ["self_attn"], 3), ("decoder", ["self_attn", "cross_attn"], 3)):
        for i in range(n_layers):
            for kind in kinds:
                for s in PER_ATTN:
                    name = f"{stack}.{i}.{kind}.{s}"
                    assert name in tr and isinstance(tr[name], torch.Tensor), name
                    assert tr.get(name) is not None
            assert tr.is_derived(f"{stack}.{i}.self_attn.scores")
    assert tr.is_derived("encoder.0.self_attn.mask")  # no padding: zeros on access
    assert not tr.is_derived("decoder.0.self_attn.mask")  # the causal mask is stored
    assert tr.names("decoder.0.self_attn.") == [f"decoder.0.self_attn.{s}" for s in
                                                 ["q", "k", "v", "mask", "scores", "scaled", "masked", "weights",
                                                  "heads", "out"]]


def test_save_load_and_pickle_keep_every_name(tmp_path):
    net = _model()
    g = torch.Generator().manual_seed(3)
    lazy, _ = _traces(net, src=torch.randint(4, 40, (1, 7), generator=g), tgt=torch.randint(4, 40, (1, 5), generator=g))
    path = tmp_path / "run.npz"
    lazy.save(path)
    loaded = Trace.load(path)
    assert list(loaded) == list(lazy)
    for n in lazy:
        assert torch.equal(loaded[n], lazy[n]), n
    again = pickle.loads(pickle.dumps(lazy))
    assert list(again) == list(lazy) and torch.equal(again["decoder.1.cross_attn.masked"], lazy["decoder.1.cross_attn.masked"])


def test_a_derived_name_needs_its_sources():
    with pytest.raises(ValueError, match="lacks"):
        Trace({"a.scores": Derived("qk", "a.q", "a.k")}, {})


def test_recorders_that_filter_or_keep_batches_record_tensors():
    net = _model("encoder")
    src = torch.randint(4, 40, (2, 5))
    rec = Recorder(names=["encoder.0.self_attn.scores", "encoder.0.self_attn.weights"], whole_batch=True)
    with torch.no_grad():
        net(src, rec=rec)
    assert not rec.derived and rec.tensors["encoder.0.self_attn.scores"].shape == (2, 4, 5, 5)
    plain = {}
    core.scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4),
                                      record=lambda n, t: plain.__setitem__(n, t))
    assert set(plain) == {"scores", "scaled", "masked", "weights"}  # a plain callable gets tensors


# ------------------------------------------------------------------ float16 attention maps
def test_half_attention_halves_the_maps_within_float16_rounding():
    net = _model()
    g = torch.Generator().manual_seed(4)
    tr, _ = _traces(net, src=torch.randint(4, 40, (1, 20), generator=g), tgt=torch.randint(4, 40, (1, 12), generator=g),
                    src_pad=torch.tensor([[False] * 16 + [True] * 4]))
    half = tr.to_half_attention()
    assert half.attention_nbytes() == tr.attention_nbytes() // 2
    assert half.nbytes() < tr.nbytes()
    assert list(half) == list(tr)
    for n in tr:
        if n.endswith(".weights"):
            w, w16 = tr[n], half[n]
            assert half.stored(n).dtype == torch.float16 and w16.dtype == torch.float32
            assert (w16 - w).abs().max() <= 2**-12  # half an ulp of float16 below 1
            assert (w16 - 1).abs().max() <= 1 and (w16 >= 0).all()
            torch.testing.assert_close(w16.sum(-1), torch.ones_like(w16.sum(-1)), rtol=0, atol=1e-3)
            assert (w16[w == 0] == 0).all()  # masked keys keep exactly 0
        else:
            assert torch.equal(half[n], tr[n]), n  # everything else untouched
    assert half.meta["half_attention"]
    assert for_cache(tr, half_attention=False) is tr
    assert for_cache(tr, half_attention=True).stored("encoder.0.self_attn.weights").dtype == torch.float16
    assert for_cache(tr, half_attention=True, min_tokens=10**6) is tr


# ------------------------------------------------------------------ the byte-bounded cache
class Blob:
    def __init__(self, n):
        self.n = n

    def nbytes(self):
        return self.n


def test_cache_evicts_least_recently_used_by_bytes():
    c = ByteLRU(max_bytes=100)
    c.put("a", Blob(40))
    c.put("b", Blob(40))
    assert c.get("a").n == 40  # a is now the most recent
    c.put("c", Blob(40))  # 120 > 100: the least recent (b) goes
    assert c.get("b") is None and c.get("a") is not None and c.get("c") is not None
    assert c.nbytes == 80 and len(c) == 2
    c.put("d", Blob(90))  # needs everything else out
    assert len(c) == 1 and c.nbytes == 90 and c.get("d") is not None


def test_cache_never_keeps_an_item_larger_than_its_budget():
    c = ByteLRU(max_bytes=100)
    c.put("small", Blob(10))
    c.put("huge", Blob(101))
    assert c.get("huge") is None and c.get("small") is not None and c.nbytes == 10
    calls = []
    v = c.get_or_compute("huge2", lambda: calls.append(1) or Blob(500))
    assert v.n == 500 and c.get("huge2") is None  # served, not kept


def test_cache_replacing_a_key_does_not_count_it_twice():
    c = ByteLRU(max_bytes=100)
    c.put("a", Blob(30))
    c.put("a", Blob(50))
    assert c.nbytes == 50 and len(c) == 1


def test_cache_entry_limit():
    c = ByteLRU(max_bytes=10**9, max_entries=3)
    for i in range(5):
        c.put(i, Blob(1))
    assert len(c) == 3 and c.get(0) is None and c.get(4) is not None


def test_concurrent_get_or_compute_computes_once():
    c = ByteLRU(max_bytes=10**6)
    calls = []
    lock = threading.Lock()

    def compute():
        with lock:
            calls.append(1)
        time.sleep(0.2)  # slow enough for every thread to arrive while it runs
        return Blob(10)

    start = threading.Barrier(8)
    got = []

    def worker():
        start.wait()
        got.append(c.get_or_compute("k", compute))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(got) == 8 and all(g is got[0] for g in got)
    assert c.misses == 1


def test_cache_bounds_real_traces_by_their_bytes():
    net = _model("encoder")
    traces = [_traces(net, src=torch.randint(4, 40, (1, 40)))[0] for _ in range(4)]
    one = traces[0].nbytes()
    c = ByteLRU(max_bytes=int(2.5 * one), size_of=lambda t: t.nbytes())
    for i, t in enumerate(traces):
        c.put(i, t)
    assert len(c) == 2 and c.nbytes <= 2.5 * one
    assert c.get(0) is None and c.get(3) is traces[3]
