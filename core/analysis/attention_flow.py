"""Where attention goes through the layers: rollout and flow, pure functions over traces.

Only self-attention maps are read (`{stack}.{i}.self_attn.weights`), one layer at a time, so a
trace that computes attention on access never holds every layer's maps at once.

Rollout and flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): the
residual connection is modelled by mixing the identity into each layer's (head-averaged) map,
    A~_l = residual * I + (1 - residual) * A_l,  rows renormalised to sum to 1,
rollout multiplies them, R_0 = A~_0, R_l = A~_l R_{l-1}; flow treats the layers as a graph
(node j of layer l-1 -> node i of layer l with capacity A~_l[i, j]) and takes the maximum
flow from an input token to a token of a layer (scipy's max-flow on capacities scaled to
integers, FLOW_SCALE per unit).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from .. import trace_names as tn
from ..net.mixer import MIXER_REASONS

FLOW_SCALE = 10**6  # integer capacity units per unit of attention (scipy's max-flow takes integers)

Heads = Union[str, int]


def _softmax_layer(trace, stack: str, layer: int) -> str:
    """The name of a layer's softmax weights; a ValueError for a token mixer's layer."""
    name = tn.self_attn(stack, layer, "weights")
    mixers = getattr(trace, "mixer_layers", None)  # a Trace says which layers are token mixers
    if mixers is not None and layer in mixers(stack):
        raise ValueError(f"{stack} layer {layer} mixes tokens with a mixer, not softmax attention: "
                         f"{MIXER_REASONS['softmax']}, so rollout and flow, which compose softmax maps, do not apply")
    return name


def _layer_map(trace, stack: str, layer: int, heads: Heads) -> np.ndarray:
    _softmax_layer(trace, stack, layer)
    w = trace[tn.self_attn(stack, layer, "weights")].double()  # H x n x n, read once and dropped
    if heads == "mean":
        return w.mean(0).numpy()
    if heads == "max":
        return w.max(0).values.numpy()
    if isinstance(heads, (int, np.integer)) and 0 <= int(heads) < w.shape[0]:
        return w[int(heads)].numpy()
    raise ValueError(f"heads must be 'mean', 'max' or a head index below {w.shape[0]}, not {heads!r}")


def _pooled_map(trace, stack: str, layer: int, heads: Heads, size: int) -> np.ndarray:
    """A layer's block map (queries averaged, keys summed within blocks of `size`), rows sum to 1."""
    name = _softmax_layer(trace, stack, layer)
    if heads == "mean":
        p = trace.pooled(name, size).double().mean(0)
    elif isinstance(heads, (int, np.integer)):
        p = trace.pooled(name, size, heads=[int(heads)])[0].double()
    else:
        raise ValueError(f"heads must be 'mean' or a head index for a rollout in blocks, not {heads!r}")
    n = p.shape[-1] and len(trace.tokens("source" if stack == "encoder" else "target"))
    widths = np.array([min(size, n - b * size) for b in range(p.shape[-1])], dtype=np.float64)
    return p.numpy() * widths[None, :]


def mix_residual(a: np.ndarray, residual: float) -> np.ndarray:
    """A~ = residual * I + (1 - residual) * A, each row renormalised to sum to 1."""
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must lie in [0, 1], not {residual}")
    m = residual * np.eye(a.shape[-1]) + (1.0 - residual) * np.asarray(a, dtype=np.float64)
    s = m.sum(-1, keepdims=True)
    return np.divide(m, s, out=np.zeros_like(m), where=s > 0)


def rollout(trace, stack: str, residual: float = 0.5, heads: Heads = "mean", size: Optional[int] = None) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020): L x n x n float64, R[l, i, j] = how much of
    token i after layer l comes from input token j, with R_0 = A~_0 and R_l = A~_l R_{l-1}
    (A~ from mix_residual). heads: "mean" (the paper's choice), "max", or one head's index.
    Every row of every layer sums to 1.

    size: rollout between blocks of `size` tokens (L x nb x nb), from each layer's pooled map
    (trace.pooled: one head and a tile at a time) with keys summed within a block, for long
    inputs where L x n x n would not fit (L = 30, n = 8,192: 16 GB). An approximation: a
    block's tokens are taken to pass on what they receive alike. heads "max" is not pooled."""
    out = []
    r = None
    for layer in range(trace.layers(stack)):
        m = _layer_map(trace, stack, layer, heads) if size is None else _pooled_map(trace, stack, layer, heads, size)
        a = mix_residual(m, residual)
        r = a if r is None else a @ r
        out.append(r)
    return np.stack(out)


class _SinkGraph:
    """The part of the layer graph that can carry flow into token i after layer l, for one
    max-flow per input token: node 0 is the source (the input token, its edges to the
    tokens after layer 0 carry mixed[0][:, j]), then the tokens after layers 0 .. l-1, then
    the sink (token i after layer l, fed by mixed[l][i, :]). The structure is built once
    per (l, i); only the source's n capacities change from one input token to the next, in
    place, so each max-flow call handles (l - 1) n^2 + 2n edges rather than (l + 1) n^2."""

    def __init__(self, caps: Sequence[np.ndarray], l: int, i: int):
        import scipy.sparse as sp

        n = caps[0].shape[-1]
        self.n, self.sink = n, l * n + 1
        indptr, indices, data = [0], [], []
        indices.append(np.arange(1, n + 1))  # source -> tokens after layer 0
        data.append(np.zeros(n, np.int32))
        indptr.append(n)
        for m in range(1, l):  # tokens after layer m-1 -> tokens after layer m: caps[m][k, k']
            first = 1 + m * n
            for k2 in range(n):
                indices.append(np.arange(first, first + n))
                data.append(caps[m][:, k2])
                indptr.append(indptr[-1] + n)
        for k in range(n):  # tokens after layer l-1 -> the sink
            indices.append(np.array([self.sink]))
            data.append(caps[l][i, k : k + 1])
            indptr.append(indptr[-1] + 1)
        indptr.append(indptr[-1])  # the sink has no way out
        size = self.sink + 1
        self.graph = sp.csr_matrix((np.concatenate(data).astype(np.int32), np.concatenate(indices), np.array(indptr)),
                                   shape=(size, size))
        self.caps0 = caps[0]

    def value(self, j: int) -> int:
        from scipy.sparse.csgraph import maximum_flow

        self.graph.data[: self.n] = self.caps0[:, j]
        return maximum_flow(self.graph, 0, self.sink).flow_value


def flow(trace, stack: str, residual: float = 0.5, heads: Heads = "mean",
         query: Optional[int] = None, layers: Optional[Sequence[int]] = None) -> np.ndarray:
    """Attention flow (Abnar & Zuidema 2020): L x n x n float64, F[l, i, j] = the maximum
    flow from input token j to token i after layer l through the layer graph (token j after
    layer m-1 -> token i after layer m, capacity A~_m[i, j]), computed by scipy.sparse.csgraph.maximum_flow on capacities
    scaled to integers (FLOW_SCALE per unit, so values are within ~n/FLOW_SCALE of the
    real-valued flow). One max-flow per (layer, token, input token): `query` limits it to
    token i = query (other rows stay 0), `layers` to those layers (others stay 0).
    Pairs with no path (zero rollout, e.g. a later token under a causal mask) are 0; after
    layer 0 the flow is the single edge's capacity, A~_0[i, j]."""
    n_layers = trace.layers(stack)
    mixed = [mix_residual(_layer_map(trace, stack, l, heads), residual) for l in range(n_layers)]
    caps = [np.rint(a * FLOW_SCALE).astype(np.int32) for a in mixed]
    n = mixed[0].shape[-1]
    reach = None
    out = np.zeros((n_layers, n, n))
    queries = range(n) if query is None else [int(query)]
    for l in range(n_layers):
        reach = mixed[l] if reach is None else mixed[l] @ reach  # rollout: > 0 iff a path exists
        if layers is not None and l not in layers:
            continue
        for i in queries:
            if l == 0:
                out[0, i] = mixed[0][i]
                continue
            g = _SinkGraph(caps, l, i)
            for j in range(n):
                if reach[i, j] > 0:
                    out[l, i, j] = g.value(j) / FLOW_SCALE
    return out
