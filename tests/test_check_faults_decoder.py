"""The decoder stepper's teacher-forcing check can fail: a fault injected into the core's step
machinery (every step view's decoder rows shifted down by one position) makes the page show
st.error with the difference and where it is, and the clean core shows st.success and no error.

The page caches traces across sessions and the check per step (viz/pages/models.py), so both are
cleared around the fault: a clean result cached earlier must not hide it, nor a faulty one
outlive the test."""

import re

import pytest
import torch

import core.trace
from conftest import assert_no_exception
from viz.pages import models

DEVICE = "cpu"  # the model fixtures (conftest.py) load on the CPU here
TEXT = "the small dog sees the cat"
STEP = 3  # rows 0-2: <start> and two target tokens


def _clear_page_caches():
    models.trace_cache().clear()
    models.prefix_check.clear()


@pytest.fixture
def clean_caches():
    _clear_page_caches()
    yield
    _clear_page_caches()


def _shifted_rows(monkeypatch):
    """Step views (Trace.prefix) give their rows one position late: row i shows row i - 1's
    numbers (rolled along the query axis), the shapes unchanged."""
    original = core.trace.decoder_rows

    def shifted(name, x, t):
        out = original(name, x, t)
        if out is x:  # not a decoder row (the encoder side, cross-attention's keys and values)
            return out
        return torch.roll(out, 1, dims=1 if out.dim() == 3 else 0)  # H x n x ... or n x ...

    monkeypatch.setattr(core.trace, "decoder_rows", shifted)


def _open(app_test, greedy):
    at = app_test("decoder", model="toy-translate", text=TEXT, target=" ".join(greedy), step=str(STEP))
    at.run()
    assert_no_exception(at)
    assert at.radio(key="decoder.mode").value == "teacher"
    return at


def test_decoder_teacher_check_fails_on_shifted_rows(app_test, toy, monkeypatch, clean_caches):
    greedy = toy.greedy_batch([TEXT])[0]

    at = _open(app_test, greedy)  # the clean core: the check passes and says by how much
    ok = [s.value for s in at.success if "max |Δ|" in s.value]
    assert ok and not at.error, ([s.value for s in at.success], [e.value for e in at.error])
    assert float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", ok[0]).group(1)) <= 1e-4

    _clear_page_caches()
    _shifted_rows(monkeypatch)
    at = _open(app_test, greedy)
    errors = [e.value for e in at.error if "max |Δ|" in e.value]
    assert errors, ([e.value for e in at.error], [s.value for s in at.success])
    assert not [s.value for s in at.success if "max |Δ|" in s.value]
    delta = float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", errors[0]).group(1))
    assert delta > 1e-4 and "> 1e-04" in errors[0]
    assert re.search(r" at (self|cross)-attention weights, layer \d, head \d, row \d, key \d", errors[0]) or \
        re.search(r" at top-k next-token probabilities, row \d", errors[0]), errors[0]
