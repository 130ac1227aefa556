"""Dollars per million images from an instance's hourly price: `--price-per-hour`, `--accelerators`, `--instance`
and `--prices` of `siglip-serve bench`, `loadtest` and `device-check`.

A served figure is what the instance served, so its price per million images is the hourly price over an hour of
it: usd_per_hour / (images_per_second * 3600) * 1e6. A bare-encoder figure is one accelerator's (a GPU, a logical
NeuronCore: what one encoder replica holds), so it is scaled by the instance's accelerators first and capped at the
host ceiling's images a second where one was measured: past the host's decoding and HTTP no accelerator adds
images, so a host-bound instance is priced at what its host carries.

`--instance NAME` reads the price and the accelerator count from a table (prices.toml beside this module, or
`--prices FILE`); `--price-per-hour` and `--accelerators` override it. Without a price nothing is priced: there is no
default price.

The shipped table is EMPTY: no on-demand price with a source one can cite was at hand when it was written, and a
price without its source and date is a guess. Fill it from AWS's EC2 on-demand pricing page or the Price List API's
JSON for the region, saved under shared/seeds/ and named in each entry's `source`.

Standard library only: `siglip-serve device-check` reads it before the project's dependencies are installed.
"""

from __future__ import annotations

import argparse
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from siglip_serve.core.errors import UserError

TABLE = Path(__file__).with_name("prices.toml")
# What fills an empty table, said wherever one is missing.
FILL_HINT = ("fill it from AWS's EC2 on-demand pricing page or the Price List API's JSON, saved under shared/seeds/ "
             "(measure/prices.toml says how)")


class PriceError(UserError, ValueError):
    """A price table that cannot be read, or an instance it does not list; the message says which."""


@dataclass(frozen=True)
class Price:
    """An instance's on-demand price, and where it comes from (None where given on the command line)."""

    usd_per_hour: float
    accelerators: int = 1
    instance: str | None = None
    region: str | None = None
    date: str | None = None
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        """One line for a table's title: the price, the instance and where the price comes from."""
        where = f"{self.instance}, " if self.instance else ""
        source = f"; {self.region or 'no region'}, {self.date or 'undated'}, {self.source}" if self.source else ""
        return (f"${self.usd_per_hour:g}/h ({where}{self.accelerators} accelerator"
                f"{'s' if self.accelerators != 1 else ''}{source})")


@dataclass(frozen=True)
class BarePrice:
    """The bare encoder's best bucket priced for the whole instance (see the module's docstring)."""

    bucket: int
    per_accelerator_images_per_second: float
    images_per_second: float
    capped_by_host_ceiling: bool
    usd_per_million_images: float | None


def usd_per_million(images_per_second: float | None, usd_per_hour: float) -> float | None:
    """The price of a million images at `images_per_second` for `usd_per_hour`; None where nothing was served."""
    if images_per_second is None or not images_per_second > 0 or not math.isfinite(images_per_second):
        return None
    return usd_per_hour / (images_per_second * 3600.0) * 1e6


def dollars(usd: float | None, missing: str = "-") -> str:
    """Dollars for a table: cents where it is a dollar or more, three significant digits below (a bare encoder's
    million images can cost a fraction of a cent)."""
    if usd is None:
        return missing
    return f"${usd:.2f}" if usd >= 1 else f"${usd:.3g}"


def bare_price(price: Price, bucket: int, per_accelerator: float, host_ceiling: float | None) -> BarePrice:
    """The bare figure of one accelerator times the instance's, capped at `host_ceiling` (img/s) where measured."""
    instance = per_accelerator * price.accelerators
    capped = host_ceiling is not None and host_ceiling < instance
    rate = host_ceiling if capped and host_ceiling is not None else instance
    return BarePrice(bucket=bucket, per_accelerator_images_per_second=per_accelerator, images_per_second=rate,
                     capped_by_host_ceiling=capped, usd_per_million_images=usd_per_million(rate, price.usd_per_hour))


def read_table(path: Path = TABLE) -> dict[str, Price]:
    """Each instance the table lists, by name; PriceError naming the file and entry that is not right."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise PriceError(f"price table {path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PriceError(f"price table {path} is not TOML: {exc}") from None
    table: dict[str, Price] = {}
    for index, entry in enumerate(data.get("instances", [])):
        try:
            price = Price(usd_per_hour=float(entry["usd_per_hour"]), accelerators=int(entry["accelerators"]),
                          instance=str(entry["instance"]), region=str(entry["region"]), date=str(entry["date"]),
                          source=str(entry["source"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PriceError(f"price table {path}: entry {index + 1} needs instance, usd_per_hour, accelerators, "
                             f"region, date and source ({type(exc).__name__}: {exc})") from None
        check(price)
        table[str(price.instance)] = price
    return table


def check(price: Price) -> Price:
    if not price.usd_per_hour > 0 or not math.isfinite(price.usd_per_hour):
        raise PriceError(f"a price per hour must be a positive number of dollars, got {price.usd_per_hour}")
    if price.accelerators < 1:
        raise PriceError(f"an instance's accelerators must be at least 1, got {price.accelerators}")
    return price


def price_of(usd_per_hour: float | None, accelerators: int | None, instance: str | None,
             table: Path = TABLE) -> Price | None:
    """The price the options give, or None where they give none: `instance` from `table`, its price and count
    overridden by `usd_per_hour` and `accelerators` where given."""
    if instance is not None:
        listed = read_table(table)
        if not listed:
            raise PriceError(f"--instance {instance}: the price table {table} is empty: {FILL_HINT}; or give "
                             "--price-per-hour (and --accelerators)")
        if instance not in listed:
            raise PriceError(f"--instance {instance}: the price table {table} lists only {', '.join(sorted(listed))}; "
                             "add it, or give --price-per-hour (and --accelerators)")
        base = listed[instance]
        return check(Price(usd_per_hour if usd_per_hour is not None else base.usd_per_hour,
                           accelerators if accelerators is not None else base.accelerators, base.instance,
                           base.region, base.date,
                           base.source if usd_per_hour is None else f"--price-per-hour over {base.source}"))
    if usd_per_hour is None:
        if accelerators is not None:
            raise PriceError("--accelerators prices a bare figure for the instance: give --price-per-hour or "
                             "--instance too")
        return None
    return check(Price(usd_per_hour, accelerators if accelerators is not None else 1))


def add_price_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """The four options, on a parser or an argument group."""
    parser.add_argument("--price-per-hour", type=float, metavar="DOLLARS",
                        help="the instance's on-demand price: $ per 1M images for each served row (none without "
                             "it or --instance)")
    parser.add_argument("--accelerators", type=int, metavar="N",
                        help="the instance's accelerators (GPUs, logical NeuronCores): the bare encoder's best "
                             "bucket, one accelerator's figure, is priced times N, capped at the host ceiling "
                             "(default 1, or the table's)")
    parser.add_argument("--instance", metavar="NAME",
                        help=f"read the price and accelerators from the price table (--prices); the shipped one is "
                             f"empty: {FILL_HINT}")
    parser.add_argument("--prices", type=Path, metavar="FILE",
                        help="the price table --instance reads (default: the shipped one, measure/prices.toml)")


def price_from_args(args: argparse.Namespace) -> Price | None:
    return price_of(args.price_per_hour, args.accelerators, args.instance, args.prices or TABLE)
