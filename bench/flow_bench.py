"""Attention flow's cost: core.analysis.flow for 30 tokens x 6 layers (target <= 5 s).

    python -m bench.flow_bench [--tokens 30] [--layers 6] [--rounds 3]

Flow runs one scipy max-flow per (layer, token, input token): 6 x 30 x 30 = 5,400 for the
target size, on the layer graph of (L + 1) * n nodes. The maps come from minilm (6 layers)
when its weights are installed, else from random row-stochastic maps of the same size.
Prints the median wall time over the rounds, rollout's for comparison, and the one-token
flow that the heads page draws.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import PASSAGE  # noqa: E402
from core import analysis  # noqa: E402

TARGET_S = 5.0


class Maps:
    """A trace-like object holding only self-attention maps (what flow reads)."""

    def __init__(self, maps):
        self.maps = maps

    def layers(self, stack):
        return len(self.maps)

    def __getitem__(self, name):
        return self.maps[int(name.split(".")[1])]


def maps_for(n_tokens: int, n_layers: int):
    import core

    if n_layers == 6 and core.MODELS["minilm"].available():
        model = core.load_model("minilm", device="cpu")
        words = PASSAGE.split()
        for k in range(1, len(words) + 1):  # the longest prefix of the passage within n tokens
            if len(model.encode(" ".join(words[:k]))) > n_tokens:
                break
        text = " ".join(words[: k - 1])
        trace = model.trace(text)
        maps = [trace[f"encoder.{i}.self_attn.weights"] for i in range(6)]
        return Maps(maps), f"minilm on {maps[0].shape[-1]} tokens"
    rng = np.random.default_rng(0)
    maps = []
    for _ in range(n_layers):
        x = rng.random((12, n_tokens, n_tokens)) ** 3
        maps.append(torch.tensor(x / x.sum(-1, keepdims=True), dtype=torch.float32))
    return Maps(maps), f"random maps, {n_tokens} tokens"


def median_time(fn, rounds: int):
    """Median wall time and median process CPU time (s): on a shared machine the CPU time is
    the work itself, the wall time adds the waits for a core."""
    wall, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    trace, what = maps_for(args.tokens, args.layers)
    n = trace[("encoder.0.self_attn.weights")].shape[-1]
    full = median_time(lambda: analysis.flow(trace, "encoder"), args.rounds)
    one = median_time(lambda: analysis.flow(trace, "encoder", query=n // 2), args.rounds)
    roll = median_time(lambda: analysis.rollout(trace, "encoder"), args.rounds)
    status = "met" if args.tokens != 30 or args.layers != 6 or full[0] <= TARGET_S else "MISSED"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"flow bench ({what}, {args.layers} layers, median of {args.rounds}; "
          f"{os.cpu_count()} CPUs, load average {load:.1f})")
    print(f"  flow, every token     wall {full[0]:7.3f} s  cpu {full[1]:7.3f} s   target <= {TARGET_S} s wall at 30 x 6: {status}")
    print(f"  flow, one token       wall {one[0]:7.3f} s  cpu {one[1]:7.3f} s")
    print(f"  rollout               wall {roll[0]:7.3f} s  cpu {roll[1]:7.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
