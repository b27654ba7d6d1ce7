"""Tolerances that follow from the precision of the two sides a test compares.

Each bound is a worst case of floating-point rounding that holds for ANY order of summation,
blocking, vector width or use of fused multiply-add (Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., Lemma 3.1 and §3.1: a sum of n terms computed in any order
is within gamma(n) * sum |terms| of the exact sum). A CPU whose BLAS or softmax kernel sums in
another order moves the rounding error within these bounds, never past them, so a test that
uses them passes on every CPU, and one that fails has found a difference larger than rounding.

u is the unit roundoff: 2^-24 for float32, 2^-53 for float64."""

from __future__ import annotations

import math

import torch

U32 = 2.0 ** -24
U64 = 2.0 ** -53
EXP_ULPS = 4  # a float32 exp/log is within 1 ulp in glibc and SLEEF's u10 kernels (what torch uses); 4 leaves room


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of n rounded operations."""
    assert n * u < 1, (n, u)
    return n * u / (1 - n * u)


def matmul_error(x: torch.Tensor, w: torch.Tensor, u: float = U32) -> torch.Tensor:
    """Elementwise bound on |fl(x @ w.T) - x @ w.T| for x (m, d) and w (V, d): gamma(d) times
    |x| @ |w|.T, computed in float64 (so the bound itself carries no float32 error)."""
    return gamma(x.shape[-1], u) * (x.double().abs() @ w.double().abs().T)


def rms_norm_rel_error(d: int, u: float = U32) -> float:
    """Relative error of each element of a float32 RMSNorm x / sqrt(mean(x^2) + eps) * g over d:
    the sum of squares (gamma(d) + u for the squaring), the mean, eps, sqrt (halves the error)
    and the division and gain (u each). Sum of the parts, rounded up."""
    return (gamma(d, u) + 2 * u) / 2 + 5 * u


def softmax_rel_error(logit_error: float, logit_range: float, vocab: int, u: float = U32) -> float:
    """Relative bound on each probability of a softmax computed in precision u from logits that
    are each within logit_error of exact.

    - logits off by at most D each: p_j' / p_j = e^(d_j) / sum_v p_v e^(d_v) lies in
      [e^(-2D), e^(2D)];
    - z_j - max z rounds by at most u |z_j - max z| <= u * logit_range, added to D;
    - each exp within EXP_ULPS ulps, the sum of vocab positive terms within gamma(vocab - 1)
      (any order), the division within u.
    With 1 + x <= e^x the product of these factors is at most e^(total) - 1."""
    d = logit_error + u * logit_range
    total = 2 * d + 2 * EXP_ULPS * u + gamma(max(vocab - 1, 1), u) + 2 * u
    return math.expm1(total)


def kl_bound(logit_error: float) -> float:
    """KL(p || q) for q = softmax(z + delta), p = softmax(z), |delta_v| <= D: KL equals
    log E_p[e^delta] - E_p[delta], which Hoeffding's lemma bounds by (2D)^2 / 8 = D^2 / 2."""
    return logit_error ** 2 / 2
