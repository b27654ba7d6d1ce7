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
