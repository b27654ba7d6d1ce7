"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"): the task on which a
fixed-size state and softmax attention part ways.

A sequence first lists key-value pairs, then asks for the keys again, each followed by its
value:

    context   f 7 c 2 q 7 a 11            (4 pairs: key, value, key, value, ...)
    queries   c 2 a 11 f 7 q 7            (every key once, in a new order, each with its value)

At each query key the model must predict the value that followed that key in the context.
Softmax attention can look the key up (a previous-token head writes each key into its value's
position; the next layer's query finds it); a layer with a fixed-size state must have kept
every pair in that state, and as the pairs grow it holds them less well.

Keys and values are words of their own (letters and numbers), so the bundled models read
as text on every page. Everything here is plain Python and torch: no model, no page.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

KEYS = [chr(ord("a") + i) for i in range(24)]  # a ... x
VALUES = [str(i) for i in range(24)]  # 0 ... 23
SPECIALS = ["<pad>", "<unk>"]
MAX_PAIRS = 24
PAIR_COUNTS = (2, 4, 8, 12, 16, 20, 24)  # the accuracy curve's x axis
RECALL_DIR = Path(__file__).resolve().parents[2] / "assets" / "recall"  # one folder per mixer


def vocab() -> List[str]:
    return SPECIALS + KEYS + VALUES


@dataclass
class Example:
    tokens: List[str]
    n_pairs: int
    # positions of the query keys (where the value is predicted) and, for each, the position
    # of the same key in the context (whose value is the answer)
    query_positions: List[int]
    answer_key_positions: List[int]
    answers: List[str]

    def text(self) -> str:
        return " ".join(self.tokens)


def make_example(n_pairs: int, rng: random.Random) -> Example:
    """One MQAR sequence of n_pairs distinct keys (values may repeat), then every key queried."""
    if not 1 <= n_pairs <= len(KEYS):
        raise ValueError(f"n_pairs must be in 1..{len(KEYS)}, not {n_pairs}")
    keys = rng.sample(KEYS, n_pairs)
    values = [rng.choice(VALUES) for _ in keys]
    tokens: List[str] = []
    where = {}
    for k, v in zip(keys, values):
        where[k] = len(tokens)
        tokens += [k, v]
    order = rng.sample(range(n_pairs), n_pairs)
    qpos, kpos, answers = [], [], []
    for i in order:
        qpos.append(len(tokens))
        kpos.append(where[keys[i]])
        answers.append(values[i])
        tokens += [keys[i], values[i]]
    return Example(tokens, n_pairs, qpos, kpos, answers)


def batch(n_pairs: int, size: int, rng: random.Random, index: Optional[dict] = None):
    """(ids (size, 4 n_pairs), targets (size, 4 n_pairs) with -100 off the query positions):
    targets[b, p] is the id to predict after reading position p."""
    index = index or {w: i for i, w in enumerate(vocab())}
    ids, tgt = [], []
    for _ in range(size):
        ex = make_example(n_pairs, rng)
        row = [index[t] for t in ex.tokens]
        t = [-100] * len(row)
        for p in ex.query_positions:
            t[p] = row[p + 1]
        ids.append(row)
        tgt.append(t)
    return torch.tensor(ids), torch.tensor(tgt)


@torch.no_grad()
def accuracy(logits_fn, n_pairs: int, n_examples: int, seed: int, size: int = 64) -> float:
    """The share of query keys whose value is the model's top prediction. logits_fn(ids (B, n))
    -> logits (B, n, V). The same seed gives the same sequences."""
    rng = random.Random(seed * 1000 + n_pairs)
    right = total = 0
    left = n_examples
    while left > 0:
        ids, tgt = batch(n_pairs, min(size, left), rng)
        pred = logits_fn(ids).argmax(-1)
        on = tgt != -100
        right += int((pred[on] == tgt[on]).sum())
        total += int(on.sum())
        left -= ids.shape[0]
    return right / total


def curve(logits_fn, counts: Sequence[int] = PAIR_COUNTS, n_examples: int = 256, seed: int = 1) -> dict:
    """Accuracy per number of pairs, on held-out sequences (seed 1; training draws from seed 0)."""
    return {int(n): accuracy(logits_fn, n, n_examples, seed) for n in counts}


def shipped_curves(folder: Path = RECALL_DIR) -> Dict[str, Dict[int, float]]:
    """The recall models' accuracy by number of pairs, as their training run measured it
    (assets/recall/<mixer>/metrics.json), mixer -> {pairs: accuracy}; {} where none is shipped."""
    out = {}
    for f in sorted(Path(folder).glob("*/metrics.json")):
        meta = json.loads(f.read_text())
        out[meta["mixer"]] = {int(k): float(v) for k, v in meta["accuracy"].items()}
    return out
