"""The admission gate as a page shows it (the gate itself: viz/ui/gate.py): one Gate per process,
over the memory budget, with the trace cache counted against it. A job that has to wait says
so in the page ("Waiting: 2 jobs ahead, about 40 s") with a Cancel button; a cancelled job
leaves the queue, and the page offers to run it again. A job never stops once it runs.

The wait's estimate is the gate's own (Gate.expected: the last jobs of the same kind, measured);
viz.ui.longdoc.trace_seconds, from the long-trace calibration, is its starting point only."""

from __future__ import annotations

import logging
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
    shown = []

    def on_wait(ahead: int, secs: float) -> None:
        if not shown:
            button.button("Cancel", key="gate-cancel", on_click=_cancel)
            shown.append(True)
        note.info(f"Waiting: {ahead} job{'s' if ahead != 1 else ''} ahead, about {max(1, round(secs))} s "
                  f"({label}; the server runs heavy work within its memory budget).")

    with gate().admit(cost, seconds, label, on_wait=on_wait, kind=kind or label,
                      first=first) as ticket:
        waited = ticket.entered - ticket.queued
        LOG.info("gate: admitted %s (%.0f MiB)%s", label, cost / 2**20,
                 f" after waiting {waited:.1f} s" if shown else "")
        note.empty()
        button.empty()
        t0 = time.monotonic()
        yield ticket
        LOG.info("gate: done %s in %.1f s", label, time.monotonic() - t0)
