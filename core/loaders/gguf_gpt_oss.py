"""gpt-oss GGUF files (llama.cpp's architecture "gpt-oss", as its convert_hf_to_gguf.py writes
them), in our core: the same network as core/loaders/families/gpt_oss.py builds from a checkpoint
folder (learned sinks, alternating sliding and full layers, YaRN, biases on q, k, v and o, a
mixture of experts with the clamped SwiGLU in every layer).

    model = core.load_model("/models/gpt-oss-20b-mxfp4.gguf")

Header (gpt-oss.*): block_count, context_length, embedding_length, feed_forward_length,
attention.head_count / head_count_kv / key_length, attention.layer_norm_rms_epsilon,
attention.sliding_window, expert_count, expert_used_count, expert_feed_forward_length (else
feed_forward_length), rope.freq_base, rope.scaling.type "yarn" with rope.scaling.factor and
rope.scaling.original_context_length (rope.scaling.yarn_beta_fast / _slow where present, else
32 and 1).

Assumed where the file says nothing (llama.cpp's fixed rules for the architecture):

    windows     layer i slides unless (i + 1) % 2 == 0 (sliding, full, sliding, ...), or
                attention.sliding_window_pattern where the file has it
    YaRN        the correction range is not rounded (truncate False, as every gpt-oss config.json
                says; ggml's own YaRN rounds it to whole features, a small difference at the
                ramp's two ends); attention factor 0.1 ln(factor) + 1 (a file with another
                rope.scaling.yarn_attn_factor or a yarn_log_multiplier is refused)
    experts     softmax over the top-k router logits; SwiGLU clamped at 7 with alpha 1.702
    RoPE        rows of W_q / W_k as in the checkpoint (NEOX rope): rope_layout "half"

Weights (GGUF name -> ours; i = layer; Linear weights are (out, in) in both):

    token_embd, output_norm, output      -> tgt_embed.tok, decoder_norm, out_proj (absent: tied)
    blk.{i}.attn_norm                    -> decoder.{i}.norms.0
    blk.{i}.post_attention_norm          -> decoder.{i}.norms.1                     (the FFN's norm)
    blk.{i}.attn_q/_k/_v/_output[.bias]  -> decoder.{i}.self_attn.w_q / w_k / w_v / w_o
    blk.{i}.attn_sinks                   -> decoder.{i}.self_attn.sinks             (H)
    blk.{i}.ffn_gate_inp[.bias]          -> decoder.{i}.ffn.router                  (E x d, E)
    blk.{i}.ffn_gate_exps, ffn_up_exps   -> decoder.{i}.ffn.gate_up: (E, m, d) each, transposed
                                            and interleaved (gate the even columns, up the odd)
                                            into (E, d, 2m); their biases (E, m) likewise into
                                            ffn.gate_up_bias (E, 2m)
    blk.{i}.ffn_gate_up_exps[.bias]      -> the same from one fused tensor (E, 2m, d): gate rows
                                            first, then up (the converter's fused option)
    blk.{i}.ffn_down_exps                -> decoder.{i}.ffn.down: (E, d, m) transposed to (E, m, d)
    blk.{i}.ffn_down_exps.bias           -> decoder.{i}.ffn.down_bias               (E x d)

Every tensor is dequantised to float32 by gguf.quants.dequantize (the experts are usually MXFP4,
type 39; F32, F16, BF16, Q8_0, ... as elsewhere). Tokenizer: the byte-level BPE vocabulary
(tokenizer.ggml.*; gpt-oss files name the "gpt-4o" pre-tokenizer), read by core/loaders/gguf_reader.py.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Dict, Optional

import torch

from ..api import AttentionModel
from ..net.config import ModelConfig
from .byte_bpe import ByteBPETokenizer
from .checkpoint import CheckpointError
from .gguf_reader import byte_bpe, context_length, decoder_config, field, gguf_shape, net_from_state, open_gguf, read_tensors

ARCH = "gpt-oss"
SWA_EVERY = 2  # llama.cpp: every 2nd layer full, the others sliding
ALPHA, LIMIT = 1.702, 7.0  # the clamped SwiGLU's constants (no metadata key)


def _yarn(reader, need, name: str) -> Optional[dict]:
    """ModelConfig.rope_scaling from rope.scaling.* (see the module docstring)."""
    kind = field(reader, f"{ARCH}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(need("rope.scaling.factor"))}
    if kind != "yarn":
        raise CheckpointError(f"{name}: RoPE scaling {kind!r} is not supported in gpt-oss GGUF files (yarn, linear)")
    attn = field(reader, f"{ARCH}.rope.scaling.yarn_attn_factor", 1.0)
    log_mul = field(reader, f"{ARCH}.rope.scaling.yarn_log_multiplier", 0.0)
    if float(attn) != 1.0 or float(log_mul) != 0.0:
        raise CheckpointError(f"{name}: YaRN with yarn_attn_factor {attn} / yarn_log_multiplier {log_mul} is not "
                              "supported (only the default attention factor 0.1 ln(factor) + 1)")
    return {"type": "yarn", "factor": float(need("rope.scaling.factor")),
            "original_max_position_embeddings": float(need("rope.scaling.original_context_length")),
            "beta_fast": float(field(reader, f"{ARCH}.rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(field(reader, f"{ARCH}.rope.scaling.yarn_beta_slow", 1.0)),
            "truncate": False}


def config_from_gguf(reader, name: str) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch != ARCH:
        raise CheckpointError(f"{name}: GGUF architecture {arch!r} is not {ARCH!r}")
    need, d, h, d_head = gguf_shape(reader, ARCH, where=f"{name}: ", error=CheckpointError)
    n_layers = int(need("block_count"))
    window = field(reader, f"{ARCH}.attention.sliding_window")
    types = None
    if window:
        pattern = field(reader, f"{ARCH}.attention.sliding_window_pattern", SWA_EVERY)
        if isinstance(pattern, list):  # per layer, True: sliding
            types = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(n_layers)]
        if len(types) != n_layers:
            raise CheckpointError(f"{name}: sliding_window_pattern has {len(types)} layers, the file {n_layers}")
    moe = {"kind": "gpt_oss", "experts": int(need("expert_count")), "top_k": int(need("expert_used_count")),
           "d_expert": int(field(reader, f"{ARCH}.expert_feed_forward_length", need("feed_forward_length"))),
           "alpha": ALPHA, "limit": LIMIT}
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    ctx = context_length(reader, ARCH)
    cfg = decoder_config(
        reader, ARCH, need, d, h, d_head, ctx,
        tgt_vocab_size=int(field(reader, f"{ARCH}.vocab_size", len(tokens))),
        rope_scaling=_yarn(reader, need, name),
        rope_layout="half",
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        extra={"family": "gpt_oss", "context_length": ctx, "gguf_name": field(reader, "general.name")},
    )
    return dataclasses.replace(cfg, bias=True, qkv_bias=True, out_bias=False, attn_sinks=True, moe=moe,
                               layer_types=types, sliding_window=int(window) if window else None)


def weight_table(cfg: ModelConfig, fused: bool) -> Dict[str, str]:
    """GGUF tensor name -> ours; the experts' gate / up / down go to names of their own
    ("gguf.{i}.*"), rearranged by weights_from_gguf."""
    table = {"token_embd.weight": "tgt_embed.tok.weight", "output_norm.weight": "decoder_norm.weight",
             "output.weight": "out_proj.weight"}
    for i in range(cfg.n_layers):
        b, o = f"blk.{i}.", f"decoder.{i}."
        table.update({b + "attn_norm.weight": o + "norms.0.weight", b + "post_attention_norm.weight": o + "norms.1.weight",
                      b + "attn_sinks.weight": o + "self_attn.sinks",
                      b + "ffn_down_exps.bias": o + "ffn.down_bias", b + "ffn_down_exps.weight": f"gguf.{i}.down"})
        for g, ours in (("attn_q", "w_q"), ("attn_k", "w_k"), ("attn_v", "w_v"), ("attn_output", "w_o")):
            table.update({f"{b}{g}.{s}": f"{o}self_attn.{ours}.{s}" for s in ("weight", "bias")})
        table.update({f"{b}ffn_gate_inp.{s}": f"{o}ffn.router.{s}" for s in ("weight", "bias")})
        for part in (("gate_up",) if fused else ("gate", "up")):
            table.update({f"{b}ffn_{part}_exps.weight": f"gguf.{i}.{part}",
                          f"{b}ffn_{part}_exps.bias": f"gguf.{i}.{part}_bias"})
    return table


def weights_from_gguf(reader, cfg: ModelConfig, name: str) -> Dict[str, torch.Tensor]:
    """Every tensor dequantised to float32 and renamed; the experts laid out as the HF
    checkpoint holds them (module docstring). Errors name unmapped, missing and mis-shaped tensors."""
    from ..net.model import Transformer

    fused = any(t.name.endswith("ffn_gate_up_exps.weight") for t in reader.tensors)
    table = weight_table(cfg, fused)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    e, d, m = cfg.moe["experts"], cfg.d_model, cfg.moe["d_expert"]
    for i in range(cfg.n_layers):
        shapes.update({f"gguf.{i}.down": (e, d, m), f"gguf.{i}.gate": (e, m, d), f"gguf.{i}.up": (e, m, d),
                       f"gguf.{i}.gate_bias": (e, m), f"gguf.{i}.up_bias": (e, m),
                       f"gguf.{i}.gate_up": (e, 2 * m, d), f"gguf.{i}.gate_up_bias": (e, 2 * m)})
    out = read_tensors(reader, table, CheckpointError, f"{name}: ", shapes,
                       optional={"out_proj.weight"} if cfg.tie_embeddings else ())
    for i in range(cfg.n_layers):
        if fused:
            w, bias = out.pop(f"gguf.{i}.gate_up"), out.pop(f"gguf.{i}.gate_up_bias")
            gate, up, gate_b, up_b = w[:, :m], w[:, m:], bias[:, :m], bias[:, m:]
        else:
            gate, up = out.pop(f"gguf.{i}.gate"), out.pop(f"gguf.{i}.up")  # (E, m, d)
            gate_b, up_b = out.pop(f"gguf.{i}.gate_bias"), out.pop(f"gguf.{i}.up_bias")  # (E, m)
        gate_up = torch.empty(e, d, 2 * m)
        gate_up[..., 0::2], gate_up[..., 1::2] = gate.transpose(1, 2), up.transpose(1, 2)  # (E, d, 2m)
        gate_up_b = torch.empty(e, 2 * m)
        gate_up_b[:, 0::2], gate_up_b[:, 1::2] = gate_b, up_b
        out[f"decoder.{i}.ffn.gate_up"], out[f"decoder.{i}.ffn.gate_up_bias"] = gate_up, gate_up_b
        out[f"decoder.{i}.ffn.down"] = out.pop(f"gguf.{i}.down").transpose(1, 2).contiguous()  # (E, m, d)
    return out


def load_gguf(path, device=None, name: Optional[str] = None, progress=None) -> AttentionModel:
    """A gpt-oss GGUF file as an AttentionModel (decoder)."""
    from .masked_lm import local_model

    path = Path(path)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    say("reading the GGUF header")
    reader = open_gguf(path, CheckpointError)
    cfg = config_from_gguf(reader, path.name)
    say(f"dequantising {len(reader.tensors)} tensors to float32")
    state = weights_from_gguf(reader, cfg, path.name)
    tk, info = byte_bpe(reader, CheckpointError, f"{path.name}: ")
    net = net_from_state(cfg, state, path.name, CheckpointError)
    n = sum(p.numel() for p in net.parameters())
    tok = ByteBPETokenizer(tk, info, max_len=cfg.max_len)
    say("ready")
    return local_model(name or path.name, net, tok, device, f"gpt-oss GGUF file {path.name}", path, "gpt_oss", n, t0,
                       "decoder", end_id=info.get("eos_id"))
