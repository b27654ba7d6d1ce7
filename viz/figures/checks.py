"""Checks: two independently computed values compared with a stated tolerance (`Check`), and the
tolerances a float64 recomputation is held to against the core's numbers. The pages show them
beside what they check (viz.ui.widgets.show_checks): the Inside page's steps (viz/inside/step_checks.py),
the Positions page's P and X, the Patching page's whole-stream restore, the Playground's learned scores
(`scaled_check`, against viz/figures/reference.py's float64 numpy layer)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core import trace_names as tn
from viz.figures.heatmaps import to_numpy
from viz.figures.reference import reference_layer

# Tolerance of a float64 recomputation against the core's numbers, relative to the values'
# scale (largest |value|, at least 1): float32 rounding through a layer stays near 1e-6.
RTOL = {"torch.float64": 1e-9, "torch.float32": 1e-4, "torch.float16": 1e-2, "torch.bfloat16": 3e-2}


@dataclass
class Check:
    """Two independently computed values compared: the largest |difference| against `tol`."""

    label: str
    error: float
    tol: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error) and self.error <= self.tol)

    def text(self) -> str:
        mark = "✓" if self.ok else "✗ FAILED:"
        return f"{mark} {self.label} (max abs error {self.error:.1e}, tolerance {self.tol:.1e})"


def max_abs_diff(a, b) -> float:
    """Largest |a - b| over cells where both are finite; inf when the -inf patterns differ."""
    a = to_numpy(a).astype(np.float64)
    b = to_numpy(b).astype(np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not np.array_equal(np.isneginf(a), np.isneginf(b)):
        return float("inf")
    fin = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[fin] - b[fin]).max()) if fin.any() else 0.0


def tolerance(ref, rtol: float = 1e-4) -> float:
    """rtol x max(1, largest finite |ref|)."""
    r = to_numpy(ref).astype(np.float64)
    fin = r[np.isfinite(r)]
    scale = float(np.abs(fin).max()) if fin.size else 1.0
    return rtol * max(1.0, scale)


def rtol_of(trace) -> float:
    """The relative tolerance (RTOL) for the dtype of the trace's model weights; 1e-4 without a model."""
    runner = getattr(trace, "runner", None)
    net = getattr(getattr(runner, "model", None), "net", None)
    if net is None:
        return 1e-4
    return RTOL.get(str(next(net.parameters()).dtype), 1e-4)


NUMPY = "float64 numpy, from the stored input and the checkpoint's weights"


def scaled_check(trace, stack: str, layer: int, head: int, shown) -> Check:
    """`shown` (a head's scaled scores as a page computed them from the recorded Q and K) against
    viz.figures.reference's float64 recomputation of the same head from the layer's stored input and the
    checkpoint's weights. Raises NoReference where the trace has no model."""
    ref = reference_layer(trace, stack, layer, {tn.SELF: head})
    mine = ref[tn.local(tn.SELF, f"maps{head}")]["scaled"]
    return Check(f"the learned scores shown equal Q Kᵀ × scale recomputed in {NUMPY}", max_abs_diff(shown, mine),
                 tolerance(mine, rtol_of(trace)))
