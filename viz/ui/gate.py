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
- A page's work on a result it already holds (a long input's maps, surprisal and head profiles after
  its trace: `maps_bytes`, `surprisal_bytes`) is admitted with first=True: it goes ahead of the
  jobs waiting (new traces), behind the others of its kind, so a session that has its trace
  finishes with it instead of waiting behind every trace queued after its own.
- A waiting job calls on_wait(ahead, seconds) about every POLL seconds: the jobs ahead of it and
  the time they are expected to take. The time comes from the gate's own measurements: the share
  of the machine the last RECENT jobs of the same kind had (see below) against their estimates
  (or, where they had none, their bytes), so a slow machine or a busy one is seen from the
  second job on; the caller's estimate (a calibration) is used alone only before any job of
  that kind has ended.
- After a large job ends (TRIM_BYTES or more) and after the caches give back room, `release`
  (the app passes core.device.release_freed_memory) hands the freed memory back to the system:
  the process keeps freed memory for speed (core.device.keep_freed_memory), in one malloc arena
  per thread, so without it memory given back by one session's job is not there for another's.
- on_wait may raise (a page's rerun: the user pressed Cancel, or typed something else); the job
  then leaves the queue and its place is freed. A job is never stopped once it has entered.
- Identical requests share one computation before they reach the gate: the trace cache's
  get_or_compute runs one computation per key, the others wait for its result.
- A result a page run holds (its trace, from the cache or just computed) counts against the budget
  until the run ends (`hold` ... `release_holds(owner)`), whether or not a cache still keeps it:
  dropping it from a cache frees nothing while a page draws from it. Held results are counted
  once however many runs hold them, and are never dropped from a cache to make room (that would
  free nothing). So that holds cannot stop every run (each waiting for room its own hold takes),
  the first job in the queue enters with nothing running when every run that holds something is
  itself waiting in the queue, or when nothing has changed for STALL seconds (a holder blocked
  elsewhere: on another session's identical computation).
- The time a job is expected to take is its share of the machine: while k jobs run, each is
  charged 1/k of the wall time (the cores are shared), so the jobs ahead of a waiting one are
  expected to take the sum of their shares, whether they run one at a time or several at once.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Sequence

POLL = 0.25  # seconds between a waiting job's on_wait calls
BUDGET_ENV = "ATTENTION_LAB_MEMORY_BUDGET_MB"
BUDGET_SHARE = 0.5  # default budget: this share of the memory available when the process starts
RECENT = 8  # the time estimate: the last this many jobs of a kind that ended
TRIM_BYTES = 256 * 2**20  # a job this large hands its freed memory back to the system when it ends
STALL = 10.0  # seconds with nothing running and nothing changed before the first waiting job enters anyway


UNLIMITED = 2**60  # a cgroup v1 limit at or above this is "no limit" (the kernel writes 2^63 rounded to a page)


def _read_int(path: str) -> Optional[int]:
    """An integer file's value; None when it is missing, unreadable, "max" (cgroup v2's no limit) or garbage."""
    try:
        with open(path, encoding="ascii") as f:
            raw = f.read().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


def _stat(path: str, key: str) -> int:
    """One counter of a cgroup's memory.stat (0 when absent)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


def cgroup_memory(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[int]:
    """Bytes the process's memory cgroups leave it now: for each cgroup that limits memory, its limit minus what
    it uses (its reclaimable page cache, inactive_file, counted as free), the smallest of them; None where no
    cgroup limits memory. Read for cgroup v2 (`memory.max`, `memory.current`, the unified hierarchy at `root`)
    and v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes` under `root`/memory), each at the process's own
    cgroup (from `proc_cgroup`) and at every ancestor up to the mount's root, since a parent's limit binds its
    children too. A path that is not there under the mount (a container that sees its own cgroup as the root)
    is walked up until it is. The paths are arguments so that tests can hand in fake files."""
    try:
        with open(proc_cgroup, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: "0::/path", the unified hierarchy (at root, or root/unified in hybrid mode)
            mounts = [root, os.path.join(root, "unified")]
            files = ("memory.max", "memory.current", "memory.stat", "inactive_file")
        elif "memory" in controllers.split(","):  # v1: "4:memory:/path"
            mounts = [os.path.join(root, "memory")]
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file")
        else:
            continue
        limit_file, usage_file, stat_file, inactive = files
        for mount in mounts:
            if not os.path.isdir(mount):
                continue
            parts_ = [p for p in path.strip("/").split("/") if p and p != ".."]
            while parts_ and not os.path.isdir(os.path.join(mount, *parts_)):
                parts_.pop()  # not under this mount as named: walk up to where it is
            while True:
                here = os.path.join(mount, *parts_)
                limit = _read_int(os.path.join(here, limit_file))
                if limit is not None and limit < UNLIMITED:
                    used = _read_int(os.path.join(here, usage_file)) or 0
                    used = max(0, used - _stat(os.path.join(here, stat_file), inactive))
                    found.append(max(0, limit - used))
                if not parts_:
                    break
                parts_.pop()
    return min(found) if found else None


def machine_memory(proc_cgroup: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup",
                   meminfo: str = "/proc/meminfo") -> int:
    """Bytes of memory available to the process now: the machine's MemAvailable (else its total), or what
    the process's memory cgroups leave it (cgroup_memory, v1 or v2), whichever is smaller. A container's
    limit is a cgroup's: past it the kernel kills the process, whatever the machine has free."""
    try:
        with open(meminfo, encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        machine = info.get("MemAvailable") or info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limited = cgroup_memory(proc_cgroup, cgroup_root)
    return machine if limited is None else min(machine, limited)


def default_budget() -> int:
    """$ATTENTION_LAB_MEMORY_BUDGET_MB, else half the memory available at start (machine_memory: the
    machine's, or a container's cgroup limit where that is smaller; the loaded models, Streamlit and the
    browser sessions' own state live in the other half)."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if raw:
        return max(1, int(float(raw) * 2**20))
    return int(machine_memory() * BUDGET_SHARE)


LOGIT_ROWS = 256  # core.api computes next-token distributions this many positions at a time
MARGIN = 1.1  # over the measured peaks (docs/decisions.md, "Measurements moved from the code")
SMALL_JOB = 2 * 2**20  # what a job allocates beside its arrays (torch's and the allocator's own): about 1 MiB measured on small jobs, twice that
TRACE_MARGIN = 1.35  # a trace's: measured as the app allocates (core.device.keep_freed_memory), see trace_bytes


def widest_head(cfg) -> tuple:
    """(d_k, H_kv) for a memory estimate: the largest over the layers, where a model sets a head size
    or a key/value head count per layer kind (Gemma 4's global layers: ModelConfig.layer_d_head,
    layer_kv_heads); the model's own otherwise."""
    d_k = cfg.d_head or cfg.d_model // cfg.n_heads
    kv = getattr(cfg, "n_kv_heads", None) or cfg.n_heads
    if hasattr(cfg, "layer_d_head"):
        layers = range(cfg.n_layers)
        d_k = max([d_k] + [cfg.layer_d_head(i) for i in layers])
        kv = max([kv] + [cfg.layer_kv_heads(i) for i in layers])
    return d_k, kv


def map_heads(cfg) -> int:
    """The most maps a layer of the model makes: H of its softmax layers, or of its token mixer's
    implicit attention where that has more heads (Kimi Linear's KDA layers, a Mamba2's)."""
    return max(cfg.n_heads, int((getattr(cfg, "mixer", None) or {}).get("heads", 0) or 0))


def trace_bytes(cfg, n_tokens: int, n_target: int = 0) -> int:
    """Peak bytes a traced pass holds above the model, from its shapes, in float32:
    - what the trace stores: 2 (L + 5) n d floats a stack (the stream at every layer boundary,
      the embeddings, the final norm, and their copies while a layer runs);
    - one layer's working set: 2 n (4 d + 3 m) floats (q, k, v, the attention output, the FFN's
      hidden layer and the temporaries beside them); the attention runs in blocks (fused kernel,
      long inputs a tile of rows at a time), so no n x n term;
    - a decoder's next-token distributions, LOGIT_ROWS rows of the vocabulary at a time: 3
      LOGIT_ROWS V floats (logits, softmax, top-k).
    Times TRACE_MARGIN (`python -m bench.load_test --calibrate` measures it against a pass; the
    figures that set it: docs/decisions.md, "Measurements moved from the code")."""
    d, m, L = cfg.d_model, cfg.d_ff, cfg.n_layers
    stacks = [n_tokens] if cfg.kind != "encoder-decoder" else [n_tokens, max(1, n_target or n_tokens)]
    stored = sum(2 * (L + 5) * n * d for n in stacks)
    working = 2 * max(stacks) * (4 * d + 3 * m)
    logits = 3 * LOGIT_ROWS * cfg.tgt_vocab_size if cfg.kind != "encoder" else 0
    return int(TRACE_MARGIN * 4 * (stored + working + logits))


def steps_bytes(cfg, n_prompt: int, n_new: int) -> int:
    """Peak bytes of the decoder stepper's run (core.api steps): greedy decoding through the KV cache,
    then one traced pass over the prompt and the generated tokens: a trace of n_prompt + n_new
    positions (trace_bytes)."""
    return trace_bytes(cfg, int(n_prompt) + int(n_new))


def batch_bytes(cfg, tokens: int, grad: bool = False, n_keys: int = 0) -> int:
    """Peak bytes of batched passes over `tokens` positions in all (patching's corrupted runs,
    integrated gradients' steps, occlusions), in float32: one layer's working set,
    2 tokens (4 d + 3 m) floats, held for every layer when gradients flow back through them
    (autograd keeps each layer's activations), plus a decoder's output at the positions read;
    n_keys: the keys each position attends over, whose scores and weights (2 H n_keys floats a
    position) a pass with gradients keeps for every layer, one without for one. Times MARGIN;
    held against the measured peak by tests/app/peak_probe.py (the figures: docs/decisions.md,
    "Measurements moved from the code")."""
    d, m, L = cfg.d_model, cfg.d_ff, cfg.n_layers
    working = 2 * tokens * (4 * d + 3 * m)
    maps = 2 * tokens * map_heads(cfg) * max(0, int(n_keys))
    held = (working + maps) * (L if grad else 1) + 2 * tokens * d * (L + 2)  # the stream kept beside it
    logits = 3 * LOGIT_ROWS * cfg.tgt_vocab_size if cfg.kind != "encoder" else 0
    return int(MARGIN * 4 * (held + logits))


def patching_bytes(cfg, n_tokens: int, cells: int) -> int:
    """Peak bytes of a patching grid (core.analysis.patch) over n_tokens positions with `cells` cells
    a layer (positions, or heads): the clean and the corrupted run's values kept at every layer (two
    traces: 2 trace_bytes) and one batch of patched runs, at most BATCH_TOKENS positions in all and
    one item per cell (batch_bytes, each position over n_tokens keys)."""
    from core.analysis.activation_patching import BATCH_TOKENS

    n = max(1, int(n_tokens))
    tokens = min(max(BATCH_TOKENS // n, 1), max(1, int(cells))) * n
    return 2 * trace_bytes(cfg, n) + batch_bytes(cfg, tokens, n_keys=n)


def pattern_bytes(cfg, n_tokens: int, layer: Optional[int] = None) -> int:
    """Peak bytes of one head's pattern attribution (core.analysis.pattern_attribution) of layer `layer`
    (default: the last) above its trace, in float64, times MARGIN:
    - every component of the stream up to the head (each head's write, each layer's MLP and biases,
      the embeddings: C = (layer + 1)(H + 2) + 4), made along the stream, n d values each (C n d),
      then projected to the query and the key side, 2 d_k values a position each, the two sides made
      and then taken at the positions (4 C n d_k);
    - the walk's working set in one layer, 2 n (4 d + 3 m);
    - the head's n x n maps: its weights, its scaled scores and their product, with the temporaries
      beside them (5 n^2).
    Held against the measured peak by tests/app/peak_probe.py (the figures: docs/decisions.md,
    "Measurements moved from the code")."""
    d, m, d_k = cfg.d_model, cfg.d_ff, widest_head(cfg)[0]
    n = max(1, int(n_tokens))
    walked = cfg.n_layers if layer is None else min(cfg.n_layers, int(layer) + 1)
    components = walked * (cfg.n_heads + 2) + 4
    made = components * n * (d + 4 * d_k)
    return int(MARGIN * 8 * (made + 2 * n * (4 * d + 3 * m) + 5 * n * n))


def circuit_bytes(cfg, n_tokens: int) -> int:
    """Peak bytes of one head's circuit edges (core.analysis.head_circuit, one head): pattern
    attribution's walk with a third side (the values), so 3 d_k float64 values a position and
    component instead of 2."""
    return pattern_bytes(cfg, n_tokens) * 3 // 2


def path_patch_bytes(cfg, n_tokens: int) -> int:
    """Peak bytes of one path patch (core.analysis.path_patch): a forward pass's working set,
    every head's output and MLP write of the layers between sender and receiver kept (at most
    L of each: 2 L n d floats beside the H n d_k heads), and the receiver's layer run with its
    maps recorded (H n^2 floats for each of scores, scaled, masked, weights, value norms)."""
    d, L, H = cfg.d_model, cfg.n_layers, map_heads(cfg)
    kept = 2 * L * n_tokens * d * 2
    maps = 5 * H * n_tokens * n_tokens
    return batch_bytes(cfg, n_tokens) + int(MARGIN * 4 * (kept + maps))


def maps_bytes(cfg, n_tokens: int) -> int:
    """Peak bytes of a long input's views after its trace (overview and zoom, the model view's
    pooled maps, head profiles: core.head_maps.LayerMaps, one head and a tile of rows at a time):
    the layer's normed input and RoPE angles (n d + 2 n d_k floats), one head's q and each kv
    head's k (n d_k (1 + kv) floats), kept with the trace, and a tile of TILE_ROWS x n cells in
    up to 16 copies while it is pooled (scores to weights, the mask, padding, block sums, the
    profile's temporaries). Times MARGIN (the measurement it is held against: docs/decisions.md,
    "Measurements moved from the code")."""
    from core.head_maps import TILE_ROWS

    d_k, kv = widest_head(cfg)
    n = int(n_tokens)
    held = n * cfg.d_model + 2 * n * d_k + n * d_k * (1 + kv)
    return int(MARGIN * 4 * (held + 16 * TILE_ROWS * n) + SMALL_JOB)


def surprisal_bytes(cfg, n_tokens: int) -> int:
    """Peak bytes of a decoder's surprisal over a trace (core.analysis.surprisal): the logits of
    ROWS positions at a time over the vocabulary, in float32, then in float64 with their log-softmax,
    its exponent and their product (4 + 3 x 8 bytes a cell), three float64 values a position for the
    result, and SMALL_JOB; times MARGIN; the same at any length past ROWS (the measurement it is
    held against: docs/decisions.md, "Measurements moved from the code")."""
    from core.analysis.surprisal import ROWS

    n = max(1, int(n_tokens))
    return int(MARGIN * (28 * min(ROWS, n) * cfg.tgt_vocab_size + 24 * n) + SMALL_JOB)


def prefix_check_bytes(cfg, n_rows: int, n_pass: int, n_source: int = 0) -> int:
    """Peak bytes of the decoder stepper's step check or teacher-forcing check
    (viz.ui.prefix_check.prefix_difference, through models.step_check and models.prefix_check)
    above the model and the trace the page holds, in float32:
    - the decoder run on the prefix alone: a trace of n_rows decoder positions (trace_bytes, over an
      encoder-decoder's n_source source positions);
    - the self-attention weights compared: layer by layer while a layer's maps are short, the pass
      behind the view's H n_pass^2 weights and the prefix run's H n_rows^2, each made beside its
      scores and masked scores (3 copies), and the difference's temporaries (4 H n_rows^2); past
      core.head_maps.LONG_LAYER_BYTES one head and a tile of rows at a time (two LayerMaps' inputs,
      and 16 tiles' worth of a tile a side and their temporaries: prefix_check.check_tile_rows),
      never a layer;
    - an encoder-decoder's cross-attention, read with its whole layer (8 H n_pass n_source);
    - the drawn maps' reference, one head's three n_rows^2 maps in float64 (short prefixes; a long
      one's is a block row at a time).
    Times MARGIN."""
    from core.head_maps import LONG_LAYER_BYTES

    n_rows, n_pass = max(1, int(n_rows)), max(1, int(n_rows), int(n_pass))
    H = map_heads(cfg)
    alone = trace_bytes(cfg, n_source or n_rows, n_rows) if cfg.kind == "encoder-decoder" else trace_bytes(cfg, n_rows)
    tiled = cfg.positional != "relative" and H * n_pass * n_pass * 4 > LONG_LAYER_BYTES
    if tiled:  # two LayerMaps' inputs and q, k, and a tile a side with its temporaries (16 tiles' worth)
        from viz.ui.prefix_check import check_tile_rows

        d_k, kv = widest_head(cfg)
        held = n_pass * cfg.d_model + 2 * n_pass * d_k + n_pass * d_k * (1 + kv)
        maps = 4 * (2 * held + 16 * min(n_pass, check_tile_rows(n_pass)) * n_pass)
    else:
        maps = 4 * (3 * H * n_pass ** 2 + 7 * H * n_rows ** 2) + 3 * 8 * n_rows ** 2
    cross = 4 * 8 * H * n_pass * n_source if cfg.kind == "encoder-decoder" else 0
    return int(alone + MARGIN * (maps + cross))


def generation_check_bytes(cfg, n_prompt: int, n_new: int, n_source: int = 0) -> int:
    """Peak bytes of the decoder stepper's KV-cache check (viz.ui.prefix_check.generation_difference,
    through models.generation_check) above the model, in float32: greedy decoding through the KV cache
    (the prompt's pass, its keys and values, core.net.cost.kv_cache_bytes a position: 2 H_kv d_k floats
    on each layer that keeps a cache, a latent attention's latent; and T next-token logits over the
    vocabulary) and one uncached pass over the prompt and the T generated tokens (at most a trace of
    P + T positions: trace_bytes) with its T rows of logits. Times MARGIN."""
    from core.net.cost import kv_cache_bytes

    n = max(1, int(n_prompt) + int(n_new))
    T, V = max(1, int(n_new)), cfg.tgt_vocab_size
    one_pass = trace_bytes(cfg, n_source or n, n) if cfg.kind == "encoder-decoder" else trace_bytes(cfg, n)
    return int(one_pass + MARGIN * (kv_cache_bytes(cfg) * n + 4 * 3 * T * V))


def kind_of(what: str, model: str, calibrated: bool = False) -> str:
    """What the gate measures a job's time by (Gate.admit's kind): the work, the model, and where the
    caller's estimate came from. A ratio of measured to estimated time holds for one model's jobs
    estimated one way; a small model's short traces, timed mostly by their fixed overhead against a
    rough FLOP rate, would otherwise scale a long calibrated trace's estimate a hundredfold."""
    return f"{what} {model} ({'calibrated' if calibrated else 'rough'} estimate)"


@dataclass
class Ticket:
    cost: int
    seconds: float
    label: str
    number: int
    kind: str = ""
    first: bool = False  # work on a result the page holds: ahead of the other waiting jobs
    owner: object = None  # the page run that asked (Gate.hold's owner), if any
    entered: Optional[float] = None  # when it started running (None while it waits)
    queued: float = field(default_factory=time.monotonic)
    share: float = 0.0  # seconds of the machine it has had: wall time / the jobs running beside it


class Cancelled(Exception):
    """A waiting job left the queue before it ran."""


class Gate:
    def __init__(self, budget: int, caches: Sequence = (), release: Optional[Callable[[], object]] = None):
        self.budget = int(budget)
        self.caches: List = list(caches)  # .nbytes, .holds(value), .shrink_to(bytes, keep=) (viz.ui.cache.ByteLRU)
        self.release = release  # hands freed memory back to the system (core.device.release_freed_memory)
        self._done: Dict[str, Deque[tuple]] = {}  # kind -> (share, estimate, cost) of its last RECENT jobs
        self._holds: Dict[int, list] = {}  # id(value) -> [value, bytes, {owner: count}]
        self._changed = time.monotonic()  # the last admission, end or released hold
        self._shared_at = time.monotonic()  # when the running jobs' shares were last brought up to date
        self.released = 0
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

    def held_bytes(self) -> int:
        """Bytes of the results page runs hold now, each once."""
        return sum(b for _, b, _ in self._holds.values())

    def _in_caches(self, value) -> bool:
        return any(c.holds(value) for c in self.caches)

    def _held_in_caches(self) -> int:
        """Of the held bytes, those a cache counts too (so that they are not counted twice)."""
        return sum(b for v, b, _ in self._holds.values() if self._in_caches(v))

    def resident_bytes(self) -> int:
        """What the budget holds now: running jobs, cached results and held results, each once."""
        with self._cond:
            return self.running_bytes + self.cached_bytes() + self.held_bytes() - self._held_in_caches()

    def status(self) -> dict:
        with self._cond:
            return {"budget": self.budget, "running": len(self._running), "running_bytes": self.running_bytes,
                    "waiting": len(self._queue), "cached_bytes": self.cached_bytes(), "admitted": self.admitted,
                    "held_bytes": self.held_bytes(), "holds": len(self._holds),
                    "cancelled": self.cancelled, "waited": self.waited, "peak_running_bytes": self.peak_running}

    # -------------------------------------------------------------- results a page run holds
    def hold(self, value, nbytes: int, owner) -> None:
        """Count `value` (nbytes) against the budget until release_holds(owner): a page run draws
        from it. Several owners holding one value count it once."""
        if value is None or owner is None:
            return
        with self._cond:
            entry = self._holds.setdefault(id(value), [value, int(max(0, nbytes)), {}])
            entry[2][owner] = entry[2].get(owner, 0) + 1

    def release_holds(self, owner) -> int:
        """End every hold of `owner` (its page run ended); returns the bytes no run holds any more
        and no cache keeps: when they are many, the freed memory is handed back."""
        freed = 0
        with self._cond:
            for key in list(self._holds):
                entry = self._holds[key]
                if entry[2].pop(owner, None) is not None and not entry[2]:
                    del self._holds[key]
                    if not self._in_caches(entry[0]):
                        freed += entry[1]
            entry = None  # no reference left here when the memory is handed back
            freed += self._make_room(self.budget - self.running_bytes - self.held_bytes())  # kept while held
            if freed:
                self._changed = time.monotonic()
                self._cond.notify_all()
        if freed >= TRIM_BYTES:
            self._release()
        return freed

    def _fits(self, t: Ticket) -> bool:
        """Whether `t`, first in the queue, may enter now: it fits beside the running jobs and the
        held results once the caches give back what they must (cached results not held make
        room before anyone waits); or it may run alone (_alone)."""
        pinned = self.running_bytes + self.held_bytes()
        if pinned + t.cost > self.budget and not self._alone(t):
            return False
        if self._make_room(self.budget - pinned - t.cost):
            self._release()
        return True

    def _make_room(self, room: int) -> int:
        """Drop cached results no run holds (least recently used first) until the caches keep at
        most `room` bytes beyond the held results; returns the bytes dropped."""
        room, held, freed = max(0, room), self._held_in_caches(), 0
        for c in self.caches:
            over = self.cached_bytes() - held - room
            if over > 0:
                before = int(c.nbytes)
                c.shrink_to(max(0, before - over), keep=lambda v: id(v) in self._holds)
                freed += before - int(c.nbytes)
        return freed

    def _alone(self, t: Ticket) -> bool:
        """A job that does not fit enters anyway when nothing runs and waiting would not make room:
        no run holds anything, or every run that holds something is waiting in the queue (its
        own job included), or nothing has changed for STALL seconds."""
        if self._running:
            return False
        waiting = {w.owner for w in self._queue if w.owner is not None}
        holders = {o for _, _, owners in self._holds.values() for o in owners}
        return holders <= waiting or time.monotonic() - self._changed >= STALL

    def _release(self) -> None:
        if self.release is not None:
            self.release()
            self.released += 1

    # -------------------------------------------------------------- time
    def _share(self) -> None:
        """Bring the running jobs' shares up to date: each is charged the wall time since the last
        update divided by the jobs running (call before the running set changes)."""
        now = time.monotonic()
        if self._running:
            each = (now - self._shared_at) / len(self._running)
            for r in self._running:
                r.share += each
        self._shared_at = now

    def expected(self, t: Ticket) -> float:
        """Seconds of the machine job t is expected to take: its kind's last jobs' measured shares
        against their estimates, times t's estimate (or, where they had none, per byte, times t's
        cost); t's own estimate before any job of its kind has ended."""
        done = self._done.get(t.kind)
        if not done:
            return t.seconds
        spent = sum(s for s, _, _ in done)
        estimated = sum(e for _, e, _ in done)
        if t.seconds > 0 and estimated > 0:
            return t.seconds * spent / estimated
        cost = sum(c for _, _, c in done)
        return t.cost * spent / cost if cost > 0 else spent / len(done)

    def _ended(self, t: Ticket) -> None:
        self._done.setdefault(t.kind, deque(maxlen=RECENT)).append((t.share, t.seconds, t.cost))

    def ahead(self, t: Ticket) -> tuple:
        """(jobs ahead of t: running and waiting before it, seconds until they are done: the
        machine time the running ones have left and the waiting ones' whole, however many run
        at once)."""
        self._share()
        running = sum(max(0.0, self.expected(r) - r.share) for r in self._running)
        before = self._queue[:self._queue.index(t)] if t in self._queue else []
        return len(self._running) + len(before), running + sum(self.expected(w) for w in before)

    # -------------------------------------------------------------- admission
    @contextmanager
    def admit(self, cost: int, seconds: float = 0.0, label: str = "",
              on_wait: Optional[Callable[[int, float], None]] = None, kind: str = "", first: bool = False,
              owner=None):
        """Hold the block until a job of `cost` bytes fits (see the module docstring). seconds: the
        caller's estimate of its time alone on the machine; kind: what the gate measures its times
        by ("trace", "surprisal"...); first: work on a result the page holds, ahead of the other
        waiting jobs; owner: the page run asking (what it holds: `hold`)."""
        t = Ticket(int(max(0, cost)), float(max(0.0, seconds)), label, next(self._numbers), kind, bool(first),
                   owner)
        with self._cond:
            at = sum(1 for w in self._queue if w.first) if first else len(self._queue)
            self._queue.insert(at, t)
        waited = False
        try:
            while True:
                with self._cond:
                    if self._queue[0] is t and self._fits(t):
                        self._queue.remove(t)
                        self._share()
                        t.entered = self._changed = time.monotonic()
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
                self._share()
                self._running.remove(t)
                self._ended(t)
                self._changed = time.monotonic()
                self._cond.notify_all()
            if t.cost >= TRIM_BYTES:
                self._release()
