"""Recording: how a forward pass hands its intermediates to whoever asked for them.

Every module of the network (core/net/model.py, core/net/layers.py, core/net/multihead.py) takes an
optional `rec`, a callable rec(name, tensor). With rec=None (the default) nothing is kept
and attention takes the fused kernel. A Recorder keeps what it is given under the Trace
names of docs/design.md, batch item 0 by default (traces are unbatched); `scoped(rec,
prefix)` gives a module the recorder that puts its prefix ("encoder.0.self_attn") before
its names.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from .hooks import point

Rec = Optional[Callable[[str, torch.Tensor], None]]


class Recorder:
    """Collects named tensors during a forward pass.

    By default it keeps batch item 0, detached (a Trace is unbatched). `names` keeps only
    the names asked for (a collection of names, or a predicate name -> bool);
    `whole_batch=True, detach=False` keeps the full tensors with their gradients (used by
    training to supervise one attention head).

    `maps` says whether attention runs on the explicit path (every n_q x n_k step recorded,
    the default) or on the fused kernel (`maps=False`: only O(n d) tensors such as the
    layer outputs and the per-head outputs are recorded). A traced pass uses maps=False;
    a layer looked at is run again with maps=True (core/trace.py).
    """

    def __init__(self, names=None, whole_batch: bool = False, detach: bool = True, maps: bool = True):
        self.tensors: Dict[str, torch.Tensor] = {}
        if names is None or callable(names):
            self.keep = names
        else:
            wanted = set(names)
            self.keep = wanted.__contains__
        self.whole_batch = whole_batch
        self.detach = detach
        self.maps = maps

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        if self.keep is not None and not self.keep(name):
            return
        if batched and not self.whole_batch:
            t = t[0]
        self.tensors[name] = t.detach() if self.detach and t.requires_grad else t

    def scope(self, prefix: str) -> "_Scope":
        return _Scope(self, prefix)


class _Scope:
    """A recorder that prefixes names ("encoder.0.self_attn" + "." + name)."""

    __slots__ = ("rec", "prefix")

    def __init__(self, rec, prefix: str):
        self.rec, self.prefix = rec, prefix

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        self.rec(f"{self.prefix}.{name}", t, batched)

    @property
    def maps(self) -> bool:
        return getattr(self.rec, "maps", True)

    def point(self, name: str, t: torch.Tensor, record: bool = True) -> torch.Tensor:
        return point(self.rec, f"{self.prefix}.{name}", t, record)


def scoped(rec: Rec, prefix: str) -> Rec:
    if rec is None:
        return None
    if isinstance(rec, _Scope):  # one prefix, one call per record, however deep the nesting
        return _Scope(rec.rec, f"{rec.prefix}.{prefix}")
    return _Scope(rec, prefix)


def records_maps(rec: Rec) -> bool:
    """Whether attention under this recorder takes the explicit (recorded) path."""
    return rec is not None and getattr(rec, "maps", True)

