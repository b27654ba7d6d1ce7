"""What a GGUF file's header says about a Llama-style decoder, for core/loaders/smollm2.py (its one
bundled file) and core/loaders/gguf_file.py (any llama / qwen2 file) alike: metadata fields, the
network's shape and ModelConfig, and the GGUF names of a block's tensors.
"""

from __future__ import annotations

from ..net.config import ModelConfig

MAX_LEN = 2048  # the context assumed for a GGUF file whose header lacks {arch}.context_length


def context_length(reader, arch: str) -> int:
    """The model's own context in tokens, as the file's header says ({arch}.context_length)."""
    return int(field(reader, f"{arch}.context_length", MAX_LEN))

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


def gguf_shape(reader, arch: str, where: str = "", error=ValueError):
    """(need, d, H, d_k) of a GGUF decoder: need(key) reads the required field {arch}.{key}
    (`error` naming it when absent); partial RoPE is refused. `where` prefixes the messages
    (a file's name)."""
    def need(key):
        v = field(reader, f"{arch}.{key}")
        if v is None:
            raise error(f"{where}the GGUF file lacks {arch}.{key}")
        return v

    d, h = int(need("embedding_length")), int(need("attention.head_count"))
    d_head = int(field(reader, f"{arch}.attention.key_length", d // h))
    rope_dims = int(field(reader, f"{arch}.rope.dimension_count", d_head))
    if rope_dims != d_head:
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
