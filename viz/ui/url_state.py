"""URL state: every page's widgets seeded from the URL and written back to it, so a view can
be shared; where the page does not show the URL's value, a message that says which field,
the value given, the value shown and why.

`PageState` is the page's side of it; `int_from_url` seeds a whole-number widget clamped to a
range. viz/ui/url_switches.py adds switches, tabs and options on top.

What a page remembers across model changes goes through the same calls: every choice is
read back as its own type (`as_int`: a widget whose options changed with the model can hand
back the label the browser still shows, a str), clamped or reset with a note when it no
longer fits the new model, and written back to the session (`PageState.keep`) so that the
browser's widget shows the value the page states, also after the widget was not drawn for a
run (another model's page has other controls) or changed kind. On a model switch
(`PageState.switched`, set by the model picker) the typed text is written back too.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional, Sequence

import streamlit as st

from viz.ui import text_store
from viz.figures.text import MAX_CHARS, url_text, url_value

TEXT_FIELDS = ("text", "text2", "target")  # typed text: a longer URL value is cut to MAX_CHARS
KEY_SUFFIX = "_key"  # field + KEY_SUFFIX: the key of a value too long for the URL, kept whole on this server


def said(value) -> str:
    """A value as a message names it: a number or a switch as it reads, a list as the URL spells
    it (0,2,3; none when empty), nothing as none, an empty text as empty, any other text quoted
    (url_value), a long text with its length."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, str) and value == "":
        return "empty"
    if isinstance(value, int) or re.fullmatch(r"-?\d{1,12}", str(value)):
        return str(value)
    text = str(value)
    return url_value(text) + (f"… ({len(text):,} characters)" if len(text) > 40 else "")


class PageState:
    """Widget state seeded from the URL and written back to it, so every view can be shared.

    A value comes from the URL when the page is opened with it (or the URL changed since
    the app last wrote it), else from what the user chose on any page this session, else
    the default. Where the page does not show the URL's value (out of range, not valid for
    this model or page, a field the page does not have), `overridden` / `ignored` leave a
    message that names the field, the value given, the value shown and why; show_messages
    shows each once.

    `fields`: every URL field the page reads; the URL's others are ignored, with a message
    (`reads_url=False`: a page that reads none, every field given is named).
    `keys`: a widget's session key where it is not `page.field` (one the page's CSS or tests
    name otherwise).
    """

    def __init__(self, page: str, fields: Sequence[str] = (), keys: Optional[Dict[str, str]] = None,
                 reads_url: bool = True):
        self.page = page
        self.keys = dict(keys or {})
        self.qp = st.query_params.to_dict()
        self.external = self.qp != st.session_state.get("_url_last")
        self.shared: Dict = st.session_state.setdefault("_shared", {})
        self.messages: list = []
        self._said: set = set()
        self.from_url: set = set()  # fields whose value this run took from the URL
        self.extra: Dict = {}  # fields every later publish() adds to the URL (e.g. step_train)
        self.switched = False  # the model picker saw the model change since this page's last run
        if (fields or not reads_url) and self.external:
            for field in self.qp:
                if field not in fields and not (field.endswith(KEY_SUFFIX) and field[:-len(KEY_SUFFIX)] in fields):
                    self.ignored(field, f"this page has no {field} (its URL fields: {', '.join(fields)})" if fields
                                 else "this page keeps nothing in its URL")

    def key(self, field: str) -> str:
        return self.keys.get(field) or f"{self.page}.{field}"

    # -------------------------------------------------------------- what the page says about the URL
    def say(self, message: str) -> None:
        """A message for show_messages, once however often the run reaches it."""
        if message not in self._said:
            self._said.add(message)
            self.messages.append(message)

    def overridden(self, field: str, given, used, why: str, used_text: Optional[str] = None) -> None:
        """The URL's field=given is not what the page shows: it shows `used` (or `used_text`, as
        worded) because `why`."""
        self.say(f"The URL's {field}={said(given)} is replaced by {used_text or said(used)}: {why}.")

    def ignored(self, field: str, why: str) -> None:
        """The URL's `field` has no effect on this page (its value is left out of the URL), because `why`."""
        if field in self.qp:
            self.say(f"The URL's {field}={said(self.qp[field])} is ignored: {why}.")

    def ignored_if_given(self, field: str, why: str) -> None:
        """`ignored`, when the URL is the one the page was opened with (not the app's own)."""
        if self.external:
            self.ignored(field, why)

    # -------------------------------------------------------------- seeding
    def seeded_key(self, field: str, default, parse: Callable = str, valid: Optional[Callable] = None,
                   why=None, instead: Optional[str] = None) -> str:
        """The session-state key of a widget for `field`, its value first set (once, or again
        when the URL changed) from the URL, else from this session's other pages, else
        `default`. A URL value that `parse` or `valid` rejects is replaced, with a message saying
        `why` (a text, or why(raw, error) -> text; by default that it is not valid here) and what
        is used instead (`instead`, as worded, where the value alone would not say it: "the
        model's top-1" for an empty target)."""
        def rejected(raw, value, exc):
            reason = why(raw, exc) if callable(why) else why
            return value, ("it is not valid here" + (f" ({reason})" if reason else ""))

        key = self._seed_from_url(field, default, parse, valid, rejected, instead)
        if field in TEXT_FIELDS:
            self.keep_text(key)
        return key

    def _seed_from_url(self, field: str, default, parse: Callable, valid: Optional[Callable], rejected,
                       instead: Optional[str] = None) -> str:
        """seeded_key's rule; rejected(raw, value, error) -> (the value to use, why) for a URL
        value that parse or valid refuses."""
        key = self.key(field)
        raw = self._whole(field, self.qp.get(field))
        if key not in st.session_state or (self.external and raw is not None):
            value = self.shared.get(field, default)
            if valid is not None and field in self.shared and not (
                    _holds(valid, value) or (isinstance(value, str) and _holds(lambda v: valid(parse(v)), value))):
                value = default  # another page's value (as it wrote it, or as the URL spells it) not taken here
            if raw is not None:
                try:
                    parsed = parse(raw)
                    if valid is not None and not valid(parsed):
                        raise ValueError
                    value = parsed
                    self.from_url.add(field)
                except (ValueError, TypeError) as exc:
                    value, why = rejected(raw, value, exc)
                    self.overridden(field, raw, value, why, used_text=instead)
                if field in TEXT_FIELDS and isinstance(value, str) and len(value) > MAX_CHARS:
                    self.overridden(field, raw, None, f"only the first {MAX_CHARS:,} are used (the models read "
                                    "no more)", used_text=f"its first {MAX_CHARS:,} characters")
                    value = value[:MAX_CHARS]
            st.session_state[key] = value
        return key

    def _whole(self, field: str, raw):
        """The URL's value of `field`, whole: a value too long for the URL comes with a key
        (field_key=) under which publish kept it on this server (viz.ui.text_store); where this
        server does not hold it, the part the URL carries, with a message asking for the rest."""
        stored = self.qp.get(field + KEY_SUFFIX)
        if stored is None:
            return raw
        part = "" if raw is None else str(raw)
        try:
            whole = text_store.fetch(stored)
        except text_store.Unreachable as exc:
            self.say(f"This link's {field} was too long for a web address and is kept in the text store under a "
                     f"key, but {exc}. The box shows only the part the address carries: its first {len(part):,} "
                     "characters. Reload the page later to read all of it, or paste the whole text into the box.")
            return raw
        if whole is not None and whole.startswith(part):
            return whole
        shown = (f"its first {len(part):,} characters, the part the address carries" if part
                 else "the page's own example (the address carries none of it)")
        if not text_store.valid_key(stored):
            self.say(f"The URL's {field}{KEY_SUFFIX}={said(stored)} is ignored: it is not a key this app makes (a "
                     f"stored text's key is {text_store.KEY_CHARS} hexadecimal characters). The box shows {shown}.")
        elif whole is not None:
            self.say(f"The URL's {field}{KEY_SUFFIX}={said(stored)} holds a different text from the one the link "
                     f"starts with, so it is ignored. The box shows {shown}.")
        else:
            self.say(f"This link's {field} was too long for a web address, so the server that made the link kept it "
                     f"whole under the key {url_value(stored, 48)}; this server does not hold that key (the link "
                     f"comes from another server, or is older than the {text_store.MAX_ITEMS} texts kept). The box "
                     f"shows {shown}. Paste the whole text into the box to read all of it.")
        return raw

    def keep(self, key: str, value=None) -> None:
        """Write the widget `key`'s value (the one it holds, or `value`) back to the session
        before the widget is drawn, so the browser's widget shows what the page states (a widget
        the last run did not draw, or of another kind, would otherwise come back at its own
        default while the page reads the remembered value)."""
        if value is None:
            value = st.session_state.get(key)
        if value is not None:
            st.session_state[key] = value

    def keep_text(self, key: str) -> None:
        """The text box's `keep`, on a model switch only (the box may change kind with the
        model; writing it on every run would undo typing the browser has not sent yet)."""
        if self.switched:
            self.keep(key)

    def switch_seen(self, model_name: str) -> bool:
        """Note the page's model; True (and `switched`) when it differs from the last run's."""
        seen = st.session_state.get(f"_model_seen.{self.page}")
        st.session_state[f"_model_seen.{self.page}"] = model_name
        self.switched = seen is not None and seen != model_name
        return self.switched

    def set(self, field: str, value) -> None:
        st.session_state[self.key(field)] = value

    def get(self, field: str, default=None):
        return st.session_state.get(self.key(field), default)

    def publish(self, **values) -> None:
        values = {**values, **self.extra}
        for k, v in values.items():
            if v is None:  # left out of the URL: the next page takes its own default, not None
                self.shared.pop(k, None)
            else:
                self.shared[k] = v
        # an emptied sentence stays in the URL (text=), so a reload or a shared link shows the
        # same empty box and its message rather than the default sentence; other empty
        # fields (an optional target) are left out
        params = {}
        for k, v in values.items():
            if v is None or (v == "" and k != "text"):
                continue
            v = str(v)
            params[k] = url_text(v)
            if params[k] != v:  # too long for the URL: kept whole here, its key in the URL
                try:
                    params[k + KEY_SUFFIX] = text_store.store(v[:MAX_CHARS])
                except text_store.StoreError as exc:
                    st.warning(f"The {k} ({len(v):,} characters) is too long for the web address, which keeps its "
                               f"first {len(params[k]):,}, and {exc}: a reload, Back or a shared link will bring "
                               f"back only those {len(params[k]):,} characters. The page itself works on the "
                               "whole text.")
        if st.query_params.to_dict() != params:
            st.query_params.from_dict(params)
        st.session_state["_url_last"] = params

    def show_messages(self) -> None:
        """Show the pending messages once (a later call shows only newer ones)."""
        for m in self.messages:
            st.warning(m)
        self.messages.clear()

    def end_here(self, **values) -> None:
        """End the page's run early (no trace, nothing to draw): the URL still says what the
        page shows (publish), the URL's messages are still shown, then the run stops."""
        self.publish(**values)
        self.show_messages()
        st.stop()


def _holds(valid: Callable, value) -> bool:
    try:
        return bool(valid(value))
    except (ValueError, TypeError):
        return False


def as_int(value) -> Optional[int]:
    """A remembered whole-number choice as an int: an int, a numeral, or a selectbox label that
    starts with its number ("3: 'cat'", what the browser sends back for an option of a list
    that changed with the model); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    m = re.match(r"\s*(-?\d{1,12})(?:\s*$|:)", str(value)) if isinstance(value, str) else None
    return int(m.group(1)) if m else None


def int_from_url(state: PageState, field: str, default: int, lo: int, hi: int, of: str = "") -> str:
    """Seed an integer widget from the URL, clamped to [lo, hi] with a notice; `of` names what
    the range belongs to ("toy-translate's encoder self-attention"). The value is written back
    every run (PageState.keep): the browser's widget always shows the number the page uses."""
    key = state._seed_from_url(field, default, lambda raw: int(str(raw).strip()), None, lambda raw, value, exc: (
        default, f"{field}={url_value(raw)} is not a whole number"))
    value = st.session_state[key]
    number = as_int(value)
    if number is None or number < lo or number > hi:
        fixed = min(max(default if number is None else number, lo), hi)
        why = (f"{field} {number} is out of range ({lo}–{hi}{' in ' + of if of else ''})" if number is not None
               else f"{field} {said(value)} is not a whole number")
        if field in state.from_url:
            state.overridden(field, value, fixed, why)
        else:
            state.say(f"{why}; showing {field} {fixed}.")
        number = fixed
    state.keep(key, number)
    return key
