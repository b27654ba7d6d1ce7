"""The KV-cache sweep over a corpus: perplexity against budget for several policies on many
documents, in-process or on Ray (as core/cli/corpus_job.py runs the corpus job).

    table = core.cli.evict_job.run(model, documents, policies=("window", "streaming"), budgets=(64, 128))
    table = core.cli.evict_job.run_ray("smollm2", documents, ...)   # one task per (document, policy, budget)

One row per (document, policy, budget): doc_id, policy, budget, n (positions read),
perplexity_full, perplexity, mean_kl, mean_mass_lost, seconds. A document the model cannot read
(empty, no words) is skipped and listed in table.attrs["skipped"] with why; a budget the policy
refuses (streaming at or below its sinks) likewise. snapkv needs a continuation: the document's
last `snapkv_continuation` share of characters is read as one (the rest is the prompt).
"""

from __future__ import annotations

import time
from typing import Iterable, Optional, Sequence

import pandas as pd

from ..errors import InputError
from ..analysis.evict import evict

COLUMNS = ["doc_id", "policy", "budget", "n", "perplexity_full", "perplexity", "mean_kl", "mean_mass_lost", "seconds"]


def _split(text: str, policy: str, share: float):
    if policy != "snapkv":
        return text, None
    cut = int(len(text) * (1 - share))
    return text[:cut], text[cut:]


def one(model, doc_id: int, text: str, policy: str, budget: int, sinks: int = 4, snapkv_continuation: float = 0.2):
    """The row of one (document, policy, budget), or (None, why) when it cannot run."""
    prompt, cont = _split(text, policy, snapkv_continuation)
    t0 = time.perf_counter()
    try:
        df = evict(model, prompt, policy, int(budget), sinks=sinks, continuation=cont)
    except (ValueError, InputError) as exc:
        return None, f"document {doc_id}, {policy} at {budget}: {exc}"
    return dict(doc_id=doc_id, policy=policy, budget=int(budget), n=len(df), perplexity_full=df.attrs["perplexity_full"],
                perplexity=df.attrs["perplexity"], mean_kl=float(df["kl"].mean()),
                mean_mass_lost=float(df["mass_lost"].mean()), seconds=time.perf_counter() - t0), None


def _table(rows, skipped) -> pd.DataFrame:
    out = pd.DataFrame([r for r in rows if r is not None], columns=COLUMNS)
    out = out.sort_values(["doc_id", "policy", "budget"], kind="stable").reset_index(drop=True)
    out.attrs["skipped"] = [s for s in skipped if s]
    return out


def run(model, documents: Sequence[str], policies: Iterable[str] = ("window", "streaming"),
        budgets: Iterable[int] = (64, 128, 256, 512), sinks: int = 4, snapkv_continuation: float = 0.2,
        progress=None) -> pd.DataFrame:
    """In-process: every (document, policy, budget), one after another."""
    jobs = [(i, p, b) for i in range(len(documents)) for p in policies for b in budgets]
    rows, skipped = [], []
    for k, (i, p, b) in enumerate(jobs):
        row, why = one(model, i, documents[i], p, b, sinks, snapkv_continuation)
        rows.append(row)
        skipped.append(why)
        if progress is not None:
            progress(k + 1, len(jobs))
    return _table(rows, skipped)


def _ray_batch(batch, model_name: str, model_kwargs: dict, sinks: int, share: float):
    """A Ray Data batch of jobs (doc_id, text, policy, budget) -> rows; the model loads once per worker."""
    from ..registry import load_model

    global _WORKER_MODEL
    key = (model_name, tuple(sorted(model_kwargs.items())))
    if _WORKER_MODEL is None or _WORKER_MODEL[0] != key:
        _WORKER_MODEL = (key, load_model(model_name, device="cpu", **model_kwargs))
    model = _WORKER_MODEL[1]
    out = {c: [] for c in COLUMNS + ["skipped"]}
    for i, text, p, b in zip(batch["doc_id"], batch["text"], batch["policy"], batch["budget"]):
        row, why = one(model, int(i), str(text), str(p), int(b), sinks, share)
        for c in COLUMNS:
            out[c].append(None if row is None else row[c])
        out["skipped"].append(why or "")
    return out


_WORKER_MODEL = None


def run_ray(model_name: str, documents: Sequence[str], policies: Iterable[str] = ("window", "streaming"),
            budgets: Iterable[int] = (64, 128, 256, 512), sinks: int = 4, snapkv_continuation: float = 0.2, *,
            address: Optional[str] = None, model_kwargs: Optional[dict] = None, init_kwargs: Optional[dict] = None
            ) -> pd.DataFrame:
    """The sweep on Ray Data, one job per row (each is seconds to minutes of work). `address`: a
    cluster's (None or "local": a local Ray started here); every worker needs this package and
    the model's weights."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("the sweep on Ray needs Ray: pip install 'attention-lab[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "", "local") else address, **(init_kwargs or {}))
    jobs = [{"doc_id": i, "text": documents[i], "policy": p, "budget": int(b)}
            for i in range(len(documents)) for p in policies for b in budgets]
    ds = ray.data.from_items(jobs).map_batches(
        _ray_batch, batch_size=1, batch_format="numpy",
        fn_kwargs={"model_name": model_name, "model_kwargs": dict(model_kwargs or {}), "sinks": sinks,
                   "share": snapkv_continuation})
    got = ds.to_pandas()
    rows = [None if pd.isna(r["n"]) else {c: r[c] for c in COLUMNS} for _, r in got.iterrows()]
    return _table(rows, list(got["skipped"]))
