"""The logit lens and direct logit attribution on smollm2, against one traced pass of the prompt.

    python -m bench.bench_lens [--tokens 512,2048] [--json]   # every part, each in a fresh process
    python -m bench.bench_lens --part speed --tokens 128      # one part

Targets (one repetition each; the machine is shared, CPU time with one torch thread):
  - the lens of 31 layers x 32 positions (the default: the last 32) <= 0.5x one traced pass of
    the prompt, judged at the longest --tokens (2,048, the long input the default is for); the
    shorter ones and the indirect-object prompt (14 tokens) are reported as info;
  - the lens of every position at 2,048 tokens: peak resident memory above the loaded model
    and its trace <= +1 GiB;
  - direct logit attribution of every head at the last position <= 0.1x one traced pass of
    the prompt, judged at the same length; the others as info.

The lens costs 31 unembeddings (576 x 49,152) per position, about 6.5 times what one pass
costs per position (30 layers of 4.4 M multiply-adds plus one unembedding), so against a pass
of a prompt of n tokens its 32 positions cost about 6.5 x 32 / n of it, and more in practice
(the float64 softmax the lens needs for 1e-4 on KL of 100+ nats). The attribution reads every MLP's weights once (each run again at
one position) while a pass reads every weight once for all its positions: at a short prompt,
where a pass is bound by reading the weights, the two cost alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.common import ROOT, Result, status_kib
from bench.common import smol_ids, trace_from_ids

IOI = "When Mary and John went to the store, John gave a drink to"
LENS_TARGET, MEMORY_TARGET_GIB, ATTRIBUTION_TARGET = 0.5, 1.0, 0.1


def _cpu(fn):
    c = time.process_time()
    out = fn()
    return time.process_time() - c, out


def part_speed(lengths) -> dict:
    import torch

    import core
    import core.analysis as ca

    model = core.load_model("smollm2", device="cpu")
    ca.lens(model.trace(IOI), target=" Mary")  # first-call costs (the display-string index) out of the timings
    out = {"rows": []}
    for n in [None] + list(lengths):  # None: the indirect-object prompt
        if n is None:
            make = lambda: model.trace(IOI)  # noqa: E731
        else:
            ids = smol_ids(model, n)
            make = lambda ids=ids: trace_from_ids(model, ids, model.target_strings(ids))  # noqa: E731
        traced_s, tr = _cpu(make)
        lens_s, df = _cpu(lambda: ca.lens(tr))
        attr_s, _ = _cpu(lambda: ca.logit_attribution(tr, int(tr["topk.ids"][-1, 0]),
                                                      baseline=int(tr["topk.ids"][-1, 1])))
        out["rows"].append({"tokens": len(tr["embed.decoder.sum"]), "ioi": n is None, "traced_s": traced_s,
                            "lens_s": lens_s, "lens_cells": [int(df.layer.nunique()), int(df.position.nunique())],
                            "attribution_s": attr_s})
        tr = df = None  # the next length starts with only the model in memory
    out["threads"] = torch.get_num_threads()
    return out


def part_memory(n: int = 2048) -> dict:
    import torch

    import core
    import core.analysis as ca

    model = core.load_model("smollm2", device="cpu")
    ids = smol_ids(model, n)
    tr = trace_from_ids(model, ids, model.target_strings(ids))
    ca.lens(model.trace(IOI), positions=[-1])  # allocator and first-call costs
    base = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current one
    t = time.process_time()
    df = ca.lens(tr, positions=range(n))
    lens_s = time.process_time() - t
    peak = status_kib("VmHWM")
    return {"tokens": n, "rows": len(df), "loaded_and_trace_rss_mib": base / 1024,
            "peak_above_mib": (peak - base) / 1024, "lens_cpu_s": lens_s, "trace_stored_mib": tr.nbytes() / 2**20,
            "threads": torch.get_num_threads()}


def _in_process(part: str, args: list) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_lens", "--part", part, *args, "--json"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"bench_lens --part {part} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(lengths=(512, 2048), memory_tokens: int = 2048) -> dict:
    s = _in_process("speed", ["--tokens", ",".join(map(str, lengths))])
    m = _in_process("memory", ["--tokens", str(memory_tokens)])
    th = f"torch threads {s['threads']}; one repetition"
    judged = max((r for r in s["rows"] if not r["ioi"]), key=lambda r: r["tokens"])
    results = []
    for r in s["rows"]:
        what = f"the {r['tokens']}-token " + ("indirect-object prompt" if r["ioi"] else "prompt")
        target = r is judged
        results.append(Result(
            "lens", f"smollm2 logit lens, {r['lens_cells'][0]} layers x {r['lens_cells'][1]} positions / one traced "
                    f"pass of {what}", r["lens_s"] / r["traced_s"], "x", LENS_TARGET if target else None,
            note=f"lens {r['lens_s']:.2f} s, traced pass {r['traced_s']:.2f} s CPU; {th}"
                 + ("" if target else "; a lens position costs ~6.5 pass positions (31 unembeddings of 49,152 tokens)")))
    results.append(Result(
        "lens", f"smollm2 logit lens of all {m['tokens']} positions: peak memory above the loaded model and its trace",
        m["peak_above_mib"] / 1024, "GiB", MEMORY_TARGET_GIB,
        note=f"{m['rows']:,} rows in {m['lens_cpu_s']:.0f} s CPU; the trace stores {m['trace_stored_mib']:.0f} MiB; "
             f"torch threads {m['threads']}"))
    for r in s["rows"]:
        what = f"the {r['tokens']}-token " + ("indirect-object prompt" if r["ioi"] else "prompt")
        target = r is judged
        results.append(Result(
            "lens", f"smollm2 direct logit attribution of every head at one position / one traced pass of {what}",
            r["attribution_s"] / r["traced_s"], "x", ATTRIBUTION_TARGET if target else None,
            note=f"{r['attribution_s'] * 1000:.0f} ms vs {r['traced_s'] * 1000:.0f} ms CPU; {th}"
                 + ("" if target or not r["ioi"] else "; both read every MLP weight once")))
    return {"results": [r.to_dict() for r in results], "details": {"speed": s, "memory": m}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048", help="prompt lengths of the speed part, comma-separated (memory: "
                                                         "one length, 2048)")
    ap.add_argument("--part", choices=["speed", "memory"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import core.device

    core.device.configure_threads(1)  # $ATTENTION_LAB_THREADS, else 1: as the app runs
    if args.part:
        lengths = [int(t) for t in str(args.tokens).split(",")]
        out = part_speed(lengths) if args.part == "speed" else part_memory(lengths[-1])
        print(json.dumps(out))
        return
    res = run([int(t) for t in str(args.tokens).split(",")])
    if args.json:
        print(json.dumps(res, default=str))
        return
    for r in res["results"]:
        v = "—" if r["value"] is None else f"{r['value']:.3g} {r['unit']}"
        tgt = "" if r["target"] is None else f" (target <= {r['target']})"
        print(f"[{r['status']}] {r['name']}: {v}{tgt}\n    {r['note']}")


if __name__ == "__main__":
    main()
