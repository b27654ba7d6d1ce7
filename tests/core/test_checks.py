"""The numbers handed to core.analysis are checked strictly and in one place (core/analysis/_checks.py):
a bool is not a number, a non-integer position is refused (not rounded), an out-of-range one too,
and every message quotes what was given. One tiny random Llama (2 layers, 8 heads) serves every
public function here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import core
import core.analysis as ca
from core.analysis import _checks as checks
from core.analysis.activation_patching import restore_check
from core.analysis.token_ids import output_token_id

TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hf_builders import build

    hf, folder = build("llama", tmp_path_factory.mktemp("checks-llama"))
    hf.save_pretrained(str(folder), safe_serialization=True)
    model = core.load_model(str(folder), device="cpu")
    return model, model.trace(TEXT)


# ------------------------------------------------------------------ the helper itself
@pytest.mark.parametrize("value", [3, np.int64(3), torch.tensor(3)])
def test_whole_numbers_of_any_integer_type_pass(value):
    assert checks.whole(value, "x") == 3 and type(checks.whole(value, "x")) is int


@pytest.mark.parametrize("value,shown", [(True, "True or False"), (False, "True or False"), (1.7, "1.7"),
                                         (2.0, "2.0"), ("3", "'3'"), (None, "None"), (np.float64(1.5), "1.5"),
                                         (torch.tensor(1.0), "tensor(1.)")])
def test_bools_floats_and_strings_are_refused_quoting_them(value, shown):
    with pytest.raises(ValueError, match="must be a whole number") as e:
        checks.whole(value, "the budget")
    assert f"(got {shown})" in str(e.value)


def test_positions_count_from_the_end_and_quote_what_was_given():
    assert checks.position(-1, 6) == 5 and checks.position(0, 6) == 0 and checks.position(np.int32(-6), 6) == 0
    for bad in (6, -7, -99):
        with pytest.raises(ValueError, match=f"key {bad} is outside the 6 positions"):
            checks.position(bad, 6, "key")
    with pytest.raises(ValueError, match=r"at least 1 \(got 0\)"):
        checks.whole(0, "steps", lo=1)
    with pytest.raises(ValueError, match=r"layer 2 is outside 0 to 1"):
        checks.index(2, 2, "layer")
    with pytest.raises(ValueError, match=r"layer -1 is outside 0 to 1"):  # layers and heads do not wrap
        checks.index(-1, 2, "layer")


# ------------------------------------------------------------------ every public function
def test_evict_refuses_bools_and_fractions(tiny):
    model, _ = tiny
    for kw, what in ((dict(budget=True), "budget"), (dict(budget=7.5), "budget"), (dict(budget=4, sinks=True), "sinks"),
                     (dict(budget=4, recent=1.5), "recent"), (dict(budget=4, observe=False), "observe"),
                     (dict(budget=np.float32(4)), "budget")):
        with pytest.raises(ValueError, match=f"{what}.*must be a whole number"):
            ca.evict(model, TEXT, "h2o", **kw)
    assert len(ca.evict(model, TEXT, "window", np.int64(3))) == len(model.encode(TEXT).ids)  # a numpy integer is one


def test_score_and_pattern_attribution_refuse_loose_positions(tiny):
    model, tr = tiny
    n = len(tr.tokens("target"))
    with pytest.raises(ValueError, match=r"query must be a whole number \(got 1.7\)"):
        ca.score_attribution(tr, "decoder", 1, 0, query=1.7, key=0)
    with pytest.raises(ValueError, match=rf"key -99 is outside the {n} positions"):
        ca.score_attribution(tr, "decoder", 1, 0, query=3, key=-99)
    with pytest.raises(ValueError, match=r"versus key must be a whole number \(got True or False\)"):
        ca.score_attribution(tr, "decoder", 1, 0, query=3, key=1, versus=True)
    with pytest.raises(ValueError, match=r"head must be a whole number \(got True or False\)"):
        ca.score_attribution(tr, "decoder", 1, True, query=3, key=1)
    with pytest.raises(ValueError, match=r"layer \(of the decoder\) 2 is outside 0 to 1"):
        ca.pattern_attribution(tr, "decoder", 2, 0)
    with pytest.raises(ValueError, match=r"layer \(of the decoder\) must be a whole number \(got 1.0\)"):
        ca.pattern_attribution(tr, "decoder", 1.0, 0)
    df = ca.score_attribution(tr, "decoder", 1, 0, query=-1, key=np.int64(2))  # the last query, a numpy key
    assert df.attrs["query"] == n - 1 and df.attrs["key"] == 2


def test_logit_attribution_and_the_lens_refuse_loose_positions_and_tokens(tiny):
    model, tr = tiny
    n = len(tr.tokens("target"))
    for pos, msg in ((True, r"position must be a whole number \(got True or False\)"),
                     (1.5, r"position must be a whole number \(got 1.5\)"),
                     (-99, rf"position -99 is outside the {n} positions")):
        with pytest.raises(ValueError, match=msg):
            ca.logit_attribution(tr, 5, position=pos)
    with pytest.raises(ValueError, match=r"target token must be a token \(a string\) or its id"):
        ca.logit_attribution(tr, 5.0)
    with pytest.raises(ValueError, match="target token id must be a whole number"):
        ca.logit_attribution(tr, True)
    with pytest.raises(ValueError, match=r"position must be a whole number \(got True or False\)"):
        ca.lens(tr, positions=[0, True])
    with pytest.raises(ValueError, match=rf"position {n} is outside"):
        ca.lens(tr, positions=[n])
    with pytest.raises(ValueError, match=r"k \(candidates a row\) must be a whole number \(got 2.5\)"):
        ca.lens(tr, k=2.5)
    with pytest.raises(ValueError, match="target token id must be a whole number"):
        ca.lens(tr, target=False)
    assert output_token_id(model, np.int64(7)) == 7
    assert len(ca.lens(tr, positions=[-1], k=2)) == tr.layers("decoder") + 1


def test_attribution_patching_and_head_scores_refuse_loose_numbers(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match=r"steps must be a whole number \(got True or False\)"):
        ca.attribute(model, TEXT, "integrated_gradients", steps=True)
    with pytest.raises(ValueError, match=r"steps must be a whole number \(got 2.5\)"):
        ca.attribute(model, TEXT, "integrated_gradients", steps=2.5)
    with pytest.raises(ValueError, match=r"position 1 is not its last position"):
        ca.attribute(model, TEXT, "occlusion", position=1)
    with pytest.raises(ValueError, match=r"position must be a whole number \(got 0.5\)"):
        ca.attribute(model, TEXT, "occlusion", position=0.5)
    assert len(ca.attribute(model, TEXT, "occlusion", position=-1)) == len(model.encode(TEXT).ids)
    corrupt = "the small cat sees the dog"
    with pytest.raises(ValueError, match=r"batch_tokens must be a whole number \(got True or False\)"):
        ca.patch(model, TEXT, corrupt, 5, batch_tokens=True)
    with pytest.raises(ValueError, match=r"layer must be a whole number \(got 0.0\)"):
        restore_check(model, TEXT, corrupt, 5, layer=0.0)
    with pytest.raises(ValueError, match=r"answer token id must be a whole number \(got True or False\)"):
        ca.patch(model, TEXT, corrupt, True)
    with pytest.raises(ValueError, match=r"r \(the repeated sequence's length\) must be a whole number"):
        ca.head_scores(model, TEXT, r=True)
    with pytest.raises(ValueError, match=r"k \(heads\) must be a whole number \(got 1.5\)"):
        ca.top_heads(ca.head_scores(model, TEXT, r=4), "self", 1.5)
