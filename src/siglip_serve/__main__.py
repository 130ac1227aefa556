"""`siglip-serve COMMAND ...` (also `python -m siglip_serve`): one dispatcher for every command.

Each command is a `main(argv) -> int` in the package that owns it; only the chosen one is imported, so
`siglip-serve kernels` never pays for Ray and `siglip-serve run` never for Locust.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# name -> (module with main(argv) -> int, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("siglip_serve.launcher.cli", "start a local Ray (or join one) and serve the HTTP API"),
    "bench": ("siglip_serve.measure.bench_cli", "bare-encoder, preprocessing and served throughput; table + JSON"),
    "report": ("siglip_serve.measure.report", "instance throughput beside seed 000 from a bench, a multi-core "
                                              "bench and a load test (recorded or run here); host- or device-bound"),
    "loadtest": ("siglip_serve.loadtest.cli",
                 "Locust load test (summary.json, CSV, HTML); 'loadtest report' is 'report'"),
    "embed": ("siglip_serve.bulk.cli", "embed a folder, list or table of images (or texts) in bulk into Parquet "
                                       "shards, resumable (Ray Data)"),
    "compile": ("siglip_serve.models.neuron.cli",
                "compile the image tower for Trainium2 (--backend neuron | neuron-native)"),
    "accuracy": ("siglip_serve.measure.accuracy", "compare two encoders' embeddings on a folder of images"),
    "determinism": ("siglip_serve.determinism.cli", "is a vector the same alone, in each batch, on another "
                                                            "replica, from the cache, bulk and every input form; "
                                                            "deterministic's cost"),
    "kernels": ("siglip_serve.kernels.cli", "kernel-level benchmarks: matmul tiling, MLP, NKI kernels, profile JSON"),
    "trn2-check": ("siglip_serve.launcher.trn2_check", "first run on a fresh trn2: versions, neuron-ls, compile, "
                                                       "accuracy, serve, bench, report into one folder"),
    "device-check": ("siglip_serve.measure.device_check", "every accelerator figure in one bounded run: install, "
                                                          "pytest -m cuda, bare, served, host ceiling, verdict"),
}
# What the runtime install (`pip install siglip-serve`, requirements/runtime-*.txt) leaves to an extra:
# top-level module -> the extra that brings it. A command that needs one says which extra to install.
EXTRAS = {"locust": "loadtest", "gevent": "loadtest", "matplotlib": "report"}
# Commands that cannot start without one (kernels' --plot needs matplotlib only when asked).
NEEDS = {"loadtest": "locust", "report": "matplotlib"}
# Given before the command (`siglip-serve --log-level DEBUG run`), as the one-parser CLI took it.
LOG_LEVEL = "--log-level"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    return ("usage: siglip-serve [--log-level LEVEL] COMMAND [ARGS]   (siglip-serve COMMAND -h for its options)\n\n"
            "commands:\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    leading: list[str] = []
    while argv and argv[0].startswith(LOG_LEVEL):
        taken = 1 if "=" in argv[0] else 2
        leading, argv = [*leading, *argv[:taken]], argv[taken:]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"siglip-serve: unknown command {command!r}\n{usage()}", file=sys.stderr)
        return 2
    try:
        if command in NEEDS and importlib.util.find_spec(NEEDS[command]) is None:
            raise ModuleNotFoundError(f"No module named {NEEDS[command]!r}", name=NEEDS[command])
        module = importlib.import_module(COMMANDS[command][0])
        return int(module.main([*leading, *rest]) or 0)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        print(f"siglip-serve {command}: needs {top}, which the runtime install leaves out: "
              f"pip install 'siglip-serve[{EXTRAS[top]}]' (make install has every extra)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
