"""Measurement: benchmarks, the served driver, server CPU accounting and the instance report.

Every producer writes a typed result (measure/results.py) and every reader validates it back:
  siglip-serve bench           -> measure.bench (+ measure.served, measure.multicore) -> BenchResult
  python -m measure.multicore  -> MulticoreResult
  siglip-serve loadtest        -> loadtest/ (Locust) -> LoadTestSummary (loadtest/summary.py)
  siglip-serve loadtest report -> measure.report reads the three -> InstanceReport, report.md, PNGs
measure/ may import models/ and serve/ (the app it benchmarks); it never imports loadtest/, which
imports it.
"""
