"""The one GGUF reader. core/loaders/smollm2.py (its one bundled file, converted once into a
cache), core/loaders/gguf_file.py (any llama / qwen2 / qwen3 / phi3 / smollm3 file) and
core/loaders/gguf_gpt_oss.py (gpt-oss files) read through it:

    open_gguf(path)                 the file's GGUFReader (a clear error when it is not GGUF)
    field(reader, key)              one metadata value (scalar, string or list)
    gguf_shape / decoder_config     the network's shape and the ModelConfig of a Llama-style
                                    decoder from the {arch}.* header fields
    read_tensors(reader, table)     every tensor dequantised to float32 (gguf.quants.dequantize:
                                    F32, F16, BF16, Q8_0, Q4_*, ...) and renamed by a table;
                                    errors name unmapped, missing and mis-shaped tensors
    byte_bpe(reader)                the byte-level BPE vocabulary (tokenizer.ggml.*) as a
                                    `tokenizers` object and the info core/loaders/byte_bpe.py keeps
    LAYER_MAP                       the GGUF names of a Llama block's tensors

Each caller passes the exception type its messages are raised as (smollm2: ValueError, as
always; gguf_file: CheckpointError) and a prefix naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..net.config import ModelConfig

MAX_LEN = 2048  # the context assumed for a GGUF file whose header lacks {arch}.context_length

# (GGUF name, our name), ".weight" follows; "{i}" is the layer.
LAYER_MAP = [
    ("blk.{i}.attn_norm", "decoder.{i}.norms.0"),
    ("blk.{i}.attn_q", "decoder.{i}.self_attn.w_q"),
    ("blk.{i}.attn_k", "decoder.{i}.self_attn.w_k"),
    ("blk.{i}.attn_v", "decoder.{i}.self_attn.w_v"),
    ("blk.{i}.attn_output", "decoder.{i}.self_attn.w_o"),
    ("blk.{i}.ffn_norm", "decoder.{i}.norms.1"),
    ("blk.{i}.ffn_gate", "decoder.{i}.ffn.w_1"),
    ("blk.{i}.ffn_up", "decoder.{i}.ffn.w_3"),
    ("blk.{i}.ffn_down", "decoder.{i}.ffn.w_2"),
]


def field(reader, key: str, default=None):
    """A metadata value: scalar, str, or list (of scalars or str)."""
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None:
        return default
    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if main == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def context_length(reader, arch: str) -> int:
    """The model's own context in tokens, as the file's header says ({arch}.context_length)."""
    return int(field(reader, f"{arch}.context_length", MAX_LEN))


def gguf_shape(reader, arch: str, where: str = "", error=ValueError, partial: bool = False):
    """(need, d, H, d_k) of a GGUF decoder: need(key) reads the required field {arch}.{key}
    (`error` naming it when absent); partial RoPE is refused unless `partial` (the caller reads
    rope.dimension_count itself). `where` prefixes the messages (a file's name)."""
    def need(key):
        v = field(reader, f"{arch}.{key}")
        if v is None:
            raise error(f"{where}the GGUF file lacks {arch}.{key}")
        return v

    d, h = int(need("embedding_length")), int(need("attention.head_count"))
    d_head = int(field(reader, f"{arch}.attention.key_length", d // h))
    rope_dims = int(field(reader, f"{arch}.rope.dimension_count", d_head))
    if rope_dims != d_head and not (partial and 0 < rope_dims < d_head and rope_dims % 2 == 0):
        raise error(f"{where}partial RoPE ({rope_dims} of {d_head} features) is not supported")
    return need, d, h, d_head


def decoder_config(reader, arch: str, need, d: int, h: int, d_head: int, max_len: int, **fields) -> ModelConfig:
    """The ModelConfig of a Llama-style GGUF decoder (pre-norm RMSNorm, SwiGLU, RoPE, no
    biases) from the header fields every such file has; `fields` add or override the rest
    (core/loaders/smollm2.py's one file, core/loaders/gguf_file.py's llama and qwen2)."""
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=h,
        n_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", h)),
        d_head=d_head,
        d_ff=int(need("feed_forward_length")),
        n_layers=int(need("block_count")),
        max_len=max_len,
        positional="rope",
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        norm="rmsnorm",
        norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        norm_placement="pre",
        activation="swiglu",
        bias=False,
        final_norm=True,
        pad_id=int(field(reader, "tokenizer.ggml.padding_token_id", 0) or 0),
        **fields,
    )


# pre-tokenizer regexes of llama.cpp's byte-level BPE types
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# GPT-4o / o200k (gpt-oss): case-aware letter runs with the contraction as a suffix, digits in threes
UPPER, LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_REGEX = (rf"[^\r\n\p{{L}}\p{{N}}]?{UPPER}*{LOWER}+{CONTRACTION}|[^\r\n\p{{L}}\p{{N}}]?{UPPER}+{LOWER}*{CONTRACTION}"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTROL = 3  # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
USER_DEFINED = 4
PRE_TYPES = ("default", "gpt-2", "gpt2", "smollm", "llama-bpe", "llama3", "qwen2", "gpt-4o")


def net_from_state(cfg: ModelConfig, state: Dict[str, torch.Tensor], where: str, error=ValueError):
    """Our Transformer holding `state`, built on the meta device (no random init); a tied
    output projection shares the embedding. Every parameter must be filled from the file."""
    from ..net.model import Transformer

    with torch.device("meta"):
        net = Transformer(cfg)
    net.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_embeddings:
        net.out_proj.weight = net.tgt_embed.tok.weight
    meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if meta:
        raise error(f"{where}: tensors not filled from the file: {meta[:6]}")
    return net


def open_gguf(path, error=ValueError):
    """gguf's GGUFReader over the file (memory-mapped); `error` naming the file when it is not GGUF."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:
        raise error(f"{Path(path).name} cannot be read as GGUF ({exc})") from None


def read_tensors(reader, table: Dict[str, str], error=ValueError, where: str = "",
                 shapes: Optional[Dict[str, tuple]] = None, optional=()) -> Dict[str, torch.Tensor]:
    """{our name: float32 tensor} for every tensor of the file, renamed by `table` (GGUF name ->
    ours), rows exactly as stored. A tensor the table lacks, one missing (besides `optional`)
    or one whose shape is not `shapes[ours]` is an `error` naming it."""
    import numpy as np
    from gguf.quants import dequantize

    out: Dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name not in table:
            raise error(f"{where}the GGUF file holds a tensor this architecture does not use: {t.name!r}")
        # a copy: F32 tensors would otherwise view the file's memory map
        arr = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, order="C", copy=True)
        ours = table[t.name]
        if shapes is not None and tuple(arr.shape) != tuple(shapes[ours]):
            raise error(f"{where}the tensor {t.name!r} has shape {list(arr.shape)} but the metadata implies "
                        f"{list(shapes[ours])}")
        out[ours] = torch.from_numpy(arr)
    missing = sorted(k for k, v in table.items() if v not in out and v not in optional)
    if missing:
        raise error(f"{where}the GGUF file lacks {len(missing)} tensor(s): {', '.join(missing[:6])}")
    return out


def byte_bpe(reader, error=ValueError, where: str = "", pre_types=PRE_TYPES):
    """(tokenizers.Tokenizer, info) rebuilt from tokenizer.ggml.* (model "gpt2": byte-level BPE):
    the vocabulary and merges, the pre-tokenizer of the file's type (`pre_types` those accepted),
    the byte-level decoder and the control / user-defined tokens (core/loaders/byte_bpe.py)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise error(f"{where}only byte-level BPE ('gpt2') GGUF tokenizers are supported, not {model!r}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges") or []]
    bad = [m for m in merges if len(m) != 2]
    if bad:
        raise error(f"{where}malformed merges: {bad[:3]}")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre not in pre_types:
        raise error(f"{where}GGUF pre-tokenizer {pre!r} is not supported")
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt-2", "gpt2"):
        tk.pre_tokenizer = byte_level
    elif pre == "smollm":  # llama.cpp: "\p{N}" first, then GPT-2's regex
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:  # llama-bpe, llama3, qwen2, gpt-4o
        regex = {"qwen2": QWEN2_REGEX, "gpt-4o": GPT4O_REGEX}.get(pre, LLAMA3_REGEX)
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    return tk, finish_byte_tokenizer(tk, reader, tokens, types, pre)


def finish_byte_tokenizer(tk, reader, tokens: List[str], types: List[int], pre: str) -> dict:
    """The end of byte_bpe: the byte-level decoder, the file's control tokens as special tokens
    and its user-defined ones as added tokens; returns the info every such tokenizer keeps
    (pre-tokenizer, bos/eos ids, control ids)."""
    from tokenizers import AddedToken, decoders

    tk.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [t for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if control:
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    if user:
        tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return {
        "pre": pre,
        "bos_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "control_ids": [i for i, ty in enumerate(types) if ty == CONTROL],
    }
