"""Direct logit attribution per head, written here in float64 from the trace's stored head
outputs and the model's state dict, with no code of core.analysis: the reference the pages'
lists of heads are held against (core's own attribution is held against transformers in
tests/parity/test_lens.py).

For a pre-norm decoder with an RMS final norm (smollm2): the logit difference is
y . (u_t - u_b), y = g * x / s, s = sqrt(mean(x^2) + eps), x the last block's output. With s
frozen at its traced value (as the lens page states), head h of block l contributes
(W_o[:, h] @ z_lh) * g / s . (u_t - u_b), z_lh its stored output at the position."""

from __future__ import annotations

import torch

F64 = torch.float64


def head_contributions(model, trace, target: str, baseline: str, position: int = -1, bound: bool = False):
    """(layers, heads) float64: each head's direct contribution to logit(target) - logit(baseline).
    bound=True: also (layers, heads), how far a float32 computation of the same contribution
    can be from it: gamma(d_k + d + 8) (W_o's product, the dot with the direction, the norm's
    scale and the unembedding difference, tests/precision.py) times the sum of the absolute
    terms, any summation order."""
    cfg = model.config
    assert cfg.norm != "layernorm" and cfg.logit_scale == 1.0 and cfg.final_softcap is None, "written for smollm2-like decoders"
    sd = {k: v.detach().to(F64) for k, v in model.net.state_dict().items()}
    (t,), (b,) = model.tokenizer.encode(target).ids, model.tokenizer.encode(baseline).ids
    unembed = sd["out_proj.weight"]
    L, dk = cfg.n_layers, cfg.d_head
    x = trace[f"decoder.{L - 1}.out"][position].to(F64)
    s = torch.sqrt((x ** 2).mean() + cfg.norm_eps)
    direction = sd["decoder_norm.weight"] / s * (unembed[t] - unembed[b])
    out = torch.zeros(L, cfg.n_heads, dtype=F64)
    mag = torch.zeros(L, cfg.n_heads, dtype=F64)
    for layer in range(L):
        w_o = sd[f"decoder.{layer}.self_attn.w_o.weight"]
        z = trace[f"decoder.{layer}.self_attn.heads"][:, position].to(F64)
        for h in range(cfg.n_heads):
            out[layer, h] = (w_o[:, h * dk:(h + 1) * dk] @ z[h]) @ direction
            mag[layer, h] = (w_o[:, h * dk:(h + 1) * dk].abs() @ z[h].abs()) @ direction.abs()
    if bound:
        from precision import gamma

        return out, gamma(dk + x.shape[0] + 8) * mag
    return out
