"""Core benchmark: minilm in our core against transformers' BertModel, timed alternately.

    python -m bench.core_bench [--config after|glibc] [--rounds 15]
                               [--lengths 16,128,512] [--device cpu|cuda] [--json]

At each length, one round runs each of these once, round after round:
    ours trace+maps  model.trace(text), then every layer's attention weights read through the
                     public API (trace.each_layer, all kept until the round ends): tokenize +
                     traced forward + every map, what the model view does
    ours ids+maps    the same from the token ids (what transformers is given): traced forward +
                     Trace + every map, without tokenizing or the text-side metadata
    hf eager+attn    BertModel(attn_implementation="eager")(ids, output_attentions=True): every map
    ours trace (ids) the Trace from the token ids alone: the traced fast pass, which stores
                     O(n d) and computes no attention map (maps are computed when read)
    hf sdpa          BertModel(attn_implementation="sdpa")(ids): no attention map either
    ours plain       model.net(ids): tracing off (fused attention)
All but `ours trace+maps` get the same token ids. Like for like: the two "+maps" rows against
hf eager+attn (every map materialised on both sides); `ours trace (ids)` and `ours plain`
against hf sdpa (no map on either side). Reported: medians of wall time and of process CPU
time, and the ratios ours / theirs (ratio of the medians, and the median of the per-round
ratios).

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
NAMES = ("ours trace+maps", "ours ids+maps", "hf eager+attn", "ours trace (ids)", "hf sdpa", "ours plain")


def every_map(trace) -> list:
    """Every layer's self-attention weights (H x n x n each), read through the public API
    (Trace.each_layer: one layer's re-run up to its softmax at a time) and all kept, as
    transformers' output_attentions keeps them: the maps the model view shows."""
    return [got["self_attn.weights"] for stack in trace.stacks() for got in trace.each_layer(stack)]


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
    folder = str(core.loaders.minilm.model_dir())
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
            "ours trace+maps": lambda: every_map(model.trace(text)),
            "ours ids+maps": lambda: every_map(trace_from_ids()),
            "hf eager+attn": lambda: eager(ids, output_attentions=True),
            "ours trace (ids)": trace_from_ids,
            "hf sdpa": lambda: sdpa(ids),
            "ours plain": lambda: model.net(ids),
        }
        with torch.inference_mode():
            t = alternate(fns, rounds, warmup=2, sync=sync)
        tr = model.trace(text)
        with torch.inference_mode():
            ref = eager(ids, output_attentions=True)
        maps = every_map(tr)  # what the timed "+maps" rows read, checked against transformers' maps
        assert len(maps) == len(ref.attentions), (len(maps), len(ref.attentions))
        att_err = max((m - r[0].float().cpu()).abs().max().item() for m, r in zip(maps, ref.attentions))
        ratio = lambda a, b, k="wall": median(t[a][k]) / median(t[b][k])  # noqa: E731
        row = {
            "tokens": n,
            "median_ms": {k: median(v["wall"]) * 1000 for k, v in t.items()},
            "min_ms": {k: min(v["wall"]) * 1000 for k, v in t.items()},
            "cpu_median_ms": {k: median(v["cpu"]) * 1000 for k, v in t.items()},
            # like for like, every map materialised on both sides
            "maps_vs_eager": ratio("ours trace+maps", "hf eager+attn"),
            "maps_vs_eager_paired": paired_ratio(t["ours trace+maps"]["wall"], t["hf eager+attn"]["wall"]),
            "maps_vs_eager_cpu": ratio("ours trace+maps", "hf eager+attn", "cpu"),
            "ids_maps_vs_eager": ratio("ours ids+maps", "hf eager+attn"),
            "ids_maps_vs_eager_paired": paired_ratio(t["ours ids+maps"]["wall"], t["hf eager+attn"]["wall"]),
            "ids_maps_vs_eager_cpu": ratio("ours ids+maps", "hf eager+attn", "cpu"),
            # like for like, no map on either side
            "trace_vs_sdpa": ratio("ours trace (ids)", "hf sdpa"),
            "trace_vs_sdpa_paired": paired_ratio(t["ours trace (ids)"]["wall"], t["hf sdpa"]["wall"]),
            "trace_vs_sdpa_cpu": ratio("ours trace (ids)", "hf sdpa", "cpu"),
            "plain_vs_sdpa": ratio("ours plain", "hf sdpa"),
            "plain_vs_sdpa_paired": paired_ratio(t["ours plain"]["wall"], t["hf sdpa"]["wall"]),
            "plain_vs_sdpa_cpu": ratio("ours plain", "hf sdpa", "cpu"),
            "trace_bytes": tr.nbytes(),
            "trace_device": tr.meta["device"],
            "trace_device_name": tr.meta["device_name"],
            "maps_read": len(maps),
            "max_abs_diff_weights_vs_hf": att_err,
        }
        rows.append(row)
        del tr, ref, maps
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
    ratios = [("trace+maps/eager", "maps_vs_eager"), ("ids+maps/eager", "ids_maps_vs_eager"),
              ("trace(ids)/sdpa", "trace_vs_sdpa"), ("plain/sdpa", "plain_vs_sdpa")]
    lines = [f"config {res['config']}: device {res['device_name']}, threads {res['threads']}, "
             f"{res['rounds']} alternating rounds, keep_freed_memory={res['keep_freed_memory']}",
             "tokens  " + "  ".join(f"{k:>22}" for k in NAMES) + "  "
             + "  ".join(f"{label:>16}" for label, _ in ratios) + "  trace MiB",
             "        " + "  ".join(f"{'wall ms [cpu ms]':>22}" for _ in NAMES)]
    for r in res["rows"]:
        cells = "  ".join(f"{r['median_ms'][k]:>12.1f} [{r['cpu_median_ms'][k]:>7.1f}]" for k in NAMES)
        rat = "  ".join(f"{r[key]:>9.2f} ({r[key + '_cpu']:.2f})" for _, key in ratios)
        lines.append(f"{r['tokens']:>6}  {cells}  {rat}  {r['trace_bytes'] / 2**20:>9.1f}")
    lines.append("ratios: wall medians (CPU medians); trace MiB: what the trace stores, before any map is read")
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
