"""Faithfulness of attributions on the user's sentence (DeYoung et al. 2020): rank the tokens
by each method's scores (core/analysis/input_attribution.py), replace the top fraction of them
(comprehensiveness) or all but it (sufficiency) by the baseline token's embedding, and see how
much p(target) falls. Random is the floor, as a distribution: RANDOM_DRAWS seeded random
rankings, their mean and spread; each method's margin over random is read against that spread
("indistinguishable from random" within NOISE_SDS standard deviations), and equal scores share
a rank. Every perturbed input goes through the `embed.{stack}.tokens` hook point, each
distinct one once, batched.

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


RANDOM_DRAWS = 20  # seeded random rankings: random is a distribution (its mean and spread), not one draw
NOISE_SDS = 2.0  # a margin over random within this many of random's standard deviations is noise
TIE_TOL = 5e-5  # differences this close are ties (equal at the four decimals the page shows)


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
                             seed: int = RANDOM_SEED, progress: Progress = None, fix_first: bool = False,
                             draws: int = RANDOM_DRAWS) -> pd.DataFrame:
    """The faithfulness table of given rankings (method -> per-position scores) and of random:
    one row per method, sorted from most to least faithful (comprehensiveness minus
    sufficiency, highest first), with how each stands against random.

    Random is a distribution, not one draw: `draws` seeded random rankings (seeds seed ..
    seed + draws - 1); its row holds their mean, and every row's `random_sd` their standard
    deviation of the difference. `margin` is a row's difference minus random's mean;
    `verdict` says "above random" / "below random" where the margin exceeds
    NOISE_SDS standard deviations of random (and TIE_TOL), else "indistinguishable from
    random". `rank` is shared by ties (differences within TIE_TOL: equal at four decimals),
    `tied` marks them. `fix_first` leaves token 0 (the attention sink) in place in every
    perturbed input, as integrated gradients does with that option (and the positions in
    s.fixed always).

    df.attrs["curves"]: the deletion curves (method -> p(target) after replacing the top k
    tokens, k = 0 .. the number of replaceable tokens; random's the mean over the draws,
    df.attrs["random_curve_sd"] their standard deviation); df.attrs["random_draws"]: each
    draw's comprehensiveness, sufficiency and difference; df.attrs["p_full"]: p(target | x)."""
    n = s.n
    fixed = set(s.fixed) | ({0} if fix_first and n > 1 else set())
    free = [i for i in range(n) if i not in fixed]
    draws = int(draws)
    if draws < 2:
        raise ValueError(f"random needs at least 2 draws to have a spread, not {draws}")
    scores = {m: sc for m, sc in scores.items() if m != "random"}
    randoms = {f"random#{j}": random_scores(n, seed + j) for j in range(draws)}
    rankings = {**scores, **randoms}
    fractions = [float(f) for f in fractions]
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1], not {fractions}")
    if not free:
        raise ValueError("no token is left to replace (every position is held fixed)")
    masks, index = [np.zeros(n, dtype=bool)], {}
    for m, sc in rankings.items():
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
    measured, curves = {}, {}
    for m in rankings:
        comp = float(np.mean([p_full - p[index[(m, "del", _k_of(f, len(free)))]] for f in fractions]))
        suff = float(np.mean([p_full - p[index[(m, "keep", _k_of(f, len(free)))]] for f in fractions]))
        measured[m] = (comp, suff, comp - suff)
        curves[m] = [p_full] + [float(p[index[(m, "del", k)]]) for k in range(1, len(free) + 1)]
    rand = np.array([measured[m] for m in randoms])  # (draws, 3)
    r_mean, r_sd = rand.mean(0), rand.std(0, ddof=1)
    rows = [{"method": m, "comprehensiveness": c, "sufficiency": su, "difference": d}
            for m, (c, su, d) in measured.items() if m in scores]
    rows.append({"method": "random", "comprehensiveness": float(r_mean[0]), "sufficiency": float(r_mean[1]),
                 "difference": float(r_mean[2])})
    df = pd.DataFrame(rows)
    df["margin"] = df["difference"] - float(r_mean[2])
    df["random_sd"] = float(r_sd[2])
    df["verdict"] = [verdict(mg, float(r_sd[2])) if m != "random" else f"random: mean of {draws} draws"
                     for m, mg in zip(df["method"], df["margin"])]
    df = df.sort_values("difference", ascending=False, kind="stable").reset_index(drop=True)
    d = df["difference"].to_numpy()
    df["rank"] = [1 + int(np.sum(d > v + TIE_TOL)) for v in d]
    df["tied"] = [bool(np.sum(np.abs(d - v) <= TIE_TOL) > 1) for v in d]
    random_curves = np.array([curves.pop(m) for m in randoms])
    curves["random"] = random_curves.mean(0).tolist()
    # attrs hold plain lists and numbers only (pandas compares attrs when it combines frames)
    df.attrs.update(curves={m: curves[m] for m in list(scores) + ["random"]}, p_full=p_full, target_id=s.target_id,
                    n_free=len(free), fractions=fractions, baseline_token_id=s.baseline_id, seed=seed, draws=draws,
                    fixed=sorted(fixed), fix_first=bool(fix_first),
                    random_curve_sd=random_curves.std(0, ddof=1).tolist(),
                    random_draws=[{"seed": seed + j, "comprehensiveness": float(c), "sufficiency": float(su),
                                   "difference": float(dd)} for j, (c, su, dd) in enumerate(rand)],
                    scores={**{m: [float(v) for v in np.asarray(sc)] for m, sc in scores.items()},
                            "random": [float(v) for v in randoms["random#0"]]})
    return df


def verdict(margin: float, random_sd: float) -> str:
    """How a method's difference stands against random's: beyond NOISE_SDS standard deviations
    of random's draws (and beyond TIE_TOL) above or below, else indistinguishable."""
    bar = max(NOISE_SDS * random_sd, TIE_TOL)
    if margin > bar:
        return "above random"
    if margin < -bar:
        return "below random"
    return "indistinguishable from random"


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
                 fix_first: bool = False, seed: int = RANDOM_SEED, progress: Progress = None,
                 draws: int = RANDOM_DRAWS) -> pd.DataFrame:
    """One row per method (every method, plus "random": the mean of `draws` seeded random
    rankings; faithfulness_from_scores for the margin, spread, verdict and ties columns, and for
    `fix_first`, which holds token 0 on the path and in every perturbed input): comprehensiveness = mean over
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
                                  part(0.6, 1.0), fix_first=fix_first, draws=draws)
    if "integrated_gradients" in attrs:
        df.attrs["completeness_error"] = attrs["integrated_gradients"].attrs["completeness_error"]
    return df
