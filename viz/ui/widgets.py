"""The widgets pages share: the page header (model picker and sidebar), the attention /
layer / head picker, example-sentence buttons and token chips, and the lecture notes'
example sentences.

The pickers are seeded from the URL through PageState (viz/ui/url_state.py); the header
loads the picked model through viz/ui/models.py.
"""

from __future__ import annotations

from typing import Dict

import streamlit as st

import core
from core import trace_names as tn
from viz.figures.citations import cite_text
from viz.ui import page_guide, registry
from viz.ui.models import get_model, model_kind, model_label, model_names, random_preset
from viz.ui.url_state import PageState, int_from_url
from viz.figures.select import attention_views
from viz.figures.text import _md_code


DEFAULT_MODEL = "toy-translate"

NOTES_EXAMPLES = {
    "bank (river)": "I swam across the river to get to the other bank.",
    "bank (cash)": "I walked across the road to get cash from the bank.",
    "Show me the money": "Show me the money",
    "help me!": "help me!",
}


KIND_LABEL = {("encoder", "self_attn"): "encoder self-attention", ("decoder", "self_attn"): "decoder self-attention (masked)",
              ("decoder", "cross_attn"): "decoder cross-attention"}


MIXER_LABEL = {"gated_delta": "Gated DeltaNet", "kimi_delta": "Kimi Delta Attention", "mamba2": "Mamba2", "short_conv": "short convolution"}


def mixer_views(trace) -> list:
    """(stack, "mixer") for each stack with layers whose token mixer is not softmax attention."""
    return [(s, tn.MIXER) for s in trace.stacks() if trace.mixer_layers(s)]


def view_layers(trace, stack: str, kind: str) -> list:
    """The layers of `stack` where the view `kind` applies: a token mixer's layers for "mixer",
    else the layers that hold that softmax attention."""
    if kind == tn.MIXER:
        return trace.mixer_layers(stack)
    return [i for i in range(trace.layers(stack)) if tn.attn(stack, i, kind, "weights") in trace]


def mixer_kind(trace) -> str:
    """The kind of the trace's token mixers ("gated_delta", "kimi_delta", "mamba2", "short_conv"), or ""."""
    return str((trace.meta.get("config", {}).get("mixer") or {}).get("kind", ""))


def no_softmax_info(model_name: str, trace, what: str) -> None:
    """The one message a view that reads softmax attention gives on a model whose layers mix
    tokens otherwise."""
    kind = MIXER_LABEL.get(mixer_kind(trace), "a token mixer")
    st.info(f"**{what} reads softmax attention**, and {model_name} has none: every layer mixes tokens with "
            f"{kind}, whose implicit attention is signed and does not sum to 1. Explore and Inside a head show it.")


def attention_picker(state: PageState, trace, cols, mixers: bool = False):
    """Attention (stack.kind), layer and head selectors in three columns, seeded from the
    URL and clamped to the trace. Returns (attn, stack, kind, layer, head, layer_key, head_key).
    The layer picker offers the layers where the chosen view applies; with `mixers`, a stack
    with token mixers (core/net/mixer.py) adds the view "{stack}.mixer" of those layers. A
    trace with no view at all says so (no_softmax_info) and stops the page."""
    views = attention_views(trace) + (mixer_views(trace) if mixers else [])
    view_names = [f"{s}.{k}" for s, k in views]
    model = trace.meta.get("model", "this model")
    if not view_names:
        no_softmax_info(model, trace, "This view")
        st.stop()
    attn_key = state.seeded_key("attn", view_names[0], valid=lambda v: v in view_names,
                          why=f"{model}'s attentions are {', '.join(view_names)}")
    if st.session_state[attn_key] not in view_names:
        st.session_state[attn_key] = view_names[0]
    mixer_label = f"{trace.stacks()[-1]} token mixer ({MIXER_LABEL.get(mixer_kind(trace), 'not softmax')})"
    attn = cols[0].selectbox("Attention", view_names, key=attn_key,
                             format_func=lambda v: (mixer_label if v.endswith("." + tn.MIXER)
                                                    else KIND_LABEL.get(tuple(v.split(".")), v)),
                             help="Which attention to show. Self-attention: the sentence's words look at each other. "
                                  "Cross-attention (translation models): each output word looks at the input "
                                  "sentence. A token mixer (Gated DeltaNet, Mamba2, a short convolution) mixes the "
                                  "words without a softmax.")
    stack, kind = attn.split(".")
    layers = view_layers(trace, stack, kind)
    if kind == tn.MIXER:
        n_heads = trace.mixer_heads(stack) if mixer_kind(trace) != "short_conv" else 1
    else:
        n_heads = trace.n_heads(stack)
    of = f"{model}'s {KIND_LABEL.get((stack, kind), attn)}"
    layer_key = int_from_url(state, "layer", layers[0], 0, trace.layers(stack) - 1, of=of)
    if st.session_state[layer_key] not in layers:
        asked = st.session_state[layer_key]
        nearest = min(layers, key=lambda i: (abs(i - asked), i))
        state.say(f"layer {asked} has no {mixer_label if kind == tn.MIXER else KIND_LABEL.get((stack, kind), attn)}"
                  f" (its layers are {', '.join(map(str, layers))}); showing layer {nearest}.")
        st.session_state[layer_key] = nearest
        state.keep(layer_key, nearest)
    head_key = int_from_url(state, "head", 0, 0, n_heads - 1, of=of)
    layer = cols[1].selectbox("Layer", layers, key=layer_key,
                              help="The model is a stack of layers, each reading what the one below wrote; "
                                   "0 is the first, nearest the words. Only the layers this view applies to are "
                                   "offered.")
    head = cols[2].selectbox("Head", list(range(n_heads)), key=head_key,
                             help="Each layer has several heads: separate attentions side by side, each free to "
                                  "look for something different (the previous word, the verb, the same word).")
    return attn, stack, kind, layer, head, layer_key, head_key


def header(key: str) -> None:
    """The page's heading and, under it, the one line that says what the page answers
    (both from the page registry, viz/ui/registry.py)."""
    spec = registry.page(key)
    st.title(spec.heading)
    st.caption(f"**{spec.question}**")
    guide = page_guide.section(spec.title)
    if guide:
        with st.expander("Page guide: what this page shows and how to read it", icon=":material/help:"):
            st.markdown(guide)
            st.caption("From the page guide, docs/pages.md, which holds every page's.")


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
    when another is asked for. A random preset says, under the header, that its weights are
    random. Returns (model name, model or None, the wide column)."""
    top = st.columns([1, 3])
    with top[0]:
        model_name = model_picker(state, allowed=allowed, needs=needs)
    random_note(model_name)
    model = get_model(model_name)
    sidebar(model)
    return model_name, model, top[1]


def random_note(model_name: str) -> None:
    """For a random preset (core.registry.RANDOM_PRESETS): an st.info saying that its weights
    are random, which mechanism it has and which seed drew it."""
    preset = random_preset(model_name)
    if preset is None:
        return
    what = core.registry.RANDOM_PRESETS[preset[0]][0]
    st.info(f"**The weights of {model_name} are random** (seed {preset[1]}), not trained: its maps show what the "
            f"mechanism does ({what}), not what a trained model learned. It needs no download.",
            icon=":material/casino:")


def example_buttons(examples: Dict[str, str], key: str, on_click, max_cols: int = 5, shown: int | None = None) -> None:
    """One button per example sentence (label -> sentence), max_cols to a row; a shortened
    label shows the whole sentence on hover. on_click(sentence) runs before the rerun; a value
    may be a tuple (sentence, ...), handed to on_click whole.
    shown: only the first `shown` examples as buttons, the rest in a "More examples" popover
    beside them (a closed popover mounts nothing: the page's first view stays light)."""
    items = list(examples.items())
    first, rest = (items, []) if shown is None or shown >= len(items) else (items[:shown], items[shown:])
    cols = st.columns(min(len(first) + bool(rest), max_cols))

    def button(where, i, label, sentence):
        text = sentence[0] if isinstance(sentence, tuple) else sentence  # (sentence, what else it carries)
        where.button(label, key=f"{key}-{i}", on_click=on_click, args=(sentence,), width="stretch",
                     help=text if label != text else None)

    for i, (label, sentence) in enumerate(first):
        button(cols[i % len(cols)], i, label, sentence)
    if rest:
        with cols[len(first) % len(cols)].popover(f"{len(rest)} more", key=f"{key}-more", width="stretch"):
            for i, (label, sentence) in enumerate(rest, start=len(first)):
                button(st, i, label, sentence)


def model_picker(state: PageState, allowed=None, label: str = "Model", needs: str = "") -> str:
    """The model selectbox, seeded from the URL. Beside the models it lists, it takes a random
    preset with a seed ("random:sinks:3", core.registry.random_preset) where the page takes its
    preset, and shows a seed box under a random preset."""
    names = [n for n in model_names() if n != "random" and (allowed is None or n in allowed)]

    def base(name) -> str:  # a seeded preset stands for its preset's name
        preset = random_preset(name)
        return f"random:{preset[0]}" if preset is not None else str(name)

    def valid(name) -> bool:
        return name in names or base(name) in names

    def why_not(name) -> str:
        name = str(name)
        try:
            core.registry.random_preset(name)
        except ValueError:  # the value itself is not repeated outside the URL's quote
            return (f"the random model's presets are {', '.join(core.registry.RANDOM_PRESETS)}, each with an optional "
                    "seed (random:sinks:3)")
        if base(name) in model_names() and base(name) != "random":
            return f"{name} is an {model_kind(name)} model; {needs or 'this page takes ' + ', '.join(names)}"
        return f"no model here has that name (models: {', '.join(names)})"

    default = DEFAULT_MODEL if DEFAULT_MODEL in names else names[0]
    theirs = state.shared.get("model")
    if theirs is not None and not valid(theirs) and state.key("model") not in st.session_state \
            and "model" not in state.qp:  # the model of the page the user comes from
        state.say(f"{why_not(theirs)}: showing {default}.")
    key = state.seeded_key("model", default, valid=valid, why=lambda raw, exc: why_not(raw))
    if not valid(st.session_state[key]):
        st.session_state[key] = default
    current = st.session_state[key]
    options = names if current in names else names + [current]  # a preset with its own seed
    name = st.selectbox(label, options, key=key, format_func=model_label)
    preset = random_preset(name)
    if preset is not None:
        seed_key = f"{state.page}._seed"
        st.session_state[seed_key] = preset[1]

        def reseed():
            seed = int(st.session_state[seed_key])
            st.session_state[key] = f"random:{preset[0]}" + (f":{seed}" if seed else "")

        st.number_input("Seed of the random weights", min_value=0, max_value=2**31 - 1, key=seed_key, step=1, on_change=reseed,
                        help="Another seed draws other random weights of the same shape (the URL keeps it).")
    state.switch_seen(name)  # the page's remembered choices are fitted to the new model (url_state)
    return name


TEXT_HINT = "press Ctrl+Enter"  # every page's text boxes: multi-line, applied with Ctrl+Enter (⌘+Enter on a Mac)


def text_box(label: str, key: str, where=None, help=None, height: int = 80) -> str:
    """The one kind of text box of the app: multi-line (st.text_area), so a pasted paragraph
    keeps its newlines (the tokenizer sees them, the URL keeps them); Enter starts a new line,
    Ctrl+Enter applies (Streamlit says so under the box while it is focused). Every page's
    sentence, prompt and target box is this one."""
    where = st if where is None else where
    return where.text_area(f"{label} ({TEXT_HINT})", key=key, height=height, help=help)


def token_chips(tokens, special=None, title: str = "") -> None:
    """Tokens as chips: plain text in st.pills-like badges (never HTML)."""
    if title:
        st.caption(title)
    if not tokens:
        return
    shown = tokens[:400]
    st.markdown(" ".join(f"`{_md_code(t)}`" for t in shown) + (" …" if len(tokens) > 400 else ""))


def show_checks(checks) -> None:
    """Checks (viz.figures.checks.Check) as the pages show them: a green caption within the tolerance,
    an st.error past it, each with its error and tolerance."""
    for chk in checks:
        if chk.ok:
            st.caption(f":green[{cite_text(chk.text())}]")
        else:
            st.error(cite_text(chk.text()))
