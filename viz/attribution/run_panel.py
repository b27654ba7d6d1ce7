"""The Attribution page's computation: every method's scores for a sentence, and, when asked,
the faithfulness table of those scores, each kept for the last few requests of any session (a
plain store, not st.cache_data: a cached function would record the progress bar's updates and
replay them into other sessions)."""

import threading
from collections import OrderedDict

import streamlit as st

from core.analysis import input_attribution as A
from core.analysis import faithfulness_scores as F
from core.errors import InputError
from viz.ui import gate
from viz.ui import admission, models

MAX_TOKENS = 64  # occlusion and the deletion curves run one pass per token: longer inputs are cut


@st.cache_resource(show_spinner=False)
def _results():
    """Computed results shared by every session, last KEEP of them (a plain store: a cached
    function would record the progress bar's updates and replay them into other sessions)."""
    return {"lock": threading.Lock(), "items": OrderedDict()}


KEEP = 8


def _cached(key):
    store = _results()
    with store["lock"]:
        if key in store["items"]:
            store["items"].move_to_end(key)
            return store["items"][key]
    return None


def _keep(key, value) -> None:
    store = _results()
    with store["lock"]:
        store["items"][key] = value
        while len(store["items"]) > KEEP:
            store["items"].popitem(last=False)


def compute(model_name: str, text: str, target: str, contrast: str, baseline: str, steps: int, fix_first: bool,
            position, _model, _progress):
    """(info, {method: DataFrame}, Setup): every method's scores, integrated gradients refined
    until complete within A.COMPLETE_WITHIN."""
    key = (model_name, text, target, contrast, baseline, steps, fix_first, position)
    out = _cached(key)
    if out is not None:
        return out
    n = min(models._tokens(_model, text), MAX_TOKENS)
    rows = max(1, min(steps, A.BATCH_TOKENS // max(1, n)))  # integrated gradients' steps a batch (the largest pass)
    with admission.admitted(gate.batch_bytes(_model.config, rows * n, grad=True, n_keys=n), 0.0,
                            f"{model_name} attribution, {n} tokens", kind="attribution"):
        out = _run(text, target, contrast, baseline, steps, fix_first, position, _model, _progress)
    _keep(key, out)
    return out


def table(model_name: str, text: str, target: str, contrast: str, baseline: str, steps: int, fix_first: bool,
          position, _setup, _frames, _progress):
    """The faithfulness table of compute's scores (`_setup`, `_frames` as compute returned them)."""
    key = ("table", model_name, text, target, contrast, baseline, steps, fix_first, position)
    out = _cached(key)
    if out is not None:
        return out
    n = _setup.n
    with admission.admitted(gate.batch_bytes(_setup.model.config, _setup.batch_rows() * n, grad=False, n_keys=n),
                            0.0, f"{model_name} faithfulness, {n} tokens", kind="attribution"):
        out = _table(_setup, _frames, fix_first, _progress)
    _keep(key, out)
    return out


def _run(text, target, contrast, baseline, steps, fix_first, position, _model, _progress):
    s = A.setup(_model, text, target or None, contrast or None, baseline or None, position)
    if s.n > MAX_TOKENS:
        raise InputError(f"the sentence is {s.n} tokens; this page explains up to {MAX_TOKENS} (occlusion and the "
                         "deletion curves run one pass per token): shorten it")
    trace = _model.trace(text)
    # integrated gradients refines its steps until complete within the page's warning line
    frames = A.attribute_setup(s, None, steps, fix_first, trace, _progress, complete_within=A.COMPLETE_WITHIN)
    tk = _model.target_tokenizer if _model.kind == "encoder-decoder" else _model.tokenizer
    info = {"target": tk.token_str(s.target_id), "target_id": int(s.target_id),
            "contrast_id": None if s.contrast_id is None else int(s.contrast_id), "contrast": None if s.contrast_id is None else tk.token_str(s.contrast_id),
            "baseline": _model.tokenizer.token_str(s.baseline_id), "baseline_id": s.baseline_id,
            "word_ids": list(s.word_ids), "special": list(s.special), "tokens": list(s.tokens)}
    return info, frames, s


def _table(s, frames, fix_first, _progress):
    return F.faithfulness_from_scores(s, {m: df["score"].to_numpy() for m, df in frames.items()}, progress=_progress,
                                      fix_first=fix_first)
