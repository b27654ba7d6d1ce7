"""The patching page under AppTest: the map draws the numbers core.analysis.patch computes, every
control round-trips through the URL, a pair of different token counts gets a message naming both
counts with both tokenisations, a clicked cell opens Explore, and the layer-0 check shows. Also
the pure helpers of viz.patching.figures."""

import numpy as np
import pandas as pd
import pytest

import core.analysis as ca
from conftest import assert_no_exception, chart_by_key, heatmap_z
from viz.patching import figures as pm

TOY_CLEAN, TOY_CORRUPT = "the small dog sees the cat", "the small cat sees the dog"


def _run(app_test, **params):
    at = app_test("patching", **params)
    at.run()
    assert_no_exception(at)
    return at


@pytest.mark.parametrize("what", ["resid_pre", "head"])
def test_map_draws_what_core_computes(app_test, toy, what):
    at = _run(app_test, model="toy-translate", text=TOY_CLEAN, corrupt=TOY_CORRUPT, what=what)
    assert not at.error
    pair = ca.activation_patching.prepare(toy, TOY_CLEAN, TOY_CORRUPT)
    df = ca.patch(toy, TOY_CLEAN, TOY_CORRUPT, pair.clean_next, pair.corrupt_next, what=what)
    z = heatmap_z(chart_by_key(at, "patching-map"))
    np.testing.assert_allclose(z, pm.restored_matrix(df), atol=1e-6)
    assert z.shape == ((3, 4) if what == "head" else (3, len(pair.tokens)))
    assert any("restores 1.000000" in s.value for s in at.success)


def test_smollm2_ioi_is_the_default_view(app_test, smollm2):
    at = _run(app_test, model="smollm2")
    assert at.query_params["text"] == pm.IOI_CLEAN and at.query_params["corrupt"] == pm.IOI_CORRUPT
    assert at.query_params["answer"] == pm.IOI_ANSWER and at.query_params["wrong"] == pm.IOI_WRONG
    df = ca.patch(smollm2, pm.IOI_CLEAN, pm.IOI_CORRUPT, pm.IOI_ANSWER, pm.IOI_WRONG)
    np.testing.assert_allclose(heatmap_z(chart_by_key(at, "patching-map")), pm.restored_matrix(df), atol=1e-5)
    assert any("restores 1.000000" in s.value for s in at.success) and not at.error


def test_every_control_round_trips_through_the_url(app_test, toy):
    params = dict(model="toy-translate", text="the old man sleeps near the river",
                  corrupt="the old dog sleeps near the river", answer="", wrong="", what="mlp_out")
    pair = ca.activation_patching.prepare(toy, params["text"], params["corrupt"])
    params["answer"], params["wrong"] = toy.alternative_strings([pair.clean_next, pair.corrupt_next])
    at = _run(app_test, **params)
    assert dict(at.query_params) == params
    assert at.text_area(key="patching.corrupt").value == params["corrupt"]
    assert at.text_input(key="patching.answer").value == params["answer"]
    assert at.radio(key="patching.what").value == "mlp_out"
    at.radio(key="patching.what").set_value("attn_out").run()
    assert at.query_params["what"] == "attn_out"
    at.text_input(key="patching.wrong").set_value("").run()  # empty: the corrupted translation's token
    assert "wrong" not in at.query_params
    assert any("Measuring" in c.value for c in at.caption)


def test_different_token_counts_name_both_and_show_both_tokenisations(app_test, smollm2):
    at = _run(app_test, model="smollm2", text=pm.IOI_CLEAN, corrupt=pm.IOI_CORRUPT + " the shop")
    assert any("the clean one has 14, the corrupted one 16" in e.value for e in at.error), [e.value for e in at.error]
    captions = [c.value for c in at.caption]
    assert "clean: 14 tokens" in captions and "corrupted: 16 tokens" in captions
    assert not at.get("plotly_chart")
    assert at.query_params["corrupt"] == pm.IOI_CORRUPT + " the shop"  # the user's text is kept


def test_bad_answer_and_encoder_model_get_messages(app_test):
    # as on Lens and Attribution: the URL's token is named with what is used instead, and the grid drawn
    at = _run(app_test, model="toy-translate", text=TOY_CLEAN, corrupt=TOY_CORRUPT, answer="le chat noir")
    assert not at.error, [e.value for e in at.error]
    assert any(w.value.startswith("The URL's answer='le chat noir' is replaced by the model's own choice")
               and "not one" in w.value for w in at.warning), [w.value for w in at.warning]
    assert "answer" not in at.query_params
    chart_by_key(at, "patching-map")
    at.text_input(key="patching.answer").set_value("le chat noir").run()  # typed: said, the box keeps it
    assert any("not one" in w.value and "using the model's own choice on the clean prompt instead" in w.value
               for w in at.warning), [w.value for w in at.warning]
    assert at.query_params["answer"] == "le chat noir" and not at.error
    chart_by_key(at, "patching-map")
    at = _run(app_test, model="minilm")
    assert any("decoders and encoder-decoders" in w.value for w in at.warning)


def test_clicked_cell_opens_explore(app_test, toy):
    at = _run(app_test, model="toy-translate", text=TOY_CLEAN, corrupt=TOY_CORRUPT, what="head")
    from viz.ui.explore_links import explore_params

    at.session_state["patching._open"] = explore_params("toy-translate", TOY_CLEAN, "encoder", 2, 1)
    at.run()
    assert_no_exception(at)
    assert at.query_params["layer"] == "2" and at.query_params["head"] == "1"
    assert at.query_params["attn"] == "encoder.self_attn" and at.query_params["text"] == TOY_CLEAN


# ------------------------------------------------------------------ viz.patching.figures
def test_swap_and_default_corrupt():
    assert pm.default_corrupt(pm.IOI_CLEAN) == pm.IOI_CORRUPT
    assert pm.default_corrupt("When Anna met Tom, she smiled") == "When Anna met Anna, she smiled"
    assert pm.default_corrupt("the small dog sees the cat") == "the small dog sees the cat"
    assert pm.words("the dog's bone, 2 cats") == ["the", "dog's", "bone", "cats"]
    assert pm.swap_word("the dog's bone, 2 cats", 3, "mice") == "the dog's bone, 2 mice"
    with pytest.raises(ValueError):
        pm.swap_word("a b", 2, "c")


def test_heatmap_cells_and_click_targets():
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "position": [-1] * 4, "head": [0, 1, 0, 1],
                       "metric": [1.0, 2, 3, 4], "restored": [0.1, 0.9, -0.2, np.nan]})
    fig = pm.restored_heatmap(df)
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), [[0.1, 0.9], [-0.2, np.nan]])
    cd = np.asarray(fig.data[1].customdata, dtype=float)
    assert [tuple(r[:3]) for r in cd] == [(0, 0, -1), (0, 1, -1), (1, 0, -1), (1, 1, -1)]
    assert pm.cell_pick({"customdata": [1, 0, -1, -0.2]}) == (1, 0, -1)
    assert list(pm.top_cells(df, 2)["restored"]) == [0.9, 0.1]
