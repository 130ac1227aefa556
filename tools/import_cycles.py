"""Fail when siglip_serve's modules or packages import each other in a cycle.

Every import counts, a lazy one inside a function included: a lazy import hides a cycle from Python's
loader, not from the reader. Only `if TYPE_CHECKING:` blocks are left out (they never run).
Usage: python tools/import_cycles.py [SRC_DIR]   (default: src/siglip_serve)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

ROOT = "siglip_serve"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imported(tree: ast.AST, this: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that `tree` imports (a `from package import module` names the module)."""
    package = this if is_package else this.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known and name != this}


def graph(src: Path) -> dict[str, set[str]]:
    files = {module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    known = set(files)
    return {name: imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known)
            for name, path in files.items()}


def package_of(module: str) -> str:
    """`siglip_serve.serve.app` -> `siglip_serve.serve`; a top-level module is its own package."""
    parts = module.split(".")
    return ".".join(parts[:2])


def package_graph(modules: Mapping[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, targets in modules.items():
        edges = out.setdefault(package_of(name), set())
        edges.update(package_of(t) for t in targets if package_of(t) != package_of(name))
    return out


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main(argv: list[str]) -> int:
    src = Path(argv[0] if argv else "src/siglip_serve")
    modules = graph(src)
    problems = [("packages", c) for c in cycles(package_graph(modules))]
    problems += [("modules", c) for c in cycles(modules)]
    for kind, members in problems:
        print(f"import cycle between {kind}: {' <-> '.join(members)}")
    if not problems:
        print(f"no import cycles among {len(modules)} modules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
