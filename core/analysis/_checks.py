"""The numbers a user hands an analysis, checked in one place with one wording.

A count or a position is a whole number: an int (or a numpy / torch integer), never a bool
(True is not 1 here) and never a float (1.7 is not rounded to 1, nor 2.0 taken as 2). A
position counts from 0, or from the end when negative (-1 the last), and must fall inside the
input. Every message quotes what was given, as given: "key -99 is outside ...", not the
position it would have become.
"""

from __future__ import annotations

import operator
from typing import Optional


def shown(value) -> str:
    """value as a message quotes it: numbers as typed, anything else by repr."""
    if isinstance(value, (bool, int, float)):
        return str(value)
    try:
        return str(operator.index(value))  # numpy / torch integers, without their type's name
    except TypeError:
        return repr(value)


def whole(value, what: str, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """value as an int; ValueError (quoting it) for a bool, a non-integer, or one below lo / above hi."""
    i = None
    if not isinstance(value, (bool, float)):
        try:
            i = operator.index(value)
        except TypeError:
            i = None
    if i is None:
        kind = "True or False" if isinstance(value, bool) else shown(value)
        raise ValueError(f"{what} must be a whole number (got {kind})")
    if lo is not None and i < lo:
        raise ValueError(f"{what} must be at least {lo} (got {shown(value)})")
    if hi is not None and i > hi:
        raise ValueError(f"{what} must be at most {hi} (got {shown(value)})")
    return i


def position(value, n: int, what: str = "position") -> int:
    """A position among n (negative: from the end) as 0..n-1; ValueError quoting the value given."""
    i = whole(value, what)
    p = i + n if i < 0 else i
    if not 0 <= p < n:
        raise ValueError(f"{what} {shown(value)} is outside the {n} positions (0 to {n - 1}, or -{n} to -1 "
                         "from the end)")
    return p


def index(value, n: int, what: str) -> int:
    """An index among n (a layer, a head) as 0..n-1, counted from 0 only; ValueError quoting it."""
    i = whole(value, what)
    if not 0 <= i < n:
        raise ValueError(f"{what} {shown(value)} is outside 0 to {n - 1}")
    return i
