"""Texts too long for a URL, kept by the server so that a reload, the Back button or a shared link
brings the whole text back: the URL keeps the text's first URL_VALUE_BYTES
(viz.figures.text.url_text) and a key, the text's SHA-256 (hex, KEY_CHARS characters), under which
the whole text is stored here.

    key = put(text)          # stored (or touched, if already there); the key for the URL; None if refused
    key = store(text)        # the same, raising StoreError (TooLarge, Unreachable) with a message to show
    get(key)                 # the text, or None when the store does not hold it (or cannot be reached)
    fetch(key)               # the same, raising Unreachable when the store cannot be reached

Where the texts are kept, chosen by one setting, $ATTENTION_LAB_TEXT_STORE:
- unset: a folder on this machine, ~/.cache/attention-lab/texts (every process of this user on
  this machine shares it: replicas on one machine need nothing more);
- a path: that folder (a folder every replica mounts is a store they share);
- `redis://host:port/db`: a Redis server every replica reaches (the `redis` client).

Bounded and expiring, in every kind: at most MAX_ITEMS texts and MAX_BYTES bytes, the least
recently used (written or read) removed first; a text unused for TTL_DAYS days is gone; one text
over MAX_BYTES is refused (TooLarge), never kept. $ATTENTION_LAB_TEXT_STORE_DAYS sets the expiry
and $ATTENTION_LAB_TEXT_STORE_MB the byte bound.

The folder store only ever deletes what it wrote: its texts are `<key>.attention-lab.txt` and its
temporary files `<key>.<pid>.<thread>.attention-lab.tmp` (a write that failed part-way leaves one:
removed once older than TMP_AGE seconds, so another process's write in progress is left alone).
Any other file in the folder is neither read as a text nor removed. Texts kept before the marker
(`<key>.txt`) are still read, never removed. A text read back is checked against its key (a
damaged or edited text is not returned), in every kind. No Streamlit here.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Optional

KEY_CHARS = 32  # 128 bits of SHA-256: a key names one text
MAX_ITEMS = 200


def _setting(name: str, default: float) -> float:
    """A positive number from the environment; the default where it is unset or not one (the
    app must start whatever the setting says)."""
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


MAX_BYTES = int(_setting("ATTENTION_LAB_TEXT_STORE_MB", 64) * 2**20)
TTL_DAYS = _setting("ATTENTION_LAB_TEXT_STORE_DAYS", 30)
TMP_AGE = 600  # seconds: a temporary file older than this is a failed write's
SUFFIX = ".attention-lab.txt"  # the store's own marker: the only texts it removes
TMP_SUFFIX = ".attention-lab.tmp"
REDIS_PREFIX = "attention-lab:text:"
REDIS_USED = "attention-lab:texts-used"  # sorted set: key -> last use (seconds)
REDIS_SIZES = "attention-lab:texts-bytes"  # hash: key -> bytes
REDIS_TIMEOUT = 2.0  # seconds to connect or answer: an unreachable store must not hang a page
STORE_ENV = "ATTENTION_LAB_TEXT_STORE"
_KEY = re.compile(rf"[0-9a-f]{{{KEY_CHARS}}}")
_TEXT = re.compile(rf"([0-9a-f]{{{KEY_CHARS}}}){re.escape(SUFFIX)}")
_TMP = re.compile(rf"[0-9a-f]{{{KEY_CHARS}}}\.\d+\.\d+{re.escape(TMP_SUFFIX)}")
_LOCK = threading.Lock()


class StoreError(Exception):
    """The store refused a text; str(e) says why, in words for the page."""


class TooLarge(StoreError):
    pass


class Unreachable(StoreError):
    pass


def setting() -> str:
    return os.environ.get(STORE_ENV, "").strip()


def is_redis() -> bool:
    return setting().startswith(("redis://", "rediss://", "unix://"))


def where() -> str:
    """Where the texts are kept, for messages and the README (a Redis URL without its password)."""
    if is_redis():
        return "Redis at " + re.sub(r"//[^@/]*@", "//", setting())
    return str(folder())


def folder() -> Path:
    return Path(setting() if setting() and not is_redis() else Path.home() / ".cache" / "attention-lab" / "texts")


def ttl_seconds() -> float:
    return TTL_DAYS * 86400


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_CHARS]


def valid_key(key) -> bool:
    return isinstance(key, str) and bool(_KEY.fullmatch(key))


def put(text: str) -> Optional[str]:
    """Store `text` (or mark it used again) and return its key; None when the store refuses
    (the caller then says the text is not kept; `store` says why)."""
    try:
        return store(text)
    except StoreError:
        return None


def store(text: str) -> str:
    """Store `text` (or mark it used again) and return its key; raises TooLarge (one text over
    MAX_BYTES) or Unreachable (the disk or the Redis server refused), with a message to show."""
    data = text.encode("utf-8")
    if len(data) > MAX_BYTES:
        raise TooLarge(f"the text is {len(data):,} bytes and the text store keeps at most {MAX_BYTES:,} bytes "
                       "in all, so it is not kept")
    key = key_of(text)
    if is_redis():
        _redis_put(key, data)
    else:
        _folder_put(key, text)
    return key


def get(key) -> Optional[str]:
    """The text stored under `key`, or None (not a key, not held, expired, not the text whose
    hash it is, or the store cannot be reached: `fetch` tells that apart)."""
    try:
        return fetch(key)
    except Unreachable:
        return None


def fetch(key) -> Optional[str]:
    """The text stored under `key`, or None (not a key, not held, expired, or not the text whose
    hash it is); raises Unreachable when the store cannot be asked."""
    if not valid_key(key):
        return None
    text = _redis_get(key) if is_redis() else _folder_get(key)
    if text is None or key_of(text) != key:
        return None
    return text


# ------------------------------------------------------------------ a folder (the default)
def _folder_put(key: str, text: str) -> None:
    where_ = folder()
    path = where_ / f"{key}{SUFFIX}"
    try:
        with _LOCK:
            where_.mkdir(parents=True, exist_ok=True)
            if path.exists():
                os.utime(path)
            else:
                tmp = where_ / f"{key}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
                try:
                    with open(tmp, "w", encoding="utf-8", newline="") as f:
                        f.write(text)
                    os.replace(tmp, path)
                except OSError:
                    _unlink(tmp)  # a failed write leaves nothing behind
                    raise
            _bound(where_, keep=path)
    except OSError as exc:
        raise Unreachable(f"the text store ({where()}) could not write it: {exc.strerror or exc}") from exc


def _folder_get(key: str) -> Optional[str]:
    where_ = folder()
    for path in (where_ / f"{key}{SUFFIX}", where_ / f"{key}.txt"):  # .txt: kept before the marker, read only
        try:
            with open(path, encoding="utf-8", newline="") as f:  # newlines as written (\r\n stays)
                text = f.read()
            age = time.time() - path.stat().st_mtime
        except (OSError, UnicodeDecodeError):
            continue
        if age > ttl_seconds():
            return None  # expired: removed at the next write
        try:
            os.utime(path)  # used: the last to go
        except OSError:
            pass
        return text
    if not where_.is_dir() and where_.exists():
        raise Unreachable(f"the text store ({where()}) is not a folder")
    return None


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def _bound(where_: Path, keep: Path) -> None:
    """Remove the store's own texts past MAX_ITEMS or MAX_BYTES (least recently used first) or
    unused for TTL_DAYS, and its temporary files older than TMP_AGE (never `keep`, and never a
    file without the store's marker)."""
    now = time.time()
    files = []
    for p in where_.iterdir():
        name = p.name
        ours_text, ours_tmp = bool(_TEXT.fullmatch(name)), bool(_TMP.fullmatch(name))
        if not (ours_text or ours_tmp):
            continue
        try:
            st = p.stat()
        except OSError:
            continue
        if ours_tmp:
            if now - st.st_mtime > TMP_AGE:
                _unlink(p)
            continue
        if p != keep and now - st.st_mtime > ttl_seconds():
            _unlink(p)
            continue
        files.append((st.st_mtime_ns, st.st_size, p))
    files.sort(key=lambda f: f[0], reverse=True)  # newest first
    count, total = 0, 0
    for _, size, p in files:
        count += 1
        total += size
        if p != keep and (count > MAX_ITEMS or total > MAX_BYTES):
            _unlink(p)


# ------------------------------------------------------------------ Redis (replicas on several machines)
_clients: dict = {}


def _client():
    url = setting()
    with _LOCK:
        client = _clients.get(url)
        if client is None:
            try:
                import redis
            except ImportError as exc:
                raise Unreachable(f"the text store is set to {where()}, but the redis client is not installed "
                                  "(pip install redis)") from exc
            client = redis.Redis.from_url(url, socket_connect_timeout=REDIS_TIMEOUT, socket_timeout=REDIS_TIMEOUT)
            _clients[url] = client
    return client


def _redis_call(fn):
    client = _client()  # Unreachable without the redis client
    import redis

    try:
        return fn(client)
    except redis.RedisError as exc:
        raise Unreachable(f"the text store ({where()}) cannot be reached: {exc}") from exc


def _redis_put(key: str, data: bytes) -> None:
    ttl = max(1, int(ttl_seconds()))

    def put_(r):
        now = time.time()
        p = r.pipeline()
        p.set(REDIS_PREFIX + key, data, ex=ttl)
        p.zadd(REDIS_USED, {key: now})
        p.hset(REDIS_SIZES, key, len(data))
        p.execute()
        _redis_bound(r, keep=key, now=now)

    _redis_call(put_)


def _redis_get(key: str) -> Optional[str]:
    def get_(r):
        data = r.get(REDIS_PREFIX + key)
        if data is None:
            return None
        p = r.pipeline()
        p.expire(REDIS_PREFIX + key, max(1, int(ttl_seconds())))  # used: it lives TTL_DAYS from now
        p.zadd(REDIS_USED, {key: time.time()})
        p.execute()
        return data

    data = _redis_call(get_)
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _redis_bound(r, keep: str, now: float) -> None:
    """The same bounds as the folder's, over the keys this store wrote (its own prefix): expired
    keys leave the index, then the least recently used go past MAX_ITEMS or MAX_BYTES."""
    stale = [k.decode() for k in r.zrangebyscore(REDIS_USED, 0, now - ttl_seconds())]
    entries = [(k.decode(), score) for k, score in r.zrevrange(REDIS_USED, 0, -1, withscores=True)]  # newest first
    sizes = {k.decode(): int(v) for k, v in r.hgetall(REDIS_SIZES).items()}
    drop = set(stale) - {keep}
    count, total = 0, 0
    for k, _ in entries:
        if k in drop:
            continue
        count += 1
        total += sizes.get(k, 0)
        if k != keep and (count > MAX_ITEMS or total > MAX_BYTES):
            drop.add(k)
    drop |= set(sizes) - {k for k, _ in entries} - {keep}  # sizes left by a write that failed part-way
    if drop:
        p = r.pipeline()
        p.delete(*(REDIS_PREFIX + k for k in drop))
        p.zrem(REDIS_USED, *drop)
        p.hdel(REDIS_SIZES, *drop)
        p.execute()
