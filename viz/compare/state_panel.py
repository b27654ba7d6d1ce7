"""The Compare page's state: a PageState whose remembered sentences belong to this page
alone, the model it opens on (minilm, else toy-translate), its pair of sentences and the word
they share, and the offer of the sentence the user was reading on another page."""

from __future__ import annotations

from typing import Sequence, Tuple

import streamlit as st

import core
from viz.compare import figures as cmp
from viz.ui import models, url_state

FALLBACK_MODEL = "toy-translate"


class CompareState(url_state.PageState):
    """PageState whose remembered values belong to this page alone (see viz/compare/page.py)."""

    def __init__(self):
        super().__init__("compare", fields=("model", "text", "text2", "target", "word", "layer", "head", "mean",
                                            "words"))
        self.shared = st.session_state.setdefault("_compare_shared", {})
        if "text2" not in self.qp and "target" in self.qp:
            self.qp["text2"] = self.qp["target"]
        elif "target" in self.qp:
            self.ignored_if_given("target", "text2 gives sentence B (target is read only without it)")


def seeded_model(state: CompareState, names: Sequence[str]) -> str:
    """The model picker's session key: minilm when installed, else toy-translate; a model that
    is not installed is replaced by toy-translate, with a message."""
    preferred = "minilm" if "minilm" in names else FALLBACK_MODEL
    model_key = state.seeded_key("model", preferred, valid=lambda v: v in names,
                                 why=f"no model here has that name (models: {', '.join(names)})")
    if st.session_state[model_key] not in names:
        st.session_state[model_key] = preferred
    wanted = st.session_state[model_key]
    if not models.model_available(wanted):
        why = f"{wanted} is not installed ({core.MODELS[wanted].install_hint()})"
        if "model" in state.from_url:
            state.overridden("model", wanted, FALLBACK_MODEL, why)
        else:
            st.warning(f"{why}; showing {FALLBACK_MODEL} instead.")
        st.session_state[model_key] = FALLBACK_MODEL
    return model_key


def seeded_pair(state: CompareState, model_name: str) -> Tuple[str, str, str]:
    """The session keys of sentence A, sentence B and the word, seeded with the model's default
    pair; switching models swaps the old model's pair (if unedited) for the new one's."""
    default_a, default_b, default_word = cmp.default_pair(model_name)
    text_a_key = state.seeded_key("text", default_a)
    text_b_key = state.seeded_key("text2", default_b)
    word_key = state.seeded_key("word", default_word)
    previous = st.session_state.get("compare._model")
    if previous is not None and previous != model_name and not state.external:
        old = cmp.default_pair(previous)
        if (st.session_state[text_a_key], st.session_state[text_b_key]) == old[:2]:  # still the old model's pair
            st.session_state[text_a_key], st.session_state[text_b_key] = default_a, default_b
            st.session_state[word_key] = default_word
    st.session_state["compare._model"] = model_name
    return text_a_key, text_b_key, word_key


def offer_their_sentence(state: CompareState, model_name: str, names: Sequence[str], model_key: str,
                         text_a_key: str, text_b_key: str) -> None:
    """Compare keeps its own pair (not the other pages' sentence): say so, once, with a way back
    to the user's."""
    theirs = st.session_state.get("_shared", {})
    their_text, their_model = str(theirs.get("text") or ""), theirs.get("model")
    if (their_text.strip() and their_text not in (st.session_state[text_a_key], st.session_state[text_b_key])
            and not st.session_state.get("compare._told") and "text" not in state.qp):
        def _use_theirs() -> None:
            st.session_state[text_a_key] = their_text
            st.session_state["compare._told"] = True
            if their_model in names and their_model != model_name:
                st.session_state[model_key] = their_model

        on = f" on {their_model}" if their_model and their_model != model_name else ""
        st.info(f"Compare opens on its own pair of sentences ({model_name}); the sentence you were looking at"
                f"{on}, “{cmp.md_escape(their_text[:80])}”, is not shown here.")
        st.button(f"Use my sentence as A{on}", key="compare-use-mine", on_click=_use_theirs)


def settle_word(state: CompareState, word_key: str, model_name: str, words_a, words_b,
                shared_words: Sequence[str]) -> None:
    """The word to compare: the typed or linked one when both sentences have it, else the
    default word (or the first shared one), with a message saying where the word was."""
    default_word = cmp.default_pair(model_name)[2]
    typed = st.session_state.get(word_key) or ""
    if cmp.normalize(typed) not in shared_words:
        fallback = default_word if default_word in shared_words else shared_words[0]
        in_a, in_b = bool(cmp.occurrences(words_a, typed)), bool(cmp.occurrences(words_b, typed))
        where = "neither sentence" if not (in_a or in_b) else ("sentence B only" if in_b else "sentence A only")
        if typed.strip() and "word" in state.from_url:
            state.overridden("word", typed, fallback, f"“{cmp.md_escape(typed[:40])}” is in {where}, not in both; "
                             "pick a word the two sentences share")
        elif typed.strip():
            st.warning(f"“{cmp.md_escape(typed[:40])}” is in {where}, not in both; showing "
                       f"“{cmp.md_escape(fallback)}”. Pick a word the two sentences share.")
        st.session_state[word_key] = fallback
    else:
        st.session_state[word_key] = cmp.normalize(typed)
