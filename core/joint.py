"""One head's queries and keys in one 2-D picture (AttentionViz, Yeh et al. 2023).

    qn, kn = normalise(Q, K)                  # Q, K: (N, d_k) one head's query and key vectors
    xy = project(qn, kn, "pca")               # (2N, 2): the N queries, then the N keys

Normalisation, exactly (it changes no attention weight):
  1. translate the keys so that their centroid is the queries' centroid:
         k_j' = k_j - mean_j(k) + mean_i(q)
     a query's scores all move by the same q_i . (mean(q) - mean(k)), and softmax ignores a
     constant added to a row;
  2. scale both to the same mean norm, leaving every dot product q . k as it was:
         a = sqrt(m_k / m_q),  q_i'' = a q_i,  k_j'' = k_j' / a
     where m_q = mean_i |q_i| and m_k = mean_j |k_j'|; afterwards both mean norms are
     sqrt(m_q m_k).
Then queries and keys are projected together (one fit on the 2N points), so a query lands
near the keys it scores highly.

Projections: "pca" (numpy's SVD of the centred points: the top two principal axes),
"tsne" (scikit-learn, PCA-initialised, seed 0), "umap" (umap-learn, seed 0; optional).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

PROJECTIONS = {"pca": "PCA", "tsne": "t-SNE", "umap": "UMAP"}


class ProjectionUnavailable(RuntimeError):
    """The projection's package is not installed; the message says how to install it."""


def normalise(q: np.ndarray, k: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """AttentionViz's normalisation (see the module docstring): keys translated onto the
    queries' centroid, then both scaled to the same mean norm, every q . k unchanged."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    k = k - k.mean(axis=0) + q.mean(axis=0)  # centroids coincide
    m_q = np.linalg.norm(q, axis=1).mean()
    m_k = np.linalg.norm(k, axis=1).mean()
    if m_q == 0 or m_k == 0:
        return q, k
    a = np.sqrt(m_k / m_q)
    return q * a, k / a


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
    """(2N, 2) coordinates: rows 0..N-1 the queries, N..2N-1 the keys, fitted together."""
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
