"""Activation patching (Meng et al. 2022; Wang et al. 2022): which activations the output needs.

    import core, core.analysis as ca
    model = core.load_model("smollm2")
    df = ca.patch(model, "When Mary and John went to the store, John gave a drink to",
                  "When Mary and John went to the store, Mary gave a drink to", " Mary", " John", what="head")

Run `corrupt`, replace one activation by its value in the `clean` run, and measure
m = logit[answer] - logit[wrong] at the last position (wrong None: logit[answer] alone).
restored = (m - m_corrupt) / (m_clean - m_corrupt): 1 where the patch brings the clean run's
preference back, 0 where it changes nothing. `what` is patched, at the hook points of
core/net/hooks.py:

    resid_pre  the residual stream entering layer i, at position p     {stack}.{i}.in
    attn_out   the self-attention sub-layer's output at (i, p)          {stack}.{i}.self_attn.out
    mlp_out    the feed-forward sub-layer's output at (i, p)           {stack}.{i}.ffn.out
    head       head h's slice of Concat(head_1..head_H) before W_o,     {stack}.{i}.self_attn.heads
               at every position

A layer whose token mixer is not softmax attention (core/net/mixer.py: Qwen3.5, Qwen3-Next)
has these points in its mixer: attn_out is {stack}.{i}.mixer.out and head a mixer head's output
before its gated norm, {stack}.{i}.mixer.heads (the mixer's H heads); a layer with a mixer
beside its attention (Falcon-H1) keeps its attention's points. Such a mixer carries a
state from position to position that cannot be cut at the first differing token as keys and
values can, so with mixer layers every patched run reads the whole input.

How it is computed. The clean and the corrupted input are run once each and their values at
those points kept. The patched runs of one layer go as one batch, one item per cell, that
starts at that layer from the corrupted run's stream entering it (Transformer.run_from): the
layers below are the corrupted run's. In a decoder, the positions before the first token where
the two prompts differ see the same tokens in every run (the look-ahead mask), so a batch runs
only the positions from there on, over the corrupted run's keys and values of the earlier ones,
and a cell before that position restores 0 without a run. So does any cell whose clean and
corrupted values are equal: its patched run is the corrupted run. Gemma 4: the batch also reads
the corrupted run's per-layer inputs and the keys and values that layers from i reuse of the
layers below i (PatchRuns._side_of); the per-layer inputs carry the corrupted tokens into every
layer, so restore_check puts the clean per-layer inputs in beside the clean stream.

Encoder-decoders (toy-translate, Marian, BART, T5): the encoder's positions and heads are
patched, with a clean and a corrupted source sentence of the same token count. The decoder
reads the beginning the two greedy translations share, and the metric is taken at the first
decoder position where they differ: there the source pair decides what the decoder writes,
and answer / wrong default to the clean and the corrupted translation's tokens at that
position. An encoder alone has no output to measure (ValueError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pandas as pd
import torch

from .. import trace_names as tn
from ..net.hooks import Hooks
from . import _checks as checks
from .token_ids import Token, output_token_id

WHATS = ("resid_pre", "attn_out", "mlp_out", "head")
POINT = {"resid_pre": tn.IN, "attn_out": tn.local(tn.SELF, "out"), "mlp_out": tn.local(tn.FFN, "out"),
         "head": tn.local(tn.SELF, "heads")}
MIXER_POINT = {"attn_out": tn.local(tn.MIXER, "out"), "head": tn.local(tn.MIXER, "heads")}
BATCH_TOKENS = 8192  # positions run at once in one batch of patched runs (batch items x positions)



@dataclass
class PatchPair:
    """A clean and a corrupted input as the model reads them, before anything is patched.

    stack: the stack whose activations are patched (decoder; encoder for encoder-decoders).
    differ: the positions where the two token sequences differ. For encoder-decoders,
    `decoder_input` is the greedy translations' shared beginning (<start> first) and
    `clean_next` / `corrupt_next` their tokens at the first position where they differ (None
    when the translations are the same)."""

    model: str
    kind: str
    stack: str
    clean_ids: List[int]
    corrupt_ids: List[int]
    tokens: List[str]
    corrupt_tokens: List[str]
    decoder_input: Optional[List[int]] = None
    decoder_tokens: List[str] = field(default_factory=list)
    clean_next: Optional[int] = None
    corrupt_next: Optional[int] = None
    cut: Tuple[int, int] = (0, 0)  # tokens cut from (clean, corrupt) at the model's input limit

    @property
    def same_length(self) -> bool:
        return len(self.clean_ids) == len(self.corrupt_ids)

    @property
    def differ(self) -> List[int]:
        return [p for p, (a, b) in enumerate(zip(self.clean_ids, self.corrupt_ids)) if a != b]

    def check(self) -> None:
        """ValueError where the pair cannot be patched: different token counts (both named),
        the same tokens, or (encoder-decoders) the same translation."""
        if not self.same_length:
            raise ValueError(f"clean and corrupt must have the same number of tokens: clean has "
                             f"{len(self.clean_ids)}, corrupt has {len(self.corrupt_ids)}")
        if not self.differ:
            raise ValueError("clean and corrupt are the same tokens: there is nothing to restore")
        if self.kind == "encoder-decoder" and self.clean_next is None:
            raise ValueError("the clean and the corrupted source have the same greedy translation: there is no "
                             "decoder position where the pair makes a difference to measure")


def prepare(model, clean: str, corrupt: str) -> PatchPair:
    """Both inputs tokenised (and, for encoder-decoders, translated), unchecked: a page shows
    both tokenisations when their counts differ. ValueError for encoders alone."""
    if model.kind == "encoder":
        raise ValueError(f"{model.name} is an encoder without an output layer: activation patching measures a "
                         "logit of the next token, which an encoder does not predict")
    a, b = model.encode(clean), model.encode(corrupt)
    pair = PatchPair(model.name, model.kind, "decoder" if model.kind == "decoder" else "encoder", list(a.ids),
                     list(b.ids), model.source_strings(a), model.source_strings(b),
                     cut=(a.truncated, b.truncated))
    if model.kind == "encoder-decoder" and pair.same_length:
        gen_a, _ = model._greedy(model._ids(a.ids), [model.start_id], model.max_new_tokens)
        gen_b, _ = model._greedy(model._ids(b.ids), [model.start_id], model.max_new_tokens)
        t = next((j for j, (x, y) in enumerate(zip(gen_a, gen_b)) if x != y), None)
        if t is None and len(gen_a) != len(gen_b):  # one stopped at the max length, the other went on
            t = min(len(gen_a), len(gen_b))
        common = gen_a if t is None else gen_a[:t]
        pair.decoder_input = [model.start_id] + list(common)
        pair.decoder_tokens = model.target_strings(pair.decoder_input)
        if t is not None and t < len(gen_a) and t < len(gen_b):
            pair.clean_next, pair.corrupt_next = int(gen_a[t]), int(gen_b[t])
    return pair


@torch.inference_mode()
def patch(model, clean: str, corrupt: str, answer: Optional[Token], wrong: Optional[Token] = None,
          what: str = "resid_pre", progress: Optional[Callable[[float], None]] = None,
          batch_tokens: int = BATCH_TOKENS) -> pd.DataFrame:
    """The patching table of `what` (module docstring): columns layer, position (-1 for
    "head"), head (-1 unless "head"), metric, restored; df.attrs clean_metric, corrupt_metric
    (and the tokens, answer and wrong ids and strings, the stack, the runs made). answer None
    (encoder-decoders): the clean translation's token where the two differ. progress(f) is
    called with the fraction of the grid done after each batch."""
    if what not in WHATS:
        raise ValueError(f"what must be one of {', '.join(WHATS)}, not {what!r}")
    batch_tokens = checks.whole(batch_tokens, "batch_tokens", lo=1)
    pair = prepare(model, clean, corrupt)
    pair.check()
    runs = PatchRuns(model, pair, answer, wrong, what)
    return runs.grid(progress, batch_tokens)


@torch.inference_mode()
def restore_check(model, clean: str, corrupt: str, answer: Optional[Token], wrong: Optional[Token] = None,
                  layer: int = 0) -> Dict[str, float]:
    """Patching the whole residual stream entering `layer` at every position where the two
    inputs differ, through the same batched runs as the grid: at layer 0 the patched input is
    the clean input, so the patched metric must equal the clean run's (restored 1). Returns
    the patched metric, the clean and corrupted runs' metrics and restored. Gemma 4: its
    per-layer inputs are input too (each position's own token's), so they are the clean run's
    here, beside the stream."""
    pair = prepare(model, clean, corrupt)
    pair.check()
    layer = checks.index(layer, len(model.net.layers(pair.stack)), "layer")
    runs = PatchRuns(model, pair, answer, wrong, "resid_pre")
    if layer == 0 and runs.side is not None and "per_layer" in runs.side:
        x = runs._ids(pair.clean_ids)  # position by position: the corrupted run's where the tokens agree
        runs.side = dict(runs.side, per_layer=model.net.per_layer_inputs(x, model.net.tgt_embed(x)))
    m = runs.run_cells(layer, [pair.differ])[0]
    return {"patched_metric": m, "clean_metric": runs.m_clean, "corrupt_metric": runs.m_corrupt,
            "restored": runs.restored(m)}


class PatchRuns:
    """The clean and corrupted runs of a pair, with their values at the hook points of `what`
    kept, and the batched patched runs that start from them."""

    def __init__(self, model, pair: PatchPair, answer: Optional[Token], wrong: Optional[Token], what: str):
        self.model, self.pair, self.what = model, pair, what
        self.net, self.dev, self.stack = model.net, model.device, pair.stack
        if answer is None:
            if pair.clean_next is None:
                raise ValueError("give the answer token (the one the clean input should make likelier)")
            answer = pair.clean_next
        self.answer = output_token_id(model, answer, "answer token")
        self.wrong = None if wrong is None else output_token_id(model, wrong, "wrong token")
        self.n_layers = len(self.net.layers(self.stack))
        self.n = len(pair.clean_ids)
        layers = self.net.layers(self.stack)
        # each layer's hook point of `what` (a mixer layer's own for attn_out and head; a layer with
        # a mixer beside its attention, Falcon-H1, the attention's)
        self.points = [MIXER_POINT.get(what, POINT[what]) if getattr(layer, "self_attn", None) is None
                       else POINT[what] for layer in layers]
        mixers = any(getattr(layer, "mixer", None) is not None for layer in layers)
        # decoders: positions before the first difference are the same in every run (a mixer's
        # state cannot be cut there: with mixer layers every run reads the whole input)
        self.start = pair.differ[0] if self.stack == "decoder" and not mixers else 0
        self.clean = self._run(pair.clean_ids, False)
        self.cache: Optional[dict] = {} if self.stack == "decoder" and self.start > 0 else None
        self.corrupt = self._run(pair.corrupt_ids, True, self.cache)
        self.m_clean, self.m_corrupt = self.clean.pop("metric"), self.corrupt.pop("metric")
        self.side = self._side_of(pair.corrupt_ids) if self.stack == "decoder" and self.net.needs_side() else None

    # -------------------------------------------------------------- the two runs
    def _ids(self, ids: Sequence[int], batch: int = 1) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long, device=self.dev).expand(batch, -1)

    def _side_of(self, ids: Sequence[int]) -> dict:
        """Gemma 4: what a patched run started at a layer reads besides the stream, from the
        corrupted run (the layers below the start are the corrupted run's): the per-layer
        inputs of the corrupted ids, and each layer's keys and values that a later layer reuses."""
        x = self._ids(ids)
        side = {}
        if self.net.cfg.per_layer_dim:
            side["per_layer"] = self.net.per_layer_inputs(x, self.net.tgt_embed(x))
        sources = {j for j in (self.net.cfg.kv_source or []) if j is not None}
        if sources:
            kept = {}

            def keep(key):
                def fn(t):
                    kept[key] = t
                    return t
                return fn

            fns = {tn.attn(self.stack, j, tn.SELF, s): keep((j, s)) for j in sources for s in ("k", "v")}
            self.net.decode(x, rec=Hooks(fns))
            side["shared"] = {j: (kept[(j, "k")], kept[(j, "v")]) for j in sources}
        return side

    def _side(self, i: int, batch: int) -> Optional[dict]:
        """The side inputs of patched runs of layer i, over the batch, for positions start..
        (the keys and values of every position: the layers below i wrote them)."""
        if self.side is None:
            return None
        out = {}
        if "per_layer" in self.side:
            e = self.side["per_layer"][:, self.start:]
            out["per_layer"] = e.expand(batch, *e.shape[1:])
        if "shared" in self.side:
            out["shared"] = {j: tuple(t.expand(batch, *t.shape[1:]) for t in kv)
                             for j, kv in self.side["shared"].items() if j < i}
        return out

    def _run(self, ids: Sequence[int], with_in: bool, cache: Optional[dict] = None) -> dict:
        """One full pass; its values at each layer's point (and at `in`: with_in) (batch item 0)
        and its metric."""
        kept: dict = {}

        def keep(name):
            def fn(t):
                kept[name] = t[0]
                return t
            return fn

        hooks = Hooks({tn.at(self.stack, i, p): keep((i, p)) for i in range(self.n_layers)
                       for p in ([tn.IN] if with_in else []) + [self.points[i]]})
        if self.stack == "decoder":
            hidden = self.net.decode(self._ids(ids), rec=hooks, cache=cache)
        else:
            memory = self.net.encode(self._ids(ids), rec=hooks)
            hidden = self.net.decode(self._ids(self.pair.decoder_input), memory)
        kept["metric"] = self.metrics(self.net.project(hidden[:, -1]))[0]
        return kept

    def metrics(self, logits: torch.Tensor) -> List[float]:
        """logit[answer] - logit[wrong] (or logit[answer]) of each row of (B, V) logits."""
        m = logits[:, self.answer].double()
        if self.wrong is not None:
            m = m - logits[:, self.wrong].double()
        return m.tolist()

    def restored(self, m: float) -> float:
        d = self.m_clean - self.m_corrupt
        return (m - self.m_corrupt) / d if d != 0 else float("nan")

    # -------------------------------------------------------------- patched runs
    def _hook(self, i: int, cells: Sequence) -> Dict[str, Callable]:
        """The hook that puts the clean values of `cells` (one per batch item) into layer i's
        point: positions (or lists of positions) for the per-position kinds, heads for "head"."""
        clean, s = self.clean[(i, self.points[i])], self.start

        if self.what == "head":
            heads = torch.tensor(list(cells), device=self.dev)
            values = clean[:, s:][heads]  # (B, t, d_k)

            def put(t):  # t (B, H, t, d_k)
                t = t.clone()
                t[torch.arange(len(heads), device=self.dev), heads] = values
                return t
        else:
            rows, items = [], []
            for b, c in enumerate(cells):
                for p in ([c] if isinstance(c, int) else c):
                    rows.append(p - s)
                    items.append(b)
            rows_t, items_t = torch.tensor(rows, device=self.dev), torch.tensor(items, device=self.dev)
            values = clean[rows_t + s]  # (cells, d)

            def put(t):  # t (B, t, d)
                t = t.clone()
                t[items_t, rows_t] = values
                return t

        return {tn.at(self.stack, i, self.points[i]): put}

    def _prefix_cache(self, i: int, batch: int) -> Optional[dict]:
        """The corrupted run's cache of the positions before `start` (keys and values, or latent
        attention's latents: each attention module cuts its own, cache_prefix), for layers i..,
        repeated over the batch (decode's cache format; each run appends its own)."""
        if self.cache is None:
            return None
        layers = self.net.layers("decoder")
        return {j: {"self_attn": layers[j].self_attn.cache_prefix(self.cache[j]["self_attn"], self.start, batch)}
                for j in range(i, self.n_layers)}

    def run_cells(self, i: int, cells: Sequence) -> List[float]:
        """The metric of each cell's patched run, all of layer i in one batch started there."""
        b = len(cells)
        x = self.corrupt[(i, "in")][self.start:][None].expand(b, -1, -1)  # (B, t, d): the stream entering layer i
        hooks = Hooks(self._hook(i, cells))
        if self.stack == "decoder":
            hidden = self.net.run_from("decoder", i, x, hooks, cache=self._prefix_cache(i, b), n_past=self.start,
                                       side=self._side(i, b))
        else:
            memory = self.net.run_from("encoder", i, x, hooks)
            hidden = self.net.decode(self._ids(self.pair.decoder_input, b), memory)
        return self.metrics(self.net.project(hidden[:, -1]))

    def cells(self, i: int) -> Tuple[list, list]:
        """Layer i's cells as (run, unchanged): positions (or heads) whose patch is run, and
        those whose clean value equals the corrupted one (restored 0, no run)."""
        key = (i, self.points[i])
        a, b = self.clean[key], self.corrupt.get(key)
        if self.what == "head":
            return ([h for h in range(a.shape[0]) if not torch.equal(a[h, self.start:], b[h, self.start:])],
                    [h for h in range(a.shape[0]) if torch.equal(a[h, self.start:], b[h, self.start:])])
        run = [p for p in range(self.start, self.n) if not torch.equal(a[p], b[p])]
        kept = set(run)
        return run, [p for p in range(self.n) if p not in kept]

    def grid(self, progress: Optional[Callable[[float], None]] = None, batch_tokens: int = BATCH_TOKENS) -> pd.DataFrame:
        t = self.n - self.start  # positions each patched run computes
        per_batch = max(1, batch_tokens // max(1, t))
        plan = [(i, *self.cells(i)) for i in range(self.n_layers)]
        total = sum((self.n_layers - i) * len(run) for i, run, _ in plan) or 1
        done, rows, n_runs = 0, [], 0
        head = self.what == "head"
        for i, run, same in plan:
            for c in same:
                rows.append((i, -1 if head else c, c if head else -1, self.m_corrupt))
            for k in range(0, len(run), per_batch):
                chunk = run[k : k + per_batch]
                for c, m in zip(chunk, self.run_cells(i, chunk)):
                    rows.append((i, -1 if head else c, c if head else -1, m))
                n_runs += len(chunk)
                done += (self.n_layers - i) * len(chunk)
                if progress is not None:
                    progress(done / total)
        df = pd.DataFrame(rows, columns=["layer", "position", "head", "metric"])
        df = df.sort_values(["layer", "head" if head else "position"], ignore_index=True)
        df["restored"] = [self.restored(m) for m in df["metric"]]
        model, pair = self.model, self.pair
        df.attrs.update(
            clean_metric=self.m_clean, corrupt_metric=self.m_corrupt, what=self.what, stack=self.stack,
            answer_id=self.answer, answer=model.alternative_strings([self.answer])[0], wrong_id=self.wrong,
            wrong=None if self.wrong is None else model.alternative_strings([self.wrong])[0],
            tokens=list(pair.tokens), corrupt_tokens=list(pair.corrupt_tokens), differ=pair.differ,
            decoder_tokens=list(pair.decoder_tokens), n_layers=self.n_layers, runs=n_runs, first_run=self.start)
        return df
