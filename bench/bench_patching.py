"""Activation patching's cost: core.analysis.patch's grids against one forward pass per cell.

    python -m bench.bench_patching [--reps 1] [--json]

On a 20-token smollm2 prompt pair (the indirect-object pattern, one name changed), in one run:
the resid_pre grid (30 layers x 20 positions) against 600 separate forward passes, and the head
grid (30 x 9 heads) against 270 forward passes (targets: <= 0.3x each). Each separate pass is
what a patching loop without batching does: the corrupted prompt run whole, with one cell's
hook, and its last position projected. The grid batches a layer's cells and starts at that
layer; in a decoder it runs only the positions from the first differing token on (module
docstring of core/analysis/activation_patching.py), so the figure depends on where the prompts first
differ: the same prompt changed at its first token (nothing before it to reuse) is printed too,
as information. Medians over --reps (1 on a shared machine: the figures are one run each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import core  # noqa: E402
import core.analysis as ca  # noqa: E402
from bench.common import Result  # noqa: E402
from core.analysis.token_ids import output_token_id  # noqa: E402
from core.net.hooks import Hooks  # noqa: E402

CLEAN = "When Mary and John went to the store after school on a sunny day, John gave a drink to"
CORRUPT = "When Mary and John went to the store after school on a sunny day, Mary gave a drink to"
FIRST_WORD = ("Then", "After")  # the worst case: the pair differs at its first token
TARGET = 0.3


def separate_passes(model, clean: str, corrupt: str, what: str, answer: int, wrong: int) -> float:
    """Seconds for one hooked forward pass of the corrupted prompt per cell (the clean values
    read in one pass first), each projecting its last position: patching without batching."""
    net = model.net
    L, H = model.config.n_layers, model.config.n_heads
    ids_c = torch.tensor([model.encode(clean).ids])
    ids_x = torch.tensor([model.encode(corrupt).ids])
    point = ca.activation_patching.POINT[what]
    t0 = time.perf_counter()
    with torch.inference_mode():
        kept = {}
        net.decode(ids_c, rec=Hooks({f"decoder.{i}.{point}": (lambda t, i=i: kept.__setitem__(i, t) or t)
                                     for i in range(L)}))
        cells = range(H) if what == "head" else range(ids_c.shape[1])
        for i in range(L):
            for c in cells:
                def put(t, i=i, c=c):
                    t = t.clone()
                    t[:, c] = kept[i][:, c]
                    return t
                logits = net.project(net.decode(ids_x, rec=Hooks({f"decoder.{i}.{point}": put}))[:, -1])
                float(logits[0, answer] - logits[0, wrong])
    return time.perf_counter() - t0


def grid(model, clean, corrupt, what, answer, wrong) -> float:
    t0 = time.perf_counter()
    ca.patch(model, clean, corrupt, answer, wrong, what=what)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1, help="repetitions (median); 1 on a shared machine")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of Result rows (bench.run_all)")
    args = ap.parse_args(argv)
    core.device.configure_threads()
    model = core.load_model("smollm2", device="cpu")
    n = len(model.encode(CLEAN).ids)
    assert n == len(model.encode(CORRUPT).ids) == 20, n
    a, w = output_token_id(model, " Mary"), output_token_id(model, " John")
    worst = tuple(s.replace("When", word, 1) for s, word in zip((CLEAN, CORRUPT), FIRST_WORD))
    L, H = model.config.n_layers, model.config.n_heads
    rows = []
    print(f"smollm2, {n}-token prompts, {torch.get_num_threads()} torch thread(s), --reps {args.reps} "
          f"(a shared machine: one run per figure)", flush=True)
    for what, n_cells in (("resid_pre", L * n), ("head", L * H)):
        sep = statistics.median(separate_passes(model, CLEAN, CORRUPT, what, a, w) for _ in range(args.reps))
        ours = statistics.median(grid(model, CLEAN, CORRUPT, what, a, w) for _ in range(args.reps))
        first = statistics.median(grid(model, *worst, what, a, w) for _ in range(args.reps))
        print(f"{what}: grid {ours:.2f} s, {n_cells} separate passes {sep:.2f} s: {ours / sep:.3f}x "
              f"(target <= {TARGET}x); prompts differing at the first token: {first:.2f} s, {first / sep:.3f}x",
              flush=True)
        rows.append(Result("patching", f"smollm2 {what} grid ({L} x {n if what != 'head' else H} cells) / {n_cells} "
                           f"separate forward passes, {n}-token prompts differing at token "
                           f"{ca.activation_patching.prepare(model, CLEAN, CORRUPT).differ[0]}", ours / sep, "x", TARGET,
                           note=f"grid {ours:.2f} s, separate passes {sep:.2f} s; --reps {args.reps}"))
        rows.append(Result("patching", f"smollm2 {what} grid / {n_cells} separate forward passes, prompts differing "
                           "at their first token (nothing before it to reuse)", first / sep, "x", None,
                           note=f"grid {first:.2f} s"))
    if args.json:
        print(json.dumps({"results": [r.to_dict() for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
