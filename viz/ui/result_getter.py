"""A cached result asked for again after its page run ended, without keeping it alive meanwhile.

Streamlit keeps a download button's deferred file function until the session's next run: a
function that held the trace would pin hundreds of MB for as long as a tab stays open, outside
the admission gate's budget (viz/ui/gate.py counts a trace while a page run holds it and while
the cache keeps it). viz.ui.models remembers how each trace (or each decoder step of a run) was
made; `getter` gives a function returning it: as it is while it lives, else from the cache again,
else computed again through the gate. Pure Python (no Streamlit).
"""

from __future__ import annotations

import weakref
from typing import Callable

# a result -> (cache, cache key, compute, index in the cached list or None); no reference to the result
_AGAIN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def alive() -> list:
    """The remembered results still alive (whoever holds them): the server log counts them."""
    return list(_AGAIN.keys())


def remember(value, cache, cache_key: tuple, compute: Callable[[], object]) -> None:
    """How `value` (a trace, or a list of decoder steps: each step) is made again:
    cache.get_or_compute(cache_key, compute)."""
    items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
    for index, item in items:
        try:
            _AGAIN[item] = (cache, cache_key, compute, index)
        except TypeError:  # not weakly referable: getter keeps it as it is
            pass


def getter(value) -> Callable[[], object]:
    """A function that returns `value` later without keeping it alive; a result whose making was not
    remembered (a view of one) is kept as it is."""
    try:
        again = _AGAIN.get(value)
    except TypeError:
        again = None
    if again is None:
        return lambda: value
    ref = weakref.ref(value)
    cache, cache_key, compute, index = again

    def get():
        got = ref()
        if got is None:
            got = cache.get_or_compute(cache_key, compute)
            if index is not None:
                got = got[index]
        return got

    return get


def whole(value):
    """The cached result `value` is an item of (a decoder run's list of steps, as the cache keeps that very
    list), else `value`: what to hold against the budget so that the gate counts it once with the cache."""
    try:
        again = _AGAIN.get(value)
    except TypeError:
        return value
    if again is None or again[3] is None:
        return value
    cache, cache_key, _, index = again
    got = cache.get(cache_key)
    return got if isinstance(got, list) and index < len(got) and got[index] is value else value
