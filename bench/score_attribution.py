"""Score attribution's cost on smollm2, as ratios to a traced pass of the same text:

    python -m bench.score_attribution [--cell-tokens 2048] [--pattern-tokens 512] [--json]

- one cell's decomposition (core.analysis.score_attribution: the last query, an early key)
  at 2,048 tokens / a traced pass of those 2,048 tokens (target <= 0.1x);
- one head's pattern attribution (core.analysis.pattern_attribution, every component pair,
  group="component") at 512 tokens / a traced pass of those 512 tokens (target <= 1x);
- the peak resident memory added by each (VmHWM, reset once the trace is made, in a child process that does only that,
  beyond the trace it starts from), and the bytes of the largest projected stack the pattern
  holds (components x n x d_k, float64).
Each timing is the best of --reps, the traced pass and the attribution alternated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Result, smol_ids, trace_from_ids  # noqa: E402

TARGETS = {"cell": 0.1, "pattern": 1.0}
LAYER, HEAD = 15, 4


def _hwm_mib() -> float:
    """The process's peak resident memory since the last reset (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak(what: str, n: int, threads) -> float:
    """MiB that `what` (cell / pattern) adds to the peak RSS, in a child process of its own."""
    import subprocess

    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import bench.score_attribution as b; "
            f"b._child({what!r}, {n}, {threads!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return float("nan")


def _child(what: str, n: int, threads=None) -> None:
    import torch

    import core
    import core.analysis as ca

    if threads:
        torch.set_num_threads(threads)

    model = core.load_model("smollm2", device="cpu")
    ids = smol_ids(model, n)
    tr = trace_from_ids(model, ids, [str(i) for i in ids])
    with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current RSS
        f.write("5")
    before = _hwm_mib()
    if what == "cell":
        ca.score_attribution(tr, "decoder", LAYER, HEAD, n - 1, 3)
    else:
        ca.pattern_attribution(tr, "decoder", LAYER, HEAD)
    print(_hwm_mib() - before)


def main(argv=None) -> int:
    import core
    import core.analysis as ca

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell-tokens", type=int, default=2048)
    ap.add_argument("--pattern-tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-memory", action="store_true", help="skip the child processes that measure peak memory")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: the app's choice); 1 on a machine shared with other work")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    core.device.configure_threads()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model = core.load_model("smollm2", device="cpu")
    out = sys.stderr if args.json else sys.stdout

    def traced(ids):
        return trace_from_ids(model, ids, [str(i) for i in ids])

    def best(fns):
        times = {k: float("inf") for k in fns}
        for _ in range(args.reps):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[k] = min(times[k], time.perf_counter() - t0)
        return times

    rows = []
    n = args.cell_tokens
    ids = smol_ids(model, n)
    tr = traced(ids)
    ca.score_attribution(tr, "decoder", LAYER, HEAD, n - 1, 3)  # warm-up
    t = best({"trace": lambda: traced(ids),
              # a fresh trace each time would time the trace too: the cell reads no cached layer
              "cell": lambda: ca.score_attribution(tr, "decoder", LAYER, HEAD, n - 1, 3)})
    df = ca.score_attribution(tr, "decoder", LAYER, HEAD, n - 1, 3)
    rows.append(Result("score attribution", f"one cell, smollm2 L{LAYER}H{HEAD}, {n} tokens / a traced pass",
                       t["cell"] / t["trace"], "x", TARGETS["cell"],
                       note=f"cell {t['cell']:.3f} s, traced pass {t['trace']:.2f} s; {len(df)} terms; "
                            f"|sum - score| {abs(df.attrs['sum'] - df.attrs['score']):.1e}"))
    del tr
    n = args.pattern_tokens
    ids = smol_ids(model, n)
    tr = traced(ids)
    ca.pattern_attribution(tr, "decoder", LAYER, HEAD)
    t = best({"trace": lambda: traced(ids), "pattern": lambda: ca.pattern_attribution(tr, "decoder", LAYER, HEAD)})
    pa = ca.pattern_attribution(tr, "decoder", LAYER, HEAD)
    comps = int(len(pa) ** 0.5)
    stack_mib = comps * n * model.config.d_head * 8 / 2**20
    rows.append(Result("score attribution", f"pattern attribution, smollm2 L{LAYER}H{HEAD}, {n} tokens / a traced pass",
                       t["pattern"] / t["trace"], "x", TARGETS["pattern"],
                       note=f"pattern {t['pattern']:.3f} s, traced pass {t['trace']:.2f} s; {comps} x {comps} "
                            f"components; one projected stack {stack_mib:.0f} MiB; |sum - score| "
                            f"{abs(pa.attrs['sum'] - pa.attrs['score']):.1e}"))
    if not args.no_memory:
        for what, k in (("cell", args.cell_tokens), ("pattern", args.pattern_tokens)):
            rows.append(Result("score attribution", f"{what}: peak memory added beyond its trace, {k} tokens",
                               _peak(what, k, args.threads), "MiB", None,
                               note="VmHWM after a reset, in a child process"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"score attribution bench (smollm2; {os.cpu_count()} CPUs, load average {load:.1f})", file=out)
    for r in rows:
        print(f"  {r.name}: {r.value:.3f} {r.unit} (target {r.target}) {r.status}  [{r.note}]", file=out)
    if args.json:
        print(json.dumps({"results": [r.to_dict() for r in rows]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
