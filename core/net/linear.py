"""The network's linear layers: y = x W^T + b. A small model runs them through oneDNN on a
CPU when no gradient is wanted; otherwise they are torch's own linear.

On a CPU, torch.nn.functional.linear hands the product to MKL's sgemm, which re-packs the
weight matrix on every call. oneDNN's inner product (torch.ops.mkldnn._linear_pointwise, the
op torch's own compiler emits for CPU linears) on a weight packed once into its blocked
layout (torch.ops.mkldnn._reorder_linear_weight) runs the same product 5-15 % faster at
minilm's shapes, and applies the FFN's activation while the output is still in cache
(`act`), which saves a pass over the n x d_ff hidden layer (`python -m bench.core_bench`
measures the whole pass against transformers'). The results differ from torch's GEMM by
float rounding only, the summation order of the dot products: max |diff| ~4e-6 on outputs
of size ~2, the size of either's error against a float64 product (tests/core/test_linear.py).

The packed copy doubles a weight's memory, so only a model whose linear weights fit BUDGET
turns this on (`use_onednn`, called by core.net.model.Transformer: minilm, the toy models,
the tiny test checkpoints). SmolLM2 and the other released decoders keep torch's GEMM: their
weights would cost hundreds of MiB more, their long inputs are GEMMs of thousands of rows
where packing gains little, and their parity tests hold transformers' logits to 1e-4. The
packed copy is made on first use and again when the weight changes (its storage or in-place
version: training, load_state_dict).

Where oneDNN is not there (a torch built without it, a GPU, float64, autograd for the
attribution methods) or $ATTENTION_LAB_ONEDNN is 0, `forward` is torch.nn.functional.linear
and `act` the activation applied after it: the same function. A forward hook on a linear
sees its own output as with nn.Linear: `act` does not fuse when one is registered.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# activation name (FeedForward's) -> oneDNN post-op (attr, algorithm)
POST_OPS = {"relu": ("relu", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "silu": ("swish", "")}
EAGER = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}
FAST_VAR = "ATTENTION_LAB_ONEDNN"  # 0: torch's own GEMM everywhere (to compare the two)
BUDGET = 64 * 2**20  # bytes of linear weights a model may keep a packed second copy of
PACK_ROWS = 128  # the row count oneDNN is told to pack for (any count runs on the packed weight)


def _op():
    if os.environ.get(FAST_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        if not torch.backends.mkldnn.is_available():
            return None
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_ONEDNN = _op()
_PACKS = _ONEDNN is not None and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _hooked(m: nn.Module) -> bool:
    """Whether a forward hook (the module's or a global one) would see this linear's output."""
    g = nn.modules.module
    return bool(m._forward_hooks or m._forward_pre_hooks or g._global_forward_hooks or g._global_forward_pre_hooks)


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) whose CPU inference runs through
    oneDNN on a packed weight when its model turned that on (`use_onednn`); `act(x, name)` is
    the activation of x W^T + b, fused there."""

    onednn = False  # set by use_onednn

    def _fast(self, x: torch.Tensor) -> bool:
        return (self.onednn and _ONEDNN is not None and x.device.type == "cpu" and x.dtype == torch.float32
                and self.weight.dtype == torch.float32 and x.numel() > 0 and x.dim() >= 2
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)))

    def _packed(self) -> torch.Tensor:
        """The weight in oneDNN's blocked layout, made again when the weight changed (a
        weight made under torch.inference_mode has no version to follow: used as it is)."""
        w = self.weight
        if not _PACKS or w.is_inference():
            return w
        key = (w.data_ptr(), w._version)
        kept = self.__dict__.get("_kept")
        if kept is None or kept[0] != key:
            kept = self.__dict__["_kept"] = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS))
        return kept[1]

    def _onednn(self, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], attr: str = "none",
                algorithm: Optional[str] = "") -> torch.Tensor:
        shape = x.shape
        y = _ONEDNN(x.reshape(-1, shape[-1]), w, b, attr, [], algorithm)
        return y.view(*shape[:-1], y.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fast(x):
            return self._onednn(x, self._packed(), self.bias)
        return F.linear(x, self.weight, self.bias)

    def rows(self, x: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """Output features r0:r1 alone (one head's q or k, core/head_maps.py): bit for bit
        those columns of forward(x) (oneDNN on a slice of the weight gives the packed full
        product's columns, as torch's GEMM gives its own; tests/core/test_linear.py)."""
        w = self.weight[r0:r1]
        b = None if self.bias is None else self.bias[r0:r1]
        return self._onednn(x, w, b) if self._fast(x) else F.linear(x, w, b)

    def act(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """EAGER[name](x W^T + b), in one oneDNN call where it can; through the module's
        call, and unfused, when a forward hook would see the linear's own output."""
        if name in POST_OPS and self._fast(x) and not _hooked(self):
            return self._onednn(x, self._packed(), self.bias, *POST_OPS[name])
        return EAGER[name](self(x))


def use_onednn(module: nn.Module, budget: int = BUDGET) -> bool:
    """Run every Linear of `module` through oneDNN, each keeping a packed copy of its weight,
    when all of them together hold at most `budget` bytes; returns whether they do."""
    lins = [m for m in module.modules() if isinstance(m, Linear)]
    ok = sum(m.weight.numel() * m.weight.element_size() for m in lins) <= budget
    for m in lins:
        m.onednn = ok
    return ok
