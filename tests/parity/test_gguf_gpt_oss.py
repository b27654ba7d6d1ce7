"""gpt-oss GGUF files written here as llama.cpp's convert_hf_to_gguf.py writes them (experts
transposed, gate and up de-interleaved into ffn_gate_exps / ffn_up_exps or fused gate-then-up,
sinks as attn_sinks, the router as ffn_gate_inp, YaRN and the window in the metadata), loaded by
core.load_model(path) and matched against the same checkpoint from its folder (every weight)
and transformers' eager forward (logits and every layer's weights within 1e-4); MXFP4 experts
against transformers holding the same dequantised experts; a wrong window or YaRN factor in the
header moves the output far past the tolerance; a truncated file and unsupported headers raise
errors that name the problem. (SmolLM3 GGUF: tests/parity/test_new_attention.py's
test_smollm3_gguf_matches_transformers.)"""

import json

import numpy as np
import pytest
import torch

import core
from core.loaders.checkpoint import CheckpointError
from hf_builders import build, hf_eager

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

TEXT = "the small dog sees the old cat near the river bank because it was tired"
TOL = 1e-4
FAR = 100 * TOL


def write_gguf(hf, tokenizer_json, path, fused=False, mxfp4=False, meta=None, drop=(), pre="default"):
    """The converter's layout; `meta` overrides header values (key suffix after "gpt-oss.")."""
    cfg = hf.config
    meta = dict({"sliding_window": cfg.sliding_window, "rope.scaling.factor": cfg.rope_parameters["factor"]},
                **(meta or {}))
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name("tiny-gpt-oss")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_sliding_window(meta["sliding_window"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(float(meta["rope.scaling.factor"]))
    w.add_rope_scaling_orig_ctx_len(int(cfg.rope_parameters["original_max_position_embeddings"]))
    for key, value in meta.items():
        if key not in ("sliding_window", "rope.scaling.factor"):
            w.add_float32(f"gpt-oss.{key}", value)
    tj = json.loads(tokenizer_json.read_text())
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_eos_token_id(vocab["<|endoftext|>"])
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[b + "post_attention_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        out[b + "attn_sinks.weight"] = sd[p + "self_attn.sinks"]
        for x, g in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")):
            for s in ("weight", "bias"):
                out[f"{b}{g}.{s}"] = sd[f"{p}self_attn.{x}_proj.{s}"]
        out[b + "ffn_gate_inp.weight"] = sd[p + "mlp.router.weight"]
        out[b + "ffn_gate_inp.bias"] = sd[p + "mlp.router.bias"]
        gate_up = sd[p + "mlp.experts.gate_up_proj"].swapaxes(-1, -2)  # (E, 2m, d), gate and up interleaved
        bias = sd[p + "mlp.experts.gate_up_proj_bias"]
        if fused:
            out[b + "ffn_gate_up_exps.weight"] = np.concatenate([gate_up[:, ::2], gate_up[:, 1::2]], axis=1)
            out[b + "ffn_gate_up_exps.bias"] = np.concatenate([bias[:, ::2], bias[:, 1::2]], axis=1)
        else:
            out[b + "ffn_gate_exps.weight"], out[b + "ffn_up_exps.weight"] = gate_up[:, ::2], gate_up[:, 1::2]
            out[b + "ffn_gate_exps.bias"], out[b + "ffn_up_exps.bias"] = bias[:, ::2], bias[:, 1::2]
        out[b + "ffn_down_exps.weight"] = sd[p + "mlp.experts.down_proj"].swapaxes(-1, -2)  # (E, d, m)
        out[b + "ffn_down_exps.bias"] = sd[p + "mlp.experts.down_proj_bias"]
    for name, t in out.items():
        if name in drop:
            continue
        t = np.ascontiguousarray(t, dtype=np.float32)
        if mxfp4 and name.endswith("_exps.weight"):
            w.add_tensor(name, gguf.quants.quantize(t, gguf.GGMLQuantizationType.MXFP4),
                         raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, its folder loaded by core, the folder)."""
    folder = tmp_path_factory.mktemp("gpt_oss")
    hf, folder = build("gpt_oss", folder)
    hf.save_pretrained(str(folder))
    return hf, core.load_model(str(folder), device="cpu"), folder


def _gap(hf, ours, text=TEXT):
    """(worst logit gap, worst weight gap over every layer) against transformers' eager forward."""
    tr = ours.trace(text)
    att, _, logits = hf_eager(hf, tr.meta["target_ids"])
    worst = max(float((tr[f"decoder.{i}.self_attn.weights"] - a).abs().max()) for i, a in enumerate(att))
    return float((tr["logits"] - logits).abs().max()), worst


@pytest.mark.parametrize("fused", [False, True])
def test_gpt_oss_gguf_is_the_folder_model(tiny, tmp_path, fused):
    hf, folder_model, folder = tiny
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "tiny-gpt-oss.gguf", fused=fused)
    ours = core.load_model(str(path), device="cpu")
    cfg, want = ours.config, folder_model.config
    assert ours.name == "tiny-gpt-oss.gguf" and ours.info["family"] == "gpt_oss"
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 2 and cfg.sliding_window == 6
    for f in ("rope_scaling", "moe", "attn_sinks", "layer_types", "bias", "qkv_bias", "out_bias", "rope_layout",
              "n_kv_heads", "d_head", "tgt_vocab_size", "max_len"):
        assert getattr(cfg, f) == getattr(want, f), f
    assert cfg.norm_eps == pytest.approx(want.norm_eps, rel=1e-6)  # GGUF holds it as float32
    assert ours.encode(TEXT).ids == folder_model.encode(TEXT).ids  # the vocabulary rebuilt from the header
    theirs = folder_model.net.state_dict()
    mine = ours.net.state_dict()
    assert mine.keys() == theirs.keys()
    for k, v in mine.items():
        assert torch.equal(v, theirs[k]), k  # F32 in, F32 out: every weight exactly the folder's
    logit_gap, weight_gap = _gap(hf, ours)
    assert logit_gap < TOL and weight_gap < TOL, (logit_gap, weight_gap)
    tr = ours.trace(TEXT)
    assert float(tr["decoder.3.self_attn.weights"].max()) > 2.0 / tr["decoder.3.self_attn.weights"].shape[-1]


def test_mxfp4_experts_match_transformers_on_the_dequantised_weights(tmp_path):
    """Experts written as MXFP4 (d and m multiples of 32): ours against transformers holding the
    values gguf's quantize-then-dequantize gives, so the loader's layout is checked on them."""
    from gguf.quants import dequantize, quantize

    hf, folder = build("gpt_oss", tmp_path / "hf", hidden_size=64, head_dim=16, intermediate_size=32)
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "mxfp4.gguf", mxfp4=True)
    mx = gguf.GGMLQuantizationType.MXFP4
    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert kinds["blk.0.ffn_gate_exps.weight"] == mx and kinds["blk.0.ffn_down_exps.weight"] == mx
    ours = core.load_model(str(path), device="cpu")
    with torch.no_grad():
        for layer in hf.model.layers:
            ex = layer.mlp.experts
            for p in (ex.gate_up_proj, ex.down_proj):  # round-trip along the rows the file quantises
                t = p.detach().float().numpy().swapaxes(-1, -2).copy()
                back = dequantize(quantize(t, mx), mx).swapaxes(-1, -2)
                assert np.abs(back - p.numpy()).max() > 1e-3  # MXFP4 really changed them
                p.copy_(torch.from_numpy(np.ascontiguousarray(back)))
    logit_gap, weight_gap = _gap(hf, ours)
    assert logit_gap < TOL and weight_gap < TOL, (logit_gap, weight_gap)


@pytest.mark.parametrize("meta", [{"sliding_window": 3}, {"rope.scaling.factor": 2.0}])
def test_a_wrong_header_value_moves_the_output(tiny, tmp_path, meta):
    hf, _, folder = tiny
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "wrong.gguf", meta=meta)
    logit_gap, weight_gap = _gap(hf, core.load_model(str(path), device="cpu"))
    assert max(logit_gap, weight_gap) > FAR, (meta, logit_gap, weight_gap)


def test_truncated_unsupported_and_incomplete_files_are_named(tiny, tmp_path):
    hf, _, folder = tiny
    good = write_gguf(hf, folder / "tokenizer.json", tmp_path / "good.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cut.gguf"):
        core.load_model(str(cut), device="cpu")
    bad = write_gguf(hf, folder / "tokenizer.json", tmp_path / "attn.gguf", meta={"rope.scaling.yarn_attn_factor": 2.0})
    with pytest.raises(CheckpointError, match="yarn_attn_factor"):
        core.load_model(str(bad), device="cpu")
    other = write_gguf(hf, folder / "tokenizer.json", tmp_path / "other.gguf")
    data = other.read_bytes()
    other.write_bytes(data.replace(b"gpt-oss", b"gpt-xyz"))  # every key and the architecture renamed alike
    with pytest.raises(CheckpointError, match=r"'gpt-xyz' is not supported; supported: .*gpt-oss"):
        core.load_model(str(other), device="cpu")
    less = write_gguf(hf, folder / "tokenizer.json", tmp_path / "less.gguf", drop=("blk.2.ffn_up_exps.bias",))
    with pytest.raises(CheckpointError, match=r"blk\.2\.ffn_up_exps\.bias"):
        core.load_model(str(less), device="cpu")


def test_gpt4o_pre_tokenizer_splits_as_o200k(tiny, tmp_path):
    """gpt-oss files name the "gpt-4o" pre-tokenizer: case runs split words, the contraction stays
    on its word, digits go in threes, a space before digits stands alone, '/' joins the next word."""
    hf, _, folder = tiny
    path = write_gguf(hf, folder / "tokenizer.json", tmp_path / "o200k.gguf", pre="gpt-4o")
    from core.loaders.gguf_reader import byte_bpe, open_gguf

    tk, info = byte_bpe(open_gguf(path))
    assert info["pre"] == "gpt-4o"
    pieces = [p for p, _ in tk.pre_tokenizer.pre_tokenize_str("HelloWorld's 12345 foo\n/bar")]
    assert pieces == ["Hello", "World's", "Ġ", "123", "45", "Ġfoo", "Ċ", "/bar"]
