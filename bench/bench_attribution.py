"""Attribution's cost on smollm2, as ratios measured in one run (one rep each):

    python -m bench.bench_attribution [--tokens 20] [--json]

- integrated gradients, 64 steps, on a 20-token prompt / 64 untraced forward passes of that
  prompt (target <= 2.0x): the steps run batched through the embed hook point;
- the whole faithfulness table (every method's attribution, the random floor, the deletion
  curves, sufficiency) for the same prompt / 200 untraced forward passes (target <= 1x);
- value_norms of one layer alone / that layer's weights alone (target <= 2x), from the trace;
- the first load of /attribution?model=smollm2 (the page's computation at its defaults: its
  example sentence, 64 steps refined until complete within 5%, the first token fixed, every
  method's scores; the faithfulness table waits for its switch, its time in the note) / one
  traced pass of that sentence (target <= 100x; the IOI sentence, which takes 192 steps, <= 200x),
  with integrated gradients' completeness error and the steps it took (`--page-only`: these rows
  alone).
Untraced forward pass: model.net.decode + the output projection of the last position under
torch.inference_mode (no recorder, fused attention).
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

import torch  # noqa: E402

from bench.common import PASSAGE, Result  # noqa: E402

TARGETS = {"ig": 2.0, "faithfulness": 1.0, "value_norms": 2.0, "page": 100.0, "page_ioi": 200.0}
IOI = "When Mary and John went to the store, John gave a drink to"
READS = 25  # alternated reads of one layer's weights and value_norms


def prompt_of(model, n_tokens: int) -> str:
    words = PASSAGE.split()
    text = ""
    for k in range(1, len(words) + 1):
        cand = " ".join(words[:k])
        if len(model.encode(cand)) > n_tokens:
            break
        text = cand
    return text


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    import core
    from core.analysis import input_attribution as A
    from core.analysis import faithfulness_scores as F

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of Result rows (bench.run_all)")
    ap.add_argument("--page-only", action="store_true", help="only the page's first load (and the IOI sentence's)")
    args = ap.parse_args(argv)
    core.device.configure_threads()
    model = core.load_model("smollm2", device="cpu")
    page_rows = page_first_load(model)
    if args.page_only:
        return report(page_rows, args.json, "smollm2 page defaults")
    text = prompt_of(model, args.tokens)
    ids = torch.tensor([model.encode(text).ids])
    n = ids.shape[1]

    def forwards(k: int) -> None:
        with torch.inference_mode():
            for _ in range(k):
                model.net.project(model.net.decode(ids)[:, -1])

    forwards(2)  # warm-up
    ig_s, ig = timed(lambda: A.attribute(model, text, "integrated_gradients", steps=args.steps))
    fwd64_s, _ = timed(lambda: forwards(args.steps))
    faith_s, table = timed(lambda: F.faithfulness(model, text, steps=args.steps))
    fwd200_s, _ = timed(lambda: forwards(200))
    tr = model.trace(text)
    layer = model.config.n_layers // 2
    w_s = vn_s = float("inf")
    for _ in range(READS):  # sub-millisecond reads: the best of many, alternated
        w_s = min(w_s, timed(lambda: list(tr.each_layer("decoder", ["self_attn.weights"], [layer])))[0])
        vn_s = min(vn_s, timed(lambda: list(tr.each_layer("decoder", ["self_attn.value_norms"], [layer])))[0])
    rows = [
        Result("attribution", f"integrated gradients, {args.steps} steps, {n}-token smollm2 prompt / {args.steps} "
               "untraced forward passes", ig_s / fwd64_s, "x", TARGETS["ig"],
               note=f"IG {ig_s:.2f} s, forwards {fwd64_s:.2f} s; completeness error "
                    f"{ig.attrs['completeness_error']:.1%}"),
        Result("attribution", f"faithfulness table ({len(table)} rankings incl. random), {n} tokens / 200 untraced "
               "forward passes", faith_s / fwd200_s, "x", TARGETS["faithfulness"],
               note=f"table {faith_s:.2f} s, forwards {fwd200_s:.2f} s"),
        Result("attribution", f"value_norms of layer {layer} / its weights alone ({n} tokens)", vn_s / w_s, "x",
               TARGETS["value_norms"], note=f"value_norms {vn_s * 1000:.2f} ms, weights {w_s * 1000:.2f} ms (best of {READS}, "
                                             "alternated)"),
    ] + page_rows
    return report(rows, args.json, f"smollm2, {n} tokens")


def page_first_load(model) -> list:
    """The Attribution page's computation at its defaults (viz/attribution/run_panel.py's _run:
    every method's scores, the faithfulness table left to its switch; no Streamlit session), for
    the page's example sentence and for the IOI sentence, each / one traced pass of its sentence;
    the note adds the faithfulness table's time when switched on."""
    from viz.attribution import defaults
    from viz.attribution import run_panel as attribution_run

    rows = []
    for label, text, target in (("its example", defaults.DEFAULT_TEXT["decoder"], TARGETS["page"]),
                                ("the IOI sentence", IOI, TARGETS["page_ioi"])):
        traces = [timed(lambda: model.trace(text))[0] for _ in range(3)]
        page_s, (_, frames, s) = timed(lambda: attribution_run._run(text, "", "", "", defaults.STEPS_DEFAULT, True,
                                                                    None, model, lambda f, what: None))
        traces += [timed(lambda: model.trace(text))[0] for _ in range(3)]  # before and after: the load drifts
        trace_s = sorted(traces)[len(traces) // 2]
        table_s, _ = timed(lambda: attribution_run._table(s, frames, True, None))
        ig = frames["integrated_gradients"].attrs
        rows.append(Result("attribution", f"first load of /attribution?model=smollm2 on {label} "
                           f"({len(model.encode(text).ids)} tokens) / one traced pass", page_s / trace_s, "x",
                           target, note=f"page {page_s:.1f} s, trace {trace_s:.3f} s (median of 6); integrated "
                                        f"gradients {ig['steps']} steps, completeness error "
                                        f"{ig['completeness_error']:.1%}; the faithfulness table, when switched on, "
                                        f"{table_s:.1f} s more"))
    return rows


def report(rows, as_json: bool, what: str) -> int:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"attribution bench ({what}, one rep; {os.cpu_count()} CPUs, load average {load:.1f})",
          file=sys.stderr if as_json else sys.stdout)
    for r in rows:
        print(f"  {r.name}: {r.value:.2f}{r.unit} (target <= {r.target}) {r.status}  [{r.note}]",
              file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps({"results": [r.to_dict() for r in rows]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
