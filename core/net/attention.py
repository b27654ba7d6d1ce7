"""Scaled dot-product attention and its masks: seed 003, equations (10) and (18).

    A(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V

Tokens are rows. Masks are additive float matrices: 0 where a query may look at a key,
-inf where it may not, so softmax gives those keys a weight of exactly 0.

One function serves every model in the project. With a recorder it computes each step
explicitly and hands every intermediate to the recorder; without one it takes PyTorch's
fused kernel, which computes the same thing without keeping the n x n matrices. A traced
pass takes the fused kernel; a layer looked at is run again on the explicit path (see
core/trace.py), so the two paths check each other.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

RecordFn = Callable[[str, torch.Tensor], None]  # record(name, tensor); core.net.recorder.Recorder is one

NEG_INF = float("-inf")
SOFTCAP_ROWS = 1024  # soft-capped attention without a recorder: queries per block (bounds the n_q x n_k buffer)
HEADS_BLOCK_BYTES = 2**20  # attention_weights on a CPU: heads per block so that a block's scores stay in cache


def forbidden(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool = False, window: Optional[int] = None,
              symmetric: bool = False, key_is_pad: Optional[torch.Tensor] = None,
              chunk: Optional[int] = None) -> Optional[torch.Tensor]:
    """The masking rules of every attention here, for queries at q_pos (n_q,) and keys at
    k_pos (n_k,): True (n_q, n_k) where the query may NOT see the key, None where it sees all.

    causal: keys after the query (the look-ahead mask). window: with causal, keys `window` or
    more positions back (Mistral, Gemma's sliding layers); with symmetric, keys more than
    window // 2 away either way (ModernBERT's local layers). chunk: keys outside the query's
    own chunk of `chunk` positions (Llama 4's chunked attention: position p lies in chunk
    p // chunk). key_is_pad (n_k,): padding keys.
    Every mask of the network (causal_mask, sliding_window_mask, Transformer.encoder_masks /
    decoder_masks) and every tile of a long input (core/head_maps.py) is built here."""
    qp, kp = q_pos[:, None], k_pos[None, :]
    off = None
    if causal:
        off = kp > qp
    if window is not None:
        far = (qp - kp).abs() > window // 2 if symmetric else (qp - kp) >= window
        off = far if off is None else off | far
    if chunk is not None:
        other = (qp // chunk) != (kp // chunk)
        off = other if off is None else off | other
    if key_is_pad is not None:
        pad = key_is_pad[None, :].expand(len(q_pos), -1)
        off = pad if off is None else off | pad
    return off


def additive(off: Optional[torch.Tensor], dtype=torch.float32) -> Optional[torch.Tensor]:
    """A boolean mask of forbidden cells as the additive one: -inf there, 0 elsewhere."""
    if off is None:
        return None
    return torch.zeros(off.shape, dtype=dtype, device=off.device).masked_fill(off, NEG_INF)


def causal_mask(n: int, device=None, dtype=torch.float32, n_k: Optional[int] = None) -> torch.Tensor:
    """Look-ahead mask M (seed 002) / B (seed 003): 0 on and below the diagonal, -inf above.

    With n_k > n the queries are the last n of n_k positions (a prefix is already known).
    """
    n_k = n if n_k is None else n_k
    q_pos = torch.arange(n_k - n, n_k, device=device)  # (n,)
    k_pos = torch.arange(n_k, device=device)  # (n_k,)
    return additive(forbidden(q_pos, k_pos, causal=True), dtype)


def padding_mask(key_is_pad: torch.Tensor, n_q: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask from a boolean key-padding vector.

    key_is_pad: (..., n_k) True at padding positions. Returns (..., n_q, n_k): -inf in the
    columns of padding keys, 0 elsewhere. Padding queries still see the real keys, so no
    row is ever all -inf.
    """
    cols = torch.zeros(key_is_pad.shape, dtype=dtype, device=key_is_pad.device)
    cols = cols.masked_fill(key_is_pad, NEG_INF)
    return cols.unsqueeze(-2).expand(*key_is_pad.shape[:-1], n_q, key_is_pad.shape[-1])


def sliding_window_mask(n: int, window: int, device=None, dtype=torch.float32, n_k: Optional[int] = None) -> torch.Tensor:
    """(1, 1, n, n_k) additive mask: -inf where key j is `window` or more positions before
    query i (the queries are the last n of n_k positions)."""
    n_k = n if n_k is None else n_k
    i = torch.arange(n_k - n, n_k, device=device)
    j = torch.arange(n_k, device=device)
    return additive(forbidden(i, j, window=window), dtype)[None, None]


def chunked_mask(n: int, chunk: int, device=None, dtype=torch.float32, n_k: Optional[int] = None) -> torch.Tensor:
    """(1, 1, n, n_k) additive mask: -inf where key j lies outside query i's chunk of `chunk`
    positions (the queries are the last n of n_k positions; Llama 4)."""
    n_k = n if n_k is None else n_k
    i = torch.arange(n_k - n, n_k, device=device)
    j = torch.arange(n_k, device=device)
    return additive(forbidden(i, j, chunk=chunk), dtype)[None, None]


def combine_masks(*masks: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Sum of additive masks (None entries ignored); -inf anywhere stays -inf."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out + m
    return out


STEPS = ("scores", "scaled", "capped", "masked", "weights")


def soft_cap(x: torch.Tensor, softcap: Optional[float], inplace: bool = False) -> torch.Tensor:
    """Gemma 2's soft-capping c tanh(x / c) (x itself where softcap is None)."""
    if softcap is None:
        return x
    if inplace:
        return x.div_(softcap).tanh_().mul_(softcap)
    return torch.tanh(x / softcap) * softcap


def attention_map(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor] = None,
                  scale=None, softcap: Optional[float] = None, what: str = "weights",
                  record: Optional[RecordFn] = None, out: Optional[torch.Tensor] = None,
                  weights_out: Optional[torch.Tensor] = None, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """THE attention formula, up to the step `what` (one of STEPS):

        scores = Q K^T   scaled = scores * scale   capped = c tanh(scaled / c)   masked = capped + M
        weights = softmax(masked)

    Every path computes its maps here: the explicit (recorded) path, the weights-only read of
    the model view and value norms (attention_weights), and one head's tile of a long input
    (core/head_maps.py). q (..., n_q, d_k), k (..., n_k, d_k); scale defaults to 1/sqrt(d_k);
    "capped" is the scaled scores where softcap is None. mask: additive (broadcast to
    (..., n_q, n_k)) or boolean (True: forbidden, -inf).
    record: given, each step is a new tensor handed to record(name, t) (capped only where a
    cap is set), as the explicit path records them. Else the steps run in place on one buffer:
    `out` (written with Q K^T) or the one Q K^T makes; weights_out receives the softmax.
    scale: a float, or a tensor broadcast to (..., n_q, 1) where it varies by query (Llama 4's
    temperature tuning: the `.scale` of its layers without positions).
    sink: learned sink logits (gpt-oss), broadcast to (..., n_q, 1): one more logit per row
    that no key owns, in the softmax beside the keys' masked scores:
        [weights, sink] = softmax([masked, sink])
    so a row of weights sums to 1 - sink; the sink's probability is recorded as "sink"."""
    if what not in STEPS:
        raise KeyError(f"{what!r} is not one of {STEPS}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    keep = record is not None
    if out is None:
        t = q @ k.transpose(-2, -1)  # (..., n_q, n_k)
    elif q.dim() == 4 and q.shape[0] == 1:  # bmm on the (H, n, d_k) views: matmul's 4-d folding costs ~10% a head
        torch.bmm(q[0], k[0].transpose(-2, -1), out=out[0])
        t = out
    else:
        t = torch.matmul(q, k.transpose(-2, -1), out=out)
    if keep:
        record("scores", t)
    if what == "scores":
        return t
    t = t * scale if keep else t.mul_(scale)
    if keep:
        record("scaled", t)
    if what == "scaled":
        return t
    t = soft_cap(t, softcap, inplace=not keep)
    if keep and softcap is not None:
        record("capped", t)
    if what == "capped":
        return t
    if mask is not None:
        if mask.dtype == torch.bool:
            t = t.masked_fill(mask, NEG_INF) if keep else t.masked_fill_(mask, NEG_INF)
        elif keep or torch.broadcast_shapes(t.shape, mask.shape) != t.shape:
            t = t + mask
        else:
            t = t.add_(mask)
    if keep:
        record("masked", t)
    if what == "masked":
        return t
    if sink is not None:
        p = torch.softmax(torch.cat([t, sink.to(t.dtype).expand(*t.shape[:-1], 1)], dim=-1), dim=-1)
        w = p[..., :-1]
        if weights_out is not None:
            w = weights_out.copy_(w)
        if keep:
            record("weights", w)
            record("sink", p[..., -1])
        return w
    w = torch.softmax(t, dim=-1) if weights_out is None else torch.softmax(t, dim=-1, out=weights_out)
    if keep:
        record("weights", w)
    return w


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    record: Optional[RecordFn] = None,
    scale: Optional[float] = None,
    is_causal: bool = False,
    softcap: Optional[float] = None,
    sink: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """softmax(Q K^T * scale + M) V for q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v).

    Two paths, the same maths:
    - fast (record is None): PyTorch's fused kernel; no n_q x n_k matrix is kept. With
      is_causal=True (and no mask) the kernel applies the look-ahead mask itself.
    - explicit (record given): the formula line by line, each step handed to the recorder
      as scores, scaled, masked and weights (seed 003's Q K^T, F, F + B and S).
    scale defaults to 1/sqrt(d_k). mask is additive and broadcasts to (..., n_q, n_k).
    softcap c (Gemma 2): the scaled scores become capped = c tanh(scaled / c) before the mask;
    the fused kernel cannot do that, so without a recorder the same formula runs unrecorded;
    likewise learned sinks (sink, attention_map). scale may be a tensor (..., n_q, 1) (a scale
    per query): the fused kernel then reads q times it with a scale of 1.
    """
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    if record is None and softcap is None and (sink is None or _fused_sink_ok(q, k, v, mask)):
        causal = is_causal and mask is None
        if torch.is_tensor(scale):
            q, scale = q * scale.to(q.dtype), 1.0
        if sink is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal)
        # learned sinks on the fused kernel: out = softmax(masked) V and its log-sum-exp L per row;
        # with the sink s beside the keys every weight is exp(masked) / (e^L + e^s), so
        # out_sink = out e^L / (e^L + e^s) = out sigmoid(L - s), exactly
        out, lse = _FLASH_CPU(q, k, v, 0.0, causal, attn_mask=None if mask is None else mask.to(q.dtype), scale=scale)
        return out * torch.sigmoid(lse.unsqueeze(-1) - sink.to(q.dtype))
    if is_causal and mask is None:
        mask = causal_mask(q.shape[-2], device=q.device, dtype=q.dtype, n_k=k.shape[-2])
    if record is None and q.shape[-2] > SOFTCAP_ROWS:  # unrecorded and long: a block of queries at a time
        outs = []
        for r in range(0, q.shape[-2], SOFTCAP_ROWS):
            m = None if mask is None else mask[..., r:r + SOFTCAP_ROWS, :] if mask.shape[-2] > 1 else mask
            sc = scale[..., r:r + SOFTCAP_ROWS, :] if torch.is_tensor(scale) and scale.shape[-2] > 1 else scale
            outs.append(scaled_dot_product_attention(q[..., r:r + SOFTCAP_ROWS, :], k, v, m, None, sc,
                                                     softcap=softcap, sink=sink))
        return torch.cat(outs, dim=-2)
    weights = attention_map(q, k, mask, scale, softcap, record=record or (lambda name, t: None), sink=sink)
    return weights @ v  # (..., n_q, d_v)


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _fused_sink_ok(q, k, v, mask) -> bool:
    """Whether learned sinks can take the fused CPU kernel that also returns each row's
    log-sum-exp (inference on the CPU, 4-d q/k/v of one shape but length, a float mask);
    otherwise the formula runs unrecorded, a block of queries at a time."""
    return (_FLASH_CPU is not None and q.device.type == "cpu" and q.dim() == 4 and k.shape == v.shape
            and k.shape[:2] == q.shape[:2] and not (mask is not None and mask.dtype == torch.bool)
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)))


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: Optional[torch.Tensor] = None,
                      scale=None, softcap: Optional[float] = None, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(Q K^T * scale + M) alone, for views that need only the weights (the model
    view): the explicit path's operations in the same order, so the weights are bit for bit
    the explicit path's (tests/core/test_trace.py).

    For q and k (B, H, n, d_k), a block of heads at a time. On a CPU a block holds
    HEADS_BLOCK_BYTES of scores (one head at least): Q K^T of a block is written into one
    scratch block, scaled, [capped,] masked there while it is in cache, and its softmax
    written into the result; where one block holds every head (and on a GPU) each step runs
    in place in the result. Either way at most one n x n buffer besides the result, so with
    glibc's default malloc settings (a notebook), where a freed n x n buffer is handed back
    to the kernel, little is paged in afresh (what it saved: docs/decisions.md, "Measurements
    moved from the code")."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    n_q, n_k = q.shape[-2], k.shape[-2]
    shape = q.shape[:-1] + (n_k,)
    if q.dim() != 4 or k.shape[:2] != q.shape[:2] or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)) \
            or (mask is not None and torch.broadcast_shapes(shape, mask.shape) != shape):
        return attention_map(q, k, mask, scale, softcap, sink=sink)  # batched masks, autograd
    heads = q.shape[1]
    block = heads if q.device.type != "cpu" else max(1, HEADS_BLOCK_BYTES // max(1, n_q * n_k * q.element_size()))
    out = q.new_empty(shape)  # (B, H, n_q, n_k)
    scratch = q.new_empty(shape[:1] + (block,) + shape[2:]) if block < heads else None
    per_head = mask is not None and mask.dim() == 4 and mask.shape[1] != 1
    for h in range(0, heads, block):
        hb = min(block, heads - h)
        w = out[:, h:h + hb] if scratch is None else scratch[:, :hb]
        attention_map(q[:, h:h + hb], k[:, h:h + hb], None if mask is None else mask[:, h:h + hb] if per_head else mask,
                      scale, softcap, out=w, weights_out=out[:, h:h + hb],
                      sink=None if sink is None else sink[:, h:h + hb])
    return out
