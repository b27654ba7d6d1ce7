"""The KV-cache sweep over a corpus (core.cli.evict_job): its rows are evict's own numbers
for each (document, policy, budget), unreadable documents and refused budgets are listed, and
Ray Data (a local Ray) gives the same rows."""

import numpy as np
import pytest

import core
import core.analysis as ca
from core.cli import evict_job


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hf_builders import build

    hf, folder = build("llama", tmp_path_factory.mktemp("evict-job-llama"))
    hf.save_pretrained(str(folder), safe_serialization=True)
    return core.load_model(str(folder), device="cpu"), str(folder)


DOCS = ["the small dog sees the cat near the old river bank and the cat sat on the mat",
        "   ",
        "alice gave bob the book because he asked for it, said the old man to the young woman"]


def test_rows_are_evicts_numbers(tiny):
    model, _ = tiny
    table = evict_job.run(model, DOCS, policies=("window", "streaming", "snapkv"), budgets=(4, 8))
    assert list(table.columns) == evict_job.COLUMNS
    assert sorted(set(table.doc_id)) == [0, 2]  # the blank document is skipped, and said
    skipped = table.attrs["skipped"]
    assert any("document 1" in s and "empty" in s for s in skipped)
    assert any("streaming at 4" in s and "above the sinks" in s for s in skipped)
    row = table[(table.doc_id == 2) & (table.policy == "window") & (table.budget == 8)].iloc[0]
    df = ca.evict(model, DOCS[2], "window", 8)
    assert row.perplexity == pytest.approx(df.attrs["perplexity"]) and row.n == len(df)
    assert row.mean_kl == pytest.approx(df.kl.mean()) and row.perplexity > row.perplexity_full
    snap = table[(table.policy == "snapkv")]
    assert len(snap) == 4 and (snap.n < table[table.policy == "window"].n.max()).all()  # the continuation only


@pytest.mark.slow
def test_ray_local_gives_the_same_rows(tiny):
    ray = pytest.importorskip("ray")
    model, folder = tiny
    local = evict_job.run(model, DOCS[:1], policies=("window",), budgets=(4, 8))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = evict_job.run_ray(folder, DOCS[:1], policies=("window",), budgets=(4, 8))
    finally:
        ray.shutdown()
    np.testing.assert_allclose(remote.perplexity.to_numpy(float), local.perplexity.to_numpy(float), rtol=1e-9)
    assert list(remote.budget) == [4, 8]
