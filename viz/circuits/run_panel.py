"""The Circuits page's runs (Streamlit): one head's depth-1 edges (core.analysis.head_circuit) and
one edge's path patch (core.analysis.path_patch), each admitted by the gate with an estimate from
the shapes and kept in one byte-bounded cache shared by every session; failures as st.error /
st.warning, never a traceback."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import pandas as pd
import streamlit as st

import core.analysis as ca
from core import trace_names as tn
from viz.ui import admission, gate
from viz.ui.cache import ByteLRU

CACHE_BYTES = int(os.environ.get("ATTENTION_LAB_CIRCUITS_CACHE_MB", "64")) * 2**20


def _size_of(df: pd.DataFrame) -> int:
    return int(df.memory_usage(deep=True).sum()) + 256


@st.cache_resource(show_spinner=False)
def circuit_cache() -> ByteLRU:
    return ByteLRU(CACHE_BYTES, max_entries=1024, size_of=_size_of)


def _n(trace, stack: str) -> int:
    return len(trace[tn.embed(stack)])


def head_edges(trace, cfg, model_name: str, text_key: str, stack: str, layer: int, head: int,
               top: int) -> Optional[pd.DataFrame]:
    """One head's depth-1 edges (all three sides), cached; None after a message."""
    key = ("circuit", model_name, text_key, stack, int(layer), int(head), int(top))
    n = _n(trace, stack)
    return _gated(key, gate.circuit_bytes(cfg, n), f"{model_name} circuit of L{layer}H{head}, {n} tokens", "circuit",
                  lambda: ca.head_circuit(trace, stack, layer, head, depth=1, top=top),
                  f"Taking apart what layer {layer} head {head} reads…",
                  lambda exc: (st.info if trace.mixer_layers(stack) else st.error)(  # a mixer model: does not apply
                      f"The circuit of layer {layer} head {head} cannot be read exactly here: {exc}"),
                  f"The circuit of layer {layer} head {head} could not be computed")


def cached_patch(model_name: str, text_key: str, edge: str, score: str) -> Optional[pd.DataFrame]:
    return circuit_cache().get(("patch", model_name, text_key, edge, score))


def patch(model, model_name: str, text_key: str, edge: str, clean_ids: Sequence[int], corrupt_ids: Sequence[int],
          sender: Tuple[int, int], receiver: Tuple[int, int], side: str, score: str, stack: str,
          targets=None) -> Optional[pd.DataFrame]:
    """path_patch of one edge, cached; None after a message."""
    key = ("patch", model_name, text_key, edge, score)
    n = len(clean_ids)

    def compute():
        df = ca.path_patch(model, list(clean_ids), list(corrupt_ids), sender, receiver, side,
                           score=score if targets is None else "induction", targets=targets, stack=stack)
        return _keep_attrs(df.iloc[0:0].copy(), df)

    return _gated(key, gate.path_patch_bytes(model.config, n), f"{model_name} path patch {edge}, {n} tokens",
                  "path_patch", compute, f"Path patching {edge}…",
                  lambda exc: st.warning(f"Path patching {edge}: {exc}"), f"Path patching {edge} could not run")


def _gated(key, cost: int, label: str, kind: str, fn, spinner: str, said, failed: str):
    """fn() once per key in the shared cache, admitted by the gate at `cost` bytes; a ValueError
    (the analysis cannot apply) goes to said(exc), any other failure to an st.error: None after either."""
    def compute():
        admission.gate().count(circuit_cache())
        with admission.admitted(cost, 0.0, label, kind=kind):
            return fn()

    try:
        with st.spinner(spinner):
            return circuit_cache().get_or_compute(key, compute)
    except ValueError as exc:
        said(exc)
    except Exception as exc:  # the page keeps working
        st.error(f"{failed}: {exc}")
    return None


def _keep_attrs(empty: pd.DataFrame, full: pd.DataFrame) -> pd.DataFrame:
    """The result without its n^2 rows of weights (the page writes the scores on the edge)."""
    empty.attrs.update(full.attrs)
    return empty
