"""Trace: every intermediate tensor of one forward pass, under the names of DESIGN.md.

An ordered mapping from stable names to detached CPU tensors, plus the token strings and
metadata (model, config, device, timings). Saves to and loads from `.npz`.

Stored and derived names
------------------------
Every DESIGN.md name reads as a tensor (`trace[name]`), but a traced forward pass does not
keep four H x n_q x n_k matrices per attention: at 512 tokens each one is 12 MiB per layer
for minilm. A trace made by `AttentionModel.trace` stores the attention `weights` (what the
model used) and derives the other three on access, with the very operations, inputs and
order of the forward pass, so they come out bit for bit as the forward pass computed them:

    scores = q @ k^T            (k repeated per query head under grouped-query attention)
    scaled = scores * (1/sqrt(d_k))
    masked = scaled + mask      (masked is scaled itself where the attention had no mask)
    mask   = zeros(n_q, n_k)    (attention with no mask; stored when there is one)

`scaled` and `masked` repeat the forward's elementwise operations on the same values, so
they are exact. `scores` repeats the forward's matmul on the recorded q and k: bit for bit
on the CPU in our tests (1, 2 and 4 threads; minilm, toy-translate, smollm2); a trace run on
a GPU recomputes it on the CPU, within float rounding of the GPU's (about 1e-6 relative).
So scaled = scores / sqrt(d_k) and masked = scaled + mask hold as they did, and
softmax(masked) = weights holds to float rounding (tests check 1e-6). Derived tensors are
computed afresh on every access (nothing is memoised, so a trace's memory never grows) and
count nothing in `nbytes()`. `stored(name)` / `is_derived(name)` / `derivation(name)` tell
which is which; `save()` writes every name as an array, as before.

`to_half_attention()` gives a copy whose stored attention maps are kept in float16 (half
the bytes, for caches); reading them gives float32 again, rounded to float16's precision.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import torch


# Token lists live beside the tensors; these names reach them like tensors.
LIST_NAMES = {"tokens.source": "source", "tokens.target": "target", "next.tokens": "next"}

# Names whose tensors are H x n_q x n_k attention maps (the bulk of a long trace).
ATTENTION_MAPS = (".scores", ".scaled", ".masked", ".weights")


class Derived:
    """A recipe for a trace name computed from other names of the same trace.

    op is one of:
      "qk"    (q_name, k_name)      q @ k^T, k's heads repeated to q's under GQA
      "mul"   (name, factor)        tensor * factor
      "add"   (name_a, name_b)      a + b (broadcasting)
      "same"  (name,)               the tensor itself
      "softmax" (name,)             softmax over the last axis (probs from logits)
      "zeros" (shape, dtype)        torch.zeros(shape, dtype=dtype)
    String arguments are trace names; everything else is a constant.
    """

    __slots__ = ("op", "args")
    OPS = ("qk", "mul", "add", "same", "zeros", "softmax")

    def __init__(self, op: str, *args):
        if op not in self.OPS:
            raise ValueError(f"unknown derivation {op!r}; one of {self.OPS}")
        self.op, self.args = op, tuple(args)

    def sources(self) -> List[str]:
        if self.op == "zeros":
            return []
        return [a for a in self.args if isinstance(a, str)]

    def compute(self, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
        op, a = self.op, self.args
        if op == "qk":
            q, k = get(a[0]), get(a[1])
            if k.shape[-3] != q.shape[-3]:  # grouped-query attention: as the forward repeats them
                k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            return q @ k.transpose(-2, -1)
        if op == "mul":
            return get(a[0]) * a[1]
        if op == "add":
            return get(a[0]) + get(a[1])
        if op == "same":
            return get(a[0])
        if op == "softmax":
            return torch.softmax(get(a[0]), dim=-1)
        return torch.zeros(tuple(a[0]), dtype=a[1])

    def describe(self) -> str:
        op, a = self.op, self.args
        return {
            "qk": lambda: f"{a[0]} @ {a[1]}^T",
            "mul": lambda: f"{a[0]} * {a[1]!r}",
            "add": lambda: f"{a[0]} + {a[1]}",
            "same": lambda: f"{a[0]}",
            "softmax": lambda: f"softmax({a[0]})",
            "zeros": lambda: f"zeros{tuple(a[0])}",
        }[op]()

    def __repr__(self) -> str:
        return f"Derived({self.describe()})"

    def __getstate__(self):
        return (self.op, self.args)

    def __setstate__(self, state):
        self.op, self.args = state


class Trace:
    def __init__(self, tensors: Dict[str, object], tokens: Dict[str, List[str]], meta: Optional[dict] = None):
        """tensors: name -> tensor, or name -> Derived (computed from other names on access)."""
        self._order: List[str] = []
        self._tensors: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        self._derived: Dict[str, Derived] = {}
        self._half: Dict[str, torch.dtype] = {}  # stored in float16; read back in this dtype
        for k, v in tensors.items():
            self._order.append(k)
            if isinstance(v, Derived):
                self._derived[k] = v
            else:
                self._tensors[k] = v if v.device.type == "cpu" and not v.requires_grad else v.detach().to("cpu")
        for k, d in self._derived.items():
            missing = [s for s in d.sources() if s not in self._tensors and s not in self._derived]
            if missing:
                raise ValueError(f"{k!r} is derived from {missing}, which this trace lacks")
        self._tokens = {k: list(v) for k, v in tokens.items()}
        self.meta = dict(meta or {})

    # mapping interface ------------------------------------------------------------
    def _get(self, name: str) -> torch.Tensor:
        t = self._tensors.get(name)
        if t is not None:
            dtype = self._half.get(name)
            return t if dtype is None else t.to(dtype)
        return self._derived[name].compute(self._get)

    def __getitem__(self, name: str):
        if name in LIST_NAMES and LIST_NAMES[name] in self._tokens:
            return self.tokens(LIST_NAMES[name])
        if name in self._tensors or name in self._derived:
            return self._get(name)
        raise KeyError(f"no tensor named {name!r} in this trace")

    def __contains__(self, name: str) -> bool:
        return (name in self._tensors or name in self._derived
                or (name in LIST_NAMES and LIST_NAMES[name] in self._tokens))

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def get(self, name: str, default=None):
        if name in self._tensors or name in self._derived:
            return self._get(name)
        return default

    def names(self, prefix: str = "") -> List[str]:
        return [n for n in self._order if n.startswith(prefix)]

    def tokens(self, which: str = "source") -> List[str]:
        return list(self._tokens.get(which, []))

    @property
    def token_sets(self) -> Dict[str, List[str]]:
        return {k: list(v) for k, v in self._tokens.items()}

    # stored vs derived ----------------------------------------------------------------
    def is_derived(self, name: str) -> bool:
        return name in self._derived

    def stored(self, name: str) -> Optional[torch.Tensor]:
        """The tensor as kept (float16 where halved), or None for a derived name."""
        return self._tensors.get(name)

    def derivation(self, name: str) -> Optional[str]:
        """How a derived name is computed (e.g. 'encoder.0.self_attn.scores * 0.17...'), else None."""
        d = self._derived.get(name)
        return None if d is None else d.describe()

    def nbytes(self) -> int:
        """Bytes this trace keeps alive: its stored tensors (derived names cost nothing), each
        memory block counted once however many names or views share it, and never more than
        the views into it cover (a slice of a model parameter counts as the slice)."""
        blocks: Dict[int, list] = {}
        for t in self._tensors.values():
            st = t.untyped_storage()
            view = (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            entry = blocks.setdefault(st.data_ptr() or id(st), [st.nbytes(), {}])
            entry[1][view] = t.numel() * t.element_size()
        return sum(min(size, sum(views.values())) for size, views in blocks.values())

    # memory policy --------------------------------------------------------------------
    def to_half_attention(self) -> "Trace":
        """A copy whose stored H x n_q x n_k attention maps (names ending in .weights, and
        .scores/.scaled/.masked where stored, e.g. in loaded traces) are kept in float16.

        Reading them still gives float32: the float16 value, exactly. Weights lie in [0, 1], so
        the error is at most 2^-12 (~2.4e-4) absolute, ~2^-11 relative; zeros stay exactly 0
        (masked keys keep weight 0). Derived names come from float32 q and k, unchanged.
        Other tensors are shared with this trace, not copied."""
        out = Trace.__new__(Trace)
        out._order = list(self._order)
        out._derived = dict(self._derived)
        out._tokens = {k: list(v) for k, v in self._tokens.items()}
        out.meta = dict(self.meta)
        out._tensors = OrderedDict()
        out._half = dict(self._half)
        for k, t in self._tensors.items():
            if k.endswith(ATTENTION_MAPS) and t.is_floating_point() and t.dtype != torch.float16 and t.dim() >= 2:
                out._tensors[k] = t.to(torch.float16)
                out._half[k] = t.dtype
            else:
                out._tensors[k] = t
        out.meta["half_attention"] = sorted(out._half)
        return out

    def attention_nbytes(self) -> int:
        """Bytes of the stored H x n_q x n_k attention maps (the part float16 halves)."""
        return sum(t.numel() * t.element_size() for k, t in self._tensors.items() if k.endswith(ATTENTION_MAPS))

    # structure helpers --------------------------------------------------------------
    def layers(self, stack: str) -> int:
        """Number of layers recorded for a stack ('encoder' or 'decoder')."""
        idx = {int(n.split(".")[1]) for n in self._order if n.startswith(stack + ".") and n.split(".")[1].isdigit()}
        return max(idx) + 1 if idx else 0

    def attention_kinds(self, stack: str) -> List[str]:
        kinds = []
        for kind in ("self_attn", "cross_attn"):
            if f"{stack}.0.{kind}.weights" in self:
                kinds.append(kind)
        return kinds

    def stacks(self) -> List[str]:
        return [s for s in ("encoder", "decoder") if f"{s}.0.self_attn.weights" in self]

    # persistence --------------------------------------------------------------------
    def to_numpy(self) -> Dict[str, np.ndarray]:
        """Every name as an array (derived names computed, float16 maps back to float32)."""
        arrays = {k: self._get(k).numpy() for k in self._order}
        for which, toks in self._tokens.items():
            key = "next.tokens" if which == "next" else f"tokens.{which}"
            arrays[key] = np.array(toks, dtype=str)
        arrays["meta"] = np.array(json.dumps(self.meta, default=str))
        return arrays

    def save(self, path) -> None:
        np.savez_compressed(path, **self.to_numpy())

    @classmethod
    def load(cls, path) -> "Trace":
        with np.load(path, allow_pickle=False) as z:
            tensors, tokens, meta = OrderedDict(), {}, {}
            for k in z.files:
                if k in LIST_NAMES or k.startswith("tokens."):
                    tokens[LIST_NAMES.get(k, k[len("tokens.") :])] = [str(s) for s in z[k]]
                elif k == "meta":
                    meta = json.loads(str(z[k]))
                else:
                    tensors[k] = torch.from_numpy(z[k])
        return cls(tensors, tokens, meta)

    def __repr__(self) -> str:
        toks = {k: len(v) for k, v in self._tokens.items()}
        return f"Trace(model={self.meta.get('model')!r}, tokens={toks}, tensors={len(self)})"


HALF_ATTENTION_VAR = "ATTENTION_LAB_HALF_ATTENTION"


def half_attention_requested() -> bool:
    """Whether $ATTENTION_LAB_HALF_ATTENTION asks for float16 attention maps in caches."""
    import os

    return os.environ.get(HALF_ATTENTION_VAR, "0").strip().lower() in ("1", "true", "yes", "on")


def for_cache(trace: Trace, half_attention: Optional[bool] = None, min_tokens: int = 0) -> Trace:
    """The form in which to keep a trace in a cache: float16 attention maps when asked.

    half_attention: True / False; None reads $ATTENTION_LAB_HALF_ATTENTION ("1" halves,
    default "0"). Only traces with at least `min_tokens` source (or target) positions are
    halved, so short ones keep float32 exactly. Off by default: the Inside page's checks
    (row sums, softmax(masked) = weights, to 1e-5) are float32 checks, and float16 weights
    are off by up to 2.4e-4 (see Trace.to_half_attention and docs/benchmarks.md).
    """
    if half_attention is None:
        half_attention = half_attention_requested()
    n = max(len(trace.tokens("source")), len(trace.tokens("target")))
    return trace.to_half_attention() if half_attention and n >= min_tokens else trace
