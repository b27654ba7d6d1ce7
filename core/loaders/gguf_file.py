"""GGUF files of the llama, qwen2, qwen3, phi3 and smollm3 architectures, in our core (the general form of
what core/loaders/smollm2.py does for its one bundled file, whose loading is left as it is). Gemma files
are core/loaders/gguf_gemma.py's, gpt-oss files core/loaders/gguf_gpt_oss.py's.

    model = core.load_model("/models/tiny-llama.gguf")

The file is read through core/loaders/gguf_reader.py (the one GGUF reader, smollm2's too): every
tensor dequantised to float32 (gguf.quants.dequantize: F32, F16, BF16, Q8_0, Q4_*, ...), the
ModelConfig from the file's metadata ({arch}.* keys) and the tokenizer from the byte-level BPE
of tokenizer.ggml.* (model "gpt2"; pre-tokenizers default/gpt2, smollm, llama-bpe, qwen2, gpt-4o).
Nothing is cached on disk.

Weights (GGUF name -> ours; i = layer; Linear weights are (out, in) in both)

    token_embd            -> tgt_embed.tok
    output                -> out_proj            (absent: tied to token_embd)
    output_norm           -> decoder_norm
    blk.{i}.attn_norm     -> decoder.{i}.norms.0
    blk.{i}.attn_q/_k/_v  -> decoder.{i}.self_attn.w_q / w_k / w_v   (+ .bias: qwen2)
    blk.{i}.attn_q_norm / attn_k_norm -> decoder.{i}.self_attn.q_norm / k_norm  (qwen3: QK-norm per head)
    blk.{i}.attn_qkv      -> split into w_q, w_k, w_v (phi3: rows q, then k, then v)
    blk.{i}.attn_output   -> decoder.{i}.self_attn.w_o
    blk.{i}.ffn_norm      -> decoder.{i}.norms.1
    blk.{i}.ffn_gate/up/down -> decoder.{i}.ffn.w_1 / w_3 / w_2
    blk.{i}.ffn_up        -> split into w_1 (first half, the gate) and w_3 (phi3: gate_up fused)

RoPE layout: llama.cpp's converter permutes the rows of W_q and W_k of llama models so that
neighbouring features (2j, 2j+1) form the rotated pairs; we keep the rows and rotate
neighbours (rope_layout="interleaved"; see core/loaders/smollm2.py for why q . k is unchanged).
qwen2, qwen3 and phi3 files are not permuted (llama.cpp's NEOX rope): rope_layout="half".
smollm3 files are llama's (rows permuted) with no positions on every fourth layer (3, 7, ...), the rule
llama.cpp applies to the architecture (its files carry no key for it; transformers' default
no_rope_layer_interval is the same 4).
phi3's rope.dimension_count below the head's width is partial rotary (ModelConfig.rotary_dim);
its long-context files (rope_factors_long / _short tensors, longrope) are refused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from ..api import AttentionModel
from .checkpoint import CheckpointError
from ..net.config import ModelConfig
from .byte_bpe import ByteBPETokenizer
from .gguf_reader import (LAYER_MAP, byte_bpe, context_length, decoder_config, field, gguf_shape, net_from_state,
                          open_gguf, read_tensors)

ARCHS = ("llama", "qwen2", "qwen3", "phi3", "smollm3")
SMOLLM3_NOPE_STEP = 4  # llama.cpp's fixed rule for smollm3 files (no metadata key): every 4th layer has no RoPE
TOP_MAP = [("token_embd", "tgt_embed.tok"), ("output_norm", "decoder_norm"), ("output", "out_proj")]
FUSED_QKV = "blk.{i}.attn_qkv"  # phi3
QK_NORM_MAP = [("blk.{i}.attn_q_norm", "decoder.{i}.self_attn.q_norm"),
               ("blk.{i}.attn_k_norm", "decoder.{i}.self_attn.k_norm")]  # qwen3


def _reader(path: Path):
    return open_gguf(path, CheckpointError)


def describe_gguf(path: Path) -> Tuple[str, int]:
    """(architecture, parameter count) from the file's header."""
    r = _reader(path)
    n = 0
    for t in r.tensors:
        k = 1
        for s in t.shape:
            k *= int(s)
        n += k
    return str(field(r, "general.architecture", "?")), n


def config_from_gguf(reader, name: str) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch not in ARCHS:
        raise CheckpointError(f"{name}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHS)}, "
                              "gemma, gemma2, gemma3, gpt-oss")
    names = {t.name for t in reader.tensors}
    if arch == "phi3" and names & {"rope_factors_long.weight", "rope_factors_short.weight"}:
        raise CheckpointError(f"{name}: Phi-3 with longrope RoPE factors (rope_factors_long / _short, the long-context "
                              "files) is not supported")
    need, d, h, d_head = gguf_shape(reader, arch, where=f"{name}: ", error=CheckpointError, partial=arch == "phi3")
    scaling = None
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind == "linear":
        scaling = {"type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise CheckpointError(f"{name}: RoPE scaling {kind!r} is not supported in GGUF files (only linear)")
    if "rope_freqs.weight" in names:
        raise CheckpointError(f"{name}: per-frequency RoPE factors (rope_freqs, Llama 3.1 scaling) are not supported in GGUF files")
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    ctx = context_length(reader, arch)
    rot = int(field(reader, f"{arch}.rope.dimension_count", d_head))
    window = field(reader, f"{arch}.attention.sliding_window") if arch == "phi3" else None
    n_layers = int(need("block_count"))
    nope = [i for i in range(n_layers) if (i + 1) % SMOLLM3_NOPE_STEP == 0] if arch == "smollm3" else []
    return decoder_config(
        reader, arch, need, d, h, d_head, ctx,
        tgt_vocab_size=int(field(reader, f"{arch}.vocab_size", len(tokens))),
        rope_scaling=scaling,
        rope_layout="interleaved" if arch in ("llama", "smollm3") else "half",
        nope_layers=nope or None,
        qkv_bias=arch == "qwen2",
        qk_norm="head" if arch == "qwen3" else None,
        rotary_dim=rot if rot < d_head else None,
        sliding_window=int(window) if window else None,
        tie_embeddings="output.weight" not in names,
        extra={"family": arch, "context_length": ctx, "gguf_name": field(reader, "general.name")},
    )


def weights_from_gguf(reader, cfg: ModelConfig, name: str) -> Dict[str, torch.Tensor]:
    """Every tensor dequantised to float32 and renamed (rows as in the file; phi3's fused qkv and
    gate_up split by rows); errors name unmapped, missing and mis-shaped tensors."""
    arch = cfg.extra["family"]
    table = {a + ".weight": b + ".weight" for a, b in TOP_MAP}
    for i in range(cfg.n_layers):
        for a, b in LAYER_MAP + (QK_NORM_MAP if cfg.qk_norm else []):
            table[a.format(i=i) + ".weight"] = b.format(i=i) + ".weight"
        if cfg.qkv_bias:
            for p in ("q", "k", "v"):
                table[f"blk.{i}.attn_{p}.bias"] = f"decoder.{i}.self_attn.w_{p}.bias"
        if arch == "phi3":  # fused: read under a name of their own, split below
            for p in ("q", "k", "v"):
                del table[f"blk.{i}.attn_{p}.weight"]
            del table[f"blk.{i}.ffn_gate.weight"]
            table[FUSED_QKV.format(i=i) + ".weight"] = f"fused.{i}.qkv"
            table[f"blk.{i}.ffn_up.weight"] = f"fused.{i}.gate_up"
    with torch.device("meta"):
        from ..net.model import Transformer

        shapes = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    q, kv, m, d = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.d_ff, cfg.d_model
    for i in range(cfg.n_layers):
        shapes[f"fused.{i}.qkv"], shapes[f"fused.{i}.gate_up"] = (q + 2 * kv, d), (2 * m, d)
    out = read_tensors(reader, table, CheckpointError, f"{name}: ", shapes,
                       optional={"out_proj.weight"} if cfg.tie_embeddings else ())
    for i in range(cfg.n_layers):
        if f"fused.{i}.qkv" in out:
            t = out.pop(f"fused.{i}.qkv")
            out[f"decoder.{i}.self_attn.w_q.weight"] = t[:q].clone()
            out[f"decoder.{i}.self_attn.w_k.weight"] = t[q:q + kv].clone()
            out[f"decoder.{i}.self_attn.w_v.weight"] = t[q + kv:].clone()
            t = out.pop(f"fused.{i}.gate_up")
            out[f"decoder.{i}.ffn.w_1.weight"], out[f"decoder.{i}.ffn.w_3.weight"] = t[:m].clone(), t[m:].clone()
    return out


def tokenizer_from_gguf(reader, name: str):
    """(tokenizers.Tokenizer, info) for a byte-level BPE GGUF vocabulary."""
    return byte_bpe(reader, CheckpointError, f"{name}: ")


def load_gguf(path, device=None, name: Optional[str] = None, progress=None) -> AttentionModel:
    """A llama / qwen2 / qwen3 / phi3 GGUF file as an AttentionModel (decoder)."""
    from .masked_lm import local_model

    path = Path(path)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    say("reading the GGUF header")
    reader = _reader(path)
    cfg = config_from_gguf(reader, path.name)
    say(f"dequantising {len(reader.tensors)} tensors to float32")
    state = weights_from_gguf(reader, cfg, path.name)
    tk, info = tokenizer_from_gguf(reader, path.name)
    net = net_from_state(cfg, state, path.name, CheckpointError)
    n = sum(p.numel() for p in net.parameters())
    tok = ByteBPETokenizer(tk, info, max_len=cfg.max_len)
    say("ready")
    family = cfg.extra["family"]
    return local_model(name or path.name, net, tok, device, f"{family} GGUF file {path.name}", path, family, n, t0,
                       "decoder", end_id=info.get("eos_id"))
