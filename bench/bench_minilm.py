"""Benchmark: minilm (all-MiniLM-L6-v2) in our core against transformers' BertModel.

    .venv/bin/python bench/bench_minilm.py [--runs 5] [--threads N] [--device cpu|cuda] [--keep-freed-memory]

Prints: load time; at 16, 128 and 512 tokens the median time of
    ours trace      model.trace(text): tokenize + traced forward (every intermediate) + Trace
    ours traced     net(ids, rec=Recorder()): the traced forward alone
    ours plain      net(ids): untraced forward (fused attention)
    hf eager+attn   BertModel(attn_implementation="eager")(ids, output_attentions=True)
    hf sdpa         BertModel(attn_implementation="sdpa")(ids)
timed alternately in one process (one run of each, round after round), so load on the
machine hits all of them alike; then the ratios ours / theirs and the size of a 512-token
Trace. A plain script, not a test; transformers is needed here only.

On a busy machine (load average above the number of cores) multi-threaded CPU timings
swing by 10x for everyone; compare with --threads 1 there. The traced forward keeps three
H x n x n tensors per layer (scores, scaled, weights) where transformers keeps one, so at
512 tokens it touches ~230 MB of fresh memory; THP_MEM_ALLOC_ENABLE=1 (PyTorch's switch for
transparent huge pages on large CPU allocations) cuts those page faults ~4x, and
--keep-freed-memory (glibc keeps freed memory for the next pass) removes them. Process CPU
time is printed beside wall time: with --threads 1 it is the fairer figure on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import core  # noqa: E402
from core.model import Recorder  # noqa: E402

LENGTHS = (16, 128, 512)
PASSAGE = (
    "the river bank was quiet in the morning and the old man walked along the water to the "
    "town where people sold fish bread and fruit from small boats while children ran across "
    "the bridge and the sun rose over the hills behind the church "
)


def text_of(model, n: int) -> str:
    """A text that tokenizes to exactly n positions ([CLS] + n - 2 one-piece words + [SEP])."""
    words = (PASSAGE * (n // 40 + 2)).split()[: n - 2]
    text = " ".join(words)
    got = len(model.tokenizer.encode(text))
    assert got == n, (n, got)
    return text


def keep_freed_memory() -> None:
    """Tell glibc's malloc to keep freed memory for reuse instead of handing it back to the
    OS (M_TRIM_THRESHOLD = 2 GiB, M_MMAP_THRESHOLD = 32 MiB): a new trace then reuses the
    pages of the last one instead of faulting in fresh, zeroed ones."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    ok = libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) and libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
    print(f"mallopt: keep freed memory ({'ok' if ok else 'failed'})")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds per length (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep-freed-memory", action="store_true",
                    help="glibc mallopt: never trim the heap, no mmap below 32 MB, so freed tensors are reused")
    args = ap.parse_args(argv)
    if args.keep_freed_memory:
        keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, device {core.device_name(device)}, threads {torch.get_num_threads()}, "
          f"cpus {os.cpu_count()}, load average {load:.2f}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '')!r}")
    if load > (os.cpu_count() or 1):
        print("warning: the machine is busy; timings are noisy (try --threads 1)")

    t0 = time.perf_counter()
    model = core.load_model("minilm", device=device)
    t_load_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = core.load_model("minilm", device=device)
    t_load = time.perf_counter() - t0
    print(f"load: first {t_load_first * 1000:.0f} ms (imports, cold files), again {t_load * 1000:.0f} ms")

    from transformers import BertModel  # test/bench-only dependency
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    folder = str(core.minilm.model_dir())
    t0 = time.perf_counter()
    eager = BertModel.from_pretrained(folder, attn_implementation="eager").eval().to(device)
    t_hf_load = time.perf_counter() - t0
    sdpa = BertModel.from_pretrained(folder, attn_implementation="sdpa").eval().to(device)
    print(f"transformers BertModel.from_pretrained: {t_hf_load * 1000:.0f} ms")

    rows = []
    for n in LENGTHS:
        text = text_of(model, n)
        ids = torch.tensor([model.tokenizer.encode(text).ids], device=device)
        fns = {
            "ours trace": lambda: model.trace(text),
            "ours traced": lambda: model.net(ids, rec=Recorder()),
            "ours plain": lambda: model.net(ids),
            "hf eager+attn": lambda: eager(ids, output_attentions=True),
            "hf sdpa": lambda: sdpa(ids),
        }
        wall = {k: [] for k in fns}
        cpu = {k: [] for k in fns}
        with torch.inference_mode():
            for fn in fns.values():  # warm-up
                fn()
            for _ in range(args.runs):
                for name, fn in fns.items():
                    sync(device)
                    c, t = time.process_time(), time.perf_counter()
                    fn()
                    sync(device)
                    wall[name].append(time.perf_counter() - t)
                    cpu[name].append(time.process_time() - c)
        ms = lambda d, f: {k: f(v) * 1000 for k, v in d.items()}  # noqa: E731
        rows.append((n, ms(wall, statistics.median), ms(wall, min), ms(cpu, statistics.median)))

    names = list(fns)
    print(f"\nms over {args.runs} alternating rounds: wall median (wall min) [process CPU median]")
    print(f"{'tokens':>6}  " + "  ".join(f"{k:>24}" for k in names))
    for n, med, low, cpu_med in rows:
        print(f"{n:>6}  " + "  ".join(f"{med[k]:>8.1f} ({low[k]:>6.1f}) [{cpu_med[k]:>6.1f}]" for k in names))
    print("\nratios ours/theirs: wall median (wall min) [CPU median]")
    print(f"{'tokens':>6}  {'trace/eager':>22}  {'traced/eager':>22}  {'plain/sdpa':>22}")
    for n, med, low, cpu_med in rows:
        def r(a, b):
            return f"{med[a] / med[b]:>5.2f} ({low[a] / low[b]:>5.2f}) [{cpu_med[a] / cpu_med[b]:>5.2f}]"

        print(f"{n:>6}  {r('ours trace', 'hf eager+attn'):>22}  {r('ours traced', 'hf eager+attn'):>22}  "
              f"{r('ours plain', 'hf sdpa'):>22}")

    tr = model.trace(text_of(model, 512))
    att = sum(tr[k].numel() * tr[k].element_size() for k in tr.names() if k.endswith((".scores", ".scaled", ".masked", ".weights")))
    print(f"\n512-token trace: {len(tr)} tensors, {tr.nbytes() / 2**20:.1f} MiB "
          f"({tr.nbytes()} bytes; {att / 2**20:.1f} MiB of it the H x n x n scores/scaled/masked/weights)")


if __name__ == "__main__":
    main()
