"""`siglip-serve bench`: its options, read into the service config the benchmark serves (measure/bench.py)."""

from __future__ import annotations

import argparse
import logging

from siglip_serve.core import cli
from siglip_serve.launcher.cli import add_front_end_option
from siglip_serve.measure.corpus import ENDPOINTS
from siglip_serve.measure.prices import add_price_arguments, price_from_args
from siglip_serve.models import cli_args

log = logging.getLogger("siglip_serve")


def client_processes(text: str) -> int | None:
    """`--client-processes`: a count, or None for auto (measure/client_pool.py)."""
    from siglip_serve.measure.client_pool import parse_client_processes

    try:
        return parse_client_processes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from siglip_serve.serve.plan.config import ServiceConfig

    bench = argparse.ArgumentParser(prog="siglip-serve bench",
                                    description="bare-encoder, preprocessing and served throughput; table + JSON")
    cli.add_log_level(bench)
    cli_args.add_model_arguments(bench)
    bench.add_argument("--warmup", type=int, default=10)
    bench.add_argument("--iterations", type=int, default=50)
    bench.add_argument("--concurrency", default="1,8,32", help="served-benchmark client concurrency levels")
    bench.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    bench.add_argument("--client-processes", default="auto", type=client_processes,
                       help="served benchmark: client processes that share each level's concurrency and requests "
                            "(auto: 1 on up to 4 usable CPUs, else one per 4, at most 8)")
    cli.add_field_arguments(bench.add_argument_group("service"), ServiceConfig, ("replicas",))
    bench.add_argument("--images-per-request", type=int, default=1, help="served benchmark: images in each request")
    bench.add_argument("--multicore", type=int, default=0, metavar="N",
                       help="also run seed 000's multi-core bench: N pinned workers, summed (neuron: N logical cores)")
    bench.add_argument("--multicore-bucket", type=int, default=1, help="batch each multi-core worker runs (seed: 1)")
    bench.add_argument("--skip", default="", help="comma list of parts to skip: encoder,preprocess,served,"
                                                  "host-ceiling (the served path with no model, zeros-no-model)")
    bench.add_argument("--endpoint", choices=ENDPOINTS, help="served benchmark's body: raw bytes (the default for "
                                                             "one image a request), multipart (for more), or json "
                                                             "(base64 data URIs)")
    bench.add_argument("--profile", metavar="DIR", help="also record a py-spy flame graph of each of the service's "
                                                        "processes under the highest concurrency, after the "
                                                        "measured rows (DIR/<kind>-<pid>.svg; needs py-spy)")
    bench.add_argument("--profile-seconds", type=float, default=10.0, help="how long --profile records")
    bench.add_argument("--json", dest="json_out", default="bench.json", help="where to write the results")
    bench.add_argument("--set", action="append", default=[], type=cli.key_value, metavar="KEY=VALUE")
    add_front_end_option(bench)
    add_price_arguments(bench.add_argument_group("price (dollars per million images)"))
    return bench


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging(args.log_level)

    def bench() -> int:
        from siglip_serve.measure.bench import run_bench
        from siglip_serve.serve.plan.config import ServiceConfig

        if args.profile:  # refused before anything starts, not after minutes of measuring
            from siglip_serve.measure.profile import ProfileRefused, py_spy

            py_spy()
            if "served" in args.skip:
                raise ProfileRefused("--profile records the served part; it is skipped (--skip served)")
        args.price = price_from_args(args)  # a table or option that gives no price fails before anything runs
        settings = {**cli_args.model_values(args), **cli.settings_values(args.set),
                    **cli.option_values(args, ("replicas",))}
        return run_bench(ServiceConfig.from_args(settings), args)

    return cli.run_main(bench, log)
