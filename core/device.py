"""Device choice: an explicit argument, then $ATTENTION_LAB_DEVICE, then CUDA > MPS > CPU."""

from __future__ import annotations

import os
from typing import Optional

import torch

ENV_VAR = "ATTENTION_LAB_DEVICE"


def pick_device(device: Optional[str] = None) -> torch.device:
    choice = device or os.environ.get(ENV_VAR) or None
    if choice and choice != "auto":
        dev = torch.device(choice)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for, but no CUDA GPU is available")
        if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise RuntimeError("device 'mps' was asked for, but Apple MPS is not available")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def device_name(dev: torch.device) -> str:
    """Human-readable name: the GPU's name, or 'CPU'."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "mps":
        return "Apple MPS"
    return "CPU"


THREADS_VAR = "ATTENTION_LAB_THREADS"


def configure_threads(default: int = 1) -> int:
    """Set torch's intra-op CPU threads from $ATTENTION_LAB_THREADS (else `default`).

    A server answers several sessions at once and shares the machine with the browser;
    with more intra-op threads than free cores, OpenMP's spinning threads slow each forward
    pass by one or two orders of magnitude, so the app runs one thread per request.
    """
    n = int(os.environ.get(THREADS_VAR, default))
    if n > 0 and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


KEEP_FREED_VAR = "ATTENTION_LAB_KEEP_FREED_MEMORY"
_kept_freed: Optional[bool] = None


def keep_freed_memory(mmap_threshold: int = 32 * 2**20, trim_threshold: int = 2**31 - 1) -> bool:
    """Ask glibc's malloc to keep freed memory in the process for the next allocation.

    A trace of n tokens allocates H x n x n float32 buffers per layer (12 MiB each for
    minilm at 512). By default glibc serves such blocks with mmap, or trims them off the
    heap when freed, so every forward pass page-faults fresh, zeroed memory from the kernel
    (what that cost: docs/decisions.md, "Measurements moved from the code"). With M_MMAP_THRESHOLD = 32 MiB
    (blocks below it come from the heap) and M_TRIM_THRESHOLD = 2 GiB (freed heap memory is
    kept), the next pass reuses the same pages. The price: the process's resident memory
    stays at its high-water mark instead of shrinking after a long input; the app bounds
    what it keeps (its trace cache is bounded in bytes), so the high-water mark is bounded too.

    Call it once at start-up, in the app process and in benchmarks (bench/ does); importing
    core never calls it.
    Returns True when set; False on platforms without glibc's mallopt or when
    $ATTENTION_LAB_KEEP_FREED_MEMORY is 0. Calling it again does nothing more.
    """
    global _kept_freed
    if _kept_freed is not None:
        return _kept_freed
    _kept_freed = False
    if os.environ.get(KEEP_FREED_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
    ok = bool(mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(mallopt(M_TRIM_THRESHOLD, int(trim_threshold)))
    _kept_freed = ok
    return ok


def release_freed_memory() -> bool:
    """Hand the memory malloc keeps freed back to the system (glibc's malloc_trim, every arena).

    keep_freed_memory keeps it for the next pass's speed, but each thread allocates from its
    own arena (a Streamlit server runs each session's script in a thread of its own), so what
    one session's trace freed is not reused by another's and the process's resident memory
    grows to the sum of the arenas' peaks. The app's admission gate calls this after a large
    job ends and after its caches drop results (viz/ui/gate.py; what it hands back:
    docs/decisions.md, "Measurements moved from the code"). Returns False where there is no
    glibc (nothing to do)."""
    global _trim
    if _trim is None:
        _trim = False
        import ctypes
        import platform

        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                _trim = ctypes.CDLL("libc.so.6").malloc_trim
                _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                _trim = False
    if not _trim:
        return False
    _trim(0)
    return True


_trim = None


def freeze_heap() -> int:
    """Collect garbage once, then move every object alive now out of the cyclic garbage
    collector's sight (gc.freeze); returns how many objects are frozen in all.

    A server that has imported torch, plotly and pandas and loaded a model holds 250,000 to
    350,000 container objects, and a full collection walks every one of them (what that took:
    docs/decisions.md, "Measurements moved from the code"). Streamlit runs a full collection
    after every script run, holding the interpreter lock while the page waits for its last
    messages, so each click would pay that time.
    Frozen objects are still freed by reference counting when nothing uses them; only a
    reference cycle among them would outlive its use. So call this when what is alive is
    meant to live as long as the process: after start-up imports, after loading a model.
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
