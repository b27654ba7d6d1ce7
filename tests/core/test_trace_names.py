"""core.trace_names: the one module that builds and parses trace names. Every name a real pass
records parses and prints back unchanged; the builders give the names the network records;
what a traced pass stores is what the contract says; a pickled trace keeps what it stored
and recomputes the rest on its model; docs/design.md lists every name the module knows."""

import pickle
import re
from pathlib import Path

import pytest
import torch

import core
import core.layer_runner
from core import trace_names as tn
from core.net.config import ModelConfig
from core.registry import load_random

ROOT = Path(__file__).resolve().parents[2]
TEXT = "the small dog sees the cat"


@pytest.fixture(scope="module")
def toy_trace(toy):
    return toy.trace(TEXT)


def _rope_t5_models():
    """Tiny random models for the names the bundled toy does not record: RoPE (q_pre_rope) with
    pre-norm, and T5's relative position bias."""
    rope = load_random(device="cpu", config=ModelConfig(kind="decoder", n_layers=2, d_model=32, n_heads=4,
                                                        n_kv_heads=2, d_ff=64, max_len=64, positional="rope",
                                                        norm="rmsnorm", norm_placement="pre", activation="swiglu"))
    t5 = load_random(device="cpu", config=ModelConfig(kind="encoder-decoder", n_layers=1, n_decoder_layers=1,
                                                      d_model=32, n_heads=4, d_ff=64, max_len=64,
                                                      positional="relative"))
    return rope, t5


def test_every_recorded_name_parses_and_prints_back(toy_trace):
    rope, t5 = _rope_t5_models()
    traces = [toy_trace, rope.trace("the cat"), t5.trace("the cat", target="the dog")]
    seen_parts = set()
    for tr in traces:
        for name in list(tr) + ["tokens.source"]:
            p = tn.parse(name)
            assert str(p) == name, (name, p)
            seen_parts.add(p.part)
            if p.layer is not None:
                assert tn.at(p.stack, p.layer, p.local()) == name
                assert tn.layer_of(name) == (p.stack, p.layer)
            else:
                assert tn.layer_of(name) is None
    assert seen_parts == {"embed", "self_attn", "cross_attn", "ffn", "block", "final_norm", "output", "tokens"}
    names = set(traces[1]) | set(traces[2])
    assert tn.self_attn("decoder", 1, "q_pre_rope") in names and tn.self_attn("encoder", 0, "position_bias") in names


def test_builders_give_the_names_the_network_records(toy_trace):
    tr = toy_trace
    expected = {
        tn.embed("encoder", "tokens"): "embed.encoder.tokens",
        tn.embed("decoder"): "embed.decoder.sum",
        tn.self_attn("encoder", 2, "weights"): "encoder.2.self_attn.weights",
        tn.cross_attn("decoder", 1, "weights"): "decoder.1.cross_attn.weights",
        tn.attn("decoder", 0, tn.SELF, "mask"): "decoder.0.self_attn.mask",
        tn.ffn("encoder", 0, "hidden"): "encoder.0.ffn.hidden",
        tn.residual("decoder", 0, 3): "decoder.0.residual3",
        tn.norm("decoder", 0, 2): "decoder.0.norm2",
        tn.out("encoder", 1): "encoder.1.out",
        tn.stored_input("decoder", 0): "embed.decoder.sum",
        tn.stored_input("decoder", 2): "decoder.1.out",
    }
    for built, literal in expected.items():  # the literal is the contract
        assert built == literal
        assert literal in tr
    assert tn.stack_output(tr, "encoder") == f"encoder.{tr.layers('encoder') - 1}.out"  # post-norm: no final norm


def test_what_a_traced_pass_stores_is_the_contract(toy_trace):
    """Stored: embeddings, every layer's output, each attention's heads, final norms, top-k and
    the last distribution; everything else recomputed (read off the parsed name, not is_stored)."""
    rope, _ = _rope_t5_models()
    for tr in (toy_trace, rope.trace("the cat")):
        for name in tr:
            p = tn.parse(name)
            contract = (p.part in ("embed", "final_norm") or (p.part == "block" and p.step == "out")
                        or (p.part in tn.ATTNS and p.step == "heads") or name in tn.TOPK + tn.STEP_NAMES)
            assert tr.is_stored(name) == contract == tn.is_stored(name), name


@pytest.mark.parametrize("name", ["decoder.3.self_attn.value_norms", "decoder.0.self_attn.capped",
                                  "decoder.2.self_attn.q_pre_norm", "decoder.2.self_attn.k_pre_norm",
                                  "decoder.4.post_norm2", "decoder.1.in"])
def test_names_added_by_newer_layers_parse(name):
    p = tn.parse(name)
    assert str(p) == name and p.layer is not None


@pytest.mark.parametrize("name", ["encoder.x.self_attn.weights", "encoder.0.self_attn.nope", "encoder.0.mlp.out",
                                  "embed.encoder.foo", "middle.0.out", "decoder.final", "weights", "encoder.0.norm"])
def test_a_name_that_is_none_is_a_valueerror(name):
    with pytest.raises(ValueError, match="is not a trace name"):
        tn.parse(name)
    assert not tn.is_name(name)


def test_maps_and_sides():
    assert tn.is_map("decoder.1.cross_attn.weights") and tn.is_map("encoder.0.self_attn.value_norms")
    assert not tn.is_map("encoder.0.self_attn.q") and not tn.is_map("encoder.0.ffn.out")
    w = torch.zeros(4, 5, 5)  # H x n x n, a decoder self-attention map
    assert tn.decoder_rows("decoder.0.self_attn.weights", w, 3).shape == (4, 3, 3)
    assert tn.decoder_rows("decoder.0.cross_attn.k", torch.zeros(4, 7, 8), 3).shape == (4, 7, 8)  # the source's
    assert tn.decoder_rows("encoder.0.self_attn.weights", w, 3) is w


# ------------------------------------------------------------------ pickling
def test_a_pickled_trace_keeps_what_it_stored_and_recomputes_the_rest(toy):
    tr = toy.trace(TEXT)
    blob = pickle.dumps(tr)
    back = pickle.loads(blob)
    assert list(back) == list(tr) and back.stored_names() == tr.stored_names()
    assert back.tokens("target") == tr.tokens("target") and back.meta == tr.meta
    for name in (tn.cross_attn("decoder", 1, "weights"), tn.ffn("encoder", 2, "hidden"), tn.PROBS):
        assert not back.is_stored(name)
        assert torch.equal(back[name], tr[name]), name  # recomputed on the same model: the same numbers
    assert "recomputes the rest on the model 'toy-translate'" in repr(back)
    assert "recomputes" in type(tr).__getstate__.__doc__
    # nothing was computed to pickle it: the stored tensors, not every layer's maps
    every_name = len(pickle.dumps({n: tr[n] for n in tr}))
    assert len(blob) < every_name / 2, (len(blob), every_name)


def test_a_pickled_step_view_is_the_same_step(toy):
    steps = toy.steps(TEXT)
    view = steps[2]
    back = pickle.loads(pickle.dumps(view))
    name = tn.self_attn("decoder", 0, "weights")
    assert back[name].shape == view[name].shape and torch.equal(back[name], view[name])
    assert back.tokens("next") == view.tokens("next") and torch.equal(back[tn.NEXT_PROBS], view[tn.NEXT_PROBS])
    assert back.meta["step"] == view.meta["step"] == 3


def test_unpickled_without_its_model_says_which_model_it_needs(toy, monkeypatch):
    tr = toy.trace(TEXT)
    blob = pickle.dumps(tr)
    monkeypatch.setattr(core.layer_runner, "_MODELS", {})  # as in another process
    back = pickle.loads(blob)
    assert torch.equal(back[tn.out("encoder", 1)], tr[tn.out("encoder", 1)])  # stored: still there
    with pytest.raises(KeyError, match="toy-translate"):
        back[tn.cross_attn("decoder", 0, "weights")]
    assert "not loaded in this process" in repr(back)


# ------------------------------------------------------------------ the design document
def test_design_doc_lists_every_name_the_module_knows():
    """docs/design.md's trace-name table covers every pattern core.trace_names builds or parses."""
    doc = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = doc.split("## Trace names", 1)[1].split("\n## ", 1)[0]
    rows = " ".join(line for line in section.splitlines() if line.startswith("|"))
    spelled = set(re.findall(r"`([^`]+)`", rows))
    missing = [p for p in tn.patterns() if p not in spelled]
    assert not missing, f"docs/design.md's trace-name table lacks {missing}"


def _page_fields() -> dict:
    """{page: the fields its PageState reads}, read from the page scripts' source (nothing run)."""
    import ast
    import importlib

    def fields_of(expr, modules) -> list:
        """A literal tuple, a shared tuple of an imported module (why_panel.FIELDS), or their sum."""
        if isinstance(expr, ast.Tuple):
            return [e.value for e in expr.elts if isinstance(e, ast.Constant)]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return fields_of(expr.left, modules) + fields_of(expr.right, modules)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in modules:
            return list(getattr(importlib.import_module(modules[expr.value.id]), expr.attr))
        return []

    out = {}
    for path in sorted((ROOT / "viz").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = {}  # the names this file binds to a module: `from viz.ui import why_panel as wp`
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                modules.update({a.asname: a.name for a in node.names if a.asname})
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func not in ("PageState", "__init__"):
                continue
            for kw in node.keywords:
                if kw.arg == "fields" and fields_of(kw.value, modules):
                    out.setdefault(node.args[0].value, set()).update(fields_of(kw.value, modules))
    return out


def test_design_doc_lists_every_url_parameter_of_every_page():
    doc = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = doc.split("## Pages and URLs", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) == 2:
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
            if "(below)" in cells[1]:  # "every control of its tabs (below)": named in the prose under the table
                rows[cells[0].strip("`")] |= set(re.findall(r"`([^`]+)`", section.split("\n\n", 1)[-1]))
    pages = _page_fields()
    assert {"explore", "inside", "decoder", "heads", "corpus"} <= set(pages), pages
    for page, fields in pages.items():
        assert page in rows, f"docs/design.md's URL table has no row for {page}"
        missing = fields - rows[page]
        assert not missing, f"{page}: docs/design.md does not name {sorted(missing)}"
