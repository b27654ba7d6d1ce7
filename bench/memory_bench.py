"""Memory benchmark: what a trace keeps, what float16 attention maps cost in accuracy, and
how many traces the app's byte-bounded cache holds.

    python -m bench.memory_bench [--json]

1. bytes of a minilm trace at 512 tokens: now (weights stored; scores / scaled / masked /
   zero masks derived on access) and before (Recorder(lazy=False): every tensor stored);
   transformers' output_attentions for the same input, for scale;
2. float16 attention maps (Trace.to_half_attention) on real traces -- minilm at 16 / 128 /
   512 tokens and its example sentences, toy-translate (causal and cross attention, with
   and without padding), smollm2 (grouped-query attention) when installed: the largest
   |w16 - w32|, the largest |w16 - w32| / w32 over weights >= 1e-3, the largest
   |row sum - 1| in float16 and in float32, and whether every masked weight stays exactly 0;
3. the app's trace cache (viz.cache.ByteLRU, 1 GiB by default): how many 512-token minilm
   traces it holds in float32 and in float16, and the process's resident memory (VmRSS /
   VmHWM) while 8 different 512-token traces pass through a 512 MiB cache.
"""

from __future__ import annotations

import argparse
import functools
import json

from bench.common import Result, status_kib, text_of


def half_errors(trace) -> dict:
    """Float16 vs float32 for every weights tensor of a trace."""
    import torch

    half = trace.to_half_attention()
    worst = {"max_abs": 0.0, "max_rel_ge_1e-3": 0.0, "row_sum_err_16": 0.0, "row_sum_err_32": 0.0,
             "masked_exact_zero": True, "maps": 0}
    for name in trace.names():
        if not name.endswith(".weights"):
            continue
        w32, w16 = trace[name].double(), half[name].double()
        assert half[name].dtype == torch.float32 and half.stored(name).dtype == torch.float16
        d = (w16 - w32).abs()
        big = w32 >= 1e-3
        worst["max_abs"] = max(worst["max_abs"], d.max().item())
        if big.any():
            worst["max_rel_ge_1e-3"] = max(worst["max_rel_ge_1e-3"], (d[big] / w32[big]).max().item())
        worst["row_sum_err_16"] = max(worst["row_sum_err_16"], (w16.sum(-1) - 1).abs().max().item())
        worst["row_sum_err_32"] = max(worst["row_sum_err_32"], (w32.sum(-1) - 1).abs().max().item())
        mask = trace[name[: -len(".weights")] + ".mask"]
        blocked = torch.isneginf(mask).expand_as(w32)
        if blocked.any():
            worst["masked_exact_zero"] &= bool((w16[blocked] == 0).all())
        worst["maps"] += 1
    return worst


def run(quick: bool = False) -> dict:
    import core
    import core.api
    import core.device
    import torch
    from core.model import Recorder

    core.device.configure_threads(1)
    core.device.keep_freed_memory()
    results = []
    details = {}

    minilm = core.load_model("minilm", device="cpu")
    text512 = text_of(minilm, 512)
    tr = minilm.trace(text512)
    lazy_bytes, att_bytes = tr.nbytes(), tr.attention_nbytes()
    real = core.api.Recorder
    core.api.Recorder = functools.partial(Recorder, lazy=False)
    try:
        eager = minilm.trace(text512)
    finally:
        core.api.Recorder = real
    before_bytes = eager.nbytes()
    before_counted = sum(eager[n].numel() * eager[n].element_size() for n in eager)  # old nbytes(): masked counted again
    half = tr.to_half_attention()
    hf_attn = 6 * 12 * 512 * 512 * 4
    details["trace_512"] = {"names": len(tr), "derived": sum(tr.is_derived(n) for n in tr), "bytes": lazy_bytes,
                            "attention_bytes": att_bytes, "before_bytes": before_bytes,
                            "before_nbytes_reported": before_counted, "half_bytes": half.nbytes(),
                            "hf_output_attentions_bytes": hf_attn}
    mib = 2**20
    results.append(Result("memory", "minilm trace at 512 tokens (every name of docs/design.md)", lazy_bytes / mib, "MiB",
                          note=f"{len(tr)} names, {details['trace_512']['derived']} derived on access; "
                               f"{att_bytes / mib:.0f} MiB of it the 6 x 12 x 512 x 512 weights. Before: "
                               f"{before_bytes / mib:.0f} MiB kept ({before_counted / mib:.0f} MiB by the old "
                               f"nbytes(), which counted masked = scaled twice); transformers' "
                               f"output_attentions alone: {hf_attn / mib:.0f} MiB"))
    results.append(Result("memory", "same trace with float16 attention maps (Trace.to_half_attention)",
                          half.nbytes() / mib, "MiB", note="the weights in float16; everything else shared"))
    del eager

    # float16 accuracy on real traces
    cases = [("minilm", minilm, text_of(minilm, 16), {}), ("minilm", minilm, text_of(minilm, 128), {}),
             ("minilm", minilm, text512, {})]
    if not quick:
        cases += [("minilm", minilm, s, {}) for s in minilm.examples]
    try:
        toy = core.load_model("toy-translate", device="cpu")
        cases += [("toy-translate", toy, "the small dog sees the cat", {}),
                  ("toy-translate", toy, "help the tiny white cat across the road", {"pad_to": 12})]
    except Exception as exc:  # pragma: no cover - the bundled model should be there
        details["toy_error"] = str(exc)
    if not quick:
        try:
            smol = core.load_model("smollm2", device="cpu")
            cases.append(("smollm2", smol, "The capital of France is a city with many old bridges and", {}))
        except Exception as exc:
            details["smollm2_error"] = str(exc)
    worst = {"max_abs": 0.0, "max_rel_ge_1e-3": 0.0, "row_sum_err_16": 0.0, "row_sum_err_32": 0.0,
             "masked_exact_zero": True, "maps": 0}
    per_case = []
    for model_name, model, text, kw in cases:
        t = model.trace(text, **kw)
        e = half_errors(t)
        per_case.append({"model": model_name, "tokens": len(t.tokens("source")), **e})
        for k in ("max_abs", "max_rel_ge_1e-3", "row_sum_err_16", "row_sum_err_32"):
            worst[k] = max(worst[k], e[k])
        worst["masked_exact_zero"] &= e["masked_exact_zero"]
        worst["maps"] += e["maps"]
    details["float16"] = {"worst": worst, "cases": per_case}
    n_cases = len(per_case)
    results.append(Result("memory", "float16 weights: max |w16 - w32|", worst["max_abs"], "",
                          note=f"over {worst['maps']} attention tensors in {n_cases} real traces; bound 2^-12 = 2.4e-4"))
    results.append(Result("memory", "float16 weights: max relative error (weights >= 1e-3)", worst["max_rel_ge_1e-3"], "",
                          note="bound 2^-11 = 4.9e-4"))
    results.append(Result("memory", "float16 weights: max |row sum - 1|", worst["row_sum_err_16"], "",
                          note=f"float32: {worst['row_sum_err_32']:.1e}; masked weights stay exactly 0: "
                               f"{'yes' if worst['masked_exact_zero'] else 'NO'}"))

    # the app's cache
    from viz.cache import ByteLRU

    cache_bytes = 1024 * mib
    details["cache"] = {"default_bytes": cache_bytes, "fits_512_float32": cache_bytes // lazy_bytes,
                        "fits_512_float16": cache_bytes // half.nbytes(), "fits_512_before": cache_bytes // before_bytes}
    results.append(Result("memory", "512-token minilm traces in the default 1 GiB trace cache", cache_bytes // lazy_bytes,
                          "traces", note=f"float16 maps: {cache_bytes // half.nbytes()}; before: "
                                         f"{cache_bytes // before_bytes}"))
    del tr, half
    bound = 512 * mib
    cache = ByteLRU(bound, size_of=lambda v: v.nbytes())
    rss0 = status_kib("VmRSS")
    rss = []
    for i in range(4 if quick else 8):
        words = text512.split()
        words[i + 1], words[i + 2] = words[i + 2], words[i + 1]  # a different 512-token input each time
        key = " ".join(words)
        cache.get_or_compute(key, lambda: minilm.trace(key))
        rss.append(status_kib("VmRSS"))
    details["cache_rss"] = {"bound_bytes": bound, "entries": len(cache), "cache_bytes": cache.nbytes,
                            "rss_start_kib": rss0, "rss_kib": rss, "hwm_kib": status_kib("VmHWM")}
    results.append(Result("memory", "process memory growth while 512-token traces pass through a 512 MiB cache",
                          (max(rss) - rss0) / 1024, "MiB",
                          note=f"{len(rss)} traces, {len(cache)} kept ({cache.nbytes / mib:.0f} MiB); resident "
                               f"memory after each: {', '.join(f'{(r - rss0) / 1024:.0f}' for r in rss)} MiB above start"))
    return {"results": [r.to_dict() for r in results], "details": details}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.quick)
    if args.json:
        print(json.dumps(res, default=str))
        return
    for r in res["results"]:
        v = r["value"]
        print(f"{r['name']}: {v:.4g} {r['unit']}  ({r['note']})")
    print(json.dumps(res["details"]["float16"]["cases"], indent=1))


if __name__ == "__main__":
    main()
