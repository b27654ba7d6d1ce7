"""Text as the app takes it in and gives it back: typed text cleaned for the models, values
cut to fit a URL, and URL values quoted safely for a message. Pure Python (no Streamlit)."""

from __future__ import annotations

import bisect
import html
import itertools
import re
import string
import urllib.parse
from typing import Tuple

# A guard against pathological pastes only, far above any model's context (8,192 tokens are
# ~40,000 characters of English): the limit that binds is the model's context, in tokens,
# and the page says how many tokens it read.
MAX_CHARS = 200_000


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


URL_VALUE_BYTES = 32_000  # per value, percent-encoded; the server refuses (HTTP 400) URLs of ~100 kB
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "_.-~")  # what urllib.parse.quote leaves as is


def url_text(value: str) -> str:
    """A value as the URL keeps it: at most its first MAX_CHARS characters, and no
    more than URL_VALUE_BYTES once percent-encoded, so that a reload or a shared link of a page
    holding pasted text still opens."""
    value = value[:MAX_CHARS]
    if len(value) * 12 <= URL_VALUE_BYTES:  # fits whatever the characters (at most 12 bytes each)
        return value
    if len(urllib.parse.quote(value, safe="")) <= URL_VALUE_BYTES:  # one call (pages call this every run)
        return value
    # the longest prefix that fits: a character quotes to itself if unreserved, else %XX per UTF-8 byte
    sizes = itertools.accumulate(1 if ch in _UNRESERVED else 3 * len(ch.encode("utf-8")) for ch in value)
    return value[:bisect.bisect_right(list(sizes), URL_VALUE_BYTES)]


def url_value(raw, limit: int = 40) -> str:
    """A value from the URL, quoted (repr) for a message. Anything but plain words and numbers
    is shown as a Markdown code span, so an image, link, web address, directive or LaTeX in
    it reads as the literal text it is and never loads or links anything."""
    text = repr(str(raw)[:limit])
    if re.fullmatch(r"(?:[^\W_]|[\s'.+-])*", text) and "www." not in text.lower():
        return text
    return "`" + text.replace("`", "ˋ") + "`"


def token_text(tok: str) -> str:
    """A token as the app shows it: a newline as \\n, and a blank token (spaces) as one visible
    space symbol ␣ per character, so ' ' is seen and told apart from '  '."""
    tok = tok.replace("\n", "\\n")
    return tok if tok.strip() else "␣" * max(1, len(tok))


def html_text(text: str) -> str:
    """Text where it meets HTML (plotly's labels, hover and legends read HTML tags; an HTML
    block): markup escaped, once. The one place the app escapes text for HTML: a token such as
    '<unk>' or '<b>' then reads as typed, and a label passed through it twice would read '&lt;'."""
    return html.escape(str(text), quote=False)


def _md_code(tok: str) -> str:
    """A token for a Markdown code span (the token chips)."""
    return token_text(tok.replace("`", "ˋ"))
