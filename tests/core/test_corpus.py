"""The corpus job (core.cli.corpus_job): its q and k equal single-sentence traces', padding excluded;
the Parquet file and the CLI; Ray Data's run gives the same rows as the in-process one."""

import numpy as np
import pandas as pd
import pytest

import core
import core.cli.corpus_job as cc
from core import trace_names as tn
from core.net.config import ModelConfig
from core.cli.corpus_data import load as load_bundled

MIXED = [  # lengths from 1 word to 12, so every batch pads
    "the small dog sees the cat",
    "show me the money",
    "help",
    "the old man sleeps near the river and the young woman sings quietly today",
    "I swam across the river to get to the other bank.",
    "she finds the cash in the bank",
    "!!!",  # no word: skipped
    "the farmer feeds the hungry cow and the dog sleeps",
]


def _check_against_traces(model, sentences, layers, batch_size):
    result = cc.run(model, sentences, layers, batch_size=batch_size)
    df = result.table.to_pandas()
    stack = cc.stack_of(model)
    cfg = model.config
    group = cfg.n_heads // cfg.n_kv_heads
    checked = 0
    for sid, text in enumerate(sentences):
        rows = df[df.sentence_id == sid]
        try:
            trace = model.trace(text)
        except core.InputError:
            assert rows.empty and sid in [s for s, _ in result.skipped]
            continue
        tokens = trace.tokens("source")
        n = len(tokens)
        assert len(rows) == n * len(layers) * cfg.n_heads  # padding is never a row
        for l in layers:
            q = trace[tn.self_attn(stack, l, "q")].numpy()  # H x n x d_k
            k = trace[tn.self_attn(stack, l, "k")].numpy()  # H_kv x n x d_k
            for h in range(cfg.n_heads):
                r = rows[(rows.layer == l) & (rows["head"] == h)].sort_values("position")
                assert list(r.position) == list(range(n))
                assert list(r.token) == tokens
                np.testing.assert_allclose(np.stack(r.q.to_numpy()), q[h], atol=1e-5, rtol=0)
                np.testing.assert_allclose(np.stack(r.k.to_numpy()), k[h // group], atol=1e-5, rtol=0)
                checked += 1
    return result, checked


def test_toy_translate_vectors_equal_single_traces():
    model = core.load_model("toy-translate", device="cpu")
    result, checked = _check_against_traces(model, MIXED, [0, 2], batch_size=3)
    assert checked == 7 * 2 * model.config.n_heads
    assert [s for s, _ in result.skipped] == [6]


def test_minilm_vectors_equal_single_traces():
    if not core.MODELS["minilm"].available():
        pytest.skip("minilm's weight package is not installed")
    model = core.load_model("minilm", device="cpu")
    _check_against_traces(model, MIXED, [0, 5], batch_size=4)


def test_grouped_query_rope_decoder_reads_its_kv_head():
    cfg = ModelConfig(kind="decoder", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96,
                      positional="rope", norm="rmsnorm", norm_placement="pre", activation="swiglu", max_len=64)
    model = core.load_model("random", device="cpu", config=cfg, seed=3)
    result, _ = _check_against_traces(model, MIXED, [0, 1], batch_size=5)
    # heads 0 and 1 share kv head 0, heads 2 and 3 kv head 1: equal keys within a group, not across
    df = result.table.to_pandas()
    k = {h: np.stack(df[(df.layer == 1) & (df["head"] == h)].k.to_numpy()) for h in range(4)}
    assert np.array_equal(k[0], k[1]) and np.array_equal(k[2], k[3]) and not np.allclose(k[1], k[2])


def test_a_hybrid_gives_its_softmax_layers_only():
    """On a model with token mixers the job writes the softmax layers' q and k (the default, every
    such layer), equal to single traces; asked for a mixer's layer it says which layers it can read."""
    model = core.load_model("random:gated_delta", device="cpu")
    assert cc.softmax_layers(model) == [3]
    _, checked = _check_against_traces(model, MIXED[:2], [3], batch_size=2)
    assert checked == 2 * model.config.n_heads
    assert set(cc.run(model, MIXED[:2]).table.to_pandas().layer) == {3}
    with pytest.raises(core.InputError, match=r"layers 0, 1 mix tokens without softmax attention.*are 3"):
        cc.run(model, MIXED[:2], "0,1,3")


def test_rows_sorted_and_schema():
    model = core.load_model("toy-translate", device="cpu")
    t = cc.run(model, load_bundled()[:40], "1").table
    assert t.column_names == cc.COLUMNS
    df = t.to_pandas()
    assert df.equals(df.sort_values(["sentence_id", "layer", "head", "position"]).reset_index(drop=True))
    assert set(df.layer) == {1}


def test_cli_writes_parquet(tmp_path):
    from core.__main__ import main

    src = tmp_path / "corpus.txt"
    src.write_text("\n".join(MIXED[:4]) + "\n\n")
    out = tmp_path / "v.parquet"
    assert main(["corpus", "--model", "toy-translate", "--input", str(src), "--layers", "0,1", "--out", str(out),
                 "--device", "cpu"]) == 0
    df = pd.read_parquet(out)
    assert list(df.columns) == cc.COLUMNS and sorted(set(df.sentence_id)) == [0, 1, 2, 3]
    model = core.load_model("toy-translate", device="cpu")
    trace = model.trace(MIXED[3])
    r = df[(df.sentence_id == 3) & (df.layer == 1) & (df["head"] == 2)]
    np.testing.assert_allclose(np.stack(r.q.to_numpy()), trace["encoder.1.self_attn.q"][2].numpy(), atol=1e-5)
    assert main(["corpus", "--model", "toy-translate", "--input", str(src), "--layers", "7", "--out", str(out)]) == 2
    assert main(["corpus", "--model", "toy-translate", "--input", str(tmp_path / "none.txt"), "--out", str(out)]) == 2


@pytest.mark.slow
def test_ray_local_gives_the_same_rows():
    ray = pytest.importorskip("ray")
    sentences = load_bundled()[:30] + ["!!!"]
    model = core.load_model("toy-translate", device="cpu")
    local = cc.run(model, sentences, [0, 2], batch_size=8)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = cc.run_ray("toy-translate", sentences, [0, 2], batch_size=8, model=model,
                            model_kwargs={"device": "cpu"})
    finally:
        ray.shutdown()
    assert remote.skipped == local.skipped
    a, b = local.table.to_pandas(), remote.table.to_pandas()
    keys = ["sentence_id", "position", "token", "layer", "head"]
    assert a[keys].equals(b[keys]) and len(a) > 0
    for col in ("q", "k"):
        np.testing.assert_allclose(np.stack(a[col].to_numpy()), np.stack(b[col].to_numpy()), atol=1e-5, rtol=0)
