"""The bundled corpus: assets/corpus/sentences.txt, one English sentence a line.

    python -m core.cli.corpus_data        # (re)writes the file; the same bytes every time

Every sentence is the project's own: the lecture notes' example sentences (seeds 000-004),
the example sentences the app's models show, then sentences drawn with a fixed seed from the
toy translation task's grammar (core.toy.toy_task.sample), held-out sentences included, without
repeats. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from ..toy import toy_task

CORPUS_DIR = Path(__file__).resolve().parents[2] / "assets" / "corpus"
CORPUS_FILE = CORPUS_DIR / "sentences.txt"
N_GRAMMAR = 1200
SEED = 2023

# The lecture notes' examples (seed 000-004), as the notes write them.
NOTES = [
    "I swam across the river to get to the other bank.",
    "I walked across the road to get cash from the bank.",
    "the bank told the man he was bankrupt",
    "then the bank told the man he was bankrupt",
    "Show me the money",
    "help me!",
    "Not on your life!",
]
# The examples the app's pages offer for its models (core.loaders.minilm.EXAMPLES, toy_task.EXAMPLES).
MODEL_EXAMPLES = [
    "The animal didn't cross the street because it was too tired.",
    "The trophy doesn't fit in the suitcase because it is too big.",
    "Attention is all you need.",
]


def sentences(n_grammar: int = N_GRAMMAR, seed: int = SEED) -> list[str]:
    """The corpus: notes, examples, then n_grammar distinct sentences of the toy grammar."""
    out: list[str] = []
    seen: set[str] = set()

    def add(s: str) -> None:
        if s not in seen:
            seen.add(s)
            out.append(s)

    for s in NOTES + MODEL_EXAMPLES + list(toy_task.EXAMPLES):
        add(s)
    rng = random.Random(seed)
    target = len(out) + n_grammar
    while len(out) < target:
        words, _, _ = toy_task.sample(rng)
        add(" ".join(words))
    return out


def load(path: Path = CORPUS_FILE) -> list[str]:
    """The bundled sentences (blank lines skipped)."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.cli.corpus_data", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=CORPUS_FILE)
    ap.add_argument("--n", type=int, default=N_GRAMMAR, help="sentences drawn from the toy grammar")
    args = ap.parse_args(argv)
    lines = sentences(args.n)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(lines)} sentences")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
