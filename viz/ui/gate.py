"""The admission gate: heavy work (long traces, decoder steps, patching grids, integrated
gradients, cache simulations, score attribution over a long text) runs only while the
process's memory budget holds it. Pure Python (threading; no Streamlit): viz/ui/admission.py
shows a waiting job's place in the queue with a way to cancel.

    GATE = Gate(budget_bytes, caches=[trace_cache])
    with GATE.admit(cost_bytes, seconds, "smollm2 trace, 4,096 tokens", on_wait=show):
        run()

- A job's cost (bytes above the loaded models at its peak) is estimated from shapes before it
  starts (`trace_bytes`), as the download sizes are.
- Jobs enter in order of arrival. The first in the queue enters when the jobs running and it fit
  the budget beside what the process-wide caches hold; cached results are dropped first (least
  recently used), so caches count against the same budget without making anyone wait. A job
  larger than the whole budget runs alone.
- A waiting job calls on_wait(ahead, seconds) about every POLL seconds: the jobs ahead of it and
  the time they are expected to take. on_wait may raise (a page's rerun: the user pressed
  Cancel, or typed something else); the job then leaves the queue and its place is freed. A job
  is never stopped once it has entered.
- Identical requests share one computation before they reach the gate: the trace cache's
  get_or_compute runs one computation per key, the others wait for its result.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

POLL = 0.25  # seconds between a waiting job's on_wait calls
BUDGET_ENV = "ATTENTION_LAB_MEMORY_BUDGET_MB"
BUDGET_SHARE = 0.5  # default budget: this share of the memory available when the process starts


def machine_memory() -> int:
    """Bytes of memory available to the process now (MemAvailable), else the machine's total."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        return info.get("MemAvailable") or info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget() -> int:
    """$ATTENTION_LAB_MEMORY_BUDGET_MB, else half the memory available at start (the loaded
    models, Streamlit and the browser sessions' own state live in the other half)."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if raw:
        return max(1, int(float(raw) * 2**20))
    return int(machine_memory() * BUDGET_SHARE)


LOGIT_ROWS = 256  # core.api computes next-token distributions this many positions at a time
MARGIN = 1.1  # over the measured peaks below


def trace_bytes(cfg, n_tokens: int, n_target: int = 0) -> int:
    """Peak bytes a traced pass holds above the model, from its shapes, in float32:
    - what the trace stores: 2 (L + 5) n d floats a stack (the stream at every layer boundary,
      the embeddings, the final norm, and their copies while a layer runs);
    - one layer's working set: 2 n (4 d + 3 m) floats (q, k, v, the attention output, the FFN's
      hidden layer and the temporaries beside them); the attention runs in blocks (fused kernel,
      long inputs a tile of rows at a time), so no n x n term;
    - a decoder's next-token distributions, LOGIT_ROWS rows of the vocabulary at a time: 3
      LOGIT_ROWS V floats (logits, softmax, top-k).
    Times MARGIN. Measured (`python -m bench.load_test --calibrate`, smollm2 on this CPU, VmHWM above
    the loaded model): 417 MiB at 1,239 tokens and 1,076 MiB at 4,400; this gives 440 and 1,158."""
    d, m, L = cfg.d_model, cfg.d_ff, cfg.n_layers
    stacks = [n_tokens] if cfg.kind != "encoder-decoder" else [n_tokens, max(1, n_target or n_tokens)]
    stored = sum(2 * (L + 5) * n * d for n in stacks)
    working = 2 * max(stacks) * (4 * d + 3 * m)
    logits = 3 * LOGIT_ROWS * cfg.tgt_vocab_size if cfg.kind != "encoder" else 0
    return int(MARGIN * 4 * (stored + working + logits))


def batch_bytes(cfg, tokens: int, grad: bool = False) -> int:
    """Peak bytes of batched passes over `tokens` positions in all (patching's corrupted runs,
    integrated gradients' steps, occlusions), in float32: one layer's working set,
    2 tokens (4 d + 3 m) floats, held for every layer when gradients flow back through them
    (autograd keeps each layer's activations), plus a decoder's output at the positions read.
    Measured for integrated gradients (64 steps of smollm2's 14-token indirect-object prompt,
    VmHWM above the model): 1,547 MiB; this gives 1,856."""
    d, m, L = cfg.d_model, cfg.d_ff, cfg.n_layers
    working = 2 * tokens * (4 * d + 3 * m)
    held = working * (L if grad else 1) + 2 * tokens * d * (L + 2)  # the stream kept beside it
    logits = 3 * LOGIT_ROWS * cfg.tgt_vocab_size if cfg.kind != "encoder" else 0
    return int(MARGIN * 4 * (held + logits))


def pattern_bytes(cfg, n_tokens: int) -> int:
    """Peak bytes of one head's pattern attribution (core.analysis.score_attribution): every
    component of the stream (each head's write, each layer's MLP and biases, the embeddings)
    projected to the query and the key side, 2 d_k float64 values a position each, for the two
    sides, times MARGIN. Measured on smollm2 at 512 tokens: 232 MiB above the trace; this gives 367."""
    d_k = cfg.d_head or cfg.d_model // cfg.n_heads
    components = cfg.n_layers * (cfg.n_heads + 2) + 4
    return int(MARGIN * 8 * 2 * components * n_tokens * 2 * d_k)


@dataclass
class Ticket:
    cost: int
    seconds: float
    label: str
    number: int
    entered: Optional[float] = None  # when it started running (None while it waits)
    queued: float = field(default_factory=time.monotonic)


class Cancelled(Exception):
    """A waiting job left the queue before it ran."""


class Gate:
    def __init__(self, budget: int, caches: Sequence = ()):
        self.budget = int(budget)
        self.caches: List = list(caches)  # objects with .nbytes and .shrink_to(bytes) (viz.ui.cache.ByteLRU)
        self._cond = threading.Condition()
        self._queue: List[Ticket] = []  # waiting, in order of arrival
        self._running: List[Ticket] = []
        self._numbers = itertools.count(1)
        self.admitted = self.cancelled = self.waited = 0
        self.peak_running = 0

    def count(self, cache) -> None:
        """Count `cache` (.nbytes, .shrink_to) against the budget, once."""
        with self._cond:
            if not any(c is cache for c in self.caches):
                self.caches.append(cache)

    # -------------------------------------------------------------- what the gate holds
    @property
    def running_bytes(self) -> int:
        return sum(t.cost for t in self._running)

    def cached_bytes(self) -> int:
        return sum(int(c.nbytes) for c in self.caches)

    def status(self) -> dict:
        with self._cond:
            return {"budget": self.budget, "running": len(self._running), "running_bytes": self.running_bytes,
                    "waiting": len(self._queue), "cached_bytes": self.cached_bytes(), "admitted": self.admitted,
                    "cancelled": self.cancelled, "waited": self.waited, "peak_running_bytes": self.peak_running}

    def _fits(self, t: Ticket) -> bool:
        """Whether `t`, first in the queue, may enter now: nothing runs (a job larger than the
        budget runs alone), or it fits beside the running jobs once the caches give back what
        they must."""
        if not self._running:
            room = self.budget - t.cost
        else:
            room = self.budget - self.running_bytes - t.cost
            if room < 0:
                return False
        for c in self.caches:  # cached results make room before anyone waits
            over = self.cached_bytes() - max(0, room)
            if over > 0:
                c.shrink_to(max(0, int(c.nbytes) - over))
        return True

    def ahead(self, t: Ticket) -> tuple:
        """(jobs ahead of t: running and waiting before it, seconds they are expected to take)."""
        now = time.monotonic()
        running = sum(max(0.0, r.seconds - (now - (r.entered or now))) for r in self._running)
        before = [w for w in self._queue if w.number < t.number]
        return len(self._running) + len(before), running + sum(w.seconds for w in before)

    # -------------------------------------------------------------- admission
    @contextmanager
    def admit(self, cost: int, seconds: float = 0.0, label: str = "",
              on_wait: Optional[Callable[[int, float], None]] = None):
        t = Ticket(int(max(0, cost)), float(max(0.0, seconds)), label, next(self._numbers))
        with self._cond:
            self._queue.append(t)
        waited = False
        try:
            while True:
                with self._cond:
                    if self._queue[0] is t and self._fits(t):
                        self._queue.remove(t)
                        t.entered = time.monotonic()
                        self._running.append(t)
                        self.admitted += 1
                        self.waited += waited
                        self.peak_running = max(self.peak_running, self.running_bytes)
                        break
                    self._cond.wait(POLL)
                    ahead = self.ahead(t)
                waited = True
                if on_wait is not None:
                    on_wait(*ahead)  # may raise: the job leaves the queue (finally below)
        except BaseException:
            with self._cond:
                if t in self._queue:
                    self._queue.remove(t)
                    self.cancelled += 1
                    self._cond.notify_all()
            raise
        try:
            yield t
        finally:
            with self._cond:
                self._running.remove(t)
                self._cond.notify_all()
