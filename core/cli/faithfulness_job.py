"""The faithfulness table over a corpus: which explanation is faithful on many sentences.

    python -m core faithfulness --model smollm2 --input corpus.txt --out table.csv [--ray [ADDRESS]]

    rows = core.cli.faithfulness_job.run(model, sentences)     # one row per (sentence, method)
    table = core.cli.faithfulness_job.summary(rows)            # one row per method: mean and spread

Each sentence gets core.analysis.faithfulness (every method and the seeded random floor, the
model's own top-1 next token as the target; random the mean of seeded draws, each method's
margin over it and its verdict against random's spread). The summary has, per method, the
mean and the standard deviation over sentences of comprehensiveness, sufficiency, their
difference and the margin over random, the number of sentences and on how many the method
stood above random; rows are sorted from most to least faithful (mean difference).
Sentences the model cannot read are skipped and listed. With Ray (`run_ray`), Ray Data maps
the same per-sentence function over the sentences; each worker loads the model by name once.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import pandas as pd

from ..errors import InputError
from ..analysis.input_attribution import FRACTIONS
from ..analysis.faithfulness_scores import faithfulness

ROW_COLUMNS = ["sentence_id", "method", "comprehensiveness", "sufficiency", "difference", "margin", "random_sd",
               "verdict", "target", "tokens"]


def sentence_rows(model, sid: int, text: str, methods=None, fractions=FRACTIONS, steps: int = 64) -> pd.DataFrame:
    df = faithfulness(model, text, methods=methods, fractions=fractions, steps=steps)
    tk = model.target_tokenizer if model.kind == "encoder-decoder" else model.tokenizer
    out = df[["method", "comprehensiveness", "sufficiency", "difference", "margin", "random_sd", "verdict"]].copy()
    out.insert(0, "sentence_id", sid)
    out["target"] = tk.token_str(df.attrs["target_id"])
    out["tokens"] = df.attrs["n_free"]
    return out[ROW_COLUMNS]


def run(model, sentences: Sequence[str], methods=None, fractions=FRACTIONS, steps: int = 64,
        progress: Optional[Callable[[int, int], None]] = None) -> Tuple[pd.DataFrame, List[Tuple[int, str]]]:
    """(one row per sentence and method, [(sentence_id, why skipped)])."""
    frames, skipped = [], []
    for sid, text in enumerate(sentences):
        try:
            frames.append(sentence_rows(model, sid, text, methods, fractions, steps))
        except (InputError, ValueError) as exc:
            skipped.append((sid, str(exc)))
        if progress:
            progress(sid + 1, len(sentences))
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ROW_COLUMNS)
    return rows, skipped


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean and standard deviation (over sentences) of comprehensiveness,
    sufficiency, difference and the margin over random, the number of sentences, and on how
    many of them the method stood above random (beyond the noise of random's draws, per
    sentence); most faithful first."""
    g = rows.groupby("method")
    out = pd.DataFrame({"sentences": g.size()})
    for col in ("comprehensiveness", "sufficiency", "difference", "margin"):
        out[f"{col}_mean"] = g[col].mean()
        out[f"{col}_std"] = g[col].std(ddof=1)
    out["above_random"] = g["verdict"].agg(lambda v: int((v == "above random").sum()))
    return out.sort_values("difference_mean", ascending=False).reset_index()


_WORKER_MODELS: dict = {}


def _ray_rows(batch, model_name: str, methods, fractions, steps: int) -> pd.DataFrame:
    from ..registry import load_model

    if model_name not in _WORKER_MODELS:
        _WORKER_MODELS.clear()
        _WORKER_MODELS[model_name] = load_model(model_name, device="cpu")
    model = _WORKER_MODELS[model_name]
    frames = []
    for sid, text in zip(batch["sentence_id"], batch["text"]):
        try:
            frames.append(sentence_rows(model, int(sid), str(text), methods, fractions, steps))
        except (InputError, ValueError):
            pass
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ROW_COLUMNS)


def run_ray(model_name: str, sentences: Sequence[str], methods=None, fractions=FRACTIONS, steps: int = 64,
            address: Optional[str] = None, init_kwargs: Optional[dict] = None):
    """`run` on Ray Data: one task per sentence (`address` a cluster's, None a local Ray)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'attention-lab[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "", "local") else address, **(init_kwargs or {}))
    ds = ray.data.from_items([{"sentence_id": i, "text": t} for i, t in enumerate(sentences)])
    ds = ds.map_batches(_ray_rows, batch_size=1, batch_format="pandas",
                        fn_kwargs={"model_name": model_name, "methods": methods, "fractions": tuple(fractions),
                                   "steps": steps})
    rows = ds.to_pandas()
    rows = rows.sort_values(["sentence_id", "method"]).reset_index(drop=True) if len(rows) else rows
    done = set(rows["sentence_id"]) if len(rows) else set()
    skipped = [(i, "the model could not read it") for i in range(len(sentences)) if i not in done]
    return rows, skipped


def main(args) -> int:
    """`python -m core faithfulness` (core/cli/commands.py parses the arguments)."""
    from pathlib import Path

    from ..registry import load_model
    from .corpus_job import ProgressBar, read_sentences

    path = Path(args.input)
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    sentences = read_sentences(path.read_text(encoding="utf-8", errors="replace"))
    if not sentences:
        raise InputError(f"{path} holds no sentences (one a line)")
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
    fractions = tuple(float(f) for f in args.fractions.split(",")) if args.fractions else FRACTIONS
    t0 = time.perf_counter()
    if args.ray is not None:
        print(f"faithfulness: {len(sentences)} sentences on Ray ({args.ray or 'a local Ray'})", file=sys.stderr)
        rows, skipped = run_ray(args.model, sentences, methods, fractions, args.steps, address=args.ray or None)
    else:
        model = load_model(args.model, device=args.device)
        print(f"faithfulness: {len(sentences)} sentences, {model.name} on {model.device}", file=sys.stderr)
        rows, skipped = run(model, sentences, methods, fractions, args.steps, progress=ProgressBar())
    for sid, why in skipped[:10]:
        print(f"skipped sentence {sid}: {why}", file=sys.stderr)
    if not len(rows):
        raise InputError("no sentence could be explained")
    table = summary(rows)
    table.to_csv(args.out, index=False)
    if args.per_sentence:
        rows.to_csv(args.per_sentence, index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"), file=sys.stderr)
    print(f"{args.out}: {len(table)} methods over {rows['sentence_id'].nunique()} sentences "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0
