"""The admission gate as a page shows it (the gate itself: viz/ui/gate.py): one Gate per process,
over the memory budget, with the trace cache counted against it. A job that has to wait says
so in the page ("Waiting: 2 jobs ahead, about 40 s") with a Cancel button; a cancelled job
leaves the queue, and the page offers to run it again. A job never stops once it runs.

A page run holds the results it draws from (its trace): `page_run` (app.py, around every page)
names the run, `hold` counts a result against the budget until the run ends, as Gate.hold says.

The wait's estimate is the gate's own (Gate.expected: the last jobs of the same kind, measured);
viz.ui.longdoc.trace_seconds, from the long-trace calibration, is its starting point only."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

import streamlit as st

from viz.ui import gate as vg

CANCELLED = "_gate.cancelled"  # session flag: the user cancelled a waiting job
LOG = logging.getLogger("attention_lab")
SECONDS_PER_FLOP = 2e-10  # a job's first estimate before anything is measured: ~5 GFLOP/s


@st.cache_resource(show_spinner=False)
def gate() -> vg.Gate:
    """The process's gate; the caches that count against its budget join it with `count`."""
    import core.device

    g = vg.Gate(vg.default_budget(), release=core.device.release_freed_memory)
    LOG.info("gate: budget %d MiB", g.budget // 2**20)
    return g


_RUN = threading.local()  # .owner: the page run on this thread (a Streamlit session runs its script on one)


class _Run:
    """One page run: what it holds is released when it ends; it counts its waits (each wait's
    Cancel button needs a key of its own: a run can wait for its trace, then for its maps)."""

    def __init__(self):
        self.waits = 0

    def __repr__(self) -> str:
        return f"page run {id(self):x}"


def current_run():
    return getattr(_RUN, "owner", None)


@contextmanager
def page_run():
    """Around a page's run (app.py): the results it holds (`hold`) count against the memory budget
    until it ends, however it ends (drawn, stopped, rerun, the browser gone)."""
    outer, _RUN.owner = current_run(), _Run()
    try:
        yield _RUN.owner
    finally:
        owner, _RUN.owner = _RUN.owner, outer
        gate().release_holds(owner)


def hold(value, nbytes: int) -> None:
    """Count `value` (nbytes) against the budget until this page run ends (nothing outside one)."""
    gate().hold(value, nbytes, current_run())


WAIT_LOG_SECONDS = 30.0


def _state() -> str:
    g = gate().status()
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            rss = next((int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS")), 0)
    except OSError:
        rss = 0
    return (f"rss {rss} MiB; running {g['running']} ({g['running_bytes'] / 2**20:.0f} MiB), held {g['holds']} "
            f"({g['held_bytes'] / 2**20:.0f} MiB), cached {g['cached_bytes'] / 2**20:.0f} MiB, waiting {g['waiting']}")


def _cancel() -> None:
    st.session_state[CANCELLED] = True


@contextmanager
def admitted(cost: int, seconds: float, label: str, kind: str = "", first: bool = False):
    """Run the block once the gate admits a job of `cost` bytes. While it waits, the page shows
    its place and a Cancel button; a click reruns the page, which ends the wait (the job leaves
    the queue) and shows that it was cancelled, with a button to run it again. kind: what the
    gate times it by (default: the label); first: the page's work on a result it
    holds (Gate.admit)."""
    if st.session_state.pop(CANCELLED, False):
        st.info(f"Cancelled before it started: {label}. Nothing was computed.")
        st.button("Run it again", key="gate-again")
        st.stop()
    note, button = st.empty(), st.empty()
    shown, logged = [], [time.monotonic()]
    run = current_run()
    if run is not None:
        run.waits += 1
    cancel_key = f"gate-cancel-{run.waits}" if run is not None else f"gate-cancel-{label}"

    def on_wait(ahead: int, secs: float) -> None:
        now = time.monotonic()
        if now - logged[0] >= WAIT_LOG_SECONDS:  # the server log says what a long wait waits for
            logged[0] = now
            LOG.info("gate: %s waits: %s", label, _state())
        if not shown:
            button.button("Cancel", key=cancel_key, on_click=_cancel)
            shown.append(True)
        note.info(f"Waiting: {ahead} job{'s' if ahead != 1 else ''} ahead, about {max(1, round(secs))} s "
                  f"({label}; the server runs heavy work within its memory budget).")

    with gate().admit(cost, seconds, label, on_wait=on_wait, kind=kind or label,
                      first=first, owner=current_run()) as ticket:
        waited = ticket.entered - ticket.queued
        LOG.info("gate: admitted %s (%.0f MiB)%s; %s", label, cost / 2**20,
                 f" after waiting {waited:.1f} s" if shown else "", _state())
        note.empty()
        button.empty()
        t0 = time.monotonic()
        yield ticket
        LOG.info("gate: done %s in %.1f s", label, time.monotonic() - t0)
