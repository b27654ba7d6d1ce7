"""The weights of a Hugging Face checkpoint in our Transformer: build_net fills the network
from the checkpoint's tensors, by the weight table of the model_type's family module
(core/loaders/families: bert, gpt2, llama, ...; config reading shared in core/loaders/hf_config.py).

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
from typing import Callable, Dict, Optional

import torch

from .checkpoint import Checkpoint, CheckpointError, check_shape
from . import families
from .masked_lm import mlm_names, read_mlm_head
from ..net.model import Transformer

Progress = Optional[Callable[[str], None]]

# tensors that carry no parameter of the forward pass we run (buffers, poolers, NSP heads)
IGNORED = re.compile(
    r"^(.*embeddings\.position_ids|.*pooler\..*|cls\.seq_relationship\..*|.*\.attn\.(masked_)?bias"
    r"|.*rotary_emb\.inv_freq|classifier\..*|qa_outputs\..*|score\..*)$"
)


def _base(ckpt: Checkpoint, family: str, mod) -> str:
    """The base prefix of the checkpoint's tensor names ("bert.", "model.", ""): a family
    module's BASES, or its BASES_BY_TYPE entry for this model_type where it reads several."""
    prefixes, probe = getattr(mod, "BASES_BY_TYPE", {}).get(family, mod.BASES)
    for p in prefixes:
        if p + probe in ckpt:
            return p
    raise CheckpointError(f"this is not a {family} checkpoint: it lacks {prefixes[0] + probe!r}")


def build_net(family: str, hf: dict, ckpt: Checkpoint, progress: Progress = None):
    """(our Transformer, MLMHead or None) holding the checkpoint's tensors, as float32."""
    mod = families.module(family)  # every family is a module of core/loaders/families
    if mod is None:
        raise CheckpointError(f"no family module reads model_type {family!r}")
    cfg = mod.config(hf)
    base = _base(ckpt, family, mod)
    with torch.device("meta"):
        net = Transformer(cfg)
    ours = dict(net.state_dict(keep_vars=True))
    state: Dict[str, torch.Tensor] = {}
    rows = mod.weight_rows(cfg, base)
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
    if hasattr(mod, "split_fused"):  # fused tensors (GPT-2's c_attn, ...)
        mod.split_fused(cfg, base, ckpt, state)
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
