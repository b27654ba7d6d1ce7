"""A models folder holding one tiny checkpoint of each Gemma family (1-4), ModernBERT and a gemma2
GGUF file, through the real app (AppTest): the picker lists them all with their family, each
opens in Explore with its own trace's attention drawn, and ModernBERT's fill-ins show."""

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import core
from conftest import open_first, APP, assert_no_exception, heatmap_z

pytest.importorskip("transformers")
TEXT = "the small dog sees the old cat near the river"
FOLDERS = {"tiny-gemma": "gemma", "tiny-gemma2": "gemma2", "tiny-gemma3": "gemma3_text", "tiny-gemma4": "gemma4_text",
           "tiny-modernbert": "modernbert"}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    from gemma_builders import build

    root = tmp_path_factory.mktemp("gemma-models")
    for name, family in FOLDERS.items():
        hf, folder = build(family, root / name)
        hf.save_pretrained(str(folder))
    pytest.importorskip("gguf")
    from test_gguf_gemma import write_gguf

    hf, folder = build("gemma2", root / "src", query_pre_attn_scalar=12)
    write_gguf(hf, root / "tiny-gemma2.gguf", "gemma2", vocab=folder / "tokenizer.json")
    for f in folder.iterdir():  # the source folder is not a model of the list
        f.unlink()
    folder.rmdir()
    return root


@pytest.mark.parametrize("name", [*FOLDERS, "tiny-gemma2.gguf"])
def test_each_family_is_listed_and_opens_in_explore(models_dir, monkeypatch, name):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    open_first(at, "explore")
    at.query_params.update(model=name, text=TEXT, layer="1", head="1")
    at.run()
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]
    picker = next(s for s in at.selectbox if s.label == "Model")
    assert picker.value == name
    for other, family in [*FOLDERS.items(), ("tiny-gemma2.gguf", "gemma2")]:
        assert any(o.startswith(f"{other} ({family}, ") for o in picker.options), (other, picker.options)
    model = core.load_model(str(models_dir / name), device="cpu")
    stack = "encoder" if model.kind == "encoder" else "decoder"
    expected = np.asarray(model.trace(TEXT)[f"{stack}.1.self_attn.weights"][1])
    maps = [heatmap_z(c) for c in at.get("plotly_chart")]
    assert any(z.shape == expected.shape and np.allclose(z, expected, atol=1e-5) for z in maps), \
        "no heatmap shows layer 1, head 1 of the model's own trace"


def test_modernbert_fill_ins_show(models_dir, monkeypatch):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    open_first(at, "explore")
    at.query_params.update(model="tiny-modernbert", text="the small [MASK] sees the cat")
    at.run()
    assert_no_exception(at)
    model = core.load_model(str(models_dir / "tiny-modernbert"), device="cpu")
    best, p = model.fill_mask("the small [MASK] sees the cat")[0]["top"][0]
    infos = [i.value for i in at.info if "fill-ins" in i.value]
    assert len(infos) == 1 and f"`{best}` {p:.0%}" in infos[0], infos


@pytest.mark.parametrize("page", ["inside", "positions", "decoder", "compare", "playground", "heads"])
@pytest.mark.parametrize("name", ["tiny-gemma2", "tiny-gemma4", "tiny-modernbert"])
def test_every_page_takes_them(models_dir, monkeypatch, page, name):
    if page == "decoder" and name == "tiny-modernbert":
        pytest.skip("the decoder stepper is for decoders")
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    open_first(at, page)
    at.query_params.update(model=name, text=TEXT)
    at.run()
    assert_no_exception(at)
    errors = [e.value for e in at.error]
    if name == "tiny-gemma4" and page == "heads":  # the one refusal: its stream is not score attribution's sum
        assert len(errors) == 1 and "pattern cannot be taken apart" in errors[0] and "Gemma 4" in errors[0], errors
        errors = []
    assert not errors, errors
    assert not [w for w in at.warning if "not valid here" in w.value]  # the model was taken, not replaced
    captions = " ".join(c.value for c in at.caption)
    assert "✗" not in captions


@pytest.mark.parametrize("page", ["patching", "kvcache", "lens", "attribution", "circuits"])
def test_gemma4_on_the_research_pages(models_dir, monkeypatch, page):
    """Gemma 4's per-layer inputs and shared keys through patching (its restore check green:
    the clean per-layer inputs go in beside the clean stream), the KV cache page, the lens and
    input attribution; the circuits page says why it cannot take the stream apart."""
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(models_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    open_first(at, page)
    at.query_params.update(model="tiny-gemma4", text=TEXT)
    at.run()
    assert_no_exception(at)
    errors = [e.value for e in at.error]
    if page == "circuits":
        assert len(errors) == 1 and "cannot be read exactly" in errors[0] and "Gemma 4" in errors[0], errors
    else:
        assert not errors, errors
    assert "✗" not in " ".join(c.value for c in at.caption)
