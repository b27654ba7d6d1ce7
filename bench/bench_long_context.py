"""The model's own context: SmolLM2 at 8,000 tokens, and reads that compute only what they are asked for.

    python -m bench.bench_long_context [--quick] [--json] [--part minilm|smollm2|memory] [--tokens N]

Each part runs in its own process (peak memory is per process); torch threads as the app
(core.device.configure_threads: $ATTENTION_LAB_THREADS, default 1). Figures, all from one run:

minilm (128 and 512 tokens, alternating rounds, medians of process CPU time):
    ours: the trace from the token ids, then every layer's self-attention weights read
          through the public API, trace[f"encoder.{i}.self_attn.weights"] layer by layer
    hf:   transformers' BertModel, eager attention, output_attentions=True
    ratio ours / hf -- target <= 1.0x
smollm2 at 8,000 tokens (the notes' passage repeated; the same ids on both sides):
    traced pass / untraced forward (model.net) -- target <= 1.10x
    stored trace (Trace.nbytes) -- target <= 1.25 GiB
    trace.pooled of one head (layer 15, head 4) at size 128 / the traced pass -- <= 0.25x
    the 270-map model view pooled one head and a tile at a time (viz.figures.model_view.pooled_layers,
      every layer) / the traced pass -- <= 1.5x
memory (smollm2, a fresh process; VmHWM reset through /proc/self/clear_refs):
    peak resident memory during the 8,000-token traced pass above the loaded model -- <= 3 GiB
      (what glibc's heap holds free after the pass included, which varies from one run to the
      next of the same code: docs/decisions.md, "Measurements moved from the code")
    peak during trace.pooled of one head above the process before it -- <= 512 MiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.common import (ROOT, Result, alternate, machine_info, median, smol_ids, status_kib, text_of,
                          trace_from_ids)

MIB, GIB = 2**20, 2**30
TOKENS = 8000
LAYER, HEAD = 15, 4


def part_minilm(rounds: int) -> dict:
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    import core

    hf_logging.set_verbosity_error()
    model = core.load_model("minilm", device="cpu")
    eager = BertModel.from_pretrained(str(core.loaders.minilm.model_dir()), attn_implementation="eager").eval()
    rows = []
    for n in (128, 512):
        enc = model.tokenizer.encode(text_of(model, n))
        ids, toks = list(enc.ids), list(enc.tokens)
        t_ids = torch.tensor([ids])

        def ours():
            tr = trace_from_ids(model, ids, toks)
            return [tr[f"encoder.{i}.self_attn.weights"] for i in range(tr.layers("encoder"))]

        fns = {"ours trace + trace[weights]": ours, "hf eager+attn": lambda: eager(t_ids, output_attentions=True)}
        with torch.inference_mode():
            t = alternate(fns, rounds, warmup=2)
        a, b = median(t["ours trace + trace[weights]"]["cpu"]), median(t["hf eager+attn"]["cpu"])
        rows.append({"tokens": len(ids), "ours_ms": a * 1000, "hf_ms": b * 1000, "ratio": a / b})
    return {"rows": rows, "threads": torch.get_num_threads()}


def part_smollm2(rounds: int, n: int = TOKENS) -> dict:
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
        t = alternate(fns, rounds, warmup=0)
    fwd, traced = median(t["untraced forward"]["cpu"]), median(t["traced pass"]["cpu"])
    tr = trace_from_ids(model, ids, toks)
    c = time.process_time()
    p = tr.pooled(f"decoder.{LAYER}.self_attn.weights", size=128, heads=[HEAD])
    pooled_s = time.process_time() - c
    tr = trace_from_ids(model, ids, toks)
    c = time.process_time()
    pooled_layers(tr, "decoder", "self_attn", list(range(tr.layers("decoder"))))
    view_s = time.process_time() - c
    return {"tokens": len(ids), "forward_cpu_s": fwd, "traced_cpu_s": traced, "traced_vs_forward": traced / fwd,
            "forward_wall_s": median(t["untraced forward"]["wall"]), "traced_wall_s": median(t["traced pass"]["wall"]),
            "stored_bytes": tr.nbytes(), "pooled_cpu_s": pooled_s, "pooled_vs_traced": pooled_s / traced,
            "pooled_shape": list(p.shape), "model_view_cpu_s": view_s, "model_view_vs_traced": view_s / traced,
            "maps": tr.layers("decoder") * model.config.n_heads, "threads": torch.get_num_threads()}


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM, the peak resident set, back to the current one


def heap_free_mib() -> float:
    """What glibc's main heap holds free (mallinfo2's fordblks; resident where it was touched),
    in MiB; -1 where there is no mallinfo2."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return -1.0
    fn.restype = MallInfo2
    return fn().fordblks / MIB


def part_memory(n: int = TOKENS) -> dict:
    import torch

    import core

    model = core.load_model("smollm2", device="cpu")
    ids = smol_ids(model, n)
    toks = model.target_strings(ids)
    with torch.inference_mode():
        model.net(None, torch.tensor([ids[:16]]))  # allocator warmed on a short input
    loaded = status_kib("VmRSS")
    _reset_peak()
    tr = trace_from_ids(model, ids, toks)
    peak_pass = status_kib("VmHWM")
    before = status_kib("VmRSS")
    heap_free = heap_free_mib()
    _reset_peak()
    tr.pooled(f"decoder.{LAYER}.self_attn.weights", size=128, heads=[HEAD])
    peak_pooled = status_kib("VmHWM")
    return {"tokens": len(ids), "loaded_rss_mib": loaded / 1024, "peak_above_loaded_mib": (peak_pass - loaded) / 1024,
            "stored_mib": tr.nbytes() / MIB, "heap_free_after_mib": heap_free,
            "rss_after_above_loaded_mib": (before - loaded) / 1024, "pooled_peak_above_mib": (peak_pooled - before) / 1024,
            "threads": torch.get_num_threads()}


def _in_process(part: str, quick: bool, tokens: int) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_long_context", "--part", part, "--json", "--tokens", str(tokens)]
    res = subprocess.run(cmd + (["--quick"] if quick else []), cwd=ROOT, capture_output=True, text=True, timeout=5400)
    if res.returncode != 0:
        raise RuntimeError(f"bench_long_context --part {part} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(quick: bool = False, tokens: int = TOKENS) -> dict:
    """Every part, each in a fresh process; the results as Result rows plus the raw figures."""
    import core

    details, results = {}, []
    details["minilm"] = m = _in_process("minilm", quick, tokens)
    for r in m["rows"]:
        results.append(Result("long inputs", f"minilm trace + every layer's weights through trace[name] / transformers "
                                             f"eager + output_attentions, {r['tokens']} tokens (CPU-time medians)",
                              r["ratio"], "x", 1.0,
                              note=f"ours {r['ours_ms']:.1f} ms, eager {r['hf_ms']:.1f} ms CPU; torch threads "
                                   f"{m['threads']}"))
    if core.MODELS["smollm2"].available():
        details["smollm2"] = s = _in_process("smollm2", quick, tokens)
        th = f"torch threads {s['threads']}"
        results += [
            Result("long inputs", f"smollm2 traced pass / untraced forward, {s['tokens']} tokens", s["traced_vs_forward"],
                   "x", 1.10, note=f"traced {s['traced_cpu_s']:.1f} s CPU ({s['traced_wall_s']:.1f} s wall), forward "
                                   f"{s['forward_cpu_s']:.1f} s CPU; {th}"),
            Result("long inputs", f"smollm2 stored trace at {s['tokens']} tokens", s["stored_bytes"] / GIB, "GiB", 1.25,
                   note="what the trace keeps alive (Trace.nbytes) before any map is read"),
            Result("long inputs", f"smollm2 trace.pooled of one head (layer {LAYER}, size 128) / the traced pass",
                   s["pooled_vs_traced"], "x", 0.25, note=f"{s['pooled_cpu_s']:.2f} s CPU; {th}"),
            Result("long inputs", f"smollm2 model view ({s['maps']} maps pooled one head and a tile at a time) / the "
                                  "traced pass", s["model_view_vs_traced"], "x", 1.5,
                   note=f"{s['model_view_cpu_s']:.1f} s CPU; {th}"),
        ]
        details["memory"] = mm = _in_process("memory", quick, tokens)
        results += [
            Result("long inputs", f"smollm2 peak process memory during a {mm['tokens']}-token traced pass, above the "
                                  "loaded model", mm["peak_above_loaded_mib"] / 1024, "GiB", 3.0,
                   note=f"loaded model {mm['loaded_rss_mib']:.0f} MiB resident; trace stores {mm['stored_mib']:.0f} MiB; "
                        f"the heap holds {mm.get('heap_free_after_mib', -1):.0f} MiB free after the pass "
                        "(freed buffers between stored ones)"),
            Result("long inputs", f"smollm2 peak memory during trace.pooled of one head at {mm['tokens']} tokens, above "
                                  "the process before it", mm["pooled_peak_above_mib"], "MiB", 512,
                   note="one head's map would be 244 MiB, the layer's nine 2.1 GiB"),
        ]
    return {"results": [r.to_dict() for r in results], "details": details}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--part", choices=["minilm", "smollm2", "memory"])
    ap.add_argument("--tokens", type=int, default=TOKENS)
    args = ap.parse_args(argv)
    import core.device

    core.device.configure_threads(1)  # $ATTENTION_LAB_THREADS, else 1: as the app runs
    if args.part:
        out = {"minilm": lambda: part_minilm(5 if args.quick else 11),
               "smollm2": lambda: part_smollm2(1 if args.quick else 2, args.tokens),
               "memory": lambda: part_memory(args.tokens)}[args.part]()
        print(json.dumps(out))
        return
    res = run(args.quick, args.tokens)
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
