"""Circuits' cost on smollm2, as ratios to a traced pass of the same text:

    python -m bench.circuits [--tokens 512] [--reps 1] [--threads N] [--json]

- a depth-2 circuit (core.analysis.head_circuit, top=5 per side, all three sides) of the induction
  head L18H6 at --tokens tokens / a traced pass of those tokens; the number of heads it expanded;
- one path patch (core.analysis.path_patch, L16H0 -> L18H6 on the key side) at --tokens tokens /
  a traced pass.
The text is a random sequence of --tokens // 2 ordinary tokens repeated twice (an induction
head's home). Each timing is the best of --reps, the traced pass and the analysis alternated.
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

from bench.common import Result, trace_from_ids  # noqa: E402

RECEIVER, SENDER = (18, 6), (16, 0)


def main(argv=None) -> int:
    import core
    import core.analysis as ca

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=1)
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
    r = args.tokens // 2
    ids, start = ca.repeated_sequence(model, r=r, seed=0)["decoder"]
    other = ca.repeated_sequence(model, r=r, seed=1)["decoder"][0]
    targets = [(i, i - r + 1) for i in range(start, start + r)]
    n = len(ids)

    def traced():
        return trace_from_ids(model, ids, [str(i) for i in ids])

    def best(fns):
        times = {k: float("inf") for k in fns}
        for _ in range(args.reps):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[k] = min(times[k], time.perf_counter() - t0)
        return times

    tr = traced()
    got = {}

    def circuit():
        got["edges"] = ca.head_circuit(tr, "decoder", *RECEIVER, depth=2, top=5)

    def patch():
        got["patch"] = ca.path_patch(model, ids, other, SENDER, RECEIVER, "key", targets=targets)

    t = best({"trace": traced, "circuit": circuit, "patch": patch})
    edges, pp = got["edges"], got["patch"]
    expanded = len(edges.attrs["checks"])
    rows = [
        Result("circuits", f"depth-2 circuit of L{RECEIVER[0]}H{RECEIVER[1]} (top 5 a side), smollm2, {n} tokens "
               "/ a traced pass", t["circuit"] / t["trace"], "x", None,
               note=f"circuit {t['circuit']:.1f} s for {expanded} heads ({t['circuit'] / expanded:.2f} s a head), "
                    f"traced pass {t['trace']:.2f} s; {len(edges)} edges"),
        Result("circuits", f"one path patch L{SENDER[0]}H{SENDER[1]} -> L{RECEIVER[0]}H{RECEIVER[1]} (key), smollm2, "
               f"{n} tokens / a traced pass", t["patch"] / t["trace"], "x", None,
               note=f"path patch {t['patch']:.2f} s, traced pass {t['trace']:.2f} s; induction score "
                    f"{pp.attrs['clean']:.3f} -> {pp.attrs['patched']:.3f}"),
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"circuits bench (smollm2; {os.cpu_count()} CPUs, load average {load:.1f})", file=out)
    for row in rows:
        print(f"  {row.name}: {row.value:.3f} {row.unit}  [{row.note}]", file=out)
    if args.json:
        print(json.dumps({"results": [row.to_dict() for row in rows], "load_average": load}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
