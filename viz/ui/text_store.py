"""Texts too long for a URL, kept on this server's disk so that a reload, the Back button or a
shared link brings the whole text back: the URL keeps the text's first URL_VALUE_BYTES
(viz.figures.text.url_text) and a key, the text's SHA-256 (hex, KEY_CHARS characters), under which
the whole text is stored here.

    key = put(text)          # stored (or touched, if already there); the key for the URL
    get(key)                 # the text, or None when this server does not hold it

The store is bounded: at most MAX_ITEMS texts and MAX_BYTES bytes, the least recently used
(written or read) removed first. Its folder is $ATTENTION_LAB_TEXT_STORE, else
~/.cache/attention-lab/texts. A text read back is checked against its key (a damaged or
edited file is not returned). No Streamlit here.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from typing import Optional

KEY_CHARS = 32  # 128 bits of SHA-256: a key names one text
MAX_ITEMS = 200
MAX_BYTES = 64 * 1024 * 1024
_KEY = re.compile(rf"[0-9a-f]{{{KEY_CHARS}}}")
_LOCK = threading.Lock()


def folder() -> Path:
    return Path(os.environ.get("ATTENTION_LAB_TEXT_STORE") or Path.home() / ".cache" / "attention-lab" / "texts")


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_CHARS]


def valid_key(key) -> bool:
    return isinstance(key, str) and bool(_KEY.fullmatch(key))


def put(text: str) -> Optional[str]:
    """Store `text` (or mark it used again) and return its key; None when the disk refuses
    (the caller then says the text is not kept)."""
    key = key_of(text)
    path = folder() / f"{key}.txt"
    try:
        with _LOCK:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                os.utime(path)
            else:
                tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                with open(tmp, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
                os.replace(tmp, path)
                _bound(path.parent, keep=path)
    except OSError:
        return None
    return key


def get(key) -> Optional[str]:
    """The text stored under `key`, or None (not a key, not on this server, or not the text
    whose hash it is)."""
    if not valid_key(key):
        return None
    path = folder() / f"{key}.txt"
    try:
        with open(path, encoding="utf-8", newline="") as f:  # newlines as written (\r\n stays)
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    if key_of(text) != key:
        return None
    try:
        os.utime(path)  # used: the last to go
    except OSError:
        pass
    return text


def _bound(where: Path, keep: Path) -> None:
    """Remove the least recently used texts past MAX_ITEMS or MAX_BYTES (never `keep`)."""
    files = []
    for p in where.glob("*.txt"):
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime_ns, st.st_size, p))
    files.sort(key=lambda f: f[0], reverse=True)  # newest first
    count, total = 0, 0
    for _, size, p in files:
        count += 1
        total += size
        if p != keep and (count > MAX_ITEMS or total > MAX_BYTES):
            try:
                p.unlink()
            except OSError:
                pass
