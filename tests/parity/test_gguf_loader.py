"""A llama-architecture GGUF written here with gguf's GGUFWriter (float32 tensors, W_q / W_k
rows permuted as llama.cpp's converter does), loaded by core.load_model(path) and matched
against the same weights run through transformers' LlamaForCausalLM (eager attention)."""

import json

import numpy as np
import pytest
import torch

import core
from core.loaders.checkpoint import CheckpointError
from hf_builders import SENTENCES, build, hf_eager

gguf = pytest.importorskip("gguf")
TOL = 1e-4


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (half -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf, tokenizer_json, path, drop=(), arch="llama", extra=None):
    """llama: q/k rows permuted (llama.cpp's LlamaModel); qwen2: rows as stored, with q/k/v biases;
    qwen3: rows as stored, with the per-head q/k norms (attn_q_norm, attn_k_norm) and key_length;
    phi3: the fused qkv_proj as attn_qkv and gate_up_proj as ffn_up, partial rope dimensions."""
    cfg = hf.config
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rot = int(d_head * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(rot)
    if d_head != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(d_head)
        w.add_value_length(d_head)
    if getattr(cfg, "sliding_window", None) and arch == "phi3":
        w.add_sliding_window(cfg.sliding_window)
    tj = json.loads(tokenizer_json.read_text())
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab["<|endoftext|>"])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names.update({p + "input_layernorm.weight": f"blk.{i}.attn_norm.weight",
                      p + "self_attn.q_proj.weight": f"blk.{i}.attn_q.weight",
                      p + "self_attn.k_proj.weight": f"blk.{i}.attn_k.weight",
                      p + "self_attn.v_proj.weight": f"blk.{i}.attn_v.weight",
                      p + "self_attn.o_proj.weight": f"blk.{i}.attn_output.weight",
                      p + "post_attention_layernorm.weight": f"blk.{i}.ffn_norm.weight",
                      p + "mlp.gate_proj.weight": f"blk.{i}.ffn_gate.weight",
                      p + "mlp.up_proj.weight": f"blk.{i}.ffn_up.weight",
                      p + "mlp.down_proj.weight": f"blk.{i}.ffn_down.weight"})
        if arch == "qwen2":
            names.update({p + f"self_attn.{x}_proj.bias": f"blk.{i}.attn_{x}.bias" for x in "qkv"})
        if arch == "qwen3":
            names.update({p + f"self_attn.{x}_norm.weight": f"blk.{i}.attn_{x}_norm.weight" for x in "qk"})
        if arch == "phi3":
            for x in ("q_proj", "k_proj", "v_proj"):
                del names[p + f"self_attn.{x}.weight"]
            del names[p + "mlp.gate_proj.weight"], names[p + "mlp.up_proj.weight"]
            names.update({p + "self_attn.qkv_proj.weight": f"blk.{i}.attn_qkv.weight",
                          p + "mlp.gate_up_proj.weight": f"blk.{i}.ffn_up.weight"})
    for hf_name, g_name in names.items():
        if g_name in drop:
            continue
        t = sd[hf_name]
        if arch in ("qwen2", "qwen3", "phi3"):
            pass
        elif g_name.endswith("attn_q.weight"):
            t = permute(t, cfg.num_attention_heads)
        elif g_name.endswith("attn_k.weight"):
            t = permute(t, cfg.num_key_value_heads)
        w.add_tensor(g_name, np.ascontiguousarray(t, dtype=np.float32))
    for g_name, t in (extra or {}).items():
        w.add_tensor(g_name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("tied", [False, True])
def test_llama_gguf_matches_transformers(tmp_path, tied):
    from tokenizers import Tokenizer

    hf, folder = build("llama", tmp_path / "hf", tie_word_embeddings=tied)
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "tiny-llama.gguf")
    ours = core.load_model(str(path), device="cpu")
    assert ours.name == "tiny-llama.gguf" and ours.config.rope_layout == "interleaved"
    assert (ours.config.n_heads, ours.config.n_kv_heads) == (8, 2)
    assert (ours.net.out_proj.weight is ours.net.tgt_embed.tok.weight) == tied
    reference_tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in SENTENCES:
        ids = ours.encode(text).ids
        assert ids == reference_tok.encode(text).ids  # the vocabulary rebuilt from the GGUF fields
        tr = ours.trace(text)
        att, _, logits = hf_eager(hf, ids)
        for i, a in enumerate(att):
            assert torch.allclose(tr[f"decoder.{i}.self_attn.weights"], a, atol=TOL), i
        assert torch.allclose(tr["logits"], logits, atol=TOL)


def test_qwen2_gguf_matches_transformers(tmp_path):
    hf, folder = build("qwen2", tmp_path / "hf")
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "tiny-qwen2.gguf", arch="qwen2")
    ours = core.load_model(str(path), device="cpu")
    assert ours.config.rope_layout == "half" and ours.config.qkv_bias
    for text in SENTENCES:
        ids = ours.encode(text).ids
        tr = ours.trace(text)
        att, _, logits = hf_eager(hf, ids)
        for i, a in enumerate(att):
            assert torch.allclose(tr[f"decoder.{i}.self_attn.weights"], a, atol=TOL), i
        assert torch.allclose(tr["logits"], logits, atol=TOL)


@pytest.mark.parametrize("arch,over", [
    ("qwen3", {}),  # QK-norm per head, d_k = 10 != d / H (key_length), GQA
    ("phi3", {"sliding_window": 4}),  # fused qkv and gate_up, partial rotary (6 of 10), a window
])
def test_later_gguf_architectures_match_transformers(tmp_path, arch, over):
    hf, folder = build(arch, tmp_path / "hf", **over)
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / f"tiny-{arch}.gguf", arch=arch)
    ours = core.load_model(str(path), device="cpu")
    assert ours.config.rope_layout == "half" and ours.config.extra["family"] == arch
    if arch == "qwen3":
        assert ours.config.qk_norm == "head" and ours.config.d_head == 10
    else:
        assert ours.config.rotary_dim == 6 and ours.config.sliding_window == 4
    for text in SENTENCES:
        ids = ours.encode(text).ids
        tr = ours.trace(text)
        att, _, logits = hf_eager(hf, ids)
        for i, a in enumerate(att):
            assert torch.allclose(tr[f"decoder.{i}.self_attn.weights"], a, atol=TOL), i
        assert torch.allclose(tr["logits"], logits, atol=TOL)


def test_phi3_long_context_gguf_is_refused(tmp_path):
    hf, folder = build("phi3", tmp_path / "hf")
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "long.gguf", arch="phi3",
                      extra={"rope_factors_long.weight": np.ones(3, dtype=np.float32),
                             "rope_factors_short.weight": np.ones(3, dtype=np.float32)})
    with pytest.raises(CheckpointError, match="longrope"):
        core.load_model(str(path), device="cpu")


def test_gguf_missing_tensor_and_describe(tmp_path):
    from core.loaders.gguf_file import describe_gguf

    hf, folder = build("llama", tmp_path / "hf")
    good = write_gguf(hf, folder / "tokenizer.json", tmp_path / "good.gguf")
    arch, n = describe_gguf(good)
    assert arch == "llama" and n == sum(p.numel() for p in hf.parameters())
    bad = write_gguf(hf, folder / "tokenizer.json", tmp_path / "bad.gguf", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(CheckpointError, match=r"blk\.1\.ffn_up\.weight"):
        core.load_model(str(bad), device="cpu")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF but not really")
    with pytest.raises(CheckpointError, match="junk.gguf"):
        core.load_model(str(junk), device="cpu")
