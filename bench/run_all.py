"""Every benchmark, then docs/benchmarks.md: `python -m bench.run_all [--quick]` (`make bench`).

1. core    minilm trace / untraced forward against transformers (bench.core_bench), in one
           fresh process per configuration: glibc's malloc defaults and after (= what the app
           runs); on a CUDA machine also on the GPU;
2. long inputs  what a trace stores and costs at the models' own context (bench.trace_bench), and
           smollm2 at 8,000 tokens: pooled maps, memory, minilm's reads (bench.bench_long_context);
3. patching  smollm2's resid_pre and head grids against one forward pass per cell (bench.bench_patching);
4. lens    the logit lens and direct logit attribution against one traced pass (bench.bench_lens);
5. attribution  integrated gradients and the faithfulness table against untraced forward passes (bench.bench_attribution);
6. browser the app in Chromium: sentence, model view, head, decoder step, 512 tokens, the
           corpus page's 20,000-point scatter (bench.browser_bench; also in --quick), and in full
           runs smollm2's 8,000 tokens: trace, map, model view, span view (scenario smollm2_8k).
Each runs in its own process. --quick: fewer rounds and repetitions, configurations
glibc/after, lengths 128 and 512 (a few minutes instead of ~15).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, Result, machine_info
from bench.core_bench import format_table, run_in_subprocess

DOC = ROOT / "docs" / "benchmarks.md"


def _sub(module: str, args: list, timeout: float = 3600) -> dict:
    res = subprocess.run([sys.executable, "-m", module, *args, "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{module} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def load_results(quick: bool) -> list:
    """bench.load_bench: a Llama-shaped bfloat16 checkpoint written to disk, then loaded and
    traced in a fresh process (the ~7 M-parameter shape with --quick). Figures without targets."""
    try:
        r = _sub("bench.load_bench", ["--small"] if quick else [], timeout=3600)
    except Exception as exc:
        return [Result("checkpoint load", "checkpoint load benchmark", None, "s", note=str(exc)[-300:])]
    size = f"{r['parameters'] / 1e9:.2f} B" if r["parameters"] >= 1e8 else f"{r['parameters'] / 1e6:.0f} M"
    what = f"Llama-shaped {size}-parameter checkpoint ({r['disk_mb']:.0f} MiB of bfloat16 safetensors)"
    rows = [Result("checkpoint load", f"{what}: load in a fresh process", r["load_s"], "s",
                   note=f"{r['load_warm_s']:.2f} s the second time in the same process; computes in {r['dtype']}"),
            Result("checkpoint load", "peak resident memory after the load", r["rss_after_load_mb"] / 1024, "GiB",
                   note=f"python + torch alone {r['rss_import_mb']:.0f} MiB; the float32 weights are "
                        f"{4 * r['parameters'] / 2**30:.2f} GiB")]
    for n in (128, 1024):
        key = next((k for k in r if k.startswith("trace_") and k.endswith("_s") and int(k.split("_")[1]) >= n - 1
                    and int(k.split("_")[1]) <= n + 1), None)
        if key:
            rows.append(Result("checkpoint load", f"trace at {n} tokens (one map read)", r[key], "s",
                               note=f"peak resident memory after it {r[f'rss_after_trace_{n}_mb'] / 1024:.2f} GiB"))
    return rows


def gemma_load_results(quick: bool) -> list:
    """bench.bench_load_gemma: a 1 B-parameter bfloat16 Gemma-3-shaped checkpoint written to disk
    and loaded in a fresh process (~10 M parameters with --quick); peak memory against 1.3x the
    float32 weights. The Llama row beside it is load_results'."""
    try:
        r = _sub("bench.bench_load_gemma", ["--gemma-only"] + (["--small"] if quick else []), timeout=3600)["rows"][0]
    except Exception as exc:
        return [Result("checkpoint load", "Gemma checkpoint load benchmark", None, "s", note=str(exc)[-300:])]
    size = f"{r['parameters'] / 1e9:.2f} B" if r["parameters"] >= 1e8 else f"{r['parameters'] / 1e6:.0f} M"
    what = f"Gemma-3-shaped {size}-parameter checkpoint ({r['disk_mb']:.0f} MiB of bfloat16 safetensors)"
    return [Result("checkpoint load", f"{what}: load in a fresh process", r["load_s"], "s",
                   note=f"{r['load_warm_s']:.2f} s the second time in the same process; computes in {r['dtype']}"),
            Result("checkpoint load", f"{what}: peak resident memory / float32 weights", r["peak_ratio"], "x",
                   r["target_ratio"] if r["parameters"] >= 1e8 else None,  # python + torch dwarf a tiny model
                   note=f"peak {r['rss_after_load_mb'] / 1024:.2f} GiB (python + torch alone "
                                           f"{r['rss_import_mb']:.0f} MiB); the float32 weights are "
                                           f"{r['float32_model_mb'] / 1024:.2f} GiB")]


def core_results(runs: dict) -> list:
    """Target rows from the 'after' configuration (CPU), with glibc's malloc defaults in the notes.

    Like for like only: our trace with every layer's attention weights read (Trace.each_layer)
    against transformers' eager BertModel with output_attentions=True (both materialise every
    map); our trace with no map read (maps on demand) and our untraced forward against
    transformers' sdpa BertModel (neither computes a map)."""
    out = []
    after = runs.get("after")
    if after is None:
        return [Result("core", "minilm trace + every layer's weights / transformers eager + output_attentions", None,
                       "x", 1.0, note="core benchmark failed")]
    before = {r["tokens"]: r for r in runs.get("glibc", {}).get("rows", [])}

    def ms(r, k):
        return f"{r['cpu_median_ms'][k]:.1f} ms CPU ({r['median_ms'][k]:.1f} ms wall)"

    def was(n, key, name):
        b = before.get(n)
        return (f"; with glibc's malloc defaults {b[key + '_cpu']:.2f} (wall {b[key]:.2f}), {name} "
                f"{b['median_ms'][name]:.0f} ms wall / {b['cpu_median_ms'][name]:.0f} ms CPU") if b and key in b else ""

    for r in after["rows"]:
        n = r["tokens"]
        out.append(Result(
            "core", f"minilm model.trace(text) + every layer's attention weights read through the public API "
                    f"(Trace.each_layer), tokenizing included / transformers eager + output_attentions, {n} tokens "
                    "(ratio of CPU-time medians)",
            r["maps_vs_eager_cpu"], "x", 1.0 if n in (128, 512) else None,
            note=f"ours {ms(r, 'ours trace+maps')}, theirs {ms(r, 'hf eager+attn')}; {r['maps_read']} maps on each "
                 f"side; wall ratio {r['maps_vs_eager']:.2f}, median per-round wall ratio "
                 f"{r['maps_vs_eager_paired']:.2f}{was(n, 'maps_vs_eager', 'ours trace+maps')}"))
    for r in after["rows"]:
        n = r["tokens"]
        out.append(Result(
            "core", f"minilm trace from the same token ids + every layer's attention weights / transformers eager + "
                    f"output_attentions, {n} tokens (ratio of CPU-time medians)",
            r["ids_maps_vs_eager_cpu"], "x", 1.0 if n in (128, 512) else None,
            note=f"ours {ms(r, 'ours ids+maps')}, theirs {ms(r, 'hf eager+attn')}; wall ratio "
                 f"{r['ids_maps_vs_eager']:.2f}, median per-round wall ratio {r['ids_maps_vs_eager_paired']:.2f}. "
                 "Both start from token ids; the row above adds our tokenizing and the text-side metadata"
                 f"{was(n, 'ids_maps_vs_eager', 'ours ids+maps')}"))
    for r in after["rows"]:
        n = r["tokens"]
        out.append(Result(
            "core", f"minilm trace from token ids, maps on demand (none read) / transformers sdpa without attentions, "
                    f"{n} tokens (ratio of CPU-time medians)",
            r["trace_vs_sdpa_cpu"], "x", None,
            note=f"ours {ms(r, 'ours trace (ids)')}, theirs {ms(r, 'hf sdpa')}; wall ratio {r['trace_vs_sdpa']:.2f}, "
                 f"median per-round wall ratio {r['trace_vs_sdpa_paired']:.2f}. Neither side computes an attention "
                 "map; the target for this ratio is judged under long inputs (bench.trace_bench)"
                 f"{was(n, 'trace_vs_sdpa', 'ours trace (ids)')}"))
    for r in after["rows"]:
        n = r["tokens"]
        out.append(Result(
            "core", f"minilm forward, tracing off / transformers sdpa, {n} tokens (ratio of CPU-time medians)",
            r["plain_vs_sdpa_cpu"], "x", 1.1 if n in (128, 512) else None,
            note=f"ours {ms(r, 'ours plain')}, theirs {ms(r, 'hf sdpa')}; wall ratio {r['plain_vs_sdpa']:.2f}, "
                 f"median per-round wall ratio {r['plain_vs_sdpa_paired']:.2f}"
                 f"{was(n, 'plain_vs_sdpa', 'ours plain')}"))
    return out


def fmt(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "x":  # three decimals: a figure near its target must not round onto it
        return f"{v:.3f}x"
    if unit == "s":
        return f"{v:.3f} s"
    if unit == "MiB":
        return f"{v:.1f} MiB"
    if unit == "GiB":
        return f"{v:.2f} GiB"
    if unit == "":
        return f"{v:.2e}"
    return f"{v:g} {unit}"


def threads_line(core_runs: dict, mem: dict) -> str:
    """The intra-op thread counts the benchmark processes ran with, as they reported them."""
    parts = [f"core {name} {run['threads']}" for name, run in core_runs.items()
             if isinstance(run, dict) and "threads" in run]
    parts += [f"long inputs {name} {d['threads']}" for name, d in mem.get("details", {}).items()
              if isinstance(d, dict) and "threads" in d]
    return ", ".join(parts) if parts else "not reported (no benchmark process finished)"


HISTORY = "benchmarks-history.md"  # hand-written: earlier figures and the commits they come from


def write_doc(info: dict, results: list, core_runs: dict, mem: dict, browser: dict, quick: bool, started: str,
              elapsed: float, load_end) -> str:
    L = []
    L.append("# Benchmarks")
    L.append("")
    L.append(f"Generated by `python -m bench.run_all{' --quick' if quick else ''}` (`make bench`) on {started}, "
             f"in {elapsed / 60:.1f} min. Do not edit by hand: run it again.")
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append(f"- CPU: {info['cpu']}, {info['cores']} cores; memory {info['memory_gib']} GiB; {info['os']} ({info['libc']})")
    L.append(f"- load average at start: {', '.join(str(x) for x in info['load_average'])} (1, 5, 15 min); at the end: "
             f"{', '.join(f'{x:.2f}' for x in load_end)}. The machine is shared: a load above {info['cores']} means "
             "other processes wanted the cores too, which stretches wall times (see the notes on CPU time below).")
    L.append(f"- torch threads, as each benchmark process reported them: {threads_line(core_runs, mem)} "
             "(core.device.configure_threads: $ATTENTION_LAB_THREADS, else 1, as in the app)")
    gpu = info["gpu"]
    L.append(f"- GPU: {gpu} (CUDA {info['cuda_version']})" if gpu else
             "- GPU: none. **GPU figures were not taken here.** On a CUDA machine the same command runs the core "
             "benchmark on the GPU as well (the trace's meta then says device cuda) and adds those rows.")
    L.append("")
    L.append("## Versions")
    L.append("")
    L.append(f"python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
             f"streamlit {info['streamlit']}, plotly {info['plotly']}, playwright {info['playwright']}, "
             f"{info['chromium']}")
    L.append("")
    L.append("## Targets")
    L.append("")
    L.append("| | figure | measured | target | status |")
    L.append("|---|---|---|---|---|")
    for r in results:
        tgt = "—" if r.target is None else ("<= " + fmt(r.target, r.unit))
        L.append(f"| {r.section} | {r.name} | {fmt(r.value, r.unit)} | {tgt} | **{r.status}** |")
    L.append("")
    L.append("Notes per figure:")
    L.append("")
    for r in results:
        if r.note:
            L.append(f"- *{r.name}*: {r.note}")
    L.append("")
    L.append("## Core: minilm against transformers, before and after")
    L.append("")
    L.append("Each configuration runs in a fresh process; in each, one round runs each of these once, round after "
             "round, so load hits them alike: `model.trace(text)` then every layer's attention weights read through "
             "`Trace.each_layer` (trace+maps); the same from the token ids (ids+maps); transformers' eager BertModel "
             "with `output_attentions=True`; the trace from the token ids with no map read (maps on demand); "
             "transformers' sdpa BertModel; our untraced forward. Compared like for like: the two +maps columns "
             "against eager + output_attentions (every map materialised on both sides), the trace with no map read "
             "and the untraced forward against sdpa (no map on either side). CPU = process CPU time (with one torch "
             "thread, the time the work itself took); wall = elapsed time, which on this shared machine also counts "
             "the time other processes held the cores. Targets are judged on the ratio of CPU-time medians; the wall "
             "ratios are in the notes.")
    L.append("")
    L.append("- **glibc**: glibc's malloc defaults;")
    L.append("- **after**: `core.device.keep_freed_memory()`: what the app runs (viz/ui/models.py's setup_process calls it).")
    L.append("")
    L.append("```")
    for name in ("glibc", "after", "after-cuda"):
        if name in core_runs:
            L.append(format_table(core_runs[name]))
            L.append("")
    L.append("```")
    if core_runs.get("errors"):
        L.append("")
        L.append("Errors: " + "; ".join(core_runs["errors"]))
    L.append("")
    L.append("## Long inputs: what a trace stores")
    L.append("")
    L.append("A traced pass runs the fused attention kernel and stores only O(n d) tensors: the embeddings, every "
             "layer's output (the residual stream), each attention's per-head output, the final norms and, for "
             "decoders, the top-10 next tokens at every position and the whole distribution at the last one. "
             "Every other name is computed when it is read, by running that one layer again on its stored input "
             "(core/trace.py; the last two layers are cached). The model view pools each layer's maps as it is "
             f"computed. Figures from before this design are in [{HISTORY}]({HISTORY}) (hand-written, with the "
             "commits they come from). The figures below are the targets' rows above, from "
             "`python -m bench.trace_bench`.")
    d = mem.get("details", {})
    if "smollm2" in d:
        s = d["smollm2"]
        L.append("")
        L.append(f"- smollm2 at {s['tokens']} tokens: untraced forward {s['forward_cpu_s']:.2f} s CPU, traced pass "
                 f"{s['traced_cpu_s']:.2f} s, one layer's maps on first access {s['layer_first_access_cpu_s']:.2f} s, "
                 f"the {s['maps']}-map model view {s['model_view_cpu_s']:.2f} s (torch threads: {s['threads']}).")
    if "memory" in d:
        m = d["memory"]
        L.append(f"- smollm2 loaded: {m['loaded_rss_mib']:.0f} MiB resident; peak during a {m['tokens']}-token traced "
                 f"pass: {m['peak_above_loaded_mib']:.0f} MiB above that; the trace stores {m['stored_mib']:.0f} MiB.")
    L.append("")
    bd = browser.get("details", {})
    L.append("## Browser")
    L.append("")
    L.append("Headless Chromium (Playwright) against `streamlit run app.py` started after keep_freed_memory() "
             f"(bench/serve.py), $ATTENTION_LAB_THREADS={os.environ.get('ATTENTION_LAB_THREADS', '1')} torch thread(s), "
             f"no file watcher; a warm server; {bd.get('reps', '?')} repetitions "
             f"after one warm-up ({bd.get('long_reps', '?')} for 512 tokens), median. Time runs from the user's "
             "action (the page's own timestamp of the Enter keydown or the click's pointerdown) to the first frame "
             "at which the chart `.st-key-<key>[data-stale=\"false\"] .js-plotly-plot` holds a new plotly figure "
             "that shows the new data (the typed tokens on the axis, the chosen head in the title, 72 maps, one "
             "more decoder row). The browser shares the 2 cores with the server and with the machine's other load.")
    L.append("")
    L.append("The model view is one heatmap: viz.figures.grid tiles every layer x head map into one matrix (a blank row and "
             "column between maps) with an invisible click target per map, instead of 72 plotly subplots (their "
             f"figures are in [{HISTORY}]({HISTORY})). The decoder's and the explore heatmaps use fixed "
             "margins fitted to their token labels (viz.figures.heatmaps.fix_margins) instead of plotly's automargin, which "
             "measured every label and drew each chart twice when the margins moved. A decoder step redraws five "
             "charts; the target figure is the weights chart, and the time until all five are new is reported too. "
             "The floor rows time the same press of Next on bench/floor/app.py, a bare Streamlit fragment (no "
             "model, none of the app's code) with no chart and with five plain heatmaps of the decoder's sizes, "
             "each on its own server in the same run: the second is what Streamlit and plotly.js cost for five "
             "charts on this machine, which the decoder's figure cannot go under without drawing fewer charts. "
             "\"Step in the browser\" (the stepper's toggle, viz/decoder/steps.py) goes under it by not rerunning: "
             "one figure holds every step's three maps and its own slider restyles them in the page; its row is a "
             "click on that slider until the weights panel holds one more row, with the number of Streamlit runs "
             "the clicks started.")
    L.append("")
    L.append("The first-load rows open each page afresh by its own link until it is usable (the run ended, nothing "
             "stale or a grey skeleton, the first chart drawn), beside bench/floor/app.py opened with as many plain "
             "heatmaps at the same depth of URL: /bare beside /explore, / beside the home page. Streamlit's browser "
             "code opened at /name is refused /name/_stcore/health and waits a fixed 100 ms before /_stcore/health, "
             "so every linked page of a multipage app pays it and the floor pays it too (each row says what it cost "
             "in that run).")
    L.append("")
    L.append("The corpus rows: /corpus with 500 pasted sentences of 20 minilm tokens, so one head's joint scatter "
             "has 10,000 queries and 10,000 keys. Pasting runs the corpus job and the PCA (reported once); the "
             "target is timed on reruns that reuse both (a 'Colour by' change; a return to a head seen before), "
             "from the click to the scatter holding the 20,000 points in the new colouring or head: the figure "
             "built by the server, sent, and drawn by plotly's WebGL scatter, which headless Chromium renders in "
             "software (SwiftShader). Streamlit mounts a new chart for every new figure, and plots it twice (once "
             "before and once after it applies the page's width and theme). The CPU seconds per redraw in the "
             "notes (server, renderer, GPU process) do not grow with the machine's other load as wall time does.")
    if bd.get("errors"):
        L.append("")
        L.append("Errors: " + "; ".join(bd["errors"]))
    L.append("")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    ap.add_argument("--skip-browser", action="store_true")
    ap.add_argument("--out", default=str(DOC))
    args = ap.parse_args(argv)
    import core.device

    os.environ.setdefault("ATTENTION_LAB_THREADS", "1")
    core.device.configure_threads(1)
    t_start = time.time()
    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    info = machine_info()
    print(f"{info['cpu']}, {info['cores']} cores, load {info['load_average']}; torch {info['torch']}, "
          f"transformers {info['transformers']}, streamlit {info['streamlit']}; GPU: {info['gpu'] or 'none'}", flush=True)

    configs = ("glibc", "after")
    rounds = 5 if args.quick else 21
    lengths = (128, 512) if args.quick else (16, 128, 512)
    core_runs = {}
    for c in configs:
        print(f"core: {c} ...", flush=True)
        try:
            core_runs[c] = run_in_subprocess(c, rounds, lengths, device="cpu")
            print(format_table(core_runs[c]), flush=True)
        except Exception as exc:
            core_runs.setdefault("errors", []).append(f"{c}: {str(exc)[-500:]}")
            print(f"core {c} failed: {exc}", flush=True)
    if info["cuda"]:
        try:
            core_runs["after-cuda"] = run_in_subprocess("after", rounds, lengths, device="cuda")
            print(format_table(core_runs["after-cuda"]), flush=True)
        except Exception as exc:
            core_runs.setdefault("errors", []).append(f"cuda: {str(exc)[-500:]}")
    results = core_results(core_runs)
    if "after-cuda" in core_runs:
        for r in core_runs["after-cuda"]["rows"]:
            results.append(Result("core (GPU)", f"{core_runs['after-cuda']['device_name']}: minilm trace from ids + "
                                  f"every layer's weights / eager + output_attentions, {r['tokens']} tokens (wall)",
                                  r["ids_maps_vs_eager"], "x", None,
                                  note=f"trace meta device {r['trace_device']}; ours "
                                       f"{r['median_ms']['ours ids+maps']:.1f} ms, theirs "
                                       f"{r['median_ms']['hf eager+attn']:.1f} ms; maps on demand (none read) / sdpa "
                                       f"{r['trace_vs_sdpa']:.2f}"))
    else:
        results.append(Result("core (GPU)", "GPU figures", None, "x", None,
                              note="no GPU on this machine: GPU figures were not taken here"))

    print("long inputs ...", flush=True)
    try:
        mem = _sub("bench.trace_bench", ["--quick"] if args.quick else [])
    except Exception as exc:
        mem = {"results": [Result("long inputs", "trace benchmark", None, "", note=str(exc)[-300:]).to_dict()],
               "details": {}}
    results += [Result.from_dict(r) for r in mem["results"]]
    print("long context (8,000 tokens) ...", flush=True)
    try:
        longctx = _sub("bench.bench_long_context", ["--quick"] if args.quick else [], timeout=5400)
    except Exception as exc:
        longctx = {"results": [Result("long inputs", "long-context benchmark", None, "", note=str(exc)[-300:]).to_dict()]}
    results += [Result.from_dict(r) for r in longctx["results"]]

    print("corpus ...", flush=True)
    try:
        corpus = _sub("bench.corpus_bench", ["--n", "300", "--single", "100"] if args.quick else [])
        results += [Result.from_dict(r) for r in corpus["results"]]
    except Exception as exc:
        results.append(Result("corpus", "corpus benchmark", None, "s", note=str(exc)[-300:]))

    print("patching ...", flush=True)
    try:
        results += [Result.from_dict(r) for r in _sub("bench.bench_patching", ["--reps", "1"])["results"]]
    except Exception as exc:
        results.append(Result("patching", "patching benchmark", None, "x", note=str(exc)[-300:]))
    print("lens ...", flush=True)
    try:  # bench.bench_lens: the logit lens and direct logit attribution against a traced pass (smollm2)
        lens = _sub("bench.bench_lens", ["--tokens", "512" if args.quick else "512,2048"])
        results += [Result.from_dict(r) for r in lens["results"]]
    except Exception as exc:
        results.append(Result("lens", "lens benchmark", None, "x", note=str(exc)[-300:]))
    print("attribution ...", flush=True)
    try:
        results += [Result.from_dict(r) for r in _sub("bench.bench_attribution", [])["results"]]
    except Exception as exc:
        results.append(Result("attribution", "attribution benchmark", None, "x", note=str(exc)[-300:]))

    print("circuits ...", flush=True)
    try:  # bench.circuits: a depth-2 circuit and one path patch against a traced pass (smollm2, 512 tokens)
        results += [Result.from_dict(r) for r in _sub("bench.circuits", [])["results"]]
    except Exception as exc:
        results.append(Result("circuits", "circuits benchmark", None, "x", note=str(exc)[-300:]))

    print("checkpoint load ...", flush=True)
    results += load_results(args.quick)
    results += gemma_load_results(args.quick)

    browser = {"results": [], "details": {}}
    if not args.skip_browser:
        print("browser ...", flush=True)
        try:
            browser = _sub("bench.browser_bench", ["--quick"] if args.quick else [], timeout=7200)
        except Exception as exc:
            browser = {"results": [Result("browser", "browser benchmark", None, "s", note=str(exc)[-300:]).to_dict()],
                       "details": {}}
        results += [Result.from_dict(r) for r in browser["results"]]

    load_end = os.getloadavg()
    doc = write_doc(info, results, core_runs, mem, browser, args.quick, started, time.time() - t_start, load_end)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = ROOT / "docs" / "load.md"  # bench.load_test's figures, measured on their own (minutes of every core)
    out.write_text(doc + ("\n" + load.read_text() if load.exists() else ""))
    (out.with_suffix(".json")).write_text(json.dumps({"machine": info, "results": [r.to_dict() for r in results],
                                                      "core": core_runs, "memory": mem.get("details"),
                                                      "browser": browser.get("details")}, indent=1, default=str))
    print()
    for r in results:
        print(f"[{r.status:>12}] {r.section}: {r.name}: {fmt(r.value, r.unit)}"
              + (f" (target <= {fmt(r.target, r.unit)})" if r.target is not None else ""))
    print(f"\nwrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
