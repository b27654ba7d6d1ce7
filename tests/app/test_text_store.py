"""Texts too long for a URL are kept (issue 41): the bounded store (viz.ui.text_store) and the
pages' URL state, which puts the key in the URL and reads the whole text back through it, or
says that this server does not hold it."""

import pytest

from conftest import assert_no_exception
from viz.ui import text_store
from viz.figures.text import url_text

LONG = "".join(f"Sentence {i} of a long pasted document, with words. " for i in range(1000))[:50_000]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_TEXT_STORE", str(tmp_path / "texts"))
    return tmp_path / "texts"


def test_put_and_get_round_trip_and_a_damaged_file_is_not_returned(store):
    key = text_store.put(LONG)
    assert text_store.valid_key(key) and text_store.get(key) == LONG
    assert text_store.put(LONG) == key  # the same text, the same key
    assert text_store.get("0" * text_store.KEY_CHARS) is None and text_store.get("../etc/passwd") is None
    (store / f"{key}{text_store.SUFFIX}").write_text(LONG + "edited", encoding="utf-8")
    assert text_store.get(key) is None


def test_the_store_is_bounded_least_recently_used_first(store, monkeypatch):
    import os
    import time

    monkeypatch.setattr(text_store, "MAX_ITEMS", 3)
    keys = []
    for i in range(3):
        keys.append(text_store.put(f"text {i}"))
        p = store / f"{keys[-1]}{text_store.SUFFIX}"
        os.utime(p, ns=(time.time_ns() - (10 - i) * 10**9,) * 2)  # distinct ages, the first the oldest
    assert text_store.get(keys[0]) == "text 0"  # read: now the most recently used
    text_store.put("text 3")
    assert text_store.get(keys[1]) is None  # the least recently used went
    assert text_store.get(keys[0]) == "text 0" and text_store.get(keys[2]) == "text 2"
    assert len(list(store.glob("*" + text_store.SUFFIX))) == 3
    monkeypatch.setattr(text_store, "MAX_ITEMS", 100)
    monkeypatch.setattr(text_store, "MAX_BYTES", 2 * len(LONG.encode()))
    for i in range(3):
        text_store.put(LONG + str(i))
    assert sum(p.stat().st_size for p in store.glob("*" + text_store.SUFFIX)) <= 2 * len(LONG.encode())


def test_a_text_too_long_for_the_url_comes_back_whole_through_its_key(store, app_test):
    assert len(url_text(LONG)) < len(LONG)  # the URL alone would cut it
    at = app_test("explore", model="toy-translate")
    at.run()
    at.text_area(key="explore.text").input(LONG).run()
    assert_no_exception(at)
    qp = dict(at.query_params)
    assert qp["text"] == url_text(LONG) and len(qp["text"]) < len(LONG)
    assert text_store.get(qp["text_key"]) == LONG
    again = app_test("explore", **qp)  # a reload, Back, or the link in a new tab: a new session
    again.run()
    assert_no_exception(again)
    assert again.text_area(key="explore.text").value == LONG
    assert not [w.value for w in again.warning if "text_key" in w.value or "not hold" in w.value]


def test_a_link_whose_text_this_server_does_not_hold_says_so(store, app_test):
    qp = {"model": "toy-translate", "text": url_text(LONG), "text_key": text_store.key_of(LONG)}
    at = app_test("explore", **qp)
    at.run()
    assert_no_exception(at)
    warns = " ".join(w.value for w in at.warning)
    assert "does not hold that key" in warns and f"first {len(url_text(LONG)):,} characters" in warns, warns
    assert at.text_area(key="explore.text").value == url_text(LONG)


# ------------------------------------------------------------------ bounds, markers, expiry (issue 53)
def test_one_text_over_the_byte_budget_is_refused_with_a_message(store, monkeypatch):
    monkeypatch.setattr(text_store, "MAX_BYTES", 1000)
    with pytest.raises(text_store.TooLarge, match=r"1,000 bytes"):
        text_store.store("x" * 1001)
    assert text_store.put("x" * 1001) is None
    assert not store.exists() or not list(store.iterdir())  # nothing kept, not even part of it
    assert text_store.get(text_store.put("x" * 1000)) == "x" * 1000  # at the budget: kept


def test_only_the_stores_own_files_are_removed_and_failed_writes_are_cleaned_up(store, monkeypatch):
    import os
    import time

    store.mkdir(parents=True)
    old = time.time_ns() - 3600 * 10**9
    foreign = [store / "notes.txt", store / ("a" * text_store.KEY_CHARS + ".txt"), store / "x.tmp"]
    for p in foreign:
        p.write_text("someone else's", encoding="utf-8")
        os.utime(p, ns=(old, old))
    stale_tmp = store / f"{'b' * text_store.KEY_CHARS}.123.456{text_store.TMP_SUFFIX}"  # a write that died an hour ago
    fresh_tmp = store / f"{'c' * text_store.KEY_CHARS}.123.457{text_store.TMP_SUFFIX}"  # another process's, in progress
    for p in (stale_tmp, fresh_tmp):
        p.write_text("part of a text", encoding="utf-8")
    os.utime(stale_tmp, ns=(old, old))
    monkeypatch.setattr(text_store, "MAX_ITEMS", 1)
    first = text_store.put("text 1")
    os.utime(store / f"{first}{text_store.SUFFIX}", ns=(old, old))
    second = text_store.put("text 2")  # past MAX_ITEMS: the store's own least recently used goes
    assert text_store.get(first) is None and text_store.get(second) == "text 2"
    assert all(p.exists() for p in foreign), "a file the store did not write was removed"
    assert not stale_tmp.exists() and fresh_tmp.exists()

    def failing_replace(src, dst):  # the disk fails between the write and the rename
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(text_store.os, "replace", failing_replace)
    with pytest.raises(text_store.Unreachable, match="No space left"):
        text_store.store("text 3")
    assert not list(store.glob(f"{text_store.key_of('text 3')}*")), "a failed write left a file"


def test_texts_expire_after_the_configured_days(store, monkeypatch):
    import os
    import time

    monkeypatch.setattr(text_store, "TTL_DAYS", 2)
    key = text_store.put(LONG)
    path = store / f"{key}{text_store.SUFFIX}"
    day = 86400 * 10**9
    os.utime(path, ns=(time.time_ns() - day,) * 2)
    assert text_store.get(key) == LONG  # a day unused: still kept, and now used again
    os.utime(path, ns=(time.time_ns() - 3 * day,) * 2)
    assert text_store.get(key) is None  # three days unused: expired
    text_store.put("another text")  # the next write removes it
    assert not path.exists()


def test_a_text_kept_before_the_marker_is_still_read(store):
    store.mkdir(parents=True)
    (store / f"{text_store.key_of(LONG)}.txt").write_text(LONG, encoding="utf-8")
    assert text_store.get(text_store.key_of(LONG)) == LONG


# ------------------------------------------------------------------ Redis, shared by replicas (issue 56)
@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A redis-server of the test's own on a free 127.0.0.1 port, stopped by its pid."""
    import shutil
    import subprocess
    import time

    from bench.app_server import free_port

    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("no redis-server: `make test` (scripts/setup.sh --test) installs Debian's redis-server",
                    pytrace=False)
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.RedisError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def test_redis_store_round_trip_bounds_and_expiry(redis_server, monkeypatch):
    import redis

    monkeypatch.setenv("ATTENTION_LAB_TEXT_STORE", redis_server)
    r = redis.Redis.from_url(redis_server)
    r.flushdb()
    key = text_store.store(LONG)
    assert text_store.fetch(key) == LONG and text_store.where().startswith("Redis at redis://127.0.0.1:")
    assert 0 < r.ttl(text_store.REDIS_PREFIX + key) <= text_store.ttl_seconds()  # it expires
    r.set(text_store.REDIS_PREFIX + key, (LONG + "edited").encode())
    assert text_store.get(key) is None  # not the text whose hash it is
    r.set("someone-else", b"x")
    monkeypatch.setattr(text_store, "MAX_ITEMS", 2)
    keys = [text_store.store(f"text {i}") for i in range(4)]
    held = [k for k in keys if text_store.get(k) is not None]
    assert held == keys[2:]  # the least recently used went
    assert r.get("someone-else") == b"x"  # a key the store did not write stays
    monkeypatch.setattr(text_store, "MAX_BYTES", 10)
    with pytest.raises(text_store.TooLarge):
        text_store.store("a text of more than ten bytes")


def test_an_unreachable_store_is_said_and_short_texts_still_work(monkeypatch, app_test):
    from bench.app_server import free_port

    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    monkeypatch.setenv("ATTENTION_LAB_TEXT_STORE", down)
    with pytest.raises(text_store.Unreachable, match="cannot be reached"):
        text_store.store(LONG)
    at = app_test("explore", model="toy-translate", text="the small dog sees the cat")
    at.run()
    assert_no_exception(at)
    assert not [w.value for w in at.warning if "text store" in w.value]
    assert at.get("plotly_chart"), "a short text drew nothing with the store down"
    at.text_area(key="explore.text").input(LONG).run()  # a long text: the page works, and says the link is cut
    assert_no_exception(at)
    warns = " ".join(w.value for w in at.warning)
    assert "cannot be reached" in warns and "Redis at redis://127.0.0.1" in warns, warns
    assert at.get("plotly_chart")
    qp = {"model": "toy-translate", "text": url_text(LONG), "text_key": text_store.key_of(LONG)}
    again = app_test("explore", **qp)  # a link with a key while the store is down
    again.run()
    assert_no_exception(again)
    warns = " ".join(w.value for w in again.warning)
    assert "cannot be reached" in warns and f"first {len(url_text(LONG)):,} characters" in warns, warns
