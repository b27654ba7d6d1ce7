"""Print the figures that say how the code base is laid out, and check its rules, so anyone can
see the house stays the way docs/design.md describes it: `python scripts/structure.py [--json]`.

Counted from the source with `ast` and file listings only (nothing is imported or run). The
rules (tests/core/test_structure.py holds each at its target):
- only a page (`viz/<feature>/page.py`), a page's Streamlit parts (`*_panel.py`) and `viz/ui/`
  import Streamlit;
- no feature folder imports another; `viz/figures/` (shared pure pieces) imports no feature and
  not `viz/ui/`; `viz/ui/` (shared Streamlit parts) imports no feature;
- core never imports viz;
- every module in `viz/figures/` is shared: used by at least two places, a place being a
  feature folder, `viz/ui`, core, bench or viz's top level (tests and scripts are not places).
  A use counts when the place imports the module directly or through other modules of
  `viz/figures/` or `viz/ui/` (whoever uses those uses it too; `viz/ui` is a place as well).
  A module that one feature alone uses belongs in that feature's folder;
- nothing in `viz/figures/` (shared pure figures) runs a model: no call of a method that runs
  one (RUNS_A_MODEL: the model's trace, steps, greedy_run, forced_logits, trace_decoder_input,
  generate; a module's forward). What runs a model lives in core or `viz/ui/`;
- no import cycle among the project's modules, counting imports inside functions;
- every feature folder's page.py is in the page registry (viz/ui/registry.py), and every
  registered page has its page.py;
- no head count read from a map (`trace[...weights"].shape[0]`: it recomputes a layer's maps);
- no trace name spelled by hand outside core/trace_names.py (`.self_attn.`, `embed.{stack}`,
  `{stack}.{i}.out|residual|norm|ffn.`, `{stack}.final_norm`); docstrings and core/loaders/
  (checkpoint and parameter names) are not counted.
Figures only (no target): modules at core's top level and viz's, the feature folders, core's
longest import chain.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "viz", "bench")
SHARED = ("figures", "ui")  # viz's shared layers; every other folder in viz/ is a feature (a page)
RUNS_A_MODEL = ("trace", "steps", "greedy_run", "forced_logits", "trace_decoder_input", "generate", "forward")
HEAD_COUNT = re.compile(r"""\[[^\[\]]*(weights|scores|scaled|masked)["'][^\[\]]*\]\s*\.shape\[0\]""")
# A trace name spelled out: an attention's step, an embedding, a layer's own names, a final norm.
# Not counted: docstrings and messages that describe the pattern ("{stack}.{i}..."), and core/loaders/,
# whose strings name checkpoint tensors and parameters ("encoder.{i}.self_attn.w_q"), never a trace name.
NAME_LITERAL = re.compile(r"(self_attn|cross_attn)\.(?!w_)|^embed\.(encoder|decoder|\{x\})|"
                          r"^(encoder|decoder|\{x\})\.(\d+|\{x\})\.(out|in|residual|norm|post_norm|ffn\.)|"
                          r"^(encoder|decoder|\{x\})\.final_norm$")


def py_files(package: str) -> list:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, known: set) -> set:
    """Project modules that `path` imports anywhere in the file (top level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()

    def add(name: str) -> None:
        while name and name not in known:  # `from core.trace import Trace`: core.trace
            name = name.rpartition(".")[0]
        if name and name != me:
            found.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}" if base else a.name
                add(full if full in known else base)
    return found


def cycles(graph: dict) -> list:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def registered_pages() -> set:
    """The page keys viz/ui/registry.py lists (`PageSpec("lens", ...)`)."""
    path = ROOT / "viz" / "ui" / "registry.py"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return set(re.findall(r"PageSpec\(\s*[\"']([a-z_]+)[\"']", text))


def viz_layer(rel: str):
    """(kind, folder) of a module under viz/: ("top", None), ("shared", "figures"|"ui") or ("feature", name)."""
    parts = rel.split("/")
    if len(parts) == 2:
        return "top", None
    return ("shared" if parts[1] in SHARED else "feature"), parts[1]


def imports_streamlit(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "streamlit" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "streamlit":
            return True
    return False


def streamlit_allowed(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return rel.startswith("viz/ui/") or (rel.startswith("viz/") and (name == "page.py" or name.endswith("_panel.py")))


def layer_breaks(graph: dict, rel_of: dict) -> list:
    """Imports that break the layers, as "importer -> imported": a feature importing another
    feature, viz/figures or viz/ui importing a feature, viz/figures importing viz/ui, core
    importing viz."""
    out = []
    for mod, deps in sorted(graph.items()):
        rel = rel_of[mod]
        for dep in sorted(deps):
            drel = rel_of[dep]
            if rel.startswith("core/") and drel.startswith("viz/"):
                out.append(f"{mod} -> {dep}")
            if not (rel.startswith("viz/") and drel.startswith("viz/")):
                continue
            (_, name), (dkind, dname) = viz_layer(rel), viz_layer(drel)
            if dkind == "feature" and name != dname:
                out.append(f"{mod} -> {dep}")
            elif name == "figures" and dname == "ui":
                out.append(f"{mod} -> {dep}")
    return out


def place_of(rel: str) -> str:
    """The place a module belongs to, for the sharing rule: 'viz/<feature>', 'viz/ui', 'viz/figures',
    'viz' (its top level), or its top folder ('core', 'bench')."""
    parts = rel.split("/")
    if parts[0] != "viz":
        return parts[0]
    return "viz" if len(parts) == 2 else f"viz/{parts[1]}"


def users(graph: dict, rel_of: dict) -> dict:
    """{module in viz/figures: the places that use it}, a use counted through other modules of
    viz/figures and viz/ui (their users use it too; viz/ui is a place of its own as well)."""
    importers = defaultdict(set)
    for mod, deps in graph.items():
        for dep in deps:
            importers[dep].add(mod)
    memo: dict = {}

    def places(mod, seen):
        if mod in memo:
            return memo[mod]
        out = set()
        for imp in importers.get(mod, ()):
            where = place_of(rel_of[imp])
            if where in ("viz/figures", "viz/ui"):
                if where == "viz/ui":
                    out.add(where)
                if imp not in seen:
                    out |= places(imp, seen | {imp})
            else:
                out.add(where)
        memo[mod] = out
        return out

    return {m: places(m, frozenset({m})) for m in sorted(graph) if place_of(rel_of[m]) == "viz/figures"
            and rel_of[m] != "viz/figures/__init__.py"}


def unshared(graph: dict, rel_of: dict) -> list:
    """Modules of viz/figures that fewer than two places use, as 'path: used by ...'."""
    return [f"{rel_of[m]}: used by {', '.join(sorted(p)) or 'nothing'}"
            for m, p in users(graph, rel_of).items() if len(p) < 2]


def longest_chain(graph: dict, prefix: str) -> list:
    """The longest chain of imports among the modules under `prefix`, importer first."""
    nodes = {m for m in graph if m.startswith(prefix + ".")}
    best: dict = {}

    def chain(m, seen):
        if m in best:
            return best[m]
        if m in seen:  # a cycle: stop (the cycle count reports it)
            return [m]
        longest: list = []
        for d in graph.get(m, ()):
            if d in nodes:
                c = chain(d, seen | {m})
                if len(c) > len(longest):
                    longest = c
        best[m] = [m] + longest
        return best[m]

    return max((chain(m, frozenset()) for m in sorted(nodes)), key=len, default=[])


def name_literals(path: Path) -> int:
    """String constants and f-string pieces in `path` that spell a trace name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    docs |= {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}  # counted whole
    n = 0
    for node in ast.walk(tree):
        if id(node) in docs:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{x}"
                           for v in node.values)
            n += bool(NAME_LITERAL.search(text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" not in node.value:
            n += bool(NAME_LITERAL.search(node.value)) and len(node.value) < 80
    return n


def model_runs(path: Path) -> list:
    """Lines of `path` that call a method that runs a model (RUNS_A_MODEL), as 'line method'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sorted(f"{n.lineno} {n.func.attr}" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in RUNS_A_MODEL)


def figures() -> dict:
    files = {p: p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in py_files(pkg)}
    known = {module_name(p) for p in files}
    rel_of = {module_name(p): rel for p, rel in files.items()}
    graph = {module_name(p): imports_of(p, known) for p in files}
    core_top = sorted(p.name for p in (ROOT / "core").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    viz_top = sorted(p.name for p in (ROOT / "viz").glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in (ROOT / "viz").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    features = [f for f in folders if f not in SHARED]
    pages = {f for f in features if (ROOT / "viz" / f / "page.py").exists()}
    registered = registered_pages()
    head_counts, streamlit, runs = [], [], []
    spelled = defaultdict(int)
    for p, rel in sorted(files.items(), key=lambda kv: kv[1]):
        text = p.read_text(encoding="utf-8")
        for i, line in enumerate(text.splitlines(), 1):
            if HEAD_COUNT.search(line):
                head_counts.append(f"{rel}:{i}")
        if rel.split("/")[0] in ("core", "viz") and rel != "core/trace_names.py" and not rel.startswith("core/loaders/"):
            k = name_literals(p)
            if k:
                spelled[rel] = k
        if rel.split("/")[0] in ("core", "viz") and not streamlit_allowed(rel) and imports_streamlit(p):
            streamlit.append(rel)
        if rel.startswith("viz/figures/"):
            runs += [f"{rel}:{where}" for where in model_runs(p)]
    chain = longest_chain(graph, "core")
    return {
        "core_top_level_modules": len(core_top),
        "viz_top_level_modules": viz_top,
        "viz_feature_folders": features,
        "import_cycles": cycles(graph),
        "streamlit_outside_pages_panels_ui": streamlit,
        "layer_breaks": layer_breaks(graph, rel_of),
        "model_runs_in_viz_figures": runs,
        "viz_figures_used_by_one_place": unshared(graph, rel_of),
        "pages_not_registered": sorted(pages - registered),
        "registered_without_page": sorted(registered - pages),
        "core_longest_import_chain": len(chain),
        "core_longest_import_chain_modules": chain,
        "head_counts_from_a_map": head_counts,
        "hand_spelled_trace_names": sum(spelled.values()),
        "hand_spelled_by_module": dict(sorted(spelled.items(), key=lambda kv: -kv[1])),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args(argv)
    f = figures()
    if args.json:
        print(json.dumps(f, indent=1))
        return 0
    print(f"modules at core's top level: {f['core_top_level_modules']} (target <= 14)")
    print(f"modules at viz's top level: {len(f['viz_top_level_modules'])} ({', '.join(f['viz_top_level_modules'])})")
    print(f"feature folders in viz: {len(f['viz_feature_folders'])} ({', '.join(f['viz_feature_folders'])})")
    print(f"core's longest import chain: {f['core_longest_import_chain']} modules")
    print(f"import cycles (imports inside functions included): {len(f['import_cycles'])} (target 0)")
    for c in f["import_cycles"]:
        print(f"  {len(c)} modules: {', '.join(c)}")
    print("modules outside page.py, *_panel.py and viz/ui that import Streamlit: "
          f"{len(f['streamlit_outside_pages_panels_ui'])} (target 0)")
    for w in f["streamlit_outside_pages_panels_ui"]:
        print(f"  {w}")
    print(f"imports that break the layers (feature -> another feature, shared -> feature, figures -> ui, "
          f"core -> viz): {len(f['layer_breaks'])} (target 0)")
    for w in f["layer_breaks"]:
        print(f"  {w}")
    print(f"calls that run a model in viz/figures: {len(f['model_runs_in_viz_figures'])} (target 0)")
    for w in f["model_runs_in_viz_figures"]:
        print(f"  {w}")
    print(f"modules in viz/figures that fewer than two places use (features, viz/ui, core, bench; through "
          f"viz/figures and viz/ui): {len(f['viz_figures_used_by_one_place'])} (target 0)")
    for w in f["viz_figures_used_by_one_place"]:
        print(f"  {w}")
    print(f"pages not in the registry: {len(f['pages_not_registered'])}; registered pages with no page.py: "
          f"{len(f['registered_without_page'])} (target 0 and 0)")
    print(f"head counts read from a map: {len(f['head_counts_from_a_map'])} (target 0)")
    for w in f["head_counts_from_a_map"]:
        print(f"  {w}")
    print(f"trace names spelled by hand in core/ and viz/: {f['hand_spelled_trace_names']} (target 0)")
    for rel, n in f["hand_spelled_by_module"].items():
        print(f"  {rel}: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
