""""Why here?" on Explore, Inside a head and the Heads page, under AppTest: the cell, the
versus key and the grouping come from the URL and go back to it; the top terms the page words
are the API's; the sum check is green; bad URL values get a message, never a traceback; a
model switch keeps the cell where it fits."""

from __future__ import annotations

import pytest

import core
import core.analysis as ca
from conftest import assert_no_exception
from viz.figures import why as wf

TEXT = "When Mary and John went to the store, John gave a drink to"


def _markdown(at):
    return "\n".join(m.value for m in at.markdown)


def _captions(at):
    return "\n".join(c.value for c in at.caption)


@pytest.fixture(scope="module")
def smol():
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's weight package is not installed")
    return core.load_model("smollm2")


def test_explore_opens_the_cell_from_the_url_with_the_apis_terms(app_test, smol):
    at = app_test("explore", model="smollm2", text=TEXT, attn="decoder.self_attn", layer="3", head="2", why="12,3")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    tr = smol.trace(TEXT)
    df = ca.score_attribution(tr, "decoder", 3, 2, 12, 3, group="layer")
    q, k = tr.tokens("target")[12], tr.tokens("target")[3]
    md = _markdown(at)
    for sentence in wf.term_sentences(df, q, k, 5):
        assert sentence in md
    assert "The terms add up to the model's own score" in _captions(at)
    assert at.query_params["why"] == "12,3"
    # versus: the next-heaviest key by default, its own terms and check
    assert "Versus key" in md
    # open to heads: the URL keeps it
    at.radio(key="explore.why_group").set_value("heads").run()
    assert_no_exception(at)
    assert at.query_params["why_group"] == "heads"
    dh = ca.score_attribution(tr, "decoder", 3, 2, 12, 3, group="component")
    assert wf.term_sentences(dh, q, k, 1)[0] in _markdown(at)


def test_bad_why_values_say_why_and_a_model_switch_keeps_the_cell(app_test, smol):
    at = app_test("explore", model="smollm2", text=TEXT, attn="decoder.self_attn", layer="1", head="0", why="99,3")
    at.run()
    assert_no_exception(at)
    notes = [w.value for w in list(at.warning) + list(at.info)]
    assert any("why=" in n for n in notes), notes
    at = app_test("explore", model="smollm2", text="the small dog sees the cat", attn="decoder.self_attn", layer="1",
                  head="0", why="4,1", versus="2")
    at.run()
    assert_no_exception(at)
    assert at.query_params["versus"] == "2"
    at.selectbox(key="explore.model").set_value("toy-translate").run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert at.query_params["why"] == "4,1"


def test_inside_and_heads_show_the_decomposition(app_test, smol):
    at = app_test("inside", model="smollm2", text="the small dog sees the cat", layer="1", head="2", why="4,1")
    at.run()
    assert_no_exception(at)
    assert "The terms add up to the model's own score" in _captions(at)
    at = app_test("heads", model="smollm2", text="the small dog sees the cat", pa="3,2")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert "The terms add up to the model's own attention-weighted score" in _captions(at)
    pa = ca.pattern_attribution(smol.trace("the small dog sees the cat"), "decoder", 3, 2, group="layer")
    assert "; ".join(wf.term_sentences(pa, None, None, 3)) in _markdown(at)


def test_heads_reads_the_pattern_on_the_repeated_sequence(app_test, smol):
    at = app_test("heads", model="smollm2", text="the small dog sees the cat", pa="17,3", pa_on="repeat")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert at.query_params["pa_on"] == "repeat" and at.query_params["pa"] == "17,3"
    rep = ca.repeated_text(smol, "decoder")
    pa = ca.pattern_attribution(smol.trace(rep["text"]), "decoder", 17, 3, group="layer")
    assert "; ".join(wf.term_sentences(pa, None, None, 3)) in _markdown(at)
    assert "The terms add up to the model's own attention-weighted score" in _captions(at)


def test_toy_translate_cross_attention_and_heads_page(app_test, toy):
    at = app_test("explore", model="toy-translate", text="the small dog sees the cat", attn="decoder.cross_attn",
                  layer="1", head="0", why="2,3")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert "The terms add up to the model's own score" in _captions(at)
    assert "enc." in _markdown(at) or "encoder's" in _markdown(at)  # keys from the encoder's stream
    at = app_test("heads", model="toy-translate", text="the small dog sees the cat", pa_group="kinds")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert "The terms add up to the model's own attention-weighted score" in _captions(at)
