"""Why a head attends where it does: one pre-softmax score taken apart into what the model
wrote into its stream (docs/design.md / the contract "Why a head attends where it does").

    df = core.analysis.score_attribution(trace, "decoder", 3, 2, query=9, key=4)
    df.attrs["score"], df.attrs["sum"]          # the model's own s_ij and the terms' sum
    pa = core.analysis.pattern_attribution(trace, "decoder", 3, 2)

The stream entering a layer is a sum of components, read from the trace:
    "embed" (the token embeddings, scaled where the model scales them), "positions" (added
    position vectors), "types" (token types), "L{l}H{h}" (head h of layer l: its stored output
    through its own d_k rows of W_o), "L{l}.attn_bias" (the output projection's bias),
    "L{l}.mlp" (the FFN's write: in a pre-norm stack, where the FFN is a layer's last sub-layer,
    the stored layer output less the stream before the FFN; in a post-norm stack the FFN run
    again at the positions asked for on its input, as core/analysis/logit_attribution.py does),
    "bias" (every norm's shift, and the attention's
    own q / k biases). Cross-attention's heads are "L{l}xH{h}" and "L{l}.cross_attn_bias"; the
    keys of a cross-attention come from the encoder's stream, whose components are named with
    "enc." in front.
With every norm's scale (and LayerNorm's mean) frozen at its traced value a norm is an affine
map per position: x -> centre(x) * s_p * g + beta. It maps each earlier component linearly and
adds its beta as a "bias" component, so the decomposition is carried through pre-norm blocks,
post-norm blocks (each norm maps every earlier component), norms after the sub-layers
(Gemma 2/3, OLMo-2: each sub-layer's write is mapped by its norm frozen at the sub-layer's
output), parallel blocks (GPT-NeoX: the FFN reads the layer's input) and encoder memories (the
encoder's final norm). q_i = W_q^h y_i + b_q and k_j likewise are affine in the components;
QK-norm multiplies each by its frozen factor, RoPE (the layer's own base) rotates each, and

    s_ij = scale * q_i . k_j = sum_a sum_b scale * q_a,i . k_b,j

exactly (after scaling, before the mask and any soft-cap; the cap is in df.attrs["capped"]).

Memory: components are kept factored (a head's write as its n x d_k output and its slice of
W_o), and in a pre-norm stack, where nothing but the target's own norm maps a component after
it is written, each one is projected to the head's q and k spaces (2 d_k columns) as soon as it
is made. Only post-norm stacks (the small seq2seq and BERT-like models) carry d-wide components
through their norms. No components x n x d tensor is made in a pre-norm model; a cell reads only
the positions it needs.

pattern_attribution: sum over (i, j) of a_ij * term_ij(a, b), the terms weighted by the
attention each cell gets: with Q_a (n x d_k) and K_b the components' rotated projections,
term(a, b) = scale * sum((A @ K_b) * Q_a), one GEMM A @ [K_1 .. K_C] and one product of the
stacked Q's with it, in blocks of components.
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from . import _checks as checks
from .logit_lens import model_of
from .. import trace_names as tn
from ..net.mixer import check_softmax_heads
from ..net.norms import RMSNorm
from ..net.positional import apply_rope

F64 = torch.float64
GROUPS = ("component", "layer", "kind")
COLUMNS = ["query_component", "key_component", "term"]
PAIR_BLOCK_BYTES = 16 * 2**20  # pattern attribution: A @ K for this many bytes of components at once
_HEAD = re.compile(r"^(enc\.)?L(\d+)(x?)H(\d+)$")
_LAYER_PART = re.compile(r"^(enc\.)?L(\d+)\.(attn_bias|cross_attn_bias|mlp)$")


class _Comp:
    """One component at the positions P: value = s[:, None] * (x @ m) (m None: x itself).
    x (|P| x k), m (k x w) or None, s (|P|,): the product of the frozen scales that have mapped it."""

    __slots__ = ("name", "x", "m", "s")

    def __init__(self, name: str, x: torch.Tensor, m: Optional[torch.Tensor] = None, s: Optional[torch.Tensor] = None):
        self.name, self.x, self.m = name, x, m
        self.s = torch.ones(x.shape[0], dtype=F64) if s is None else s

    def value(self) -> torch.Tensor:
        v = self.x if self.m is None else self.x @ self.m
        return v * self.s[:, None]

    def right(self, mat: torch.Tensor) -> "_Comp":
        """The component times a fixed matrix on the right (a row map, a projection)."""
        if self.m is None and self.x.shape[1] <= mat.shape[1]:
            return _Comp(self.name, self.x @ mat, None, self.s)
        return _Comp(self.name, self.x, mat if self.m is None else self.m @ mat, self.s)


def _frozen(norm, z: torch.Tensor):
    """(scale per position, gain or None, shift or None, centre) of a norm frozen at its input z
    (|P| x d, float64); None for the identity."""
    if norm is None or isinstance(norm, nn.Identity):
        return None
    if isinstance(norm, nn.LayerNorm):
        centre = True
        s = torch.rsqrt(z.var(-1, unbiased=False) + norm.eps)
    elif isinstance(norm, RMSNorm):
        centre = False
        s = torch.rsqrt(z.pow(2).mean(-1) + norm.eps)
    else:
        raise ValueError(f"a {type(norm).__name__} is not a LayerNorm or an RMSNorm: its frozen map is not known, so "
                         "the score is not decomposed")
    g = None if getattr(norm, "weight", None) is None else norm.weight.detach().to("cpu", F64)
    b = None if getattr(norm, "bias", None) is None else norm.bias.detach().to("cpu", F64)
    return s, g, b, centre


def _row_map(mat: torch.Tensor, g, centre: bool) -> torch.Tensor:
    """mat (k x d) mapped by a frozen norm's fixed part: its rows centred, times the gain."""
    if centre:
        mat = mat - mat.mean(-1, keepdim=True)
    return mat if g is None else mat * g


def _apply_norm(comps: List[_Comp], frozen, actual: torch.Tensor, prefix: str = "") -> torch.Tensor:
    """Map every component by a frozen norm (in place), add its shift as a "bias" component;
    the new actual value."""
    if frozen is None:
        return actual
    s, g, b, centre = frozen
    for c in comps:
        if c.m is None:
            c.x = _row_map(c.x, g, centre)
        else:
            c.m = _row_map(c.m, g, centre)
        c.s = c.s * s
    out = _row_map(actual, g, centre) * s[:, None]
    if b is not None:
        comps.append(_Comp(prefix + "bias", torch.ones(actual.shape[0], 1, dtype=F64), b[None]))
        out = out + b
    return out


class _Walk:
    """The components of one stack's stream at positions P, layer by layer, up to the input of
    a sub-layer (stop = (layer, kind)) or to the stack's output (stop None: the memory a
    cross-attention reads). reduce: fn(list of comps) -> comps, applied to each component once
    nothing but the last norm will map it (a pre-norm stack): the projection to d_k."""

    def __init__(self, trace, model, stack: str, positions: torch.Tensor, prefix: str = ""):
        self.trace, self.model, self.net = trace, model, model.net
        self.stack, self.P, self.prefix = stack, positions, prefix
        self.dtype = next(self.net.parameters()).dtype
        self.dev = model.device

    def _module(self, fn, x: torch.Tensor) -> torch.Tensor:
        """A module of the network run on float64 values at P (in the model's dtype)."""
        return fn(x.to(self.dev, self.dtype)[None])[0].to("cpu", F64)

    def run(self, stop: Optional[Tuple[int, str]], reduce=None):
        trace, net, stack, P, pre_ = self.trace, self.net, self.stack, self.P, self.prefix
        cfg = net.cfg
        pre = cfg.norm_placement == "pre"
        keep: List[_Comp] = []  # finished components (reduced)
        live: List[_Comp] = []  # components later norms still map (post-norm)

        def add(new: List[_Comp]):
            if pre and reduce is not None:
                keep.extend(reduce(new))
            else:
                live.extend(new)

        emb = net.src_embed if stack == "encoder" else net.tgt_embed
        parts = []
        for part, name in (("tokens", "embed"), ("positions", "positions"), ("types", "types")):
            full = tn.embed(stack, part)
            if full in trace:
                parts.append(_Comp(pre_ + name, trace[full][P].to(F64)))
        if not parts:
            raise ValueError(f"this trace keeps no token embeddings of the {stack} (embed.{stack}.tokens), so the "
                             "stream cannot be taken apart into components")
        actual = sum(c.value() for c in parts)
        if emb.norm is not None:  # BERT, ModernBERT: a LayerNorm of the embeddings' sum
            actual = _apply_norm(parts, _frozen(emb.norm, actual), actual, pre_)
        add(parts)
        ablate = getattr(trace.runner, "ablate", None)
        for i, layer in enumerate(net.layers(stack)):
            if stop is not None and i > stop[0]:
                break
            hooks = ablate.hooks(stack, i) if ablate else {}
            x_in = actual
            for j, kind in enumerate(layer.sublayers()):
                if stop is not None and (i, kind) == stop:
                    y = x_in if (pre and layer.parallel) else actual
                    norm = layer.norms[j] if pre and len(layer.norms) else None
                    return self._finish(keep, live, _frozen(norm, y), y, reduce)
                if kind == "ffn" and pre:
                    # the FFN is a pre-norm layer's last sub-layer: what it wrote (its norm after it
                    # included) is the stored layer output less the stream before it, at P
                    f = trace[tn.out(stack, i)][P].to(F64) - actual
                    actual = actual + f
                    add([_Comp(f"{pre_}L{i}.mlp", f)])
                    continue
                if kind == "ffn":  # post-norm: the FFN run again on its input at P
                    f = self._module(layer.ffn, actual)
                    new = [_Comp(f"{pre_}L{i}.mlp", f)]
                else:
                    attn = getattr(layer, kind)
                    heads = trace[tn.attn(stack, i, kind, "heads")]
                    fn = hooks.get(f"{kind}.heads")
                    if fn is not None:  # an ablated pass continued from the hook's value
                        heads = fn(heads[None])[0]
                    heads = heads[:, P]  # H x |P| x d_k
                    f = self._module(attn.w_o, heads.transpose(0, 1).reshape(len(P), -1))  # the sub-layer's output
                    heads = heads.to(F64)
                    w_o = attn.w_o.weight.detach().to("cpu", F64).view(-1, attn.h, attn.dk)  # d x H x d_k
                    tag = "" if kind == "self_attn" else "x"
                    new = [_Comp(f"{pre_}L{i}{tag}H{h}", heads[h], w_o[:, h, :].T.contiguous()) for h in range(attn.h)]
                    if attn.w_o.bias is not None:
                        bname = "attn_bias" if kind == "self_attn" else "cross_attn_bias"
                        bias = attn.w_o.bias.detach().to("cpu", F64)[None]
                        new.append(_Comp(f"{pre_}L{i}.{bname}", torch.ones(len(P), 1, dtype=F64), bias))
                if pre and layer.post_norms is not None:  # Gemma 2/3, OLMo-2: the write normed first
                    f = _apply_norm(new, _frozen(layer.post_norms[j], f), f, pre_)
                actual = actual + f
                add(new)
                if not pre:  # post-norm: Norm(x + f(x)) maps the whole stream
                    actual = _apply_norm(live, _frozen(layer.norms[j], actual), actual, pre_)
        if stop is not None:
            raise ValueError(f"{stack} has no sub-layer {stop[1]} in layer {stop[0]}")
        return self._finish(keep, live, _frozen(net.final_norm(stack), actual), actual, reduce)

    def _finish(self, keep, live, frozen, y, reduce):
        """The components at the target's input, the last norm (frozen at y) applied: the live
        ones mapped by it in full; the reduced ones (their norm's fixed part already folded
        into reduce's projection) take its per-position scale; its shift is one more "bias"."""
        comps = list(live)
        y_out = _apply_norm(comps, frozen, y, self.prefix)
        if frozen is not None:
            for c in keep:
                c.s = c.s * frozen[0]
        if reduce is None:
            return comps + keep, y_out
        return keep + reduce(comps, final=True), y_out


class _Side:
    """The q, k or v side of one head: its components' projections at positions P (q and k
    rotated and QK-normed as the model does; v neither)."""

    def __init__(self, model, stack: str, layer: int, kind: str, which: str, head: int):
        net = model.net
        attn = getattr(net.layers(stack)[layer], kind)
        if attn is None:
            raise ValueError(f"{stack} layer {layer} has no {kind}")
        self.attn, self.which = attn, which
        self.kv = which in ("k", "v")
        self.rotates = which != "v"
        self.g = head // (attn.h // attn.hkv) if self.kv else head
        lin = {"q": attn.w_q, "k": attn.w_k, "v": attn.w_v}[which]
        n_heads = attn.hkv if self.kv else attn.h
        w = lin.weight.detach().to("cpu", F64)
        self.w_full = w  # (heads d_k) x d
        self.w = w.view(n_heads, attn.dk, -1)[self.g]  # d_k x d
        b = lin.bias
        self.b_full = None if b is None else b.detach().to("cpu", F64)
        self.b = None if b is None else self.b_full.view(n_heads, attn.dk)[self.g]
        self.norm = {"q": attn.q_norm, "k": attn.k_norm, "v": None}[which]
        self.qk_norm = attn.qk_norm if self.norm is not None else None
        self.n_heads = n_heads


class _Decomposition:
    """Both sides of one head at their positions: names and rotated projections (C x |P| x d_k)."""

    def __init__(self, trace, stack: str, layer: int, head: int, attn: str, q_pos, k_pos, value: bool = False):
        """value: the v side too (self.v_names, self.V at the key positions), from the same walk."""
        model = model_of(trace, "score attribution")
        net, cfg = model.net, model.config
        if stack not in trace.stacks():
            raise ValueError(f"this trace has no {stack}")
        layer = checks.index(layer, trace.layers(stack), f"layer (of the {stack})")
        if attn not in tn.ATTNS:
            raise ValueError(f"attn must be one of {tn.ATTNS}, not {attn!r}")
        check_softmax_heads(net, stack, layer, "score attribution")
        lay = net.layers(stack)[layer]
        mod = getattr(lay, attn, None)
        if mod is None:
            raise ValueError(f"{stack} layer {layer} has no {attn}")
        head = checks.index(head, mod.h, "head")
        self.model, self.trace, self.stack, self.layer, self.head, self.attn = model, trace, stack, layer, head, attn
        self.mod = mod
        if getattr(mod, "temperature", None) is not None:
            raise ValueError(f"{stack} layer {layer}'s scale varies by query position (temperature tuning): "
                             "score attribution decomposes scores of one fixed scale")
        self.scale = mod.scale if mod.scale is not None else 1.0 / math.sqrt(mod.dk)
        self.softcap = mod.softcap
        self.cross = attn == "cross_attn"
        if self.cross and stack != "decoder":
            raise ValueError("cross-attention reads the encoder from the decoder")
        self.q_side = _Side(model, stack, layer, attn, "q", head)
        self.k_side = _Side(model, stack, layer, attn, "k", head)
        angles = None
        if not self.cross and cfg.positional == "rope":
            n = int(max(int(torch.as_tensor(q_pos).max()), int(torch.as_tensor(k_pos).max()))) + 1
            angles = net._angles(n, device="cpu", layer=layer)  # this layer's own base (None: no positions there)
            angles = None if angles is None else angles.to(F64)
        self.angles = angles
        q_pos = torch.as_tensor(q_pos, dtype=torch.long)
        k_pos = torch.as_tensor(k_pos, dtype=torch.long)
        kv_sides = [self.k_side] + ([_Side(model, stack, layer, attn, "v", head)] if value else [])
        self.v_names, self.V = None, None
        if self.cross:
            self.q_names, self.Q = self._side(stack, (layer, attn), q_pos, [self.q_side], "")[0]
            got = self._side("encoder", None, k_pos, kv_sides, "enc.")
            self.k_names, self.K = got[0]
            if value:
                self.v_names, self.V = got[1]
        else:
            both = torch.unique(torch.cat([q_pos, k_pos]))
            got = self._side(stack, (layer, attn), both, [self.q_side] + kv_sides, "")
            (qn, Q), (kn, K) = got[0], got[1]
            where = {int(p): r for r, p in enumerate(both.tolist())}
            k_rows = [where[int(p)] for p in k_pos]
            self.q_names, self.Q = qn, Q[:, [where[int(p)] for p in q_pos]]
            self.k_names, self.K = kn, K[:, k_rows]
            if value:
                self.v_names, self.V = got[2][0], got[2][1][:, k_rows]

    def _side(self, stack, stop, P, sides: Sequence[_Side], prefix: str):
        """[(names, C x |P| x d_k)] for each side, the stream of `stack` walked to `stop` at P."""
        walk = _Walk(self.trace, self.model, stack, P, prefix)
        cols = [s.w.T for s in sides]  # d x d_k each
        mat = torch.cat(cols, dim=1)  # d x (sides d_k)
        pre = self.model.config.norm_placement == "pre"
        if pre:  # each component projected as it is made, the last norm's fixed part folded in
            norm = self._last_norm(stack, stop)
            fr = None
            if norm is not None and not isinstance(norm, nn.Identity):
                g = None if getattr(norm, "weight", None) is None else norm.weight.detach().to("cpu", F64)
                fr = (g, isinstance(norm, nn.LayerNorm))
            folded = _fold(mat, fr)
            comps, y = walk.run(stop, reduce=lambda cs, final=False: _reduced(cs, final, folded, mat))
        else:
            comps, y = walk.run(stop, reduce=None)
            comps = [c.right(mat) for c in comps]
        # every component now in the projected space: value = s * (x @ m) (|P| x sides d_k)
        out = []
        dk = self.mod.dk
        names = [c.name for c in comps]
        n_b = [1 if side.b is not None else 0 for side in sides]
        Vs = [torch.empty(len(comps) + nb, len(P), dk, dtype=F64) for nb in n_b]
        for r, c in enumerate(comps):  # one component's |P| x (sides d_k) at a time
            v = c.value()
            for n_side, V in enumerate(Vs):
                V[r] = v[:, n_side * dk:(n_side + 1) * dk]
            comps[r] = None  # its factors are no longer needed
        rope = None if self.angles is None else self.angles[P]
        for n_side, (side, V) in enumerate(zip(sides, Vs)):
            if side.b is not None:
                V[-1] = side.b
            if side.norm is not None:  # QK-norm, frozen at the actual q / k
                y_proj = y @ side.w_full.T + (0 if side.b_full is None else side.b_full)  # |P| x heads d_k
                w = side.norm.weight  # None: a norm without gain (Llama 4's L2 norm of q and k)
                gain = torch.ones(dk if side.qk_norm != "full" else side.n_heads * dk, dtype=F64) if w is None \
                    else w.detach().to("cpu", F64)
                if side.qk_norm == "full":
                    fac = torch.rsqrt(y_proj.pow(2).mean(-1) + side.norm.eps)
                    gain = gain.view(side.n_heads, dk)[side.g]
                else:
                    mine = y_proj.view(len(P), side.n_heads, dk)[:, side.g]
                    fac = torch.rsqrt(mine.pow(2).mean(-1) + side.norm.eps)
                V.mul_(fac[None, :, None] * gain)
            if rope is not None and side.rotates:  # a block of components at a time: rotation's temporaries stay small
                step = max(1, 2**22 // max(1, len(P) * dk))
                for c0 in range(0, V.shape[0], step):
                    V[c0:c0 + step] = apply_rope(V[c0:c0 + step], rope, self.mod.rope_layout)
            out.append((names + ["bias"] * n_b[n_side], V))
        return out

    def _last_norm(self, stack, stop):
        layers = self.model.net.layers(stack)
        if stop is None:
            return self.model.net.final_norm(stack)
        lay = layers[stop[0]]
        if not len(lay.norms):
            return None
        return lay.norms[lay.sublayers().index(stop[1])]


def _fold(mat: torch.Tensor, fr) -> torch.Tensor:
    """A norm's fixed part (centre, gain) folded into a projection d x w: x -> centre(x) * g @ mat."""
    if fr is None:
        return mat
    g, centre = fr
    m = mat if g is None else mat * g[:, None]
    if centre:
        m = m - m.mean(0, keepdim=True)  # (x - mean(x)) @ m = x @ (m - 1 mean_rows(m))
    return m


def _reduced(comps, final, folded, plain):
    """Pre-norm components projected as they are made: each one's value times the last norm's
    fixed part and the projection (folded). `final`: components the last norm has already mapped
    (the walk's live list, empty in a pre-norm stack) take the plain projection."""
    return [c.right(plain if final else folded) for c in comps]


def _scores_row(trace, stack, layer, attn, head, rows) -> torch.Tensor:
    """The model's own scaled scores of the head at query rows (k x n_k), from the trace's map."""
    from ..head_maps import long_layer

    name = tn.attn(stack, layer, attn, "scaled")
    if attn == "self_attn" and long_layer(trace, stack, attn):
        return trace.head(name, head)[rows].to(F64)
    return trace[name][head][rows].to(F64)


def _weights(trace, stack, layer, attn, head) -> torch.Tensor:
    from ..head_maps import long_layer

    name = tn.attn(stack, layer, attn, "weights")
    if attn == "self_attn" and long_layer(trace, stack, attn):
        return trace.head(name, head).to(F64)
    return trace[name][head].to(F64)


def group_of(name: str, group: str) -> str:
    """The label a component sums into under `group` (component / layer / kind)."""
    if group == "component":
        return name
    pre = "enc." if name.startswith("enc.") else ""
    m = _HEAD.match(name)
    if m:
        return f"{pre}L{m.group(2)}.{'cross_attn' if m.group(3) else 'attn'}" if group == "layer" else f"{pre}attn"
    m = _LAYER_PART.match(name)
    if m:
        part = m.group(3)
        if group == "layer":
            return f"{pre}L{m.group(2)}." + {"attn_bias": "attn", "cross_attn_bias": "cross_attn", "mlp": "mlp"}[part]
        return pre + ("mlp" if part == "mlp" else "attn")
    base = name[len(pre):]
    if group == "kind" and base in ("embed", "positions", "types"):
        return pre + "embed"
    return name


def _aggregate(names: List[str], group: str) -> Tuple[List[str], torch.Tensor]:
    """(labels in first-seen order, C x G 0/1 matrix summing components into them)."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
    labels, index = [], {}
    cols = []
    for n in names:
        g = group_of(n, group)
        if g not in index:
            index[g] = len(labels)
            labels.append(g)
        cols.append(index[g])
    m = torch.zeros(len(names), len(labels), dtype=F64)
    m[torch.arange(len(names)), torch.tensor(cols)] = 1.0
    return labels, m


def _frame(q_names, k_names, T: torch.Tensor, group: str) -> pd.DataFrame:
    ql, qm = _aggregate(q_names, group)
    kl, km = _aggregate(k_names, group)
    G = qm.T @ T @ km  # labels_q x labels_k
    df = pd.DataFrame({"query_component": np.repeat(np.array(ql, dtype=object), len(kl)),
                       "key_component": np.tile(np.array(kl, dtype=object), len(ql)),
                       "term": G.reshape(-1).numpy()})
    return df


def _lengths(trace, stack, attn):
    if stack not in tn.STACKS or stack not in trace.stacks():
        raise ValueError(f"this trace has no {stack!r} stack (it has {', '.join(trace.stacks())})")
    if attn not in tn.ATTNS:
        raise ValueError(f"attn must be one of {tn.ATTNS}, not {attn!r}")
    if attn == tn.CROSS and (stack != "decoder" or "encoder" not in trace.stacks()):
        raise ValueError("cross_attn reads an encoder's output from a decoder: this model has no cross-attention")
    names_q = tn.embed(stack, "sum")
    n_q = trace[names_q].shape[0]
    n_k = trace[tn.embed("encoder", "sum")].shape[0] if attn == "cross_attn" else n_q
    return n_q, n_k


@torch.inference_mode()
def score_attribution(trace, stack: str, layer: int, head: int, query: int, key: int, attn: str = "self_attn",
                      versus: Optional[int] = None, group: str = "component") -> pd.DataFrame:
    """s_ij of (layer, head) (after scaling, before the mask and any soft-cap) as query-side x
    key-side terms (the module docstring); versus=j2: the terms of s_ij - s_ij2. Rows:
    query_component, key_component, term. attrs: score (the model's own, from the trace's
    scaled map), sum, capped (c tanh(s / c) where the head soft-caps, else None), masked, and
    the positions, tokens and softmax row of the cell."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
    n_q, n_k = _lengths(trace, stack, attn)
    i = checks.position(query, n_q, "query")
    j = checks.position(key, n_k, "key")
    j2 = None if versus is None else checks.position(versus, n_k, "versus key")
    keys = [j] if j2 is None else [j, j2]
    dec = _Decomposition(trace, stack, layer, head, attn, [i], keys)
    Q = dec.Q[:, 0]  # C_q x d_k
    T = dec.scale * (Q @ dec.K[:, 0].T)
    if j2 is not None:
        T = T - dec.scale * (Q @ dec.K[:, 1].T)
    df = _frame(dec.q_names, dec.k_names, T, group)
    row = _scores_row(trace, stack, layer, attn, head, slice(i, i + 1))[0]
    score = float(row[j] - (row[j2] if j2 is not None else 0.0))
    w = trace[tn.attn(stack, layer, attn, "masked")][head][i] if not _long(trace, stack, attn) else None
    q_tokens = trace.tokens("target") if stack == "decoder" and trace.tokens("target") else trace.tokens("source")
    k_tokens = trace.tokens("source") if attn == "cross_attn" else q_tokens
    df.attrs.update(score=score, sum=float(T.sum()), scale=dec.scale, softcap=dec.softcap,
                    capped=None if dec.softcap is None else float(dec.softcap * math.tanh(float(row[j]) / dec.softcap)),
                    stack=stack, layer=int(layer), head=int(head), attn=attn, query=i, key=j, versus=j2,
                    group=group, masked=None if w is None else bool(torch.isinf(w[j]) and w[j] < 0),
                    query_token=q_tokens[i] if i < len(q_tokens) else "",
                    key_token=k_tokens[j] if j < len(k_tokens) else "",
                    versus_token=None if j2 is None else (k_tokens[j2] if j2 < len(k_tokens) else ""))
    return df


def _long(trace, stack, attn) -> bool:
    from ..head_maps import long_layer

    return attn == "self_attn" and long_layer(trace, stack, attn)


def agrees(df: pd.DataFrame, tol: float = 1e-4) -> bool:
    """Whether the terms' sum equals the model's own score within tol x max(1, |score|)."""
    s, t = df.attrs["score"], df.attrs["sum"]
    return abs(s - t) <= tol * max(1.0, abs(s))


@torch.inference_mode()
def pattern_attribution(trace, stack: str, layer: int, head: int, attn: str = "self_attn",
                        group: str = "component") -> pd.DataFrame:
    """What drives the head's whole pattern on this text: sum over (i, j) of a_ij * term_ij(a, b).
    Same rows as score_attribution; attrs: score = sum_ij a_ij s_ij from the model's own maps,
    sum = the terms' sum."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
    n_q, n_k = _lengths(trace, stack, attn)
    dec = _Decomposition(trace, stack, layer, head, attn, torch.arange(n_q), torch.arange(n_k))
    A = _weights(trace, stack, layer, attn, head)  # n_q x n_k
    return pattern_frame(trace, dec, A, group)


def pattern_frame(trace, dec: "_Decomposition", A: torch.Tensor, group: str = "component") -> pd.DataFrame:
    """pattern_attribution's frame from a decomposition at every position and the head's weights A."""
    stack, layer, head, attn = dec.stack, dec.layer, dec.head, dec.attn
    n_q, n_k = A.shape
    # pair after grouping where the grouping is coarser (bilinear: sums commute with the pairing)
    ql, qm = _aggregate(dec.q_names, group)
    kl, km = _aggregate(dec.k_names, group)
    # (a name may repeat, e.g. each norm's shift is a "bias": those rows are summed too)
    Q = torch.einsum("cnd,cg->gnd", dec.Q, qm) if len(ql) != len(dec.q_names) else dec.Q
    K = torch.einsum("cnd,cg->gnd", dec.K, km) if len(kl) != len(dec.k_names) else dec.K
    Cq, Ck = Q.shape[0], K.shape[0]
    dk = Q.shape[2]
    Qf = Q.reshape(Cq, -1)  # Cq x (n_q d_k)
    T = torch.empty(Cq, Ck, dtype=F64)
    per = max(1, PAIR_BLOCK_BYTES // max(1, n_q * dk * 8))
    for b0 in range(0, Ck, per):
        b1 = min(Ck, b0 + per)
        Kb = K[b0:b1].permute(1, 0, 2).reshape(n_k, -1)  # n_k x (blk d_k)
        AK = (A @ Kb).reshape(n_q, b1 - b0, dk).permute(1, 0, 2).reshape(b1 - b0, -1)  # blk x (n_q d_k)
        T[:, b0:b1] = Qf @ AK.T
    T = T * dec.scale
    df = pd.DataFrame({"query_component": np.repeat(np.array(ql, dtype=object), len(kl)),
                       "key_component": np.tile(np.array(kl, dtype=object), len(ql)),
                       "term": T.reshape(-1).numpy()})
    S = _scaled_full(trace, stack, layer, attn, head)
    own = float(torch.where(A > 0, A * S, torch.zeros_like(A)).sum())
    df.attrs.update(score=own, sum=float(T.sum()), scale=dec.scale, stack=stack, layer=int(layer), head=int(head),
                    attn=attn, group=group)
    return df


def _scaled_full(trace, stack, layer, attn, head) -> torch.Tensor:
    name = tn.attn(stack, layer, attn, "scaled")
    if _long(trace, stack, attn):
        return trace.head(name, head).to(F64)
    return trace[name][head].to(F64)


def top_terms(df: pd.DataFrame, k: int = 5) -> pd.DataFrame:
    """The k terms largest in size, largest first."""
    order = df["term"].abs().sort_values(ascending=False, kind="stable").index[:k]
    return df.loc[order].reset_index(drop=True)
