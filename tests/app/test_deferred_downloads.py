"""A deferred download (a file built when its button is clicked) is called by Streamlit after the
page run that offered it has ended, when admission.page_run has dropped the page's heavy globals.
Here each deferred file function a page registers is kept, as Streamlit keeps it, and called
after the run: it must give its file (parsed), and holding it must not keep a trace alive.

AppTest cannot click a deferred download; the real browser does in
tests/browser/test_browser_crawl.py. These run the same functions without a browser."""

import gc
import io
import weakref

import numpy as np
import pandas as pd
import pytest

from conftest import assert_no_exception
from hf_builders import build

pytest.importorskip("transformers")
TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    hf, folder = build("gpt2", root / "tiny-gpt2")
    hf.save_pretrained(str(folder))
    return root


@pytest.fixture
def deferred(monkeypatch):
    """file name -> the deferred function of every download button registered from now on."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    kept: dict = {}
    add = MediaFileManager.add_deferred

    def recording(self, data_callable, mimetype, coordinates, file_name=None, **kw):
        kept[file_name] = data_callable
        return add(self, data_callable, mimetype, coordinates, file_name, **kw)

    monkeypatch.setattr(MediaFileManager, "add_deferred", recording)
    return kept


def _traces_freed():
    """Empty the trace cache (nothing else may hold a trace once the run has ended) and say which
    of its traces are still alive."""
    from viz.ui import models

    kept = [weakref.ref(v) for v, _ in models.trace_cache()._data.values() if hasattr(v, "meta")]
    assert kept, "the page traced its text through the cache"
    models.trace_cache().clear()
    gc.collect()
    return [r() for r in kept] == [None] * len(kept)


def test_lens_csvs_are_built_after_the_run_ends(app_test, deferred, models_dir, monkeypatch):
    import core

    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))  # a pre-norm decoder: the attribution applies
    at = app_test("lens", model="tiny-gpt2", text=TEXT)
    at.run(timeout=120)
    assert_no_exception(at)
    names = {"logit-lens-tiny-gpt2.csv", "logit-attribution-tiny-gpt2.csv"}
    assert names <= set(deferred), (sorted(deferred), [e.value for e in at.info])
    assert _traces_freed(), "a download's deferred function keeps the lens page's trace alive"
    model = core.load_model(str(models_dir / "tiny-gpt2"), device="cpu")
    lens = pd.read_csv(io.BytesIO(deferred["logit-lens-tiny-gpt2.csv"]()))
    n = len(model.encode(TEXT).ids)
    # the embeddings and the stream after each block, at every position (all shown: a short text)
    assert len(lens) == (model.config.n_layers + 1) * n, lens.shape
    assert {"after_block", "stream", "top_tokens"} <= set(lens.columns)
    attr = pd.read_csv(io.BytesIO(deferred["logit-attribution-tiny-gpt2.csv"]()))
    assert (attr["label"].str.match(r"^L\d+H\d+$")).sum() == model.config.n_layers * model.config.n_heads


def test_kvcache_csvs_are_built_after_the_run_ends(app_test, deferred, models_dir, monkeypatch):
    import core

    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))
    at = app_test("kvcache", model="tiny-gpt2", text=TEXT, policy="window", budget="3")
    at.run(timeout=120)
    assert_no_exception(at)
    at.button(key="kvcache-sweep").click().run(timeout=120)  # the sweep's CSV is offered once it has run
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    names = {"kvcache-tiny-gpt2-window-3.csv", "kvcache-sweep-tiny-gpt2.csv"}
    assert names <= set(deferred), sorted(deferred)
    assert _traces_freed(), "a download's deferred function keeps the KV cache page's trace alive"
    per = pd.read_csv(io.BytesIO(deferred["kvcache-tiny-gpt2-window-3.csv"]()))
    ids = core.load_model(str(models_dir / "tiny-gpt2"), device="cpu").encode(TEXT).ids
    assert list(per["position"]) == list(range(len(ids))) and {"kl", "mass_lost"} <= set(per.columns), per.columns
    sweep = pd.read_csv(io.BytesIO(deferred["kvcache-sweep-tiny-gpt2.csv"]()))
    assert set(sweep["policy"]) == {"window", "streaming"} and np.isfinite(sweep["perplexity"]).all()


def test_a_deferred_download_refuses_to_hold_a_trace(toy):
    from viz.ui import downloads

    trace = toy.trace(TEXT)
    with pytest.raises(TypeError, match="getter"):
        downloads.later(lambda t: b"", trace)
    frame = pd.DataFrame({"a": [1, 2]})
    frame.attrs["kept"] = np.zeros(10)
    assert downloads.csv_later(frame)() == b"a\n1\n2\n"


def _lambdas_over_globals(source: str) -> list:
    """The download buttons of a page script whose data is a lambda written at the script's top level
    (outside any function): it reads the page's globals when clicked, after page_run dropped them."""
    import ast

    found = []

    def visit(node, in_function: bool):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function = True
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "download_button" and not in_function:
            data = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "data"), None)
            if isinstance(data, ast.Lambda):
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(ast.parse(source), False)
    return found


def test_no_page_builds_a_download_from_its_globals():
    from conftest import ROOT

    bad = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "viz").glob("*/page.py"))
           if (lines := _lambdas_over_globals(p.read_text(encoding="utf-8")))}
    assert not bad, f"download buttons whose data is a lambda over the page's globals (use downloads.later): {bad}"
    # the check can fail: the Lens page's CSV as it was
    assert _lambdas_over_globals('st.download_button("The lens (CSV)", lambda: lens_df.to_csv().encode())') == [1]
    assert _lambdas_over_globals("def f():\n    st.download_button('x', lambda: local)\n") == []
