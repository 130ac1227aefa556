"""One polling loop for "ask again until it is so or the time is up" (readiness, late metrics).

Not a library call: httpx's transport retries only failed connections, not answers such as a 503
from /readyz, and nothing we depend on polls a predicate against a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(attempt: Callable[[], T], done: Callable[[T], bool], timeout_s: float, interval_s: float = 1.0,
         sleep: Callable[[float], None] = time.sleep) -> tuple[T, bool, float]:
    """Call `attempt()` every `interval_s` until `done(result)` or `timeout_s` has passed.

    Returns (the last result, whether it was done, seconds waited). At least one attempt is made,
    also with a timeout of 0."""
    began = time.monotonic()
    while True:
        result = attempt()
        if done(result):
            return result, True, time.monotonic() - began
        if time.monotonic() - began >= timeout_s:
            return result, False, time.monotonic() - began
        sleep(interval_s)
