"""The Playground's controls and their URL state. Every control inside the tabs is in the
URL under its own name (session key "playground.<name>"), written only where it differs from
its default, so that a copied link draws the same figures; tab 1's edited Q, K and V tables
go as JSON rows (hand_q, hand_k, hand_v)."""

from __future__ import annotations

import streamlit as st

from viz.figures import by_hand
from viz.ui import url_state, url_switches

PLAY_TABS = {"hand": "1 · Attention by hand", "free": "2 · Parameter-free", "symmetric": "3 · Symmetric vs learned",
             "scale": "4 · Why scale", "sizes": "5 · Hyper-parameters", "cost": "6 · Cost",
             "recall": "7 · Recall"}
CHOICES = {  # name: (default, options) for selectboxes, radios and select sliders
    "pf_x": ("sum", ["sum", "tokens"]),
    "sc_keys": (16, [2, 4, 8, 16, 32, 64, 128, 256]),
    "hp_kind": ("encoder", ["encoder", "decoder", "encoder-decoder"]),
    "hp_d": (64, [16, 32, 64, 128, 256, 512, 1024]),
    "hp_m": (256, [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]),
    "hp_pos": ("sinusoidal", ["sinusoidal", "learned", "rope", "none"]),
    "hp_place": ("post", ["post", "pre"]),
    "hp_norm": ("layernorm", ["layernorm", "rmsnorm"]),
    "hp_act": ("relu", ["relu", "gelu", "swiglu"]),
    "cost_n": (512, [128, 256, 512, 1024]),
    "cost_d": (512, [128, 256, 512, 1024]),
}
# name: (default, lowest, highest); rc_*: tab 7's sequence (pairs, seed) and the layer shown
# (the recall models have two); its query (rc_query, 0 .. pairs - 1) is seeded after them
NUMBERS = {"sc_seed": (0, 0, 10_000), "hp_L": (2, 1, 12), "rc_pairs": (4, 2, 16), "rc_seed": (0, 0, 10_000),
           "rc_layer": (1, 0, 1)}
SWITCHES = {"hand_scaled": True, "pf_scale": False, "hp_bias": True, "hp_built": False}
HAND = {"Q": "hand_q", "K": "hand_k", "V": "hand_v"}  # tab 1's tables: JSON rows, when edited

FIELDS = ("model", "text", "tab", "layer", "head", "sym_stack", *CHOICES, *NUMBERS, "hp_H", "rc_query", *SWITCHES,
          *HAND.values())


def seeded_keys(state: url_state.PageState, trace, model_name: str = "") -> dict:
    """Every tab control's session key, its value first set from the URL (or this session, or
    its default); sym_stack, layer and head only when there is a trace to choose them in."""
    ss = st.session_state
    keys = {name: url_switches.option(state, name, default, options) for name, (default, options) in CHOICES.items()}
    keys.update({name: url_state.int_from_url(state, name, *spec) for name, spec in NUMBERS.items()})
    keys.update({name: url_switches.flag(state, name, default) for name, default in SWITCHES.items()})
    keys["hp_H"] = url_switches.option(state, "hp_H", 4, by_hand.heads_options(ss[keys["hp_d"]]))
    keys["rc_query"] = url_state.int_from_url(state, "rc_query", 0, 0, ss[keys["rc_pairs"]] - 1,
                                              of=f"a sequence of {ss[keys['rc_pairs']]} queries")
    if trace is not None:
        stacks = trace.stacks()
        keys["sym_stack"] = url_switches.option(state, "sym_stack", stacks[0], stacks)
        # tab 3's layer and head, checked here whether or not tab 3 is open (only the open tab
        # runs), so a URL's bad value gets its message and the URL keeps a valid one
        stack = ss[keys["sym_stack"]]
        of = f"{model_name}'s {stack} self-attention"
        keys["layer"] = url_state.int_from_url(state, "layer", 0, 0, trace.layers(stack) - 1, of=of)
        keys["head"] = url_state.int_from_url(state, "head", 0, 0, trace.n_heads(stack) - 1, of=of)
    return keys


def hand_tables(state: url_state.PageState) -> dict:
    """Tab 1's Q, K and V to edit: the notes' example, or the tables of the URL (or of this
    session, coming back to the page). The editors start again from them (a new version of
    their keys) only when the URL brings tables."""
    ss = st.session_state
    example = by_hand.help_me_example()
    ver = ss.setdefault("playground.hand_ver", 0)
    fresh = f"playground.Q.v{ver}" not in ss  # the editors were not on the page's last run
    given = state.external and any(f in state.qp for f in HAND.values())
    if "playground.hand_base" in ss and not (fresh or given):
        return ss["playground.hand_base"]
    reset = ss.pop("playground.hand_reset", False)
    base = {}
    for name, field in HAND.items():
        raw = None if reset else state.qp.get(field, state.shared.get(field))
        base[name] = example[name]
        if raw:
            try:
                base[name] = by_hand.frame_from_url(raw)
            except ValueError as exc:
                state.overridden(field, raw, None, str(exc), used_text=f"the notes' {name}")
    ss["playground.hand_base"] = base
    if given:
        ss["playground.hand_ver"] = ver + 1
    return base



def url_values(keys: dict, trace, edited: dict, built: bool) -> dict:
    """What the tabs write to the URL: each control only where it differs from its default,
    the edited tables only where they differ from the notes' example, hp_built while the
    built model is shown."""
    ss = st.session_state
    example = by_hand.help_me_example()
    defaults = {**{name: spec[0] for name, spec in CHOICES.items()}, **{name: spec[0] for name, spec in NUMBERS.items()}}
    in_tabs = {name: url_switches.changed(ss[keys[name]], default) for name, default in defaults.items()}
    in_tabs.update({name: url_switches.flag_url(ss[keys[name]], default) for name, default in SWITCHES.items()})
    in_tabs["hp_H"] = url_switches.changed(ss[keys["hp_H"]], 4)
    in_tabs["rc_query"] = url_switches.changed(ss[keys["rc_query"]], 0)
    in_tabs["hp_built"] = url_switches.flag_url(built)
    if trace is not None:
        in_tabs["sym_stack"] = url_switches.changed(ss[keys["sym_stack"]], trace.stacks()[0])
    for name, field in HAND.items():
        in_tabs[field] = url_switches.changed(by_hand.frame_to_url(edited[name]), by_hand.frame_to_url(example[name]))
    return in_tabs
