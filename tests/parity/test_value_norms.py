"""value_norms = ||a_ij v_j W_o^h|| (Kobayashi et al. 2020) against transformers: the same
quantity computed from transformers' own attention maps (eager), its value projection's
output (a forward hook on v_proj / value) and its output matrix (o_proj / attention.output.dense),
on a grouped-query Llama (8 query heads read 2 kv heads) and on a BERT."""

import pytest
import torch

import core
from hf_builders import SENTENCES, build, save

pytest.importorskip("transformers")

REL = 1e-4


def _reference(hf, ids, attn_modules, v_name, o_name, n_heads, n_kv):
    """Per layer H x n x n: a_ij ||v_j W_o^h|| from transformers' tensors."""
    vs = {}
    hooks = [_get(m, v_name).register_forward_hook(lambda mod, inp, out, i=i: vs.__setitem__(i, out.detach()))
             for i, m in enumerate(attn_modules)]
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True)
    for h in hooks:
        h.remove()
    refs = []
    for i, m in enumerate(attn_modules):
        a = out.attentions[i][0].double()  # (H, n, n)
        n = a.shape[-1]
        d_k = vs[i].shape[-1] // n_kv
        v = vs[i][0].double().view(n, n_kv, d_k).transpose(0, 1).repeat_interleave(n_heads // n_kv, 0)  # (H, n, d_k)
        w_o = _get(m, o_name).weight.double()  # (d, H d_k)
        fx = torch.stack([v[h] @ w_o[:, h * d_k:(h + 1) * d_k].T for h in range(n_heads)])  # (H, n, d)
        refs.append(a * fx.norm(dim=-1)[:, None, :])
    return refs


def _get(m, dotted):
    for part in dotted.split("."):
        m = getattr(m, part)
    return m


def _check(ours, refs, stack, text):
    tr = ours.trace(text)
    assert len(refs) == tr.layers(stack)
    for i, ref in enumerate(refs):
        got = tr[f"{stack}.{i}.self_attn.value_norms"].double()
        assert got.shape == ref.shape
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        assert err < REL, f"layer {i}: relative difference {err:.2e}"
        fast = next(tr.each_layer(stack, ["self_attn.value_norms"], layers=[i]))["self_attn.value_norms"]
        assert torch.allclose(fast.double(), got, rtol=0, atol=1e-6 * ref.abs().max().item())


def test_value_norms_equal_transformers_on_a_grouped_query_llama(tmp_path):
    hf, folder = build("llama", tmp_path)
    save(hf, folder)
    ours = core.load_model(str(folder), device="cpu")
    assert ours.config.n_kv_heads < ours.config.n_heads
    for text in SENTENCES:
        ids = ours.encode(text).ids
        refs = _reference(hf, ids, [l.self_attn for l in hf.model.layers], "v_proj", "o_proj",
                          hf.config.num_attention_heads, hf.config.num_key_value_heads)
        _check(ours, refs, "decoder", text)


def test_value_norms_equal_transformers_on_bert(tmp_path):
    hf, folder = build("bert", tmp_path)
    save(hf, folder)
    ours = core.load_model(str(folder), device="cpu")
    for text in SENTENCES:
        ids = ours.encode(text).ids
        layers = hf.bert.encoder.layer
        refs = _reference(hf, ids, [l.attention for l in layers], "self.value", "output.dense",
                          hf.config.num_attention_heads, hf.config.num_attention_heads)
        _check(ours, refs, "encoder", text)


def test_value_norms_are_weights_times_value_sizes_and_not_the_weights():
    """A fault check: value norms differ from the weights (values are not all of one size)."""
    m = core.load_model("toy-translate", device="cpu")
    tr = m.trace("the small dog sees the cat")
    w, vn = tr["encoder.0.self_attn.weights"], tr["encoder.0.self_attn.value_norms"]
    ratio = vn / w.clamp_min(1e-30)
    assert not torch.allclose(ratio, ratio[:, :1, :].expand_as(ratio)[:, :, :1].expand_as(ratio))
    assert torch.allclose(ratio, ratio[:, :1, :].expand_as(ratio), rtol=1e-4)  # a column's size is the same for every query


def test_a_short_traces_value_norms_read_reuses_the_kept_q_k_v():
    """Short inputs keep each self-attention's q, k and v (core/api.py): a value_norms read is then
    Q K^T, the softmax and v's sizes, with no projection run again (the <= 2x weights target)."""
    m = core.load_model("toy-translate", device="cpu")
    tr = m.trace("the small dog sees the cat")
    expect = tr["encoder.1.self_attn.value_norms"]  # the layer's explicit re-run

    def refuse(*_a, **_k):
        raise AssertionError("a projection ran again")

    attn = m.net.layers("encoder")[1].self_attn
    for lin in (attn.w_q, attn.w_k, attn.w_v):
        lin.forward = refuse
    try:
        fast = next(tr.each_layer("encoder", ["self_attn.value_norms"], layers=[1]))["self_attn.value_norms"]
    finally:
        for lin in (attn.w_q, attn.w_k, attn.w_v):
            del lin.forward
    assert torch.allclose(fast, expect, rtol=1e-5, atol=1e-7)
