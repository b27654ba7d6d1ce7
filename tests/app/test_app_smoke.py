"""Every page, through the real app.py navigation: default state, an empty sentence, a
600-token sentence and nonsense URL values all render without an exception."""

import pytest

from conftest import assert_no_exception
from viz.ui import registry

PAGES = [p.key for p in registry.PAGES]  # every page of the sidebar (viz/ui/registry.py)
LONG = " ".join(["the small dog sees the cat"] * 100)  # 600 words


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_by_default(app_test, page):
    at = app_test(page)
    at.run()
    assert_no_exception(at)
    assert at.get("plotly_chart") or at.get("dataframe") or at.get("table"), f"{page} drew nothing"


@pytest.mark.parametrize("page", PAGES)
def test_page_survives_empty_long_and_bad_url(app_test, page):
    for params in ({"text": ""}, {"text": "   "}, {"text": LONG},
                   {"layer": "99", "head": "-3", "step": "x", "model": "no-such-model"}):
        at = app_test(page, **params)
        at.run()
        assert_no_exception(at)
        if registry.page(page).reads_url and (params.get("model") == "no-such-model" or params.get("layer") == "99"):
            assert at.warning, f"{page} {params}: no warning for impossible URL values"


@pytest.mark.parametrize("page", PAGES)
def test_page_says_what_it_answers(app_test, page):
    """Every page opens with its heading and, under it, the one line from the registry."""
    at = app_test(page)
    at.run()
    assert_no_exception(at)
    spec = registry.page(page)
    assert at.title and at.title[0].value == spec.heading
    assert any(c.value == f"**{spec.question}**" for c in at.caption), [c.value for c in at.caption][:3]


def test_sidebar_sections_follow_the_registry():
    """app.py's navigation is built from the registry: each section lists its pages in order."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "app.py").read_text(encoding="utf-8"))
    assert "registry" in ast.unparse(tree) and "st.Page(p.file" in ast.unparse(tree)
    sections = registry.by_section()
    assert list(sections) == ["Learn", "Explore", "Research"]
    assert sum(len(v) for v in sections.values()) == len(registry.PAGES)
    assert all(p.section in registry.SECTIONS for p in registry.PAGES)
    from pathlib import Path as P
    assert all((P(__file__).resolve().parents[2] / p.file).is_file() for p in registry.PAGES)


def test_root_url_opens_the_path(app_test):
    at = app_test("", text="the old man sleeps near the river")
    at.run()
    assert_no_exception(at)
    assert at.title and at.title[0].value == registry.page(registry.HOME).heading
    assert at.text_area(key="home.text").value == "the old man sleeps near the river"


def test_a_model_load_freezes_the_heap_out_of_the_collectors_walks(app_test):
    """Streamlit runs a full garbage collection after every script run; the app freezes what
    a model load leaves alive (core.device.freeze_heap), so that collection walks only what
    later runs made, not the whole of torch, plotly and the model."""
    import gc

    from viz.ui import models

    gc.unfreeze()
    models._load_model.clear()
    assert gc.get_freeze_count() == 0
    at = app_test("explore", model="minilm")
    at.run()
    assert_no_exception(at)
    assert gc.get_freeze_count() > 100_000
    model = models._load_model("minilm")  # the cached instance the page got
    assert gc.is_tracked(model) and not any(o is model for o in gc.get_objects())  # frozen, not walked
