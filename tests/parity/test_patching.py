"""Activation patching (core.analysis.patch) against patching done independently, with forward
hooks in transformers: smollm2 as LlamaForCausalLM (a subset of cells of each kind) and a tiny
random GPT-2 saved with save_pretrained and read back with core.load_model (every cell). Then
the sanity checks that can fail (patching the whole stream at layer 0 where the inputs differ
restores 1; a patch of equal values restores 0), encoder-decoders (toy-translate, against one
unbatched hooked pass per cell) and the messages for pairs and models that cannot be patched."""

from __future__ import annotations


import pytest
import torch

import core
import core.analysis as ca
from core.analysis.activation_patching import PatchRuns, prepare
from core.analysis.token_ids import output_token_id
from core.net.hooks import Hooks

DEVICE = "cpu"  # compared with transformers on the CPU
TOL = 1e-4

IOI_CLEAN = "When Mary and John went to the store, John gave a drink to"
IOI_CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


# ------------------------------------------------------------------ patching in transformers, by hooks
def _hidden(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


class HFPatcher:
    """Activation patching written directly on a transformers causal LM: a clean run that keeps
    the values, then one corrupted run per cell with a hook that puts the clean value in."""

    def __init__(self, hf, layers, attn, mlp, o_proj, d_head):
        self.hf, self.layers, self.attn, self.mlp, self.o_proj, self.d_head = hf, layers, attn, mlp, o_proj, d_head

    def _module(self, what, i):
        return {"resid_pre": self.layers, "attn_out": self.attn, "mlp_out": self.mlp, "head": self.o_proj}[what][i]

    def _logits(self, ids):
        with torch.inference_mode():
            return self.hf(torch.tensor([ids]), use_cache=False).logits[0, -1]

    def values(self, ids, what, i):
        """The clean run's value at (what, layer i): (n, d) or, for heads, (n, H * d_head)."""
        kept = {}
        mod = self._module(what, i)
        if what in ("resid_pre", "head"):
            h = mod.register_forward_pre_hook(lambda m, a, kw: kept.update(v=_hidden(a, kw)[0].clone()),
                                              with_kwargs=True)
        else:
            h = mod.register_forward_hook(lambda m, a, out: kept.update(v=_first(out)[0].clone()))
        try:
            self._logits(ids)
        finally:
            h.remove()
        return kept["v"]

    def metric(self, logits, answer, wrong):
        return float(logits[answer].double() - (0 if wrong is None else logits[wrong].double()))

    def patched(self, clean_ids, corrupt_ids, answer, wrong, what, i, cell):
        """The metric of the corrupted run with (layer i, position or head `cell`) taken from the clean run."""
        clean = self.values(clean_ids, what, i)
        mod = self._module(what, i)

        def put(x):
            x = x.clone()
            if what == "head":
                s = slice(cell * self.d_head, (cell + 1) * self.d_head)
                x[0, :, s] = clean[:, s]
            else:
                x[0, cell] = clean[cell]
            return x

        if what in ("resid_pre", "head"):
            def pre(m, a, kw):
                if a:
                    return (put(a[0]),) + tuple(a[1:]), kw
                return a, {**kw, "hidden_states": put(kw["hidden_states"])}
            h = mod.register_forward_pre_hook(pre, with_kwargs=True)
        else:
            h = mod.register_forward_hook(
                lambda m, a, out: (put(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else put(out))
        try:
            return self.metric(self._logits(corrupt_ids), answer, wrong)
        finally:
            h.remove()


def _compare(model, patcher, clean, corrupt, answer, wrong, what, cells=None):
    """Our grid's metric against transformers' hooked run for each cell (all when cells is None);
    returns (largest |difference|, largest |patched - corrupted| the patches make)."""
    df = ca.patch(model, clean, corrupt, answer, wrong, what=what)
    a_id, w_id = df.attrs["answer_id"], df.attrs["wrong_id"]
    ids_c, ids_x = model.encode(clean).ids, model.encode(corrupt).ids
    worst = moved = 0.0
    key = "head" if what == "head" else "position"
    rows = df if cells is None else df[[(r.layer, getattr(r, key)) in cells for r in df.itertuples()]]
    assert len(rows) == (len(df) if cells is None else len(cells))
    m_x = patcher.metric(patcher._logits(ids_x), a_id, w_id)
    assert abs(m_x - df.attrs["corrupt_metric"]) < TOL
    for r in rows.itertuples():
        ref = patcher.patched(ids_c, ids_x, a_id, w_id, what, r.layer, getattr(r, key))
        worst = max(worst, abs(ref - r.metric))
        moved = max(moved, abs(ref - m_x))
    return worst, moved, df


# ------------------------------------------------------------------ smollm2 / LlamaForCausalLM
@pytest.fixture(scope="module")
def llama(smollm2):
    """transformers' LlamaForCausalLM (eager, float32) from smollm2's GGUF (as tests/core/test_ablation.py)."""
    from hf_builders import smollm2_llama

    ref = smollm2_llama()
    ls = ref.model.layers
    return HFPatcher(ref, ls, [l.self_attn for l in ls], [l.mlp for l in ls], [l.self_attn.o_proj for l in ls], 64)


# cells where the IOI pair's patches matter (the subject token, 9, and the last position, 13), and
# some before the first difference (restored 0 without a run here; run in full by transformers)
SMOL_CELLS = {
    "resid_pre": [(0, 9), (3, 4), (8, 9), (16, 9), (22, 13), (29, 13)],
    "attn_out": [(0, 9), (2, 1), (14, 13), (23, 13)],
    "mlp_out": [(0, 9), (5, 10), (17, 13), (28, 13)],
    "head": [(0, 3), (17, 4), (20, 0), (23, 3), (29, 1)],
}


@pytest.mark.parametrize("what", ca.activation_patching.WHATS)
def test_smollm2_cells_match_transformers_hooks(smollm2, llama, what, capsys):
    worst, moved, df = _compare(smollm2, llama, IOI_CLEAN, IOI_CORRUPT, " Mary", " John", what, SMOL_CELLS[what])
    with capsys.disabled():
        print(f"\nsmollm2 {what}: max |ours - hooked llama| {worst:.2e} over {len(SMOL_CELLS[what])} cells "
              f"(the patches move the metric by up to {moved:.2f})")
    assert moved > 100 * TOL  # the cells matter, so the comparison can fail
    assert worst < TOL
    n_cells = 30 * (9 if what == "head" else len(smollm2.encode(IOI_CLEAN).ids))
    assert len(df) == n_cells and list(df.columns) == ["layer", "position", "head", "metric", "restored"]


def test_smollm2_ioi_sanity(smollm2):
    """The clean run prefers Mary, the corrupted one John; the whole stream at layer 0 at the one
    differing position restores exactly 1; the same token after it restores nothing at layer 0."""
    df = ca.patch(smollm2, IOI_CLEAN, IOI_CORRUPT, " Mary", " John")
    assert df.attrs["clean_metric"] > 1 and df.attrs["corrupt_metric"] < -1
    assert df.attrs["differ"] == [9]

    def cell(layer, p):
        return float(df[(df.layer == layer) & (df.position == p)].restored.iloc[0])

    assert abs(cell(0, 9) - 1) < 1e-5
    assert abs(cell(0, 10)) < 1e-5  # same token, same embedding: nothing to restore
    check = ca.activation_patching.restore_check(smollm2, IOI_CLEAN, IOI_CORRUPT, " Mary", " John")
    assert abs(check["restored"] - 1) < 1e-5 and abs(check["patched_metric"] - check["clean_metric"]) < 1e-4


# ------------------------------------------------------------------ a tiny random GPT-2 from disk
GPT_CLEAN, GPT_CORRUPT = "alice gave bob the cat because", "alice gave bob the old because"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_builders import build, save

    hf, folder = build("gpt2", tmp_path_factory.mktemp("gpt2") / "g")
    save(hf, folder)
    hf.config._attn_implementation = "eager"
    h = hf.transformer.h
    patcher = HFPatcher(hf, h, [b.attn for b in h], [b.mlp for b in h], [b.attn.c_proj for b in h], 8)
    return core.load_model(str(folder), device="cpu"), patcher


@pytest.mark.parametrize("what", ca.activation_patching.WHATS)
def test_tiny_gpt2_full_grid_matches_transformers_hooks(gpt2, what):
    model, patcher = gpt2
    worst, moved, df = _compare(model, patcher, GPT_CLEAN, GPT_CORRUPT, " the", " old", what)
    assert moved > 100 * TOL
    assert worst < TOL
    if what == "resid_pre":
        p = df.attrs["differ"][0]
        assert abs(float(df[(df.layer == 0) & (df.position == p)].restored.iloc[0]) - 1) < 1e-5


def test_equal_values_restore_zero_when_run(gpt2):
    """A patch whose clean value equals the corrupted one, run through the batched runs anyway
    (the grid skips it), restores 0; the one that differs, run in the same batch, restores 1."""
    model, _ = gpt2
    pair = prepare(model, GPT_CLEAN, GPT_CORRUPT)
    runs = PatchRuns(model, pair, " the", " old", "resid_pre")
    p = pair.differ[0]
    later = len(pair.clean_ids) - 1  # the same token at layer 0: equal embeddings
    assert torch.equal(runs.clean[(0, "in")][later], runs.corrupt[(0, "in")][later])
    same, moved = runs.run_cells(0, [later, p])
    assert abs(runs.restored(same)) < 1e-5
    assert abs(runs.restored(moved) - 1) < 1e-5


def test_answer_and_wrong_as_ids_equal_strings(gpt2):
    model, _ = gpt2
    a, w = output_token_id(model, " the"), output_token_id(model, " old")
    by_str = ca.patch(model, GPT_CLEAN, GPT_CORRUPT, " the", " old", what="head")
    by_id = ca.patch(model, GPT_CLEAN, GPT_CORRUPT, a, w, what="head")
    assert torch.allclose(torch.tensor(by_str.metric.values), torch.tensor(by_id.metric.values), atol=0)
    alone = ca.patch(model, GPT_CLEAN, GPT_CORRUPT, a, None, what="head")  # logit[answer] alone
    assert alone.attrs["wrong_id"] is None and alone.attrs["clean_metric"] != by_id.attrs["clean_metric"]


# ------------------------------------------------------------------ encoder-decoders
TOY_CLEAN, TOY_CORRUPT = "the small dog sees the cat", "the small cat sees the dog"


def test_toy_translate_patches_the_encoder(toy):
    """Encoder positions patched, metric at the first decoder position where the greedy
    translations differ; every cell equals a plain hooked encode + decode of its own."""
    pair = prepare(toy, TOY_CLEAN, TOY_CORRUPT)
    assert pair.stack == "encoder" and pair.clean_next is not None and pair.clean_next != pair.corrupt_next
    net = toy.net

    def ids(s):
        return torch.tensor([toy.encode(s).ids])

    dec = torch.tensor([pair.decoder_input])
    for what in ca.activation_patching.WHATS:
        df = ca.patch(toy, TOY_CLEAN, TOY_CORRUPT, None, pair.corrupt_next, what=what)
        assert df.attrs["answer_id"] == pair.clean_next
        point = ca.activation_patching.POINT[what]
        for r in df.sample(8, random_state=0).itertuples():
            name = f"encoder.{r.layer}.{point}"
            kept = {}
            with torch.inference_mode():
                net.encode(ids(TOY_CLEAN), rec=Hooks({name: lambda t: kept.setdefault("v", t)}))
                cell = r.head if what == "head" else r.position

                def put(t):
                    t = t.clone()
                    t[0, cell] = kept["v"][0, cell]
                    return t

                memory = net.encode(ids(TOY_CORRUPT), rec=Hooks({name: put}))
                logits = net.project(net.decode(dec, memory))[0, -1]
            ref = float(logits[pair.clean_next] - logits[pair.corrupt_next])
            assert abs(ref - r.metric) < TOL, (what, r)
    full = ca.patch(toy, TOY_CLEAN, TOY_CORRUPT, None, pair.corrupt_next)
    assert full.attrs["clean_metric"] > 0 > full.attrs["corrupt_metric"]
    check = ca.activation_patching.restore_check(toy, TOY_CLEAN, TOY_CORRUPT, None, pair.corrupt_next)
    assert abs(check["restored"] - 1) < 1e-5


# ------------------------------------------------------------------ what cannot be patched
def test_different_token_counts_name_both(smollm2):
    with pytest.raises(ValueError, match=r"clean has 14, corrupt has 16"):
        ca.patch(smollm2, IOI_CLEAN, IOI_CORRUPT + " the shop", " Mary", " John")


def test_refusals(smollm2, minilm):
    with pytest.raises(ValueError, match="encoder without an output"):
        ca.patch(minilm, "the cat sat", "the dog sat", "cat")
    with pytest.raises(ValueError, match="same tokens"):
        ca.patch(smollm2, IOI_CLEAN, IOI_CLEAN, " Mary", " John")
    with pytest.raises(ValueError, match="not one"):
        ca.patch(smollm2, IOI_CLEAN, IOI_CORRUPT, " Maryanne", " John")
    with pytest.raises(ValueError, match="what must be one of"):
        ca.patch(smollm2, IOI_CLEAN, IOI_CORRUPT, " Mary", " John", what="resid_post")
