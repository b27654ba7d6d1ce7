"""Hugging Face checkpoint folders, family by family, against transformers' own eager forward.

Each case builds a tiny random model with transformers (hf_builders), saves it with
save_pretrained (safetensors) and a tokenizer.json trained here, loads the folder through
core.load_model(path) and compares every layer's attention weights and the logits (decoders)
or the last hidden states and the masked-LM logits (encoders) for two sentences, to 1e-4.
"""

import json
import math

import pytest
import torch

import core
from core.loaders.checkpoint import CheckpointError
from core.net.positional import rope_inv_freq
from hf_builders import SENTENCES, build, hf_eager

pytest.importorskip("transformers")

TOL = 1e-4
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 10000.0}
CASES = {
    "bert": ("bert", {}),
    "roberta": ("roberta", {}),
    "distilbert": ("distilbert", {}),
    "gpt2-tied": ("gpt2", {}),
    "gpt2-untied": ("gpt2", {"tie_word_embeddings": False}),
    "llama-gqa-untied": ("llama", {}),  # 8 query heads, 2 key/value heads: 4 per group
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-rope-llama3": ("llama", {"rope_parameters": LLAMA3}),
    "llama-rope-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}}),
    "mistral-window4": ("mistral", {"sliding_window": 4}),
    "qwen2": ("qwen2", {"tie_word_embeddings": True}),
    # later families (core/loaders/families): QK-norm per head, d_k != d / H, GQA
    "qwen3": ("qwen3", {}),
    # norms after the sub-layers only, QK-norm over the whole projection
    "olmo2": ("olmo2", {}),
    # parallel block, partial rotary (4 of 10 features), fused per-head qkv, biases
    "gpt_neox-parallel": ("gpt_neox", {}),
    "gpt_neox-sequential-tied": ("gpt_neox", {"use_parallel_residual": False, "tie_word_embeddings": True}),
    # fused qkv and gate_up, partial rotary (6 of 10), GQA; a window shorter than the sentence
    "phi3": ("phi3", {}),
    "phi3-window4-tied": ("phi3", {"sliding_window": 4, "tie_word_embeddings": True, "partial_rotary_factor": 1.0}),
}


def load(folder):
    return core.load_model(str(folder), device="cpu")


def check_parity(hf, ours, sentences=SENTENCES):
    stack = "encoder" if ours.kind == "encoder" else "decoder"
    L = ours.config.n_layers
    for text in sentences:
        ids = ours.encode(text).ids
        tr = ours.trace(text)
        assert tr.meta.get("target_ids", ids) == ids
        att, hidden, logits = hf_eager(hf, ids)
        assert len(att) == L
        for i, a in enumerate(att):
            w = tr[f"{stack}.{i}.self_attn.weights"]
            assert w.shape == a.shape
            assert torch.allclose(w, a, atol=TOL), f"layer {i}: {float((w - a).abs().max())}"
        if stack == "encoder":
            h = tr[f"encoder.{L - 1}.out"]
            assert torch.allclose(h, hidden, atol=TOL), float((h - hidden).abs().max())
            assert torch.allclose(ours.mlm_logits(h), logits, atol=TOL)
        else:
            assert torch.allclose(tr["logits"], logits, atol=TOL), float((tr["logits"] - logits).abs().max())
        # not a vacuous match: the maps are far from uniform somewhere
        w = tr[f"{stack}.{L - 1}.self_attn.weights"]
        assert float(w.max()) > 2.0 / w.shape[-1]


@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_transformers(tmp_path, case):
    family, over = CASES[case]
    hf, folder = build(family, tmp_path / case, **over)
    hf.save_pretrained(str(folder))
    ours = load(folder)
    assert ours.name == case and ours.config.extra["family"] == family
    check_parity(hf, ours)


def test_gqa_tied_and_untied_are_what_they_say(tmp_path):
    hf, folder = build("llama", tmp_path / "untied")
    hf.save_pretrained(str(folder))
    m = load(folder)
    assert (m.config.n_heads, m.config.n_kv_heads) == (8, 2)
    assert m.net.out_proj.weight.data_ptr() != m.net.tgt_embed.tok.weight.data_ptr()
    hf2, folder2 = build("llama", tmp_path / "tied", tie_word_embeddings=True)
    hf2.save_pretrained(str(folder2))
    m2 = load(folder2)
    assert m2.net.out_proj.weight is m2.net.tgt_embed.tok.weight


def test_llama3_scaling_keeps_short_divides_long_and_blends_between():
    # d_k = 16: wavelengths 2 pi / f = 6.3, 19.9, 62.8, 199, ...; with original length 64,
    # low_freq_factor 1 and high_freq_factor 4: < 16 kept, > 64 divided by 8, between blended
    scaling = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    plain, scaled = rope_inv_freq(16, 10000.0), rope_inv_freq(16, 10000.0, scaling)
    assert scaled[0] == plain[0]
    assert torch.all((scaled[1:3] < plain[1:3]) & (scaled[1:3] > plain[1:3] / 8))
    assert torch.allclose(scaled[3:], plain[3:] / 8)
    assert torch.allclose(rope_inv_freq(8, 10000.0, {"type": "linear", "factor": 4.0}), rope_inv_freq(8, 10000.0) / 4)


def test_mistral_window_is_in_the_recorded_mask(tmp_path):
    hf, folder = build("mistral", tmp_path / "mistral", sliding_window=4)
    hf.save_pretrained(str(folder))
    m = load(folder)
    tr = m.trace(SENTENCES[0])
    mask = tr["decoder.0.self_attn.mask"]
    n = mask.shape[-1]
    assert n > 4
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    assert torch.all(torch.isinf(mask[(i - j >= 4) | (j > i)]))
    assert torch.all(mask[(i - j < 4) & (j <= i)] == 0)
    w = tr["decoder.1.self_attn.weights"]
    assert torch.all(w[:, (i - j >= 4)] == 0)


def test_bfloat16_sharded_checkpoint(tmp_path):
    import transformers as tf

    hf, folder = build("llama", tmp_path / "bf16")
    hf.to(torch.bfloat16).save_pretrained(str(folder), max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1
    ours = load(folder)
    assert ours.config.extra["checkpoint_dtypes"] == {"BF16": len(json.loads(
        (folder / "model.safetensors.index.json").read_text())["weight_map"])}
    assert next(ours.net.parameters()).dtype == torch.float32
    ref = tf.LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    check_parity(ref, ours)


def test_fill_mask_top_choice_is_transformers_argmax(tmp_path):
    hf, folder = build("bert", tmp_path / "bert")
    hf.save_pretrained(str(folder))
    m = load(folder)
    text = "the small [MASK] sees the cat"
    enc = m.encode(text)
    pos = enc.tokens.index("[MASK]")
    _, _, logits = hf_eager(hf, enc.ids)
    probs = torch.softmax(logits[pos], -1)
    fills = m.fill_mask(text, k=3)
    assert [f["position"] for f in fills] == [pos]
    assert fills[0]["top"][0][0] == m.tokenizer.token_str(int(probs.argmax()))
    assert math.isclose(fills[0]["top"][0][1], float(probs.max()), abs_tol=1e-5)
    tr = m.trace(text)
    assert tr.meta["fill_mask"][0]["position"] == pos
    assert tr.meta["fill_mask"][0]["top"][0][0] == fills[0]["top"][0][0]
    assert math.isclose(tr.meta["fill_mask"][0]["top"][0][1], fills[0]["top"][0][1], abs_tol=1e-5)


def test_pickle_only_folder_gets_the_convert_message(tmp_path, monkeypatch):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle")
    (folder / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load called"))
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*[Cc]onvert"):
        load(folder)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf, folder = build("llama", tmp_path / "broken")
    hf.save_pretrained(str(folder))
    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.1.self_attn.k_proj.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load(folder)


def test_mismatched_and_extra_tensors_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf, folder = build("gpt2", tmp_path / "bad")
    hf.save_pretrained(str(folder))
    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.0.mlp.c_fc.weight"] = state["transformer.h.0.mlp.c_fc.weight"][:, :10].contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"transformer\.h\.0\.mlp\.c_fc\.weight.*shape"):
        load(folder)
    hf.save_pretrained(str(folder))
    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.0.adapter.weight"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"transformer\.h\.0\.adapter\.weight"):
        load(folder)


def test_unknown_family_names_the_supported_ones(tmp_path):
    folder = tmp_path / "weird"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(CheckpointError) as err:
        load(folder)
    msg = str(err.value)
    assert "mamba" in msg
    for fam in ("bert", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2", "gpt_neox", "phi3", "qwen3",
                "olmo2"):
        assert fam in msg


def test_cli_trace_takes_a_path(tmp_path):
    from core.__main__ import main

    hf, folder = build("gpt2", tmp_path / "g")
    hf.save_pretrained(str(folder))
    out = tmp_path / "t.npz"
    assert main(["trace", "--model", str(folder), "--text", SENTENCES[0], "--out", str(out), "--device", "cpu"]) == 0
    assert out.stat().st_size > 0
    assert main(["trace", "--model", str(tmp_path / "nothing-here"), "--text", "x", "--out", str(out)]) == 2


def test_discover_lists_folders_and_gguf_one_level_deep(tmp_path):
    from core.loaders.local_models import discover

    root = tmp_path / "models"
    hf, folder = build("bert", root / "minilm")  # clashes with the registry name
    hf.save_pretrained(str(folder))
    (root / "notes").mkdir()  # not a model
    (root / "deeper" / "inner").mkdir(parents=True)
    found = discover(f"{root}{__import__('os').pathsep}{tmp_path / 'absent'}", taken=list(core.MODELS))
    assert list(found) == ["minilm-2"]
    m = found["minilm-2"]
    assert m.family == "bert" and m.path == folder and m.problem is None
    assert m.size.endswith("K") and m.label == f"minilm-2 (bert, {m.size})"


def test_seq2seq_families_go_to_hf_seq2seq(tmp_path, monkeypatch):
    import sys
    import types

    folder = tmp_path / "t5-small"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    calls = []
    fake = types.ModuleType("core.loaders.hf_seq2seq")
    fake.load = lambda f, device: calls.append((f, device)) or "seq2seq model"
    monkeypatch.setitem(sys.modules, "core.loaders.hf_seq2seq", fake)
    assert core.load_model(str(folder), device="cpu") == "seq2seq model"
    assert calls == [(folder, torch.device("cpu"))]
    from core.loaders.hf import supported_families

    assert {"marian", "bart", "t5"} <= set(supported_families())


def _traced(tmp_path, family, **over):
    hf, folder = build(family, tmp_path / family, **over)
    hf.save_pretrained(str(folder))
    m = load(folder)
    return hf, m, m.trace(SENTENCES[0])


@pytest.mark.parametrize("family,dims", [("qwen3", "head"), ("olmo2", "full")])
def test_qk_norm_is_recorded_before_and_after(tmp_path, family, dims):
    """q_pre_norm / k_pre_norm are the raw projections (split into heads); q_pre_rope is their
    RMSNorm, over each head's d_k features (qwen3) or the whole projection (olmo2)."""
    hf, m, tr = _traced(tmp_path, family)
    cfg = m.config
    x = tr["decoder.1.norm1"] if "decoder.1.norm1" in tr else tr.layer_input("decoder", 1)
    attn = hf.model.layers[1].self_attn
    with torch.no_grad():
        raw_q = attn.q_proj(x).view(-1, cfg.n_heads, cfg.d_head).transpose(0, 1)
        raw_k = attn.k_proj(x).view(-1, cfg.n_kv_heads, cfg.d_head).transpose(0, 1)
    assert torch.allclose(tr["decoder.1.self_attn.q_pre_norm"], raw_q, atol=1e-5)
    assert torch.allclose(tr["decoder.1.self_attn.k_pre_norm"], raw_k, atol=1e-5)
    with torch.no_grad():
        if dims == "head":
            want = attn.q_norm(raw_q)
        else:
            want = attn.q_norm(raw_q.transpose(0, 1).reshape(x.shape[0], -1)).view(-1, cfg.n_heads, cfg.d_head).transpose(0, 1)
    assert torch.allclose(tr["decoder.1.self_attn.q_pre_rope"], want, atol=1e-5)
    assert not torch.allclose(want, raw_q, atol=1e-2)  # the norm did something


def test_olmo2_has_post_norms_and_no_pre_norms(tmp_path):
    _, m, tr = _traced(tmp_path, "olmo2")
    names = tr.names("decoder.0.")
    assert "decoder.0.post_norm1" in names and "decoder.0.post_norm2" in names
    assert "decoder.0.norm1" not in names and "decoder.0.norm2" not in names
    x = tr.layer_input("decoder", 0)
    assert torch.allclose(tr["decoder.0.residual1"], x + tr["decoder.0.post_norm1"], atol=1e-6)
    assert torch.allclose(tr["decoder.0.residual2"], tr["decoder.0.residual1"] + tr["decoder.0.post_norm2"], atol=1e-6)


def test_gpt_neox_parallel_block_reads_the_layer_input_twice(tmp_path):
    hf, m, tr = _traced(tmp_path, "gpt_neox")
    assert m.config.parallel_block and m.config.rotary_dim == 4
    x = tr.layer_input("decoder", 1)
    ln2 = hf.gpt_neox.layers[1].post_attention_layernorm
    with torch.no_grad():
        assert torch.allclose(tr["decoder.1.norm2"], ln2(x), atol=1e-5)  # of x, not of residual1
    assert torch.allclose(tr["decoder.1.residual1"], x + tr["decoder.1.self_attn.out"], atol=1e-5)
    assert torch.allclose(tr["decoder.1.residual2"], x + tr["decoder.1.self_attn.out"] + tr["decoder.1.ffn.out"],
                          atol=1e-5)
    # partial rotary: the features past rotary_dim are not rotated
    assert torch.equal(tr["decoder.1.self_attn.q"][..., 4:], tr["decoder.1.self_attn.q_pre_rope"][..., 4:])
    assert not torch.allclose(tr["decoder.1.self_attn.q"][:, 1:, :4], tr["decoder.1.self_attn.q_pre_rope"][:, 1:, :4])


@pytest.mark.parametrize("family,over,match", [
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 3,
                                  "rope_theta": 10000.0}}, "longrope"),
    ("phi3", {"rope_parameters": None, "rope_scaling": {"type": "su", "short_factor": [1.0] * 3,
                                                        "long_factor": [2.0] * 3}}, "'su'"),
    ("qwen3", {"use_sliding_window": True}, "use_sliding_window"),
    ("gpt_neox", {"attention_bias": False}, "attention_bias"),
    ("olmo2", {"attention_bias": True}, "attention_bias"),
])
def test_later_family_settings_not_computed_are_refused(tmp_path, family, over, match):
    from core.loaders import families

    hf, folder = build(family, tmp_path / family)
    hf.save_pretrained(str(folder))
    hf_cfg = {**json.loads((folder / "config.json").read_text()), **over}
    with pytest.raises(CheckpointError, match=match):
        families.module(family).config(hf_cfg)
