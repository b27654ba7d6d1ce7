"""$ATTENTION_LAB_MODELS through the real app (AppTest): a folder's tiny checkpoint appears in
the picker with its family and size, its attention heatmap is drawn from its own trace, a
broken checkpoint ends in st.error, and hostile model= URL values get a warning and the
default model without any file being read."""

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import core
import core.analysis as ca
from conftest import open_first, APP, assert_no_exception, chart_by_key, heatmap_z
from hf_builders import build

pytest.importorskip("transformers")
TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    hf, folder = build("gpt2", root / "tiny-gpt2")
    hf.save_pretrained(str(folder))
    hf, folder = build("bert", root / "tiny-bert")
    hf.save_pretrained(str(folder))
    hf, folder = build("mistral", root / "tiny-mistral", sliding_window=4)  # every layer sees the last 4 keys
    hf.save_pretrained(str(folder))
    broken = root / "old-bert"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (broken / "pytorch_model.bin").write_bytes(b"never unpickled")
    return root


@pytest.fixture
def app(models_dir, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))

    def make(**params):
        at = AppTest.from_file(APP, default_timeout=30)
        open_first(at, "explore")
        for k, v in params.items():
            at.query_params[k] = v
        return at

    return make


def _picker(at):
    return next(s for s in at.selectbox if s.label == "Model")


def test_local_model_is_listed_and_drawn(app, models_dir):
    at = app(model="tiny-gpt2", text=TEXT, layer="1", head="2")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    picker = _picker(at)
    assert picker.value == "tiny-gpt2"
    labels = [o for o in picker.options if o.startswith("tiny-gpt2 ")]  # options as the picker shows them
    assert len(labels) == 1 and labels[0].startswith("tiny-gpt2 (gpt2, ") and labels[0].endswith("K)"), picker.options
    assert any(o.startswith("old-bert (bert") for o in picker.options)
    model = core.load_model(str(models_dir / "tiny-gpt2"), device="cpu")
    expected = np.asarray(model.trace(TEXT)["decoder.1.self_attn.weights"][2])
    maps = [heatmap_z(c) for c in at.get("plotly_chart")]
    assert any(z.shape == expected.shape and np.allclose(z, expected, atol=1e-5) for z in maps), \
        "no heatmap shows layer 1, head 2 of the local model's trace"


def test_broken_checkpoint_is_an_error_not_a_traceback(app):
    at = app(model="old-bert", text=TEXT)
    at.run()
    assert_no_exception(at)
    assert any("pytorch_model.bin" in e.value and "onvert" in e.value for e in at.error), [e.value for e in at.error]


@pytest.mark.parametrize("hostile", ["../x", "/etc/passwd", "no-such-model", "../tiny-gpt2", "tiny-gpt2/../tiny-gpt2"])
def test_hostile_model_values_are_refused(app, monkeypatch, hostile):
    read = []
    real = core.load_model
    monkeypatch.setattr(core, "load_model", lambda name, *a, **k: read.append(name) or real(name, *a, **k))
    at = app(model=hostile, text=TEXT)
    at.run()
    assert_no_exception(at)
    assert at.warning, f"no warning for model={hostile!r}"
    assert _picker(at).value == "toy-translate"
    assert all(name in core.MODELS for name in read), read


@pytest.mark.parametrize("page", ["inside", "positions", "decoder", "compare", "playground"])
def test_every_page_takes_a_local_decoder(models_dir, monkeypatch, page):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))
    at = AppTest.from_file(APP, default_timeout=30)
    open_first(at, page)
    at.query_params["model"] = "tiny-gpt2"
    at.query_params["text"] = TEXT
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert not [w for w in at.warning if "not valid here" in w.value]  # the model was taken, not replaced
    assert at.get("plotly_chart")


def test_fill_ins_are_shown_for_mask_tokens(app, models_dir):
    at = app(model="tiny-bert", text="the small [MASK] sees the cat")
    at.run()
    assert_no_exception(at)
    model = core.load_model(str(models_dir / "tiny-bert"), device="cpu")
    best, p = model.fill_mask("the small [MASK] sees the cat")[0]["top"][0]
    infos = [i.value for i in at.info if "fill-ins" in i.value]
    assert len(infos) == 1 and f"`{best}` {p:.0%}" in infos[0], infos


def test_the_kv_cache_page_reads_a_windowed_model_at_its_own_window(app, models_dir):
    """A Mistral whose layers see the last 4 keys, on the KV cache page with policy `window` at 4
    keys: the cache evicts only what the model never reads, so the page shows KL 0 and mass lost
    0 (every head of the mass map too), as evict does; at 3 keys both are above 0."""
    text = "the small dog sees the old cat near the river and the tired cat gave alice a book"
    at = app(model="tiny-mistral", text=text, policy="window", budget="4")
    open_first(at, "kvcache")
    at.run(timeout=120)
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    shown = {m.label: m.value for m in at.metric}
    assert shown["Attention mass lost"] == "0.000" and shown["Mean KL(full ‖ policy)"] == "0.0000 nats", shown
    assert np.abs(heatmap_z(chart_by_key(at, "kvcache-mass"))).max() < 1e-6
    model = core.load_model(str(models_dir / "tiny-mistral"), device="cpu")
    df = ca.evict(model, text, "window", 4)
    assert df.mass_lost.max() < 1e-6 and df.kl.max() < 1e-6
    at.number_input(key="kvcache.budget").set_value(3).run(timeout=120)
    assert_no_exception(at)
    shown = {m.label: m.value for m in at.metric}
    assert float(shown["Attention mass lost"]) > 0.01 and float(shown["Mean KL(full ‖ policy)"].split()[0]) > 0, shown


def test_the_kv_cache_page_says_how_many_queries_snapkv_observed(app):
    """Observe 32 with a budget of 3: SnapKV observes 2 queries (the cache holds budget - 1 keys),
    and the page says so beside its figures; at observe 2 it says nothing."""
    text = "the small dog sees the old cat near the river"
    at = app(model="tiny-mistral", text=text, policy="snapkv", budget="3", observe="32", cont="and the cat sat")
    open_first(at, "kvcache")
    at.run(timeout=120)
    assert_no_exception(at)
    said = [c.value for c in at.caption if "SnapKV observed" in c.value]
    assert len(said) == 1 and "last 2 queries, not 32" in said[0], [c.value for c in at.caption]
    at.number_input(key="kvcache.observe").set_value(2).run(timeout=120)
    assert_no_exception(at)
    assert not [c.value for c in at.caption if "SnapKV observed" in c.value]
