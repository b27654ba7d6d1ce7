"""What every benchmark shares: the machine and versions, alternating timers, texts of an
exact token length, and one result row per target."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PASSAGE = (
    "the river bank was quiet in the morning and the old man walked along the water to the "
    "town where people sold fish bread and fruit from small boats while children ran across "
    "the bridge and the sun rose over the hills behind the church "
)


@dataclass
class Result:
    """One figure against its target: met when value <= target (lower is better)."""

    section: str
    name: str
    value: Optional[float]
    unit: str
    target: Optional[float] = None
    note: str = ""
    extra: Dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.value is None:
            return "not measured"
        if self.target is None:
            return "info"
        return "met" if self.value <= self.target else "missed"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        d = {k: v for k, v in d.items() if k != "status"}
        return cls(**d)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mem_total_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return "not installed"


def status_kib(field: str, pid="self") -> int:
    """A /proc/PID/status field in KiB (VmRSS, VmHWM); -1 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def chromium_version() -> str:
    import shutil
    import subprocess

    exe = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not Path(exe).exists():
        exe = shutil.which("chromium") or ""
    if not exe:
        return "not installed"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
        return out or "unknown"
    except Exception:
        return "unknown"


def machine_info() -> dict:
    """CPU, cores, load, memory, accelerator and library versions, for the report."""
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    cuda = torch.cuda.is_available()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in load],
        "memory_gib": round(mem_total_gib() or 0, 1),
        "os": f"{platform.system()} {platform.release()}",
        "libc": " ".join(platform.libc_ver()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "streamlit": _version("streamlit"),
        "plotly": _version("plotly"),
        "playwright": _version("playwright"),
        "chromium": chromium_version(),
        "torch_threads": torch.get_num_threads(),
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cuda_version": torch.version.cuda,
    }


def text_of(model, n: int) -> str:
    """A text that minilm tokenizes to exactly n positions ([CLS] + n - 2 one-piece words + [SEP])."""
    words = (PASSAGE * (n // 40 + 2)).split()[: n - 2]
    text = " ".join(words)
    got = len(model.tokenizer.encode(text))
    assert got == n, (n, got)
    return text


def alternate(fns: Dict[str, Callable[[], object]], rounds: int, warmup: int = 1,
              sync: Callable[[], None] = lambda: None) -> Dict[str, Dict[str, List[float]]]:
    """Run each function once per round, round after round, so that load on a shared machine
    hits them alike. Returns per name the wall and process-CPU seconds of every round."""
    out = {k: {"wall": [], "cpu": []} for k in fns}
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            sync()
            c, t = time.process_time(), time.perf_counter()
            res = fn()
            sync()
            out[name]["wall"].append(time.perf_counter() - t)
            out[name]["cpu"].append(time.process_time() - c)
            del res
    return out


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(a: List[float], b: List[float]) -> float:
    """Median of the per-round ratios a_i / b_i (each pair ran back to back)."""
    return statistics.median(x / y for x, y in zip(a, b)) if a and b else float("nan")


def trace_from_ids(model, ids, toks):
    """A Trace of exactly these token ids (no tokenizer round trip), as model.trace builds one."""
    tensors, ms, runner = model._run_traced(None, ids) if model.kind == "decoder" else model._run_traced(ids, None)
    return model._finish(tensors, {"source": toks, "target": toks},
                         {"model": model.name, "kind": model.kind, "config": model.config.to_dict()}, runner)


def smol_ids(model, n: int):
    """n token ids of English text for smollm2 (the notes' passage, repeated)."""
    ids = model.tokenizer.encode(PASSAGE * (n // 20 + 2)).ids
    return list(ids[:n])
