"""tools/lanes_bench.py's figures from its streams' rows: the p99 ratios and the backfill's kept share."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lanes_bench", REPO / "tools" / "lanes_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lanes_bench"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_stream_is_summarized_by_its_answered_requests_and_percentiles() -> None:
    lb = bench()
    row = lb.summarize(lb.Stream("s", 2, None, 0), [0.01] * 99 + [0.5], failures=3, seconds=10.0)
    assert (row.answered, row.failures, row.requests_per_second) == (100, 3, 10.0)
    assert row.p50_ms == 10.0 and 10.0 < row.p99_ms <= 500.0
    empty = lb.summarize(lb.Stream("s", 2, None, 0), [], failures=5, seconds=10.0)
    assert empty.p99_ms is None and empty.requests_per_second == 0.0


def test_the_ratios_compare_each_stream_beside_the_other_with_it_alone() -> None:
    lb = bench()

    def row(name: str, rps: float, p99: float) -> object:
        return lb.StreamResult(name, 2, int(rps * 10), 0, 10.0, rps, p99 / 2, p99)

    rows = {"interactive-alone": [row("interactive", 40, 30)], "bulk-alone": [row("bulk", 100, 400)],
            "mixed": [row("interactive", 20, 45), row("bulk", 72, 500)],
            "small-alone": [row("small", 40, 30)], "tenants": [row("large", 90, 700), row("small", 30, 60)]}
    figures = lb.ratios(rows)
    assert figures["interactive_p99_beside_bulk_over_alone"] == 1.5
    assert figures["bulk_kept_of_alone_minus_interactive"] == 0.9  # 72 of (100 - 20)
    assert figures["small_tenant_p99_beside_large_over_alone"] == 2.0
    assert figures["large_tenant_requests_per_second"] == 90
    # Windows left out (--windows): their ratios are null, the others stand.
    only_tenants = lb.ratios({"small-alone": rows["small-alone"], "tenants": rows["tenants"]})
    assert only_tenants == {"interactive_p99_beside_bulk_over_alone": None,
                            "bulk_kept_of_alone_minus_interactive": None,
                            "small_tenant_p99_beside_large_over_alone": 2.0, "large_tenant_requests_per_second": 90}
