"""The lecture notes are cited by name (viz.figures.citations), and "seed" is left to random seeds."""

from pathlib import Path

import pytest

import core

from viz.figures.citations import NOTES, cite_text

# The notes live beside the checkout: <dir>/main (the project) and <dir>/shared/seeds.
ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT.parent / "shared" / "seeds"


@pytest.mark.parametrize("raw, want", [
    ("(seed 003 eq. 18)", "(Transformers handout eq. 18)"),
    ("Seed 000's example", "Bishop ch. 12's example"),
    ("seeds 001/003", "Chapter 9 and Transformers handout"),
    ("seeds 000-004", "the lecture notes"),
    ("Random seed 42", "Random seed 42"),
])
def test_cite_text(raw, want):
    assert cite_text(raw) == want


def test_titles_are_the_files_own():
    assert SEEDS.is_dir(), (f"the lecture notes are expected in {SEEDS} (../shared/seeds beside the project's "
                            "checkout): put the shared folder there")
    for number, notes in NOTES.items():
        found = sorted(SEEDS.glob(f"{number}_*.txt"))
        assert len(found) == 1, (number, f"expected one {number}_*.txt in {SEEDS}, found {found}")
        (path,) = found
        head = " ".join(path.read_text(encoding="utf-8").split()[:40]).replace("#", "")
        first = notes.title.split(":")[-1].strip().split()[0]  # "Transformers", "Attention", "Transformer"
        assert first in head, (number, head[:120])


def test_every_concept_of_the_notes_links_to_a_page_that_opens_on_it(app_test):
    """The Lecture notes page maps each concept to a page of the registry; each link opens that
    page on its example and model with no warning and no exception."""
    from conftest import assert_no_exception

    from viz.figures.citations import CONCEPTS, NOTES
    from viz.ui import registry

    assert {c.notes for c in CONCEPTS} == set(NOTES)  # every set of notes has its concepts
    for c in CONCEPTS:
        assert c.page in registry.BY_KEY, c
        if not core.MODELS[c.model].available():
            continue
        at = app_test(c.page, model=c.model, text=c.text, **dict(c.params))
        at.run(timeout=300)
        assert_no_exception(at)
        assert not at.warning and not at.error, (c.idea, [w.value for w in at.warning] + [e.value for e in at.error])
        assert at.title[0].value == registry.page(c.page).heading
