"""Facts of the host this process runs on, without importing torch (the planner reads them in the builder)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
