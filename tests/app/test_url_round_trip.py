"""Every page that takes a sentence keeps it in the URL both ways, from the page registry (no
hand-kept list): opened with ?text=..., its text box shows that text and the URL still carries
it after the run; a sentence typed into the box replaces the URL's."""

import pytest

from conftest import assert_no_exception
from viz.ui import registry

PAGES = [p.key for p in registry.with_text() if p.reads_url]
FIRST, TYPED = "the old man sleeps near the river", "a cat sat on the warm mat"


def _url_text(at) -> str:
    v = at.query_params.get("text")
    return v[0] if isinstance(v, list) else v


def _box(at, label):
    boxes = [w for w in list(at.text_area) + list(at.text_input) if w.label.startswith(label)]
    assert boxes, f"no text box labelled {label!r}: {[w.label for w in list(at.text_area) + list(at.text_input)]}"
    return boxes[0]


def test_the_matrix_covers_every_page_with_a_sentence():
    assert len(PAGES) >= 11 and "home" in PAGES and "kvcache" in PAGES, PAGES


@pytest.mark.parametrize("page", PAGES)
def test_sentence_round_trips_through_the_url(app_test, page):
    spec = registry.page(page)
    at = app_test(page, text=FIRST, **spec.params)
    at.run(timeout=300)
    assert_no_exception(at)
    box = _box(at, spec.text_box)
    assert box.value == FIRST, (page, box.value)
    assert _url_text(at) == FIRST, (page, dict(at.query_params))
    box.input(TYPED).run(timeout=300)
    assert_no_exception(at)
    assert _box(at, spec.text_box).value == TYPED
    assert _url_text(at) == TYPED, (page, dict(at.query_params))
