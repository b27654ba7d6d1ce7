"""Circuits: which earlier heads make a head attend where it does and what it reads, as a graph
of exact edges (head_circuit), and path patching to test an edge (path_patch). The contract is
docs/design.md, "Circuits".

    edges = core.analysis.head_circuit(trace, "decoder", 18, 6, depth=2, top=5)
    pp = core.analysis.path_patch(model, clean, corrupt, sender=(16, 0), receiver=(18, 6), side="key")
    pp.attrs["clean"], pp.attrs["patched"]      # the receiver's induction score, clean and patched

head_circuit. The stream entering a layer is a sum of components (score attribution's
decomposition, core/analysis/score_attribution.py, with every norm's scale frozen at its traced
value). Into a head (the target):
    query / key: pattern attribution's marginals. With T(a, b) = sum_ij a_ij term_ij(a, b), the
        query-side weight of a is sum_b T(a, b) and the key-side weight of b is sum_a T(a, b):
        exact, no new approximation (sum over either side = the pattern's sum_ij a_ij s_ij).
    value: the component's share of the head's output. Each component c of the stream at key j
        goes through the same frozen norm and W_V (+ the v bias as one more "bias" component), so
        the head's output at query i is o_i = sum_c o_c,i with o_c,i = sum_j a_ij v_c,j, and
        weight(c) = sum_i <o_c,i W_O^h, o_i W_O^h> / sum_i |o_i W_O^h|^2: the shares sum to 1.
Depth d: the `top` heaviest head sources ("L{l}H{h}", by |weight|) of each side of a target are
expanded in turn as targets, on the same trace, breadth first; a head is expanded once.

path_patch (Wang et al. 2022). The clean input is run to the receiver's layer with the sender's
head output taken from the corrupted run and every other head and MLP between them frozen at its
clean value (hook points `.heads`, `ffn.out`): the stream that reaches the receiver differs from
the clean one only by the sender's direct write (carried through the norms where a post-norm
stack has them). The receiver's layer is then run on its clean input with only the receiver
head's query (or its kv head's key or value) taken from the layer run on that patched stream
(hook points `.q`, `.k`, `.v`): every other path keeps its clean value. The layers compute
attention as every other pass does (Transformer.run_layer).
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import torch

from .. import trace_names as tn
from ..net.hooks import Hooks
from ..net.mixer import check_softmax_heads
from ..net.recorder import Recorder
from .score_attribution import F64, _Decomposition, _lengths, _weights, pattern_frame

SIDES = ("query", "key", "value")
COLUMNS = ["source", "target", "side", "weight", "share", "depth"]
SCORES = ("induction", "previous_token")
_SELF_HEAD = re.compile(r"^L(\d+)H(\d+)$")


def head_name(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def parse_head(name: str) -> Optional[Tuple[int, int]]:
    """(layer, head) of a self-attention head's component name "L{l}H{h}"; None for any other."""
    m = _SELF_HEAD.match(str(name))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _sum_by_name(names: Sequence[str], values: torch.Tensor) -> Dict[str, float]:
    """{name: summed value} in first-seen order (a name such as "bias" may repeat)."""
    out: Dict[str, float] = {}
    for n, v in zip(names, values.tolist()):
        out[n] = out.get(n, 0.0) + float(v)
    return out


def _value_shares(trace, dec: _Decomposition, A: torch.Tensor) -> Tuple[Dict[str, float], float]:
    """{component: share of the head's output} and the relative difference between the
    components' summed output and the head's own traced output."""
    V = dec.V  # C x n_k x d_k: each component's value vectors at every key
    O_c = torch.einsum("ij,cjd->cid", A, V)  # C x n_q x d_k: each component's part of the head's output
    O = O_c.sum(0)  # n_q x d_k
    mod = dec.mod
    dk = mod.dk
    w_o = mod.w_o.weight.detach().to("cpu", F64)[:, dec.head * dk:(dec.head + 1) * dk]  # d x d_k
    G = w_o.T @ w_o  # d_k x d_k: <o W_O^h, o' W_O^h> = o G o'
    OG = O @ G  # n_q x d_k
    total = float((OG * O).sum())
    shares = torch.einsum("cid,id->c", O_c, OG) / (total if total != 0 else 1.0)
    own = trace[tn.attn(dec.stack, dec.layer, dec.attn, "heads")][dec.head].to(F64)
    err = float((O - own).norm() / max(float(own.norm()), 1e-12))
    return _sum_by_name(dec.v_names, shares), err


def _one_head(trace, stack: str, layer: int, head: int, sides: Sequence[str]) -> Tuple[dict, dict]:
    """{side: {component: weight}} into one self-attention head, and its checks."""
    n_q, n_k = _lengths(trace, stack, tn.SELF)
    dec = _Decomposition(trace, stack, layer, head, tn.SELF, torch.arange(n_q), torch.arange(n_k),
                         value="value" in sides)
    A = _weights(trace, stack, layer, tn.SELF, head)
    out, checks = {}, {"target": head_name(layer, head)}
    if "query" in sides or "key" in sides:
        pa = pattern_frame(trace, dec, A, "component")
        if "query" in sides:
            out["query"] = pa.groupby("query_component", sort=False)["term"].sum().to_dict()
        if "key" in sides:
            out["key"] = pa.groupby("key_component", sort=False)["term"].sum().to_dict()
        checks.update(pattern_score=pa.attrs["score"], pattern_sum=pa.attrs["sum"])
    if "value" in sides:
        out["value"], checks["value_error"] = _value_shares(trace, dec, A)
    return out, checks


def _chosen(weights: Dict[str, float], top: int) -> Tuple[List[str], List[str]]:
    """(sources listed: the `top` heaviest of any kind and the `top` heaviest heads; heads expanded)."""
    by_size = sorted(weights, key=lambda n: -abs(weights[n]))
    heads = [n for n in by_size if parse_head(n) is not None][:top]
    listed = by_size[:top]
    return listed + [h for h in heads if h not in listed], heads


@torch.inference_mode()
def head_circuit(trace, stack: str, layer: int, head: int, depth: int = 2, top: int = 5,
                 side: Union[str, Iterable[str]] = SIDES) -> pd.DataFrame:
    """The edges into (layer, head) and, to `depth`, into its heaviest head sources (module
    docstring). Columns: source, target, side, weight, share (weight over the side's total:
    the pattern's sum for query / key, 1 for value), depth (1 = into the chosen head).
    attrs: stack, layer, head, depth, top, sides, checks (one dict per expanded head: the
    pattern's own score and its terms' sum, the value side's relative error)."""
    sides = (side,) if isinstance(side, str) else tuple(side)
    bad = [s for s in sides if s not in SIDES]
    if bad or not sides:
        raise ValueError(f"side must be among {SIDES}, not {bad or sides!r}")
    if int(depth) < 1 or int(top) < 1:
        raise ValueError(f"depth and top are at least 1 (got depth={depth}, top={top})")
    _lengths(trace, stack, tn.SELF)
    rows, checks = [], []
    seen = {(int(layer), int(head))}
    frontier = [(int(layer), int(head))]
    for d in range(1, int(depth) + 1):
        nxt = []
        for (l, h) in frontier:
            weights, check = _one_head(trace, stack, l, h, sides)
            checks.append(check)
            for s in sides:
                w = weights[s]
                total = 1.0 if s == "value" else (sum(w.values()) or 1.0)
                listed, heads = _chosen(w, int(top))
                rows += [(n, head_name(l, h), s, w[n], w[n] / total, d) for n in listed]
                for name in heads:
                    lh = parse_head(name)
                    if lh not in seen:
                        seen.add(lh)
                        nxt.append(lh)
        frontier = nxt
        if not frontier:
            break
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update(stack=stack, layer=int(layer), head=int(head), depth=int(depth), top=int(top), sides=list(sides),
                    checks=checks)
    return df


# ------------------------------------------------------------------------------ path patching
class _Stop(Exception):
    """Raised by a hook where a pass has given what it was run for."""


def _ids(model, text) -> List[int]:
    if isinstance(text, str):
        return list(model.encode(text).ids)
    return [int(i) for i in text]


def score_targets(ids: Sequence[int], score: str = "induction") -> List[Tuple[int, int]]:
    """(query, key) cells a head score names on these ids. induction: from each query i to every
    key j <= i whose previous token is ids[i] (the token after an earlier copy of it);
    previous_token: (i, i - 1)."""
    if score == "previous_token":
        return [(i, i - 1) for i in range(1, len(ids))]
    if score != "induction":
        raise ValueError(f"score must be one of {SCORES}, not {score!r}")
    seen: Dict[int, List[int]] = {}
    cells = []
    for i, t in enumerate(ids):
        cells += [(i, j) for j in seen.get(t, []) if j <= i]
        if i + 1 < len(ids):
            seen.setdefault(t, []).append(i + 1)
    return cells


def _mean_on(w: torch.Tensor, cells: Sequence[Tuple[int, int]]) -> float:
    """Mean over the queries that have cells of the weight on their cells."""
    by_q: Dict[int, List[int]] = {}
    for i, j in cells:
        by_q.setdefault(int(i), []).append(int(j))
    if not by_q:
        return float("nan")
    return float(np.mean([float(w[i, js].double().sum()) for i, js in by_q.items()]))


def _stack_of(model, stack: Optional[str]) -> str:
    if stack is None:
        stack = "decoder" if model.kind == "decoder" else "encoder"
    if stack not in ("encoder", "decoder") or (stack == "decoder" and model.kind == "encoder") or (
            stack == "encoder" and model.kind == "decoder"):
        raise ValueError(f"{model.name} has no {stack} to patch")
    if model.kind == "encoder-decoder" and stack == "decoder":
        raise ValueError("path patching runs one stack on its own input: on an encoder-decoder, the encoder")
    return stack


@torch.inference_mode()
def path_patch(model, clean, corrupt, sender: Tuple[int, int], receiver: Tuple[int, int], side: str = "key",
               score: str = "induction", targets: Optional[Sequence[Tuple[int, int]]] = None,
               stack: Optional[str] = None) -> pd.DataFrame:
    """Path patching of the edge sender -> receiver on `side` (module docstring). clean, corrupt:
    texts, or token ids as the model reads them; same token count. Returns one row per cell
    (query, key, clean, patched: the receiver's weights); attrs: clean, patched (its score:
    the mean weight on `targets`, default the cells `score` names on the clean ids), drop =
    clean - patched, output_change (|change of the receiver's write| / |its clean write|),
    sender, receiver, side, stack, score, n_targets."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    stack = _stack_of(model, stack)
    net = model.net
    n_layers = len(net.layers(stack))
    (sl, sh), (rl, rh) = (int(sender[0]), int(sender[1])), (int(receiver[0]), int(receiver[1]))
    for what, (l, h) in (("sender", (sl, sh)), ("receiver", (rl, rh))):
        if not 0 <= l < n_layers:
            raise ValueError(f"{what} layer {l} is outside the {stack}'s layers 0-{n_layers - 1}")
        check_softmax_heads(net, stack, l, "path patching")
        n_heads = net.layers(stack)[l].self_attn.h
        if not 0 <= h < n_heads:
            raise ValueError(f"{what} head {h} is outside heads 0-{n_heads - 1}")
    if sl >= rl:
        raise ValueError(f"the sender (layer {sl}) must be in an earlier layer than the receiver (layer {rl}): "
                         "a head reads only what earlier layers wrote")
    a, b = _ids(model, clean), _ids(model, corrupt)
    if len(a) != len(b):
        raise ValueError(f"clean and corrupt must have the same number of tokens: clean has {len(a)}, corrupt has "
                         f"{len(b)}")
    dev = model.device
    kept: Dict[str, torch.Tensor] = {}

    def run(ids, fns):
        x = torch.tensor([ids], dtype=torch.long, device=dev)
        try:
            net.decode(x, rec=Hooks(fns)) if stack == "decoder" else net.encode(x, rec=Hooks(fns))
        except _Stop:
            pass

    def keep(name, stop=False):
        def fn(t):
            kept[name] = t
            if stop:
                raise _Stop
            return t
        return fn

    heads_at = lambda i: tn.attn(stack, i, tn.SELF, "heads")  # noqa: E731
    ffn_at = lambda i: tn.at(stack, i, tn.local(tn.FFN, "out"))  # noqa: E731
    entry = tn.at(stack, rl, tn.IN)
    between = range(sl, rl)
    # the corrupted run: the sender's output, and nothing after its layer
    run(b, {heads_at(sl): keep("corrupt", stop=True)})
    # the clean run to the receiver's layer: every head and MLP between them, and the stream entering it
    fns = {heads_at(i): keep(("heads", i)) for i in between}
    fns.update({ffn_at(i): keep(("ffn", i)) for i in between})
    fns[entry] = keep("clean_in", stop=True)
    run(a, fns)

    def frozen(value, sender_head=None):
        def fn(t):
            if sender_head is None:
                return value
            t = value.clone()
            t[:, sender_head] = kept["corrupt"][:, sender_head]
            return t
        return fn

    fns = {heads_at(i): frozen(kept[("heads", i)], sh if i == sl else None) for i in between}
    fns.update({ffn_at(i): frozen(kept[("ffn", i)]) for i in between})
    fns[entry] = keep("patched_in", stop=True)
    run(a, fns)

    # the receiver's layer: clean, and with only the receiver's q / k / v from the patched stream
    point = {"query": "q", "key": "k", "value": "v"}[side]
    local = tn.local(tn.SELF, point)
    wanted = [tn.local(tn.SELF, "weights"), tn.local(tn.SELF, "heads")]
    rec_clean = Recorder(names=wanted)
    net.run_layer(stack, rl, kept["clean_in"], rec_clean)
    rec_p = Recorder(names=[local], maps=False)
    net.run_layer(stack, rl, kept["patched_in"], rec_p)
    attn = net.layers(stack)[rl].self_attn
    slot = rh if side == "query" else attn.kv_head(rh)
    new = rec_p.tensors[local][slot]

    def put(t):
        t = t.clone()
        t[:, slot] = new
        return t

    rec_patched = Recorder(names=wanted)
    net.run_layer(stack, rl, kept["clean_in"], Hooks({local: put}, inner=rec_patched))
    w_clean = rec_clean.tensors[wanted[0]][rh].to("cpu", F64)
    w_patched = rec_patched.tensors[wanted[0]][rh].to("cpu", F64)
    cells = list(targets) if targets is not None else score_targets(a, score)
    dk = attn.dk
    w_o = attn.w_o.weight.detach().to("cpu", F64)[:, rh * dk:(rh + 1) * dk]
    write_clean = rec_clean.tensors[wanted[1]][rh].to("cpu", F64) @ w_o.T
    write_patched = rec_patched.tensors[wanted[1]][rh].to("cpu", F64) @ w_o.T
    n = w_clean.shape[0]
    qi, kj = np.meshgrid(np.arange(n), np.arange(w_clean.shape[1]), indexing="ij")
    df = pd.DataFrame({"query": qi.ravel(), "key": kj.ravel(), "clean": w_clean.reshape(-1).numpy(),
                       "patched": w_patched.reshape(-1).numpy()})
    s_clean, s_patched = _mean_on(w_clean, cells), _mean_on(w_patched, cells)
    df.attrs.update(clean=s_clean, patched=s_patched, drop=s_clean - s_patched,
                    output_change=float((write_patched - write_clean).norm() / max(float(write_clean.norm()), 1e-12)),
                    sender=(sl, sh), receiver=(rl, rh), side=side, stack=stack,
                    score="targets" if targets is not None else score, n_targets=len(cells), n_tokens=len(a))
    return df
