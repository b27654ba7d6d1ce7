"""Direct logit attribution: how much each head, each MLP and the embeddings add to one
logit (or to the difference of two), read from a trace.

    df = core.analysis.logit_attribution(trace, " Mary", baseline=" John")

In a pre-norm model the residual stream after the last layer is a sum,
    x_L = e + sum_i [ sum_h head_{i,h} W_o^{h T} + b_o,i + mlp_i ],
e the embedding sum (`embed.decoder.sum`), head_{i,h} head h's output (the stored
`decoder.{i}.{attn}.heads`, H x n x d_k, GQA's query heads each with its own slice of W_o),
b_o,i the output projection's bias and mlp_i the FFN's output. The logits are
Norm(x_L) W_U^T (times logit_scale, T5), and with the final norm's scale s frozen at its
traced value (s = 1 / rms(x_L), RMSNorm; 1 / std(x_L) after centring, LayerNorm) Norm is
linear: each term t contributes (centre(t) * s * g) . u, u = W_U[target] - W_U[baseline]
(times logit_scale), and the norm's shift adds beta . u. Rows: kind in {"embed", "head",
"attn_bias", "mlp", "norm_bias"} (and "out_bias" where the output projection has a bias),
layer (-1 where none), head (-1 where none), attn ("self_attn" / "cross_attn" for heads and
attention biases, else ""), contribution. They add up to the logit (difference).

The terms are computed independently of the pass's own output: the heads' outputs through
W_o from the checkpoint, each MLP run again at this one position on its input rebuilt from
the stored layer input plus those attention outputs. df.attrs["model_logit"] is the model's
own logit (difference), from the pass's final hidden state through the output projection;
the sum of the rows equals it to float32 rounding, which the Lens page checks.

Parallel blocks (GPT-NeoX): the MLP is run on the layer's input, as the block runs it. Norms
after the sub-layers (Gemma 2/3, OLMo-2; RMSNorms): their scale frozen at the sub-layer's
traced output, as the final norm's, each of its terms is multiplied by g / rms(output).
A final logit soft-cap (Gemma 2: c tanh(logit / c)) gets a ValueError: it bends each logit by
its own amount after the sum, so the logit (difference) is not a sum of terms.

An output gate (Qwen3.5, Qwen3-Next: heads * sigmoid(x W_g) before W_o): each head's term is
its gated output through its slice of W_o, the gate read from the trace (`{attn}.gate`). A
layer whose token mixer is not softmax attention (core/net/mixer.py) writes its mixer's output
(`{stack}.{i}.mixer.out`) as one term, kind "mixer": its heads pass through a gated norm of
each head before the out-projection, which is not linear in them. A mixer beside the attention
(Falcon-H1) is such a term too, beside the attention's heads.

Post-norm models (toy-translate, BERT, Marian, BART) get a ValueError: each of their layers
ends with a LayerNorm of the residual sum, which divides the whole stream by its own size
again at every layer, so the output is not a sum of the heads' and MLPs' outputs and no
single frozen scale makes it one.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd
import torch

from . import _checks as checks
from .logit_lens import Token, model_of
from .token_ids import output_token_id
from .. import trace_names as tn
from ..net.norms import RMSNorm

KINDS = ("embed", "head", "attn_bias", "mlp", "mixer", "norm_bias", "out_bias")
COLUMNS = ["kind", "layer", "head", "attn", "contribution"]


def check_applies(model) -> None:
    """A ValueError saying why direct logit attribution does not apply to this model, if it does not."""
    cfg = model.config
    if not cfg.has_decoder:
        raise ValueError(f"{model.name} is an encoder: it predicts no next token, and its masked-LM head "
                         "(dense, GELU, LayerNorm) is not linear, so its logits do not split into terms")
    if cfg.norm_placement != "pre":
        raise ValueError(f"{model.name} is post-norm: every layer ends with a LayerNorm of its residual sum, which "
                         "rescales the whole stream again at every layer, so the output is not a sum of the heads' "
                         "and MLPs' outputs and direct logit attribution does not decompose it (it needs a pre-norm "
                         "model, where the final norm is the only one between the stream and the logits)")
    if cfg.final_softcap is not None:
        raise ValueError(f"{model.name} soft-caps its logits (c tanh(logit / c), c = {cfg.final_softcap:g}): the cap "
                         "bends the sum of the heads' and MLPs' terms after the final norm, and a different amount for "
                         "each logit, so the logit (difference) is not a sum of their contributions and direct logit "
                         "attribution does not decompose it (it needs an output that is linear after the final norm)")
    if cfg.per_layer_dim or cfg.layer_scalar:
        raise ValueError(f"{model.name} adds per-layer inputs after each FFN and scales each layer's output (Gemma 4): "
                         "the stream is not the sum of the heads' and MLPs' writes that direct logit attribution "
                         "splits the output into")
    post = [n for layer in model.net.layers("decoder") if layer.post_norms is not None for n in layer.post_norms]
    if any(not isinstance(n, RMSNorm) for n in post):
        raise ValueError(f"{model.name} has LayerNorms after its sub-layers: their centring is not handled, so direct "
                         "logit attribution does not decompose its output")


def _post_scale(layer, j: int):
    """fn(f) -> the factor the norm after sub-layer j multiplies its output f by, its scale
    frozen at f (an RMSNorm: g / rms(f)); 1 without such a norm."""
    if layer.post_norms is None:
        return lambda f: 1.0
    norm = layer.post_norms[j]
    return lambda f: norm.weight / torch.sqrt(f.pow(2).mean() + norm.eps)


@torch.inference_mode()
def logit_attribution(trace, target: Token, baseline: Optional[Token] = None, position: int = -1) -> pd.DataFrame:
    """Direct logit attribution of logit[target] - logit[baseline] (baseline None:
    logit[target]) at a decoder position (negative from the end). See the module docstring."""
    model = model_of(trace, "direct logit attribution")
    check_applies(model)
    net, cfg, stack = model.net, model.config, "decoder"
    n_layers = trace.layers(stack)
    n = trace[tn.embed(stack)].shape[0]
    p = checks.position(position, n, "position")
    t_id = output_token_id(model, target, "target token")
    b_id = None if baseline is None or baseline == "" else output_token_id(model, baseline, "baseline token")
    dev, dtype = model.device, next(net.parameters()).dtype
    f64 = torch.float64

    w_u = net.out_proj.weight  # V x d (the token embedding where tied)
    u = w_u[t_id].to("cpu", f64) - (w_u[b_id].to("cpu", f64) if b_id is not None else 0.0)
    u = u * cfg.logit_scale

    # the final norm, its scale frozen at the traced value of the last layer's output
    x_l = trace[tn.out(stack, n_layers - 1)][p].to(f64)
    norm = net.final_norm(stack)
    centre = isinstance(norm, torch.nn.LayerNorm)
    if norm is None:
        scale, gain, shift = 1.0, torch.ones_like(x_l), None
    else:
        eps = norm.eps
        if centre:
            scale = 1.0 / torch.sqrt(x_l.var(unbiased=False) + eps)
        else:
            scale = 1.0 / torch.sqrt(x_l.pow(2).mean() + eps)
        gain = norm.weight.to("cpu", f64) if norm.weight is not None else torch.ones_like(x_l)
        shift = getattr(norm, "bias", None)
    direction = scale * gain * u  # Norm(x) . u = centre(x) . direction (+ beta . u)

    def contribution(t: torch.Tensor) -> float:
        t = t.to("cpu", f64)
        if centre:
            t = t - t.mean(-1, keepdim=True)
        return (t @ direction).tolist()

    rows = [("embed", -1, -1, "", contribution(trace[tn.embed(stack)][p]))]
    ablate = getattr(trace.runner, "ablate", None)
    for i, layer in enumerate(net.layers(stack)):
        x_in = trace.layer_input(stack, i)[p].to(dev, dtype)
        resid = x_in
        hooks = ablate.hooks(stack, i) if ablate else {}
        for j, kind in enumerate(layer.sublayers()):
            post = _post_scale(layer, j)
            if kind == "ffn":
                y = x_in if layer.parallel else resid  # the parallel block's FFN reads the layer's input
                normed = layer.norms[j](y[None]) if len(layer.norms) else y[None]
                mlp = layer.ffn(normed)[0]
                mlp = mlp * post(mlp)
                rows.append(("mlp", i, -1, "", contribution(mlp)))
                resid = resid + mlp
                continue
            if kind == tn.MIXER:  # one term: the mixer's output (its gated norm is not linear in its heads)
                out = trace[tn.mixer(stack, i, "out")][p].to(dev, dtype)
                out = out * post(out)
                rows.append(("mixer", i, -1, "", contribution(out)))
                resid = resid + out
                continue
            attn = getattr(layer, kind)
            heads = trace[f"{stack}.{i}.{kind}.heads"]  # H x n x d_k, as computed
            fn = hooks.get(f"{kind}.heads")
            if fn is not None:  # the ablated pass continued from the hook's value
                heads = fn(heads[None])[0]
            h_p = heads[:, p].to(dev, dtype)  # H x d_k
            if attn.w_gate is not None:  # the output gate, as the pass applied it
                h_p = h_p * trace[tn.attn(stack, i, kind, tn.GATE)][:, p].to(dev, dtype)
            w_o = attn.w_o.weight  # d x (H d_k)
            per_head = torch.einsum("hk,dhk->hd", h_p, w_o.view(w_o.shape[0], attn.h, attn.dk))  # H x d
            out = per_head.sum(0) + (attn.w_o.bias if attn.w_o.bias is not None else 0.0)
            factor = post(out)  # the norm after the sub-layer, its scale frozen at this output (or 1)
            for h, c in enumerate(contribution(per_head * factor)):
                rows.append(("head", i, h, kind, c))
            if attn.w_o.bias is not None:
                rows.append(("attn_bias", i, -1, kind, contribution(attn.w_o.bias * factor)))
            resid = resid + out * factor
            if kind == "self_attn" and getattr(layer, "beside", False):  # Falcon-H1: the mixer beside it
                side = trace[tn.mixer(stack, i, "out")][p].to(dev, dtype)
                rows.append(("mixer", i, -1, "", contribution(side * factor)))
                resid = resid + side * factor
    if shift is not None:
        rows.append(("norm_bias", -1, -1, "", float(shift.to("cpu", f64) @ u)))
    if net.out_proj.bias is not None:
        b = net.out_proj.bias.to("cpu", f64)
        rows.append(("out_bias", -1, -1, "", float(b[t_id] - (b[b_id] if b_id is not None else 0.0))))
    df = pd.DataFrame(rows, columns=COLUMNS)

    logits = trace.runner.logits(trace, rows=slice(p, p + 1))[0].double()
    own = logits[t_id] - (logits[b_id] if b_id is not None else 0.0)
    strings = model.alternative_strings
    df.attrs.update(position=p, target_id=t_id, baseline_id=b_id, target=strings([t_id])[0],
                    baseline=None if b_id is None else strings([b_id])[0], model_logit=float(own),
                    total=float(df["contribution"].sum()), n_layers=n_layers, n_heads=cfg.n_heads)
    return df
