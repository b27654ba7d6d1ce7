"""Every ignored URL value is named, on every page, in one message style: opened with a field
it does not have, a model that does not exist, or a value it cannot use in each of its own
fields, a page shows one warning per field that names the field and the value as the URL gives
them ("The URL's layer='zz9' ...") and says what is used instead ("is replaced by 0: ...") or that
it has no effect ("is ignored: ..."). The page's own fields are read from what it says about the
field it does not have (no list kept here), so a field added to a page is in this test at once."""

import re

import pytest

from conftest import assert_no_exception
from viz.ui import registry
from viz.ui.url_state import said

NORMAL = "the small dog sees the cat"
PAIRS = {"compare": {"text2": "the dog sees the cat"}, "patching": {"corrupt": "the small cat sees the dog"}}
# free text, used as typed (an unknown word in it is shown as <unk>, with its own warning): never "ignored"
FREE = {"text", "text2", "corrupt", "cont"} | {"target"}  # target: a sentence on Inside, decoder, Compare
TOKEN_TARGET = {"lens", "attribution"}  # where target is one token of the vocabulary, which 'zz9' is not
BAD = "zz9"
STYLE = re.compile(r"^The URL's (\w+)=(.+?) (is replaced by .+|is ignored: .+)$", re.S)


def _open(app_test, page, **params):
    spec = registry.page(page)
    at = app_test(page, **{**spec.params, **({"text": NORMAL} if spec.text_box else {}), **PAIRS.get(page, {}),
                           **params})
    at.run(timeout=300)
    assert_no_exception(at)
    return at


def _named(at, field, value) -> list:
    """The warnings that name field=value in the URL's words."""
    return [w.value for w in at.warning if w.value.startswith(f"The URL's {field}={said(value)} ")]


@pytest.mark.parametrize("page", [p.key for p in registry.PAGES])
def test_every_url_value_a_page_cannot_use_is_named(app_test, page):
    spec = registry.page(page)
    at = _open(app_test, page, nosuch="1", **({"model": BAD} if spec.reads_url else {}))
    said_nosuch = _named(at, "nosuch", "1")
    assert said_nosuch and "is ignored" in said_nosuch[0], [w.value for w in at.warning]
    if not spec.reads_url:
        return
    assert _named(at, "model", BAD), [w.value for w in at.warning]
    fields = re.search(r"its URL fields: ([^)]*)\)", said_nosuch[0]).group(1).split(", ")
    bad = {f: BAD for f in fields if f != "model" and (f not in FREE or (f == "target" and page in TOKEN_TARGET))}
    at = _open(app_test, page, **bad)
    for w in at.warning:  # one style: every message about the URL names a field and says what happens instead
        if w.value.startswith("The URL's "):
            assert STYLE.match(w.value), w.value
    silent = [f for f in bad if not _named(at, f, BAD)]
    assert not silent, (f"{page}: the URL's {', '.join(silent)} not named", [w.value for w in at.warning])
