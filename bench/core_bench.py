"""Core benchmark: minilm in our core against transformers' BertModel, timed alternately.

    python -m bench.core_bench [--config after|glibc] [--rounds 15]
                               [--lengths 16,128,512] [--device cpu|cuda] [--json]

At each length, one round runs each of these once, round after round:
    ours trace      model.trace(text): tokenize + traced forward (every name of docs/design.md) + Trace
    ours trace (ids) the same Trace from the token ids (what transformers is given): traced
                    forward + Trace, without tokenizing or the text-side metadata
    hf eager+attn   BertModel(attn_implementation="eager")(ids, output_attentions=True)
    ours plain      model.net(ids): tracing off (fused attention)
    hf sdpa         BertModel(attn_implementation="sdpa")(ids)
All but `ours trace` get the same token ids. Reported: medians of wall time and of process
CPU time, and the ratios ours / theirs (ratio of the medians, and the median of the
per-round ratios).

Configurations (one process each: glibc's malloc settings cannot be undone in-process):
    glibc     glibc's malloc defaults
    after     core.device.keep_freed_memory(): what the app runs

On CUDA (--device cuda, or by default when a GPU is present) everything runs there; wall
times are taken after torch.cuda.synchronize() and the trace's meta records the device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.common import ROOT, alternate, machine_info, median, paired_ratio, text_of  # noqa: F401

CONFIGS = ("glibc", "after")


def run(config: str = "after", rounds: int = 15, lengths=(16, 128, 512), device=None, threads: int = 1) -> dict:
    import core
    import core.api
    import core.device
    kept = core.device.keep_freed_memory() if config == "after" else False
    os.environ.setdefault("ATTENTION_LAB_THREADS", str(threads))
    core.device.configure_threads(threads)
    import torch

    dev = core.pick_device(device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    model = core.load_model("minilm", device=dev)

    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    folder = str(core.minilm.model_dir())
    eager = BertModel.from_pretrained(folder, attn_implementation="eager").eval().to(dev)
    sdpa = BertModel.from_pretrained(folder, attn_implementation="sdpa").eval().to(dev)

    rows = []
    for n in lengths:
        text = text_of(model, n)
        ids = torch.tensor([model.tokenizer.encode(text).ids], device=dev)
        id_list = ids[0].tolist()
        toks = model.tokenizer.encode(text).tokens

        def trace_from_ids():  # the same Trace as model.trace, from the same ids transformers gets
            tensors, _, runner = model._run_traced(id_list, None, None)
            return model._finish(tensors, {"source": toks}, {"model": model.name, "device": str(dev)}, runner)

        fns = {
            "ours trace": lambda: model.trace(text),
            "ours trace (ids)": trace_from_ids,
            "hf eager+attn": lambda: eager(ids, output_attentions=True),
            "ours plain": lambda: model.net(ids),
            "hf sdpa": lambda: sdpa(ids),
        }
        with torch.inference_mode():
            t = alternate(fns, rounds, warmup=2, sync=sync)
        tr = model.trace(text)
        with torch.inference_mode():
            ref = eager(ids, output_attentions=True)
        att_err = max((tr[f"encoder.{i}.self_attn.weights"] - ref.attentions[i][0].float().cpu()).abs().max().item()
                      for i in range(6))
        row = {
            "tokens": n,
            "median_ms": {k: median(v["wall"]) * 1000 for k, v in t.items()},
            "min_ms": {k: min(v["wall"]) * 1000 for k, v in t.items()},
            "cpu_median_ms": {k: median(v["cpu"]) * 1000 for k, v in t.items()},
            "trace_vs_eager": median(t["ours trace"]["wall"]) / median(t["hf eager+attn"]["wall"]),
            "trace_vs_eager_paired": paired_ratio(t["ours trace"]["wall"], t["hf eager+attn"]["wall"]),
            "trace_vs_eager_cpu": median(t["ours trace"]["cpu"]) / median(t["hf eager+attn"]["cpu"]),
            "ids_vs_eager": median(t["ours trace (ids)"]["wall"]) / median(t["hf eager+attn"]["wall"]),
            "ids_vs_eager_paired": paired_ratio(t["ours trace (ids)"]["wall"], t["hf eager+attn"]["wall"]),
            "ids_vs_eager_cpu": median(t["ours trace (ids)"]["cpu"]) / median(t["hf eager+attn"]["cpu"]),
            "plain_vs_sdpa": median(t["ours plain"]["wall"]) / median(t["hf sdpa"]["wall"]),
            "plain_vs_sdpa_paired": paired_ratio(t["ours plain"]["wall"], t["hf sdpa"]["wall"]),
            "plain_vs_sdpa_cpu": median(t["ours plain"]["cpu"]) / median(t["hf sdpa"]["cpu"]),
            "trace_bytes": tr.nbytes(),
            "trace_device": tr.meta["device"],
            "trace_device_name": tr.meta["device_name"],
            "max_abs_diff_weights_vs_hf": att_err,
        }
        rows.append(row)
        del tr, ref
    return {"config": config, "rounds": rounds, "keep_freed_memory": kept, "device": str(dev),
            "device_name": core.device_name(dev), "threads": torch.get_num_threads(),
            "load_average_start": os.getloadavg()[0], "rows": rows}


def run_in_subprocess(config: str, rounds: int, lengths, device=None, timeout: float = 3600) -> dict:
    """run() in a fresh interpreter (malloc settings and recording are per process)."""
    import subprocess

    cmd = [sys.executable, "-m", "bench.core_bench", "--config", config, "--rounds", str(rounds),
           "--lengths", ",".join(str(n) for n in lengths), "--json"]
    if device:
        cmd += ["--device", device]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"core_bench --config {config} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def format_table(res: dict) -> str:
    names = ["ours trace", "ours trace (ids)", "hf eager+attn", "ours plain", "hf sdpa"]
    lines = [f"config {res['config']}: device {res['device_name']}, threads {res['threads']}, "
             f"{res['rounds']} alternating rounds, keep_freed_memory={res['keep_freed_memory']}",
             "tokens  " + "  ".join(f"{k:>22}" for k in names) + "   trace/eager  ids/eager  plain/sdpa   trace MiB",
             "        " + "  ".join(f"{'wall ms [cpu ms]':>22}" for _ in names)]
    for r in res["rows"]:
        cells = "  ".join(f"{r['median_ms'][k]:>12.1f} [{r['cpu_median_ms'][k]:>7.1f}]" for k in names)
        lines.append(f"{r['tokens']:>6}  {cells}   {r['trace_vs_eager']:>5.2f} ({r['trace_vs_eager_cpu']:.2f})"
                     f"  {r.get('ids_vs_eager', float('nan')):>5.2f} ({r.get('ids_vs_eager_cpu', float('nan')):.2f})"
                     f"  {r['plain_vs_sdpa']:>5.2f} ({r['plain_vs_sdpa_cpu']:.2f})  {r['trace_bytes'] / 2**20:>9.1f}")
    lines.append("ratios: wall medians (CPU medians)")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="after", choices=CONFIGS)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--lengths", default="16,128,512")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", action="store_true", help="print one JSON line (for run_all)")
    args = ap.parse_args(argv)
    res = run(args.config, args.rounds, tuple(int(x) for x in args.lengths.split(",")), args.device)
    if args.json:
        print(json.dumps(res))
    else:
        info = machine_info()
        print(f"{info['cpu']}, {info['cores']} cores, load {info['load_average']}, torch {info['torch']}, "
              f"transformers {info['transformers']}")
        print(format_table(res))


if __name__ == "__main__":
    main()
