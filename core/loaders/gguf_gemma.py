"""GGUF files of the gemma, gemma2 and gemma3 architectures (as llama.cpp's converter writes
them), in our core: the same network as core/loaders/families/gemma.py builds from a
checkpoint folder.

    model = core.load_model("/models/gemma-2-2b-it-Q8_0.gguf")

What the file holds, and where it differs from the Hugging Face folder:

    norms       llama.cpp's converter stores Gemma's RMSNorm gains already as 1 + w: read as they are
    output      absent: tied to token_embd (Gemma's usual case)
    RoPE        the rows of W_q / W_k are not permuted (llama.cpp's NEOX rope): rope_layout "half"
    windows     {arch}.attention.sliding_window; the pattern of local and global layers is
                {arch}.attention.sliding_window_pattern where the file has it, else llama.cpp's
                fixed one (gemma2: every 2nd layer global, gemma3: every 6th)
    RoPE bases  {arch}.rope.freq_base (global) and, for gemma3's local layers,
                {arch}.rope.freq_base_swa or llama.cpp's fixed 10,000
    scale       {arch}.attention.scale where present; else llama.cpp's rule: query_pre_attn_scalar
                is d / H for the 27 B models (gemma2 46 layers, gemma3 62), d_k otherwise
    soft-caps   {arch}.attn_logit_softcapping (gemma2), {arch}.final_logit_softcapping

Weights (GGUF name -> ours; i = layer):

    token_embd, output_norm, output        -> tgt_embed.tok, decoder_norm, out_proj
    blk.{i}.attn_norm                      -> decoder.{i}.norms.0
    blk.{i}.attn_q/_k/_v/_output           -> decoder.{i}.self_attn.w_q / w_k / w_v / w_o
    blk.{i}.attn_q_norm / attn_k_norm      -> decoder.{i}.self_attn.q_norm / k_norm        (gemma3)
    blk.{i}.post_attention_norm            -> decoder.{i}.post_norms.0                     (gemma2/3)
    blk.{i}.ffn_norm                       -> decoder.{i}.norms.1
    blk.{i}.post_ffw_norm                  -> decoder.{i}.post_norms.1                     (gemma2/3)
    blk.{i}.ffn_gate/up/down               -> decoder.{i}.ffn.w_1 / w_3 / w_2

Tokenizers: SentencePiece vocabularies (tokenizer.ggml.model "llama": Gemma's own, tokens with
scores, byte fallback) are rebuilt as a `tokenizers` BPE whose merges follow the pieces' scores
(as transformers converts a SentencePiece BPE model); byte-level BPE ("gpt2") as
core/loaders/gguf_file.py reads it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Dict, Optional

import torch

from ..api import AttentionModel
from .checkpoint import CheckpointError
from .gguf_reader import MAX_LEN, field, gguf_shape, net_from_state
from ..net.config import ModelConfig

ARCHS = ("gemma", "gemma2", "gemma3")
PATTERN = {"gemma2": 2, "gemma3": 6}  # llama.cpp: every n-th layer is global
BIG = {"gemma2": 46, "gemma3": 62}  # block counts of the 27 B models (query_pre_attn_scalar = d / H)
THETA = {"gemma": 10_000.0, "gemma2": 10_000.0, "gemma3": 1_000_000.0}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def architecture(path) -> Optional[str]:
    """The file's general.architecture (None if it is not readable GGUF)."""
    try:
        from gguf import GGUFReader

        return str(field(GGUFReader(str(path)), "general.architecture"))
    except Exception:
        return None


def config_from_gguf(reader, name: str) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch not in ARCHS:
        raise CheckpointError(f"{name}: GGUF architecture {arch!r} is not a Gemma one ({', '.join(ARCHS)})")
    need, d, h, d_head = gguf_shape(reader, arch, where=f"{name}: ", error=CheckpointError)
    n_layers = int(need("block_count"))
    scaling = None
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind == "linear":
        scaling = {"type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise CheckpointError(f"{name}: RoPE scaling {kind!r} is not supported in GGUF files (only linear)")
    types, window, local_theta = None, None, None
    if arch != "gemma":
        window = field(reader, f"{arch}.attention.sliding_window")
        pattern = field(reader, f"{arch}.attention.sliding_window_pattern", PATTERN[arch])
        if isinstance(pattern, list):  # a per-layer list of booleans (True: sliding)
            types = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            every = int(pattern)
            types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
        if not window:
            types, window = ["full_attention"] * n_layers, None
    if arch == "gemma3":
        local_theta = float(field(reader, f"{arch}.rope.freq_base_swa", 10_000.0))
    scale = field(reader, f"{arch}.attention.scale")
    if scale is None and arch != "gemma":
        scale = (d / h if n_layers == BIG[arch] else d_head) ** -0.5
    cap_attn = field(reader, f"{arch}.attn_logit_softcapping") if arch == "gemma2" else None
    cap_final = field(reader, f"{arch}.final_logit_softcapping")
    tokens = field(reader, "tokenizer.ggml.tokens") or []
    ctx = int(field(reader, f"{arch}.context_length", MAX_LEN))
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=h,
        n_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", h)),
        d_head=d_head,
        d_ff=int(need("feed_forward_length")),
        n_layers=n_layers,
        tgt_vocab_size=int(field(reader, f"{arch}.vocab_size", len(tokens))),
        max_len=ctx,
        positional="rope",
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", THETA[arch])),
        rope_scaling=scaling,
        rope_layout="half",
        rope_theta_local=local_theta,
        norm="rmsnorm",
        norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        norm_placement="pre",
        post_sublayer_norm=arch != "gemma",
        qk_norm="head" if arch == "gemma3" else None,
        activation="geglu_tanh",
        bias=False,
        embed_scale=True,
        final_norm=True,
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        attn_scale=float(scale) if scale is not None else None,
        attn_softcap=float(cap_attn) if cap_attn else None,
        final_softcap=float(cap_final) if cap_final else None,
        layer_types=types,
        sliding_window=int(window) if window else None,
        pad_id=int(field(reader, "tokenizer.ggml.padding_token_id", 0) or 0),
        extra={"family": arch, "context_length": ctx, "gguf_name": field(reader, "general.name")},
    )


def weight_table(cfg: ModelConfig) -> Dict[str, str]:
    """GGUF tensor name -> our parameter name (see the module docstring)."""
    table = {"token_embd.weight": "tgt_embed.tok.weight", "output_norm.weight": "decoder_norm.weight",
             "output.weight": "out_proj.weight"}
    for i in range(cfg.n_layers):
        b, o = f"blk.{i}.", f"decoder.{i}."
        pairs = [("attn_norm", "norms.0"), ("attn_q", "self_attn.w_q"), ("attn_k", "self_attn.w_k"),
                 ("attn_v", "self_attn.w_v"), ("attn_output", "self_attn.w_o"), ("ffn_norm", "norms.1"),
                 ("ffn_gate", "ffn.w_1"), ("ffn_up", "ffn.w_3"), ("ffn_down", "ffn.w_2")]
        if cfg.post_sublayer_norm:
            pairs += [("post_attention_norm", "post_norms.0"), ("post_ffw_norm", "post_norms.1")]
        if cfg.qk_norm:
            pairs += [("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")]
        table.update({f"{b}{g}.weight": f"{o}{ours}.weight" for g, ours in pairs})
    return table


def weights_from_gguf(reader, cfg: ModelConfig, name: str) -> Dict[str, torch.Tensor]:
    """Every tensor dequantised to float32 and renamed; errors name unmapped, missing and
    mis-shaped tensors."""
    import numpy as np
    from gguf.quants import dequantize

    from ..net.model import Transformer

    table = weight_table(cfg)
    with torch.device("meta"):
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


def spm_tokenizer(reader, name: str):
    """A SentencePiece vocabulary (tokens, scores, types) as a `tokenizers` Tokenizer: BPE over
    "▁"-for-space text with byte fallback, merges ranked by the merged piece's score (ties:
    by the pieces' ids), control tokens special, BOS prepended where the file says so."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    tokens = field(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise CheckpointError(f"{name}: the GGUF file has no tokenizer.ggml.tokens")
    scores = field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = field(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t for t, ty in zip(tokens, types) if ty in (NORMAL, UNUSED, USER_DEFINED)}
    merges = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            a, b = piece[:cut], piece[cut:]
            if a in vocab and b in vocab:
                merges.append((-scores[vocab[piece]], vocab[a], vocab[b], a, b))
    merges.sort()
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token=unk,
                              byte_fallback=True, fuse_unk=True))
    prefix = field(reader, "tokenizer.ggml.add_space_prefix", False)
    tk.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if prefix else [])
                                         + [normalizers.Replace(" ", "\u2581")])
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    special = [t for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)]
    user = [t for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if special:
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if user:
        tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    if bos is not None and field(reader, "tokenizer.ggml.add_bos_token", True):
        tk.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A",
                                                          special_tokens=[(tokens[bos], int(bos))])
    return tk


def tokenizer_from_gguf(reader, name: str, max_len: int):
    """Our tokenizer for the file's vocabulary (SentencePiece or byte-level BPE) and its eos id."""
    model = field(reader, "tokenizer.ggml.model")
    if model == "gpt2":
        from .byte_bpe import ByteBPETokenizer
        from .gguf_file import tokenizer_from_gguf as byte_level

        tk, info = byte_level(reader, name)
        return ByteBPETokenizer(tk, info, max_len=max_len), info.get("eos_id")
    if model != "llama":
        raise CheckpointError(f"{name}: GGUF tokenizer model {model!r} is not supported (SentencePiece 'llama' "
                              "or byte-level BPE 'gpt2')")
    from .hf_tokenizer import HFTokenizer

    tk = spm_tokenizer(reader, name)
    with tempfile.TemporaryDirectory(prefix="attention-lab-spm-") as tmp:
        path = Path(tmp) / "tokenizer.json"
        tk.save(str(path))
        tok = HFTokenizer(path, max_len=max_len)
    return tok, field(reader, "tokenizer.ggml.eos_token_id")


def load_gguf(path, device=None, name: Optional[str] = None, progress=None) -> AttentionModel:
    """A gemma / gemma2 / gemma3 GGUF file as an AttentionModel (decoder)."""
    from gguf import GGUFReader

    from .masked_lm import local_model

    path = Path(path)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    say("reading the GGUF header")
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path.name} cannot be read as GGUF ({exc})") from None
    cfg = config_from_gguf(reader, path.name)
    say(f"dequantising {len(reader.tensors)} tensors to float32")
    state = weights_from_gguf(reader, cfg, path.name)
    tok, eos = tokenizer_from_gguf(reader, path.name, cfg.max_len)
    net = net_from_state(cfg, state, path.name, CheckpointError)
    n = sum(p.numel() for p in net.parameters())
    say("ready")
    family = cfg.extra["family"]
    return local_model(name or path.name, net, tok, device, f"{family} GGUF file {path.name}", path, family, n, t0,
                       "decoder", end_id=eos)
