"""The 'corpus' page through AppTest: the scatter is the corpus job's vectors, normalised and
projected; URL state (model, layer, head, projection); pasted corpora and bad input."""

import numpy as np

import core.cli.corpus_job as cc
from conftest import assert_no_exception, chart_by_key, decode_array, figure
from core.cli.corpus_data import load as load_bundled


def _xy(trace):
    return np.stack([decode_array(trace["x"]), decode_array(trace["y"])], axis=1)


def test_default_draws_the_bundled_corpus(app_test, toy):
    at = app_test("corpus", layer="2", head="3")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert dict(at.query_params) == {"model": "toy-translate", "layer": "2", "head": "3", "projection": "pca"}
    fig = figure(chart_by_key(at, "corpus-scatter"))
    qs, ks = fig["data"]
    n = at.slider(key="corpus.n").value
    sentences = load_bundled()[:n]
    # independently: the head's vectors from single-sentence traces, AttentionViz's
    # normalisation by its two defining properties, then scikit-learn's PCA
    from sklearn.decomposition import PCA

    pick = [0, 11, 37]
    q_rows, k_rows = [], []
    cd = decode_array(qs["customdata"]).astype(int)
    for sid in pick:
        tr = toy.trace(sentences[sid])
        where = np.flatnonzero(cd[:, 0] == sid)
        assert [int(p) for p in cd[where, 1]] == list(range(len(tr.tokens("source"))))
        q_rows.append((where, tr["encoder.2.self_attn.q"][3].numpy()))
        k_rows.append((where, tr["encoder.2.self_attn.k"][3].numpy()))
    res = cc.run(toy, sentences, [2])
    rows, q, k = cc.head_vectors(res.table, 2, 3)
    for where, ref in q_rows:
        np.testing.assert_allclose(q[where], ref, atol=1e-5)
    for where, ref in k_rows:
        np.testing.assert_allclose(k[where], ref, atol=1e-5)
    import core.analysis.joint as cj

    qn, kn = cj.normalise(q, k)
    np.testing.assert_allclose(qn.mean(0), kn.mean(0), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(qn, axis=1).mean(), np.linalg.norm(kn, axis=1).mean(), rtol=1e-6)
    ref = PCA(n_components=2, svd_solver="full").fit_transform(np.vstack([qn, kn]))
    drawn = np.vstack([_xy(qs), _xy(ks)])
    for axis in range(2):
        sign = np.sign(drawn[:, axis] @ ref[:, axis])
        np.testing.assert_allclose(drawn[:, axis], sign * ref[:, axis], atol=1e-4)
    assert "<b>[" in qs["hovertext"][0]
    # small multiples: every head of the layer, computed and drawn only once their expander is open
    assert not any("corpus-heads" in c.proto.id for c in at.get("plotly_chart"))
    at.session_state["corpus.heads.open"] = True
    at.run()
    assert_no_exception(at)
    heads = figure(chart_by_key(at, "corpus-heads"))
    assert len(heads["data"]) == 2 * toy.config.n_heads


def test_tsne_on_fewer_sentences(app_test):
    at = app_test("corpus", layer="1", head="0")
    at.run()
    at.slider(key="corpus.n").set_value(20).run()
    at.selectbox(key="corpus.projection").set_value("tsne").run()
    assert_no_exception(at)
    assert at.query_params["projection"] == "tsne"
    fig = figure(chart_by_key(at, "corpus-scatter"))
    assert "t-SNE" in fig["layout"]["title"]["text"]
    ids = decode_array(fig["data"][0]["customdata"])[:, 0]
    assert set(ids.astype(int)) == set(range(20))


def test_bad_url_values_warn(app_test):
    at = app_test("corpus", layer="99", head="x", projection="mds")
    at.run()
    assert_no_exception(at)
    warnings = " ".join(w.value for w in at.warning)
    assert "layer 99 is out of range" in warnings and "projection" in warnings and "head" in warnings
    assert at.query_params["projection"] == "pca" and at.query_params["layer"] == "2"


def test_pasted_corpus_and_empty_input(app_test):
    at = app_test("corpus")
    at.run()
    at.radio(key="corpus.source").set_value("Paste text").run()
    assert_no_exception(at)
    assert any("corpus is empty" in w.value for w in at.warning)
    at.text_area(key="corpus.paste").input("the small dog sees the cat\n\n!!!\nshow me the money\n").run()
    assert_no_exception(at)
    assert any("left out" in w.value for w in at.warning)  # "!!!" has no word
    fig = figure(chart_by_key(at, "corpus-scatter"))
    assert len(decode_array(fig["data"][0]["x"])) == 6 + 4  # tokens of the two readable sentences


def test_page_shows_missing_umap_as_an_error(monkeypatch, app_test):
    import sys

    monkeypatch.setitem(sys.modules, "umap", None)
    at = app_test("corpus", projection="umap")
    at.run()
    assert not at.exception
    assert any("umap-learn" in e.value for e in at.error)


def test_bundled_corpus_opens_on_fewer_sentences_than_a_pasted_one(app_test):
    """The bundled corpus opens on its first 200 sentences (corpus.py's BUNDLED_SENTENCES: a quick
    first view); another corpus starts again from the default of 500 (DEFAULT_SENTENCES)."""
    at = app_test("corpus")
    at.run()
    assert_no_exception(at)
    assert at.slider(key="corpus.n").value == 200
    at.radio(key="corpus.source").set_value("Paste text").run()
    at.text_area(key="corpus.paste").input("\n".join(f"the small dog sees the cat {i}" for i in range(600))).run()
    assert_no_exception(at)
    assert at.slider(key="corpus.n").value == 500
