"""The KV cache and attention sinks: which keys a cache keeps, and what forgetting costs.

    df = core.analysis.evict(model, text, "streaming", budget=128, sinks=4)
    df.attrs["perplexity_full"], df.attrs["perplexity"]
    df.attrs["kept"](layer, head)          # (rows x n) bool: the keys each query row saw
    df.attrs["mass_lost_heads"]            # (L, H): per head mean attention mass lost

A decoder reads `text` with a KV cache per layer and kv head. The query at position t attends
to at most `budget` keys, its own included (budget - 1 cached from positions < t); then t
enters the cache and the policy evicts down to budget - 1. Positions are the text's own:
cached keys keep the rotation of their own position (no re-rotation). Policies:

    full       keep everything (the reference: the plain forward pass)
    window     positions t - budget + 1 .. t
    streaming  StreamingLLM (Xiao et al. 2023): 0 .. sinks - 1 and t - (budget - sinks) + 1 .. t
    h2o        H2O (Zhang et al. 2023): the `recent` most recent (default budget // 2) and the
               heavy hitters, the keys with the most attention received so far under this
               cache (summed over the queries so far, mean over the kv group's query heads)
    tova       TOVA (Oren et al. 2024): once full, evict the key the current query weighs
               least (mean over the kv group's query heads)
    snapkv     SnapKV (Li et al. 2024): the prompt `text` is read with the full cache; then per
               kv head the cache is cut to budget - 1 keys: the keys of the prompt's last
               obs = min(observe, prompt, budget - 1) queries, and the budget - 1 - obs earlier
               prompt positions those queries weigh most (summed over them, mean over the
               group; no pooling). `continuation` is read with that cache: each of its tokens
               enters it and, past budget - 1 keys, the chosen prompt key of lowest score
               leaves (then, none left, the oldest key), so each continuation query too reads
               at most `budget` keys. Rows are the continuation's positions; attrs "observe" is
               the obs it used (snapkv_sizes).

The model's own mask. Each layer's look-ahead mask and sliding window (Mistral, Gemma 2/3's
local layers, Phi-3, Qwen2 with a window) are part of every set of weights read here: the full
model's weights behind mass_lost and the sink scores, and the weights H2O, TOVA and SnapKV choose
by, take the layer's mask from the network's one set of rules (Transformer.attn_spec ->
core/net/attention.py's forbidden; _own_mask), never a global one. A key past a layer's window
weighs 0 there, so `window` at the model's own window loses nothing, and `kept` reports what each
query saw: the keys its cache held, cut to the layer's window (seen_last).

How it runs. A key once evicted never returns, so what every query saw is one number per
(layer, kv head, key): the last query position that saw it (`KeptKeys`, L x H_kv x n
integers). The eviction is an additive mask (-inf on evicted keys) handed to the network's
own forward pass (core/net/model.py `decode(extra_mask=...)`), so attention is computed by the
one formula (core/net/attention.py):
- window / streaming: the full model's pass first; then the policy's from the first eviction
  (row `budget`) on, from the full model's cache of the rows before, in blocks of queries over
  the KV cache of the blocks before, which drops the keys no later query reads (the same mask
  for every head; a block's is BLOCK x (budget + BLOCK) at most, never n x n);
- h2o / tova: token by token over the decoder's KV cache, a per-head mask (1, H, 1, t + 1)
  at step t; the current query's weights (the policies' scores) are read from the q and k
  the step recorded, through MultiHeadAttention.weights;
- snapkv: the prompt in one pass (its last `observe` queries' weights likewise), the
  continuation in one pass with a per-head mask.
The reference is one plain pass of the full model; it also gives, layer by layer, the full
model's attention weights in blocks of query rows, from which `mass_lost` is summed over the
keys the policy's cache did not hold (a static cache: 1 - the mass on the keys it holds, its
sinks and window) from the first eviction on. The next-token comparison (logprobs, KL) runs
on float32 logits with float64 sums, LOGIT_ROWS positions at a time; positions before the
first eviction are the full model's under every policy and are not projected twice.

With trace= (a Trace of the same token ids by the same model, as the KV cache page holds) the
full model's pass is not run again: its final hidden states are the trace's decoder output,
each layer's q and k (for mass lost and the sink scores) are projected from the trace's stored
layer input (MultiHeadAttention.qkv; taken as they are where the trace kept them), and so are
the keys and values of the first rows a static policy's pass starts from. The layers' attention
outputs and FFNs are what is saved; the columns are the same (tests/parity/test_evict.py).

Rows, one per position read under eviction (all positions; snapkv: the continuation's):
position, token, logprob_full and logprob (of the actual next token; NaN at the last
position), kl = KL(full || policy) of the next-token distribution (nats), mass_lost (mean
over layers and heads). df.attrs: policy, budget, sinks, recent, observe, n, perplexity_full,
perplexity (over the rows with a next token), kept (KeptKeys), mass_lost_heads (L x H mean
over rows), sink_scores (L x H: the full model's mean attention on the first `sinks` keys).
"""

from __future__ import annotations

import math
import re
import time
from typing import Callable, List, Optional

import numpy as np
import pandas as pd
import torch

from .. import trace_names as tn
from . import _checks as checks
from ..net.mixer import refuse_mixer
from ..net.attention import NEG_INF, additive, combine_masks

POLICIES = ("full", "window", "streaming", "h2o", "tova", "snapkv")
STATIC = ("full", "window", "streaming")
SEQUENTIAL = ("h2o", "tova")
BLOCK = 512  # queries per block of a static policy's pass (its mask is BLOCK x n)
MASS_ROWS = 256  # query rows per block when the full model's weights are summed for mass_lost
LOGIT_ROWS = 128  # next-token distributions compared this many positions at a time

Progress = Optional[Callable[[float, str], None]]


class KeptKeys:
    """Which keys each query saw, per (layer, head), from one integer per (layer, kv head, key):
    last[l, g, j], the last query position that saw key j (key j is seen by queries
    j .. last[l, g, j]; n - 1 if it was never evicted). `group` query heads share a kv head.
    `first`: the first query row of the analysis (snapkv: the continuation's first)."""

    def __init__(self, last: np.ndarray, group: int, first: int = 0):
        self.last = np.asarray(last, dtype=np.int32)
        self.group = int(group)
        self.first = int(first)

    @property
    def n(self) -> int:
        return self.last.shape[-1]

    @property
    def shape(self):
        """(layers, query heads, n)"""
        return (self.last.shape[0], self.last.shape[1] * self.group, self.n)

    def lifetime(self, layer: int, head: int) -> np.ndarray:
        """last[j] for query head `head` of `layer` (its kv head's)."""
        return self.last[layer, head // self.group]

    def __call__(self, layer: int, head: int, rows=None) -> np.ndarray:
        """(len(rows), n) bool for one head: [r, j] True where query rows[r] attended to key j.
        rows: query positions (default: every row of the analysis, first .. n - 1)."""
        rows = np.arange(self.first, self.n) if rows is None else np.asarray(rows)
        last = self.lifetime(layer, head)
        j = np.arange(self.n)
        return (j[None, :] <= rows[:, None]) & (rows[:, None] <= last[None, :])

    def runs(self, layer: int, head: int, row: int) -> List[tuple]:
        """The keys query `row` saw as [start, stop) runs of positions."""
        seen = self(layer, head, [row])[0]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], seen.astype(np.int8), [0]])))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]

    def count(self, layer: int, head: int) -> np.ndarray:
        """How many keys each row saw (its own included)."""
        return self(layer, head).sum(1)

    def __eq__(self, other):
        return isinstance(other, KeptKeys) and self.group == other.group and self.first == other.first \
            and np.array_equal(self.last, other.last)

    def __repr__(self):
        return f"KeptKeys(layers={self.last.shape[0]}, kv_heads={self.last.shape[1]}, group={self.group}, n={self.n})"


def check_args(model, policy: str, budget: int, sinks: int = 4, recent: Optional[int] = None,
               observe: int = 32) -> None:
    """ValueError with a message for input evict cannot read (each number a whole one: True is
    not a budget of 1, nor 7.5 one of 7)."""
    if getattr(model, "kind", None) != "decoder":
        raise ValueError(f"{getattr(model, 'name', 'this model')} is not a decoder-only model: a KV cache is what "
                         "a decoder keeps while it reads; pick a decoder such as smollm2")
    for i, layer in enumerate(model.net.layers("decoder")):
        refuse_mixer(layer, "kv_cache", f"decoder layer {i}")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    budget = checks.whole(budget, "the budget (keys per query)", lo=1)
    sinks = checks.whole(sinks, "sinks", lo=0)
    if policy == "streaming" and budget <= sinks:
        raise ValueError(f"the budget ({budget}) must be above the sinks ({sinks}): the window needs a key at least")
    if recent is not None:
        checks.whole(recent, "recent", lo=0)
    checks.whole(observe, "observe", lo=1)


def token_ids(model, text: str, continuation: Optional[str] = None):
    """(ids, tokens, n_prompt): the text's ids and, after them, the continuation's ordinary
    tokens, cut at the model's length."""
    enc = model.encode(text)
    ids = list(enc.ids)
    n_p = len(ids)
    if continuation:
        cenc = model.tokenizer.encode(continuation)
        ids += [i for i, s in zip(cenc.ids, cenc.special) if not s]
    ids = ids[: model.config.max_len]
    return ids, model.target_strings(ids), min(n_p, len(ids))


def static_last(policy: str, n: int, budget: int, sinks: int) -> np.ndarray:
    """last[j] of a static policy (the same for every layer and head)."""
    j = np.arange(n)
    if policy == "full":
        last = np.full(n, n - 1)
    elif policy == "window":
        last = j + budget - 1
    else:  # streaming
        last = np.where(j < sinks, n - 1, j + budget - sinks - 1)
    return np.minimum(last, n - 1).astype(np.int32)


def _rows_mask(last: torch.Tensor, r0: int, r1: int, group: int, dtype) -> torch.Tensor:
    """Additive mask (1, H or 1, r1 - r0, r1) for query rows r0..r1-1 over keys 0..r1-1: -inf where
    the row comes after the key's last query. last: (H_kv or 1, n)."""
    rows = torch.arange(r0, r1)[None, :, None]
    gone = rows > last[:, None, :r1].long()  # (G, c, r1)
    m = torch.zeros(gone.shape, dtype=dtype).masked_fill_(gone, NEG_INF)
    if group > 1 and m.shape[0] > 1:
        m = m.repeat_interleave(group, dim=0)
    return m[None]


def _own_mask(net, i: int, rows, n_k: int, device=None) -> torch.Tensor:
    """Layer i's own additive mask (1, 1, len(rows), n_k) for query positions `rows` over keys
    0..n_k-1: the look-ahead mask and the layer's sliding window, from the rules every mask of the
    network is built by (Transformer.attn_spec -> core/net/attention.py's forbidden)."""
    rows = torch.as_tensor(rows, device=device)
    return additive(net.attn_spec("decoder", i).forbidden(rows, torch.arange(n_k, device=device)))[None, None]


def seen_last(net, last: np.ndarray) -> np.ndarray:
    """last (L, H_kv, n) of what the cache holds, cut to what each layer's own mask lets a query
    see (a sliding layer of window w reads key j up to query j + w - 1): how far a key is seen is
    read from the layer's masking rule itself (attn_spec's forbidden, key 0 against every query)."""
    out = np.array(last, dtype=np.int32, copy=True)
    n = out.shape[-1]
    j = np.arange(n)
    for i in range(out.shape[0]):
        spec = net.attn_spec("decoder", i)
        if spec.window is None:
            continue
        off = spec.forbidden(torch.arange(n), torch.zeros(1, dtype=torch.long))
        reach = int((~off[:, 0]).nonzero().max())  # the last query that sees key 0 (the rule is shift-invariant)
        out[i] = np.minimum(out[i], j + reach)
    return out


class _QK:
    """A recorder for the fused path that keeps each self-attention's q and k (B, heads, n, d_k)
    and hands them to `on_k(layer, q, k)` once both are in. keep_kv > 0: also a copy of each
    layer's keys and values of the first keep_kv positions (`kv`: {layer: a decoder layer's cache})."""

    maps = False

    def __init__(self, on_k=None, keep_kv: int = 0):
        self.q, self.k = {}, {}
        self.on_k = on_k
        self.keep_kv = keep_kv
        self.kv: dict = {}

    _name = re.compile(r"^decoder\.(\d+)\.self_attn\.([qkv])$")

    def __call__(self, name, t, batched=True):
        m = self._name.match(name)
        if not m:
            return
        i, what = int(m.group(1)), m.group(2)
        if what == "q":
            self.q[i] = t
        elif what == "v":
            if self.keep_kv:
                self.kv[i]["self_attn"]["v"] = t[:, :, : self.keep_kv].clone()
        else:
            if self.keep_kv:  # as core/net/layers.py keeps a layer's cache
                self.kv[i] = {"self_attn": {"static": False, "k": t[:, :, : self.keep_kv].clone()}}
            if self.on_k is not None:
                self.on_k(i, self.q.pop(i), t)
            else:
                self.k[i] = t


def _ids_tensor(model, ids):
    return torch.tensor([list(ids)], dtype=torch.long, device=model.device)


def _static_pass(model, ids, last: np.ndarray, progress: Progress, frac=(0.0, 0.5), start: int = 0,
                 cache: Optional[dict] = None) -> torch.Tensor:
    """Final hidden states (n - start, d) of positions start..n-1, read in blocks of BLOCK queries
    over the KV cache of the blocks before, each block's mask from last (same for every layer and
    head). start > 0: `cache` holds the keys and values of positions 0..start-1 (a decoder
    cache as decode(cache=) keeps it), taken from the full model's pass where no key has been
    evicted yet, so those positions are not read twice.

    Before each block the cache drops the keys no query of the block (or after it) reads, as a
    decoder with that policy does (decode's cache["dropped"]): a block attends to its budget
    and itself, not to every key before it. Not for a model whose positions are not the cache's
    own business (sliding windows, chunks, a relative position bias): there the evicted keys stay in
    the cache, masked."""
    net, n = model.net, len(ids)
    x = _ids_tensor(model, ids)
    L = model.config.n_layers
    trim = model.config.positional != "relative" and all(
        net.window("decoder", i) is None and net.chunk("decoder", i) is None for i in range(L))
    last_t = torch.as_tensor(last).long()
    cache = {} if cache is None else cache
    pos = torch.arange(start)  # the positions of the keys the cache holds
    out = []
    for r0 in range(start, n, BLOCK):
        r1 = min(n, r0 + BLOCK)
        if trim:
            keep = last_t[pos] >= r0  # keys that a query r0.. still reads
            if not bool(keep.all()):
                idx = keep.nonzero()[:, 0].to(model.device)
                for i in range(L):
                    c = cache[i]["self_attn"]
                    c["k"], c["v"] = c["k"][:, :, idx], c["v"][:, :, idx]
                    c["dropped"] = r0 - len(idx)
                cache["dropped"] = r0 - len(idx)
                pos = pos[keep]
        keys = torch.cat([pos, torch.arange(r0, r1)])
        gone = torch.arange(r0, r1)[:, None] > last_t[keys][None, :]  # (c, keys)
        mask = torch.zeros(gone.shape).masked_fill_(gone, NEG_INF)[None, None].to(model.device)
        out.append(net.decode(x[:, r0:r1], cache=cache, extra_mask=mask)[0])
        pos = keys
        _tick(progress, frac, (r1 - start) / (n - start), f"policy pass: {r1} of {n} positions")
    return torch.cat(out)


def _sequential_pass(model, ids, policy: str, budget: int, recent: Optional[int], last: np.ndarray,
                     progress: Progress, frac=(0.0, 0.8)) -> torch.Tensor:
    """h2o / tova token by token over the decoder's KV cache; fills last (L, H_kv, n) in place.
    Returns the final hidden states (n, d)."""
    net, cfg, n = model.net, model.config, len(ids)
    L, H = cfg.n_layers, cfg.n_heads
    hkv = cfg.n_kv_heads or H
    g = H // hkv
    cap = budget - 1
    r = min(budget // 2 if recent is None else recent, cap)
    x = _ids_tensor(model, ids)
    dev = model.device
    held = torch.zeros(L, hkv, n, dtype=torch.bool)
    gone = torch.zeros(L, hkv, n)  # additive: -inf on evicted keys
    score = torch.zeros(L, hkv, n, dtype=torch.float64)
    last_t = torch.full((L, hkv, n), n - 1, dtype=torch.int32)
    heads = torch.arange(hkv)
    pos = torch.arange(n)
    rec = _QK()
    cache: dict = {}
    hid = []
    n_held = 0
    attn = [layer.self_attn for layer in net.decoder]
    windowed = [net.attn_spec("decoder", i).window for i in range(L)]
    t_last = time.perf_counter()
    for t in range(n):
        masks = gone[:, :, : t + 1].to(dev)
        if g > 1:
            masks = masks.repeat_interleave(g, dim=1)
        masks = masks[:, None, :, None, :]  # (L, 1, H, 1, t + 1)
        hid.append(net.decode(x[:, t:t + 1], cache=cache, rec=rec, extra_mask=lambda i: masks[i])[0])
        # the current query's weights in every layer, as the pass computed them (one formula):
        # the eviction mask and the layer's own (a sliding window's keys out of reach weigh 0)
        w = torch.stack([attn[i].weights(None, None, masks[i] if windowed[i] is None else
                                         combine_masks(masks[i], _own_mask(net, i, [t], t + 1, dev)),
                                         qk=(rec.q[i], rec.k[i]))[0, :, 0]
                         for i in range(L)])  # (L, H, t + 1)
        w = w.view(L, hkv, g, t + 1).mean(2).double().cpu()
        held[:, :, t] = True
        n_held += 1
        if policy == "h2o":
            score[:, :, : t + 1] += w
        if n_held > cap:
            h = held[:, :, : t + 1]
            if policy == "h2o":
                cand = h & (pos[: t + 1] <= t - r)
                s = score[:, :, : t + 1].masked_fill(~cand, math.inf)
            else:  # tova: the current query's lowest weight among the held keys (itself included)
                s = w.masked_fill(~h, math.inf)
            j = s.argmin(-1)  # (L, H_kv): the first of equal lows
            for li in range(L):
                held[li, heads, j[li]] = False
                gone[li, heads, j[li]] = NEG_INF
                last_t[li, heads, j[li]] = t
            n_held -= 1
        now = time.perf_counter()
        if progress is not None and (now - t_last > 0.25 or t == n - 1):
            t_last = now
            _tick(progress, frac, (t + 1) / n, f"{policy}: token {t + 1} of {n}")
    last[...] = last_t.numpy()
    return torch.cat(hid)


def snapkv_sizes(n_p: int, budget: int, observe: int) -> tuple:
    """(obs, chosen) of SnapKV over an n_p-token prompt with `budget` keys per query: obs, the
    prompt's last queries whose attention scores the prompt's keys (observe, at most the prompt
    and the cache's budget - 1 keys); chosen, how many earlier prompt keys the cache keeps beside
    the observed queries' own (budget - 1 - obs, or all of them where they fit)."""
    cap = budget - 1
    obs = min(observe, n_p, cap)
    return obs, min(n_p - obs, cap - obs)


def _snapkv_pass(model, ids, n_p: int, budget: int, observe: int, last: np.ndarray, progress: Progress,
                 frac=(0.0, 0.5)) -> torch.Tensor:
    """The prompt with the full cache, per kv head selection, the continuation over that cache.
    Fills last (L, H_kv, n) in place; returns the final hidden states (n, d).

    The cache holds budget - 1 keys once the prompt is read: the chosen prompt keys and the
    observed queries' own. Each continuation token then enters it and, past budget - 1, the
    chosen key of lowest score leaves (the compressed prompt gives way to what is read after
    it); once none is left, the oldest key. So a chosen key of rank r from the lowest is last
    read by query n_p + r, and any other key j by query j + budget - 1 (the most recent
    budget - 1 keys before each query). Where the whole prompt fits nothing is chosen and the
    cache is a window of budget - 1 keys."""
    net, cfg, n = model.net, model.config, len(ids)
    L, H = cfg.n_layers, cfg.n_heads
    hkv = cfg.n_kv_heads or H
    g = H // hkv
    cap = budget - 1
    obs, keep = snapkv_sizes(n_p, budget, observe)
    pool = n_p - obs  # the prompt keys before the observed queries: `keep` of them are chosen
    x = _ids_tensor(model, ids)
    ranked = {}  # layer -> (H_kv, keep) the chosen keys, highest score first

    def select(i, q, k):  # the last `obs` queries' weights over the prompt, summed; mean over the group
        if keep >= pool or keep == 0:  # everything fits, or nothing can be chosen (obs fills the cache)
            return
        own = _own_mask(net, i, torch.arange(pool, n_p), n_p, q.device)  # the layer's own mask (its window)
        w = net.decoder[i].self_attn.weights(None, None, own, qk=(q[:, :, pool:], k))[0]
        s = w.view(hkv, g, obs, n_p).mean(1).sum(1)[:, :pool].double().cpu()  # (H_kv, pool)
        ranked[i] = s.topk(keep, dim=-1).indices

    cache: dict = {}
    hp = net.decode(x[:, :n_p], cache=cache, rec=_QK(select))[0]
    last[...] = np.minimum(np.arange(n) + cap, n - 1)  # every key not chosen: the budget - 1 most recent
    if keep < pool:
        last[:, :, :pool] = n_p - 1  # the prompt's keys not chosen: read by the prompt's queries only
        for i, top in ranked.items():
            gone = np.minimum(n_p + keep - 1 - np.arange(keep), n - 1)  # highest score: the last to leave
            last[i, np.arange(hkv)[:, None], top.numpy()] = gone[None, :]
    _tick(progress, frac, 0.5, "snapkv: prompt read")
    if n == n_p:
        return hp
    lt = torch.as_tensor(last)
    masks = [_rows_mask(lt[i], n_p, n, g, torch.float32).to(model.device) for i in range(L)]
    hc = net.decode(x[:, n_p:], cache=cache, extra_mask=lambda i: masks[i])[0]
    _tick(progress, frac, 1.0, "snapkv: continuation read")
    return torch.cat([hp, hc])


def _tick(progress: Progress, frac, done: float, what: str):
    if progress is not None:
        progress(frac[0] + (frac[1] - frac[0]) * done, what)


def trace_mismatch(model, trace, ids) -> Optional[str]:
    """Why `trace` cannot stand for the full model's pass over `ids` (a sentence), or None when
    it can: it must be this model's, unablated, of exactly these token ids, with its layers'
    inputs and the decoder's output there to read (stored, or recomputable on the model)."""
    meta = getattr(trace, "meta", None)
    if meta is None or not hasattr(trace, "layer_input"):
        return f"trace= takes a core.trace.Trace (got {type(trace).__name__})"
    if meta.get("model") != model.name:
        return f"the trace is of {meta.get('model')!r}, not of {model.name!r}"
    if meta.get("ablate"):
        return "the trace has heads switched off: it is not the full model's pass"
    if model.config.positional == "relative":
        return f"{model.name} adds a relative position bias: its attention is not read from a trace here"
    got = meta.get("target_ids")
    if got is None or [int(i) for i in got] != [int(i) for i in ids]:
        n = "no" if got is None else f"{len(got):,}"
        return (f"the trace is of other token ids ({n} decoder ids, evict reads {len(ids):,}): trace the same "
                "text (and continuation) with the same model")
    names = [tn.stack_output(trace, "decoder")] + [tn.stored_input("decoder", i) for i in range(model.config.n_layers)]
    if trace.runner is None and not all(trace.is_stored(x) for x in names):
        return "the trace lacks the decoder's layer inputs and output, and has no model to recompute them"
    return None


def _trace_qkv(model, trace, i: int, keep_kv: int):
    """Layer i's self-attention q (1, H, n, d_k), k (1, Hkv, n, d_k) after RoPE, and v of the
    first keep_kv positions, from the trace: the q, k, v its pass kept (short inputs), else
    projected from its stored layer input as the pass did (MultiHeadAttention.qkv)."""
    net, dev = model.net, model.device
    kept = getattr(trace.runner, "qk", None) or {}
    got = [kept.get(tn.self_attn("decoder", i, s)) for s in ("q", "k", "v")]
    if all(t is not None for t in got):
        q, k, v = (t.to(dev)[None] for t in got)
        return q, k, v[:, :, :keep_kv]
    layer = net.decoder[i]
    y = layer.attn_input(trace.layer_input("decoder", i).to(dev)[None])  # (1, n, d)
    return layer.self_attn.qkv(y, net._angles(y.shape[1], device=dev, layer=i), v_rows=keep_kv)


def _reference(model, ids, last: np.ndarray, first: int, sinks: int, need_mass: bool, progress: Progress,
               frac=(0.8, 0.95), band: Optional[tuple] = None, keep_kv: int = 0, trace=None):
    """The full model's plain pass: final hidden states (n, d), mass lost (L, H, n - first) on
    the keys `last` says the policy's cache did not hold, each head's sink score (L, H), and
    (keep_kv > 0) the decoder cache of its first keep_kv positions (what decode(cache=) keeps).

    Rows before the first eviction lose nothing and are not summed. band = (s, w), a static
    policy's cache (keys 0..s-1 and the w most recent): the mass lost is 1 - the mass on those
    keys, summed over s + w keys a row instead of over every key before it.

    trace: a Trace of the same ids (trace_mismatch says None): the pass is not run again; its
    final hidden states are the trace's decoder output, each layer's q and k are projected
    from the trace's stored layer input (or taken where the trace kept them), and the cache's
    keys and values likewise."""
    net, cfg, n = model.net, model.config, len(ids)
    L, H = cfg.n_layers, cfg.n_heads
    hkv = cfg.n_kv_heads or H
    g = H // hkv
    mass = np.zeros((L, H, n - first))
    sink = np.zeros((L, H))
    lt = torch.as_tensor(last)
    n_s = min(max(sinks, 1), n)
    evicts = max(first, int(last.min()) + 1)  # rows before it: every key still held, nothing lost

    def on_k(i, q, k):
        attn = net.decoder[i].self_attn
        sums = torch.zeros(H, dtype=torch.float64)
        for r0 in range(first, n, MASS_ROWS):
            r1 = min(n, r0 + MASS_ROWS)
            own = _own_mask(net, i, torch.arange(r0, r1), r1, q.device)  # the layer's look-ahead mask and window
            w = attn.weights(None, None, own, qk=(q[:, :, r0:r1], k[:, :, :r1]))[0]  # (H, c, r1)
            sums += w[:, :, :n_s].sum((1, 2)).double().cpu()
            if not need_mass or r1 <= evicts:
                continue
            a = max(r0, evicts)
            w = w[:, a - r0:]
            if band is not None:  # rows a.. hold keys 0..s-1 and t-bw+1..t (disjoint: a >= s + bw)
                s, bw = band
                cols = torch.arange(a, r1, device=w.device)[:, None] - bw + 1 + torch.arange(bw, device=w.device)
                held = w.gather(-1, cols.expand(H, -1, -1)).double().sum(-1) + w[:, :, :s].double().sum(-1)
                # the row's mass on keys (1 - a learned sink's share, gpt-oss) less what the cache holds
                lost = (w.double().sum(-1) - held).clamp_min_(0.0)
            else:
                gone = torch.arange(a, r1)[None, :, None] > lt[i][:, None, :r1].long()  # (H_kv, c, r1)
                lost = (w.view(hkv, g, r1 - a, r1) * gone.to(w.device)[:, None]).sum(-1).view(H, r1 - a).double()
            mass[i, :, a - first:r1 - first] = lost.cpu().numpy()
        sink[i] = (sums / (n - first)).numpy()
        _tick(progress, frac, (i + 1) / L, f"full model: layer {i + 1} of {L}")

    if trace is not None:
        kv: Optional[dict] = {}
        for i in range(L):
            q, k, v = _trace_qkv(model, trace, i, keep_kv)
            if keep_kv:  # as core/net/layers.py keeps a layer's cache
                kv[i] = {"self_attn": {"static": False, "k": k[:, :, :keep_kv].clone(), "v": v}}
            on_k(i, q, k)
            del q, k, v
        hid = trace[tn.stack_output(trace, "decoder")].to(model.device)
        return hid, mass, sink, (dict(kv, n=keep_kv) if keep_kv else None)
    rec = _QK(on_k, keep_kv)
    hid = net.decode(_ids_tensor(model, ids), rec=rec)[0]
    kv = dict(rec.kv, n=keep_kv) if keep_kv else None
    return hid, mass, sink, kv


def _lse(x: torch.Tensor):
    """(exp(x - lse), lse) per row of float32 logits x: the exponentials in float32, their sum
    and its log in float64 (a float32 log-softmax is off by ~1e-5 over a 49,152-token
    vocabulary; this, by ~1e-7, at a fraction of a float64 log-softmax's cost)."""
    m = x.max(-1, keepdim=True).values
    e = (x - m).exp_()
    return e, m[:, 0].double() + e.sum(-1, dtype=torch.float64).log()


def _compare(model, ref: torch.Tensor, pol: torch.Tensor, ids, first: int, same: int = 0):
    """logprob of the next token under both, and KL(full || policy), per position first..n-1.
    Positions before `same` are read alike by both (no key evicted yet): the policy's are the
    full model's there, and their KL is 0. LOGIT_ROWS positions at a time, over float32
    logits: KL = sum_j p_j (x_j - y_j) - (lse(x) - lse(y)) for the full model's logits x and
    the policy's y, the sums in float64."""
    net, n = model.net, len(ids)
    nxt = torch.as_tensor(list(ids[1:]) + [0], dtype=torch.long, device=ref.device)
    lp_full = np.full(n - first, np.nan)
    lp = np.full(n - first, np.nan)
    kl = np.zeros(n - first)
    for r0 in range(first, n, LOGIT_ROWS):
        r1 = min(n, r0 + LOGIT_ROWS)
        idx = nxt[r0:r1, None]
        x = net.project(ref[r0:r1]).float()
        e, lse_x = _lse(x)
        lp_full[r0 - first:r1 - first] = (x.gather(1, idx)[:, 0].double() - lse_x).cpu().numpy()
        b0 = max(r0, same)  # rows b0..r1-1 differ
        if b0 < r1:
            k = b0 - r0
            y = net.project(pol[b0:r1]).float()
            _, lse_y = _lse(y)
            p = e[k:].div_(e[k:].sum(-1, keepdim=True))  # the full model's distribution
            d = (p * (x[k:] - y)).sum(-1, dtype=torch.float64) - (lse_x[k:] - lse_y)
            kl[b0 - first:r1 - first] = d.clamp_min(0).cpu().numpy()
            lp[b0 - first:r1 - first] = (y.gather(1, idx[k:])[:, 0].double() - lse_y).cpu().numpy()
        if r0 < same:
            lp[r0 - first:min(r1, same) - first] = lp_full[r0 - first:min(r1, same) - first]
    lp_full[-1] = lp[-1] = np.nan  # the last position has no next token
    return lp_full, lp, kl


def perplexity(logprobs) -> float:
    v = np.asarray(logprobs, dtype=float)
    v = v[~np.isnan(v)]
    return float(math.exp(-v.mean())) if len(v) else float("nan")


def evict(model, text: str, policy: str, budget: int, sinks: int = 4, recent: Optional[int] = None,
          observe: int = 32, continuation: Optional[str] = None, progress: Progress = None,
          trace=None) -> pd.DataFrame:
    """Read `text` (and `continuation`) under a KV-cache policy with `budget` keys per query;
    see the module's docstring. progress(fraction, what) as it goes.

    trace: a Trace of the same token ids by the same model (model.trace(text, target=continuation)):
    the full model's pass is then not run again (its final states, q, k and the cache of the
    first rows come from the trace; the results are the same). ValueError if it is of other
    ids or another model (trace_mismatch says why)."""
    check_args(model, policy, budget, sinks, recent, observe)
    if policy == "snapkv" and not (continuation and continuation.strip()):
        raise ValueError("snapkv compresses the prompt, then reads a continuation: give one (continuation=...)")
    ids, tokens, n_p = token_ids(model, text, continuation)
    n = len(ids)
    cfg = model.config
    L, H = cfg.n_layers, cfg.n_heads
    hkv = cfg.n_kv_heads or H
    first = n_p if policy == "snapkv" else 0
    if policy == "snapkv" and n_p >= n:
        raise ValueError("the continuation has no tokens left within the model's length")
    if trace is not None:
        why = trace_mismatch(model, trace, ids)
        if why is not None:
            raise ValueError(f"this trace cannot stand for the full model's pass: {why}")
    last = np.broadcast_to(static_last(policy if policy in STATIC else "full", n, budget, sinks), (L, hkv, n)).copy()
    t0 = time.perf_counter()
    same = first
    with torch.inference_mode():
        if policy in ("window", "streaming"):
            # the full model first: the policy's pass starts from its cache at the first eviction
            same = min(n, int(last.min()) + 1)
            s = sinks if policy == "streaming" else 0
            ref, mass, sink, kv = _reference(model, ids, last, first, sinks, True, progress, (0.0, 0.5),
                                             band=(s, budget - s), keep_kv=same if same < n else 0, trace=trace)
            hid = ref if same >= n else torch.cat([ref[:same], _static_pass(model, ids, last[0, 0], progress,
                                                                            (0.5, 0.9), same, kv)])
        else:
            if policy in SEQUENTIAL:
                hid = _sequential_pass(model, ids, policy, budget, recent, last, progress)
                frac = (0.8, 0.95)
            elif policy == "snapkv":
                hid = _snapkv_pass(model, ids, n_p, budget, observe, last, progress)
                frac = (0.5, 0.9)
            else:
                hid, frac = None, (0.0, 0.9)
            ref, mass, sink, _ = _reference(model, ids, last, first, sinks, policy != "full", progress, frac,
                                          trace=trace)
            if hid is None:
                hid, same = ref, n
        lp_full, lp, kl = _compare(model, ref, hid, ids, first, same)
    _tick(progress, (0.0, 1.0), 1.0, "done")
    df = pd.DataFrame({
        "position": np.arange(first, n),
        "token": tokens[first:],
        "logprob_full": lp_full,
        "logprob": lp,
        "kl": kl,
        "mass_lost": mass.mean((0, 1)) if n > first else np.zeros(0),
    })
    if policy == "snapkv":  # the number of queries it observed, not the one asked for
        observe = snapkv_sizes(n_p, budget, observe)[0]
    df.attrs.update(
        policy=policy, budget=int(budget), sinks=int(sinks), observe=int(observe),
        recent=(min(budget // 2 if recent is None else recent, budget - 1) if policy == "h2o" else recent),
        n=n, n_prompt=n_p, model=model.name,
        perplexity_full=perplexity(lp_full), perplexity=perplexity(lp),
        kept=KeptKeys(seen_last(model.net, last), H // hkv, first), mass_lost_heads=mass.mean(-1), sink_scores=sink,
        seconds=time.perf_counter() - t0,
    )
    return df


# ------------------------------------------------------------------ how long it will take
_COST: dict = {}  # model name -> (seconds per token of a 128-token pass, seconds per decoding step)
SEQUENTIAL_OVERHEAD = 1.6  # an h2o / tova step against the model's own decoding step (bench/evict.py)


def unit_costs(model) -> tuple:
    """(seconds per token of one 128-token pass, seconds per step of token-by-token decoding with
    a full cache at ~128 cached tokens), measured once per model and process."""
    got = _COST.get(model.name)
    if got is not None:
        return got
    net = model.net
    ids = torch.randint(0, model.config.tgt_vocab_size, (1, 129), device=model.device)
    with torch.inference_mode():
        net.decode(ids[:, :16])  # warm-up: first calls pack weights and allocate
        t0 = time.perf_counter()
        net.decode(ids[:, :128])
        per_token = (time.perf_counter() - t0) / 128
        cache: dict = {}
        net.decode(ids[:, :120], cache=cache)
        steps = []
        for t in range(120, 128):
            t0 = time.perf_counter()
            net.project(net.decode(ids[:, t:t + 1], cache=cache))
            steps.append(time.perf_counter() - t0)
        step = sorted(steps)[len(steps) // 2]
    _COST[model.name] = (per_token, step)
    return per_token, step


def estimate_seconds(model, n: int, policy: str) -> float:
    """A rough time for evict over n tokens (linear in n: the attention's n^2 share is left out,
    so long texts may take longer): a static policy reads the text twice (its pass and the
    full model's), a sequential one decodes it token by token."""
    per_token, step = unit_costs(model)
    passes = 1.0 if policy == "full" else 2.5
    if policy in SEQUENTIAL:
        return n * step * SEQUENTIAL_OVERHEAD + 1.5 * n * per_token
    return passes * n * per_token
