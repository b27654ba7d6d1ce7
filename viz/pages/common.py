"""What every page shares: cached models and traces, URL state, messages, downloads.

Pages stay thin: they read state here, ask for a Trace, hand it to viz figure functions
and lay the results out. Errors a user can cause end in st.error / st.warning.
"""

from __future__ import annotations

import io
import os
from typing import Callable, Dict, Optional, Tuple

import streamlit as st

import core
from core.api import InputError
from viz.cache import ByteLRU
from viz.figures import attention_frame

core.device.configure_threads()

DEFAULT_MODEL = "toy-translate"
MAX_CHARS = 20_000  # typed text beyond this is cut before tokenizing, with a warning
TRACE_CACHE_BYTES = int(os.environ.get("ATTENTION_LAB_TRACE_CACHE_MB", "1024")) * 2**20

NOTES_EXAMPLES = {
    "bank (river)": "I swam across the river to get to the other bank.",
    "bank (cash)": "I walked across the road to get cash from the bank.",
    "Show me the money": "Show me the money",
    "help me!": "help me!",
}


def model_names():
    return list(core.MODELS)


# The app's longest input per model, in tokens: a smollm2 trace of n tokens holds about
# 4.4 KB * n^2 (30 layers x 9 heads of n x n maps), so 256 tokens is ~0.3 GB.
INPUT_LIMITS = {"toy-translate": 64, "minilm": 512, "smollm2": 256}


@st.cache_resource(show_spinner=False)
def _load_model(name: str):
    model = core.load_model(name)
    model.input_limit = INPUT_LIMITS.get(name)
    return model


def get_model(name: str):
    """The model, loaded once per process; None (after an st.error) when it cannot load."""
    try:
        with st.spinner(f"Loading {name}…"):
            return _load_model(name)
    except core.ModelUnavailable as exc:
        st.error(f"{exc}. The other models keep working.")
    except Exception as exc:  # a broken install must not take the page down
        st.error(f"Could not load model {name!r}: {exc}")
    return None


@st.cache_resource(show_spinner=False)
def trace_cache() -> ByteLRU:
    return ByteLRU(TRACE_CACHE_BYTES, max_entries=256, size_of=_size_of)


def _size_of(value) -> int:
    """Bytes of a Trace or of a list of Traces (decoder steps)."""
    return sum(t.nbytes() for t in value) if isinstance(value, list) else value.nbytes()


def clean_text(text: str) -> Tuple[str, list]:
    """Text as the models get it, and warnings about what was changed."""
    msgs = []
    text = text or ""
    if "\x00" in text or any(ord(c) < 32 and c not in "\n\t\r" for c in text):
        text = "".join(c if (ord(c) >= 32 or c in "\n\t\r") else " " for c in text)
        msgs.append("Control characters in the text were replaced by spaces.")
    if len(text) > MAX_CHARS:
        msgs.append(f"The text is {len(text):,} characters long; only the first {MAX_CHARS:,} are used.")
        text = text[:MAX_CHARS]
    return text, msgs


def get_trace(model_name: str, text: str, target: Optional[str] = None, pad_to: Optional[int] = None):
    """Trace for (model, text, target, padding), cached across sessions and bounded in bytes.
    Returns None after showing a message when the input cannot be traced."""
    model = get_model(model_name)
    if model is None:
        return None
    text, msgs = clean_text(text)
    for m in msgs:
        st.warning(m)
    key = ("trace", model_name, text, target or None, pad_to)
    try:
        with st.spinner("Running the model…"):
            trace = trace_cache().get_or_compute(key, lambda: model.trace(text, target=target or None, pad_to=pad_to))
    except InputError as exc:
        st.warning(str(exc))
        return None
    except Exception as exc:
        st.error(f"The model could not run on that input: {exc}")
        return None
    show_trace_notes(trace)
    return trace


def get_steps(model_name: str, text: str):
    """All decoding steps, computed once per (model, text) and cached: step changes do no model work."""
    model = get_model(model_name)
    if model is None:
        return None
    text, msgs = clean_text(text)
    for m in msgs:
        st.warning(m)
    try:
        with st.spinner("Generating, one token at a time…"):
            return trace_cache().get_or_compute(("steps", model_name, text), lambda: model.steps(text))
    except InputError as exc:
        st.warning(str(exc))
    except Exception as exc:
        st.error(f"The model could not run on that input: {exc}")
    return None


def show_trace_notes(trace) -> None:
    meta = trace.meta
    if meta.get("fallback"):
        st.warning(meta["fallback"])
    if meta.get("unknown"):
        words = ", ".join(f"“{w}”" for w in meta["unknown"][:20])
        st.warning(f"Not in {meta['model']}'s vocabulary, shown as <unk>: {words}")
    if meta.get("truncated"):
        st.warning(f"The input was cut to the model's maximum of {meta['max_input_tokens']} tokens "
                   f"({meta['truncated']} tokens dropped).")
    if meta.get("dropped"):
        st.info(f"Ignored (not words): {' '.join(meta['dropped'][:30])}")


# ------------------------------------------------------------------ URL state
class PageState:
    """Widget state seeded from the URL and written back to it, so every view can be shared.

    A value comes from the URL when the page is opened with it (or the URL changed since
    the app last wrote it), else from what the user chose on any page this session, else
    the default.
    """

    def __init__(self, page: str):
        self.page = page
        self.qp = st.query_params.to_dict()
        self.external = self.qp != st.session_state.get("_url_last")
        self.shared: Dict = st.session_state.setdefault("_shared", {})
        self.messages: list = []

    def key(self, field: str) -> str:
        return f"{self.page}.{field}"

    def seed(self, field: str, default, parse: Callable = str, valid: Optional[Callable] = None) -> str:
        key = self.key(field)
        raw = self.qp.get(field)
        if key not in st.session_state or (self.external and raw is not None):
            value = self.shared.get(field, default)
            if raw is not None:
                try:
                    parsed = parse(raw)
                    if valid is not None and not valid(parsed):
                        raise ValueError
                    value = parsed
                except (ValueError, TypeError):
                    self.messages.append(f"The URL's {field}={str(raw)[:40]!r} is not valid here; showing {value!r}.")
            st.session_state[key] = value
        return key

    def set(self, field: str, value) -> None:
        st.session_state[self.key(field)] = value

    def get(self, field: str, default=None):
        return st.session_state.get(self.key(field), default)

    def publish(self, **values) -> None:
        for k, v in values.items():
            self.shared[k] = v
        params = {k: str(v) for k, v in values.items() if v is not None and v != ""}
        if st.query_params.to_dict() != params:
            st.query_params.from_dict(params)
        st.session_state["_url_last"] = params

    def show_messages(self) -> None:
        for m in self.messages:
            st.warning(m)


def int_from_url(state: PageState, field: str, default: int, lo: int, hi: int) -> str:
    """Seed an integer widget from the URL, clamped to [lo, hi] with a notice."""
    key = state.key(field)
    raw = state.qp.get(field)
    if key not in st.session_state or (state.external and raw is not None):
        value = state.shared.get(field, default)
        if raw is not None:
            try:
                value = int(str(raw).strip())
            except ValueError:
                state.messages.append(f"The URL's {field}={str(raw)[:40]!r} is not a whole number; showing {field} {default}.")
                value = default
        st.session_state[key] = value
    value = st.session_state[key]
    if not isinstance(value, int) or value < lo or value > hi:
        fixed = min(max(int(value) if isinstance(value, int) else default, lo), hi)
        state.messages.append(f"{field} {value} is out of range ({lo}–{hi}); showing {field} {fixed}.")
        st.session_state[key] = fixed
    return key


# ------------------------------------------------------------------ layout helpers
def sidebar(model=None) -> None:
    with st.sidebar:
        dev = core.pick_device()
        st.caption(f"Device: **{core.device_name(dev)}** ({dev.type})")
        if model is not None:
            cfg = model.config
            st.caption(f"Model: **{model.name}** · {cfg.kind} · L={cfg.n_layers} H={cfg.n_heads} "
                       f"d={cfg.d_model} d_k={cfg.d_head} m={cfg.d_ff}")


def model_picker(state: PageState, allowed=None, label: str = "Model") -> str:
    names = [n for n in model_names() if n != "random" and (allowed is None or n in allowed)]
    key = state.seed("model", DEFAULT_MODEL if DEFAULT_MODEL in names else names[0], valid=lambda v: v in names)
    if st.session_state[key] not in names:
        st.session_state[key] = names[0]
    fmt = lambda n: n if core.MODELS[n].available() else f"{n} (not installed)"  # noqa: E731
    return st.selectbox(label, names, key=key, format_func=fmt)


def token_chips(tokens, special=None, title: str = "") -> None:
    """Tokens as chips: plain text in st.pills-like badges (never HTML)."""
    if title:
        st.caption(title)
    if not tokens:
        return
    shown = tokens[:400]
    st.markdown(" ".join(f"`{_md_code(t)}`" for t in shown) + (" …" if len(tokens) > 400 else ""))


def _md_code(tok: str) -> str:
    tok = tok.replace("`", "ˋ").replace("\n", "\\n")
    return tok if tok.strip() else "␣" * max(1, len(tok))


def downloads(trace, matrix=None, q_tokens=None, k_tokens=None, name: str = "attention", key: str = "dl") -> None:
    cols = st.columns(2)
    if matrix is not None:
        def csv() -> bytes:  # built only when clicked
            return attention_frame(matrix, q_tokens, k_tokens).to_csv().encode()

        cols[0].download_button("Download this map (CSV)", csv, file_name=f"{name}.csv", mime="text/csv",
                                key=f"{key}-csv", on_click="ignore")
    def npz() -> bytes:  # built only when clicked
        buf = io.BytesIO()
        trace.save(buf)
        return buf.getvalue()

    cols[1].download_button("Download the whole trace (NPZ)", npz, file_name=f"{name}-trace.npz",
                            mime="application/octet-stream", key=f"{key}-npz", on_click="ignore")
