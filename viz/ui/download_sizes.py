"""What a download holds and how big it is, before it is made.

A whole trace written to NPZ recomputes every layer's maps one by one (core.trace.Trace.save):
its size is known beforehand from the shapes of one layer (every layer of a stack has the same
names and shapes), and one layer alone can be written instead.
"""

from __future__ import annotations

import io
import json
import os
import weakref
import zipfile
from typing import Dict, Optional

import numpy as np

from core import trace_names as tn
from core.trace_names import layer_of


def _nbytes(x) -> int:
    return int(x.numel() * x.element_size()) if hasattr(x, "numel") else int(np.asarray(x).nbytes)


_ATTN_KINDS = tn.ATTNS
_QUERY_SIDE = tn.QUERY_SIDE  # H x n_q x d_head
_KEY_SIDE = tn.KEY_SIDE  # H_kv x n_k x d_head
_MAPS = tn.MAPS  # H x n_q x n_k


def _pieces(name: str):
    """(stack, attention kind or 'ffn' or 'block', step) of a name inside a layer."""
    try:
        p = tn.parse(name)
    except ValueError:  # a name recorded by a newer layer: no attention rule, n x d
        return layer_of(name)[0], "block", name
    return p.stack, p.part, p.step


def _side_lengths(trace, stack: str, kind: str):
    q = "source" if stack == "encoder" else "target"
    k = "source" if stack == "encoder" or kind == "cross_attn" else "target"
    return len(trace.tokens(q)), len(trace.tokens(k))


def name_shape(trace, name: str):
    """The shape of a name that is not stored, from the model's configuration (trace.meta's
    'config') and the token counts alone: nothing is computed. None when no rule knows it."""
    cfg = trace.meta.get("config") or {}
    h, dh, d = int(cfg.get("n_heads", 0)), int(cfg.get("d_head", 0)), int(cfg.get("d_model", 0))
    h_kv, d_ff, vocab = int(cfg.get("n_kv_heads") or h), int(cfg.get("d_ff", 0)), int(cfg.get("tgt_vocab_size", 0))
    if name in tn.OUTPUTS:
        return (len(trace.tokens("target")), vocab)
    if name == tn.LAST_PROBS:
        return (vocab,)
    where = layer_of(name)
    if where is None or not (h and dh and d):
        return None
    stack, kind, part = _pieces(name)
    if kind in _ATTN_KINDS:
        n_q, n_k = _side_lengths(trace, stack, kind)
        shapes = {**{p: (h, n_q, dh) for p in _QUERY_SIDE}, **{p: (h_kv, n_k, dh) for p in _KEY_SIDE},
                  **{p: (h, n_q, n_k) for p in _MAPS}, "position_bias": (h, n_q, n_k),  # T5's, per head
                  "mask": (n_q, n_k), "out": (n_q, d),
                  "sink": (h, n_q), "scale": (n_q,),  # learned sinks (gpt-oss); a scale per query (Llama 4)
                  "gate": (h, n_q, dh)}  # an output gate's sigmoid (Qwen3.5, Qwen3-Next)
        mla = cfg.get("mla")
        if mla:  # latent attention: q and k of d_nope + d_rope, the latent, a sparse selection's maps
            dqk = int(mla["qk_nope_head_dim"]) + int(mla["qk_rope_head_dim"])
            shapes.update(q=(h, n_q, dqk), k=(h, n_k, dqk), latent=(n_k, int(mla["kv_lora_rank"])),
                          index_scores=(n_q, n_k), selected=(n_q, n_k))
        return shapes.get(part)
    n = _side_lengths(trace, stack, tn.SELF)[0]
    if (kind, part) == (tn.FFN, "router"):  # a mixture of experts' router logits: n x E
        return (n, int((cfg.get("moe") or {}).get("experts", 0)))
    return (n, d_ff) if (kind, part) == (tn.FFN, "hidden") else (n, d)  # residuals, norms, ffn.out, out: n x d_model


def name_bytes(trace, name: str, itemsize: int = 4) -> int:
    """Bytes of one name in an NPZ: a stored name's own size; any other from its shape (name_shape),
    never by computing it. Recomputed names are float32 (`itemsize`)."""
    if trace.is_stored(name) and name != tn.LAST_PROBS:
        return _nbytes(trace[name])
    shape = name_shape(trace, name)
    if shape is None:
        raise KeyError(f"no shape rule for {name!r}")
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def layer_bytes(trace, stack: str, layer: int = 0) -> int:
    """Bytes of every name inside one layer of a stack, from shapes (computes nothing)."""
    return sum(name_bytes(trace, n) for n in trace.names(tn.layer(stack, layer) + "."))


_SIZES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # trace -> sizes: once per trace


def trace_bytes(trace, at: Optional[Dict[str, int]] = None) -> Dict[str, int]:
    """{'total': bytes of the whole trace's NPZ (uncompressed), 'layer:<stack>': bytes of one
    layer of that stack}, from the shapes of the names (name_bytes): no layer is computed to
    size a download. `at` (stack -> layer) is accepted for callers; every layer of a stack
    has the same names and shapes."""
    try:
        return _SIZES[trace]
    except (KeyError, TypeError):
        pass
    out, total = {}, 0
    for stack in trace.stacks():
        out[f"layer:{stack}"] = layer_bytes(trace, stack, 0)
        total += out[f"layer:{stack}"] * trace.layers(stack)
    total += sum(name_bytes(trace, n) for n in trace.names() if layer_of(n) is None)
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
        items = [(n, trace[n].numpy()) for n in trace.names(tn.layer(stack, layer) + ".")]
        items += [(f"tokens.{w}", np.array(trace.tokens(w), dtype=str)) for w in ("source", "target") if trace.tokens(w)]
        items.append(("meta", np.array(json.dumps({**trace.meta, "layer": layer, "stack": stack}, default=str))))
        for name, arr in items:
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


DOWNLOAD_CAP_BYTES = 2 * 2**30  # a download is built in the server's memory before it is sent: never above this
MEMORY_SHARE = 0.25  # ... nor above this share of the memory available when it is offered


def available_memory() -> Optional[int]:
    """Bytes of memory available now (Linux's MemAvailable, else free pages by os.sysconf), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def download_budget():
    """(bytes, why): the largest download offered, min(DOWNLOAD_CAP_BYTES, MEMORY_SHARE of the
    memory available now), and a sentence that says so."""
    avail = available_memory()
    cap = DOWNLOAD_CAP_BYTES
    if avail is None:
        return cap, f"{human(cap)} (a fixed cap; this system does not say how much memory is free)"
    budget = max(1, min(cap, int(avail * MEMORY_SHARE)))
    return budget, (f"{human(budget)} (a quarter of the {human(avail)} of memory available now, "
                    f"at most {human(cap)})")


def human(n: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
