"""Input attribution (core.analysis.input_attribution) against a by-hand computation with torch
autograd on transformers' own models: LlamaForCausalLM with smollm2's weights (read from its
GGUF by transformers) and a tiny random GPT2LMHeadModel. Gradient x input, integrated
gradients (the midpoint rule, the same steps) and occlusion agree within 1e-4 relative; the
faithfulness table's numbers are recomputed here from p(target) of perturbed inputs."""

import importlib.util

import numpy as np
import pytest
import torch

import core
import core.analysis as ca
from core.analysis import input_attribution as A
from core.analysis import faithfulness_scores as F
from core.analysis.token_ids import output_token_id
from hf_builders import build, save

pytest.importorskip("transformers")
pytest.importorskip("captum")

REL = 1e-4
STEPS = 8  # integrated gradients' steps in the parity tests (the same rule on both sides)
DEVICE = "cpu"


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def by_hand(embed, logits_of, ids, target, baseline_id, contrast=None, steps=STEPS):
    """grad x input, integrated gradients and occlusion by the definitions, with autograd on a
    transformers model: embed(ids) -> (1, n, d), logits_of(inputs_embeds) -> (B, V) at the last position."""
    n = ids.shape[1]
    with torch.no_grad():
        e = embed(ids).double()
        b = embed(torch.full_like(ids, baseline_id)).double()

    def f(x):
        lg = logits_of(x.float()).double()
        return lg[:, target] - (lg[:, contrast] if contrast is not None else 0)

    x = e.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x).sum(), x)
    gxi = (g * e).sum(-1)[0]
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    path = (b + alphas[:, None, None] * (e - b)).requires_grad_(True)  # (steps, n, d)
    (gp,) = torch.autograd.grad(f(path).sum(), path)
    ig = ((e - b)[0] * gp.mean(0)).sum(-1)
    with torch.no_grad():
        occ = []
        for i in range(n):
            x = e.clone()
            x[:, i] = b[:, i]
            occ.append((f(e) - f(x)).item())
        fx, fb = f(e).item(), f(b).item()
    return {"grad_x_input": gxi.numpy(), "integrated_gradients": ig.numpy(), "occlusion": np.array(occ), "fx": fx, "fb": fb}


def _compare(ours, text, ref, target, contrast=None):
    for method in ("grad_x_input", "integrated_gradients", "occlusion"):
        df = ca.attribute(ours, text, method, target=target, baseline=contrast, steps=STEPS)
        assert list(df.columns) == ["position", "token", "score"]
        err = _rel(df["score"], ref[method])
        assert err < REL, f"{method}: relative difference {err:.2e}"
        if method == "integrated_gradients":
            want = abs(ref[method].sum() - (ref["fx"] - ref["fb"])) / abs(ref["fx"] - ref["fb"])
            assert df.attrs["completeness_error"] == pytest.approx(want, rel=1e-3, abs=1e-5)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    hf, folder = build("gpt2", tmp_path_factory.mktemp("gpt2"))
    save(hf, folder)
    ours = core.load_model(str(folder), device="cpu")
    ours.folder = folder
    return hf.float().eval(), ours


def test_gpt2_matches_autograd_by_hand(gpt2):
    hf, ours = gpt2
    text = "the small dog sees the old cat near the"
    ids = torch.tensor([ours.encode(text).ids])
    bid = A.baseline_token_id(ours)
    target, contrast = 7, 11

    def logits_of(x):
        return hf(inputs_embeds=x).logits[:, -1]

    ref = by_hand(hf.transformer.wte, logits_of, ids, target, bid, contrast)
    _compare(ours, text, ref, target, contrast)
    assert ca.attribute(ours, text, "occlusion", target=target).attrs["baseline_token_id"] == bid


def test_gpt2_refined_integration_is_the_midpoint_rule_at_the_steps_it_reports(gpt2):
    """complete_within=0 never stops early: 8 steps tripled twice reuse the earlier points, and the
    result must be transformers' by-hand midpoint rule at 72 steps (not at 8, nor a mixture)."""
    hf, ours = gpt2
    text = "the small dog sees the old cat near the"
    ids = torch.tensor([ours.encode(text).ids])
    bid = A.baseline_token_id(ours)
    target = 7

    def logits_of(x):
        return hf(inputs_embeds=x).logits[:, -1]

    df = ca.attribute(ours, text, "integrated_gradients", target=target, steps=STEPS, complete_within=0.0)
    assert df.attrs["steps"] == STEPS * 9 and df.attrs["steps_asked"] == STEPS
    ref = by_hand(hf.transformer.wte, logits_of, ids, target, bid, steps=STEPS * 9)
    assert _rel(df["score"], ref["integrated_gradients"]) < REL
    coarse = by_hand(hf.transformer.wte, logits_of, ids, target, bid, steps=STEPS)
    assert _rel(coarse["integrated_gradients"], ref["integrated_gradients"]) > 10 * REL  # the test can tell them apart
    loose = ca.attribute(ours, text, "integrated_gradients", target=target, steps=STEPS, complete_within=10.0)
    assert loose.attrs["steps"] == STEPS  # within the tolerance at once: no refinement


def _smollm2_reference():
    if importlib.util.find_spec("gguf") is None or not core.MODELS["smollm2"].available():
        pytest.skip("smollm2's GGUF or the gguf package is not installed")
    from hf_builders import smollm2_llama

    return smollm2_llama()


@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    return _smollm2_reference(), smollm2


def test_smollm2_matches_llama_for_causal_lm_by_hand(smollm2_pair):
    hf, ours = smollm2_pair
    text = "The capital of France is"
    ids = torch.tensor([ours.encode(text).ids])
    bid = A.baseline_token_id(ours)
    assert bid == ours.tokenizer.info.get("pad_id", bid)
    target = output_token_id(ours, " Paris")

    def logits_of(x):
        return hf(inputs_embeds=x).logits[:, -1]

    ref = by_hand(hf.model.embed_tokens, logits_of, ids, target, bid)
    _compare(ours, text, ref, target)


def test_the_target_defaults_to_the_top_token_and_bad_input_says_why(gpt2, minilm):
    _, ours = gpt2
    text = "the small dog sees the old cat near the"
    s = A.setup(ours, text)
    with torch.no_grad():
        top = int(ours.net.project(ours.net.decode(torch.tensor([ours.encode(text).ids])))[0, -1].argmax())
    assert s.target_id == top
    with pytest.raises(ValueError, match="unknown attribution method"):
        ca.attribute(ours, text, "saliency")
    with pytest.raises(ValueError, match="needs an output"):
        ca.attribute(minilm, "the cat sat on the mat", "occlusion")


def test_faithfulness_numbers_recomputed_from_perturbed_passes(gpt2):
    """Comprehensiveness and sufficiency of one method, recomputed here: p(target) of inputs
    whose top / other tokens carry the baseline token's embedding, run one by one."""
    hf, ours = gpt2
    text = "alice gave the tired cat a book because it"
    fractions = (0.2, 0.5)
    df = ca.faithfulness(ours, text, methods=["occlusion", "attention"], fractions=fractions, steps=4)
    assert set(df["method"]) == {"occlusion", "attention", "random"}
    assert list(df["difference"]) == sorted(df["difference"], reverse=True)
    occ = np.array(df.attrs["scores"]["occlusion"])
    ids = torch.tensor([ours.encode(text).ids])
    n = ids.shape[1]
    bid = df.attrs["baseline_token_id"]
    target = df.attrs["target_id"]
    wte = hf.transformer.wte

    def p(replaced):
        with torch.no_grad():
            x = wte(ids).clone()
            x[:, list(replaced)] = wte(torch.tensor([[bid]]))[0, 0]
            return torch.softmax(hf(inputs_embeds=x).logits[0, -1], -1)[target].item()

    order = list(np.argsort(-occ, kind="stable"))
    full = p([])
    comp = np.mean([full - p(order[:max(1, int(f * n + 0.5))]) for f in fractions])
    suff = np.mean([full - p(order[max(1, int(f * n + 0.5)):]) for f in fractions])
    row = df.set_index("method").loc["occlusion"]
    assert row["comprehensiveness"] == pytest.approx(comp, abs=1e-5)
    assert row["sufficiency"] == pytest.approx(suff, abs=1e-5)
    curves = F.curves_frame(df)
    occ_curve = curves[curves["method"] == "occlusion"].sort_values("k")
    assert occ_curve["k"].tolist() == list(range(n + 1)) and occ_curve["fraction"].iloc[-1] == 1.0
    assert occ_curve["prob"].iloc[0] == pytest.approx(full, abs=1e-5)
    assert occ_curve["prob"].iloc[3] == pytest.approx(p(order[:3]), abs=1e-5)
    # the random floor is seeded: the same ranking twice
    again = ca.faithfulness(ours, text, methods=["attention"], fractions=fractions)
    assert again.set_index("method").loc["random", "comprehensiveness"] == pytest.approx(
        df.set_index("method").loc["random", "comprehensiveness"])


def test_the_corpus_command_writes_mean_and_spread_per_method(gpt2, tmp_path):
    """`python -m core faithfulness`: per method the mean and standard deviation over
    sentences of what core.analysis.faithfulness gives for each sentence alone."""
    from core.__main__ import main

    _, ours = gpt2
    sentences = ["the small dog sees the old cat near the", "alice gave the tired cat a book because it",
                 "one two three four five six"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences) + "\n\n")
    out, per = tmp_path / "table.csv", tmp_path / "rows.csv"
    rc = main(["faithfulness", "--model", str(ours.folder), "--input", str(corpus), "--out", str(out),
               "--per-sentence", str(per), "--methods", "occlusion,attention", "--fractions", "0.2,0.5",
               "--steps", "4", "--device", "cpu"])
    assert rc == 0
    import pandas as pd

    table = pd.read_csv(out).set_index("method")
    assert set(table.index) == {"occlusion", "attention", "random"} and (table["sentences"] == 3).all()
    each = [ca.faithfulness(ours, t, methods=["occlusion", "attention"], fractions=(0.2, 0.5)).set_index("method")
            for t in sentences]
    for m in table.index:
        vals = [e.loc[m, "comprehensiveness"] for e in each]
        assert table.loc[m, "comprehensiveness_mean"] == pytest.approx(np.mean(vals), abs=1e-6)
        assert table.loc[m, "comprehensiveness_std"] == pytest.approx(np.std(vals, ddof=1), abs=1e-6)
    assert len(pd.read_csv(per)) == 9
    assert main(["faithfulness", "--model", str(ours.folder), "--input", str(tmp_path / "none.txt")]) == 2


@pytest.mark.slow
def test_the_corpus_command_on_ray_gives_the_local_rows(gpt2, tmp_path):
    """`python -m core faithfulness --ray`: Ray Data maps the same per-sentence function over the
    sentences in worker processes (each loads the model by name); the rows equal the local run's,
    and a sentence the model cannot read is skipped on both."""
    ray = pytest.importorskip("ray")
    import pandas as pd
    from core.__main__ import main
    from core.cli import faithfulness_job as job

    _, ours = gpt2
    sentences = ["the small dog sees the old cat near the", "alice gave the tired cat a book because it"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences) + "\n")
    kw = dict(methods=["occlusion", "grad_x_input"], fractions=(0.2, 0.5), steps=4)
    local, skipped = job.run(ours, sentences + [" "], **kw)
    assert [sid for sid, _ in skipped] == [2]  # an empty sentence: an input error, skipped
    out, per = tmp_path / "table.csv", tmp_path / "rows.csv"
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        _, remote_skipped = job.run_ray(str(ours.folder), sentences + [" "], **kw)
        rc = main(["faithfulness", "--model", str(ours.folder), "--input", str(corpus), "--out", str(out),
                   "--per-sentence", str(per), "--methods", "occlusion,grad_x_input", "--fractions", "0.2,0.5",
                   "--steps", "4", "--ray"])
    finally:
        ray.shutdown()
    assert rc == 0 and [sid for sid, _ in remote_skipped] == [2]
    remote = pd.read_csv(per).sort_values(["sentence_id", "method"]).reset_index(drop=True)
    local = local.sort_values(["sentence_id", "method"]).reset_index(drop=True)
    assert list(remote["sentence_id"].unique()) == [0, 1] and len(remote) == len(local) == 6
    assert (remote["method"] == local["method"]).all() and (remote["target"] == local["target"]).all()
    for col in ("comprehensiveness", "sufficiency", "difference"):
        np.testing.assert_allclose(remote[col].to_numpy(), local[col].to_numpy(), atol=1e-6, rtol=0)
    table = pd.read_csv(out).set_index("method")
    assert table.loc["occlusion", "comprehensiveness_mean"] == pytest.approx(
        local[local.method == "occlusion"]["comprehensiveness"].mean(), abs=1e-6)
