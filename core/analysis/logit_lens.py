"""The logit lens (nostalgebraist 2020): the model's own output head applied to the residual
stream at every layer boundary, read from a trace.

    df = core.analysis.lens(trace, k=5, target=" Paris")

Layer 0 is the input of layer 0 (the embeddings, `embed.{stack}.sum`), layer i + 1 the
output of layer i (`{stack}.{i}.out`), layer L the last layer's output, where the lens is the
model's own output. The head is what the model puts after its last layer: a decoder's final
norm (where it has one) and output projection (logit_scale included); an encoder's masked-LM
head (core/loaders/masked_lm.py). One row per (layer, position): the input token, the top-k
tokens of the lens (ids and probabilities), the target's probability, the entropy (nats) and
kl = KL(model's output || lens) (nats). The model's output is the head applied to the pass's
own final hidden state (`{stack}.final_norm` where stored), so kl at layer L is zero to float
rounding, a check and not a definition.

Post-norm models (toy-translate, BERT, Marian, BART): their stream is renormalised by every
layer's last LayerNorm and the head reads the last one's output directly (no final norm), so
every layer's output sits where the head expects its input, and the lens applies as is. Their
layer 0 is the embedding sum as the first layer reads it (BERT and BART normalise it; the toy
model and Marian do not, so that row reads the head on an unnormalised vector).

Memory: positions are taken a chunk at a time (CHUNK) and, within a chunk, a few layers at a
time (ROWS (layer, position) rows a matmul), so no more than ROWS rows of logits and a chunk's
distributions of two layers (the output and the layer at hand) exist at once, whatever the
input's length. The softmax is float64: in float32, KL of 100+ nats (the early layers of
smollm2) comes out 1e-3 off. Only the positions asked for are computed
(default: every position up to DEFAULT_POSITIONS tokens, else the last DEFAULT_POSITIONS).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import pandas as pd
import torch
from .. import trace_names as tn
from . import _checks as checks
from .token_ids import Token, output_token_id, output_vocab

DEFAULT_POSITIONS = 32  # positions computed by default at longer inputs: the last ones
CHUNK = 128  # positions whose output distribution is held at once (float64: 128 x 49,152 x 8 bytes = 48 MiB)
ROWS = 256  # (layer, position) rows whose logits one matmul computes (float32: 256 x 49,152 x 4 = 48 MiB)


COLUMNS = ["layer", "position", "token", "top_tokens", "top_ids", "top_probs", "target", "target_id",
           "target_prob", "entropy", "kl"]


def model_of(trace, what: str):
    """The model that made the trace (its weights read the stream), or a ValueError."""
    if trace.model is None:
        raise ValueError(f"{what} needs the model's weights: this trace was loaded without its model")
    return trace.model


def lens_stack(trace, model) -> str:
    """The stack the lens reads: the decoder, or an encoder that has a masked-LM head."""
    cfg = model.config
    if cfg.has_decoder:
        return "decoder"
    if getattr(model, "mlm_head", None) is None:
        raise ValueError(f"{model.name} is an encoder without a masked-LM head: nothing in the checkpoint maps its "
                         "residual stream to tokens, so there is no lens to apply")
    return "encoder"


def output_head(model, stack: str):
    """The function from residual-stream vectors (m x d) to logits (m x V) the model ends with."""
    net = model.net
    if stack == "encoder":
        head = model.mlm_head.to(model.device)
        norm = net.final_norm("encoder")
        return lambda h: head(norm(h) if norm is not None else h)
    norm = net.final_norm("decoder")
    return lambda h: net.project(norm(h) if norm is not None else h)


def default_positions(n: int) -> List[int]:
    return list(range(max(0, n - DEFAULT_POSITIONS), n))


def _positions(positions: Optional[Iterable[int]], n: int) -> List[int]:
    if positions is None:
        return default_positions(n)
    if isinstance(positions, (str, bytes)) or not hasattr(positions, "__iter__"):
        raise ValueError(f"positions must be a list of positions (got {checks.shown(positions)})")
    return [checks.position(p, n, "position") for p in positions]


def stream_name(stack: str, layer: int) -> str:
    """The residual stream entering layer `layer` (layer L: the last layer's output)."""
    return tn.embed(stack) if layer == 0 else tn.out(stack, layer - 1)


@torch.inference_mode()
def lens(trace, kind: str = "logit", k: int = 5, target: Optional[Token] = None,
         positions: Optional[Sequence[int]] = None) -> pd.DataFrame:
    """The logit lens of a trace: one row per (layer, position), columns COLUMNS (module
    docstring). target: a token (str as shown, or id) whose probability every row reports;
    None: the model's own top-1 at that position. positions: which positions (negative from
    the end); None: all, or the last DEFAULT_POSITIONS of a longer input."""
    if kind == "tuned":
        raise ValueError("the tuned lens needs trained per-layer translators (Belrose et al. 2023), and none ship "
                         "for the models this app reads: use kind='logit'")
    if kind != "logit":
        raise ValueError(f"kind must be 'logit' (or 'tuned'), not {kind!r}")
    model = model_of(trace, "the logit lens")
    stack = lens_stack(trace, model)
    head = output_head(model, stack)
    n_layers = trace.layers(stack)
    first = trace[stream_name(stack, 0)]
    n = first.shape[0]
    pos = _positions(positions, n)
    k = min(checks.whole(k, "k (candidates a row)", lo=1), output_vocab(model))
    fixed = None if target is None else output_token_id(model, target, "target token")
    final_name = tn.final_norm(stack) if trace.is_stored(tn.final_norm(stack)) else stream_name(stack, n_layers)
    out_head = head if final_name == stream_name(stack, n_layers) else (
        (lambda h: model.net.project(h)) if stack == "decoder" else (lambda h: model.mlm_head.to(model.device)(h)))
    tokens = trace.tokens("target" if stack == "decoder" and trace.tokens("target") else "source")
    dev, dtype = model.device, next(model.net.parameters()).dtype
    strings = model.alternative_strings
    cols = {c: [] for c in COLUMNS}

    def dot(a, b):  # row-wise a . b, no m x V temporary
        return torch.bmm(a[:, None, :], b[:, :, None])[:, 0, 0]

    for c0 in range(0, len(pos), CHUNK):
        idx = torch.tensor(pos[c0: c0 + CHUNK])
        final = torch.log_softmax(out_head(trace[final_name][idx].to(dev, dtype)).double(), dim=-1)
        p_final = final.exp()
        neg_h_final = dot(p_final, final)  # KL(f || l) = sum p_f log p_f - sum p_f log p_l
        del final
        tgt = p_final.argmax(-1) if fixed is None else torch.full((len(idx),), fixed, device=p_final.device)
        tgt_str = strings(tgt.tolist())
        per_block = max(1, ROWS // len(idx))  # layers whose logits one matmul computes
        for l0 in range(0, n_layers + 1, per_block):
            block = list(range(l0, min(n_layers + 1, l0 + per_block)))
            x = torch.cat([trace[stream_name(stack, layer)][idx] for layer in block]).to(dev, dtype)
            logits = head(x).view(len(block), len(idx), -1)
            del x
            for j, layer in enumerate(block):
                logp = torch.log_softmax(logits[j].double(), dim=-1)
                top = torch.topk(logits[j], k)
                top_ids = top.indices.cpu().tolist()
                top_p = logp.gather(1, top.indices).exp().cpu().tolist()
                t_prob = logp.gather(1, tgt[:, None])[:, 0].exp()
                kl = (neg_h_final - dot(p_final, logp)).clamp_min(0.0)
                entropy = -dot(logp.exp(), logp)
                for r, q in enumerate(idx.tolist()):
                    cols["layer"].append(layer)
                    cols["position"].append(q)
                    cols["token"].append(tokens[q] if q < len(tokens) else "")
                    cols["top_ids"].append(top_ids[r])
                    cols["top_tokens"].append(strings(top_ids[r]))
                    cols["top_probs"].append(top_p[r])
                    cols["target"].append(tgt_str[r])
                cols["target_id"] += tgt.tolist()
                cols["target_prob"] += t_prob.cpu().tolist()
                cols["entropy"] += entropy.cpu().tolist()
                cols["kl"] += kl.cpu().tolist()
                del logp
            del logits
    df = pd.DataFrame(cols, columns=COLUMNS).sort_values(["layer", "position"], kind="stable").reset_index(drop=True)
    df.attrs.update(stack=stack, n_layers=n_layers, positions=pos, k=k)
    return df
