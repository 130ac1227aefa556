"""siglip_serve.core: what several packages share, importable without torch, Ray or the rest of the
project; each Neuron environment variable name declared there and nowhere else."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.helpers import SRC


def test_core_imports_no_torch_ray_or_project_package() -> None:
    code = ("import sys, siglip_serve.core.constants, siglip_serve.core.errors, siglip_serve.core.texts; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'numpy') "
            "or (m.startswith('siglip_serve.') and not m.startswith('siglip_serve.core'))); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_each_shared_name_is_declared_once() -> None:
    """A module-level assignment of these names' values lives in core/constants.py only."""
    values = {"NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES"}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in values:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value}")
    assert sorted(found) == ["core/constants.py:11: NEURON_LOGICAL_NC_CONFIG",
                             "core/constants.py:12: NEURON_RT_VISIBLE_CORES"], found
    defaults = [f"{path.relative_to(SRC)}" for path in sorted(SRC.rglob("*.py")) if path.parent.name != "core"
                and ("TRN2_DEFAULT_LNC = " in path.read_text() or "def package_version" in path.read_text())]
    assert defaults == [], defaults
