"""The package's layout is its architecture: one `siglip_serve` under src/, packages that import each
other in one direction only (tools/import_cycles.py, run by `make lint`), and no module that imports a
package of the project by a bare name (`from models...` would run from a checkout and fail from the
wheel, or load a second copy of a module beside the first)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from tests.helpers import REPO, SRC

PACKAGES = ("core", "models", "serve", "launcher", "loadtest", "measure", "kernels", "bulk")
# Which packages each one may import (besides itself): the architecture's rows, lowest first.
MAY_IMPORT = {
    "core": set(),
    "models": {"core"},
    "serve": {"core", "models"},
    "launcher": {"core", "models", "serve"},
    "bulk": {"core", "models", "serve", "measure"},  # its run summary is a measure result (BulkResult)
    "kernels": {"core", "models"},
}


def checker():
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "tools" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_cycles", module)
    spec.loader.exec_module(module)
    return module


def bare_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                  if name.split(".")[0] in PACKAGES]
    return found


def test_every_module_imports_the_project_as_siglip_serve() -> None:
    assert sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()) == sorted(PACKAGES)
    files = [*sorted(SRC.rglob("*.py")), *sorted((REPO / "tests").rglob("*.py"))]
    assert len(files) > 150
    offenders = [line for f in files for line in bare_imports(f)]
    assert offenders == []


def test_each_package_imports_only_the_rows_below_it() -> None:
    tool = checker()
    packages = tool.package_graph(tool.graph(SRC))
    short = {name.removeprefix("siglip_serve."): {t.removeprefix("siglip_serve.") for t in targets}
             for name, targets in packages.items()}
    for package, allowed in MAY_IMPORT.items():
        assert short[package] <= allowed, (package, short[package] - allowed)
    assert tool.main([str(SRC)]) == 0


def test_the_cycle_check_sees_lazy_imports_and_skips_type_checking_ones(tmp_path: Path) -> None:
    tool = checker()
    package = tmp_path / "siglip_serve"
    (package / "a").mkdir(parents=True)
    (package / "b").mkdir()
    for folder in (package, package / "a", package / "b"):
        (folder / "__init__.py").write_text("")
    (package / "a" / "one.py").write_text("from siglip_serve.b import two\n")
    (package / "b" / "two.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from siglip_serve.a import one\n")
    assert tool.main([str(package)]) == 0
    (package / "b" / "two.py").write_text("def later():\n    from siglip_serve.a.one import x\n")
    assert tool.cycles(tool.graph(package)) == [["siglip_serve.a.one", "siglip_serve.b.two"]]
    assert tool.main([str(package)]) == 1
