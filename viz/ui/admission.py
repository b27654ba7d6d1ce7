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
import sys
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
        self.namespaces: list = []  # the page scripts' globals that took a held result

    def __repr__(self) -> str:
        return f"page run {id(self):x}"


def _page_namespace():
    """The globals of the page script running on this thread (Streamlit runs a page file as a
    fresh module named __main__), found up the stack; None outside a page."""
    frame = sys._getframe(1)
    while frame is not None:
        g = frame.f_globals
        if g.get("__name__") == "__main__" and str(g.get("__file__", "")).endswith("page.py"):
            return g
        frame = frame.f_back
    return None


def _heavy(value, depth: int = 0) -> bool:
    """A trace, a tensor, an array, a data frame or a figure, or a list, tuple, dict or project object
    holding one directly. Nothing else is looked into: a page's globals include Streamlit's own
    objects, which cost seconds to walk at every run's end."""
    import numpy as np
    import pandas as pd
    import torch
    from plotly.basedatatypes import BaseFigure

    from core.trace import Trace

    if type(value) in (str, bytes, int, float, bool, type(None)):  # the common case, at no cost
        return False
    if isinstance(value, (Trace, torch.Tensor, np.ndarray, pd.DataFrame, pd.Series, BaseFigure)):
        return True
    if depth >= 1:
        return False
    if type(value) is dict:
        items = list(value.values())[:64]
    elif type(value) in (list, tuple):
        items = value[:64]
    elif type(value).__module__.startswith(("viz.", "core.")):  # the project's own objects (a page's view, a run)
        items = list(vars(value).values())[:64] if hasattr(value, "__dict__") else []
    else:  # anything else (Streamlit's objects, the session's state, modules) is left alone, unread
        return False
    return any(_heavy(v, depth + 1) for v in items)


def _empty_heavy(namespace: dict) -> int:
    """Drop the heavy values from a finished page script's globals; returns how many. Streamlit
    keeps that namespace alive after the run: the callbacks the page gave its widgets are functions
    defined in it, kept until the session's next run, and each holds the page's globals. Left
    there, a page's trace outlived the run for as long as its tab stayed open, outside the
    memory budget. Names a callback reads (keys, the session's state, modules) are not heavy."""
    gone = [k for k, v in list(namespace.items()) if not k.startswith("__") and _heavy(v)]
    for k in gone:
        namespace.pop(k, None)
    return len(gone)


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
        for namespace in owner.namespaces:
            _empty_heavy(namespace)
        owner.namespaces.clear()
        gate().release_holds(owner)


@contextmanager
def fragment_run():
    """Around an `st.fragment`'s body: inside a page run (the fragment drawn with its page) that run;
    alone (a click reran the fragment only: app.py's page_run does not run then) a page run of its own,
    so that what the fragment holds counts against the budget until it ends, as a page's does."""
    run = current_run()
    if run is not None:
        yield run
        return
    with page_run() as own:
        yield own


def hold(value, nbytes: int) -> None:
    """Count `value` (nbytes) against the budget until this page run ends (nothing outside one),
    and have the page script that asked for it let go of it then (_empty_heavy)."""
    run = current_run()
    gate().hold(value, nbytes, run)
    if run is not None:
        namespace = _page_namespace()
        if namespace is not None and not any(namespace is ns for ns in run.namespaces):
            run.namespaces.append(namespace)


WAIT_LOG_SECONDS = 30.0


def _state() -> str:
    """The gate's state for the server log; never fails (a log line must not stop a page)."""
    try:
        return _describe()
    except Exception as exc:  # noqa: BLE001 - logged instead
        return f"(state unavailable: {type(exc).__name__})"


def _describe() -> str:
    g = gate().status()
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            rss = next((int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS")), 0)
    except OSError:
        rss = 0
    from core.trace import Trace, nbytes_of
    from viz.ui import result_getter

    live = [t for t in result_getter.alive() if isinstance(t, Trace)]
    mib = 2**20
    return (f"rss {rss} MiB; traces alive {len(live)} ({nbytes_of(live) / mib:.0f} MiB); "
            f"running {g['running']} ({g['running_bytes'] / mib:.0f} MiB), held {g['holds']} "
            f"({g['held_bytes'] / mib:.0f} MiB), cached {g['cached_bytes'] / mib:.0f} MiB, waiting {g['waiting']}")


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
        big = cost >= vg.TRIM_BYTES or shown  # the gate's state (it reads every live trace) for the jobs that matter
        LOG.info("gate: admitted %s (%.0f MiB)%s%s", label, cost / 2**20,
                 f" after waiting {waited:.1f} s" if shown else "", f"; {_state()}" if big else "")
        note.empty()
        button.empty()
        t0 = time.monotonic()
        yield ticket
        LOG.info("gate: done %s in %.1f s", label, time.monotonic() - t0)
