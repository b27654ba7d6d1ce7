"""The Patching page's parts that run the model: the default answer and wrong tokens, and the
patching grid with its progress bar, kept for the session's last few views."""

from collections import OrderedDict

import streamlit as st

import core.analysis as ca
from core.analysis import activation_patching as cp
from viz.ui import gate
from viz.ui import admission, models


def default_tokens(model, model_name: str, pair, text: str, corrupt: str):
    """(answer id, wrong id, why) when the fields are empty."""
    if model.kind != "decoder":
        return pair.clean_next, pair.corrupt_next, (
            f"the two greedy translations share {' '.join(pair.decoder_tokens)} and then differ: the clean one writes "
            f"{model.alternative_strings([pair.clean_next])[0]!r}, the corrupted one "
            f"{model.alternative_strings([pair.corrupt_next])[0]!r}")
    a = models.get_trace(model_name, text, notes=False)
    b = models.get_trace(model_name, corrupt, notes=False)
    if a is None or b is None:
        return None, None, ""
    ids_a, ids_b = a["next.ids"].tolist(), b["next.ids"].tolist()
    w = ids_b[0] if ids_b[0] != ids_a[0] else ids_a[1]
    return ids_a[0], w, "the model's top prediction on the clean prompt against " + (
        "its top prediction on the corrupted one" if ids_b[0] != ids_a[0] else "its second choice there")


def grid(model, model_name: str, text: str, corrupt: str, answer_id: int, wrong_id: int, what_: str):
    """The patching table and the layer-0 check, computed with a progress bar, kept for the
    session's last few views (a cell click or a switch back costs nothing)."""
    key = (model_name, text, corrupt, answer_id, wrong_id, what_)
    store = st.session_state.setdefault("patching._results", OrderedDict())
    if key in store:
        store.move_to_end(key)
        return store[key]
    label = f"{model_name} patching grid ({what_})"
    # the two runs' activations and a batch of patched runs, one item a cell (gate.patching_bytes: measured
    # against a random decoder's grid in tests/app/peak_probe.py; a trace's cost alone was an eighth of it)
    n = models._tokens(model, text)
    cells = model.config.n_heads if what_ == "head" else n
    with admission.admitted(gate.patching_bytes(model.config, n, cells), 0.0, label, kind="patching"):
        df, chk = _grid(model, text, corrupt, answer_id, wrong_id, what_)
    store[key] = (df, chk)
    while len(store) > 8:
        store.popitem(last=False)
    return df, chk


def _grid(model, text: str, corrupt: str, answer_id: int, wrong_id: int, what_: str):
    bar = st.progress(0.0, text=f"Patching every {'head' if what_ == 'head' else 'layer and position'}…")
    try:
        df = ca.patch(model, text, corrupt, answer_id, wrong_id, what=what_,
                      progress=lambda f: bar.progress(min(1.0, f), text=f"Patching… {f:.0%}"))
        chk = cp.restore_check(model, text, corrupt, answer_id, wrong_id)
    finally:
        bar.empty()
    return df, chk
