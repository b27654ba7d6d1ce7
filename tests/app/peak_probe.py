"""Each memory estimate the admission gate uses (viz/ui/gate.py) against the peak its job measures,
in a process of its own: run as `python tests/app/peak_probe.py` (tests/app/test_gate.py does), it prints
one JSON line per job: {"job", "estimate", "measured"} in bytes.

How a peak is measured: the resident memory's high-water mark (VmHWM) above the resident memory at rest
just before the job. Before each job the process hands freed memory back (core.device.release_freed_memory,
as the gate does after a large job) and resets the high-water mark (`5` into /proc/self/clear_refs); the
job then runs once, after a warm-up run on a short input (lazy imports, first-call caches). This counts
everything the job allocates, torch's tensors, numpy's and pandas' arrays and Python's objects alike, with
the allocator settings the app runs with (core.device.keep_freed_memory: freed memory kept for speed), and
it reads this process alone: other processes on a busy machine change its time, not its resident memory.
The model is a random decoder large enough that its jobs are tens of MiB, well above the allocator's noise.
"""

from __future__ import annotations

import gc
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]

import core  # noqa: E402
import core.device  # noqa: E402
from core import ModelConfig  # noqa: E402
from viz.ui import gate as vg  # noqa: E402

N = 512  # the jobs' input length (tokens)
PATCH_N = 128  # the patching grid's (one run per position and layer: n^2 positions run in all)
WORDS = "the small dog sees the old cat near the river".split()


def status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def measure(job) -> int:
    gc.collect()
    core.device.release_freed_memory()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    rest = status("VmRSS")
    out = job()  # kept until the high-water mark is read: what the job returns is part of its peak
    peak = status("VmHWM") - rest
    del out
    return peak


def text(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def main() -> None:
    core.device.configure_threads()
    core.device.keep_freed_memory()
    cfg = ModelConfig(kind="decoder", d_model=256, n_heads=4, n_kv_heads=2, d_ff=1024, n_layers=2, max_len=4096,
                      positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False)
    model = core.load_model("random", device="cpu", config=cfg, seed=3)
    cfg = model.config  # the loaded model's: its vocabulary's size filled in
    model.max_new_tokens = 16
    from core import analysis
    from core import head_maps as hm
    from core.analysis import input_attribution as A
    from viz.ui import prefix_check as pc

    from core.analysis.surprisal import surprisal

    T = model.max_new_tokens

    def steps_of(n):
        return model.steps(text(n))

    def pattern(tr):
        return analysis.pattern_attribution(tr, "decoder", 1, 1)

    def maps(tr):
        lm = hm.LayerMaps(tr, "decoder", 1)
        return [lm.pooled(h, "weights", 128) for h in range(lm.n_heads)], hm.layer_summary(tr, "decoder", 1, 128)

    def step_check(n):
        steps = steps_of(n)
        view = steps[-1]
        rows = len(view.meta["target_ids"])

        def run():
            alone = model.trace_decoder_input(text(n), view.meta["target_ids"])
            return pc.prefix_difference(view, alone)
        return vg.prefix_check_bytes(cfg, rows, rows), run, steps

    def long_check(n):
        """A long prefix's check: its maps a head and a tile of rows at a time (core.head_maps.long_layer),
        at this length too (LONG_LAYER_BYTES 0), as at thousands of tokens."""
        hm.LONG_LAYER_BYTES = 0
        try:
            estimate, run, steps = step_check(n)
        finally:
            hm.LONG_LAYER_BYTES = long_bytes

        def tiled():
            hm.LONG_LAYER_BYTES = 0
            try:
                return run()
            finally:
                hm.LONG_LAYER_BYTES = long_bytes
        return estimate, tiled, steps

    long_bytes = hm.LONG_LAYER_BYTES

    def generation_check(n):
        steps = steps_of(n)
        shown = [int(s.meta["chosen_id"]) for s in steps]
        return (vg.generation_check_bytes(cfg, len(model.encode(text(n)).ids), len(shown)),
                lambda: pc.generation_difference(model, text(n), shown), steps)

    def on_trace(estimate, fn):
        def make(n):
            tr = model.trace(text(n))  # the trace the page holds: made before, not the job's
            return estimate(n), lambda: fn(tr), tr
        return make

    def patching(n):
        """A grid of one patched run a position a layer, at PATCH_N tokens: its batches hold BATCH_TOKENS
        positions there as at 512, in a sixteenth of the runs."""
        return vg.patching_bytes(cfg, n, n), lambda: analysis.patch(
            model, text(n), text(n).replace("dog", "cat"), WORDS[1], WORDS[2], what="resid_pre"), None

    rows = max(1, min(16, A.BATCH_TOKENS // N))  # integrated gradients' steps a batch, as the Attribution page runs them
    jobs = {
        "trace": lambda n: (vg.trace_bytes(cfg, n), lambda: model.trace(text(n)), None),
        "steps": lambda n: (vg.steps_bytes(cfg, n, T), lambda: steps_of(n), None),
        "pattern attribution": on_trace(lambda n: vg.pattern_bytes(cfg, n, 1), pattern),
        "maps": on_trace(lambda n: vg.maps_bytes(cfg, n), maps),
        "surprisal": on_trace(lambda n: vg.surprisal_bytes(cfg, n), surprisal),
        "step check": step_check,
        "step check, long": long_check,
        "KV-cache check": generation_check,
        "attribution": lambda n: (vg.batch_bytes(cfg, rows * n, grad=True, n_keys=n),
                                  lambda: A.attribute_setup(A.setup(model, text(n)), ["integrated_gradients"], rows),
                                  None),
        "kv cache policy": lambda n: (2 * vg.trace_bytes(cfg, n), lambda: analysis.evict(model, text(n), "window", 64),
                                      None),
        "patching": lambda n: patching(min(n, PATCH_N)),
    }
    only = set(sys.argv[1:])
    for name, make in jobs.items():
        if only and name not in only:
            continue
        make(32)[1]()  # warm-up on a short input
        estimate, run, keep = make(N)
        measured = measure(run)
        del keep
        print(json.dumps({"job": name, "estimate": int(estimate), "measured": int(measured)}), flush=True)


if __name__ == "__main__":
    main()
