"""Fail when siglip_serve's modules or packages import each other in a cycle.

Every import counts: a lazy one inside a function, one under `if TYPE_CHECKING:` (it never runs, but
the types it names tie the two modules as much as a call does) and a "module:attribute" string naming a
module of the project (`"siglip_serve.serve.app:build_app"`, or an f-string whose parts are the module's
own string constants), which importlib will import. A lazy import or a string hides a cycle from
Python's loader, not from the reader. A circle between modules of one package is one as much as a
circle between packages, and a circle between sub-packages (serve's rooms, or a package and one of its
own) as much as one between top-level packages.
Usage: python tools/import_cycles.py [SRC_DIR]   (default: src/siglip_serve)
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = "siglip_serve"
# "module:attribute", absolute: what importlib is handed (a Serve import_path, a backend's implementation).
IMPORT_STRING = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*")


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _constants(tree: ast.AST) -> dict[str, str]:
    """The module's own string constants (`_MODULE = "siglip_serve.x"`), to read the f-strings built of them."""
    found: dict[str, str] = {}
    for node in getattr(tree, "body", []):
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _string_value(node: ast.AST, constants: dict[str, str]) -> str | None:
    """A string constant, or an f-string of literal parts and the module's constants; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value)
        elif (isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name)
              and value.value.id in constants and value.format_spec is None):
            parts.append(constants[value.value.id])
        else:
            return None
    return "".join(parts)


def import_strings(tree: ast.AST) -> set[str]:
    """The modules that the "module:attribute" strings of `tree` name (an f-string's inner parts aside)."""
    constants = _constants(tree)
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = set()
    for node in ast.walk(tree):
        text = None if id(node) in inner else _string_value(node, constants)
        if text is not None and (match := IMPORT_STRING.fullmatch(text.strip())):
            found.add(match["module"])
    return found


def imported(tree: ast.AST, this: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that `tree` imports (a `from package import module` names the module)."""
    package = this if is_package else this.rpartition(".")[0]
    found: set[str] = import_strings(tree)
    for node in ast.walk(tree):
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


def deepest_package(module: str, packages: set[str]) -> str:
    """The deepest of `packages` that holds `module` (`siglip_serve.serve.ingress.schedule` ->
    `siglip_serve.serve.ingress`); a package is its own."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        if ".".join(parts[:depth]) in packages:
            return ".".join(parts[:depth])
    return module


def package_graph(modules: Mapping[str, set[str]], packages: set[str] | None = None) -> dict[str, set[str]]:
    """Which packages import which: top-level ones, or with `packages` (every package, sub-packages too) the
    deepest package that holds each module."""
    def of(name: str) -> str:
        return package_of(name) if packages is None else deepest_package(name, packages)

    out: dict[str, set[str]] = {}
    for name, targets in modules.items():
        edges = out.setdefault(of(name), set())
        edges.update(of(t) for t in targets if of(t) != of(name))
    return out


def packages_of(modules: Mapping[str, set[str]], src: Path) -> set[str]:
    """Every package among `modules` (a folder with an __init__.py), sub-packages included."""
    return {name for name in modules if (src.parent / name.replace(".", "/") / "__init__.py").is_file()}


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
    problems += [("packages", c) for c in cycles(package_graph(modules, packages_of(modules, src)))
                 if ("packages", c) not in problems]
    problems += [("modules", c) for c in cycles(modules)]
    for kind, members in problems:
        print(f"import cycle between {kind}: {' <-> '.join(members)}")
    if not problems:
        print(f"no import cycles among {len(modules)} modules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
