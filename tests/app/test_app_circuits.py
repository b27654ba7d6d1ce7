"""The Circuits page under AppTest: a shared link with an expanded head and a checked edge renders
that view with no click (the edges are head_circuit's, the number written on the edge is that edge's
path patch), and URL values that do not fit get a message, not a traceback."""

import json

import numpy as np

import core.analysis as ca
from conftest import assert_no_exception
from viz.circuits import figures as cf

TEXT = "the small dog sees the small cat"


def _fig(at):
    return json.loads(at.get("plotly_chart")[0].proto.spec)


def test_a_shared_link_shows_its_expanded_head_and_its_check(app_test, toy):
    tr = toy.trace(TEXT)
    root = ca.head_circuit(tr, "encoder", 2, 1, depth=1, top=5)
    head = next(s for s in root["source"] if ca.circuits.parse_head(s))
    opened = ca.head_circuit(tr, "encoder", *ca.circuits.parse_head(head), depth=1, top=5)
    edge = cf.head_options(root)[0]
    at = app_test("circuits", model="toy-translate", text=TEXT, layer="2", head="1", open=head, checked=edge)
    at.run()
    assert_no_exception(at)
    assert not at.error
    fig = _fig(at)
    hovers = [h for t in fig["data"] if t.get("name", "").endswith("side") for h in t["hovertext"]]
    assert len(hovers) == len(root) + len(opened)
    for row in root.itertuples():  # every edge's hover carries its own weight
        assert any(h.startswith(f"{row.source} → {row.target} ({row.side}): weight {row.weight:+.4g}") for h in hovers)
    src, dst, side = cf.parse_edge(edge)
    ids = list(toy.encode(TEXT).ids)
    corrupt = ids[:1] + [int(t) for t in np.random.default_rng(0).permutation(ids[1:])]
    pp = ca.path_patch(toy, ids, corrupt, ca.circuits.parse_head(src), ca.circuits.parse_head(dst), side,
                       stack="encoder")
    notes = [a["text"] for a in fig["layout"].get("annotations", [])]
    assert cf.patch_label(pp.attrs) in notes, notes
    assert at.query_params["checked"] in (edge, [edge]) and at.query_params["open"] in (head, [head])


def test_values_that_do_not_fit_say_so(app_test):
    at = app_test("circuits", model="toy-translate", text=TEXT, layer="9", head="x", open="nonsense,L9H9",
                  edge="not-an-edge", checked="L0H0>L9H9:key", score="nope")
    at.run()
    assert_no_exception(at)
    warned = " ".join(w.value for w in at.warning)
    assert "layer" in warned and "score" in warned and "open" in warned and "checked" in warned
    assert "open" not in at.query_params and "checked" not in at.query_params
