"""Follow the service's config through one `siglip-serve run`, call by call, up to the application handed to Serve.

A stop is a call of a siglip_serve function that receives the config (a `ServiceConfig` among its arguments);
the walk is the stops in order. It prints the stops, the files they are in, and how often the walk returns to
a file it had left, and writes them as JSON: how far a reader follows the config to see what a start does.
The walk ends where `serve.run` takes the application (the replicas' own reading happens in their processes).

Usage: python tools/config_walk.py OUT.json [run's arguments...]
       (default arguments: --model tiny-siglip --random-weights --port 0 --front-end python)
It starts a local Ray on 127.0.0.1 and stops it before it returns.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

DEFAULT_ARGS = ["--model", "tiny-siglip", "--random-weights", "--front-end", "python", "--host", "127.0.0.1"]


class Walk:
    def __init__(self, package_dir: str, config_type: type) -> None:
        self.package_dir = package_dir
        self.config_type = config_type
        self.stops: list[tuple[str, str]] = []

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(self.package_dir):
            return
        code = frame.f_code
        arguments = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(isinstance(frame.f_locals.get(name), self.config_type) for name in arguments):
            where = os.path.relpath(code.co_filename, self.package_dir)
            self.stops.append((where, code.co_qualname))

    def summary(self) -> dict[str, Any]:
        files: list[str] = []
        returns = 0
        for where, _ in self.stops:
            if files and files[-1] == where:
                continue
            returns += where in files
            files.append(where)
        return {"stops": len(self.stops), "files": len(set(files)), "returns_to_a_file_left": returns,
                "walk": [f"{where}:{name}" for where, name in self.stops]}


class Handed(Exception):
    """Serve took the application: the walk ends here."""


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    args = argv[1:] or DEFAULT_ARGS
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from ray import serve

    import siglip_serve
    from siglip_serve.launcher import cli, session
    from siglip_serve.serve.plan.config import ServiceConfig

    os.environ[session.CHILD_ENV] = "1"  # in this process: the walk is followed here, not in a relayed child

    walk = Walk(str(Path(siglip_serve.__file__).parent) + os.sep, ServiceConfig)

    def handed(*_args: Any, **_kwargs: Any) -> None:
        raise Handed

    serve.run = handed  # type: ignore[assignment]
    os._exit = lambda code: (_ for _ in ()).throw(SystemExit(code))  # type: ignore[assignment]
    sys.setprofile(walk.profile)
    try:
        cli.main([*args, "--port", str(port)])
    except (Handed, SystemExit):
        pass
    finally:
        sys.setprofile(None)
    summary = walk.summary()
    for i, stop in enumerate(summary["walk"], 1):
        print(f"{i:3d} {stop}")
    print(f"{summary['stops']} stops in {summary['files']} files, returning {summary['returns_to_a_file_left']} "
          "times to a file already left")
    out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
