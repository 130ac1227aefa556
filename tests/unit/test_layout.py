"""The package's layout is its architecture: one `siglip_serve` under src/, packages that import each
other in one direction only (tools/import_cycles.py, and the layer rows of tools/layers.py, both run by
`make lint`), and no module that imports a package of the project by a bare name (`from models...`
would run from a checkout and fail from the wheel, or load a second copy of a module beside the first)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, SRC

PACKAGES = ("core", "models", "serve", "launcher", "loadtest", "measure", "kernels", "bulk", "determinism")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def checker():
    return _tool("import_cycles")


def layers():
    return _tool("layers")


def package_rows() -> dict[str, set[str]]:
    """The layer rows (tools/layers.py) seen from the top-level packages: what each, its sub-packages
    included, may import of the others."""
    rows: dict[str, set[str]] = {}
    for unit, allowed in layers().MAY_IMPORT.items():
        if unit:
            top = unit.split(".")[0]
            rows.setdefault(top, set()).update(a.split(".")[0] for a in allowed if a.split(".")[0] != top)
    return rows


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
    MAY_IMPORT = package_rows()
    assert set(MAY_IMPORT) == set(PACKAGES)  # a row for every package
    for package, allowed in MAY_IMPORT.items():
        assert short[package] <= allowed, (package, short[package] - allowed)
    assert tool.main([str(SRC)]) == 0
    assert layers().main([str(SRC)]) == 0
    assert "tools/layers.py src/siglip_serve" in (REPO / "Makefile").read_text()  # `make lint` runs it


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A small siglip_serve whose imports all point down the rows, with `files` written over it."""
    package = tmp_path / "siglip_serve"
    for folder in ("", "core", "models", "models/neuron", "models/backends", "serve", "launcher"):
        (package / folder).mkdir(parents=True, exist_ok=True)
        (package / folder / "__init__.py").write_text("")
    downward = {"launcher/cli.py": "from siglip_serve.serve import app\n",
                "serve/app.py": "from siglip_serve.models.backends import cpu\n",
                "models/backends/cpu.py": "from siglip_serve.models.neuron import line\n",
                "models/neuron/line.py": "from siglip_serve.core import low\n", "core/low.py": ""}
    for name, text in {**downward, **files}.items():
        (package / name).write_text(text)
    return package


def test_downward_imports_pass_the_layer_lint(tmp_path: Path) -> None:
    assert layers().main([str(_tree(tmp_path, {}))]) == 0


@pytest.mark.parametrize("name, text, row", [
    ("core/low.py", "from siglip_serve.serve import app\n", "core may import only nothing of the project"),
    # lazily, from one sub-package of models into another above it
    ("models/neuron/line.py", "def later():\n    from siglip_serve.models.backends import cpu\n",
     "models.neuron may import only core, models"),
    ("serve/app.py", "import siglip_serve.launcher.cli\n", "serve may import only core, models, models.backends"),
])
def test_an_upward_import_fails_the_layer_lint(tmp_path: Path, name: str, text: str, row: str) -> None:
    tool = layers()
    package = _tree(tmp_path, {name: text})
    found = tool.violations(checker().graph(package), tool.packages_in(package))
    assert len(found) == 1 and row in found[0], found
    assert tool.main([str(package)]) == 1


def test_a_replica_importing_the_config_fails_the_layer_lint(tmp_path: Path) -> None:
    """serve.ingress may import serve.plan, but not the config module in it: it reads its slice of the plan."""
    tool = layers()
    files = {"serve/ingress/__init__.py": "", "serve/plan/__init__.py": "", "serve/plan/config.py": "",
             "serve/plan/service_plan.py": "",
             "serve/ingress/ingress.py": "from siglip_serve.serve.plan import service_plan\n"}
    (tmp_path / "siglip_serve" / "serve" / "ingress").mkdir(parents=True)
    (tmp_path / "siglip_serve" / "serve" / "plan").mkdir(parents=True)
    package = _tree(tmp_path, files)
    assert tool.main([str(package)]) == 0
    package = _tree(tmp_path, {**files, "serve/ingress/ingress.py": "from siglip_serve.serve.plan.config import X\n"})
    found = tool.violations(checker().graph(package), tool.packages_in(package))
    assert found == ["siglip_serve.serve.ingress.ingress imports siglip_serve.serve.plan.config: serve.ingress reads "
                     "its slice of the plan, not the config"], found
    assert tool.main([str(package)]) == 1


def test_a_package_without_a_row_fails_the_layer_lint(tmp_path: Path) -> None:
    package = _tree(tmp_path, {})
    (package / "plugins").mkdir()
    (package / "plugins" / "__init__.py").write_text("")
    assert layers().main([str(package)]) == 1


def _packages(tmp_path: Path, *names: str) -> Path:
    package = tmp_path / "siglip_serve"
    for name in ("", *names):
        (package / name).mkdir(parents=True, exist_ok=True)
        (package / name / "__init__.py").write_text("")
    return package


TYPE_CHECKING_IMPORT = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from siglip_serve.a import one\n"


@pytest.mark.parametrize("two", [
    "def later():\n    from siglip_serve.a.one import x\n",
    # never run, but the types it names tie b.two to a.one
    TYPE_CHECKING_IMPORT,
    # what importlib will import: a literal, and an f-string of the module's own constants
    'IMPLEMENTATION = "siglip_serve.a.one:IMPLEMENTATION"\n',
    '_MODULE = "siglip_serve.a"\nPATH = f"{_MODULE}.one:build"\n',
])
def test_the_cycle_check_sees_lazy_type_checking_and_string_imports(tmp_path: Path, two: str) -> None:
    tool = checker()
    package = _packages(tmp_path, "a", "b")
    (package / "a" / "one.py").write_text("from siglip_serve.b import two\n")
    (package / "b" / "two.py").write_text("")
    assert tool.main([str(package)]) == 0
    (package / "b" / "two.py").write_text(two)
    assert tool.cycles(tool.graph(package)) == [["siglip_serve.a.one", "siglip_serve.b.two"]]
    assert tool.main([str(package)]) == 1


def test_the_cycle_check_reads_only_strings_that_name_a_module_of_the_project(tmp_path: Path) -> None:
    package = _packages(tmp_path, "a", "b")
    (package / "a" / "one.py").write_text("from siglip_serve.b import two\n")
    (package / "b" / "two.py").write_text(
        '"""Run `serve run siglip_serve.a.one:app`."""\nURL = "http://siglip_serve.a.one:80"\n'
        'RELATIVE = ".one:IMPLEMENTATION"\nMODULE = "siglip_serve.a.one"\nWHO = f"{NAME}.one:x"\n')
    assert checker().main([str(package)]) == 0


def test_a_circle_inside_one_package_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    package = _packages(tmp_path, "a")
    (package / "a" / "one.py").write_text("from siglip_serve.a import two\n")
    (package / "a" / "two.py").write_text(TYPE_CHECKING_IMPORT)
    assert checker().main([str(package)]) == 1
    assert "import cycle between modules: siglip_serve.a.one <-> siglip_serve.a.two" in capsys.readouterr().out


@pytest.mark.parametrize("back, circle", [
    # two rooms of one package, no module importing back the module that imports it
    ("a/y/two.py", "siglip_serve.a.x <-> siglip_serve.a.y"),
    # a package and one of its rooms: serve.app composes the rooms, a room importing serve's own module
    ("a/x/three.py", "siglip_serve.a <-> siglip_serve.a.x"),
])
def test_a_circle_between_sub_packages_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], back: str,
                                                  circle: str) -> None:
    package = _packages(tmp_path, "a", "a/x", "a/y")
    (package / "a" / "top.py").write_text("from siglip_serve.a.x import one\n")
    (package / "a" / "x" / "one.py").write_text("from siglip_serve.a.y import two\n")
    (package / "a" / "x" / "three.py").write_text("")
    (package / "a" / "y" / "two.py").write_text("")
    assert checker().main([str(package)]) == 0
    target = "siglip_serve.a.x.three" if back == "a/y/two.py" else "siglip_serve.a.top"
    (package / back).write_text(f"import {target}\n")
    assert checker().main([str(package)]) == 1
    assert f"import cycle between packages: {circle}" in capsys.readouterr().out


@pytest.mark.parametrize("text", [
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from siglip_serve.serve import app\n",
    'BUILD = "siglip_serve.serve.app:build_app"\n',
])
def test_the_layer_lint_sees_type_checking_and_string_imports(tmp_path: Path, text: str) -> None:
    tool = layers()
    package = _tree(tmp_path, {"core/low.py": text})
    found = tool.violations(checker().graph(package), tool.packages_in(package))
    assert len(found) == 1 and "core may import only nothing of the project" in found[0], found


def test_every_test_module_has_a_name_of_its_own() -> None:
    # pytest imports test files from folders without __init__.py by their base name: two of one name make
    # the second fail to collect ("import file mismatch"), and the whole run stops there.
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
