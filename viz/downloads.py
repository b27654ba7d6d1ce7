"""What a download holds and how big it is, before it is made.

A whole trace written to NPZ recomputes every layer's maps one by one (core.trace.Trace.save):
its size is known beforehand from the shapes of one layer (every layer of a stack has the same
names and shapes), and one layer alone can be written instead.
"""

from __future__ import annotations

import io
import json
import weakref
import zipfile
from typing import Dict, Optional

import numpy as np

from core.trace import layer_of


def _nbytes(x) -> int:
    return int(x.numel() * x.element_size()) if hasattr(x, "numel") else int(np.asarray(x).nbytes)


def layer_bytes(trace, stack: str, layer: int = 0) -> int:
    """Bytes of every name inside one layer of a stack (computes that layer once)."""
    prefix = f"{stack}.{layer}."
    return sum(_nbytes(trace[n]) for n in trace.names(prefix))


_SIZES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # trace -> sizes: once per trace


def trace_bytes(trace, at: Optional[Dict[str, int]] = None) -> Dict[str, int]:
    """{'total': bytes of the whole trace's NPZ (uncompressed), 'layer:<stack>': bytes of one
    layer of that stack}, from the shapes of one layer per stack (`at`: stack -> the layer to
    measure, e.g. the one on screen, whose maps are already computed; default 0)."""
    try:
        return _SIZES[trace]
    except (KeyError, TypeError):
        pass
    at = at or {}
    out, total, per_stack = {}, 0, {}
    for n in trace.names():
        where = layer_of(n)
        if n in ("logits", "probs"):  # n_t x V float32: counted from the shape, never computed here
            total += 4 * len(trace.tokens("target")) * int(trace.meta.get("config", {}).get("tgt_vocab_size", 0))
        elif where is None:
            total += _nbytes(trace[n])
        elif where[1] == at.get(where[0], 0):
            per_stack[where[0]] = per_stack.get(where[0], 0) + _nbytes(trace[n])
    for stack, b in per_stack.items():
        out[f"layer:{stack}"] = b
        total += b * trace.layers(stack)
    out["total"] = total
    try:
        _SIZES[trace] = out
    except TypeError:
        pass
    return out


def layer_npz(trace, stack: str, layer: int) -> bytes:
    """One layer's names (every head's maps, q, k, v, ...) and the tokens, as an .npz file."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        items = [(n, trace[n].numpy()) for n in trace.names(f"{stack}.{layer}.")]
        items += [(f"tokens.{w}", np.array(trace.tokens(w), dtype=str)) for w in ("source", "target") if trace.tokens(w)]
        items.append(("meta", np.array(json.dumps({**trace.meta, "layer": layer, "stack": stack}, default=str))))
        for name, arr in items:
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


def human(n: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
