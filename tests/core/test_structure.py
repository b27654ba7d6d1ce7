"""The house's layout holds: what the README, docs/design.md, the notebook and the CLI use is
importable from where they use it, and scripts/structure.py's figures for core stay on target
(at most 14 modules at core's top level, no import cycle, imports inside functions counted),
its layer rules hold and every module in viz/figures is shared."""

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/design.md", "docs/decisions.md", "examples/quickstart.ipynb")

# (module, name) pairs the README, docs/design.md and examples/quickstart.ipynb use, listed by hand
PUBLIC = [
    ("core", "load_model"),
    ("core", "MODELS"),
    ("core", "ModelConfig"),
    ("core", "ModelUnavailable"),
    ("core", "InputError"),
    ("core", "AttentionModel"),
    ("core", "Trace"),
    ("core", "Transformer"),
    ("core", "Recorder"),
    ("core", "sinusoidal_encoding"),
    ("core", "rope_angles"),
    ("core", "scaled_dot_product_attention"),
    ("core", "pick_device"),
    ("core.analysis", "head_scores"),
    ("core.analysis", "rollout"),
    ("core.analysis", "flow"),
    ("core.analysis", "top_heads"),
    ("core.frames", "frame"),
    ("core.frames", "frames"),
    ("core.toy.toy_model", "load_toy"),
    ("core.registry", "load_random"),
    ("core.registry", "ModelSpec"),
    ("core.loaders.hf_seq2seq", "load"),
    ("core.loaders.hf", "load_path"),
    ("core.tokens.tokenizer", "display_pieces"),
    ("core.trace", "decoder_rows"),
    ("core.device", "configure_threads"),
    ("core.device", "keep_freed_memory"),
    ("core.net.attention", "scaled_dot_product_attention"),
    ("core.net.cost", "param_formula"),
    ("core.cli", "main"),
    ("core.cli.train_toy", "main"),
    ("core.cli.corpus_data", "main"),
    ("core.__main__", "main"),
]


_FIGURES: dict = {}


def figures() -> dict:
    """scripts/structure.py's figures for this checkout, computed once per run."""
    if not _FIGURES:
        _FIGURES.update(load_structure().figures())
    return _FIGURES


def load_structure():
    spec = importlib.util.spec_from_file_location("structure", ROOT / "scripts" / "structure.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("module,name", PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_public_name_is_importable(module, name):
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"


def resolve(dotted: str) -> bool:
    """Whether `core.a.b.c` names a module or an attribute of one (the longest importable prefix)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        try:
            for p in parts[k:]:
                obj = getattr(obj, p)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_core_path_in_the_docs_resolves():
    """Each `core.x.y` the README, design notes and notebook write names something that exists,
    and each `core/x/y.py` they name is a file."""
    dotted, paths = set(), set()
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        dotted |= set(re.findall(r"(?<![\w./])core(?:\.[A-Za-z_]\w*)+", text))
        paths |= set(re.findall(r"(?<![\w./])core/[\w/]+\.py", text))
    assert {"core.load_model", "core.analysis.head_scores", "core.frames"} <= dotted  # the scan reads the docs
    missing = sorted(d for d in dotted if not resolve(d))
    assert not missing, f"the docs name these, which do not exist: {missing}"
    gone = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not gone, f"the docs name these files, which do not exist: {gone}"


def test_python_dash_m_modules_and_the_entry_point():
    for mod in ("core", "core.cli.train_toy", "core.cli.corpus_data"):
        spec = importlib.util.find_spec(mod if mod != "core" else "core.__main__")
        assert spec is not None, f"python -m {mod} has no module"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    target = scripts["attention-lab"]
    mod, _, fn = target.partition(":")
    assert callable(getattr(importlib.import_module(mod), fn)), target


def test_structure_figures_hold():
    f = figures()
    assert f["core_top_level_modules"] <= 14, f["core_top_level_modules"]
    assert f["import_cycles"] == [], f["import_cycles"]
    assert f["hand_spelled_trace_names"] == 0, f["hand_spelled_by_module"]  # core.trace_names builds them
    assert f["head_counts_from_a_map"] == [], f["head_counts_from_a_map"]


def test_the_layer_rules_hold():
    """Only page.py, *_panel.py and viz/ui import Streamlit; no feature folder imports another,
    viz/figures imports neither viz/ui nor a feature, viz/ui no feature, core never viz; every
    feature folder is a registered page and every registered page has its folder."""
    f = figures()
    assert len(f["viz_feature_folders"]) >= 14, f["viz_feature_folders"]  # the scan sees the folders
    assert f["streamlit_outside_pages_panels_ui"] == [], f["streamlit_outside_pages_panels_ui"]
    assert f["layer_breaks"] == [], f["layer_breaks"]
    assert f["model_runs_in_viz_figures"] == [], f["model_runs_in_viz_figures"]  # what runs a model: core or viz/ui
    assert f["pages_not_registered"] == [] and f["registered_without_page"] == [], f


def test_every_viz_figures_module_is_shared():
    """Each module in viz/figures is used by two places at least (features, viz/ui, core, bench;
    counted through viz/figures and viz/ui): what one feature alone uses lives in its folder."""
    f = figures()
    assert f["viz_figures_used_by_one_place"] == [], f["viz_figures_used_by_one_place"]


def _tree(tmp_path, files: dict):
    for rel, text in {"viz/__init__.py": "", "viz/ui/__init__.py": "", "viz/figures/__init__.py": "",
                      "core/__init__.py": "", "bench/__init__.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)


def test_structure_sees_each_broken_rule(tmp_path, monkeypatch):
    """Each rule can fail: a feature importing another, figures importing ui, ui importing a
    feature, core importing viz, Streamlit in a figures module, a figures module that runs a
    model, a page missing from the registry."""
    s = load_structure()
    _tree(tmp_path, {
        "viz/ui/registry.py": 'PAGES = [PageSpec("lens", "Lens"), PageSpec("gone", "Gone")]\n',
        "viz/ui/widgets.py": "from viz.lens import figures\n",
        "viz/figures/grid.py": "import streamlit as st\nfrom viz.ui import widgets\n",
        "viz/figures/check.py": "def f(model, text):\n    ids = text.encode('utf-8')\n    return model.greedy_run(text, 2)\n",
        "viz/lens/__init__.py": "", "viz/lens/page.py": "import streamlit\nfrom viz.heads import figures\n",
        "viz/lens/figures.py": "", "viz/lens/run_panel.py": "import streamlit\n",
        "viz/heads/__init__.py": "", "viz/heads/page.py": "", "viz/heads/figures.py": "",
        "core/a.py": "def f():\n    from viz.figures import grid\n",
    })
    monkeypatch.setattr(s, "ROOT", tmp_path)
    f = s.figures()
    assert f["streamlit_outside_pages_panels_ui"] == ["viz/figures/grid.py"]
    assert sorted(f["layer_breaks"]) == ["core.a -> viz.figures.grid", "viz.figures.grid -> viz.ui.widgets",
                                         "viz.lens.page -> viz.heads.figures", "viz.ui.widgets -> viz.lens.figures"]
    assert f["pages_not_registered"] == ["heads"] and f["registered_without_page"] == ["gone"]
    assert f["model_runs_in_viz_figures"] == ["viz/figures/check.py:3 greedy_run"]  # a str's encode is no model


def test_structure_sees_a_viz_figures_module_one_feature_uses(tmp_path, monkeypatch):
    """The sharing rule can fail: a viz/figures module only Lens imports, one only that module
    imports (still Lens alone) and one nothing imports are reported; a test's import is no use;
    a module two features import, and one that viz/ui imports for a page, pass."""
    s = load_structure()
    _tree(tmp_path, {
        "viz/ui/widgets.py": "from viz.figures import through_ui\n",
        "viz/figures/lens_only.py": "from viz.figures import helper\n",
        "viz/figures/helper.py": "", "viz/figures/unused.py": "",
        "viz/figures/shared.py": "", "viz/figures/through_ui.py": "",
        "viz/lens/__init__.py": "", "viz/lens/page.py": "from viz.figures import lens_only, shared\n",
        "viz/heads/__init__.py": "",
        "viz/heads/page.py": "from viz.figures import shared\nfrom viz.ui import widgets\n",
        "tests/test_lens.py": "from viz.figures import lens_only, unused\n",
    })
    monkeypatch.setattr(s, "ROOT", tmp_path)
    assert s.figures()["viz_figures_used_by_one_place"] == [
        "viz/figures/helper.py: used by viz/lens", "viz/figures/lens_only.py: used by viz/lens",
        "viz/figures/unused.py: used by nothing"]


def test_structure_counts_a_hand_spelled_trace_name(tmp_path):
    """The count sees trace names spelled out, and not parameter names or docstrings."""
    s = load_structure()
    path = tmp_path / "m.py"
    path.write_text('"""Reads {stack}.{i}.self_attn.weights."""\n'
                    'A = f"{stack}.{i}.self_attn.weights"\nB = "embed.encoder.sum"\nC = f"{stack}.{i}.out"\n'
                    'D = "decoder.final_norm"\nE = f"{stack}.{i}.self_attn.w_q.weight"\nF = "self-attention"\n')
    assert s.name_literals(path) == 4


def test_structure_counts_an_import_inside_a_function_as_a_cycle(tmp_path, monkeypatch):
    """The cycle count sees an import hidden in a function (what once held nine modules together)."""
    s = load_structure()
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("x = 1\n\ndef f():\n    from .a import x\n    return x\n")
    (tmp_path / "viz").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "app.py").write_text("")
    monkeypatch.setattr(s, "ROOT", tmp_path)
    f = s.figures()
    assert f["import_cycles"] == [["core.a", "core.b"]]
    assert f["core_top_level_modules"] == 2


def test_every_import_in_the_notebook_and_readme_resolves():
    """Each `from core... import x` / `from viz... import x` in the notebook's code cells and the
    README's and design.md's code blocks names a module or attribute that exists (a move of a
    module must move its readers' imports too)."""
    import ast
    import json

    sources = ["".join(c["source"]) for c in json.loads((ROOT / "examples" / "quickstart.ipynb").read_text(
        encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    for doc in ("README.md", "docs/design.md"):
        sources += re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(encoding="utf-8"), re.S)
    checked = []
    for src in sources:
        lines = [ln for ln in src.splitlines() if re.match(r"\s*(from|import) (core|viz)\b", ln)]
        for node in ast.walk(ast.parse("\n".join(ln.strip() for ln in lines))):
            if isinstance(node, ast.ImportFrom):
                mod = importlib.import_module(node.module)
                for a in node.names:
                    ok = hasattr(mod, a.name) or importlib.util.find_spec(f"{node.module}.{a.name}") is not None
                    assert ok, f"from {node.module} import {a.name}: no such name"
                    checked.append(f"{node.module}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    importlib.import_module(a.name)
                    checked.append(a.name)
    assert any(c.startswith("viz.") for c in checked) and any(c.startswith("core") for c in checked), checked
