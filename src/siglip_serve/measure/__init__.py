"""Measurement: benchmarks, the served driver, server CPU accounting and the instance report.

Every producer writes a typed result (measure/results.py, measure/load_results.py) and every reader validates it back:
  siglip-serve bench           -> measure/bench.py (+ served.py, multicore.py) -> BenchResult
  python -m siglip_serve.measure.multicore  -> MulticoreResult
  siglip-serve loadtest        -> loadtest/ (Locust) -> LoadTestSummary (loadtest/summary.py)
  siglip-serve report -> siglip_serve.measure.report reads the three -> InstanceReport, report.md, PNGs
measure/ may import models/ and serve/ (the app it benchmarks); it never imports loadtest/, which
imports it.
"""
