"""`siglip-serve embed`: embed a folder, a list or a table column in bulk into Parquet shards (docs/batch.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

from siglip_serve.core.cli import add_log_level, key_value, run_main, settings_values, setup_logging
from siglip_serve.core.errors import UserError
from siglip_serve.models.cli_args import add_model_arguments, model_values

if TYPE_CHECKING:  # the config module is imported where a command runs, not at the parser's
    from siglip_serve.serve.plan.config import ServiceConfig

log = logging.getLogger("siglip_serve.bulk")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="siglip-serve embed", description=__doc__,
        epilog="A rerun with the same input, model and output skips the shards already written; a killed run "
               "loses at most the shards it had in flight. --set takes the service's config fields "
               "(limits such as max_image_pixels, fast_jpeg_decode, lnc) as in `siglip-serve run`.")
    add_log_level(parser)
    parser.add_argument("source", help="a folder (recursive), a list file (one path a line), or a .parquet/.csv "
                                       "table (local or a pyarrow.fs URI such as s3://...) with a column of paths "
                                       "or texts")
    parser.add_argument("--output", "-o", required=True, help="output folder (local or a pyarrow.fs URI)")
    parser.add_argument("--column", default=None, help="the table's column to read (default: path, or text "
                                                       "with --text)")
    parser.add_argument("--text", action="store_true", help="the inputs are texts: embed them with the text tower")
    parser.add_argument("--shard-size", type=int, default=1000, help="items per output shard (default 1000)")
    parser.add_argument("--encoders", type=int, help="encoder actors (default: one per device; cpu: one)")
    parser.add_argument("--decode-workers", type=int,
                        help="CPU tasks reading and decoding images (default: the cores the encoders leave)")
    parser.add_argument("--address", help="run on this Ray cluster (a RayJob: auto) instead of a local Ray")
    parser.add_argument("--encoding", default="float", choices=["float", "int8", "uint8", "binary", "ubinary"],
                        help="embedding column type, as the API's encoding_format (docs/http-api.md): float32 "
                             "(default), int8/uint8 with a per-row scale column, binary/ubinary packed sign bits")
    parser.add_argument("--repeat-cache-mib", type=float, default=256.0,
                        help="images: MiB of embeddings the run keeps by the SHA-256 of each file's bytes, so a "
                             "file whose bytes it already embedded is not decoded or embedded again (default 256; "
                             "0: off)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve the local Ray's Prometheus metrics on this port (the service's metric names, "
                             "endpoint=bulk; on a cluster, its own metrics endpoint)")
    parser.add_argument("--json", dest="json_out", help="also write the summary here (it is always written to "
                                                        "OUTPUT/_summary.json)")
    served = parser.add_argument_group("a model of the service", "embed as the service does: its config file "
                                       "gives the model and every setting (model flags then refused; --set still "
                                       "applies on top)")
    served.add_argument("--service-config", metavar="FILE",
                        help="the service's Serve config (the YAML `serve deploy` takes) or a YAML of its args")
    served.add_argument("--served-model", metavar="NAME",
                        help="which of its models: the name requests' `model` uses (default: its default model)")
    served.add_argument("--app", help="the Serve application of the service, where the file has several")
    add_model_arguments(parser)
    parser.add_argument("--set", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                        help="any config field, as in the Serve YAML args (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging(args.log_level)
    return run_main(lambda: _embed(args), log)


def _embed(args: argparse.Namespace) -> int:
    from siglip_serve.bulk.job import JobSpec, Modality, run_job
    from siglip_serve.models.backends.implementation import check_backend_available
    from siglip_serve.serve.plan.config import ServiceConfig

    overrides = {**settings_values(args.set), "log_level": args.log_level}
    served_as = None
    if args.service_config:
        config, served_as = _served(args, overrides)
    else:
        if args.served_model or args.app:
            raise UserError("--served-model and --app pick a model of --service-config FILE; give the file")
        config = ServiceConfig.from_args({**model_values(args), **overrides})
    if not args.address:
        # A local Ray: its actors run on this machine, so a missing SDK or artifact is refused now. With
        # --address (a RayJob) this driver runs on the head, which may see no artifacts: each embed actor
        # checks them on its own node (bulk/stages.py) and refuses in one line naming it.
        check_backend_available(config.model_settings())
    modality: Modality = "text" if args.text else "image"
    spec = JobSpec(source=args.source, output=args.output, modality=modality,
                   column=args.column or ("text" if args.text else "path"), shard_size=args.shard_size,
                   encoders=args.encoders, decode_workers=args.decode_workers, address=args.address,
                   metrics_port=args.metrics_port, encoding=args.encoding, repeat_cache_mib=args.repeat_cache_mib,
                   served_as=served_as)
    result = run_job(config, spec)
    if args.json_out:
        result.write(args.json_out)
    rate = f"{result.items_per_second:.1f}" if result.items_per_second else "-"
    cpu = f"{result.cpu_ms_per_item:.2f}" if result.cpu_ms_per_item else "-"
    print(f"{result.items} {modality}(s): {result.embedded} embedded, {result.errors} refused this run "
          f"({result.errors_in_output} in _errors/ in all); {result.shards_written} shard(s) written, "
          f"{result.shards_done_before} already done; {rate} items/s, {cpu} host CPU-ms per item "
          f"over {result.seconds:.1f} s; summary: {args.output}/_summary.json")
    return 0


def _served(args: argparse.Namespace, overrides: dict[str, Any]) -> tuple[ServiceConfig, str]:
    """The config of the model the service serves as `--served-model` (its settings over the service's, as
    the service builds it: serve/plan/served_models.py), with `overrides` on top, and its served name."""
    import yaml

    from siglip_serve.serve.plan.config import ServiceConfig
    from siglip_serve.serve.plan.served_models import served_model
    from siglip_serve.serve.serve_yaml import service_args

    if flags := sorted(model_values(args)):
        raise UserError(f"--service-config gives the model; drop {', '.join('--' + f.replace('_', '-') for f in flags)}"
                        " (or --set KEY=VALUE to change a setting on purpose)")
    try:
        with open(args.service_config, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read the service config {args.service_config}: {exc}") from None
    served = served_model(ServiceConfig.from_args(service_args(document, args.app)), args.served_model)
    own = served.config.model_dump(exclude_unset=True, exclude={"models", "default_model"})
    return ServiceConfig.from_args({**own, **overrides}), served.name


if __name__ == "__main__":
    raise SystemExit(main())
