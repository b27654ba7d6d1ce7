"""Numbers a researcher can trust (issue 41), through AppTest: the token a user picks or types
is the token computed (' Mary' is not 'Mary'), and the page names it with its id. A token picked
from the top-10 list is the browser's test (tests/browser/test_browser_trust.py: picked, explained
by id, kept through a reload)."""

import numpy as np

import core.analysis as ca
from core.analysis.token_ids import output_token_id
from conftest import assert_no_exception, chart_by_key, decode_array, figure

IOI = "When Mary and John went to the store, John gave a drink to"


def _rows(at):
    fig = figure(chart_by_key(at, "attribution-text"))
    return {t["meta"]: decode_array(t["z"]).astype(float).reshape(-1) for t in fig["data"]}


def test_attribution_explains_the_token_typed_leading_space_included(app_test, smollm2):
    """' Mary' (5099) and 'Mary' (25653) are two tokens of smollm2: the page explains the one typed."""
    assert output_token_id(smollm2, " Mary") == 5099 and output_token_id(smollm2, "Mary") == 25653
    at = app_test("attribution", model="smollm2", text=IOI, target=" Mary", contrast=" John", steps="8")
    at.run(timeout=600)
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    said = " ".join(m.value for m in at.markdown)
    assert "logit[' Mary'] − logit[' John']" in said and "target id 5099" in said, said
    assert f"contrast id {output_token_id(smollm2, ' John')}" in said
    want = ca.attribute(smollm2, IOI, "occlusion", target=5099,
                        baseline=output_token_id(smollm2, " John"))["score"].to_numpy()
    np.testing.assert_allclose(_rows(at)["occlusion"], want, rtol=1e-4, atol=1e-5)
    assert at.query_params["target"] == " Mary"


def test_faithfulness_where_every_method_ties_says_so(app_test, smollm2):
    """"The capital of France is": every method scores as random does; the page says so, ranks
    them as ties (1=), and gives each method's margin over random with random's spread."""
    at = app_test("attribution", model="smollm2", text="The capital of France is", steps="8", faithful="1")
    at.run(timeout=600)
    assert_no_exception(at)
    warns = " ".join(w.value for w in at.warning)
    assert "no method is distinguishable from random" in warns, warns
    table = at.table[0].value  # the faithfulness table (st.table: its cells wrap)
    assert (table["verdict"][table["method"] != "random"] == "indistinguishable from random").all()
    assert table["rank"].iloc[0] == "1=" and table["margin over random"].str.contains("±").all()
    assert any("20 seeded random rankings" in c.value for c in at.caption)
    assert at.toggle(key="attribution.fix_first").value  # on by default on a decoder


def test_the_default_toy_example_is_one_where_methods_differ(app_test, toy):
    at = app_test("attribution", model="toy-translate", steps="16", faithful="1")
    at.run(timeout=600)
    assert_no_exception(at)
    assert at.selectbox(key="attribution.position").value == 2
    table = at.table[0].value  # the faithfulness table (st.table: its cells wrap)
    methods = table[table["method"] != "random"]
    assert methods["rank"].nunique() >= 3, table  # not one tie
    assert "above random" in set(methods["verdict"])
    assert not at.toggle(key="attribution.fix_first").value  # off on an encoder-decoder
