"""The lecture notes are cited by name (viz.notes), and "seed" is left to random seeds."""

from pathlib import Path

import pytest

from viz.notes import NOTES, cite_text

SEEDS = Path("/work/shared/seeds")


@pytest.mark.parametrize("raw, want", [
    ("(seed 003 eq. 18)", "(Transformers handout eq. 18)"),
    ("Seed 000's example", "Bishop ch. 12's example"),
    ("seeds 001/003", "Chapter 9 and Transformers handout"),
    ("seeds 000-004", "the lecture notes"),
    ("Random seed 42", "Random seed 42"),
])
def test_cite_text(raw, want):
    assert cite_text(raw) == want


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the notes folder is not on this machine")
def test_titles_are_the_files_own():
    for number, notes in NOTES.items():
        (path,) = SEEDS.glob(f"{number}_*.txt")
        head = " ".join(path.read_text(encoding="utf-8").split()[:40]).replace("#", "")
        first = notes.title.split(":")[-1].strip().split()[0]  # "Transformers", "Attention", "Transformer"
        assert first in head, (number, head[:120])
