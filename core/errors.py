"""What can go wrong while a model runs, and what is done about it.

InputError is input the user can fix (empty text, nothing the tokenizer recognises, ...):
pages show its message. cpu_fallback wraps AttentionModel's entry points: a GPU that runs
out of memory hands the model to the CPU and the call runs again there.
"""

from __future__ import annotations

import functools

import torch

from .trace import Trace


class InputError(ValueError):
    """Input a user can fix (empty text, nothing the tokenizer recognises, ...)."""


def cpu_fallback(method):
    """Run `method`; if the GPU runs out of memory, move the model to the CPU, say so in
    `model.fallback_note` (and in the returned traces' metadata), and run it again."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except torch.OutOfMemoryError:
            if self.device.type == "cpu":
                raise
            lost = str(self.device)
            self.to_device(torch.device("cpu"))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.fallback_note = f"The GPU ({lost}) ran out of memory; {self.name} now runs on the CPU."
            result = method(self, *args, **kwargs)
            for t in result if isinstance(result, list) else [result]:
                if isinstance(t, Trace):
                    t.meta["fallback"] = self.fallback_note
            return result

    return wrapper
