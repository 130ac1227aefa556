"""The checkout's folders are imported under one name, `siglip_serve.<folder>`: a module that imported a
folder by its bare name (`from models...`) would run from a checkout, where the root is on the path,
and fail from the wheel, or load a second copy of a module beside the first."""

from __future__ import annotations

import ast

from tests.helpers import REPO

FOLDERS = ("core", "models", "serve", "loadtest", "measure", "kernels", "bulk")


def bare_imports(path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                  if name.split(".")[0] in FOLDERS]
    return found


def test_every_module_imports_the_project_as_siglip_serve() -> None:
    files = [f for folder in (*FOLDERS, "tests") for f in sorted((REPO / folder).rglob("*.py"))]
    assert len(files) > 100
    offenders = [line for f in files for line in bare_imports(f)]
    assert offenders == []
