"""Corpus benchmark: the corpus job over the bundled corpus, and the joint embedding's PCA.

    python -m bench.corpus_bench [--model minilm] [--n 1000] [--layers all] [--single 200] [--threads 1]

Prints, with the load average beside them (the machine may be shared):
  - the corpus job (core.cli.corpus_job.run: padded batches) over the first n bundled sentences,
    seconds (target <= 60 s for minilm, 1,000 sentences, on a 2-core CPU);
  - its cost per sentence against tracing the sentences one at a time (model.trace(s), then
    reading the same layers' q and k), timed on the first `single` sentences (target <= 0.5x);
  - AttentionViz normalisation + PCA (core.analysis.joint) of 20,000 points (10,000 queries and
    10,000 keys of one head), median of 5 (target <= 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from bench.common import ROOT  # noqa: F401  (puts the repository on sys.path)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corpus_bench")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--layers", default="all")
    ap.add_argument("--single", type=int, default=200, help="sentences traced one at a time for the ratio")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("ATTENTION_LAB_THREADS", 1)))
    ap.add_argument("--json", action="store_true", help="end with one JSON line of Result rows (bench.run_all)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    import core
    import core.cli.corpus_job as cc
    import core.analysis.joint as cj
    from core.cli.corpus_data import load as load_bundled

    torch.set_num_threads(args.threads)
    model = core.load_model(args.model, device="cpu")
    sentences = load_bundled()[: args.n]
    layers = cc.parse_layers(None if args.layers == "all" else args.layers, model)
    print(f"corpus bench: {model.name}, {len(sentences)} bundled sentences, layers {layers}, "
          f"{torch.get_num_threads()} torch thread(s); {load()}")

    cc.run(model, sentences[:16], layers)  # warm-up
    result = cc.run(model, sentences, layers)
    n_tok = int(result.table.num_rows // (len(layers) * model.config.n_heads))
    job = result.seconds
    print(f"  corpus job: {job:.1f} s for {len(sentences)} sentences ({n_tok} tokens, {result.table.num_rows} rows), "
          f"{1000 * job / len(sentences):.2f} ms/sentence  [target <= 60 s]  ({load()})")

    single = sentences[: args.single]
    stack = cc.stack_of(model)
    t0 = time.perf_counter()
    for s in single:
        tr = model.trace(s)
        for l in layers:
            tr[f"{stack}.{l}.self_attn.q"], tr[f"{stack}.{l}.self_attn.k"]
    one = (time.perf_counter() - t0) / len(single)
    t0 = time.perf_counter()
    cc.run(model, single, layers)
    batched_same = (time.perf_counter() - t0) / len(single)
    print(f"  one at a time: {1000 * one:.2f} ms/sentence over {len(single)} sentences; "
          f"batched job {1000 * job / len(sentences):.2f} ms/sentence over {len(sentences)} "
          f"(over the same {len(single)}: {1000 * batched_same:.2f}): ratio {job / len(sentences) / one:.2f}x "
          f"({batched_same / one:.2f}x on the same sentences)  [target <= 0.5x]  ({load()})")

    rng = np.random.default_rng(0)
    q = rng.normal(size=(10_000, 32)).astype(np.float32) + 0.5
    k = rng.normal(size=(10_000, 32)).astype(np.float32) * 0.7 - 0.2
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        xy = cj.joint_embedding(q, k, "pca")
        times.append(time.perf_counter() - t0)
    assert xy.shape == (20_000, 2)
    pca = statistics.median(times)
    print(f"  normalise + PCA of 20,000 points: {pca:.3f} s (median of 5)  [target <= 1 s]  ({load()})")
    if args.json:
        from bench.common import Result

        rows = [
            Result("corpus", f"{model.name} corpus job over {len(sentences)} bundled sentences (batched, every layer "
                   f"in {layers})", job, "s", 60.0, note=f"{n_tok} tokens, {result.table.num_rows} rows; {load()}"),
            Result("corpus", "corpus job per sentence / tracing the sentences one at a time", job / len(sentences) / one,
                   "x", 0.5, note=f"{1000 * job / len(sentences):.2f} ms vs {1000 * one:.2f} ms per sentence; on the "
                                  f"same {len(single)} sentences {batched_same / one:.2f}x"),
            Result("corpus", "AttentionViz normalisation + PCA of 20,000 points (median of 5)", pca, "s", 1.0),
        ]
        print(json.dumps({"results": [r.to_dict() for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
