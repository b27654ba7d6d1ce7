"""The smaller items of issue 41, through AppTest: "Patch this head" marks the head and offers a
corrupted prompt that differs; the lists of heads include those working against the answer;
target = baseline (or contrast) is a warning, not an all-zero map; the long-input time warning
goes when the run ends (and the Lens announces a long input too); the swap list counts from 0."""


import re

from conftest import assert_no_exception, chart_by_key, figure
from dla_reference import head_contributions
from viz.patching import figures as pm
from viz.ui import explore_links, longdoc

IOI = "When Mary and John went to the store, John gave a drink to"
LINK = re.compile(r"L(\d+)H(\d+) \(layer \d+ · head \d+\): ([+-][0-9.]+)")
PLAIN = "the old man sleeps near the river"  # no names: default_corrupt leaves it as it is


def test_patch_this_head_marks_the_head_and_offers_a_differing_prompt(app_test, toy):
    assert pm.default_corrupt(PLAIN) == PLAIN
    at = app_test("patching", model="toy-translate", text=PLAIN, what="head", layer="1", head="2")
    at.run(timeout=600)
    assert_no_exception(at)
    corrupt = at.query_params["corrupt"]
    assert corrupt != PLAIN and len(toy.encode(corrupt).ids) == len(toy.encode(PLAIN).ids)
    assert any("nothing to restore" in i.value and "swapped for" in i.value for i in at.info)
    fig = figure(chart_by_key(at, "patching-map"))
    rects = [sh for sh in fig["layout"].get("shapes", []) if sh.get("type") == "rect"]
    assert len(rects) == 1 and (rects[0]["x0"], rects[0]["y0"]) == (1.5, 0.5)  # head 2's column, layer 1's row
    assert any("Outlined: **L1H2**" in c.value for c in at.caption)
    assert at.query_params["layer"] == "1" and at.query_params["head"] == "2"
    labels = [o for o in at.selectbox(key="patching.swap_word").options]
    assert labels[0].startswith("0: ")  # counted from 0, like the positions


def test_the_explore_link_carries_the_head():
    calls = []

    class Col:
        def page_link(self, *a, **k):
            calls.append(k)

    class Model:
        kind = "decoder"

    import streamlit as st
    real = st.page_link
    st.page_link = lambda *a, **k: calls.append(k)
    try:
        explore_links.head_links(Col(), Model(), "smollm2", IOI, "decoder", "self_attn", 23, 3)
    finally:
        st.page_link = real
    qp = calls[0]["query_params"]
    assert qp["layer"] == "23" and qp["head"] == "3" and qp["what"] == "head"


def test_lens_lists_heads_against_the_answer(app_test, smollm2):
    at = app_test("lens", model="smollm2", text=IOI, target=" Mary", baseline=" John")
    at.run(timeout=600)
    assert_no_exception(at)
    assert any("Top 5 heads against" in m.value for m in at.markdown)
    labels = [str(el.proto.label) for el in at.get("page_link")]
    listed = {(int(m[1]), int(m[2])): float(m[3]) for m in map(LINK.match, labels) if m and m[3].startswith("-")}
    # the five most negative heads of a float64 reference written in the tests (tests/dla_reference.py)
    ref = head_contributions(smollm2, smollm2.trace(IOI), " Mary", " John")
    order = ref.flatten().argsort().tolist()
    want = {divmod(i, ref.shape[1]) for i in order[:5]}
    assert ref.flatten()[order[4]] < 0 and ref.flatten()[order[5]] - ref.flatten()[order[4]] > 1e-3  # no near tie
    assert set(listed) == want, (labels, want)
    for (layer, head), shown in listed.items():  # shown to 3 decimals
        assert abs(shown - float(ref[layer, head])) <= 5e-4 + 1e-5, (layer, head, shown, float(ref[layer, head]))


def test_target_equal_to_baseline_is_a_warning(app_test, smollm2):
    at = app_test("lens", model="smollm2", text=IOI, target=" Mary", baseline=" Mary")
    at.run(timeout=600)
    assert_no_exception(at)
    assert any("same token" in w.value for w in at.warning)
    assert not any("Contributions add up" in s.value for s in at.success)
    at = app_test("attribution", model="toy-translate", text="the small dog sees the cat", position="0",
                  target="le", contrast="le")
    at.run(timeout=600)
    assert_no_exception(at)
    assert any("same token" in w.value for w in at.warning)
    assert not at.get("plotly_chart")


def test_the_time_warning_goes_when_the_run_ends_and_the_lens_announces(app_test, toy, monkeypatch):
    monkeypatch.setattr(longdoc, "MIN_TOKENS", 1, raising=False)
    monkeypatch.setattr(longdoc, "WARN_SECONDS", 0.0)
    monkeypatch.setitem(longdoc._COST, "toy-translate", (8, 1.0, None))  # no calibration pass
    shown = []
    real = longdoc.before_trace

    def spy(model, model_name, text):
        cb = real(model, model_name, text)
        shown.append(cb is not None)
        return cb

    monkeypatch.setattr(longdoc, "before_trace", spy)
    for page, text in (("explore", "the tall man sees the small cat"), ("lens", "the tall cat sees the small man")):
        shown.clear()  # (a text of its own each: a trace cached by the other page runs nothing)
        at = app_test(page, model="toy-translate", text=text)
        at.run(timeout=600)
        assert_no_exception(at)
        assert shown == [True], (page, shown)  # the warning and bar were drawn before the run
        assert not any("the traced pass will take" in w.value for w in at.warning), page  # and are gone after it
        assert any("the traced pass took" in c.value and "expected about" in c.value for c in at.caption), page
