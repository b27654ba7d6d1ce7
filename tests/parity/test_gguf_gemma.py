"""gemma2 / gemma3 GGUF files written here as llama.cpp's converter writes them (norm gains
stored as 1 + w, no lm_head when tied, W_q / W_k rows as they are, the window, soft-caps and RoPE
bases in the metadata), loaded by core.load_model(path) and matched against the same weights in
transformers' eager forward; and a SentencePiece vocabulary (tokens + scores) read back as the
tokenizer it came from."""

import json

import numpy as np
import pytest

import core
from core.loaders.checkpoint import CheckpointError
from gemma_builders import build
from hf_builders import CORPUS, SENTENCES
from test_hf_loaders import check_parity

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")


def write_gguf(hf, path, arch, vocab=None, scale=None, pattern=None, spm=None, drop=()):
    """vocab: tokenizer.json (byte-level BPE, written as 'gpt2'); spm: (tokens, scores, types, bos)."""
    cfg = hf.config
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)
    if scale is not None:
        w.add_attention_scale(scale)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    else:
        full, local = cfg.rope_parameters["full_attention"], cfg.rope_parameters["sliding_attention"]
        w.add_rope_freq_base(float(full["rope_theta"]))
        w.add_rope_freq_base_swa(float(local["rope_theta"]))
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(full["factor"]))
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if spm is None:
        tj = json.loads(vocab.read_text())
        ids = tj["model"]["vocab"]
        tokens = [t for t, _ in sorted(ids.items(), key=lambda kv: kv[1])]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
        w.add_eos_token_id(ids["<|endoftext|>"])
    else:
        tokens, scores, types, bos = spm
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(bos)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(True)
    for name, t in sd.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        g = name.replace("model.", "", 1)
        g = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}.get(g, g)
        for a, b in (("layers.", "blk."), (".self_attn.q_proj", ".attn_q"), (".self_attn.k_proj", ".attn_k"),
                     (".self_attn.v_proj", ".attn_v"), (".self_attn.o_proj", ".attn_output"),
                     (".self_attn.q_norm", ".attn_q_norm"), (".self_attn.k_norm", ".attn_k_norm"),
                     (".input_layernorm", ".attn_norm"), (".post_attention_layernorm", ".post_attention_norm"),
                     (".pre_feedforward_layernorm", ".ffn_norm"), (".post_feedforward_layernorm", ".post_ffw_norm"),
                     (".mlp.gate_proj", ".ffn_gate"), (".mlp.up_proj", ".ffn_up"), (".mlp.down_proj", ".ffn_down")):
            g = g.replace(a, b)
        if g in drop:
            continue
        if name.endswith("norm.weight"):  # llama.cpp's Gemma converter: gains stored as 1 + w
            t = t + 1.0
        w.add_tensor(g, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma2_gguf_matches_transformers(tmp_path):
    # query_pre_attn_scalar = head_dim: llama.cpp's rule for a file without attention.scale
    hf, folder = build("gemma2", tmp_path / "g2", query_pre_attn_scalar=12)
    path = write_gguf(hf, tmp_path / "tiny-gemma2.gguf", "gemma2", vocab=folder / "tokenizer.json")
    ours = core.load_model(str(path), device="cpu")
    cfg = ours.config
    assert ours.info["family"] == "gemma2" and cfg.layer_types == ["sliding_attention", "full_attention",
                                                                    "sliding_attention"]
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.sliding_window) == (4.0, 3.0, 4)
    check_parity(hf, ours)


def test_gemma3_gguf_matches_transformers(tmp_path):
    hf, folder = build("gemma3_text", tmp_path / "g3")
    path = write_gguf(hf, tmp_path / "tiny-gemma3.gguf", "gemma3", vocab=folder / "tokenizer.json",
                      scale=20 ** -0.5, pattern=[True, True, False, True])
    ours = core.load_model(str(path), device="cpu")
    cfg = ours.config
    assert (cfg.qk_norm, cfg.rope_theta_local, cfg.rope_scaling["factor"]) == ("head", 100.0, 2.0)
    check_parity(hf, ours)


def test_missing_and_unknown_tensors_are_named(tmp_path):
    hf, folder = build("gemma2", tmp_path / "g2", query_pre_attn_scalar=12)
    path = write_gguf(hf, tmp_path / "bad.gguf", "gemma2", vocab=folder / "tokenizer.json",
                      drop=("blk.1.post_ffw_norm.weight",))
    with pytest.raises(CheckpointError, match=r"blk\.1\.post_ffw_norm\.weight"):
        core.load_model(str(path), device="cpu")


def test_sentencepiece_vocabulary_reads_back_as_its_tokenizer(tmp_path):
    """A SentencePiece-style BPE (tokens scored by merge order, as sentencepiece scores them)
    written as tokenizer.ggml.model 'llama' tokenizes the sentences into the same ids as the
    tokenizer it came from, with the BOS the file asks for; the model on those ids matches
    transformers."""
    from tokenizers import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(CORPUS, vocab_size=180, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
    tj = json.loads(sp.to_str())
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    rank = {"".join(m.split(" ") if isinstance(m, str) else m): k for k, m in enumerate(tj["model"]["merges"])}
    scores = [-float(rank.get(t, 0)) for t in tokens]
    types = [3 if t in ("<pad>", "<eos>", "<bos>") else 2 if t == "<unk>" else 1 for t in tokens]
    hf, _ = build("gemma2", tmp_path / "g2", query_pre_attn_scalar=12, vocab_size=len(tokens))
    path = write_gguf(hf, tmp_path / "spm.gguf", "gemma2", spm=(tokens, scores, types, vocab["<bos>"]))
    ours = core.load_model(str(path), device="cpu")
    for text in SENTENCES:
        enc = ours.encode(text)
        assert enc.ids == [vocab["<bos>"]] + sp.encode(text).ids
        assert "".join(enc.tokens[1:]).strip() == text
    check_parity(hf, ours)
