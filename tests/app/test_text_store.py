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
    (store / f"{key}.txt").write_text(LONG + "edited", encoding="utf-8")
    assert text_store.get(key) is None


def test_the_store_is_bounded_least_recently_used_first(store, monkeypatch):
    import os
    import time

    monkeypatch.setattr(text_store, "MAX_ITEMS", 3)
    keys = []
    for i in range(3):
        keys.append(text_store.put(f"text {i}"))
        p = store / f"{keys[-1]}.txt"
        os.utime(p, ns=(time.time_ns() - (10 - i) * 10**9,) * 2)  # distinct ages, the first the oldest
    assert text_store.get(keys[0]) == "text 0"  # read: now the most recently used
    text_store.put("text 3")
    assert text_store.get(keys[1]) is None  # the least recently used went
    assert text_store.get(keys[0]) == "text 0" and text_store.get(keys[2]) == "text 2"
    assert len(list(store.glob("*.txt"))) == 3
    monkeypatch.setattr(text_store, "MAX_ITEMS", 100)
    monkeypatch.setattr(text_store, "MAX_BYTES", 2 * len(LONG.encode()))
    for i in range(3):
        text_store.put(LONG + str(i))
    assert sum(p.stat().st_size for p in store.glob("*.txt")) <= 2 * len(LONG.encode())


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
