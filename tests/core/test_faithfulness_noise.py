"""The faithfulness test honest about noise (issue 41): random is a distribution of seeded
draws with a spread, each method's margin over random is read against it, equal scores share
a rank, and "hold the first token fixed" holds it in the perturbed inputs too. Numbers are
recomputed here with transformers' own GPT-2 (inputs_embeds), run one input at a time."""

import numpy as np
import pytest
import torch

import core
import core.analysis as ca
from core.analysis import faithfulness_scores as F
from hf_builders import build, save

pytest.importorskip("transformers")
pytest.importorskip("captum")

TEXT = "alice gave the tired cat a book because it"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    hf, folder = build("gpt2", tmp_path_factory.mktemp("gpt2"))
    save(hf, folder)
    return hf.float().eval(), core.load_model(str(folder), device="cpu")


def _p(hf, ids, bid, target, replaced):
    wte = hf.transformer.wte
    with torch.no_grad():
        x = wte(ids).clone()
        x[:, list(replaced)] = wte(torch.tensor([[bid]]))[0, 0]
        return torch.softmax(hf(inputs_embeds=x).logits[0, -1], -1)[target].item()


def _comp_suff(hf, ids, bid, target, order, fractions, n_free):
    full = _p(hf, ids, bid, target, [])
    ks = [max(1, int(f * n_free + 0.5)) for f in fractions]
    comp = np.mean([full - _p(hf, ids, bid, target, order[:k]) for k in ks])
    suff = np.mean([full - _p(hf, ids, bid, target, order[k:]) for k in ks])
    return comp, suff


def test_random_is_a_distribution_of_seeded_draws_with_its_spread(gpt2):
    hf, ours = gpt2
    fractions = (0.2, 0.5)
    df = ca.faithfulness(ours, TEXT, methods=["occlusion", "attention"], fractions=fractions, steps=4, draws=6)
    ids = torch.tensor([ours.encode(TEXT).ids])
    n, bid, target = ids.shape[1], df.attrs["baseline_token_id"], df.attrs["target_id"]
    draws = df.attrs["random_draws"]
    assert [d["seed"] for d in draws] == list(range(6))
    diffs = []
    for d in draws:  # each draw recomputed from its own seeded permutation
        perm = np.random.default_rng(d["seed"]).permutation(n)
        order = sorted(range(n), key=lambda i: (-perm[i], i))
        comp, suff = _comp_suff(hf, ids, bid, target, order, fractions, n)
        assert d["comprehensiveness"] == pytest.approx(comp, abs=1e-5)
        assert d["sufficiency"] == pytest.approx(suff, abs=1e-5)
        diffs.append(comp - suff)
    t = df.set_index("method")
    assert t.loc["random", "difference"] == pytest.approx(np.mean(diffs), abs=1e-5)
    assert t.loc["occlusion", "random_sd"] == pytest.approx(np.std(diffs, ddof=1), abs=1e-5)
    assert np.std(diffs) > 0  # the draws do differ: one draw alone would have hidden that
    margin = t.loc["occlusion", "difference"] - np.mean(diffs)
    assert t.loc["occlusion", "margin"] == pytest.approx(margin, abs=1e-5)
    want = ("indistinguishable from random" if abs(margin) <= F.NOISE_SDS * np.std(diffs, ddof=1)
            else "above random" if margin > 0 else "below random")
    assert t.loc["occlusion", "verdict"] == want


def test_hold_the_first_token_fixed_holds_it_in_the_perturbed_inputs(gpt2):
    hf, ours = gpt2
    fractions = (0.2, 0.5)
    df = ca.faithfulness(ours, TEXT, methods=["occlusion"], fractions=fractions, steps=4, fix_first=True, draws=3)
    ids = torch.tensor([ours.encode(TEXT).ids])
    n, bid, target = ids.shape[1], df.attrs["baseline_token_id"], df.attrs["target_id"]
    assert df.attrs["n_free"] == n - 1 and df.attrs["fixed"] == [0]
    occ = np.array(df.attrs["scores"]["occlusion"])
    order = sorted(range(1, n), key=lambda i: (-occ[i], i))  # token 0 never replaced
    comp, suff = _comp_suff(hf, ids, bid, target, order, fractions, n - 1)
    row = df.set_index("method").loc["occlusion"]
    assert row["comprehensiveness"] == pytest.approx(comp, abs=1e-5)
    assert row["sufficiency"] == pytest.approx(suff, abs=1e-5)
    assert len(df.attrs["curves"]["occlusion"]) == n  # k = 0 .. n - 1


def test_equal_rankings_are_ties_not_an_order(gpt2):
    _, ours = gpt2
    s = ca.input_attribution.setup(ours, TEXT)
    same = np.arange(s.n, dtype=float)[::-1]
    df = F.faithfulness_from_scores(s, {"a": same, "b": same.copy(), "c": -same}, draws=4)
    t = df.set_index("method")
    assert t.loc["a", "rank"] == t.loc["b", "rank"] and t.loc["a", "tied"] and t.loc["b", "tied"]
    assert t.loc["a", "difference"] == t.loc["b", "difference"]
    assert not t.loc["c", "tied"] or t.loc["c", "difference"] == pytest.approx(t.loc["a", "difference"], abs=F.TIE_TOL)


def test_verdict_reads_the_margin_against_the_spread():
    assert F.verdict(0.3, 0.1) == "above random"
    assert F.verdict(0.19, 0.1) == "indistinguishable from random"
    assert F.verdict(-0.25, 0.1) == "below random"
    assert F.verdict(0.0, 0.0) == "indistinguishable from random"
