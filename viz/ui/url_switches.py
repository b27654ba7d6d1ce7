"""On/off switches and tabs kept in the URL (with PageState), so that a copied link
reproduces the figure: a switch is written only when it differs from its default
(`mean=1`), a tab by a short name (`tab=model`)."""

from __future__ import annotations

from typing import Dict

import streamlit as st

from viz.ui.url_state import PageState

TRUE, FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def parse_bool(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(raw)


def parse_ints(raw) -> list:
    """'0,2,3' (or 'none') as [0, 2, 3]; a list passes through."""
    if isinstance(raw, list):
        return [int(v) for v in raw]
    text = str(raw).strip()
    return [] if text in ("", "none") else sorted({int(v) for v in text.split(",")})


def flag(state: PageState, field: str, default: bool = False) -> str:
    """Seed the switch `page.field` from the URL (or this session's choice, or `default`);
    returns its session key for st.toggle."""
    key = state.seeded_key(field, default, parse=parse_bool, why="a switch is 1 or 0 (true/false, on/off, yes/no)")
    value = st.session_state[key]
    if not isinstance(value, bool):  # a value shared by another page, as the URL spells it
        try:
            st.session_state[key] = parse_bool(value) if value is not None else default
        except ValueError:
            st.session_state[key] = default
    state.keep(key)
    return key


def heads(state: PageState, field: str, n_heads: int, why: str, first: int = 4) -> str:
    """A list of heads kept in the URL (`heads=0,2,3`, or `none`), each in 0..n_heads-1; the
    first `first` heads by default, and again when the remembered list does not fit the model."""
    default = list(range(min(n_heads, first)))
    key = state.seeded_key(field, default, parse=parse_ints, valid=lambda v: all(0 <= h < n_heads for h in v),
                           why=why)
    if isinstance(st.session_state[key], str):  # as another page published it
        try:
            st.session_state[key] = parse_ints(st.session_state[key])
        except ValueError:
            pass
    if not isinstance(st.session_state[key], list) or any(not 0 <= h < n_heads for h in st.session_state[key]):
        st.session_state[key] = default
    return key


def flag_url(value: bool, default: bool = False):
    """The URL value of a switch: None (left out) at its default."""
    return None if bool(value) == default else ("1" if value else "0")


def tab(state: PageState, field: str, names: Dict[str, str]) -> str:
    """Seed the tabs `page.field` (short URL name -> tab label) from the URL; returns the key
    for st.tabs(..., key=key, on_change="rerun")."""
    labels = list(names.values())
    slugs = {v: k for k, v in names.items()}
    key = state.key(field)
    raw = state.qp.get(field)
    if key not in st.session_state or (state.external and raw is not None):
        if raw is not None and raw in names:
            st.session_state[key] = names[raw]
        elif raw is not None:
            first = next(iter(names))
            state.overridden(field, raw, first, f"it is not a tab here (tabs: {', '.join(names)})",
                             used_text=f"{first} (“{labels[0]}”)")
            st.session_state[key] = labels[0]
        elif key not in st.session_state:
            st.session_state[key] = labels[0]
    if st.session_state.get(key) not in slugs:
        st.session_state[key] = labels[0]
    return key


def tab_url(state: PageState, field: str, names: Dict[str, str]):
    """The open tab's short name for the URL (None for the first tab)."""
    label = st.session_state.get(state.key(field))
    slug = next((k for k, v in names.items() if v == label), None)
    return None if slug == next(iter(names)) else slug


def option(state: PageState, field: str, default, options) -> str:
    """Seed `page.field`, a widget over `options` (a selectbox, radio or select slider; numbers
    or names), from the URL; a value not among them is replaced by `default`, with a message
    listing them. Returns its session key."""
    options = list(options)
    numbers = all(isinstance(o, int) and not isinstance(o, bool) for o in options)
    key = state.seeded_key(field, default, parse=(lambda raw: int(str(raw).strip())) if numbers else str,
                     valid=lambda v: v in options, why=f"{field} is one of {', '.join(map(str, options))}")
    if st.session_state[key] not in options:  # e.g. a shared value as the URL spells it
        value = st.session_state[key]
        try:
            value = int(str(value).strip()) if numbers else value
        except ValueError:
            pass
        st.session_state[key] = value if value in options else default
    state.keep(key)
    return key


def changed(value, default):
    """The URL value of a control: None (left out) at its default."""
    return None if value == default else value
