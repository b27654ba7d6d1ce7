"""The weights of a Hugging Face checkpoint in our Transformer: each family's weight-name
table, and build_net, which fills the network from the checkpoint's tensors.

Checkpoints saved from a task model (BertForMaskedLM, GPT2LMHeadModel, LlamaForCausalLM,
...) or the bare model both load: the base prefix ("bert.", "model.", "transformer.") is
found from the tensor names. Every tensor of the checkpoint must be used (a few known
buffers and poolers aside) and every parameter of ours must be filled, else the error names
the tensors.

dtype and memory: tensors are read one at a time from memory-mapped safetensors files and
converted to float32 (bfloat16 / float16 checkpoints included); the network is built on the
meta device and takes them as they are, so the peak is the float32 model plus one stored
tensor. Computation is float32 on every device: on CUDA the float32 weights are moved to the
GPU by AttentionModel (no half-precision compute, so traces match the CPU's to rounding).
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .checkpoint import Checkpoint, CheckpointError, check_shape
from ..net.config import ModelConfig
from . import families
from .hf_config import CONFIGS
from .masked_lm import mlm_names, read_mlm_head
from .minilm import EMBED_MAP as MINILM_EMBED
from .minilm import LAYER_MAP as MINILM_LAYER
from ..net.model import Transformer

Progress = Optional[Callable[[str], None]]

# (checkpoint name under the base prefix, our name); "{i}" is the layer; ".weight"/".bias"
# are added where present. LAYER_T entries are Conv1D (stored transposed).
BERT_EMBED, BERT_LAYER = MINILM_EMBED, MINILM_LAYER  # the tables core/loaders/minilm.py uses for all-MiniLM-L6-v2
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


def _base(ckpt: Checkpoint, family: str, mod=None) -> str:
    prefixes, probe = mod.BASES if mod is not None else BASES[family]
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


def build_net(family: str, hf: dict, ckpt: Checkpoint, progress: Progress = None):
    """(our Transformer, MLMHead or None) holding the checkpoint's tensors, as float32."""
    mod = families.module(family)  # a family with a module of its own (core/loaders/families)
    cfg = (mod.config if mod is not None else CONFIGS[family])(hf)
    base = _base(ckpt, family, mod)
    with torch.device("meta"):
        net = Transformer(cfg)
    ours = dict(net.state_dict(keep_vars=True))
    state: Dict[str, torch.Tensor] = {}
    rows = mod.weight_rows(cfg, base) if mod is not None else weight_table(family, cfg, ckpt, base)
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
        elif how == "+1":  # Gemma's RMSNorm stores w and scales by (1 + w): our gain is 1 + w
            t = t + 1.0
        check_shape(theirs, t, ours[mine].shape)
        state[mine] = t
        if progress and k % 64 == 0:
            progress(f"reading tensors ({k}/{total})")
    if mod is not None and hasattr(mod, "split_fused"):
        mod.split_fused(cfg, base, ckpt, state)
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
        head = read_mlm_head(family, hf, cfg, ckpt, net.src_embed.tok.weight)
    used = set(ckpt.used) | {n for n in mlm_names(family, ckpt) if n in ckpt and head is not None}
    if tied and "lm_head.weight" in ckpt:  # a tied copy stored anyway
        used.add("lm_head.weight")
    extra_ignored = getattr(mod, "IGNORED", None)
    left = [n for n in ckpt.names() if n not in used and not IGNORED.match(n)
            and not (extra_ignored is not None and extra_ignored.match(n))]
    if left:
        raise CheckpointError(f"the checkpoint holds tensor(s) the {family} architecture here does not use: "
                              f"{', '.join(left[:6])}" + (" ..." if len(left) > 6 else ""))
    still_meta = [n for n, t in list(net.named_parameters()) + list(net.named_buffers()) if t.is_meta]
    if still_meta:
        raise CheckpointError(f"tensors not filled from the checkpoint: {still_meta[:6]}")
    cfg.extra = {"family": family, "checkpoint_dtypes": ckpt.dtypes()}
    return net, head
