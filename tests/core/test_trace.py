"""Traces: what a traced pass stores (O(n d) only), layers recomputed on access, decoder
steps as views of one pass, head ablation, save/load, and the app's byte-bounded trace
cache (viz.ui.cache.ByteLRU). No timings here: bench/trace_bench.py prints those."""

import pickle
import threading
import time

import pytest
import torch

import core
from core import trace_names as tn
from core import ModelConfig, Recorder
from core.trace import MAPS, Trace, nbytes_of
from viz.ui.cache import ByteLRU

PER_ATTN = ["q", "k", "v", "mask", "scores", "scaled", "masked", "weights", "value_norms", "heads", "out"]
TEXT = "the small dog sees the cat"


def _random(kind, seed=0, **kw):
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, kind=kind, max_len=64, **kw)
    return core.load_model("random", device="cpu", config=cfg, seed=seed)


def _cases():
    yield "encoder-decoder", _random("encoder-decoder"), {}
    yield "encoder-decoder, padded source", _random("encoder-decoder"), {"pad_to": 10}
    yield "encoder", _random("encoder"), {}
    yield "decoder, RoPE + grouped-query", _random("decoder", n_kv_heads=2, positional="rope",
                                                   norm="rmsnorm", norm_placement="pre", activation="swiglu"), {}


CASES = list(_cases())


def _explicit(model, trace, pad_to=None):
    """The whole pass on the explicit path in one go (every tensor recorded): an
    independent route to every name, to hold the recomputed layers against."""
    rec = Recorder()
    src = tgt = pad = None
    if model.kind != "decoder":
        src_ids = model.encode(TEXT).ids
        n = len(src_ids)
        if pad_to:
            pad = torch.tensor([[False] * n + [True] * (pad_to - n)])
            src_ids = list(src_ids) + [model.config.pad_id] * (pad_to - n)
        src = torch.tensor([src_ids])
    if model.kind != "encoder":
        tgt = torch.tensor([trace.meta["target_ids"]])
    with torch.inference_mode():
        model.net(src, tgt, src_pad=pad, rec=rec)
    return rec.tensors


@pytest.mark.parametrize("label,model,kw", CASES, ids=[c[0] for c in CASES])
def test_recomputed_layers_equal_an_all_explicit_pass(label, model, kw):
    tr = model.trace(TEXT, **kw)
    ref = _explicit(model, tr, kw.get("pad_to"))
    assert set(ref) - {"logits", "probs"} <= set(tr.names())
    for name, want in ref.items():
        got = tr[name]
        assert got.shape == want.shape, name
        assert torch.allclose(got, want, atol=1e-5, rtol=0, equal_nan=True), (name, (got - want).abs().max())
        if name.endswith(".mask"):  # -inf exactly where the explicit pass has it
            assert torch.equal(torch.isneginf(got), torch.isneginf(want)), name


@pytest.mark.parametrize("label,model,kw", CASES, ids=[c[0] for c in CASES])
def test_the_stored_stream_equals_the_rerun_layers_and_reruns_are_identical(label, model, kw):
    tr = model.trace(TEXT, **kw)
    for stack in tr.stacks():
        for i in range(tr.layers(stack)):
            stored = tr[tn.out(stack, i)]
            rerun = tr.recomputed(tn.out(stack, i))  # explicit path vs the fused one stored
            assert torch.allclose(rerun, stored, atol=1e-5, rtol=0), (stack, i)
            for kind in tr.attention_kinds(stack):
                heads = tn.attn(stack, i, kind, "heads")
                assert torch.allclose(tr.recomputed(heads), tr[heads], atol=1e-5, rtol=0)
    again = model.trace(TEXT, **kw)
    for name in tr.names():
        if name.endswith(MAPS) or name.endswith((".q", ".k", ".v", ".out")):
            assert torch.equal(tr[name], again[name]), name  # run to run: bit for bit


def test_a_trace_stores_only_what_grows_with_n_times_d():
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace(TEXT)
    stored = tr.stored_names()
    assert "encoder.0.out" in stored and "decoder.2.cross_attn.heads" in stored and "topk.ids" in stored
    assert not any(n.endswith(MAPS + (".mask", ".q", ".k", ".v")) for n in stored)
    assert not tr.is_stored("encoder.0.self_attn.weights") and "encoder.0.self_attn.weights" in tr
    n_src, n_tgt, d = len(tr.tokens("source")), len(tr.tokens("target")), model.config.d_model
    assert all(max(tr[n].shape) <= max(n_tgt, n_src, d, 10) for n in stored if n != "last.probs")
    for stack, kinds, n_layers in (("encoder", ["self_attn"], 3), ("decoder", ["self_attn", "cross_attn"], 3)):
        for i in range(n_layers):
            for kind in kinds:
                for s in PER_ATTN:
                    name = tn.attn(stack, i, kind, s)
                    assert name in tr and isinstance(tr[name], torch.Tensor), name
    assert tr.names("decoder.0.self_attn.") == [f"decoder.0.self_attn.{s}" for s in PER_ATTN]
    assert tr["probs"].shape == (n_tgt, model.config.tgt_vocab_size)
    assert torch.allclose(tr["probs"][-1], tr["last.probs"], atol=1e-6)
    assert torch.equal(tr["probs"][-1].topk(10).indices, tr["next.ids"])


def test_the_layer_cache_is_small_and_moving_between_heads_does_no_model_work():
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace(TEXT)
    calls = []
    real = tr._runner.layer
    tr._runner.layer = lambda *a: calls.append(a[1:]) or real(*a)
    for h in range(4):
        tr["encoder.1.self_attn.weights"][h]
        tr["encoder.1.self_attn.scores"][h]
    assert calls == [("encoder", 1)]
    for i in range(3):
        tr[tn.self_attn("decoder", i, "weights")]
    assert len(tr._cache) <= core.trace.LAYER_CACHE
    assert tr.nbytes() == nbytes_of([tr])  # the cache counts nothing


def test_each_layer_walks_the_stack_without_filling_the_cache():
    model = core.load_model("toy-translate", device="cpu")
    tr = model.trace(TEXT)
    maps = [d["self_attn.weights"] for d in tr.each_layer("encoder")]
    assert len(maps) == 3 and not tr._cache
    for i, w in enumerate(maps):
        assert torch.equal(w, tr[tn.self_attn("encoder", i, "weights")])


def test_save_load_and_pickle_keep_every_name(tmp_path):
    model = _random("encoder-decoder", seed=3)
    tr = model.trace(TEXT)
    path = tmp_path / "run.npz"
    tr.save(path)
    loaded = Trace.load(path)
    assert list(loaded) == list(tr)
    for n in tr:
        assert torch.equal(loaded[n], tr[n]), n
    assert loaded.tokens("target") == tr.tokens("target") and loaded.meta["model"] == "random"
    again = pickle.loads(pickle.dumps(tr))
    assert list(again) == list(tr) and torch.equal(again["decoder.1.cross_attn.masked"], tr["decoder.1.cross_attn.masked"])


def test_steps_are_views_of_one_pass_equal_to_step_by_step_passes():
    model = core.load_model("toy-translate", device="cpu")
    steps = model.steps(TEXT)
    assert nbytes_of(steps) == steps[0].nbytes()  # one pass shared by every step
    for s in steps[:4]:
        ids = s.meta["target_ids"]
        alone = model.trace(TEXT, target=" ".join(model.target_strings(ids[1:])))  # that prefix, traced alone
        assert alone.meta["target_ids"] == ids
        for name in ("decoder.1.self_attn.weights", "decoder.2.cross_attn.weights", "decoder.0.self_attn.mask",
                     "decoder.2.out", "embed.decoder.sum"):
            assert s[name].shape == alone[name].shape, name
            assert torch.allclose(s[name], alone[name], atol=1e-5, rtol=0), name
        assert torch.allclose(s["last.probs"], alone["last.probs"], atol=1e-5)
        assert s.tokens("next")[0] == s.meta["chosen"] == alone.tokens("next")[0]


def test_greedy_with_a_kv_cache_equals_greedy_without_one():
    model = _random("decoder", seed=5, n_kv_heads=2, positional="rope", norm="rmsnorm", norm_placement="pre")
    enc = model.encode(TEXT)
    cached, _ = model._greedy(None, list(enc.ids), 12)
    seq = list(enc.ids)
    with torch.inference_mode():
        for _ in range(12):
            seq.append(int(model.net(None, model._ids(seq))[0, -1].argmax()))
    assert cached == seq[len(enc.ids):]


# ------------------------------------------------------------------ ablation
def test_an_empty_ablation_is_exactly_the_plain_trace():
    model = core.load_model("toy-translate", device="cpu")
    plain, empty = model.trace(TEXT), model.trace(TEXT, ablate=[])
    assert plain.stored_names() == empty.stored_names()
    for n in plain.stored_names() + ["decoder.1.cross_attn.weights", "logits"]:
        assert torch.equal(plain[n], empty[n]), n


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_an_ablated_head_is_removed_before_w_o(mode):
    model = _random("encoder", seed=7)
    tr = model.trace(TEXT, ablate=[("encoder", 1, 2)], ablation=mode)
    heads = tr["encoder.1.self_attn.heads"].clone()  # H x n x d_k, before the ablation
    heads[2] = 0 if mode == "zero" else heads[2].mean(dim=0, keepdim=True)
    w_o = model.net.encoder[1].self_attn.w_o
    want = heads.transpose(0, 1).reshape(heads.shape[1], -1) @ w_o.weight.T + w_o.bias
    assert torch.allclose(tr["encoder.1.self_attn.out"], want, atol=1e-5)
    plain = model.trace(TEXT)
    assert torch.equal(plain["encoder.0.out"], tr["encoder.0.out"])  # upstream untouched
    assert not torch.allclose(plain["encoder.1.out"], tr["encoder.1.out"], atol=1e-3)
    assert tr.meta["ablate"] == [["encoder", 1, 2]] and tr.meta["ablation"] == mode


def test_bad_ablations_are_refused():
    model = _random("encoder")
    for bad in ([("middle", 0, 0)], [("encoder", 0, 0, "sideways")]):
        with pytest.raises(ValueError):
            model.trace(TEXT, ablate=bad)
    with pytest.raises(ValueError):
        model.trace(TEXT, ablate=[("encoder", 0, 0)], ablation="half")


# ------------------------------------------------------------------ recorders
def test_recorders_that_filter_or_keep_batches_record_tensors():
    model = _random("encoder")
    src = torch.randint(4, 40, (2, 5))
    rec = Recorder(names=["encoder.0.self_attn.scores", "encoder.0.self_attn.weights"], whole_batch=True)
    with torch.no_grad():
        model.net(src, rec=rec)
    assert set(rec.tensors) == {"encoder.0.self_attn.scores", "encoder.0.self_attn.weights"}
    assert rec.tensors["encoder.0.self_attn.scores"].shape == (2, 4, 5, 5)
    fast = Recorder(maps=False)
    with torch.no_grad():
        model.net(src, rec=fast)
    assert "encoder.0.self_attn.heads" in fast.tensors and not any(n.endswith(MAPS) for n in fast.tensors)
    plain = {}
    core.scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4),
                                      record=lambda n, t: plain.__setitem__(n, t))
    assert set(plain) == {"scores", "scaled", "masked", "weights"}  # a plain callable gets tensors


# ------------------------------------------------------------------ the app's trace cache
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
    model = _random("encoder")
    traces = [model.trace(" ".join([TEXT] * 6)) for _ in range(4)]
    one = traces[0].nbytes()
    c = ByteLRU(max_bytes=int(2.5 * one), size_of=lambda t: t.nbytes())
    for i, t in enumerate(traces):
        c.put(i, t)
    assert len(c) == 2 and c.nbytes <= 2.5 * one
    assert c.get(0) is None and c.get(3) is traces[3]


@pytest.mark.parametrize("label,model,kw", CASES, ids=[c[0] for c in CASES])
def test_the_weights_alone_are_bit_for_bit_the_full_rerun(label, model, kw):
    """each_layer's weights-only path (the model view's) runs the layer up to its softmax
    only, with the same operations: the same bits as the full explicit re-run."""
    tr = model.trace(TEXT, **kw)
    alone = {stack: [d["self_attn.weights"] for d in tr.each_layer(stack)] for stack in tr.stacks()}
    assert not tr._cache  # nothing was run through the full re-run
    for stack, maps in alone.items():
        for i, w in enumerate(maps):
            assert torch.equal(w, tr.recomputed(tn.self_attn(stack, i, "weights"))), (stack, i)  # the full re-run's


@pytest.mark.parametrize("label,model,kw", CASES + [
    ("encoder-decoder, T5 position bias", _random("encoder-decoder", positional="relative", norm="rmsnorm",
                                                  norm_placement="pre", bias=False), {}),
    ("decoder, soft-capped", _random("decoder", attn_softcap=5.0), {})], ids=lambda c: c if isinstance(c, str) else "")
@pytest.mark.parametrize("block_bytes", [1, 2**30], ids=["a head a block, scratch", "one block, in place"])
def test_the_weights_alone_by_blocks_of_heads_are_bit_for_bit_the_full_rerun(label, model, kw, block_bytes, monkeypatch):
    """On a CPU the weights-only path goes a block of heads at a time (core/net/attention.py):
    one head a block through a scratch block (what long inputs get) or every head in place in
    the result (short ones), the same bits as the full explicit re-run, masks, per-head
    position biases and soft-capping included."""
    import core.net.attention

    monkeypatch.setattr(core.net.attention, "HEADS_BLOCK_BYTES", block_bytes)
    tr = model.trace(TEXT, **kw)
    alone = {stack: [d["self_attn.weights"] for d in tr.each_layer(stack)] for stack in tr.stacks()}
    assert not tr._cache
    for stack, maps in alone.items():
        for i, w in enumerate(maps):
            want = tr.recomputed(tn.self_attn(stack, i, "weights"))  # the full explicit re-run's
            assert torch.equal(w, want), (stack, i)
            assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5)


def test_counting_heads_computes_no_map(toy, monkeypatch):
    """n_heads answers from the config (or the stored head outputs of a trace without one), never
    by running a layer again: the pages ask it on every run."""
    import core.layer_runner

    trace = toy.trace("the small dog sees the cat")

    def no_layer(*a, **k):
        raise AssertionError("a layer was computed to count heads")

    monkeypatch.setattr(core.layer_runner.LayerRunner, "layer", no_layer)
    assert trace.n_heads("encoder") == trace.n_heads("decoder") == toy.config.n_heads
    trace.meta.pop("config")
    assert trace.n_heads("decoder") == toy.config.n_heads  # from the stored decoder.0.self_attn.heads
