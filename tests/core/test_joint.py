"""The joint query-key embedding (core.analysis.joint) and its figures (viz.corpus.figures)."""

import numpy as np
import pandas as pd
import pytest

import core.analysis.joint as cj
from conftest import decode_array
from viz.corpus import figures as vc


def _qk(n=200, d=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, d)) * 2.0 + 3.0
    k = rng.normal(size=(n, d)) * 0.5 - 1.0
    return q, k


def _softmax(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_normalise_keeps_attention_and_matches_centroids_and_norms():
    q, k = _qk()
    qn, kn = cj.normalise(q, k)
    np.testing.assert_allclose(qn.mean(0), kn.mean(0), atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(qn, axis=1).mean(), np.linalg.norm(kn, axis=1).mean(), rtol=1e-9)
    # every query's attention over the keys is unchanged (softmax ignores a per-row constant)
    np.testing.assert_allclose(_softmax(qn @ kn.T / 4), _softmax(q @ k.T / 4), atol=1e-9)
    # and the raw dot products move by the same constant along each row
    diff = qn @ kn.T - q @ k.T
    np.testing.assert_allclose(diff, np.repeat(diff[:, :1], diff.shape[1], axis=1), atol=1e-8)


def test_pca_matches_scikit_learn():
    from sklearn.decomposition import PCA

    q, k = _qk(300, 24, seed=1)
    x = np.vstack(cj.normalise(q, k))
    ours = cj.project(*cj.normalise(q, k), "pca")
    ref = PCA(n_components=2, svd_solver="full").fit_transform(x)
    for axis in range(2):  # an axis's sign is a convention
        sign = np.sign(ours[:, axis] @ ref[:, axis])
        np.testing.assert_allclose(ours[:, axis], sign * ref[:, axis], atol=1e-8)


def test_tsne_and_unknown_projection():
    q, k = _qk(40, 8)
    xy = cj.joint_embedding(q, k, "tsne")
    assert xy.shape == (80, 2) and np.isfinite(xy).all() and xy.std(0).min() > 0
    with pytest.raises(ValueError):
        cj.joint_embedding(q, k, "mds")


def test_umap_missing_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "umap", None)  # as if umap-learn were not installed
    q, k = _qk(20, 4)
    with pytest.raises(cj.ProjectionUnavailable, match="pip install"):
        cj.joint_embedding(q, k, "umap")


def _rows():
    sents = [["[CLS]", "the", "<b>", "dog", "[SEP]"], ["a", "cat"]]
    return pd.DataFrame([(s, p, t) for s, toks in enumerate(sents) for p, t in enumerate(toks)],
                        columns=["sentence_id", "position", "token"])


def test_scatter_points_hover_and_click_data():
    rows = _rows()
    xy = np.arange(2 * len(rows) * 2, dtype=float).reshape(-1, 2)
    fig = vc.joint_scatter(xy, rows).to_dict()
    qs, ks = fig["data"]
    assert qs["type"] == ks["type"] == "scatter" and qs["name"] == "queries" and ks["name"] == "keys"
    assert qs["marker"]["color"] != ks["marker"]["color"]
    np.testing.assert_array_equal(decode_array(ks["x"]), xy[len(rows):, 0])
    cd = decode_array(ks["customdata"])
    assert cd[3].tolist() == [0, 3, 1] and decode_array(qs["customdata"])[6].tolist() == [1, 1, 0]
    # the hovered token is marked inside its sentence, and tokens are escaped, never HTML
    assert qs["hovertext"][3].endswith("[CLS] the &lt;b&gt; <b>[dog]</b> [SEP]")
    assert "<b>[&lt;b&gt;]</b>" in ks["hovertext"][2]
    assert vc.picked_point([{"customdata": cd[3].tolist()}]) == {"sentence_id": 0, "position": 3, "is_key": True}


def test_colour_by_position_and_token():
    rows = _rows()
    xy = np.zeros((2 * len(rows), 2))
    pos = vc.joint_scatter(xy, rows, color_by="position").to_dict()["data"][0]["marker"]["color"]
    assert list(decode_array(pos)) == list(rows.position)
    mk = vc.joint_scatter(xy, rows, color_by="token").to_dict()["data"][0]["marker"]
    codes = decode_array(mk["color"]).astype(int)  # colour codes on a discrete colorscale

    def colour(code):
        v = (code - mk["cmin"]) / (mk["cmax"] - mk["cmin"])
        return next(c for (a, c), (b, _) in zip(mk["colorscale"][::2], mk["colorscale"][1::2]) if a <= v <= b)

    colours = [colour(c) for c in codes]
    assert len(set(colours)) == len(set(rows.token))  # 7 tokens, fewer than the palette: one colour each
    assert {t: c for t, c in zip(rows.token, colours)} == {t: colours[list(rows.token).index(t)] for t in rows.token}
    assert set(colours) == set(vc.TOKEN_PALETTE[:7])


def test_small_multiples_one_panel_per_head():
    xys = [np.random.default_rng(h).normal(size=(20, 2)) for h in range(6)]
    fig = vc.head_multiples(xys, 10, n_cols=4).to_dict()
    assert len(fig["data"]) == 12
    assert {int(decode_array(t["customdata"]).reshape(-1)[0]) for t in fig["data"]} == set(range(6))
    assert vc.picked_head([{"customdata": [4]}]) == 4 == vc.picked_head([{"customdata": {"0": 4}}])


def test_picked_point_from_the_browser_forms():
    rows = _rows()
    assert vc.picked_point([{"customdata": {"0": 1, "1": 0, "2": 1}}]) == {"sentence_id": 1, "position": 0, "is_key": True}
    assert vc.picked_point([{"point_index": 6, "curve_number": 0}], rows) == {"sentence_id": 1, "position": 1,
                                                                               "is_key": False}
    assert vc.picked_point([{"point_index": 60}], rows) is None and vc.picked_point([]) is None


def test_scatter_is_svg_up_to_its_limit_and_webgl_above():
    """A few thousand points draw faster as SVG than through WebGL's start-up; more, as WebGL."""
    for n, kind in ((vc.SVG_MAX_POINTS // 2, "scatter"), (vc.SVG_MAX_POINTS // 2 + 1, "scattergl")):
        rows = pd.DataFrame({"sentence_id": np.arange(n) // 10, "position": np.arange(n) % 10, "token": ["t"] * n})
        fig = vc.joint_scatter(np.zeros((2 * n, 2)), rows)
        assert [t.type for t in fig.data] == [kind, kind], n
