"""One head's queries and keys in one 2-D picture (AttentionViz, Yeh et al. 2023).

    qn, kn = normalise(Q, K)                  # Q, K: (N, d_k) one head's query and key vectors
    xy = project(qn, kn, "pca")               # (2N, 2): the N queries, then the N keys

Normalisation, exactly (it changes no attention weight): with a > 0,
        q_i'' = a q_i,    k_j'' = (k_j - mean(k)) / a + a mean(q)
  1. q and k scaled by a and 1/a: every dot product q . k is unchanged;
  2. the keys translated so that their centroid is the queries' (a mean(q)): each query's
     scores all move by the same constant, which softmax ignores;
  3. a is the one scale at which both then have the same mean norm,
         mean_j |k_j''| = mean_i |q_i''|,
     found by bisection on log a: as a -> 0 the keys' mean norm (~ mean|k - mean k| / a)
     exceeds the queries' (mean|q| a); as a -> inf it tends to |mean(q)| a <= mean|q| a;
     the two cross in between (where all queries are equal they never do, and
     a = sqrt(mean|k - mean k| / mean|q|) is used).
Then queries and keys are projected together (one fit on the 2N points), so a query lands
near the keys it scores highly.

Projections: "pca" (numpy's SVD of the centred points: the top two principal axes),
"tsne" (scikit-learn, PCA-initialised, seed 0), "umap" (umap-learn, seed 0; optional).
"""

from __future__ import annotations

import os
from typing import Tuple

import numpy as np

from ..device import THREADS_VAR

PROJECTIONS = {"pca": "PCA", "tsne": "t-SNE", "umap": "UMAP"}


class ProjectionUnavailable(RuntimeError):
    """The projection's package is not installed; the message says how to install it."""


def normalise(q: np.ndarray, k: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """AttentionViz's normalisation (see the module docstring): q -> a q, k -> (k - mean k) / a
    + a mean q, with a such that both mean norms are equal. No attention weight changes."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    mu_q, kc = q.mean(axis=0), k - k.mean(axis=0)
    m_q = np.linalg.norm(q, axis=1).mean()
    m_kc = np.linalg.norm(kc, axis=1).mean()
    if m_q == 0 or m_kc == 0:  # degenerate: all queries zero, or all keys equal
        return q, kc + mu_q

    def gap(log_a: float) -> float:  # log(mean key norm / mean query norm) at scale a
        a = np.exp(log_a)
        return np.log(np.linalg.norm(kc / a + a * mu_q, axis=1).mean()) - np.log(a * m_q)

    mid = 0.5 * np.log(m_kc / m_q)  # where the norms would meet with mean(q) = 0
    lo, hi = mid - 30.0, mid + 30.0
    if gap(hi) > 0:  # queries all equal: |mean q| = mean |q|, the norms never cross
        log_a = mid
    else:
        for _ in range(80):  # gap(lo) > 0 > gap(hi)
            m = 0.5 * (lo + hi)
            lo, hi = (m, hi) if gap(m) > 0 else (lo, m)
        log_a = 0.5 * (lo + hi)
    a = np.exp(log_a)
    return q * a, kc / a + a * mu_q


def pca(x: np.ndarray, n: int = 2) -> np.ndarray:
    """The rows of x on their top-n principal axes (centred; SVD), signs fixed so that each
    axis's largest coordinate is positive (the same picture on every run)."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)  # vt: (min(N, d), d)
    axes = vt[:n]
    y = xc @ axes.T  # (N, n)
    signs = np.sign(y[np.abs(y).argmax(axis=0), range(y.shape[1])])
    signs[signs == 0] = 1
    if y.shape[1] < n:  # fewer dimensions than asked: pad with zeros
        y = np.hstack([y, np.zeros((y.shape[0], n - y.shape[1]))])
        signs = np.concatenate([signs, np.ones(n - len(signs))])
    return y * signs


def project(q: np.ndarray, k: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """(2N, 2) coordinates: rows 0..N-1 the queries, N..2N-1 the keys, fitted together.

    BLAS and OpenMP run with $ATTENTION_LAB_THREADS threads (default 1), as the model does:
    on a shared machine more threads than free cores slow t-SNE by an order of magnitude."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn brings it; without it, the libraries' own defaults
        return _project(q, k, method, seed)
    with threadpool_limits(limits=max(1, int(os.environ.get(THREADS_VAR, 1)))):
        return _project(q, k, method, seed)


def _project(q, k, method: str, seed: int) -> np.ndarray:
    x = np.vstack([q, k])
    if method == "pca":
        return pca(x)
    if method == "tsne":
        from sklearn.manifold import TSNE

        perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3)))
        return TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity).fit_transform(x)
    if method == "umap":
        try:
            import umap
        except ImportError:
            raise ProjectionUnavailable("UMAP needs the umap-learn package: pip install 'attention-lab[umap]' "
                                        "(PCA and t-SNE work without it).") from None
        return umap.UMAP(n_components=2, random_state=seed, n_neighbors=min(15, max(2, len(x) - 1))).fit_transform(x)
    raise ValueError(f"unknown projection {method!r}; one of {', '.join(PROJECTIONS)}")


def joint_embedding(q: np.ndarray, k: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """normalise, then project: (2N, 2), queries first."""
    qn, kn = normalise(q, k)
    return project(qn, kn, method, seed)
