"""Trace: every intermediate tensor of one forward pass, under the names of docs/design.md.

An ordered mapping from stable names to detached CPU tensors, plus the token strings and
metadata (model, config, device, timings). Saves to and loads from `.npz`.

Stored and recomputed names
---------------------------
Keeping every attention map costs L x H x n^2 floats: 2.2 GB for SmolLM2 at 1,036 tokens.
So a traced pass (AttentionModel.trace) runs the model's fast path, fused attention with no
n x n matrix kept, and STORES only what is O(n d):

    embed.{stack}.*                 token embeddings, positions, their sum (input to layer 0)
    {stack}.{i}.out                 the residual stream at every layer boundary
    {stack}.{i}.{attn}.heads        each attention's per-head output (n x d in all)
    {stack}.{i}.mixer.heads         a token mixer's per-head output (core/net/mixer.py)
    {stack}.final_norm              final norms (the encoder output for cross-attention)
    topk.ids, topk.probs            decoders: the top-k next tokens at every position (n x k)
    last.probs                      decoders: the whole next-token distribution at the end
    next.ids, next.probs            decoders: the top-k at the last position

Every other name (q, k, v, scores, scaled, mask, masked, weights, value_norms, the attention's out,
residual*, norm*, ffn.*, logits, probs) is COMPUTED WHEN IT IS READ: `trace[name]` runs that
one layer again on its stored input ({stack}.{i-1}.out, or embed.{stack}.sum for layer 0)
with recording on, through the same layer code (core.net.model.Transformer.run_layer) and the
explicit attention path, and keeps the result in a small cache of the last LAYER_CACHE
layers, so moving between the heads of one layer does no model work. This is activation
checkpointing, in one place: `Trace._layer`. `is_stored(name)` / `stored_names()` say which
names are kept; `nbytes()` counts what is stored.

Because the stored output came from the fused kernel and the re-run takes the explicit
formula, the two check each other: `recomputed(f"{stack}.{i}.out")` is the re-run's output
of layer i, to compare with the stored `{stack}.{i}.out`; the stored `heads` (fused) is to
compare with A V from the re-run's weights and values (viz.inside.step_checks shows both).

A trace loaded from an .npz file has every name stored and recomputes nothing. A decoder
step (`AttentionModel.steps`) is `prefix(t)`: a view of the first t decoder positions of one
traced pass (causal attention makes those rows independent of the later tokens).
"""

from __future__ import annotations

import json
import threading
import zipfile
from collections import OrderedDict
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch


from .trace_names import MAPS, PER_HEAD, STEP_NAMES, TOKEN_LISTS, decoder_rows, layer_of  # noqa: F401 (public here too)
from . import trace_names as tn

LAYER_CACHE = 2  # recomputed layers kept (each holds its maps: 4 x H x n^2 floats)


class Trace:
    def __init__(self, tensors: Dict[str, torch.Tensor], tokens: Dict[str, List[str]], meta: Optional[dict] = None,
                 runner=None, names: Optional[List[str]] = None):
        """tensors: the stored names. runner: what recomputes the others
        (core.layer_runner.LayerRunner: .layer(trace, stack, i) and .logits(trace)); None for a trace whose
        every name is stored. names: every name in order (default: the stored ones)."""
        self._tensors: "OrderedDict[str, torch.Tensor]" = OrderedDict(
            (k, v if v.device.type == "cpu" and not v.requires_grad else v.detach().to("cpu"))
            for k, v in tensors.items())
        self._order: List[str] = list(names) if names is not None else list(self._tensors)
        self._known = set(self._order)
        self._tokens = {k: list(v) for k, v in tokens.items()}
        self.meta = dict(meta or {})
        self._runner = runner
        self._cache: "OrderedDict[tuple, Dict[str, torch.Tensor]]" = OrderedDict()
        self._lock = threading.RLock()
        self._rows: Optional[int] = None  # a step view: the first _rows decoder positions
        self._base: Optional["Trace"] = None

    # mapping interface ------------------------------------------------------------
    def __getitem__(self, name: str):
        if name in TOKEN_LISTS and TOKEN_LISTS[name] in self._tokens:
            return self.tokens(TOKEN_LISTS[name])
        if name not in self._known:
            raise KeyError(f"no tensor named {name!r} in this trace")
        base = self._base or self
        if self._rows is not None and name in STEP_NAMES:
            return base._step_value(name, self._rows)
        t = base._tensors.get(name)
        if t is None:
            t = base._computed(name)
        return t if self._rows is None else decoder_rows(name, t, self._rows)

    def _step_value(self, name: str, t: int) -> torch.Tensor:
        """next.* and last.probs of a step view: the prediction at position t - 1."""
        if name == tn.NEXT_IDS:
            return self._tensors[tn.TOPK_IDS][t - 1]
        if name == tn.NEXT_PROBS:
            return self._tensors[tn.TOPK_PROBS][t - 1]
        return torch.softmax(self._runner.logits(self, rows=slice(t - 1, t))[0], dim=-1)  # last.probs

    def __contains__(self, name: str) -> bool:
        return name in self._known or (name in TOKEN_LISTS and TOKEN_LISTS[name] in self._tokens)

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def get(self, name: str, default=None):
        return self[name] if name in self._known else default

    def names(self, prefix: str = "") -> List[str]:
        return [n for n in self._order if n.startswith(prefix)]

    def tokens(self, which: str = "source") -> List[str]:
        return list(self._tokens.get(which, []))

    @property
    def token_sets(self) -> Dict[str, List[str]]:
        return {k: list(v) for k, v in self._tokens.items()}

    @property
    def runner(self):
        """What recomputes this trace's layers (core.layer_runner.LayerRunner: its .model,
        .src_pad and .ablate), or None for a trace that stores every name (loaded from .npz)."""
        return (self._base or self)._runner

    @property
    def model(self):
        """The model (core.api.AttentionModel) that made this trace and recomputes what it does
        not store: analyses read its weights here. None for a trace loaded from a file, or one
        whose model is not loaded in this process."""
        return getattr(self.runner, "model", None)

    # stored vs recomputed -------------------------------------------------------------
    def is_stored(self, name: str) -> bool:
        return name in (self._base or self)._tensors

    def stored_names(self) -> List[str]:
        stored = (self._base or self)._tensors
        return [n for n in self._order if n in stored]

    def _layer(self, stack: str, i: int) -> Dict[str, torch.Tensor]:
        """Every name of one layer, run again on its stored input with recording on (kept
        in a cache of the last LAYER_CACHE layers)."""
        key = (stack, i)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            if self._runner is None:
                raise KeyError(f"{stack}.{i} is not stored in this trace and it has no model to recompute it")
            out = self._runner.layer(self, stack, i)
            self._cache[key] = out
            while len(self._cache) > LAYER_CACHE:
                self._cache.popitem(last=False)
            return out

    def _computed(self, name: str) -> torch.Tensor:
        where = layer_of(name)
        if where is not None and name == tn.self_attn(*where, "weights"):
            return self._weights(*where)
        if where is not None:
            return self._layer(*where)[name]
        if name in tn.OUTPUTS:
            with self._lock:
                if ("head",) not in self._cache:
                    logits = self._runner.logits(self)
                    self._cache[("head",)] = {tn.LOGITS: logits, tn.PROBS: torch.softmax(logits, dim=-1)}
                    while len(self._cache) > LAYER_CACHE:
                        self._cache.popitem(last=False)
                return self._cache[("head",)][name]
        raise KeyError(f"{name!r} is neither stored nor recomputable in this trace")

    def _weights(self, stack: str, i: int) -> torch.Tensor:
        """A layer's self-attention weights: from its cached re-run, else computed alone (the
        layer up to its softmax: no values, heads, W_o or FFN) and kept in the same cache."""
        name = tn.self_attn(stack, i, "weights")
        with self._lock:
            for key in ((stack, i), (stack, i, "weights")):
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return self._cache[key][name]
            if self._runner is None:
                raise KeyError(f"{name} is not stored in this trace and it has no model to recompute it")
            w = self._runner.self_weights(self, stack, i)
            self._cache[(stack, i, "weights")] = {name: w}
            while len(self._cache) > LAYER_CACHE:
                self._cache.popitem(last=False)
            return w

    # one head, pooled maps (long inputs: core/head_maps.py) -------------------------------
    def head(self, name: str, h: int) -> torch.Tensor:
        """Head h of the attention map `name` ({stack}.{i}.{attn}.scores|scaled|masked|weights),
        n_q x n_k, computing that head alone (a tile of query rows at a time): the other heads'
        maps are never made. From the stored or cached layer when it is there."""
        from .head_maps import head_map

        return head_map(self, name, h)

    def pooled(self, name: str, size: int = 128, heads: Optional[Iterable[int]] = None) -> torch.Tensor:
        """len(heads) x ceil(n_q/size) x ceil(n_k/size): the mean of each size x size block of
        the map `name` (cells masked to -inf count 0 in weights and are left out of score
        means), computed one head and a tile of query rows at a time (docs/design.md, "Long
        inputs"; core/head_maps.py). heads: default every head."""
        from .head_maps import pooled

        return pooled(self, name, size, None if heads is None else list(heads))

    def recomputed(self, name: str) -> torch.Tensor:
        """A name inside a layer as the explicit re-run of that layer gives it, even where the
        trace stores the fast pass's value (`{stack}.{i}.out`, `...heads`): the two should
        agree to float rounding, and a check shown to the user compares them."""
        where = layer_of(name)
        if where is None:
            raise KeyError(f"{name!r} is not inside a layer")
        t = (self._base or self)._layer(*where)[name]
        return t if self._rows is None else decoder_rows(name, t, self._rows)

    def layer_input(self, stack: str, i: int) -> torch.Tensor:
        """The stored input of layer i: embed.{stack}.sum for layer 0, else {stack}.{i-1}.out."""
        return self[tn.stored_input(stack, i)]

    def each_layer(self, stack: str, names: Iterable[str] = (tn.local(tn.SELF, "weights"),),
                   layers: Optional[Iterable[int]] = None) -> Iterator[Dict[str, torch.Tensor]]:
        """Layer by layer, the asked-for names (suffixes under the layer) of every layer of a
        stack (or of `layers`), computed one layer at a time and not kept: for views of all
        layers (the model view, rollout) that must never hold L full sets of maps at once."""
        base = self._base or self
        names = list(names)
        for i in (range(self.layers(stack)) if layers is None else layers):
            missing = [s for s in names if tn.at(stack, i, s) not in base._known]
            if missing:
                mixer = f" (it mixes tokens with a mixer: its names are {tn.mixer(stack, i, '*')})" \
                    if tn.mixer(stack, i, "heads") in base._known else ""
                raise KeyError(f"{stack} layer {i} has no {', '.join(missing)}{mixer}")
            with base._lock:
                cached = base._cache.get((stack, i))
            if cached is None and base._runner is not None and not all(
                    tn.at(stack, i, s) in base._tensors for s in names):
                weights_only = [tn.local(tn.SELF, "weights")], [tn.local(tn.SELF, "value_norms")]
                if names in weights_only:  # the layer up to its softmax (and the value sizes)
                    what = tn.parse(tn.at(stack, i, names[0])).step
                    cached = {tn.self_attn(stack, i, what): base._runner.self_weights(base, stack, i, what)}
                else:
                    cached = base._runner.layer(base, stack, i)
            got = {}
            for s in names:
                full = tn.at(stack, i, s)
                t = base._tensors.get(full) if cached is None or full in base._tensors else cached[full]
                got[s] = t if self._rows is None else decoder_rows(full, t, self._rows)
            yield got

    def nbytes(self) -> int:
        """Bytes this trace keeps alive: its stored tensors (recomputed names and the layer
        cache count nothing), each memory block counted once however many names or views
        share it, and never more than the views into it cover."""
        return nbytes_of([self])

    # step views -----------------------------------------------------------------------
    def prefix(self, t: int, tokens: Optional[Dict[str, List[str]]] = None, meta: Optional[dict] = None) -> "Trace":
        """A view of the first t decoder positions (a decoder step): every decoder-side name
        cut to those rows, the encoder side whole. Shares storage and layer cache."""
        base = self._base or self
        view = Trace.__new__(Trace)
        view._tensors, view._order, view._known = base._tensors, base._order, base._known
        view._runner, view._cache, view._lock = base._runner, base._cache, base._lock
        view._tokens = {k: list(v) for k, v in (tokens or base._tokens).items()}
        view.meta = dict(meta if meta is not None else base.meta)
        view._rows, view._base = t, base
        return view

    # structure helpers --------------------------------------------------------------
    def layers(self, stack: str) -> int:
        """Number of layers recorded for a stack ('encoder' or 'decoder')."""
        idx = {w[1] for w in map(layer_of, self._order) if w is not None and w[0] == stack}
        return max(idx) + 1 if idx else 0

    def attention_kinds(self, stack: str) -> List[str]:
        """The softmax attentions of `stack` (self_attn, cross_attn) that some layer has; a layer
        whose token mixer is not softmax attention has `mixer` names instead (mixer_layers)."""
        n = self.layers(stack)
        return [kind for kind in tn.ATTNS if any(tn.attn(stack, i, kind, "weights") in self for i in range(n))]

    def mixer_layers(self, stack: str) -> List[int]:
        """The layers of `stack` whose token mixer is not softmax attention ({stack}.{i}.mixer.*)."""
        return [i for i in range(self.layers(stack)) if tn.mixer(stack, i, "out") in self]

    def stacks(self) -> List[str]:
        return [s for s in tn.STACKS if tn.out(s, 0) in self]

    def n_heads(self, stack: str) -> int:
        """Query heads per attention of `stack`, from the config or the stored per-head output:
        never a recomputed map (reading `weights` to count heads runs a whole layer again)."""
        n = self.meta.get("config", {}).get("n_heads")
        if n:
            return int(n)
        name = tn.self_attn(stack, 0, "heads")
        if not self.is_stored(name):
            raise KeyError(f"{name} is not stored and the trace has no config: cannot count heads")
        return (self._base or self)._tensors[name].shape[0]

    def mixer_heads(self, stack: str) -> int:
        """The H of a stack's token mixers (core/net/mixer.py), from the config: their maps'
        head count, which need not be the softmax layers' (n_heads)."""
        mixer = self.meta.get("config", {}).get("mixer") or {}
        if not mixer.get("heads"):
            raise KeyError(f"this trace's {stack} has no token mixer with a head count in its config")
        return int(mixer["heads"])

    def frame(self, name: str):
        """An attention name as a long pandas DataFrame, one row per (head, query, key):
        see core.frames.frame."""
        from .frames import frame

        return frame(self, name)

    # persistence --------------------------------------------------------------------
    def arrays(self) -> Iterator[Tuple[str, np.ndarray]]:
        """Every name as an array, in order, one at a time (layers recomputed one by one)."""
        for k in self._order:
            yield k, self[k].numpy()
        for which, toks in self._tokens.items():
            yield tn.TOKEN_LIST_NAMES.get(which, f"tokens.{which}"), np.array(toks, dtype=str)
        yield "meta", np.array(json.dumps(self.meta, default=str))

    def to_numpy(self) -> Dict[str, np.ndarray]:
        """Every name as an array (all in memory at once: for short inputs)."""
        return dict(self.arrays())

    def save(self, path) -> None:
        """Write every name to an .npz file, computing and writing one layer at a time."""
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, arr in self.arrays():
                with zf.open(name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)

    @classmethod
    def load(cls, path) -> "Trace":
        with np.load(path, allow_pickle=False) as z:
            tensors, tokens, meta = OrderedDict(), {}, {}
            for k in z.files:
                if k in TOKEN_LISTS or k.startswith("tokens."):
                    tokens[TOKEN_LISTS.get(k, k[len("tokens."):])] = [str(s) for s in z[k]]
                elif k == "meta":
                    meta = json.loads(str(z[k]))
                else:
                    tensors[k] = torch.from_numpy(z[k])
        return cls(tensors, tokens, meta)

    # pickling ---------------------------------------------------------------------------
    def __getstate__(self):
        """Pickled (st.cache_data, multiprocessing), a trace keeps what it STORES (the O(n d)
        tensors, tokens, meta, every name in order, a step view's rows) and HOW TO COMPUTE THE
        REST: its LayerRunner, which pickles as a reference to its model in this process (the
        weights are never copied; core/layer_runner.py). Nothing is computed to pickle a trace.
        Unpickled where that model is alive, it recomputes every other name as the original
        does; elsewhere it holds the stored names and says that the rest needs the model."""
        base = self._base or self
        tensors = OrderedDict((n, t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t)
                              for n, t in base._tensors.items())  # a view (positions: max_len x d) pickles alone
        return {"tensors": tensors, "names": base._order, "tokens": base._tokens, "meta": base.meta,
                "runner": base._runner, "rows": self._rows,
                "view_tokens": self._tokens if self._rows is not None else None,
                "view_meta": self.meta if self._rows is not None else None}

    def __setstate__(self, state):
        base = Trace(state["tensors"], state["tokens"], state["meta"], runner=state.get("runner"),
                     names=state.get("names"))
        if state.get("rows") is not None:
            base = base.prefix(state["rows"], state["view_tokens"], state["view_meta"])
        self.__dict__.update(base.__dict__)

    def computes(self) -> str:
        """What this trace does for a name it does not store, in words (also in its repr)."""
        runner = self.runner
        if runner is None:
            return "stores every name"
        model = getattr(runner, "model", None)
        if model is None:
            return f"stores {len(self.stored_names())} names; the rest needs the model " \
                   f"{getattr(runner, 'model_name', '?')!r}, which is not loaded in this process"
        return f"stores {len(self.stored_names())} names and recomputes the rest on the model {model.name!r}"

    def __repr__(self) -> str:
        toks = {k: len(v) for k, v in self._tokens.items()}
        return f"Trace(model={self.meta.get('model')!r}, tokens={toks}, tensors={len(self)}: {self.computes()})"


def nbytes_of(traces: Iterable[Trace]) -> int:
    """Bytes that some traces keep alive together: each memory block once (decoder steps
    are views of one pass and share all of it)."""
    blocks: Dict[int, list] = {}
    runners = {}
    for tr in traces:
        runner = (tr._base or tr)._runner
        if runner is not None:
            runners[id(runner)] = int(getattr(runner, "nbytes", 0) or 0)  # q and k kept for reads
        for t in (tr._base or tr)._tensors.values():
            st = t.untyped_storage()
            view = (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            entry = blocks.setdefault(st.data_ptr() or id(st), [st.nbytes(), {}])
            entry[1][view] = t.numel() * t.element_size()
    return sum(min(size, sum(views.values())) for size, views in blocks.values()) + sum(runners.values())
