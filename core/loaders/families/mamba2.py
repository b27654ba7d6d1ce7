"""Mamba2 (state-spaces' Mamba2 checkpoints as transformers saves them): a stack of Mamba2
blocks, x + Mixer(RMSNorm(x)), with no attention and no FFN (ModelConfig.mixer kind "mamba2"
with "ffn": False; the mixer is core/net/mamba2.py), a final RMSNorm and the output projection.

    backbone.embeddings                 -> tgt_embed.tok (older checkpoints: backbone.embedding)
    backbone.layers.{i}.norm            -> decoder.{i}.norms.0
    backbone.layers.{i}.mixer.in_proj   -> decoder.{i}.mixer.in_proj
    backbone.layers.{i}.mixer.conv1d    -> decoder.{i}.mixer.conv1d
    backbone.layers.{i}.mixer.dt_bias / A_log / D / norm.weight / out_proj -> the same under decoder.{i}.mixer
    backbone.norm_f                     -> decoder_norm
    lm_head                             -> out_proj (absent when tied to the embeddings)

Not supported (CheckpointError): an activation other than SiLU, heads x head_dim other than
expand x hidden_size.
"""

from __future__ import annotations

from ...net.config import ModelConfig
from ..checkpoint import CheckpointError
from ..hf_config import DECODER_MAX_LEN

MODEL_TYPES = ("mamba2",)
BASES = (("backbone.", ""), "norm_f.weight")

# the mixer's tensors, by their name under "mixer." in both checkpoints (ours keep transformers' names)
MIXER_TENSORS = ("in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D",
                 "norm.weight", "out_proj.weight", "out_proj.bias")


def _number(v) -> float:
    """A float of config.json: transformers writes infinity as {"__float__": "Infinity"}."""
    if isinstance(v, dict) and "__float__" in v:
        return float(v["__float__"])
    return float(v)


def mixer_settings(hf: dict, heads: str, head_dim: str, d_state: str, groups: str, conv: str, chunk: str,
                   bias: str, conv_bias: str, d_inner: int, eps: float) -> dict:
    """ModelConfig.mixer for a Mamba2 mixer from config.json's keys (named per family)."""
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(f"a Mamba2 mixer with hidden_act {act!r} is not supported (only silu)")
    h, p = int(hf[heads]), int(hf[head_dim])
    if h * p != d_inner:
        raise CheckpointError(f"Mamba2 heads x head_dim ({h} x {p}) must equal the mixer's inner size {d_inner}")
    lo, hi = hf.get("time_step_limit") or (0.0, float("inf"))
    return {"kind": "mamba2", "heads": h, "head_dim": p, "d_state": int(hf[d_state]), "groups": int(hf.get(groups, 1)),
            "conv": int(hf.get(conv, 4)), "chunk": int(hf.get(chunk, 256)), "norm_eps": float(eps),
            "bias": bool(hf.get(bias, False)), "conv_bias": bool(hf.get(conv_bias, True)),
            "dt_limit": [_number(lo), _number(hi)]}


def mixer_rows(base: str, theirs: str, ours: str):
    """(checkpoint name, our name, "") for every tensor of one Mamba2 mixer."""
    return [(f"{base}{theirs}.{t}", f"{ours}.{t}", "") for t in MIXER_TENSORS]


def config(hf: dict) -> ModelConfig:
    d, n = int(hf["hidden_size"]), int(hf["num_hidden_layers"])
    eps = float(hf.get("layer_norm_epsilon", 1e-5))
    mixer = mixer_settings(hf, "num_heads", "head_dim", "state_size", "n_groups", "conv_kernel", "chunk_size",
                           "use_bias", "use_conv_bias", int(hf.get("expand", 2) * d), eps)
    return ModelConfig(kind="decoder", d_model=d, n_heads=mixer["heads"], d_head=mixer["head_dim"], d_ff=1,
                       n_layers=n, tgt_vocab_size=int(hf["vocab_size"]), max_len=DECODER_MAX_LEN,
                       positional="none", norm="rmsnorm", norm_eps=eps, norm_placement="pre", activation="silu",
                       bias=False, final_norm=True, tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       layer_types=["linear_attention"] * n, mixer=dict(mixer, ffn=False),
                       pad_id=hf.get("pad_token_id") or 0)


def split_fused(cfg, base, ckpt, state) -> None:
    """No fused tensors; the embedding table under its older name (transformers renames it on load too)."""
    old = f"{base}embedding.weight"
    if f"{base}embeddings.weight" not in ckpt and old in ckpt:
        state["tgt_embed.tok.weight"] = ckpt.get(old)


def weight_rows(cfg: ModelConfig, base: str):
    out = [(base + "embeddings.weight", "tgt_embed.tok.weight", ""), (base + "norm_f.weight", "decoder_norm.weight", "")]
    for i in range(cfg.n_layers):
        out.append((f"{base}layers.{i}.norm.weight", f"decoder.{i}.norms.0.weight", ""))
        out += mixer_rows(base, f"layers.{i}.mixer", f"decoder.{i}.mixer")
    if not cfg.tie_embeddings:
        out.append(("lm_head.weight", "out_proj.weight", ""))
    return out
