"""Long inputs: what a trace costs now that it stores the residual stream and recomputes a
layer's inside when it is read (core/trace.py).

    python -m bench.trace_bench [--quick] [--json] [--part minilm|smollm2|memory]

Each part runs in its own process (peak memory is per process). Figures, all from one run:

minilm (128 and 512 tokens, alternating rounds, medians of process CPU time):
    ours trace (ids)   the Trace from token ids (the traced fast pass, storing O(n d))
    ours trace (text)  model.trace(text) as a user calls it, tokenizing included
    hf sdpa            transformers' BertModel (sdpa), no attentions returned
  (neither computes an attention map: the trace computes them when they are read) and the
  bytes the 512-token trace stores.
smollm2 at 2,048 tokens (the tokenizer's maximum), from the same ids:
    traced pass / our untraced forward (model.net) -- target <= 1.15x
    stored trace bytes -- target <= 400 MiB
    one layer's maps on first access / the untraced forward -- target <= 0.25x
    the 270-map model view (every layer pooled, layer by layer) / one traced pass -- <= 1.5x
memory (smollm2, a fresh process): peak resident memory during the traced pass above the
    loaded model (VmHWM reset through /proc/self/clear_refs after loading) -- <= 2.5 GiB.

Every part sets torch's intra-op threads with core.device.configure_threads ($ATTENTION_LAB_THREADS,
default 1, as in the app) and reports the count it ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench.common import (ROOT, Result, alternate, machine_info, median, smol_ids, status_kib, text_of,
                          trace_from_ids)

MIB = 2**20


def part_minilm(rounds: int) -> dict:
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    import core

    hf_logging.set_verbosity_error()
    model = core.load_model("minilm", device="cpu")
    folder = str(core.loaders.minilm.model_dir())
    sdpa = BertModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    rows = []
    for n in (128, 512):
        enc = model.tokenizer.encode(text_of(model, n))
        ids, toks = list(enc.ids), list(enc.tokens)
        t_ids = torch.tensor([ids])
        text = text_of(model, n)
        fns = {"ours trace (ids)": lambda: trace_from_ids(model, ids, toks),
               "ours trace (text)": lambda: model.trace(text),
               "hf sdpa": lambda: sdpa(t_ids)}
        with torch.inference_mode():
            t = alternate(fns, rounds, warmup=2)
        tr = trace_from_ids(model, ids, toks)
        rows.append({"tokens": n, "cpu_ms": {k: median(v["cpu"]) * 1000 for k, v in t.items()},
                     "wall_ms": {k: median(v["wall"]) * 1000 for k, v in t.items()},
                     "trace_vs_sdpa": median(t["ours trace (ids)"]["cpu"]) / median(t["hf sdpa"]["cpu"]),
                     "text_trace_vs_sdpa": median(t["ours trace (text)"]["cpu"]) / median(t["hf sdpa"]["cpu"]),
                     "stored_bytes": tr.nbytes()})
    return {"rows": rows, "threads": torch.get_num_threads()}


def part_smollm2(rounds: int, n: int = 2048) -> dict:
    import time

    import torch

    import core
    from viz.figures.model_view import pooled_layers

    model = core.load_model("smollm2", device="cpu")
    ids = smol_ids(model, n)
    t_ids = torch.tensor([ids])
    toks = model.target_strings(ids)
    fns = {"untraced forward": lambda: model.net(None, t_ids),
           "traced pass": lambda: trace_from_ids(model, ids, toks)}
    with torch.inference_mode():
        t = alternate(fns, rounds, warmup=1)
    fwd, traced = median(t["untraced forward"]["cpu"]), median(t["traced pass"]["cpu"])
    layer_s, view_s = [], []
    for _ in range(rounds):
        tr = trace_from_ids(model, ids, toks)
        c = time.process_time()
        tr["decoder.15.self_attn.weights"]
        layer_s.append(time.process_time() - c)
        tr = trace_from_ids(model, ids, toks)
        c = time.process_time()
        pooled_layers(tr, "decoder", "self_attn", list(range(tr.layers("decoder"))))
        view_s.append(time.process_time() - c)
    return {"tokens": n, "forward_cpu_s": fwd, "traced_cpu_s": traced, "traced_vs_forward": traced / fwd,
            "stored_bytes": tr.nbytes(), "layer_first_access_cpu_s": median(layer_s),
            "layer_vs_forward": median(layer_s) / fwd, "model_view_cpu_s": median(view_s),
            "model_view_vs_traced": median(view_s) / traced, "threads": torch.get_num_threads(),
            "maps": tr.layers("decoder") * model.config.n_heads}


def part_memory(n: int = 2048) -> dict:
    import torch

    import core

    model = core.load_model("smollm2", device="cpu")
    ids = smol_ids(model, n)
    toks = model.target_strings(ids)
    with torch.inference_mode():
        model.net(None, torch.tensor([ids[:16]]))  # allocator warmed on a short input
    loaded = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set, to the current one
    tr = trace_from_ids(model, ids, toks)
    peak = status_kib("VmHWM")
    return {"tokens": n, "loaded_rss_mib": loaded / 1024, "peak_above_loaded_mib": (peak - loaded) / 1024,
            "stored_mib": tr.nbytes() / MIB, "threads": torch.get_num_threads()}


def _in_process(part: str, quick: bool) -> dict:
    cmd = [sys.executable, "-m", "bench.trace_bench", "--part", part, "--json"] + (["--quick"] if quick else [])
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"trace_bench --part {part} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict:
    """Every part, each in a fresh process; the results as Result rows plus the raw figures."""
    import core

    details, results = {}, []
    details["minilm"] = m = _in_process("minilm", quick)
    for r in m["rows"]:
        results.append(Result("long inputs", f"minilm trace from ids, maps on demand (none read) / transformers sdpa "
                                             f"without attentions, {r['tokens']} tokens (CPU-time medians)",
                              r["trace_vs_sdpa"], "x", 1.05,
                              note=f"ours {r['cpu_ms']['ours trace (ids)']:.1f} ms, sdpa {r['cpu_ms']['hf sdpa']:.1f} ms "
                                   f"CPU; neither computes an attention map; torch threads {m['threads']}"))
    r512 = m["rows"][-1]
    results.append(Result("long inputs", "minilm model.trace(text), tokenizing included / transformers sdpa without "
                                         "attentions on the same ids, 512 tokens (CPU-time medians)",
                          r512["text_trace_vs_sdpa"], "x", 1.05,
                          note=f"ours {r512['cpu_ms']['ours trace (text)']:.1f} ms, from ids "
                               f"{r512['cpu_ms']['ours trace (ids)']:.1f} ms, sdpa {r512['cpu_ms']['hf sdpa']:.1f} ms "
                               f"CPU; torch threads {m['threads']}"))
    results.append(Result("long inputs", "minilm stored trace at 512 tokens", r512["stored_bytes"] / MIB, "MiB", 32,
                          note="what the trace keeps alive (Trace.nbytes) before any map is read"))
    if core.MODELS["smollm2"].available():
        details["smollm2"] = s = _in_process("smollm2", quick)
        results += [
            Result("long inputs", f"smollm2 traced pass / untraced forward, {s['tokens']} tokens",
                   s["traced_vs_forward"], "x", 1.15,
                   note=f"traced {s['traced_cpu_s']:.2f} s CPU, forward {s['forward_cpu_s']:.2f} s CPU; torch threads "
                        f"{s['threads']}"),
            Result("long inputs", f"smollm2 stored trace at {s['tokens']} tokens", s["stored_bytes"] / MIB, "MiB", 400,
                   note="what the trace keeps alive (Trace.nbytes) before any map is read"),
            Result("long inputs", "smollm2 one layer's maps on first access / the untraced forward",
                   s["layer_vs_forward"], "x", 0.25,
                   note=f"{s['layer_first_access_cpu_s']:.2f} s CPU (layer 15); torch threads {s['threads']}"),
            Result("long inputs", f"smollm2 model view ({s['maps']} maps, pooled layer by layer) / one traced pass",
                   s["model_view_vs_traced"], "x", 1.5,
                   note=f"{s['model_view_cpu_s']:.2f} s CPU; torch threads {s['threads']}"),
        ]
        details["memory"] = mm = _in_process("memory", quick)
        results.append(Result("long inputs", f"smollm2 peak process memory during a {mm['tokens']}-token traced pass, "
                                             "above the loaded model", mm["peak_above_loaded_mib"] / 1024, "GiB", 2.5,
                              note=f"loaded model {mm['loaded_rss_mib']:.0f} MiB resident; "
                                   f"trace stores {mm['stored_mib']:.0f} MiB; torch threads {mm['threads']}"))
    return {"results": [r.to_dict() for r in results], "details": details}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--part", choices=["minilm", "smollm2", "memory"])
    args = ap.parse_args(argv)
    import core.device

    core.device.configure_threads(1)  # $ATTENTION_LAB_THREADS, else 1: as the app runs
    rounds = 3 if args.quick else 7
    if args.part:
        out = {"minilm": lambda: part_minilm(rounds * 2), "smollm2": lambda: part_smollm2(max(2, rounds // 2)),
               "memory": part_memory}[args.part]()
        print(json.dumps(out))
        return
    res = run(args.quick)
    if args.json:
        print(json.dumps(res, default=str))
        return
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, load {info['load_average']}, torch threads {info['torch_threads']}")
    for r in res["results"]:
        r = Result.from_dict(r)
        print(f"[{r.status:>6}] {r.name}: {r.value:.3f} {r.unit} (target <= {r.target}) -- {r.note}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
