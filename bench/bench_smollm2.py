"""Timings for the smollm2 model in our core (a plain script; prints figures).

    python bench/bench_smollm2.py [--device cpu|cuda] [--repeats 3] [--threads N]

1. first load: read the GGUF, dequantise every tensor, write the converted cache (into a
   fresh temporary cache folder, removed afterwards);
2. cached load: median of N loads that read the cache;
3. trace: one traced forward pass on a 16-token prompt (median of N, after one warm-up);
4. steps: a 10-token greedy generation via model.steps() (KV-cached greedy decoding, then
   one traced pass over prompt + output), and the same 10 tokens via model.generate().

On a small shared machine, torch's OpenMP threads slow down badly when other processes
keep the cores busy (the load average is printed); --threads 1 gives steadier figures there.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.loaders import smollm2, smollm2_files  # noqa: E402
from core.device import device_name, pick_device  # noqa: E402

PROMPT_16 = "The quick brown fox jumps over the lazy dog, and then it runs into the"  # 16 tokens


def machine_info(device: torch.device) -> None:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    print("machine")
    print(f"  python {platform.python_version()}, torch {torch.__version__}, {platform.system()} {platform.release()}")
    print(f"  cpu: {cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, memory {mem}")
    print(f"  load average: {', '.join(f'{x:.2f}' for x in load)}  (other work on the machine slows every figure)")
    print(f"  device: {device} ({device_name(device)})")


def timed(fn):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    machine_info(device)
    gguf = smollm2_files.gguf_path()
    print(f"  gguf: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB)")

    with tempfile.TemporaryDirectory(prefix="attention-lab-bench-") as tmp:
        os.environ[smollm2_files.CACHE_ENV] = tmp
        t_first, model = timed(lambda: smollm2.load(device=device))
        assert model.info["loaded_from"] == "gguf"
        entry = Path(model.info["cache"])
        size = sum(f.stat().st_size for f in entry.iterdir()) / 2**20
        del model
        cached = []
        for _ in range(args.repeats):
            t, model = timed(lambda: smollm2.load(device=device))
            assert model.info["loaded_from"] == "cache"
            cached.append(t)
        print("load")
        print(f"  first load (parse GGUF, dequantise, write cache): {t_first:.2f} s  -> cache {size:.0f} MiB")
        print(f"  cached load: median {statistics.median(cached):.2f} s of {', '.join(f'{t:.2f}' for t in cached)}")
        print(f"  parameters: {model.net.num_parameters():,} (float32)")

        n = len(model.tokenizer.encode(PROMPT_16).ids)
        assert n == 16, n
        model.trace(PROMPT_16)  # warm-up
        traces = [timed(lambda: model.trace(PROMPT_16)) for _ in range(args.repeats)]
        tr = traces[-1][1]
        mib = tr.nbytes() / 2**20
        print("trace")
        print(
            f"  {n}-token prompt: median {statistics.median(t for t, _ in traces) * 1000:.0f} ms "
            f"(forward {tr.meta['timings']['forward_ms']:.0f} ms), {len(tr)} tensors, {mib:.1f} MiB"
        )
        print(f"  next tokens: {tr['next.tokens'][:3]}")

        prompt = "The capital of France is"
        t_steps, steps = timed(lambda: model.steps(prompt, max_new_tokens=10))
        t_gen, (gen, _) = timed(lambda: model.generate(prompt, max_new_tokens=10))
        print("generation (greedy, 10 new tokens)")
        print(f"  model.steps():    {t_steps:.2f} s  ({len(steps)} traces: {''.join(s.meta['chosen'] for s in steps)!r})")
        print(f"  model.generate(): {t_gen:.2f} s  (untraced: {''.join(gen)!r})")


if __name__ == "__main__":
    main()
