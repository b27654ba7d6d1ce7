"""Faithfulness of attributions on the user's sentence (DeYoung et al. 2020): rank the tokens
by each method's scores (core/analysis/input_attribution.py, plus a seeded random ranking as the
floor), replace the top fraction of them (comprehensiveness) or all but it (sufficiency) by the
baseline token's embedding, and see how much p(target) falls. Every perturbed input goes
through the `embed.{stack}.tokens` hook point, each distinct one once, batched.

    import core.analysis as ca
    ca.faithfulness(model, text)          # one row per method, most faithful first
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from .input_attribution import FRACTIONS, RANDOM_SEED, Progress, Setup, _check_methods, attribute_all


def _k_of(fraction: float, n: int) -> int:
    return min(n, max(1, int(math.floor(fraction * n + 0.5))))  # half up (round() would round 2.5 to 2)


def ranking(scores: np.ndarray, free: Sequence[int]) -> List[int]:
    """Positions in `free` from the highest score to the lowest (ties: earlier first)."""
    free = list(free)
    return sorted(free, key=lambda i: (-float(scores[i]), i))


def random_scores(n: int, seed: int = RANDOM_SEED) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n).astype(np.float64)


def _probs_of_masks(s: Setup, masks: List[np.ndarray], progress: Progress = None) -> np.ndarray:
    """p(target) with the positions of each boolean mask replaced by the baseline embedding,
    identical masks run once, in batches."""
    keys, unique = {}, []
    for m in masks:
        key = m.tobytes()
        if key not in keys:
            keys[key] = len(unique)
            unique.append(m)
    e, b = s.e, s.b
    probs = np.empty(len(unique))
    rows = s.batch_rows()
    with torch.no_grad():
        for start in range(0, len(unique), rows):
            chunk = torch.as_tensor(np.stack(unique[start:start + rows]), device=e.device)[:, :, None]  # (B, n, 1)
            emb = torch.where(chunk, b, e)
            probs[start:start + len(chunk)] = s.prob(emb).double().cpu().numpy()
            if progress:
                progress(min(1.0, (start + len(chunk)) / len(unique)), "perturbed passes")
    return np.array([probs[keys[m.tobytes()]] for m in masks])


def faithfulness_from_scores(s: Setup, scores: Dict[str, np.ndarray], fractions: Sequence[float] = FRACTIONS,
                             seed: int = RANDOM_SEED, progress: Progress = None) -> pd.DataFrame:
    """The faithfulness table of given rankings (method -> per-position scores; "random" is
    added): one row per method, sorted from most to least faithful (comprehensiveness minus
    sufficiency, highest first). df.attrs["curves"]: the deletion curves (method -> p(target)
    after replacing the top k tokens, k = 0 .. the number of replaceable tokens);
    df.attrs["p_full"]: p(target | x)."""
    n = s.n
    free = [i for i in range(n) if i not in s.fixed]
    scores = dict(scores)
    scores.setdefault("random", random_scores(n, seed))
    fractions = [float(f) for f in fractions]
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1], not {fractions}")
    masks, index = [np.zeros(n, dtype=bool)], {}
    for m, sc in scores.items():
        order = ranking(np.asarray(sc), free)
        for k in range(1, len(free) + 1):  # deletion curve (comprehensiveness reads it)
            mk = np.zeros(n, dtype=bool)
            mk[order[:k]] = True
            index[(m, "del", k)] = len(masks)
            masks.append(mk)
        for f in fractions:  # sufficiency: all but the top k replaced
            k = _k_of(f, len(free))
            mk = np.zeros(n, dtype=bool)
            mk[order[k:]] = True
            index[(m, "keep", k)] = len(masks)
            masks.append(mk)
    p = _probs_of_masks(s, masks, progress)
    p_full = float(p[0])
    rows, curves = [], {}
    for m in scores:
        comp = [p_full - p[index[(m, "del", _k_of(f, len(free)))]] for f in fractions]
        suff = [p_full - p[index[(m, "keep", _k_of(f, len(free)))]] for f in fractions]
        rows.append({"method": m, "comprehensiveness": float(np.mean(comp)), "sufficiency": float(np.mean(suff))})
        curves[m] = [p_full] + [float(p[index[(m, "del", k)]]) for k in range(1, len(free) + 1)]
    df = pd.DataFrame(rows)
    df["difference"] = df["comprehensiveness"] - df["sufficiency"]
    df = df.sort_values("difference", ascending=False, kind="stable").reset_index(drop=True)
    # attrs hold plain lists and numbers only (pandas compares attrs when it combines frames)
    df.attrs.update(curves=curves, p_full=p_full, target_id=s.target_id, n_free=len(free), fractions=fractions,
                    baseline_token_id=s.baseline_id, seed=seed,
                    scores={m: [float(v) for v in np.asarray(sc)] for m, sc in scores.items()})
    return df


def curves_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The deletion curves of a faithfulness table as a long frame: method, k (tokens
    replaced, most important first), fraction (k over the replaceable tokens), prob."""
    rows = []
    for m, probs in table.attrs["curves"].items():
        n = len(probs) - 1
        rows += [{"method": m, "k": k, "fraction": k / n if n else 0.0, "prob": p} for k, p in enumerate(probs)]
    return pd.DataFrame(rows, columns=["method", "k", "fraction", "prob"])


def faithfulness(model, text: str, methods=None, fractions: Sequence[float] = FRACTIONS, target=None,
                 baseline=None, steps: int = 64, baseline_token=None, position: Optional[int] = None,
                 fix_first: bool = False, seed: int = RANDOM_SEED, progress: Progress = None) -> pd.DataFrame:
    """One row per method (every method, plus "random", seeded): comprehensiveness = mean over
    fractions of p(target | x) - p(target | x with the top fraction of tokens replaced by the
    baseline token's embedding), sufficiency = the mean of p(target | x) - p(target | x with all
    BUT the top fraction replaced) (DeYoung et al. 2020); sorted from most to least faithful.
    df.attrs["curves"]: method -> p(target) after replacing the top k tokens, k = 0, 1, ...
    (curves_frame makes a long frame of them); df.attrs["scores"]: method -> per-position
    scores; df.attrs["completeness_error"]: integrated gradients' (when it ran)."""
    methods = _check_methods(methods)

    def part(lo, hi):
        return None if progress is None else (lambda f, what: progress(lo + (hi - lo) * f, what))

    s, attrs = attribute_all(model, text, methods, target, baseline, steps, baseline_token, position, fix_first,
                             part(0.0, 0.6))
    df = faithfulness_from_scores(s, {m: a["score"].to_numpy() for m, a in attrs.items()}, fractions, seed,
                                  part(0.6, 1.0))
    if "integrated_gradients" in attrs:
        df.attrs["completeness_error"] = attrs["integrated_gradients"].attrs["completeness_error"]
    return df
