"""GGUF files of the llama and qwen2 architectures, in our core (the general form of what
core/loaders/smollm2.py does for its one bundled file, whose loading is left exactly as it is).

    model = core.load_model("/models/tiny-llama.gguf")

Every tensor is dequantised to float32 (gguf.quants.dequantize: F32, F16, BF16, Q8_0, Q4_*,
...), the ModelConfig comes from the file's metadata ({arch}.* keys) and the tokenizer is the
byte-level BPE of tokenizer.ggml.* (model "gpt2"; pre-tokenizers default/gpt2, smollm,
llama-bpe, qwen2). Nothing is cached on disk.

Weights (GGUF name -> ours; i = layer; Linear weights are (out, in) in both)

    token_embd            -> tgt_embed.tok
    output                -> out_proj            (absent: tied to token_embd)
    output_norm           -> decoder_norm
    blk.{i}.attn_norm     -> decoder.{i}.norms.0
    blk.{i}.attn_q/_k/_v  -> decoder.{i}.self_attn.w_q / w_k / w_v   (+ .bias: qwen2)
    blk.{i}.attn_output   -> decoder.{i}.self_attn.w_o
    blk.{i}.ffn_norm      -> decoder.{i}.norms.1
    blk.{i}.ffn_gate/up/down -> decoder.{i}.ffn.w_1 / w_3 / w_2

RoPE layout: llama.cpp's converter permutes the rows of W_q and W_k of llama models so that
neighbouring features (2j, 2j+1) form the rotated pairs; we keep the rows and rotate
neighbours (rope_layout="interleaved"; see core/loaders/smollm2.py for why q . k is unchanged).
qwen2 files are not permuted (llama.cpp's NEOX rope): rope_layout="half".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from ..api import AttentionModel
from .checkpoint import CheckpointError
from ..net.config import ModelConfig
from .byte_bpe import ByteBPETokenizer, finish_byte_tokenizer
from .gguf_header import LAYER_MAP, context_length, decoder_config, field, gguf_shape

ARCHS = ("llama", "qwen2")
TOP_MAP = [("token_embd", "tgt_embed.tok"), ("output_norm", "decoder_norm"), ("output", "out_proj")]

# pre-tokenizer regexes of llama.cpp's byte-level BPE types
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def _reader(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:
        raise CheckpointError(f"{Path(path).name} cannot be read as GGUF ({exc})") from None


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
        raise CheckpointError(f"{name}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHS)}")
    need, d, h, d_head = gguf_shape(reader, arch, where=f"{name}: ", error=CheckpointError)
    scaling = None
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind == "linear":
        scaling = {"type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise CheckpointError(f"{name}: RoPE scaling {kind!r} is not supported in GGUF files (only linear)")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise CheckpointError(f"{name}: per-frequency RoPE factors (rope_freqs, Llama 3.1 scaling) are not supported in GGUF files")
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    ctx = context_length(reader, arch)
    return decoder_config(
        reader, arch, need, d, h, d_head, ctx,
        tgt_vocab_size=int(field(reader, f"{arch}.vocab_size", len(tokens))),
        rope_scaling=scaling,
        rope_layout="interleaved" if arch == "llama" else "half",
        qkv_bias=arch == "qwen2",
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        extra={"family": arch, "context_length": ctx, "gguf_name": field(reader, "general.name")},
    )


def weights_from_gguf(reader, cfg: ModelConfig, name: str) -> Dict[str, torch.Tensor]:
    """Every tensor dequantised to float32 and renamed (rows as in the file); errors name
    unmapped, missing and mis-shaped tensors."""
    import numpy as np
    from gguf.quants import dequantize

    table = {}
    for a, b in TOP_MAP:
        table[a + ".weight"] = b + ".weight"
    for i in range(cfg.n_layers):
        for a, b in LAYER_MAP:
            table[a.format(i=i) + ".weight"] = b.format(i=i) + ".weight"
        if cfg.qkv_bias:
            for p in ("q", "k", "v"):
                table[f"blk.{i}.attn_{p}.bias"] = f"decoder.{i}.self_attn.w_{p}.bias"
    with torch.device("meta"):
        from ..net.model import Transformer

        shapes = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    out: Dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name not in table:
            raise CheckpointError(f"{name}: the GGUF file holds a tensor this architecture does not use: {t.name!r}")
        arr = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, order="C", copy=True)
        ours = table[t.name]
        if tuple(arr.shape) != shapes[ours]:
            raise CheckpointError(f"{name}: the tensor {t.name!r} has shape {list(arr.shape)} but the metadata implies "
                                  f"{list(shapes[ours])}")
        out[ours] = torch.from_numpy(arr)
    wanted = set(table.values()) - ({"out_proj.weight"} if cfg.tie_embeddings else set())
    missing = sorted(k for k, v in table.items() if v in wanted and v not in out)
    if missing:
        raise CheckpointError(f"{name}: the GGUF file lacks {len(missing)} tensor(s): {', '.join(missing[:6])}")
    return out


def tokenizer_from_gguf(reader, name: str):
    """(tokenizers.Tokenizer, info) for a byte-level BPE GGUF vocabulary."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise CheckpointError(f"{name}: only byte-level BPE ('gpt2') GGUF tokenizers are supported, not {model!r}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges") or []]
    pre = field(reader, "tokenizer.ggml.pre", "default")
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt-2", "gpt2"):
        tk.pre_tokenizer = byte_level
    elif pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("llama-bpe", "llama3", "qwen2"):
        regex = QWEN2_REGEX if pre == "qwen2" else LLAMA3_REGEX
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        raise CheckpointError(f"{name}: GGUF pre-tokenizer {pre!r} is not supported")
    return tk, finish_byte_tokenizer(tk, reader, tokens, types, pre)


def load_gguf(path, device=None, name: Optional[str] = None, progress=None) -> AttentionModel:
    """A llama / qwen2 GGUF file as an AttentionModel (decoder)."""
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
    with torch.device("meta"):
        from ..net.model import Transformer

        net = Transformer(cfg)
    net.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_embeddings:
        net.out_proj.weight = net.tgt_embed.tok.weight
    meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if meta:
        raise CheckpointError(f"{path.name}: tensors not filled from the file: {meta[:6]}")
    n = sum(p.numel() for p in net.parameters())
    tok = ByteBPETokenizer(tk, info, max_len=cfg.max_len)
    say("ready")
    family = cfg.extra["family"]
    return local_model(name or path.name, net, tok, device, f"{family} GGUF file {path.name}", path, family, n, t0,
                       "decoder", end_id=info.get("eos_id"))
