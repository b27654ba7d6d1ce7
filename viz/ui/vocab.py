"""A sentence mostly outside the model's vocabulary: say so, and offer in one click a model
that reads it (the lecture notes' examples are English; toy-translate knows ~100 words)."""

from __future__ import annotations

import streamlit as st

from viz.ui import models, url_state

# word-piece and byte-level tokenizers: English text gives them no <unk>
READERS = ("minilm", "smollm2")
UNK = "<unk>"


def reader_for(model_name: str):
    """The first installed model that reads any English text, other than `model_name`."""
    return next((n for n in READERS if n != model_name and models.model_available(n)), None)


def unknown_count(trace) -> int:
    return sum(t == UNK for t in trace.tokens("source"))


def offer_reader(state: url_state.PageState, model_name: str, trace, key: str) -> None:
    """Under a trace with more than one <unk>: what it means, and a button that switches the
    page's model (the sentence stays) to one that reads the sentence."""
    n_unk = unknown_count(trace)
    if n_unk <= 1:
        return
    other = reader_for(model_name)
    n = len(trace.tokens("source"))
    msg = (f"{n_unk} of the {n} tokens are <unk>: {model_name} knows only the words of its own task, so this "
           "map says little about the sentence.")
    if other is None:
        st.info(msg)
        return
    st.info(msg + f" **{other}** reads any English text.")

    def _switch() -> None:
        st.session_state[state.key("model")] = other

    st.button(f"Open this sentence on {other}", key=key, on_click=_switch, type="primary",
              icon=":material/swap_horiz:")


def model_for_example(model, model_name: str, sentence: str) -> str:
    """The model an example opens on: this one where it reads the sentence (at most one <unk>,
    counted by the tokenizer alone), else one that reads any English text (the notes' examples
    on toy-translate)."""
    try:
        n_unk = sum(t == UNK for t in model.source_strings(model.encode(sentence)))
    except Exception:
        return model_name
    return model_name if n_unk <= 1 else (reader_for(model_name) or model_name)


def dedupe_examples(pairs) -> dict:
    """label -> sentence with one button per sentence, whatever its case ("Show me the money"
    and "show me the money" are one example); labels cut to 40 characters."""
    out, seen = {}, set()
    for label, sentence in pairs:
        norm = " ".join(sentence.lower().split())
        if norm in seen:
            continue
        seen.add(norm)
        out[label if len(label) <= 40 else label[:38] + "…"] = sentence
    return out
