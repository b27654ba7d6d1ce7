"""The Playground page through AppTest: every tab renders (only the open one runs), the
by-hand editor drives the output, bad cells warn without losing state, and layer/head live in
the URL."""


import numpy as np

import core
from conftest import assert_no_exception, chart_by_key, figure, heatmap_z
from viz.playground.controls_panel import PLAY_TABS

LONG_TEXT = " ".join(["the small dog sees the cat"] * 100)  # 600 words
EDIT = "playground.Q.v0"


def softmax_rows(a):
    e = np.exp(a - a.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def warnings(at):
    return [w.value for w in at.warning]


def open_tab(at, slug: str):
    """Click a tab: the page runs again with that tab open (st.tabs on_change="rerun")."""
    at.session_state["playground.tab"] = PLAY_TABS[slug]
    at.run()
    assert_no_exception(at)


def chart_keys(at):
    return {c.proto.id.split("-", 2)[-1] for c in at.get("plotly_chart")}


def test_default_view_computes_the_notes_example(app_test):
    at = app_test("playground")
    at.run()
    assert_no_exception(at)
    w = heatmap_z(chart_by_key(at, "playground-hand-weights"))
    assert np.round(w, 2).tolist() == [[0.62, 0.38], [0.22, 0.78]]
    frames = [df.value for df in at.table]
    softmax = next(f for f in frames if f.shape == (2, 2) and abs(float(f.iloc[0, 0]) - 0.6225) < 1e-4)
    assert softmax.round(4).to_numpy().tolist() == [[0.6225, 0.3775], [0.2227, 0.7773]]
    assert any("A1 (q1 (help)) = 0.6225 v1 + 0.3775 v2" in c.value for c in at.text)
    assert at.query_params["model"] == "toy-translate"
    # only the open tab's charts are drawn; each other tab draws its own when opened
    assert not [c for c in at.get("plotly_chart") if "playground-pfree" in c.proto.id]
    for slug, keys in {"free": ["playground-pfree"], "symmetric": ["playground-sym-scores", "playground-learned-scores"],
                       "scale": ["playground-scaling-std", "playground-scaling-entropy"]}.items():
        open_tab(at, slug)
        for key in keys:
            chart_by_key(at, key)
        assert not [c for c in at.get("plotly_chart") if "playground-hand-weights" in c.proto.id]
        assert at.query_params["tab"] == slug


def test_editing_q_changes_the_output(app_test):
    at = app_test("playground")
    at.run()
    before = heatmap_z(chart_by_key(at, "playground-hand-weights"))
    # q1: feature 2 from 1 to 5, so q1.k1 = 10 instead of 6
    at.session_state[EDIT] = {"edited_rows": {0: {"2": 5.0}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert_no_exception(at)
    after = heatmap_z(chart_by_key(at, "playground-hand-weights"))
    assert not np.allclose(before, after)
    assert np.allclose(after[0], softmax_rows(np.array([[10 / 4, 4 / 4]]))[0], atol=1e-9)
    assert np.allclose(after[1], before[1])
    assert warnings(at) == []


def test_bad_cell_warns_and_keeps_the_edits(app_test):
    at = app_test("playground")
    at.run()
    at.session_state[EDIT] = {"edited_rows": {0: {"2": None}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert_no_exception(at)
    assert any("not finite numbers" in w and "column 2" in w for w in warnings(at))
    assert at.session_state[EDIT]["edited_rows"]  # the user's edit is still there
    # a row added to K without a value in V: a shape message, not a traceback
    at.session_state[EDIT] = {"edited_rows": {}, "added_rows": [], "deleted_rows": []}
    at.session_state["playground.K.v0"] = {"edited_rows": {},
                                           "added_rows": [{"token": "k3", **{str(c): 1.0 for c in range(1, 17)}}],
                                           "deleted_rows": []}
    at.run()
    assert_no_exception(at)
    assert any("each key needs exactly one value" in w for w in warnings(at))
    open_tab(at, "free")  # other tabs still work
    chart_by_key(at, "playground-pfree")


def test_reset_restores_the_notes_example(app_test):
    at = app_test("playground")
    at.run()
    at.session_state[EDIT] = {"edited_rows": {1: {"7": -3.0}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert not np.allclose(heatmap_z(chart_by_key(at, "playground-hand-weights"))[1], [0.2227, 0.7773], atol=1e-4)
    at.button(key="playground.hand_reset").click()
    at.run()
    assert_no_exception(at)
    w = heatmap_z(chart_by_key(at, "playground-hand-weights"))
    assert np.round(w, 4).tolist() == [[0.6225, 0.3775], [0.2227, 0.7773]]


def test_unscaled_toggle(app_test):
    at = app_test("playground")
    at.run()
    at.toggle(key="playground.hand_scaled").set_value(False)
    at.run()
    w = heatmap_z(chart_by_key(at, "playground-hand-weights"))
    assert np.allclose(w, softmax_rows(np.array([[6.0, 4.0], [3.0, 8.0]])), atol=1e-9)


def test_parameter_free_map_is_softmax_x_xt(app_test):
    text = "the small dog sees the cat"
    at = app_test("playground", text=text, tab="free")
    at.run()
    tr = core.load_model("toy-translate", device="cpu").trace(text)
    X = tr["embed.encoder.sum"].double().numpy()
    z = heatmap_z(chart_by_key(at, "playground-pfree"))
    assert np.allclose(z, softmax_rows(X @ X.T), atol=1e-6)
    at.radio(key="playground.pf_x").set_value("tokens")
    at.run()
    Xt = tr["embed.encoder.tokens"].double().numpy()
    z = heatmap_z(chart_by_key(at, "playground-pfree"))
    assert np.allclose(z, softmax_rows(Xt @ Xt.T), atol=1e-6)
    assert abs(z[0, 0] - z[0, 4]) < 1e-6  # the two "the" rows are identical without positions


def test_symmetric_scores_are_symmetric(app_test):
    at = app_test("playground", layer="1", head="2", tab="symmetric")
    at.run()
    assert_no_exception(at)
    sym = heatmap_z(chart_by_key(at, "playground-sym-scores"))
    learned = heatmap_z(chart_by_key(at, "playground-learned-scores"))
    assert np.allclose(sym, sym.T, atol=1e-9)
    assert np.abs(learned - learned.T).max() > 1e-3
    assert any("learned scores shown equal Q Kᵀ × scale recomputed in float64 numpy" in s.value for s in at.success)
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="playground.layer").value == 1 and at.selectbox(key="playground.head").value == 2
    assert at.query_params["layer"] == "1" and at.query_params["head"] == "2"


def test_url_round_trip_and_bad_values(app_test):
    at = app_test("playground", layer="9", head="x", text="the dog sees the cat", tab="symmetric")
    at.run()
    assert_no_exception(at)
    w = " ".join(warnings(at))
    assert "out of range" in w and "not a whole number" in w
    assert dict(at.query_params) == {"model": "toy-translate", "text": "the dog sees the cat", "layer": "2", "head": "0",
                                     "tab": "symmetric"}


def test_empty_text(app_test):
    at = app_test("playground", text="")
    at.run()
    assert_no_exception(at)
    assert any("empty" in w for w in warnings(at))
    heatmap_z(chart_by_key(at, "playground-hand-weights"))  # the other tabs do not need a sentence
    open_tab(at, "scale")
    chart_by_key(at, "playground-scaling-std")


def test_600_token_text(app_test):
    at = app_test("playground", text=LONG_TEXT, tab="free")
    at.run()
    assert_no_exception(at)
    assert any("cut" in w for w in warnings(at))
    assert heatmap_z(chart_by_key(at, "playground-pfree")).shape == (64, 64)


def test_hyper_parameters_count(app_test):
    at = app_test("playground", tab="sizes")
    at.run()
    at.select_slider(key="playground.hp_d").set_value(128)
    at.select_slider(key="playground.hp_H").set_value(8)
    at.slider(key="playground.hp_L").set_value(3)
    at.selectbox(key="playground.hp_kind").set_value("encoder-decoder")
    at.run()
    assert_no_exception(at)
    cfg = core.ModelConfig(kind="encoder-decoder", d_model=128, n_heads=8, d_ff=256, n_layers=3, max_len=256,
                           src_vocab_size=190, tgt_vocab_size=190)
    expected = f"{core.Transformer(cfg).num_parameters():,}"
    values = {m.label: m.value for m in at.metric}
    assert values["core: Transformer(cfg).num_parameters()"] == expected
    assert values["the formula below"] == expected and values["difference"] == "0"
    assert any("agree" in s.value for s in at.success)


def test_build_random_model_on_request(app_test):
    at = app_test("playground", text="the dog sees the cat", tab="sizes")
    at.run()
    assert not [c for c in at.get("plotly_chart") if "playground-random-attn" in c.proto.id]
    at.button(key="playground.hp_build").click()
    at.run()
    assert_no_exception(at)
    w = heatmap_z(chart_by_key(at, "playground-random-attn"))
    assert w.shape == (5, 5) and np.allclose(w.sum(1), 1.0, atol=1e-5)


def test_cost_measurement_on_button(app_test):
    at = app_test("playground", tab="cost")
    at.run()
    assert any("Press Measure" in i.value for i in at.info)
    at.select_slider(key="playground.cost_n").set_value(128)
    at.select_slider(key="playground.cost_d").set_value(128)
    at.run()
    at.button(key="playground.cost_run").click()
    at.run()
    assert_no_exception(at)
    fig = chart_by_key(at, "playground-cost")
    assert fig is not None
    assert any("Fitted" in m.value for m in at.markdown)
    at.run()  # the result stays after a rerun
    chart_by_key(at, "playground-cost")


def test_edited_tables_go_in_the_url_and_come_back(app_test):
    """Q, K, V as edited are in the URL (only when edited); a fresh session opened on it starts
    its editors from them and draws the same weights. A table the URL garbles is named, and the
    notes' one is used."""
    at = app_test("playground")
    at.run()
    assert not any(k.startswith("hand_") for k in at.query_params)
    at.session_state[EDIT] = {"edited_rows": {0: {"2": 5.0}}, "added_rows": [], "deleted_rows": []}
    at.run()
    edited = heatmap_z(chart_by_key(at, "playground-hand-weights"))
    url = dict(at.query_params)
    assert set(k for k in url if k.startswith("hand_")) == {"hand_q"}
    again = app_test("playground", **url)
    again.run()
    assert_no_exception(again)
    assert np.allclose(heatmap_z(chart_by_key(again, "playground-hand-weights")), edited, atol=1e-12)
    assert dict(again.query_params) == url
    bad = app_test("playground", hand_q='[["q1",1,2],["q2",3]]')
    bad.run()
    assert_no_exception(bad)
    assert any("The URL's hand_q=" in w and "replaced by the notes' Q: its rows differ in length" in w
               for w in warnings(bad)), warnings(bad)
    assert np.round(heatmap_z(chart_by_key(bad, "playground-hand-weights")), 4).tolist() == \
        [[0.6225, 0.3775], [0.2227, 0.7773]]


def test_in_tab_controls_go_in_the_url_and_come_back(app_test):
    text = "the small dog sees the cat"
    at = app_test("playground", text=text)
    at.run()
    at.toggle(key="playground.hand_scaled").set_value(False)
    at.run()
    open_tab(at, "free")
    at.toggle(key="playground.pf_scale").set_value(True)
    at.radio(key="playground.pf_x").set_value("tokens")
    at.run()
    open_tab(at, "symmetric")
    at.selectbox(key="playground.sym_stack").set_value("decoder")
    at.run()
    open_tab(at, "scale")
    at.select_slider(key="playground.sc_keys").set_value(64)
    at.number_input(key="playground.sc_seed").set_value(7)
    at.run()
    open_tab(at, "cost")
    at.select_slider(key="playground.cost_n").set_value(256)
    at.run()
    open_tab(at, "sizes")  # a control set in a closed tab keeps its value
    at.select_slider(key="playground.hp_d").set_value(128)
    at.select_slider(key="playground.hp_H").set_value(8)
    at.selectbox(key="playground.hp_pos").set_value("rope")
    at.slider(key="playground.hp_L").set_value(3)
    at.run()
    at.button(key="playground.hp_build").click()
    at.run()
    assert_no_exception(at)
    url = dict(at.query_params)
    assert url["tab"] == "sizes"
    assert {k: url.get(k) for k in ("hand_scaled", "pf_scale", "pf_x", "sym_stack", "sc_keys", "sc_seed", "hp_d",
                                    "hp_H", "hp_pos", "hp_L", "cost_n", "hp_built", "hp_kind")} == {
        "hand_scaled": "0", "pf_scale": "1", "pf_x": "tokens", "sym_stack": "decoder", "sc_keys": "64",
        "sc_seed": "7", "hp_d": "128", "hp_H": "8", "hp_pos": "rope", "hp_L": "3", "cost_n": "256", "hp_built": "1",
        "hp_kind": None}  # at its default: left out
    again = app_test("playground", **url)
    again.run()
    assert_no_exception(again)
    assert not warnings(again)
    assert dict(again.query_params) == url
    for slug, key in (("sizes", "playground-random-attn"), ("hand", "playground-hand-weights"),
                      ("free", "playground-pfree"), ("symmetric", "playground-sym-scores"),
                      ("scale", "playground-scaling-std")):
        open_tab(at, slug)
        open_tab(again, slug)
        mine, theirs = figure(chart_by_key(at, key)), figure(chart_by_key(again, key))
        assert [[t.get(a) for a in "xyz"] for t in mine["data"]] == [[t.get(a) for a in "xyz"] for t in theirs["data"]]
    assert {k: v for k, v in again.query_params.items() if k != "tab"} == {k: v for k, v in url.items() if k != "tab"}


def test_bad_in_tab_values_in_the_url(app_test):
    at = app_test("playground", hp_d="100", hp_H="3", sc_seed="-1", pf_x="rows", sym_stack="encoder", hp_bias="maybe")
    at.run()
    assert_no_exception(at)
    w = " ".join(warnings(at))
    for said in ("The URL's hp_d=100 is replaced by 64", "The URL's hp_H=3 is replaced by 4",
                 "The URL's sc_seed=-1 is replaced by 0: sc_seed -1 is out of range (0–10000)",
                 "The URL's pf_x='rows' is replaced by 'sum'", "The URL's hp_bias='maybe' is replaced by on"):
        assert said in w, (said, w)
    assert "sym_stack" not in w  # toy-translate has an encoder: taken
    open_tab(at, "symmetric")
    assert at.selectbox(key="playground.sym_stack").value == "encoder"
