"""Hook points: named places in the forward pass where a value can be read or replaced.

The network hands a few of its values to `point(rec, name, value)` and goes on with what
comes back. Without hooks it is the value itself (a recorder only reads it); with a
`Hooks` object a function registered under the value's full name may return another
tensor of the same shape, and the pass continues from that. This is the one intervention
mechanism of the core: head ablation, activation patching, path patching and input attribution are all
functions registered on these points.

The points, by full name (`{stack}` encoder | decoder, `{attn}` self_attn | cross_attn):

    embed.{stack}.tokens      (B, n, d)     token embeddings as the model adds them (scaled)
    {stack}.{i}.in            (B, n, d)     the residual stream entering layer i ("resid_pre")
    {stack}.{i}.{attn}.q      (B, H, n, d_k) queries (after QK-norm and RoPE)
    {stack}.{i}.{attn}.k / .v (B, H_kv, n_k, d_k) keys (after RoPE) and values, cached ones included
    {stack}.{i}.{attn}.heads  (B, H, n, d_k) every head's output, before Concat and W_o
    {stack}.{i}.{attn}.out    (B, n, d)     the attention sub-layer's output ("attn_out")
    {stack}.{i}.ffn.out       (B, n, d)     the feed-forward sub-layer's output ("mlp_out")

Names are the Trace names where the value is also recorded (all but `.in`, which equals
the previous layer's `.out` or `embed.{stack}.sum`). A recorder inside the hooks sees the
value as computed, before a hook replaces it; everything downstream sees the replacement.

    hooks = Hooks({"decoder.3.self_attn.heads": lambda t: t * keep})
    model.net.decode(ids, rec=hooks)                 # one pass with head ablation
    Hooks(fns, inner=Recorder(...))                  # replace and record in one pass
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

HookFn = Callable[[torch.Tensor], torch.Tensor]


class Hooks:
    """Functions on hook points, by full name; `inner` (a Recorder, or None) records.

    A Hooks object is passed where a recorder goes (`rec=`): it records what `inner`
    keeps and replaces what `fns` names. Under hooks without a recorder attention keeps
    the fused kernel (`maps` is False)."""

    def __init__(self, fns: Optional[Dict[str, HookFn]] = None, inner=None):
        self.fns: Dict[str, HookFn] = dict(fns or {})
        self.inner = inner

    @property
    def maps(self) -> bool:
        return self.inner is not None and getattr(self.inner, "maps", True)

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        if self.inner is not None:
            self.inner(name, t, batched)

    def point(self, name: str, t: torch.Tensor, record: bool = True) -> torch.Tensor:
        if record and self.inner is not None:
            self.inner(name, t)
        fn = self.fns.get(name)
        if fn is None:
            return t
        out = fn(t)
        if out.shape != t.shape:
            raise ValueError(f"hook on {name} returned shape {tuple(out.shape)}, expected {tuple(t.shape)}")
        return out


def point(rec, name: str, t: torch.Tensor, record: bool = True) -> torch.Tensor:
    """The value at hook point `name` (relative to rec's scope): t itself, recorded when a
    recorder is there and `record`, or what a hook puts in its place."""
    if rec is None:
        return t
    fn = getattr(rec, "point", None)
    if fn is not None:
        return fn(name, t, record)
    if record:
        rec(name, t)
    return t


def attach(rec, fns: Dict[str, HookFn]):
    """rec with hooks added (names relative to rec's scope); rec itself when fns is empty."""
    if not fns:
        return rec
    prefix = getattr(rec, "prefix", None)
    if prefix is not None:  # a scope (core/net/recorder.py): the same scope over hooks at its root
        return type(rec)(_merge(rec.rec, {f"{prefix}.{k}": f for k, f in fns.items()}), prefix)
    return _merge(rec, fns)


def _merge(root, fns: Dict[str, HookFn]) -> Hooks:
    if isinstance(root, Hooks):
        merged = dict(root.fns)
        for name, fn in fns.items():
            first = merged.get(name)
            merged[name] = fn if first is None else (lambda t, a=first, b=fn: b(a(t)))
        return Hooks(merged, root.inner)
    return Hooks(fns, inner=root)
