"""One layer convention (issue 41): block k's heads are LkHh and the stream after block k is
"after Lk" in the lens's axis, its hovers and its CSV; the attribution CSV's `block` is the
same k; patching's resid_pre rows say which stream they are. On smollm2's indirect-object
sentence, each head's row held against a float64 reference written in the tests
(tests/dla_reference.py): the head at block k, head h is the one labelled LkHh."""

import numpy as np
import pytest

import core.analysis as ca
from conftest import assert_no_exception, chart_by_key, figure
from dla_reference import head_contributions
from viz.lens import figures as lf
from viz.patching import figures as pm

IOI = "When Mary and John went to the store, John gave a drink to"


@pytest.fixture(scope="module")
def trace(smollm2):
    return smollm2.trace(IOI)


def test_lens_axis_and_hover_name_the_same_row_the_same_way(trace):
    lens = ca.lens(trace, target=" Mary")
    fig = lf.lens_grid(lens).to_plotly_json()
    heat = fig["data"][0]
    hover = np.asarray(heat["customdata"])
    ticks = dict(zip(fig["layout"]["yaxis"]["tickvals"], fig["layout"]["yaxis"]["ticktext"]))
    n_blocks = trace.layers("decoder")
    assert hover.shape[0] == n_blocks + 1 == 31
    for row in range(n_blocks + 1):  # the row of lens layer i is the stream after block i - 1
        want = "embed" if row == 0 else f"after L{row - 1}"
        assert all(h.startswith(want) for h in hover[row]), (row, hover[row][0][:40])
        if row in ticks:
            assert ticks[row].startswith(want), (row, ticks[row])
    assert ticks[30] == "after L29 = output" and hover[30][0].startswith("after L29 = output")
    assert not any("layer 29" in h for h in hover.ravel())


def test_the_csvs_name_blocks_the_same_way(trace):
    lens = lf.lens_table(ca.lens(trace, target=" Mary"))
    assert "layer" not in lens.columns and {"after_block", "stream"} <= set(lens.columns)
    assert lens["after_block"].min() == -1 and set(lens.loc[lens.after_block == -1, "stream"]) == {"embed"}
    assert set(lens.loc[lens.after_block == 23, "stream"]) == {"after L23"}
    attr = lf.attribution_table(ca.logit_attribution(trace, " Mary", baseline=" John"))
    assert "layer" not in attr.columns and {"block", "head", "label"} <= set(attr.columns)
    ref, tol = head_contributions(trace.model, trace, " Mary", " John", bound=True)
    heads = attr[attr.kind == "head"]
    assert len(heads) == ref.numel()
    for row in heads.itertuples():  # each label names its block and head, and holds that head's contribution
        assert row.label == f"L{row.block}H{row.head}"
        assert abs(row.contribution - float(ref[row.block, row.head])) <= float(tol[row.block, row.head])
    top = divmod(int(ref.flatten().argmax()), ref.shape[1])
    assert heads.loc[heads.contribution.idxmax(), "label"] == f"L{top[0]}H{top[1]}"
    assert attr.loc[attr.kind == "embed", "block"].tolist() == [-1]
    assert attr.loc[attr.kind == "mlp", "label"].iloc[5] == "L5 MLP"


def test_patching_resid_pre_rows_say_which_stream():
    assert pm.row_label(16, "resid_pre") == "into L16 (after L15)" and pm.row_label(0, "resid_pre") == "into L0 (embed)"
    assert pm.row_label(16, "attn_out") == "L16"
    import pandas as pd

    df = pd.DataFrame({"layer": [0, 0, 1, 1], "position": [0, 1, 0, 1], "head": [-1] * 4, "restored": [0.0, 1, 0.5, 0.2]})
    fig = pm.restored_heatmap(df, ["a", "b"], what="resid_pre").to_plotly_json()
    assert list(fig["layout"]["yaxis"]["ticktext"]) == ["into L0 (embed)", "into L1 (after L0)"]
    assert fig["data"][1]["text"][2].startswith("into L1 (after L0)")


def test_the_lens_page_states_the_convention(app_test, smollm2):
    at = app_test("lens", model="smollm2", text=IOI, target=" Mary", baseline=" John")
    at.run(timeout=600)
    assert_no_exception(at)
    assert any("**after L23** is the residual stream after block 23" in m.value for m in at.markdown)
    labels = [str(el.proto.label) for el in at.get("page_link")]
    ref = head_contributions(smollm2, smollm2.trace(IOI), " Mary", " John")
    layer, head = divmod(int(ref.flatten().argmax()), ref.shape[1])  # the head that writes ' Mary' most
    assert any(lab.startswith(f"L{layer}H{head} (layer {layer} · head {head})") for lab in labels), labels
    ticks = figure(chart_by_key(at, "lens-grid"))["layout"]["yaxis"]["ticktext"]
    assert ticks[0] == "embed" and ticks[-1] == "after L29 = output"
