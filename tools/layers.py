"""Fail when a siglip_serve package or sub-package imports one its row below does not allow.

The rows are the architecture, lowest first: each names what it may import besides itself. A module
belongs to the deepest package that holds it (`models/backends/cpu.py` to models.backends, `models/
tower.py` to models); every package and sub-package needs a row, so a new one is placed on purpose.
Imports are read as tools/import_cycles.py reads them: every import, a lazy one inside a function, one
under `if TYPE_CHECKING:` and a "module:attribute" string naming a module of the project included.
Usage: python tools/layers.py [SRC_DIR]   (default: src/siglip_serve)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_cycles import ROOT, graph  # a sibling script, not a package

# What each package may import besides itself, lowest first. "" is siglip_serve itself (its __main__
# dispatches to every command). core holds the backends' records (core/backends.py), so anything may ask
# one. models holds what every backend builds on (settings, loading, towers); models.neuron the Neuron SDK's
# side; models.backends builds models' towers on each device. A backend's options model reaches ModelSettings
# through its record's import string, loaded by core (core/backends.py `load`), so models imports no backend.
# serve's rooms (serve/__init__.py says what each holds): the HTTP contract lowest; what the ingress and the
# towers share (the metrics label rejections by the contract's error types); the plan; then the towers and
# the ingress side by side, neither importing the other; serve itself (app.py) composes them.
SERVE_ROOMS = frozenset({"serve.http", "serve.shared", "serve.plan", "serve.towers", "serve.ingress"})
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "models": frozenset({"core"}),
    "models.neuron": frozenset({"core", "models"}),
    "models.backends": frozenset({"core", "models", "models.neuron"}),
    "kernels": frozenset({"core", "models", "models.neuron"}),
    "serve.http": frozenset({"core", "models"}),
    "serve.shared": frozenset({"core", "serve.http"}),
    "serve.plan": frozenset({"core", "models", "serve.shared"}),
    "serve.towers": frozenset({"core", "models", "models.backends", "serve.shared", "serve.plan"}),
    "serve.ingress": frozenset({"core", "models", "serve.http", "serve.shared", "serve.plan"}),
    # The contract's endpoints, one module each, built on the ingress (its rows, its scheduling call); the ingress
    # never imports them: serve/app.py hands their routes to the deployment.
    "serve.ingress.endpoints": frozenset({"core", "models", "serve.http", "serve.shared", "serve.plan",
                                          "serve.ingress"}),
    "serve": frozenset({"core", "models", "models.backends", "serve.ingress.endpoints"}) | SERVE_ROOMS,
    "launcher": frozenset({"core", "models", "models.backends", "models.neuron", "serve", "serve.plan",
                           "serve.shared"}),
    # bench's command line reuses `run`'s front-end option.
    "measure": frozenset({"core", "models", "models.backends", "serve", "serve.plan", "launcher"}),
    # The determinism comparisons run the service's own pieces in one process: the ingress's decoding and cache,
    # bulk's stages, the towers.
    "determinism": frozenset({"core", "models", "models.backends", "measure", "bulk"}) | SERVE_ROOMS,
    "loadtest": frozenset({"core", "measure"}),
    # A bulk job's summary is a measure result (BulkResult); its stages are the service's own: URL fetches,
    # the embedding cache, a tower replica's start, the contract's error types.
    "bulk": frozenset({"core", "models", "models.backends", "serve", "measure"}) | SERVE_ROOMS,
    "": frozenset({"core", "models", "models.neuron", "models.backends", "kernels", "serve", "launcher", "measure",
                   "determinism", "loadtest", "bulk"}) | SERVE_ROOMS,
}

# Modules a package may not import although its row allows their package: a replica reads its own slice of the
# plan (serve/plan/replica_slices.py), never the config the plan was made from.
CONFIG_MODULES = frozenset({"serve.plan.config", "serve.plan.model_entry", "serve.plan.served_models"})
NOT_IMPORTED: dict[str, frozenset[str]] = {
    "serve.ingress": CONFIG_MODULES,
    "serve.ingress.endpoints": CONFIG_MODULES,
    "serve.towers": CONFIG_MODULES,
}

def package_of(module: str, packages: set[str]) -> str:
    """The deepest package (a name without the `siglip_serve.` prefix) that holds `module`."""
    name = module.removeprefix(ROOT).removeprefix(".")
    parts = name.split(".")
    for depth in range(len(parts), 0, -1):
        candidate = ".".join(parts[:depth])
        if candidate in packages:
            return candidate
    return ""


def violations(modules: Mapping[str, set[str]], packages: set[str],
               rows: Mapping[str, frozenset[str]] = MAY_IMPORT,
               not_imported: Mapping[str, frozenset[str]] = NOT_IMPORTED) -> list[str]:
    found = [f"package {name or ROOT} has no row in tools/layers.py MAY_IMPORT" for name in sorted(packages | {""})
             if name not in rows]
    for module, targets in sorted(modules.items()):
        here = package_of(module, packages)
        upward: dict[str, list[str]] = {}  # `from a import b` imports a and a.b: one line per package
        for target in sorted(targets):
            there = package_of(target, packages)
            if there != here and here in rows and there not in rows[here]:
                upward.setdefault(there, []).append(target)
        found += [f"{module} imports {', '.join(names)}: {here or ROOT} may import only "
                  f"{', '.join(sorted(rows[here])) or 'nothing of the project'}" for names in upward.values()]
        banned = sorted({name for target in targets for name in not_imported.get(here, ())
                         if target == f"{ROOT}.{name}" or target.startswith(f"{ROOT}.{name}.")})
        found += [f"{module} imports {ROOT}.{name}: {here} reads its slice of the plan, not the config"
                  for name in banned]
    return found


def packages_in(src: Path) -> set[str]:
    return {".".join(p.parent.relative_to(src).parts) for p in src.rglob("__init__.py") if p.parent != src}


def main(argv: list[str]) -> int:
    src = Path(argv[0] if argv else "src/siglip_serve")
    packages = packages_in(src)
    problems = violations(graph(src), packages)
    print("\n".join(f"layer rule broken: {p}" for p in problems) or f"every import follows the layers of "
                                                                     f"{len(packages)} packages")
    return int(bool(problems))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
