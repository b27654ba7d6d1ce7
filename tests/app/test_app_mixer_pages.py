"""Every page opens, without an exception or an error, on the random presets whose layers mix
tokens otherwise than by softmax attention (gated_delta on every page; mamba2, short_conv and kda on
the pages whose code differs by the mixer's kind) and on a model of Mamba2 layers alone (a tiny
checkpoint built by transformers), where a view that reads softmax attention says why in one
st.info."""

import pytest

from conftest import assert_no_exception

TEXT = "the small dog sees the cat and the old man sleeps"
PAGES = ["home", "inside", "positions", "decoder", "playground", "explore", "compare", "corpus", "heads", "lens",
         "patching", "kvcache", "circuits", "attribution"]
BY_KIND = ["home", "inside", "decoder", "explore", "heads", "lens", "kvcache"]


def _clean(at):
    assert_no_exception(at)
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def pure_mamba(tmp_path_factory):
    pytest.importorskip("transformers")
    from mixer_builders import build

    root = tmp_path_factory.mktemp("mixer-models")
    build("mamba2", root / "tiny-mamba2")
    return root


@pytest.mark.parametrize("name, page", [("random:gated_delta", p) for p in PAGES]
                         + [(m, p) for m in ("random:mamba2", "random:short_conv", "random:kda")
                            for p in BY_KIND])
def test_every_page_opens_on_each_preset(app_test, page, name):
    at = app_test(page, model=name, text=TEXT)
    at.run()
    _clean(at)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_opens_on_a_model_of_mixers_alone(app_test, monkeypatch, pure_mamba, page):
    monkeypatch.setenv("ATTENTION_LAB_MODELS", str(pure_mamba))
    at = app_test(page, model="tiny-mamba2", text=TEXT)
    at.run()
    _clean(at)
    if page in ("heads", "compare", "corpus", "home"):  # a softmax view: says why, in one style
        assert any("reads softmax attention" in i.value for i in at.info), [i.value for i in at.info]
