"""The models the app offers and the caches every page asks: which models there are (the
registry's and those found under $ATTENTION_LAB_MODELS), their picker labels and input
limits, loading each once per process, and traces and decoder steps cached across sessions
and bounded in bytes. A failure ends in st.error / st.warning and None, never a traceback.

`setup_process()`, called once by app.py, sets threads and the allocator and the model-load log.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional, Sequence

import streamlit as st

import core
import core.registry
import core.trace
from core.errors import InputError
from viz.ui import gate
from viz.ui.cache import ByteLRU
from viz.ui import admission, longdoc, result_getter
from viz.figures.text import _md_code, clean_text

# A trace larger than the budget is served and never kept (every rerun would trace again):
# the default keeps one of smollm2's 8,192 tokens (~1.1 GiB stored) beside shorter ones.
TRACE_CACHE_BYTES = int(os.environ.get("ATTENTION_LAB_TRACE_CACHE_MB", "2048")) * 2**20


def model_names():
    """The registry's models, the random model's presets
    ("random:<preset>", seed 0) and the models found under $ATTENTION_LAB_MODELS."""
    return (list(core.MODELS) + core.registry.random_preset_names()
            + list(local_models()))


def random_preset(name):
    """(preset, seed) when `name` is one of the random model's presets ("random:<preset>" or
    "random:<preset>:<seed>", core.registry.random_preset), else None (an unknown preset too)."""
    try:
        return core.registry.random_preset(name)
    except ValueError:
        return None


# ------------------------------------------------------------------ models on disk ($ATTENTION_LAB_MODELS)
MODELS_ENV = "ATTENTION_LAB_MODELS"  # folders separated like PATH; each model folder / .gguf one level inside


@st.cache_resource(ttl=30, show_spinner=False)
def _discover(roots: str):
    import core.loaders.local_models

    return core.loaders.local_models.discover(roots, taken=list(core.MODELS))


def local_models():
    """name -> core.loaders.local_models.LocalModel for the checkpoints found under $ATTENTION_LAB_MODELS. Only these
    names (never a path from the URL) lead to a file being read."""
    return _discover(os.environ.get(MODELS_ENV, ""))


def model_label(name: str) -> str:
    """The picker's text: a local model's family and size, or a registry model's install state."""
    local = local_models().get(name)
    if local is not None:
        return local.label
    if random_preset(name) is not None:
        return f"{name} (random weights)"
    return name if core.MODELS[name].available() else f"{name} (not installed)"


def model_available(name: str) -> bool:
    return name in local_models() or random_preset(name) is not None or (name in core.MODELS and core.MODELS[name].available())


def model_kind(name: str) -> str:
    """encoder / decoder / encoder-decoder, as the registry or the checkpoint's family says ("?" unknown)."""
    if random_preset(name) is not None:
        return "decoder"
    local = local_models().get(name) if name not in core.MODELS else None
    return local.kind if local is not None else core.MODELS[name].kind if name in core.MODELS else "?"


# A cap on input tokens below a model's own context (none here: every model reads its whole
# context, smollm2 its GGUF's 8,192 tokens). A trace stores only the residual stream (O(n d))
# and recomputes a layer's maps when they are looked at, one head and a tile of rows at a
# time for long inputs (core/trace.py), so an 8,192-token smollm2 trace is ~1.1 GB.
INPUT_LIMITS: dict = {}


log = logging.getLogger("attention_lab")


def setup_process() -> None:
    """What the app does once per server process, before any page runs (app.py calls it):
    torch threads as core.device chooses, freed trace buffers reused rather than
    page-faulted afresh, one log line per model load in the server log (tests count
    them), and the start-up heap frozen out of the garbage collector's walks
    (core.device.freeze_heap; Streamlit collects after every script run). Calling it again
    changes nothing."""
    core.device.configure_threads()
    core.device.keep_freed_memory()
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        core.device.freeze_heap()  # once: the imports are alive for the life of the process


@st.cache_resource(show_spinner=False)
def _load_model(name: str, path: str = ""):
    t0 = time.perf_counter()
    name, sep, step = name.partition(STEP_SEP)  # "toy-translate@step=200": a training step (model_key)
    model = core.load_model(path or name, **({"step": int(step)} if sep else {}))
    model.name = name  # a local model's picker name (its folder name, suffixed if taken)
    model.input_limit = INPUT_LIMITS.get(name)  # models from disk: their own context
    log.info("loaded model %s on %s in %.1f s", name, model.device, time.perf_counter() - t0)
    core.device.freeze_heap()  # the model stays cached for the life of the process
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


def _cached_run(model_name: str, text: str, key: tuple, run, spinner: str, plain=None):
    """run(model, text) through the shared cache, turning every failure into a message. plain:
    the same computation without the page (no progress bar), for a result asked for again once
    its page run has ended (viz.ui.result_getter); default: run."""
    model = get_model(model_name)
    if model is None:
        return None
    text, msgs = clean_text(text)
    for m in msgs:
        st.warning(m)
    def job() -> tuple:  # (bytes, seconds, label, kind) of the computation, from the tokens it reads
        n = _tokens(model, text)
        if key[0] == "steps":  # the prompt, then the tokens generated after it, in one traced pass
            new = int(getattr(model, "max_new_tokens", 0) or 0)
            cost = gate.steps_bytes(model.config, n, new)
        else:
            cost = gate.trace_bytes(model.config, n)
        seconds = longdoc.trace_seconds(model, model_name, n)
        kind = gate.kind_of(key[0], model_name, longdoc.calibrated(model_name))  # key[0]: "trace" or "steps"
        return cost, seconds, f"{model_name}, {n:,} tokens", kind

    def admitted_run():  # one computation per key (the cache), admitted within the memory budget
        admission.gate().count(trace_cache())  # what the cache holds counts against the same budget
        cost, seconds, label, kind = job()
        with admission.admitted(cost, seconds, label, kind=kind):
            return run(model, text)

    def again():  # the same, outside a page run: admitted by the gate alone (nothing to show a wait in)
        cost, seconds, label, kind = job()
        with admission.gate().admit(cost, seconds, f"{label}, again", kind=kind):
            return (plain or run)(model, text)

    try:
        with st.spinner(spinner):
            value = trace_cache().get_or_compute((model_name, text) + key, admitted_run)
        admission.hold(value, _size_of(value))  # counted against the budget while this page run draws from it
        result_getter.remember(value, trace_cache(), (model_name, text) + key, again)
        return value
    except InputError as exc:
        st.warning(str(exc))
    except Exception as exc:
        st.error(f"The model could not run on that input: {exc}")
    return None


def _tokens(model, text: str) -> int:
    """The tokens the model will read (cheap: the tokenizer alone), for the job's cost."""
    try:
        return min(len(model.tokenizer.encode(text).ids), model.max_input_tokens)
    except Exception:
        return model.max_input_tokens


def get_trace(model_name: str, text: str, target: Optional[str] = None, pad_to: Optional[int] = None,
              ablate: Sequence = (), ablation: str = "zero", notes: bool = True, progress=None):
    """Trace for (model, text, target, padding, heads switched off), cached across sessions and
    bounded in bytes. Returns None after showing a message when the input cannot be traced.
    notes=False leaves out the notes about the input (for a second trace of the same text).
    progress: called when the trace is to be computed (not when it is cached); what it
    returns, unless None, is model.trace's progress callback (its .bar, if any, is cleared
    at the end): a long input's time warning and progress bar (viz.ui.longdoc)."""
    off = tuple(sorted(tuple(h) for h in ablate))
    key = ("trace", target or None, pad_to) + ((("ablate", off, ablation),) if off else ())

    def run(m, t):
        cb = progress() if progress is not None else None
        try:
            return m.trace(t, target=target or None, pad_to=pad_to, ablate=off, ablation=ablation,
                           **({"progress": cb} if cb is not None else {}))
        finally:  # the time warning and the bar go when the run ends (finish: a caption with the time taken)
            if callable(getattr(cb, "finish", None)):
                cb.finish()
            else:
                for part in ("bar", "note"):
                    if getattr(cb, part, None) is not None:
                        getattr(cb, part).empty()

    def plain(m, t):
        return m.trace(t, target=target or None, pad_to=pad_to, ablate=off, ablation=ablation)

    trace = _cached_run(model_name, text, key, run, "Running the model…", plain=plain)
    if trace is not None and notes:
        show_trace_notes(trace)
    return trace


def step_limit(model) -> Optional[int]:
    """The longest prompt the decoder stepper runs a decoder-only model on: its context (the
    app's input limit, else the config's max_len) minus the tokens it may generate, so that
    prompt and continuation fit the positions the model has. None for an encoder-decoder (its
    source has a context of its own; the trace's notes say when it is cut)."""
    if getattr(model, "kind", None) != "decoder":
        return None
    context = getattr(model, "input_limit", None) or model.config.max_len
    return max(1, int(context) - int(getattr(model, "max_new_tokens", 0) or 0))


def step_prompt(model_name: str, text: str):
    """The prompt the decoder stepper runs on and how many tokens were cut from its start:
    generation continues from the prompt's end, so a prompt longer than step_limit keeps its
    LAST tokens (with a warning saying how many were cut). Pass the prompt to get_steps and
    get_trace alike; the step view marks the cut at the start of the decoder input."""
    model = get_model(model_name) if text else None
    limit = step_limit(model) if model is not None else None
    if limit is None:
        return text, 0
    cleaned, _ = clean_text(text)
    try:
        enc = model.tokenizer.encode(cleaned)
        count = len(enc) + enc.truncated  # the tokenizer keeps its first max_len tokens and counts the rest
        if count <= limit:
            return text, 0
        kept = _last_tokens(model.tokenizer, cleaned, limit)
        n_kept = len(model.tokenizer.encode(kept))
    except Exception:
        return text, 0
    cut = count - n_kept
    context, new = limit + model.max_new_tokens, model.max_new_tokens
    st.warning(f"The prompt has {count:,} tokens. {model_name} reads at most {context:,} and the stepper generates up "
               f"to {new} after the prompt, so it runs on the prompt's last {n_kept:,} tokens (the ones generation "
               f"continues from): the first {cut:,} are cut (marked at the start of the decoder input below).")
    return kept, cut


def _last_tokens(tokenizer, text: str, limit: int) -> str:
    """The end of `text` that tokenizes to at most `limit` tokens, cut at a token boundary: a
    window of the text's end is tokenized (the tokenizer itself keeps only its first max_len
    tokens), widened until it holds more than `limit` tokens, then cut after its surplus."""
    span = 4 * limit
    for _ in range(40):
        begin = max(0, len(text) - span)
        enc = tokenizer.encode(text[begin:])
        if enc.truncated:  # more than the tokenizer keeps: narrow the window
            span = max(limit, span * 3 // 4)
            continue
        if len(enc) > limit or begin == 0:
            break
        span *= 2
    first = max(0, len(enc) - limit)
    while True:  # a cut inside a word may tokenize longer: move on until it fits
        kept = text[begin + enc.offsets[first][0]:] if first < len(enc) else ""
        n = len(tokenizer.encode(kept))
        if n <= limit or first >= len(enc):
            return kept
        first += n - limit


def get_steps(model_name: str, text: str):
    """All decoding steps, computed once per (model, text) and cached: step changes do no model work."""
    return _cached_run(model_name, text, ("steps",), lambda m, t: m.steps(t), "Generating, one token at a time…")


# ------------------------------------------------------------------ the decoder stepper's checks
@st.cache_resource(show_spinner=False)
def check_cache() -> ByteLRU:
    """The decoder stepper's check results, shared by every session: a few numbers and a sentence
    each (counted at CHECK_BYTES apiece), per (check, model, prompt, step or target, what was drawn)."""
    return ByteLRU(CHECK_ENTRIES * CHECK_BYTES, max_entries=CHECK_ENTRIES, size_of=lambda _: CHECK_BYTES)


CHECK_ENTRIES, CHECK_BYTES = 512, 4096


def _check(key: tuple, cost: int, seconds: float, label: str, spinner: str, compute):
    """compute() once per key (check_cache), admitted by the gate like the other heavy work: the check runs
    a forward pass of its own, as long as the stepper's prompt (up to the model's context). It is work on the
    steps the page holds, so it goes ahead of the waiting traces (first=True)."""
    def admitted_run():
        kind = gate.kind_of(f"{key[0]} check", key[1], longdoc.calibrated(key[1]))  # key: (check, model, ...)
        with admission.admitted(cost, seconds, label, kind=kind, first=True):
            return compute()

    with st.spinner(spinner):
        return check_cache().get_or_compute(key, admitted_run)


def _n_source(model, trace) -> int:
    """An encoder-decoder's source positions (0 for a decoder-only model)."""
    return len(trace.tokens("source")) if getattr(model, "kind", None) == "encoder-decoder" else 0


def prefix_check(model_name: str, text: str, target: str, n_rows: int, drawn: str, _model, _full, _drawn=None):
    """Teacher forcing = inference on the same prefix, checked for one step: the first n_rows
    decoder rows of `_full` (get_trace(model_name, text, target=target)) against the decoder
    run on those n_rows inputs alone, in a forward pass of its own on `_model`
    (get_model(model_name)); viz.ui.prefix_check.prefix_difference compares them, and the
    arrays the page drew (`_drawn`, viz.ui.prefix_check.Drawn; `drawn` is its digest). One
    extra pass per step shown, admitted by the gate (gate.prefix_check_bytes), kept per (model,
    text, target, step, what was drawn)."""
    from viz.ui import prefix_check as pc

    def compute():
        alone = _model.trace_decoder_input(clean_text(text)[0], _full.meta["target_ids"][:n_rows])
        return pc.prefix_difference(_full, alone, drawn=_drawn)

    n_pass = len(_full.tokens("target"))
    cost = gate.prefix_check_bytes(_model.config, n_rows, n_pass, _n_source(_model, _full))
    return _check(("prefix", model_name, text, target, n_rows, drawn), cost,
                  2 * longdoc.trace_seconds(_model, model_name, n_rows), f"{model_name} step check, {n_rows:,} rows",
                  "Running the decoder on this step's prefix alone…", compute)


def step_check(model_name: str, text: str, step: int, drawn: str, _model, _view, _drawn=None):
    """An inference step checked: the step view `_view` (model.steps' step `step` on `text`, a
    view of one traced pass) against the decoder run on that step's input alone, in a forward
    pass of its own on `_model` (viz.ui.prefix_check.prefix_difference), and the arrays the page
    drew of it (`_drawn`, whose digest is `drawn`). Admitted by the gate (gate.prefix_check_bytes),
    kept per (model, text, step, what was drawn)."""
    from viz.ui import prefix_check as pc

    def compute():
        alone = _model.trace_decoder_input(clean_text(text)[0], _view.meta["target_ids"])
        return pc.prefix_difference(_view, alone, drawn=_drawn)

    n_rows = len(_view.meta["target_ids"])
    base = getattr(_view, "_base", None) or _view  # a step view reads its whole pass's layers
    cost = gate.prefix_check_bytes(_model.config, n_rows, len(base.tokens("target")), _n_source(_model, _view))
    return _check(("step", model_name, text, step, drawn), cost, 2 * longdoc.trace_seconds(_model, model_name, n_rows),
                  f"{model_name} step check, {n_rows:,} rows", "Running the decoder on this step's prefix alone…",
                  compute)


def generation_check(model_name: str, text: str, shown_ids: tuple, _model, n_prompt: int = 0, n_source: int = 0):
    """The KV cache checked: the tokens the steps show (generated through the cache) against
    greedy decoding with no cache, and the two runs' next-token logits
    (viz.ui.prefix_check.generation_difference). Admitted by the gate
    (gate.generation_check_bytes: n_prompt decoder positions before the generated ones, n_source an
    encoder-decoder's source), kept per (model, text, tokens shown)."""
    from viz.ui import prefix_check as pc

    T = len(shown_ids)
    cost = gate.generation_check_bytes(_model.config, n_prompt, T, n_source)
    return _check(("generation", model_name, text, tuple(shown_ids)), cost,
                  3 * longdoc.trace_seconds(_model, model_name, n_prompt + T),
                  f"{model_name} KV-cache check, {n_prompt + T:,} tokens", "Generating again without the KV cache…",
                  lambda: pc.generation_difference(_model, clean_text(text)[0], list(shown_ids)))


def show_trace_notes(trace) -> None:
    meta = trace.meta
    if meta.get("fallback"):
        st.warning(meta["fallback"])
    if meta.get("unknown"):
        words = ", ".join(f"“{w}”" for w in meta["unknown"][:20])
        st.warning(f"Not in {meta['model']}'s vocabulary, shown as <unk>: {words}")
    if meta.get("target_unknown"):  # a teacher-forced target's words, on every page that takes one
        words = ", ".join(f"“{w}”" for w in meta["target_unknown"][:20])
        st.warning(f"Not in {meta['model']}'s target vocabulary, shown as <unk>: {words}")
    if meta.get("truncated"):
        kept, cut = int(meta["max_input_tokens"]), int(meta["truncated"])
        st.warning(f"The input was cut to the model's maximum of {kept} tokens: it is {kept + cut:,} tokens and "
                   f"{meta['model']} reads no more (its context), so its first {kept:,} are kept and the last "
                   f"{cut:,} ({cut / (kept + cut):.0%} of the input) are not read. The box still holds the whole text.")
    if meta.get("dropped"):
        st.info(f"Ignored (not words): {' '.join(meta['dropped'][:30])}")
    for fill in meta.get("fill_mask") or []:  # encoders with a masked-LM head (core.loaders.masked_lm)
        top = " · ".join(f"`{_md_code(tok)}` {p:.0%}" for tok, p in fill["top"])
        st.info(f"The masked-LM head's fill-ins for token {fill['position']}: {top}")
