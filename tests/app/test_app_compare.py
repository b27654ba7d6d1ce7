"""The 'compare' page driven through AppTest: the two "bank" sentences of seed 000 by default,
the drawn cosines and attention rows are the core's numbers, bad input is a warning, and
the view lives in the URL (model, text, text2, word, layer, head)."""

import numpy as np
import pytest
import torch.nn.functional as F

import core
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from viz.compare import figures as cmp

BANK_A, BANK_B = cmp.BANK_A, cmp.BANK_B


def _warnings(at):
    return [w.value for w in at.warning]


def _y(at, key, trace_index=0):
    return decode_array(figure(chart_by_key(at, key))["data"][trace_index]["y"]).astype(float)


def _core_cosines(model, a, b, pos_a, pos_b, stack="encoder"):
    ta, tb = model.trace(a), model.trace(b)
    names = [f"embed.{stack}.sum"] + [f"{stack}.{i}.out" for i in range(ta.layers(stack))]
    return np.array([F.cosine_similarity(ta[n][pos_a], tb[n][pos_b], dim=0).item() for n in names])


def test_default_is_the_bank_pair_on_minilm(app_test, minilm):
    at = app_test("compare")
    at.run()
    assert_no_exception(at)
    assert not at.error and not _warnings(at), (_warnings(at), [e.value for e in at.error])
    qp = at.query_params
    assert (qp["model"], qp["text"], qp["text2"], qp["word"]) == ("minilm", BANK_A, BANK_B, "bank")
    bank = minilm.trace(BANK_A).tokens("source").index("bank")
    assert bank == minilm.trace(BANK_B).tokens("source").index("bank") == 11
    expected = _core_cosines(minilm, BANK_A, BANK_B, bank, bank)
    y = _y(at, "compare-cosine")
    assert len(y) == 7  # embedding + 6 layers
    np.testing.assert_allclose(y, expected, atol=1e-6)
    assert abs(y[0] - 1.0) < 1e-6 and y[-1] < 0.95
    ticks = figure(chart_by_key(at, "compare-cosine"))["layout"]["xaxis"]["ticktext"]
    assert ticks[0] == "embedding" and ticks[-1] == "layer 5"
    text = " ".join(m.value for m in at.markdown)
    assert "same position" in text and "1.000000" in text
    # the table shows the same numbers
    df = at.table[0].value
    np.testing.assert_allclose(df["cosine"].to_numpy(dtype=float), np.round(expected, 4), atol=1e-4)
    assert df["trace name"].tolist()[:2] == ["embed.encoder.sum", "encoder.0.out"]


def test_attention_bars_are_the_word_rows(app_test, minilm):
    at = app_test("compare", layer="4", head="7")
    at.run()
    assert_no_exception(at)
    for key, sentence in (("compare-attn-a", BANK_A), ("compare-attn-b", BANK_B)):
        tr = minilm.trace(sentence)
        row = tr["encoder.4.self_attn.weights"][7, tr.tokens("source").index("bank")].numpy()
        y = _y(at, key)  # "bank" and every other word is one piece here: words == tokens
        np.testing.assert_allclose(y, row, atol=1e-6)
        assert y.sum() == pytest.approx(1.0, abs=1e-5)
        colours = figure(chart_by_key(at, key))["data"][0]["marker"]["color"]
        assert colours[11] == cmp.WORD_COLOUR and colours.count(cmp.WORD_COLOUR) == 1
    at.toggle(key="compare.mean").set_value(True).run()
    tr = minilm.trace(BANK_B)
    expected = tr["encoder.4.self_attn.weights"].mean(0)[11].numpy()
    np.testing.assert_allclose(_y(at, "compare-attn-b"), expected, atol=1e-6)


def test_word_pieces_are_merged(app_test, minilm):
    a, b = "Tokenization splits embeddings.", "Embeddings are vectors."
    at = app_test("compare", text=a, text2=b, word="embeddings", layer="2", head="3")
    at.run()
    assert_no_exception(at)
    assert not _warnings(at), _warnings(at)
    tr = minilm.trace(b)
    toks = tr.tokens("source")
    pieces = [toks.index(p) for p in ("em", "##bed", "##ding", "##s")]
    w = tr["encoder.2.self_attn.weights"][3][pieces].mean(0)
    y = _y(at, "compare-attn-b")  # words: [CLS] Embeddings are vectors . [SEP]
    assert len(y) == 6
    assert y[1] == pytest.approx(w[pieces].sum().item(), abs=1e-6)
    assert y.sum() == pytest.approx(1.0, abs=1e-5)
    ticks = figure(chart_by_key(at, "compare-attn-b"))["layout"]["xaxis"]["ticktext"]
    assert ticks[1] == "Embeddings"
    # the cosine of a word of pieces is the cosine of the means of its pieces' vectors
    ta = minilm.trace(a)
    pa = [ta.tokens("source").index(p) for p in ("em", "##bed", "##ding", "##s")]
    y = _y(at, "compare-cosine")
    assert y[-1] == pytest.approx(F.cosine_similarity(ta["encoder.5.out"][pa].mean(0), tr["encoder.5.out"][pieces].mean(0),
                                                      dim=0).item(), abs=1e-6)
    text = " ".join(m.value for m in at.markdown)
    assert "different positions" in text and "token embeddings alone are identical" in text
    # read in tokens: one bar per piece
    at.toggle(key="compare.words").set_value(False).run()
    assert len(_y(at, "compare-attn-b")) == len(toks)


def test_empty_sentence_b_warns(app_test):
    at = app_test("compare", text2="   ")
    at.run()
    assert_no_exception(at)
    assert any("Sentence B is empty" in w for w in _warnings(at)), _warnings(at)
    assert not at.get("plotly_chart")
    assert at.query_params["text"] == at.text_area(key="compare.text").value  # sentence A kept


def test_word_not_in_both_sentences_warns(app_test):
    at = app_test("compare", word="river")
    at.run()
    assert_no_exception(at)
    assert any("“river” is in sentence A only, not in both" in w for w in _warnings(at)), _warnings(at)
    assert at.selectbox(key="compare.word").value == "bank" and at.query_params["word"] == "bank"
    assert len(at.get("plotly_chart")) == 3
    at2 = app_test("compare", word="zebra")
    at2.run()
    assert any("“zebra” is in neither sentence" in w for w in _warnings(at2)), _warnings(at2)


def test_sentences_without_a_common_word_warn(app_test):
    at = app_test("compare", model="toy-translate", text="the dog sleeps", text2="a cat runs")
    at.run()
    assert_no_exception(at)
    assert any("no word in common" in w for w in _warnings(at)), _warnings(at)
    assert not at.get("plotly_chart")


def test_url_round_trip(app_test, minilm):
    at = app_test("compare")
    at.run()
    at.selectbox(key="compare.word").set_value("the").run()
    at.selectbox(key="compare.layer").set_value(3).run()
    at.selectbox(key="compare.head").set_value(5).run()
    at.selectbox(key="compare.occ_a").set_value(1).run()  # the second "the" of sentence A ("the other bank")
    assert_no_exception(at)
    qp = {k: at.query_params[k] for k in ("model", "text", "text2", "word", "layer", "head")}
    assert qp == {"model": "minilm", "text": BANK_A, "text2": BANK_B, "word": "the", "layer": "3", "head": "5"}
    tr = minilm.trace(BANK_A)
    second_the = [i for i, t in enumerate(tr.tokens("source")) if t == "the"][1]
    np.testing.assert_allclose(_y(at, "compare-attn-a"), tr["encoder.3.self_attn.weights"][5, second_the].numpy(),
                               atol=1e-6)
    at2 = app_test("compare", **qp)
    at2.run()
    assert_no_exception(at2)
    assert at2.selectbox(key="compare.word").value == "the"
    assert at2.selectbox(key="compare.layer").value == 3 and at2.selectbox(key="compare.head").value == 5
    np.testing.assert_array_equal(_y(at2, "compare-attn-b"), _y(at, "compare-attn-b"))
    # `target` is read as sentence B when text2 is absent
    at3 = app_test("compare", model="minilm", text=BANK_A, target="The bank was closed.", word="bank")
    at3.run()
    assert at3.text_area(key="compare.text2").value == "The bank was closed."
    assert at3.query_params["text2"] == "The bank was closed."


def test_bad_layer_and_head_in_url(app_test):
    at = app_test("compare", layer="42", head="x")
    at.run()
    assert_no_exception(at)
    warns = " ".join(_warnings(at))
    assert "layer 42 is out of range" in warns and "head='x' is not a whole number" in warns
    assert at.query_params["layer"] == "5" and at.query_params["head"] == "0"


def test_example_pair_and_model_switch(app_test):
    at = app_test("compare")
    at.run()
    at.button(key="compare-pair-1").click().run()  # "it: tired vs wide"
    assert_no_exception(at)
    assert at.query_params["word"] == "it" and at.query_params["text2"] == cmp.IT_B
    at.button(key="compare-pair-0").click().run()
    at.selectbox(key="compare.model").set_value("toy-translate").run()  # the default pair follows the model
    assert_no_exception(at)
    assert (at.query_params["text"], at.query_params["text2"]) == (cmp.TOY_A, cmp.TOY_B)
    y = _y(at, "compare-cosine")
    assert len(y) == 4 and abs(y[0] - 1.0) < 1e-6


def test_unknown_model_and_missing_minilm(app_test, monkeypatch):
    at = app_test("compare", model="gpt-9")
    at.run()
    assert_no_exception(at)
    assert any("model='gpt-9'" in w for w in _warnings(at)), _warnings(at)
    assert at.query_params["model"] in ("minilm", "toy-translate")
    monkeypatch.setattr(core.MODELS["minilm"], "available", lambda: False)
    at2 = app_test("compare")
    at2.run()
    assert_no_exception(at2)
    assert any("minilm is not installed" in w and "toy-translate" in w for w in _warnings(at2)), _warnings(at2)
    assert at2.query_params["model"] == "toy-translate" and at2.query_params["text"] == cmp.TOY_A
    assert abs(_y(at2, "compare-cosine")[0] - 1.0) < 1e-6


def test_smollm2_uses_the_decoder_stack(app_test):
    if not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's weight package is not installed")
    at = app_test("compare", model="smollm2", layer="29", head="8")
    at.run()
    assert_no_exception(at)
    assert not _warnings(at), _warnings(at)
    y = _y(at, "compare-cosine")
    assert len(y) == 31 and abs(y[0] - 1.0) < 1e-6 and y[-1] < 0.95
    names = figure(chart_by_key(at, "compare-cosine"))["data"][0]["customdata"]
    assert names[0] == "embed.decoder.sum" and names[-1] == "decoder.29.out"
    assert "RoPE" in " ".join(m.value for m in at.markdown)
    bars = _y(at, "compare-attn-a")
    assert bars.sum() == pytest.approx(1.0, abs=1e-5) and bars[-1] == 0  # causal: "." comes after "bank"
