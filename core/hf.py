"""Hugging Face checkpoint folders (config.json + *.safetensors + tokenizer.json) in our core.

    model = core.load_model("/path/to/my-bert")           # a folder
    model = core.load_model("/path/to/model.gguf")        # llama / qwen2 GGUF (core/gguf_file.py)

Families (config.json's model_type) and how each maps onto ModelConfig:

    bert        encoder, post-norm LayerNorm, learned positions + token types, GELU
    roberta     as bert, positions start at padding_idx + 1 (ModelConfig.position_offset)
    distilbert  as bert without token types (q_lin/k_lin/... names)
    gpt2        decoder, pre-norm LayerNorm, learned positions, gelu_new; Conv1D weights are
                stored (in, out) and transposed here; c_attn is split into W_q, W_k, W_v
    llama       decoder, RMSNorm, RoPE ("half" layout; rope_scaling linear / llama3), SwiGLU, GQA
    mistral     as llama, plus sliding-window attention (ModelConfig.sliding_window): keys
                W or more positions back are masked with -inf, visible in the recorded mask
    qwen2       as llama, with biases on W_q, W_k, W_v (ModelConfig.qkv_bias)
    marian, bart, t5: core/hf_seq2seq.py (loaded from here when that module is present)

Anything else gets a CheckpointError naming the supported families. Checkpoints saved from a
task model (BertForMaskedLM, GPT2LMHeadModel, LlamaForCausalLM, ...) or the bare model both
load: the base prefix ("bert.", "model.", "transformer.") is found from the tensor names.
Every tensor of the checkpoint must be used (a few known buffers and poolers aside) and every
parameter of ours must be filled, else the error names the tensors.

Masked-LM head: an encoder checkpoint that holds one (BertForMaskedLM's cls.predictions.*,
RoBERTa's lm_head.*, DistilBERT's vocab_*) gets `model.mlm_head`. Then `model.fill_mask(text,
k)` returns, for each [MASK] / <mask> token, its top-k fill-ins, and every trace of the
model carries the same list as trace.meta["fill_mask"]:
    [{"position": i, "top": [(token, probability), ...]}, ...]
`model.mlm_logits(hidden)` gives the head's logits for final hidden states (n x d).

dtype and memory: tensors are read one at a time from memory-mapped safetensors files and
converted to float32 (bfloat16 / float16 checkpoints included); the network is built on the
meta device and takes them as they are, so the peak is the float32 model plus one stored
tensor. Computation is float32 on every device: on CUDA the float32 weights are moved to the
GPU by AttentionModel (no half-precision compute, so traces match the CPU's to rounding).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .api import AttentionModel
from .checkpoint import Checkpoint, CheckpointError, check_shape, open_checkpoint, read_config
from .config import ModelConfig
from .device import pick_device
from .minilm import EMBED_MAP as MINILM_EMBED
from .minilm import LAYER_MAP as MINILM_LAYER
from .model import Transformer
from .tokenizer import Encoded, PieceTable, display_pieces

FAMILIES = ("bert", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2")
SEQ2SEQ = ("marian", "bart", "t5")
SUPPORTED = FAMILIES + SEQ2SEQ
DECODER_MAX_LEN = 2048  # longest input of a decoder (its trace grows with n^2)

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu", "silu": "swiglu", "swish": "swiglu"}

Progress = Optional[Callable[[str], None]]


def supported_families() -> tuple:
    """The families a folder may hold: ours, plus marian / bart / t5 once core/hf_seq2seq.py exists."""
    import importlib.util

    return SUPPORTED if importlib.util.find_spec(f"{__package__}.hf_seq2seq") is not None else FAMILIES


def unsupported(family: str) -> CheckpointError:
    return CheckpointError(
        f"model_type {family!r} is not supported; supported families: {', '.join(supported_families())} "
        "(folders with config.json and *.safetensors) and GGUF files of the llama and qwen2 architectures"
    )


# ------------------------------------------------------------------------------ config.json -> ModelConfig
def _act(name: str) -> str:
    if name not in ACTIVATIONS:
        raise CheckpointError(f"unsupported activation {name!r}")
    return ACTIVATIONS[name]


def _no(hf: dict, key: str, what: str) -> None:
    if hf.get(key):
        raise CheckpointError(f"{what} ({key}={hf[key]!r}) is not supported")


def config_bert(hf: dict) -> ModelConfig:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
    roberta = hf.get("model_type") == "roberta"
    offset = int(hf.get("pad_token_id", 1)) + 1 if roberta else 0
    return _bert_family(
        hf, ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers"),
        max_len=hf.get("max_position_embeddings", 512) - offset,
        position_offset=offset,
        type_vocab_size=hf.get("type_vocab_size", 2),
        activation=_act(hf.get("hidden_act", "gelu")),
        norm_eps=hf.get("layer_norm_eps", 1e-12),
    )


def _bert_family(hf: dict, sizes: Tuple[str, str, str, str], **fields) -> ModelConfig:
    """What BERT, RoBERTa and DistilBERT share: a post-norm encoder with learned positions, an
    embedding LayerNorm and biases. sizes: the config.json keys of d, H, m and L, which each
    family names its own way; `fields` the rest."""
    d, h, m, n_layers = (hf[k] for k in sizes)
    return ModelConfig(kind="encoder", d_model=d, n_heads=h, d_ff=m, n_layers=n_layers,
                       src_vocab_size=hf["vocab_size"], positional="learned", embed_norm=True, norm="layernorm",
                       norm_placement="post", bias=True, final_norm=False, pad_id=hf.get("pad_token_id") or 0,
                       **fields)


def config_distilbert(hf: dict) -> ModelConfig:
    return _bert_family(
        hf, ("dim", "n_heads", "hidden_dim", "n_layers"),
        max_len=hf.get("max_position_embeddings", 512),
        # positional="learned" for sinusoidal_pos_embds too: the table is stored in the checkpoint
        activation=_act(hf.get("activation", "gelu")),
        norm_eps=1e-12,
    )


def config_gpt2(hf: dict) -> ModelConfig:
    _no(hf, "scale_attn_by_inverse_layer_idx", "scaling attention by the layer index")
    _no(hf, "reorder_and_upcast_attn", "reordered attention")
    if hf.get("scale_attn_weights", True) is False:
        raise CheckpointError("GPT-2 without 1/sqrt(d_k) scaling (scale_attn_weights=false) is not supported")
    d = hf["n_embd"]
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d,
        n_layers=hf["n_layer"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=min(hf.get("n_positions", 1024), DECODER_MAX_LEN),
        positional="learned",
        activation=_act(hf.get("activation_function", "gelu_new")),
        norm="layernorm",
        norm_placement="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        bias=True,
        final_norm=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        out_bias=False,
        pad_id=hf.get("pad_token_id") or 0,
    )


def rope_params(hf: dict) -> Tuple[float, Optional[dict]]:
    """(theta, ModelConfig.rope_scaling) from rope_theta / rope_scaling (transformers 4) or
    rope_parameters (transformers 5)."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial rotary embeddings (partial_rotary_factor) are not supported")
    if kind in (None, "default"):
        return theta, None
    if kind == "linear":
        return theta, {"type": "linear", "factor": float(merged["factor"])}
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        return theta, {"type": "llama3", **{k: float(merged[k]) for k in keys}}
    raise CheckpointError(f"rope scaling type {kind!r} is not supported (only linear and llama3)")


def config_llama(hf: dict) -> ModelConfig:
    family = hf.get("model_type")
    _no(hf, "attention_bias", "attention biases")
    _no(hf, "mlp_bias", "FFN biases")
    if family == "qwen2" and hf.get("use_sliding_window"):
        raise CheckpointError("Qwen2 with use_sliding_window is not supported")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(f"hidden_act {act!r} is not supported for {family}")
    h = hf["num_attention_heads"]
    theta, scaling = rope_params(hf)
    window = hf.get("sliding_window") if family == "mistral" else None
    return ModelConfig(
        kind="decoder",
        d_model=hf["hidden_size"],
        n_heads=h,
        n_kv_heads=hf.get("num_key_value_heads") or h,
        d_head=hf.get("head_dim") or hf["hidden_size"] // h,
        d_ff=hf["intermediate_size"],
        n_layers=hf["num_hidden_layers"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=min(hf.get("max_position_embeddings", DECODER_MAX_LEN), DECODER_MAX_LEN),
        positional="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        rope_layout="half",
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_placement="pre",
        activation="swiglu",
        bias=False,
        qkv_bias=family == "qwen2",
        final_norm=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        pad_id=hf.get("pad_token_id") or 0,
    )


CONFIGS = {"bert": config_bert, "roberta": config_bert, "distilbert": config_distilbert, "gpt2": config_gpt2,
           "llama": config_llama, "mistral": config_llama, "qwen2": config_llama}


# ------------------------------------------------------------------------------ weight tables
# (checkpoint name under the base prefix, our name); "{i}" is the layer; ".weight"/".bias"
# are added where present. LAYER_T entries are Conv1D (stored transposed).
BERT_EMBED, BERT_LAYER = MINILM_EMBED, MINILM_LAYER  # the tables core/minilm.py uses for all-MiniLM-L6-v2
DISTIL_EMBED = [("embeddings.word_embeddings", "src_embed.tok"), ("embeddings.position_embeddings", "src_embed.pos"),
                ("embeddings.LayerNorm", "src_embed.norm")]
DISTIL_LAYER = [
    ("transformer.layer.{i}.attention.q_lin", "encoder.{i}.self_attn.w_q"),
    ("transformer.layer.{i}.attention.k_lin", "encoder.{i}.self_attn.w_k"),
    ("transformer.layer.{i}.attention.v_lin", "encoder.{i}.self_attn.w_v"),
    ("transformer.layer.{i}.attention.out_lin", "encoder.{i}.self_attn.w_o"),
    ("transformer.layer.{i}.sa_layer_norm", "encoder.{i}.norms.0"),
    ("transformer.layer.{i}.ffn.lin1", "encoder.{i}.ffn.w_1"),
    ("transformer.layer.{i}.ffn.lin2", "encoder.{i}.ffn.w_2"),
    ("transformer.layer.{i}.output_layer_norm", "encoder.{i}.norms.1"),
]
GPT2_TOP = [("wte", "tgt_embed.tok"), ("wpe", "tgt_embed.pos"), ("ln_f", "decoder_norm")]
GPT2_LAYER = [("h.{i}.ln_1", "decoder.{i}.norms.0"), ("h.{i}.ln_2", "decoder.{i}.norms.1")]
GPT2_LAYER_T = [("h.{i}.attn.c_proj", "decoder.{i}.self_attn.w_o"), ("h.{i}.mlp.c_fc", "decoder.{i}.ffn.w_1"),
                ("h.{i}.mlp.c_proj", "decoder.{i}.ffn.w_2")]
LLAMA_TOP = [("embed_tokens", "tgt_embed.tok"), ("norm", "decoder_norm")]
LLAMA_LAYER = [
    ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
    ("layers.{i}.self_attn.q_proj", "decoder.{i}.self_attn.w_q"),
    ("layers.{i}.self_attn.k_proj", "decoder.{i}.self_attn.w_k"),
    ("layers.{i}.self_attn.v_proj", "decoder.{i}.self_attn.w_v"),
    ("layers.{i}.self_attn.o_proj", "decoder.{i}.self_attn.w_o"),
    ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
    ("layers.{i}.mlp.gate_proj", "decoder.{i}.ffn.w_1"),
    ("layers.{i}.mlp.up_proj", "decoder.{i}.ffn.w_3"),
    ("layers.{i}.mlp.down_proj", "decoder.{i}.ffn.w_2"),
]
# (base prefixes to try, the tensor that tells them apart, tables)
BASES = {
    "bert": (("bert.", ""), "embeddings.word_embeddings.weight"),
    "roberta": (("roberta.", ""), "embeddings.word_embeddings.weight"),
    "distilbert": (("distilbert.", ""), "embeddings.word_embeddings.weight"),
    "gpt2": (("transformer.", ""), "wte.weight"),
    "llama": (("model.", ""), "embed_tokens.weight"),
    "mistral": (("model.", ""), "embed_tokens.weight"),
    "qwen2": (("model.", ""), "embed_tokens.weight"),
}
# tensors that carry no parameter of the forward pass we run (buffers, poolers, NSP heads)
IGNORED = re.compile(
    r"^(.*embeddings\.position_ids|.*pooler\..*|cls\.seq_relationship\..*|.*\.attn\.(masked_)?bias"
    r"|.*rotary_emb\.inv_freq|classifier\..*|qa_outputs\..*|score\..*)$"
)

# masked-LM heads: (prefix, dense, norm, decoder weight, decoder bias candidates, activation from)
MLM_HEADS = {
    "bert": ("cls.predictions.", "transform.dense", "transform.LayerNorm", "decoder.weight", ("bias", "decoder.bias")),
    "roberta": ("lm_head.", "dense", "layer_norm", "decoder.weight", ("bias", "decoder.bias")),
    "distilbert": ("", "vocab_transform", "vocab_layer_norm", "vocab_projector.weight", ("vocab_projector.bias",)),
}


def _base(ckpt: Checkpoint, family: str) -> str:
    prefixes, probe = BASES[family]
    for p in prefixes:
        if p + probe in ckpt:
            return p
    raise CheckpointError(f"this is not a {family} checkpoint: it lacks {prefixes[0] + probe!r}")


def weight_table(family: str, cfg: ModelConfig, ckpt: Checkpoint, base: str) -> List[Tuple[str, str, str]]:
    """(checkpoint name, our name, how) for every tensor: how is "" (as stored) or "T"
    (Conv1D: transpose). GPT-2's c_attn is handled by the caller (split in three)."""
    rows: List[Tuple[str, str, str]] = []

    def add(top, layer, how=""):
        for theirs, ours in top:
            for s in (".weight", ".bias"):
                rows.append((base + theirs + s, ours + s, how))
        for i in range(cfg.n_layers):
            for theirs, ours in layer:
                for s in (".weight", ".bias"):
                    rows.append((base + theirs.format(i=i) + s, ours.format(i=i) + s, how))

    if family in ("bert", "roberta"):
        add(BERT_EMBED, BERT_LAYER)
    elif family == "distilbert":
        add(DISTIL_EMBED, DISTIL_LAYER)
    elif family == "gpt2":
        add(GPT2_TOP, GPT2_LAYER)
        add([], GPT2_LAYER_T, "T")
    else:
        add(LLAMA_TOP, LLAMA_LAYER)
    if cfg.has_decoder and not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "out_proj.weight", ""))
    return rows


# ------------------------------------------------------------------------------ the masked-LM head
class MLMHead(nn.Module):
    """logits = LayerNorm(act(h W_t^T + b_t)) E^T + b: BERT's / RoBERTa's / DistilBERT's
    masked-LM head on the final hidden states h (n x d); E is usually the token embedding."""

    def __init__(self, d: int, vocab: int, act: str, eps: float):
        super().__init__()
        self.dense = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=eps)
        self.decoder = nn.Linear(d, vocab)
        self.act = act

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.dense(h)
        x = F.gelu(x, approximate="tanh") if self.act == "gelu_tanh" else F.gelu(x) if self.act == "gelu" else F.relu(x)
        return self.decoder(self.norm(x))


def _mlm_head(family: str, hf: dict, cfg: ModelConfig, ckpt: Checkpoint, embed: torch.Tensor) -> Optional[MLMHead]:
    spec = MLM_HEADS.get(family)
    if spec is None:
        return None
    prefix, dense, norm, dec_w, dec_b = spec
    if prefix + dense + ".weight" not in ckpt:
        return None
    act = "gelu" if family == "roberta" else cfg.activation  # RoBERTa's head always uses exact GELU
    head = MLMHead(cfg.d_model, cfg.src_vocab_size, act, cfg.norm_eps)
    with torch.no_grad():
        head.dense.weight.copy_(ckpt.get(prefix + dense + ".weight"))
        head.dense.bias.copy_(ckpt.get(prefix + dense + ".bias"))
        head.norm.weight.copy_(ckpt.get(prefix + norm + ".weight"))
        head.norm.bias.copy_(ckpt.get(prefix + norm + ".bias"))
        if prefix + dec_w in ckpt:  # an untied (or explicitly stored) output matrix
            w = ckpt.get(prefix + dec_w)
            check_shape(prefix + dec_w, w, [cfg.src_vocab_size, cfg.d_model])
            head.decoder.weight = nn.Parameter(w)
        else:  # tied to the token embedding
            head.decoder.weight = embed
        bias = next((prefix + b for b in dec_b if prefix + b in ckpt), None)
        if bias is None:
            raise CheckpointError(f"the masked-LM head lacks its output bias ({prefix + dec_b[0]!r})")
        for b in dec_b:  # both names may be stored (tied), both count as used
            if prefix + b in ckpt:
                head.decoder.bias.copy_(ckpt.get(prefix + b))
    return head.eval()


def _mlm_names(family: str, ckpt: Checkpoint) -> List[str]:
    spec = MLM_HEADS.get(family)
    if spec is None:
        return []
    prefix, dense, norm, dec_w, dec_b = spec
    return [prefix + n for n in (dense + ".weight", dense + ".bias", norm + ".weight", norm + ".bias", dec_w) + dec_b]


# ------------------------------------------------------------------------------ building the network
def build_net(family: str, hf: dict, ckpt: Checkpoint, progress: Progress = None):
    """(our Transformer, MLMHead or None) holding the checkpoint's tensors, as float32."""
    cfg = CONFIGS[family](hf)
    base = _base(ckpt, family)
    with torch.device("meta"):
        net = Transformer(cfg)
    ours = dict(net.state_dict(keep_vars=True))
    state: Dict[str, torch.Tensor] = {}
    rows = weight_table(family, cfg, ckpt, base)
    total = len(rows)
    for k, (theirs, mine, how) in enumerate(rows):
        if mine not in ours:
            if theirs in ckpt:  # a bias our config does not have
                raise CheckpointError(f"the checkpoint holds {theirs!r}, which this {family} config does not use")
            continue
        if theirs not in ckpt:
            continue  # reported below as a parameter left unfilled
        t = ckpt.get(theirs)
        if how == "T":
            t = t.t().contiguous()
        check_shape(theirs, t, ours[mine].shape)
        state[mine] = t
        if progress and k % 64 == 0:
            progress(f"reading tensors ({k}/{total})")
    if family == "gpt2":  # c_attn: x @ W (d x 3d) + b -> W_q, W_k, W_v
        d = cfg.d_model
        for i in range(cfg.n_layers):
            w_name, b_name = f"{base}h.{i}.attn.c_attn.weight", f"{base}h.{i}.attn.c_attn.bias"
            if w_name not in ckpt:
                continue
            w = ckpt.get(w_name)
            check_shape(w_name, w, [d, 3 * d])
            b = ckpt.get(b_name) if b_name in ckpt else None
            for j, part in enumerate(("w_q", "w_k", "w_v")):
                state[f"decoder.{i}.self_attn.{part}.weight"] = w[:, j * d:(j + 1) * d].t().contiguous()
                if b is not None:
                    state[f"decoder.{i}.self_attn.{part}.bias"] = b[j * d:(j + 1) * d].clone()
    tied = {"out_proj.weight"} if cfg.has_decoder and cfg.tie_embeddings else set()
    missing = [n for n in ours if n not in state and n not in tied]
    if missing:
        theirs_of = {m: t for t, m, _ in rows}
        names = [theirs_of.get(m, m) for m in missing]
        raise CheckpointError(f"the checkpoint lacks {len(names)} tensor(s): {', '.join(names[:6])}"
                              + (" ..." if len(names) > 6 else ""))
    net.load_state_dict(state, strict=False, assign=True)
    if tied:
        net.out_proj.weight = net.tgt_embed.tok.weight
    head = None
    if cfg.kind == "encoder":
        head = _mlm_head(family, hf, cfg, ckpt, net.src_embed.tok.weight)
    used = set(ckpt.used) | {n for n in _mlm_names(family, ckpt) if n in ckpt and head is not None}
    if tied and "lm_head.weight" in ckpt:  # a tied copy stored anyway
        used.add("lm_head.weight")
    left = [n for n in ckpt.names() if n not in used and not IGNORED.match(n)]
    if left:
        raise CheckpointError(f"the checkpoint holds tensor(s) the {family} architecture here does not use: "
                              f"{', '.join(left[:6])}" + (" ..." if len(left) > 6 else ""))
    still_meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if still_meta:
        raise CheckpointError(f"tensors not filled from the checkpoint: {still_meta[:6]}")
    cfg.extra = {"family": family, "checkpoint_dtypes": ckpt.dtypes()}
    return net, head


# ------------------------------------------------------------------------------ tokenizer
_SURROGATE = re.compile("[\ud800-\udfff]")


class HFTokenizer(PieceTable):
    """Any tokenizer.json (WordPiece, byte-level BPE, SentencePiece-style BPE/Unigram) with the
    interface of core.tokenizer.WordTokenizer.

    encode(text) applies the file's own post-processor (BERT's [CLS] .. [SEP], Llama's <s>
    ...); special marks the tokens it added; tokens are display strings (byte-level pieces
    decoded to text, SentencePiece's "▁" shown as a space); offsets are character spans;
    word_ids come from the pre-tokenizer; unknown lists the typed words that became the unknown
    token. Longer input keeps the first max_len tokens (and a closing special token).
    """

    def __init__(self, path, max_len: int = 512):
        from tokenizers import Tokenizer, decoders

        from .byte_bpe import BYTE_OF

        try:
            self._tk = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise CheckpointError(f"{Path(path).name} cannot be read by the tokenizers package ({exc})") from None
        self._tk.no_padding()
        self._tk.no_truncation()
        self.max_len = max_len
        self._read_pieces(self._tk)
        self.byte_level = isinstance(self._tk.decoder, decoders.ByteLevel)
        self._byte_of = BYTE_OF
        self.mask_token = next((t for t in ("[MASK]", "<mask>") if t in self.index), None)
        self.mask_id = self.index.get(self.mask_token) if self.mask_token else None
        unk = next((t for t in ("[UNK]", "<unk>", "<|endoftext|>") if t in self.index), None)
        self.unk_id = self.index.get(unk) if unk in ("[UNK]", "<unk>") else None

    def token_id(self, tok: str) -> int:
        return self.index[tok] if tok in self.index else self.unk_id

    def token_str(self, i: int) -> str:
        i = int(i)
        if not 0 <= i < len(self.pieces):  # checkpoints often pad the embedding past the tokenizer's vocabulary
            return f"<id {i}>"
        piece = self.pieces[i]
        raw = self.piece_bytes(i)
        if raw is not None:
            return display_pieces([raw], [piece])[0]
        return piece.replace("\u2581", " ")

    def piece_bytes(self, i: int) -> Optional[bytes]:
        """The bytes a byte-level piece stands for (None otherwise)."""
        i = int(i)
        piece = self.pieces[i] if 0 <= i < len(self.pieces) else ""
        if self.byte_level and piece and all(c in self._byte_of for c in piece):
            return bytes(self._byte_of[c] for c in piece)
        return None

    def decode(self, ids: List[int]) -> List[str]:
        """Display strings of a sequence: a character split over pieces is shown whole, marked
        (core.tokenizer.display_pieces)."""
        return display_pieces([self.piece_bytes(i) for i in ids], [self.token_str(i) for i in ids])

    def encode(self, text: str) -> Encoded:
        from .minilm import _uncovered

        text = _SURROGATE.sub("\ufffd", str(text))
        e = self._tk.encode(text, add_special_tokens=True)
        ids, offsets = list(e.ids), [tuple(o) for o in e.offsets]
        special = [bool(s) for s in e.special_tokens_mask]
        word_ids = [None if s else w for w, s in zip(e.word_ids, special)]
        dropped = _uncovered(text, [o for o, s in zip(offsets, special) if not s])
        unknown = [text[s:t] for i, (s, t) in zip(ids, offsets) if self.unk_id is not None and i == self.unk_id]
        truncated = 0
        if self.max_len is not None and len(ids) > self.max_len:
            truncated = len(ids) - self.max_len
            keep = list(range(self.max_len - 1)) + [len(ids) - 1] if special[-1] else list(range(self.max_len))
            ids, offsets, special, word_ids = ([x[k] for k in keep] for x in (ids, offsets, special, word_ids))
        return Encoded(ids=ids, tokens=self.decode(ids), offsets=offsets, special=special,
                       unknown=unknown, dropped=dropped, truncated=truncated, word_ids=word_ids)


# ------------------------------------------------------------------------------ the model
class HFModel(AttentionModel):
    """An AttentionModel loaded from a checkpoint folder; encoders with a masked-LM head also
    fill in [MASK] / <mask> tokens (fill_mask, trace.meta["fill_mask"])."""

    mlm_head: Optional[MLMHead] = None

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The masked-LM head's logits (n x V) for final hidden states (n x d)."""
        if self.mlm_head is None:
            raise ValueError(f"{self.name} has no masked-LM head")
        with torch.inference_mode():
            head = self.mlm_head.to(self.device)
            return head(hidden.to(self.device, torch.float32)).cpu()

    def _fills(self, hidden: torch.Tensor, ids: List[int], k: int) -> List[dict]:
        mask_id = getattr(self.tokenizer, "mask_id", None)
        pos = [i for i, t in enumerate(ids) if mask_id is not None and t == mask_id]
        if self.mlm_head is None or not pos:
            return []
        probs = torch.softmax(self.mlm_logits(hidden[pos]), dim=-1)
        top = torch.topk(probs, min(k, probs.shape[-1]))
        return [{"position": p, "top": [(self.tokenizer.token_str(i), float(v)) for i, v in zip(ti.tolist(), tv.tolist())]}
                for p, ti, tv in zip(pos, top.indices, top.values)]

    def fill_mask(self, text: str, k: int = 5) -> List[dict]:
        """Top-k fill-ins for each mask token in `text`: [{"position", "top": [(token, p)]}]."""
        enc = self.encode(text)
        with torch.inference_mode():
            hidden = self.net(self._ids(enc.ids))[0]
        return self._fills(hidden, list(enc.ids), k)

    def trace(self, text: str, *args, **kwargs):
        """AttentionModel.trace, plus meta["fill_mask"] when the text holds mask tokens."""
        tr = super().trace(text, *args, **kwargs)
        if self.mlm_head is not None and self.kind == "encoder":
            mask_str = self.tokenizer.token_str(self.tokenizer.mask_id)
            toks = tr.tokens("source")
            if mask_str in toks:
                ids = [self.tokenizer.mask_id if t == mask_str else -1 for t in toks]
                hidden = tr[f"encoder.{self.config.n_layers - 1}.out"]
                tr.meta["fill_mask"] = self._fills(torch.as_tensor(hidden, dtype=torch.float32), ids, 5)
        return tr


def _ids_from(hf: dict, key: str) -> Optional[int]:
    v = hf.get(key)
    if isinstance(v, list):
        v = v[0] if v else None
    return int(v) if v is not None else None


def load_folder(folder, device=None, name: Optional[str] = None, progress: Progress = None) -> AttentionModel:
    """A Hugging Face checkpoint folder as an AttentionModel (see the module docstring)."""
    folder = Path(folder)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    say("reading config.json")
    hf = read_config(folder)
    family = hf.get("model_type")
    if family in SEQ2SEQ:
        try:
            from .hf_seq2seq import load as load_seq2seq
        except ImportError:
            raise unsupported(family) from None
        return load_seq2seq(folder, pick_device(device))
    if family not in FAMILIES:
        raise unsupported(family)
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder.name}: no tokenizer.json in the folder (it is needed to turn text into tokens)")
    ckpt = open_checkpoint(folder)
    say(f"reading {len(ckpt.names())} tensors ({', '.join(ckpt.dtypes())} -> float32)")
    try:
        net, head = build_net(family, hf, ckpt, progress)
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}, which a {family} model needs") from None
    say("reading tokenizer.json")
    cfg = net.cfg
    tok = HFTokenizer(folder / "tokenizer.json", max_len=cfg.max_len)
    n = sum(p.numel() for p in net.parameters())
    start = end = None
    if cfg.kind == "encoder":
        start = tok.index.get("[CLS]", tok.index.get("<s>"))
        end = tok.index.get("[SEP]", tok.index.get("</s>"))
    else:
        end = _ids_from(hf, "eos_token_id")
    model = local_model(name or folder.name, net, tok, device, f"{family} checkpoint from {folder.name}", folder,
                        family, n, t0, cfg.kind, start_id=start, end_id=end, dtypes=ckpt.dtypes(),
                        masked_lm=head is not None)
    model.mlm_head = head
    if head is not None and tok.mask_token:
        model.examples = [f"The capital of France is {tok.mask_token}."] + model.examples
    say("ready")
    return model


def local_model(name: str, net, tok, device, what: str, path: Path, family: str, n: int, t0: float, kind: str,
                start_id=None, end_id=None, **info) -> "HFModel":
    """A model read from a local file or folder (a checkpoint here, a GGUF file in
    core/gguf_file.py) as the app shows it: `what` and its parameter count as the description,
    up to 32 new tokens, the examples of its kind, and where it came from and how long it
    took (since t0) in `info`."""
    return HFModel(
        name,
        net,
        tok,
        device=pick_device(device),
        description=f"{what} ({human_size(n)} parameters)",
        start_id=start_id,
        end_id=end_id,
        max_new_tokens=32,
        examples=EXAMPLES.get(kind, []),
        info={"path": str(path), "family": family, "parameters": n, "load_s": round(time.perf_counter() - t0, 3),
              **info},
    )


EXAMPLES = {
    "encoder": ["The animal didn't cross the street because it was too tired.", "Attention is all you need."],
    "decoder": ["The capital of France is", "The cat sat on the mat because it was tired."],
}


def human_size(n: int) -> str:
    for unit, k in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= k:
            return f"{n / k:.1f}{unit}".replace(".0", "")
    return str(n)


def load_path(path, device=None, name: Optional[str] = None, progress: Progress = None) -> AttentionModel:
    """A folder (config.json + safetensors) or a .gguf file, as an AttentionModel."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        from .gguf_file import load_gguf

        return load_gguf(path, device=device, name=name, progress=progress)
    if path.is_dir():
        return load_folder(path, device=device, name=name, progress=progress)
    if path.is_file() and path.suffix in (".bin", ".pt", ".pth", ".ckpt"):
        raise CheckpointError(f"{path.name}: pickle weights are never loaded; convert them to safetensors")
    raise CheckpointError(f"{path}: neither a checkpoint folder nor a .gguf file")


# ------------------------------------------------------------------------------ finding models on disk
@dataclass
class LocalModel:
    name: str  # folder or file name, as the picker shows it
    path: Path
    family: str  # model_type / GGUF architecture ("?" when unreadable)
    size: str  # parameter count ("124M") or file size ("12 MB")
    problem: Optional[str] = None  # why it will not load, when that is known without loading

    @property
    def kind(self) -> str:
        """encoder / decoder / encoder-decoder by family ("?" when unknown)."""
        if self.family in ("bert", "roberta", "distilbert"):
            return "encoder"
        if self.family in ("gpt2", "llama", "mistral", "qwen2"):
            return "decoder"
        return "encoder-decoder" if self.family in SEQ2SEQ else "?"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.family}, {self.size})"


def describe(path: Path) -> Optional[LocalModel]:
    """A LocalModel for a folder or a .gguf file, reading only headers; None if it is neither."""
    path = Path(path)
    try:
        if path.is_file() and path.suffix.lower() == ".gguf":
            from .gguf_file import describe_gguf

            family, n = describe_gguf(path)
            return LocalModel(path.name, path, family, human_size(n))
        if not path.is_dir() or not (path / "config.json").is_file():
            return None
    except OSError:
        return None
    try:
        family = str(read_config(path).get("model_type", "?"))
    except CheckpointError as exc:
        return LocalModel(path.name, path, "?", "?", str(exc))
    problem = None if family in supported_families() else str(unsupported(family))
    try:
        n = open_checkpoint(path).n_parameters()
        return LocalModel(path.name, path, family, human_size(n), problem)
    except CheckpointError as exc:
        return LocalModel(path.name, path, family, "?", problem or str(exc))


def discover(roots: str, taken=()) -> Dict[str, LocalModel]:
    """Every model folder or .gguf file one level inside the folders of `roots` (separated by
    os.pathsep, like PATH), by name; a name already taken (registry or an earlier folder)
    gets a suffix "-2", "-3", .... Hidden entries are skipped."""
    out: Dict[str, LocalModel] = {}
    used = set(taken)
    for root in [r for r in (roots or "").split(os.pathsep) if r.strip()]:
        root_path = Path(root).expanduser()
        try:
            entries = sorted(root_path.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            found = describe(entry)
            if found is None:
                continue
            name, k = found.name, 2
            while name in used:
                name, k = f"{found.name}-{k}", k + 1
            found.name = name
            used.add(name)
            out[name] = found
    return out
