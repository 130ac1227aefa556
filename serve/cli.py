"""`siglip-serve`: run the service, benchmark it, and reach the other tools of the project."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from typing import Any

from models.cli_args import LOG_FORMAT

# Subcommands owned by other packages: name -> (module with main(argv) -> int, help).
DELEGATED = {
    "kernels": ("kernels.cli", "kernel-level benchmarks: matmul tiling, MLP, NKI kernels, profile JSON"),
    "compile": ("models.compile_cli", "compile the image tower for Trainium2 (--backend neuron | neuron-native)"),
    "accuracy": ("models.accuracy", "compare two encoders' embeddings on a folder of images"),
    "loadtest": ("loadtest.cli", "Locust load test (summary.json, CSV, HTML); 'loadtest report': instance throughput"),
    "trn2-check": ("serve.trn2_check", "first run on a fresh trn2: versions, neuron-ls, compile, accuracy, serve, "
                                       "bench, report into one folder with a summary"),
}


def add_front_end_option(parser: argparse.ArgumentParser) -> None:
    from serve.haproxy_front import FRONT_ENDS

    parser.add_argument("--front-end", choices=FRONT_ENDS, default="haproxy",
                        help="HTTP front end of a Ray started here: haproxy (default: Serve's HAProxy mode, "
                             "header limits and timeouts, about half the host CPU per image) or python "
                             "(Serve's proxy actor)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="open_clip SigLIP config (default ViT-SO400M-14-SigLIP-384; tiny-siglip for tests)")
    group.add_argument("--backend", choices=["cpu", "cuda", "neuron", "neuron-native"], help="default cpu")
    weights = group.add_mutually_exclusive_group()
    weights.add_argument("--pretrained", help="open_clip pretrained tag (default webli), downloaded once")
    weights.add_argument("--checkpoint", help="state dict saved with torch.save(model.state_dict())")
    weights.add_argument("--random-weights", action="store_true", default=None,
                         help="random weights: embeddings mean nothing (tests, plumbing)")
    group.add_argument("--buckets", help="compiled batch sizes, e.g. 1,2,4,8")
    group.add_argument("--artifact-dir", help="neuron: compiled artifact directory")
    group.add_argument("--torch-threads", type=int, help="CPU threads per encoder (default: all usable cores)")


def model_args(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("model", "backend", "pretrained", "checkpoint", "random_weights", "buckets", "artifact_dir", "torch_threads")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def parse_set(pairs: list[str]) -> dict[str, Any]:
    """--set key=value for any config field; values parse as YAML scalars/lists."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siglip-serve", description=__doc__)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start a local Ray and serve the HTTP API")
    add_model_options(run)
    run.add_argument("--replicas", help="encoder replicas, or 'auto' = one per logical NeuronCore")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8000)
    run.add_argument("--metrics-port", type=int, default=8080, help="Ray's Prometheus export port")
    run.add_argument("--metrics-host", default="127.0.0.1",
                     help="where Prometheus scrapes from: 127.0.0.1 (default) keeps Ray's metrics port on "
                          "loopback; any other value makes Ray listen on every interface")
    run.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    add_front_end_option(run)
    run.add_argument("--neuron-cores", type=int,
                     help="declare this many logical NeuronCores to the local Ray (auto-detection is unreliable)")
    run.add_argument("--api-key", help="require Authorization: Bearer KEY (shows in ps: prefer the "
                                       "SIGLIP_API_KEY environment variable or --api-key-file)")
    run.add_argument("--api-key-file", help="require the key on this file's first line")
    run.add_argument("--access-log", action="store_true", default=None,
                     help="Ray Serve's access log: one line per request (default off)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="any config field, as in the Serve YAML args (repeatable)")

    bench = sub.add_parser("bench", help="bare-encoder, preprocessing and served throughput; table + JSON")
    add_model_options(bench)
    bench.add_argument("--warmup", type=int, default=10)
    bench.add_argument("--iterations", type=int, default=50)
    bench.add_argument("--concurrency", default="1,8,32", help="served-benchmark client concurrency levels")
    bench.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    bench.add_argument("--replicas", type=int, default=1)
    bench.add_argument("--images-per-request", type=int, default=1, help="served benchmark: >1 sends multipart")
    bench.add_argument("--multicore", type=int, default=0, metavar="N",
                       help="also run seed 000's multi-core bench: N pinned workers, summed (neuron: N logical cores)")
    bench.add_argument("--multicore-bucket", type=int, default=1, help="batch each multi-core worker runs (seed: 1)")
    bench.add_argument("--skip", default="", help="comma list of parts to skip: encoder,preprocess,served")
    bench.add_argument("--json", dest="json_out", default="bench.json", help="where to write the results")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    add_front_end_option(bench)

    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(DELEGATED[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    began = time.monotonic()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    from serve.preflight import METRICS_CHECK_HOST, PortUnavailable, check_ports, disable_port_sharing
    from serve.startup import Placeholder

    placeholder = None
    try:
        if args.command == "run" and not args.address:
            # First, before the heavy imports: a taken port is one line now, not a second instance
            # sharing it or a Ray traceback later; then probes get a quick 503 until Serve is up.
            check_ports(args.host, args.port, METRICS_CHECK_HOST, args.metrics_port)
            disable_port_sharing()
            placeholder = Placeholder(args.host, args.port)
        return _command(args, began, placeholder)
    except PortUnavailable as exc:
        logging.getLogger("siglip_serve").error("%s", exc)
        return 2
    finally:
        if placeholder is not None:
            placeholder.release()


def _command(args: argparse.Namespace, began: float, placeholder: Any) -> int:
    from models.encoder import BackendUnavailable
    from models.loading import ModelLoadError
    from serve.config import ConfigError, ServiceConfig

    try:
        if args.command == "run":
            settings = {**model_args(args), **parse_set(args.set), "log_level": args.log_level}
            if args.replicas is not None:
                settings["replicas"] = args.replicas if args.replicas == "auto" else int(args.replicas)
            if args.api_key:
                settings["api_key"] = args.api_key
            if args.api_key_file:
                settings["api_key_file"] = os.path.abspath(args.api_key_file)
            if args.access_log:
                settings["access_log"] = True
            config = ServiceConfig.from_args(settings)
            config.resolve_api_key(os.environ)  # an unreadable key file stops us here, not in a replica
            from models.encoder import check_backend_available
            from serve.runner import preflight_tokenizer, preflight_weights, run_service

            # Before Ray starts: a missing SDK/GPU/artifact or unreachable weights is one line now,
            # not a replica crash later.
            env = None if args.address else {**os.environ, **config.env_vars}
            check_backend_available(config.model_settings(), env)
            if placeholder is not None:
                placeholder.set_stage("checking the model weights")
            preflight_weights(config)
            preflight_tokenizer(config)
            code = run_service(config, args.host, args.port, args.metrics_port, args.address, args.neuron_cores,
                               args.metrics_host, placeholder, began, args.front_end)
            # Ray is stopped and every log flushed; the interpreter's own teardown would then wait
            # ~7-10 s in Ray's native threads before the process ends (measured on SIGTERM).
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if args.command == "bench":
            from measure.bench import run_bench

            settings = {**model_args(args), **parse_set(args.set), "replicas": args.replicas}
            return run_bench(ServiceConfig.from_args(settings), args)
    except (ConfigError, ModelLoadError, BackendUnavailable) as exc:
        logging.getLogger("siglip_serve").error("%s", exc)
        return 2
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
