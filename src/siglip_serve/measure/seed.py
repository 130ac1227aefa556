"""Seed 000's reference figures (trn2.3xlarge, SigLIP-SO400M-14-384, batch 1), as typed rows.

How seed 000 got its instance figures: its table's footnote, "instance throughput = per-core
performance x number of cores". A per-core figure measured on one core, times the cores; not all
cores measured at once (which is what siglip_serve.measure.multicore does).

The LNC=2 rows are the `--auto-cast matmult` compile (141.1 = 4 x 35.43 per the seed's formula;
4 x 35.43 is 141.7, the seed prints 141.1). The LNC=1 row (14.38 per core, 115.0) is the un-cast
fp32 compile, as issue 9's review of the seed found (the seed's own text is inconsistent: a note
says both compiles use matmult, its findings credit matmult to LNC=2 only).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SEED_INSTANCE_METHOD = "per-core x cores, each core measured one at a time (seed 000's formula)"
# What the seed measured on: its rows compare only with a run of the same backend (the trace line).
SEED_BACKEND = "neuron"


def measured_like_the_seed(backend: str, model: str | None = None) -> bool:
    """Whether a result's rows stand beside the seed's: the seed's backend, and (given) its model."""
    return backend == SEED_BACKEND and (model is None or ("SO400M" in model and "384" in model))


class SeedRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    lnc: int
    cores: int
    batch: int
    auto_cast: str
    per_core_images_per_second: float
    latency_mean_ms: float
    instance_images_per_second: float | None


def _row(label: str, lnc: int, cores: int, auto_cast: str, per_core: float, latency_ms: float,
         instance: float | None) -> SeedRow:
    return SeedRow(label=label, lnc=lnc, cores=cores, batch=1, auto_cast=auto_cast,
                   per_core_images_per_second=per_core, latency_mean_ms=latency_ms,
                   instance_images_per_second=instance)


SEED_REFERENCE: tuple[SeedRow, ...] = (
    _row("seed single core, no auto-cast (fp32)", 2, 1, "none", 21.6, 46.3, None),
    _row("seed single core, --auto-cast matmult", 2, 1, "matmult", 36.1, 27.7, None),
    _row("seed LNC=2, 4 cores, matmult", 2, 4, "matmult", 35.43, 28.23, 141.1),
    _row("seed LNC=1, 8 cores, un-cast fp32", 1, 8, "none", 14.38, 69.56, 115.0),
)


def seed_rows_for(lnc: int | None, cores: int) -> list[SeedRow]:
    """The seed's rows comparable with a run at `lnc` on `cores`: same LNC, multi-core with multi-core."""
    if lnc is None:
        return list(SEED_REFERENCE)
    same_lnc = [r for r in SEED_REFERENCE if r.lnc == lnc]
    return [r for r in same_lnc if (r.cores > 1) == (cores > 1)] or same_lnc


def multicore_seed_by_lnc() -> dict[int, SeedRow]:
    """{lnc: the seed's multi-core row}: what the instance report sets beside (b) and (c)."""
    return {row.lnc: row for row in SEED_REFERENCE if row.cores > 1}
