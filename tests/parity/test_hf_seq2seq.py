"""Encoder-decoder checkpoint folders (Marian, BART, T5) read by core.loaders.hf_seq2seq.

Each family: a tiny random model built here with transformers and saved as safetensors,
with a tokenizer trained here (sentencepiece or tokenizers). Our core loads the folder;
every layer's encoder self-attention, decoder self-attention and cross-attention weights and
the logits must match transformers' eager forward with a target given, for two sentences.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch

from core.loaders import hf_seq2seq
from core.loaders.hf_seq2seq import CheckpointError

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park with the ball",
    "the small bird sings a song in the morning",
    "my friend reads a book under the old tree",
    "we walk to the river and look at the boats",
    "she drinks coffee while he writes a letter",
    "the children play football after school",
    "a big red car stops near the station",
] * 4
PAIRS = [  # (source, target)
    ("the cat sat on the mat", "a dog ran in the park"),
    ("my friend reads a book under the old tree", "the children play football"),
]
ATOL = 1e-4
SIZES = dict(d_model=32, layers=2, heads=4, ffn=48, max_pos=64)


def _train_spm(path, **kw):
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=buf, vocab_size=48, hard_vocab_limit=False,
        minloglevel=2, num_threads=1, **kw,
    )
    path.write_bytes(buf.getvalue())
    return spm.SentencePieceProcessor(model_file=str(path))


def _bart_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=90, special_tokens=specials, show_progress=False))
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tk.save(str(folder / "tokenizer.json"))
    return tk.get_vocab_size()


def _marian_tokenizer(folder):
    sp = _train_spm(folder / "source.spm", bos_id=-1, eos_id=-1, unk_id=0)
    shutil.copy(folder / "source.spm", folder / "target.spm")
    pieces = [sp.id_to_piece(i) for i in range(1, sp.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return len(vocab)


def _t5_tokenizer(folder):
    sp = _train_spm(folder / "spiece.model", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    return sp.get_piece_size() + 3  # T5 appends sentinel ids past the sentencepiece vocabulary


def _build(variant, folder):
    """variant: a family, or "bart-untied" (an output projection of its own) or "t5-relu"
    (T5 v1.0's relu FFN, without the d^-0.5 output scale of tied embeddings)."""
    T = transformers
    s = SIZES
    family = variant.split("-")[0]
    torch.manual_seed(0)
    if family == "bart":
        v = _bart_tokenizer(folder)
        cfg = T.BartConfig(
            vocab_size=v, d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"] + 1,
            encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
            decoder_ffn_dim=s["ffn"], max_position_embeddings=s["max_pos"], pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=2, scale_embedding=True,
            tie_word_embeddings=variant != "bart-untied",
        )
        model = T.BartForConditionalGeneration(cfg)
    elif family == "marian":
        v = _marian_tokenizer(folder)
        cfg = T.MarianConfig(
            vocab_size=v, d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
            encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
            decoder_ffn_dim=s["ffn"], max_position_embeddings=s["max_pos"], pad_token_id=v - 1, eos_token_id=0,
            decoder_start_token_id=v - 1, scale_embedding=True, activation_function="swish",
        )
        model = T.MarianMTModel(cfg)
    else:
        v = _t5_tokenizer(folder)
        cfg = T.T5Config(
            vocab_size=v, d_model=s["d_model"], d_kv=6, d_ff=s["ffn"], num_layers=s["layers"],
            num_decoder_layers=s["layers"] + 1, num_heads=s["heads"],
            feed_forward_proj="relu" if variant == "t5-relu" else "gated-gelu",
            relative_attention_num_buckets=8, relative_attention_max_distance=12, pad_token_id=0,
            eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=variant != "t5-relu",
        )
        model = T.T5ForConditionalGeneration(cfg)
    with torch.no_grad():  # random biases and norms too, so a swapped or dropped tensor shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0, 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return model.eval()


@pytest.fixture(scope="module")
def make(tmp_path_factory):
    """make(family) -> (family, folder, transformers model, our AttentionModel), built once."""
    cache = {}

    def get(family):
        if family not in cache:
            folder = tmp_path_factory.mktemp(family)
            theirs = _build(family, folder)
            cache[family] = (family, folder, theirs, hf_seq2seq.load(folder, device="cpu"))
        return cache[family]

    return get


@pytest.fixture(params=["bart", "bart-untied", "marian", "t5", "t5-relu"])
def built(request, make):
    return make(request.param)


def _hf_forward(model, src_ids, dec_ids):
    # transformers 5 picks the attention kernel at construction; eager gives the weights
    model.config._attn_implementation = "eager"
    for m in model.modules():
        if hasattr(m, "config") and m.config is not model.config:
            m.config._attn_implementation = "eager"
    with torch.no_grad():
        return model(
            input_ids=torch.tensor([src_ids]), decoder_input_ids=torch.tensor([dec_ids]), output_attentions=True
        )


@pytest.mark.parametrize("pair", PAIRS, ids=["short", "long"])
def test_parity_with_transformers(built, pair):
    family, folder, theirs, ours = built
    if family == "bart-untied":  # the checkpoint carries its own output projection, and we use it
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            assert "lm_head.weight" in f.keys()
        assert not torch.equal(ours.net.out_proj.weight, ours.net.tgt_embed.tok.weight)
    if family == "t5-relu":
        assert ours.config.logit_scale == 1.0 and ours.config.activation == "relu"
    elif family == "t5":
        assert ours.config.logit_scale == pytest.approx(ours.config.d_model ** -0.5)
    source, target = pair
    tr = ours.trace(source, target=target)
    src_ids = ours.encode(source).ids
    dec_ids = tr.meta["target_ids"]
    assert len(src_ids) >= 5 and len(dec_ids) >= 4
    assert ours.tokenizer.unk_id not in src_ids  # the trained tokenizer covers the text
    out = _hf_forward(theirs, src_ids, dec_ids)
    cfg = ours.config
    assert len(out.encoder_attentions) == cfg.n_layers and len(out.decoder_attentions) == cfg.n_decoder_layers
    for i, a in enumerate(out.encoder_attentions):
        torch.testing.assert_close(tr[f"encoder.{i}.self_attn.weights"], a[0], atol=ATOL, rtol=0)
    for i, (a, c) in enumerate(zip(out.decoder_attentions, out.cross_attentions)):
        torch.testing.assert_close(tr[f"decoder.{i}.self_attn.weights"], a[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(tr[f"decoder.{i}.cross_attn.weights"], c[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(tr["logits"], out.logits[0], atol=ATOL, rtol=0)


def test_tokens_and_specials(built):
    family, _, _, ours = built
    enc = ours.encode("the cat sat")
    assert enc.special[-1] and enc.tokens[-1] == "</s>"
    assert not any(enc.special[1:-1])
    body = [t for t, s in zip(enc.tokens, enc.special) if not s]
    assert "".join(body).replace("\u2581", " ").replace("\u0120", " ").strip() == "the cat sat"
    if family.startswith("bart"):
        assert enc.tokens[0] == "<s>" and enc.special[0]
    assert ours.start_id == {"bart": 2, "marian": ours.config.pad_id, "t5": 0}[family.split("-")[0]]


def test_pickle_only_folder_gets_a_convert_message(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bart"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="(?i)convert it to safetensors"):
        hf_seq2seq.load_net(tmp_path)


def test_missing_tensor_is_named(built, tmp_path):
    from safetensors.torch import load_file, save_file

    family, folder, _, _ = built
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    state = load_file(str(folder / "model.safetensors"))
    gone = next(k for k in state if ".1." in k and "k" in k.split(".")[-2])  # a key projection in layer 1
    del state[gone]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensors: .*" + gone.removeprefix("model.").replace(".", r"\.")):
        hf_seq2seq.load_net(tmp_path)


def test_wrong_shape_is_named(built, tmp_path):
    from safetensors.torch import load_file, save_file

    family, folder, _, _ = built
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    state = load_file(str(folder / "model.safetensors"))
    key = next(k for k in state if k.startswith(("encoder.", "model.encoder."))
               and k.endswith(("fc1.weight", "DenseReluDense.wo.weight")))
    state[key] = state[key][:, :-1].contiguous()
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="wrong shape: " + key.removeprefix("model.").replace(".", r"\.")):
        hf_seq2seq.load_net(tmp_path)


def test_unknown_family_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "pegasus"}))
    with pytest.raises(CheckpointError, match="marian, bart, t5"):
        hf_seq2seq.load_net(tmp_path)


def test_t5_position_bias_is_recorded_and_added(make):
    _, _, theirs, ours = make("t5")
    source, target = PAIRS[1]
    tr = ours.trace(source, target=target)
    n, t = len(tr.tokens("source")), len(tr.tokens("target"))
    for stack, module, shape in (("encoder", theirs.encoder, (n, n)), ("decoder", theirs.decoder, (t, t))):
        with torch.no_grad():
            ref = module.block[0].layer[0].SelfAttention.compute_bias(*shape)[0]  # H x n_q x n_k
        for i in range(len(module.block)):
            bias = tr[f"{stack}.{i}.self_attn.position_bias"]
            torch.testing.assert_close(bias, ref, atol=1e-6, rtol=0)
            scaled = tr[f"{stack}.{i}.self_attn.scaled"]
            torch.testing.assert_close(scaled, tr[f"{stack}.{i}.self_attn.scores"])  # no 1/sqrt(d_k)
            want = scaled + bias + tr[f"{stack}.{i}.self_attn.mask"]
            torch.testing.assert_close(tr[f"{stack}.{i}.self_attn.masked"], want)
            assert f"{stack}.{i}.cross_attn.position_bias" not in tr.names()
    assert not any(name.startswith("embed.") and name.endswith(".positions") for name in tr.names())


def test_bfloat16_and_sharded_checkpoint(make, tmp_path):
    _, folder, theirs, _ = make("marian")
    for f in folder.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy(f, tmp_path / f.name)
    half = type(theirs)(theirs.config).to(torch.bfloat16)
    half.load_state_dict(theirs.state_dict())
    half.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    net = hf_seq2seq.load_net(tmp_path)
    assert all(p.dtype == torch.float32 for p in net.parameters())
    want = theirs.model.encoder.layers[1].fc1.weight.to(torch.bfloat16).float()
    assert torch.equal(net.encoder[1].ffn.w_1.weight, want)
    assert torch.equal(net.out_proj.bias, theirs.final_logits_bias[0].to(torch.bfloat16).float())


# ------------------------------------------------------------------ the app's pages
@pytest.fixture
def registered(make, monkeypatch, tmp_path):
    """register(family) -> a model name the app's picker lists, loading that family's folder."""
    import core

    def register(family):
        _, folder, theirs, _ = make(family)
        name = f"tiny-{family}"
        mod = f"tiny_{family}_loader"
        (tmp_path / f"{mod}.py").write_text(
            "from pathlib import Path\nfrom core.loaders import hf_seq2seq\n\n"
            f"def load(device=None):\n    return hf_seq2seq.load(Path({str(folder)!r}), device='cpu')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setitem(core.MODELS, name, core.registry.ModelSpec(name, "encoder-decoder", "test", f"{mod}:load"))
        return name, theirs

    return register


def test_positions_page_shows_t5_position_bias(app_test, registered, make):
    from conftest import assert_no_exception, chart_by_key, heatmap_z

    name, theirs = registered("t5")
    text = "the cat sat on the mat"
    at = app_test("positions", model=name, text=text)
    at.run()
    assert_no_exception(at)
    z = heatmap_z(chart_by_key(at, "positions-bias"))
    n = len(make("t5")[3].encode(text))
    assert z.shape == (n, n)
    with torch.no_grad():
        ref = theirs.encoder.block[0].layer[0].SelfAttention.compute_bias(z.shape[0], z.shape[1])[0]
    assert np.allclose(z, ref[0].numpy(), atol=1e-6)
    at.slider(key="positions.bias_head").set_value(2)
    at.run()
    assert_no_exception(at)
    assert np.allclose(heatmap_z(chart_by_key(at, "positions-bias")), ref[2].numpy(), atol=1e-6)
    assert at.query_params["bias_head"] == "2"
    from conftest import figure

    lines = figure(chart_by_key(at, "positions-bias-distance"))["data"]
    assert len(lines) == ref.shape[0]  # one line per head


def test_inside_page_adds_the_position_bias(app_test, registered):
    from conftest import assert_no_exception, chart_by_key

    name, _ = registered("t5")
    at = app_test("inside", model=name, text="the cat sat on the mat", target="a dog ran")
    at.run()
    assert_no_exception(at)
    titles = [m.value for m in at.markdown]
    order = [next(i for i, t in enumerate(titles) if key in t)
             for key in ("Scores QKᵀ", "Scaled: × 1", "+ position bias", "Masked: scaled + position bias + M",
                         "Attention weights")]
    assert order == sorted(order)
    chart_by_key(at, "inside-position_bias-fig")
    captions = " ".join(c.value for c in at.caption)
    assert "scaled + M + T5's position bias (read from the trace)" in captions
    assert not at.error, [e.value for e in at.error]  # every check holds, the position bias included


def test_positions_page_explains_marian_layout(app_test, registered):
    from conftest import assert_no_exception, chart_by_key, heatmap_z

    import core

    name, _ = registered("marian")
    at = app_test("positions", model=name, text="the cat sat on the mat")
    at.run()
    assert_no_exception(at)
    z = heatmap_z(chart_by_key(at, "positions-model-pe"))
    half = core.sinusoidal_encoding(z.shape[0], z.shape[1], layout="half").numpy()
    assert np.allclose(z, half, atol=1e-6)
    assert any("Marian's layout" in c.value for c in at.caption)


def test_long_and_odd_input(built):
    family, _, _, ours = built
    long = " ".join(["the cat sat on the mat"] * 40)  # 240 words, past max_position_embeddings (64)
    enc = ours.encode(long)
    assert len(enc) == ours.config.max_len and enc.truncated > 0 and enc.tokens[-1] == "</s>"
    tr = ours.trace(long, target="a dog")
    assert tr["encoder.0.self_attn.weights"].shape[-1] == ours.config.max_len
    odd = ours.encode("the cat \u00e9\U0001F600 \x07 \ud800 sat")
    assert odd.tokens[-1] == "</s>" and len(odd.ids) == len(odd.offsets) == len(odd.word_ids)
    assert odd.unknown  # characters the tiny vocabulary never saw are reported, not dropped silently
    for (s, t), special in zip(odd.offsets, odd.special):
        assert special or 0 <= s <= t
