"""What every page shares: cached models and traces, messages, the model picker and other widgets.

Pages stay thin: they read state here, ask for a Trace, hand it to viz figure functions
and lay the results out. Errors a user can cause end in st.error / st.warning.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Dict, Optional, Sequence

import streamlit as st

import core
import core.trace
from core.errors import InputError
from viz.cache import ByteLRU
from viz.select import attention_views
from viz.pages.url_state import PageState, int_from_url
from viz.text import MAX_CHARS, URL_VALUE_BYTES, _md_code, clean_text, url_text, url_value  # noqa: F401


DEFAULT_MODEL = "toy-translate"
TRACE_CACHE_BYTES = int(os.environ.get("ATTENTION_LAB_TRACE_CACHE_MB", "1024")) * 2**20

NOTES_EXAMPLES = {
    "bank (river)": "I swam across the river to get to the other bank.",
    "bank (cash)": "I walked across the road to get cash from the bank.",
    "Show me the money": "Show me the money",
    "help me!": "help me!",
}


def model_names():
    return list(core.MODELS) + list(local_models())


# ------------------------------------------------------------------ models on disk ($ATTENTION_LAB_MODELS)
MODELS_ENV = "ATTENTION_LAB_MODELS"  # folders separated like PATH; each model folder / .gguf one level inside


@st.cache_resource(ttl=30, show_spinner=False)
def _discover(roots: str):
    import core.local_models

    return core.local_models.discover(roots, taken=list(core.MODELS))


def local_models():
    """name -> core.local_models.LocalModel for the checkpoints found under $ATTENTION_LAB_MODELS. Only these
    names (never a path from the URL) lead to a file being read."""
    return _discover(os.environ.get(MODELS_ENV, ""))


def model_label(name: str) -> str:
    """The picker's text: a local model's family and size, or a registry model's install state."""
    local = local_models().get(name)
    if local is not None:
        return local.label
    return name if core.MODELS[name].available() else f"{name} (not installed)"


def model_available(name: str) -> bool:
    return name in local_models() or (name in core.MODELS and core.MODELS[name].available())


# The app's longest input per model, in tokens: the models' own. A trace stores only the
# residual stream (O(n d)) and recomputes a layer's maps when they are looked at
# (core/trace.py), so a 2,048-token smollm2 trace is ~0.3 GB, not L x H x n^2 floats.
INPUT_LIMITS = {"toy-translate": 64, "minilm": 512, "smollm2": 2048}


log = logging.getLogger("attention_lab")


def setup_process() -> None:
    """What the app does once per server process, before any page runs (app.py calls it):
    torch threads as core.device chooses, freed trace buffers reused rather than
    page-faulted afresh, and one log line per model load in the server log (tests count
    them). Calling it again changes nothing."""
    core.device.configure_threads()
    core.device.keep_freed_memory()
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


@st.cache_resource(show_spinner=False)
def _load_model(name: str, path: str = ""):
    t0 = time.perf_counter()
    name, sep, step = name.partition(STEP_SEP)  # "toy-translate@step=200": a training step (model_key)
    model = core.load_model(path or name, **({"step": int(step)} if sep else {}))
    model.name = name  # a local model's picker name (its folder name, suffixed if taken)
    model.input_limit = INPUT_LIMITS.get(name)  # models from disk: their own context
    log.info("loaded model %s on %s in %.1f s", name, model.device, time.perf_counter() - t0)
    return model


STEP_SEP = "@step="


def model_key(name: str, step: Optional[int] = None) -> str:
    """What get_model / get_trace / get_steps take for `name` at a training step (None: the
    shipped weights); the model and trace caches keep each step apart through it."""
    return name if step is None else f"{name}{STEP_SEP}{int(step)}"


def get_model(name: str):
    """The model, loaded once per process; None (after an st.error) when it cannot load."""
    local = local_models().get(name) if name not in core.MODELS else None
    try:
        if local is not None:
            if local.problem:
                raise core.ModelUnavailable(local.problem)
            with st.spinner(f"Loading {local.label} from {local.path.name}: reading its tensors and converting them "
                            "to float32, then its tokenizer…"):
                return _load_model(name, str(local.path))
        with st.spinner(f"Loading {name}…"):
            return _load_model(name)
    except core.ModelUnavailable as exc:
        st.error(f"{exc}. The other models keep working.")
    except Exception as exc:  # a broken install must not take the page down
        st.error(f"Could not load model {name!r}: {exc}")
    # Pages stop here without writing their state to the URL. Count the URL as read, or it would
    # stay "external" (PageState) and re-impose this model over the one the user picks next.
    st.session_state["_url_last"] = st.query_params.to_dict()
    return None


@st.cache_resource(show_spinner=False)
def trace_cache() -> ByteLRU:
    return ByteLRU(TRACE_CACHE_BYTES, max_entries=256, size_of=_size_of)


def _size_of(value) -> int:
    """Bytes of a Trace or of a list of Traces (decoder steps: views of one pass, counted once)."""
    return core.trace.nbytes_of(value if isinstance(value, list) else [value])


def _cached_run(model_name: str, text: str, key: tuple, run, spinner: str):
    """run(model, text) through the shared cache, turning every failure into a message."""
    model = get_model(model_name)
    if model is None:
        return None
    text, msgs = clean_text(text)
    for m in msgs:
        st.warning(m)
    try:
        with st.spinner(spinner):
            return trace_cache().get_or_compute((model_name, text) + key, lambda: run(model, text))
    except InputError as exc:
        st.warning(str(exc))
    except Exception as exc:
        st.error(f"The model could not run on that input: {exc}")
    return None


def get_trace(model_name: str, text: str, target: Optional[str] = None, pad_to: Optional[int] = None,
              ablate: Sequence = (), ablation: str = "zero", notes: bool = True):
    """Trace for (model, text, target, padding, heads switched off), cached across sessions and
    bounded in bytes. Returns None after showing a message when the input cannot be traced.
    notes=False leaves out the notes about the input (for a second trace of the same text)."""
    off = tuple(sorted(tuple(h) for h in ablate))
    key = ("trace", target or None, pad_to) + ((("ablate", off, ablation),) if off else ())
    trace = _cached_run(model_name, text, key,
                        lambda m, t: m.trace(t, target=target or None, pad_to=pad_to, ablate=off, ablation=ablation),
                        "Running the model…")
    if trace is not None and notes:
        show_trace_notes(trace)
    return trace


# The decoder stepper generates up to 64 tokens with a KV cache, then traces prompt + output
# once (every step is a view of that pass): smollm2 prompts are capped at 1,024 tokens so
# that generation stays within seconds on a CPU.
STEP_INPUT_LIMITS = {"smollm2": 1024}


def step_prompt(model_name: str, text: str) -> str:
    """The prompt the decoder stepper runs on: `text`, cut after STEP_INPUT_LIMITS tokens (with a
    warning) where the model has such a cap. Pass it to get_steps and get_trace alike."""
    limit = STEP_INPUT_LIMITS.get(model_name)
    model = get_model(model_name) if limit else None
    if model is None or not text:
        return text
    cleaned, _ = clean_text(text)  # same length as text up to MAX_CHARS: its offsets fit text too
    try:
        enc = model.tokenizer.encode(cleaned)
    except Exception:
        return text
    if len(enc) <= limit:
        return text
    end = max(t for _, t in enc.offsets[:limit])
    st.warning(f"The decoder stepper generates token by token, so it runs {model_name} on the first {limit} "
               f"tokens of the prompt (the other pages take up to {INPUT_LIMITS.get(model_name)}).")
    return text[:end]


def get_steps(model_name: str, text: str):
    """All decoding steps, computed once per (model, text) and cached: step changes do no model work."""
    return _cached_run(model_name, text, ("steps",), lambda m, t: m.steps(t), "Generating, one token at a time…")


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
    for fill in meta.get("fill_mask") or []:  # encoders with a masked-LM head (core.masked_lm)
        top = " · ".join(f"`{_md_code(tok)}` {p:.0%}" for tok, p in fill["top"])
        st.info(f"The masked-LM head's fill-ins for token {fill['position']}: {top}")


# ------------------------------------------------------------------ layout helpers
KIND_LABEL = {("encoder", "self_attn"): "encoder self-attention", ("decoder", "self_attn"): "decoder self-attention (masked)",
              ("decoder", "cross_attn"): "decoder cross-attention"}


def attention_picker(state: PageState, trace, cols):
    """Attention (stack.kind), layer and head selectors in three columns, seeded from the
    URL and clamped to the trace. Returns (attn, stack, kind, layer, head, layer_key, head_key)."""
    view_names = [f"{s}.{k}" for s, k in attention_views(trace)]
    model = trace.meta.get("model", "this model")
    attn_key = state.seeded_key("attn", view_names[0], valid=lambda v: v in view_names,
                          why=f"{model}'s attentions are {', '.join(view_names)}")
    if st.session_state[attn_key] not in view_names:
        st.session_state[attn_key] = view_names[0]
    attn = cols[0].selectbox("Attention", view_names, key=attn_key,
                             format_func=lambda v: KIND_LABEL.get(tuple(v.split(".")), v))
    stack, kind = attn.split(".")
    n_layers, n_heads = trace.layers(stack), trace[f"{stack}.0.{kind}.weights"].shape[0]
    of = f"{model}'s {KIND_LABEL.get((stack, kind), attn)}"
    layer_key = int_from_url(state, "layer", 0, 0, n_layers - 1, of=of)
    head_key = int_from_url(state, "head", 0, 0, n_heads - 1, of=of)
    layer = cols[1].selectbox("Layer", list(range(n_layers)), key=layer_key)
    head = cols[2].selectbox("Head", list(range(n_heads)), key=head_key)
    return attn, stack, kind, layer, head, layer_key, head_key


def sidebar(model=None) -> None:
    with st.sidebar:
        dev = core.pick_device()
        st.caption(f"Device: **{core.device_name(dev)}** ({dev.type})")
        if model is not None:
            cfg = model.config
            st.caption(f"Model: **{model.name}** · {cfg.kind} · L={cfg.n_layers} H={cfg.n_heads} "
                       f"d={cfg.d_model} d_k={cfg.d_head} m={cfg.d_ff}")


def model_header(state: PageState, allowed=None, needs: str = ""):
    """The top of a page: the model picker on the left of a wide column (returned, for the
    page's text input), the sidebar, and the loaded model (None after an error message).
    `allowed`: the models the page takes, `needs`: what they have in common, for the message
    when another is asked for. Returns (model name, model or None, the wide column)."""
    top = st.columns([1, 3])
    with top[0]:
        model_name = model_picker(state, allowed=allowed, needs=needs)
    model = get_model(model_name)
    sidebar(model)
    return model_name, model, top[1]


def example_buttons(examples: Dict[str, str], key: str, on_click, max_cols: int = 5) -> None:
    """One button per example sentence (label -> sentence), max_cols to a row; a shortened
    label shows the whole sentence on hover. on_click(sentence) runs before the rerun."""
    cols = st.columns(min(len(examples), max_cols))
    for i, (label, sentence) in enumerate(examples.items()):
        cols[i % len(cols)].button(label, key=f"{key}-{i}", on_click=on_click, args=(sentence,), width="stretch",
                                   help=sentence if label != sentence else None)


def model_kind(name: str) -> str:
    """encoder / decoder / encoder-decoder, as the registry or the checkpoint's family says ("?" unknown)."""
    local = local_models().get(name) if name not in core.MODELS else None
    return local.kind if local is not None else core.MODELS[name].kind if name in core.MODELS else "?"


def model_picker(state: PageState, allowed=None, label: str = "Model", needs: str = "") -> str:
    names = [n for n in model_names() if n != "random" and (allowed is None or n in allowed)]

    def why_not(name) -> str:
        name = str(name)
        if name == "random" or name not in model_names():
            return f"no model here has that name (models: {', '.join(names)})"
        return f"{name} is an {model_kind(name)} model; {needs or 'this page takes ' + ', '.join(names)}"

    default = DEFAULT_MODEL if DEFAULT_MODEL in names else names[0]
    theirs = state.shared.get("model")
    if theirs is not None and theirs not in names and state.key("model") not in st.session_state \
            and "model" not in state.qp:  # the model of the page the user comes from
        state.say(f"{why_not(theirs)}: showing {default}.")
    key = state.seeded_key("model", default, valid=lambda v: v in names, why=lambda raw, exc: why_not(raw))
    if st.session_state[key] not in names:
        st.session_state[key] = default
    return st.selectbox(label, names, key=key, format_func=model_label)


def token_chips(tokens, special=None, title: str = "") -> None:
    """Tokens as chips: plain text in st.pills-like badges (never HTML)."""
    if title:
        st.caption(title)
    if not tokens:
        return
    shown = tokens[:400]
    st.markdown(" ".join(f"`{_md_code(t)}`" for t in shown) + (" …" if len(tokens) > 400 else ""))

