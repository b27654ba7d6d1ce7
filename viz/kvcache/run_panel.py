"""The KV cache page's runs (Streamlit): core.analysis.evict through one byte-bounded cache shared
by every session, keyed by (model, text, policy, budget, options), with a progress bar while it
runs and its failures as st.error / st.warning, never a traceback."""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import streamlit as st

import core.analysis as ca
from core.analysis.evict import estimate_seconds, token_ids, trace_mismatch
from core.errors import InputError
from viz.ui import gate
from viz.ui.cache import ByteLRU
from viz.ui import admission, models

CACHE_BYTES = int(os.environ.get("ATTENTION_LAB_KVCACHE_CACHE_MB", "256")) * 2**20


def _size_of(df) -> int:
    kept = df.attrs.get("kept")
    extra = sum(np.asarray(df.attrs.get(k, 0)).nbytes for k in ("mass_lost_heads", "sink_scores"))
    return int(df.memory_usage(deep=True).sum()) + (kept.last.nbytes if kept is not None else 0) + extra


@st.cache_resource(show_spinner=False)
def evict_cache() -> ByteLRU:
    return ByteLRU(CACHE_BYTES, max_entries=512, size_of=_size_of)


def key_of(model_name: str, text: str, policy: str, budget: int, sinks: int, recent: Optional[int], observe: int,
           continuation: Optional[str]) -> tuple:
    """The cache key: only the options the policy reads."""
    return ("evict", model_name, text, policy, int(budget),
            int(sinks) if policy == "streaming" else None,
            recent if policy == "h2o" else None,
            int(observe) if policy == "snapkv" else None,
            continuation if policy == "snapkv" else None)


def cached(model_name, text, policy, budget, sinks=4, recent=None, observe=32, continuation=None):
    """The result when it is already computed, else None (nothing is run)."""
    return evict_cache().get(key_of(model_name, text, policy, budget, sinks, recent, observe, continuation))


def run(model, model_name: str, text: str, policy: str, budget: int, sinks: int = 4, recent: Optional[int] = None,
        observe: int = 32, continuation: Optional[str] = None, bar=None, label: str = "", trace=None):
    """evict through the shared cache; progress on `bar` (an st.progress) or a bar of its own.
    trace: the page's trace of the same text, which then stands for evict's full-model pass
    (left out where it is of other ids; never part of the cache key: the results are the same).
    Returns the frame, or None after a message."""
    key = key_of(model_name, text, policy, budget, sinks, recent, observe, continuation)
    got = evict_cache().get(key)
    if got is not None:
        return got
    own = bar is None
    bar = st.progress(0.0, text=f"{label or policy}: starting") if own else bar

    def progress(frac, what):
        bar.progress(min(1.0, max(0.0, float(frac))), text=f"{label or policy}: {what}")

    def admitted():
        # the policy's pass beside the full model's reference pass: two traces' worth (the measurement it is
        # held against: docs/decisions.md, "Measurements moved from the code")
        n = models._tokens(model, text + (continuation or ""))
        admission.gate().count(evict_cache())
        with admission.admitted(2 * gate.trace_bytes(model.config, n), estimate(model, n, policy),
                                f"{model_name} {policy} at budget {budget}, {n:,} tokens", kind="kvcache"):
            return ca.evict(model, text, policy, int(budget), sinks=int(sinks), recent=recent, observe=int(observe),
                            continuation=continuation or None, progress=progress,
                            trace=usable_trace(model, text, continuation, trace))

    try:
        return evict_cache().get_or_compute(key, admitted)
    except (ValueError, InputError) as exc:
        (st.info if "mixes tokens with" in str(exc) else st.warning)(  # a token mixer's layer: does not apply
            f"{policy} at budget {budget}: {exc}")
    except Exception as exc:  # the page keeps working
        st.error(f"{policy} at budget {budget} could not run: {exc}")
    finally:
        if own:
            bar.empty()
    return None


def usable_trace(model, text: str, continuation: Optional[str], trace):
    """The trace where it stands for evict's full-model pass over (text, continuation), else None."""
    if trace is None:
        return None
    try:
        ids = token_ids(model, text, continuation or None)[0]
        return trace if trace_mismatch(model, trace, ids) is None else None
    except Exception:  # a trace that cannot be checked is not used; evict runs the full model itself
        return None


def seconds_text(seconds: float) -> str:
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    return f"about {seconds / 60:.1f} min"


def estimate(model, n: int, policy: str) -> float:
    try:
        return estimate_seconds(model, n, policy)
    except Exception:  # an estimate must never stop the page
        return float("nan")
