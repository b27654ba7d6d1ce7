"""Trace: every intermediate tensor of one forward pass, under the names of DESIGN.md.

An ordered mapping from stable names to detached CPU tensors, plus the token strings and
metadata (model, config, device, timings). Saves to and loads from `.npz`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch


# Token lists live beside the tensors; these names reach them like tensors.
LIST_NAMES = {"tokens.source": "source", "tokens.target": "target", "next.tokens": "next"}


class Trace:
    def __init__(self, tensors: Dict[str, torch.Tensor], tokens: Dict[str, List[str]], meta: Optional[dict] = None):
        self._tensors: "OrderedDict[str, torch.Tensor]" = OrderedDict(
            (k, v.detach().to("cpu")) for k, v in tensors.items()
        )
        self._tokens = {k: list(v) for k, v in tokens.items()}
        self.meta = dict(meta or {})

    # mapping interface ------------------------------------------------------------
    def __getitem__(self, name: str):
        if name in LIST_NAMES and LIST_NAMES[name] in self._tokens:
            return self.tokens(LIST_NAMES[name])
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in this trace") from None

    def __contains__(self, name: str) -> bool:
        return name in self._tensors or (name in LIST_NAMES and LIST_NAMES[name] in self._tokens)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def get(self, name: str, default=None):
        return self._tensors.get(name, default)

    def names(self, prefix: str = "") -> List[str]:
        return [n for n in self._tensors if n.startswith(prefix)]

    def tokens(self, which: str = "source") -> List[str]:
        return list(self._tokens.get(which, []))

    @property
    def token_sets(self) -> Dict[str, List[str]]:
        return {k: list(v) for k, v in self._tokens.items()}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    # structure helpers --------------------------------------------------------------
    def layers(self, stack: str) -> int:
        """Number of layers recorded for a stack ('encoder' or 'decoder')."""
        idx = {int(n.split(".")[1]) for n in self._tensors if n.startswith(stack + ".") and n.split(".")[1].isdigit()}
        return max(idx) + 1 if idx else 0

    def attention_kinds(self, stack: str) -> List[str]:
        kinds = []
        for kind in ("self_attn", "cross_attn"):
            if f"{stack}.0.{kind}.weights" in self._tensors:
                kinds.append(kind)
        return kinds

    def stacks(self) -> List[str]:
        return [s for s in ("encoder", "decoder") if f"{s}.0.self_attn.weights" in self._tensors]

    # persistence --------------------------------------------------------------------
    def to_numpy(self) -> Dict[str, np.ndarray]:
        arrays = {k: v.numpy() for k, v in self._tensors.items()}
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
