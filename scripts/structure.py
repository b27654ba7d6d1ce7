"""Print the figures that say how the code base is laid out, so anyone can check the house
stays the way docs/design.md describes it: `python scripts/structure.py [--json]`.

Counted from the source with `ast` and file listings only (nothing is imported or run):
- modules at core's top level, `__init__` and `__main__` not counted (target: at most 14);
- import cycles among the project's modules, counting imports inside functions too (target: none);
- modules in viz/pages that app.py does not register as pages (target: none);
- module file names used more than once in core/ and viz/ (target: at most two);
- head counts read from a map (`trace[...weights"].shape[0]` and the like, target: none):
  each recomputes a whole layer of maps to read one integer;
- modules over their size limit (400 lines; pages 220; bench 500);
- hand-spelled trace names: string literals and f-strings that spell a trace name
  (`.self_attn.`, `.cross_attn.`, `embed.{stack}`, `{stack}.{i}.out|residual|norm|ffn.`,
  `{stack}.final_norm`), outside core/trace_names.py; docstrings and core/loaders/ (checkpoint
  and parameter names) are not counted (target: none).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "viz", "bench")
LIMITS = {"viz/pages": 220, "bench": 500}
DEFAULT_LIMIT = 400
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
    text = (ROOT / "app.py").read_text(encoding="utf-8")
    return set(re.findall(r"st\.Page\(\s*[\"']([^\"']+\.py)[\"']", text))


def limit_for(rel: str) -> int:
    for prefix, n in LIMITS.items():
        if rel.startswith(prefix + "/"):
            return n
    return DEFAULT_LIMIT


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


def figures() -> dict:
    files = {p: p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in py_files(pkg)}
    known = {module_name(p) for p in files}
    graph = {module_name(p): imports_of(p, known) for p in files}
    core_top = sorted(p.name for p in (ROOT / "core").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    pages = registered_pages()
    page_files = sorted(rel for rel in files.values() if rel.startswith("viz/pages/") and rel.count("/") == 2)
    not_pages = [rel for rel in page_files if rel not in pages and not rel.endswith("__init__.py")]
    names = Counter(p.name for p, rel in files.items() if rel.split("/")[0] in ("core", "viz")
                    and p.name not in ("__init__.py", "__main__.py"))
    twice = {n: c for n, c in sorted(names.items()) if c > 1}
    head_counts = []
    over = []
    spelled = defaultdict(int)
    for p, rel in sorted(files.items(), key=lambda kv: kv[1]):
        text = p.read_text(encoding="utf-8")
        for i, line in enumerate(text.splitlines(), 1):
            if HEAD_COUNT.search(line):
                head_counts.append(f"{rel}:{i}")
        n_lines = text.count("\n") + 1
        if n_lines > limit_for(rel):
            over.append(f"{rel} ({n_lines} > {limit_for(rel)})")
        if rel.split("/")[0] in ("core", "viz") and rel != "core/trace_names.py" and not rel.startswith("core/loaders/"):
            k = name_literals(p)
            if k:
                spelled[rel] = k
    return {
        "core_top_level_modules": len(core_top),
        "import_cycles": cycles(graph),
        "viz_pages_not_pages": not_pages,
        "file_names_used_twice": twice,
        "head_counts_from_a_map": head_counts,
        "modules_over_limit": over,
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
    print(f"import cycles (imports inside functions included): {len(f['import_cycles'])} (target 0)")
    for c in f["import_cycles"]:
        print(f"  {len(c)} modules: {', '.join(c)}")
    print(f"modules in viz/pages that are not pages: {len(f['viz_pages_not_pages'])} (target 0)")
    if f["viz_pages_not_pages"]:
        print("  " + ", ".join(Path(r).name for r in f["viz_pages_not_pages"]))
    print(f"file names used more than once in core/ and viz/: {len(f['file_names_used_twice'])} (target <= 2)")
    for n, c in f["file_names_used_twice"].items():
        print(f"  {n} x{c}")
    print(f"head counts read from a map: {len(f['head_counts_from_a_map'])} (target 0)")
    for w in f["head_counts_from_a_map"]:
        print(f"  {w}")
    print(f"modules over their size limit (400; pages 220; bench 500): {len(f['modules_over_limit'])}")
    for w in f["modules_over_limit"]:
        print(f"  {w}")
    print(f"trace names spelled by hand in core/ and viz/: {f['hand_spelled_trace_names']} (target 0)")
    for rel, n in f["hand_spelled_by_module"].items():
        print(f"  {rel}: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
