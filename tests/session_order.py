"""The order the suite runs its modules in, by the session's lasting services each needs (tests/conftest.py).

Once a test starts one of the session's lasting services (its Ray with Serve, then the `main` app on it), that
service stays up to the session's end, and idle it still takes a share of this machine's cores (Ray's agents,
Serve's controller and proxy, the app's replicas) from every test that runs beside it: most of all from the tests
that start a service of their own. So the modules that need none run first, then those that need Ray alone, then
those that need the `main` app too, each group in its collected order. A module stays whole, its module-scoped
fixtures set up once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

# The session's lasting services, by fixture, in the order they start: Ray (with Serve), then the `main` app.
LASTING_FIXTURES = ("serve_cluster", "main_app")


class Collected(Protocol):
    """What the order reads of a collected test (a pytest.Item): its module's path, and the fixtures it needs
    (`fixturenames`, every one it needs through others too; an item that is no test function has none)."""

    @property
    def path(self) -> Path: ...


T = TypeVar("T", bound=Collected)


def lasting_services_last(items: Sequence[T]) -> list[T]:
    """`items` with each module placed by the lasting services any of its tests needs, fewest first, stably."""
    needs: dict[Path, tuple[bool, ...]] = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        mine = tuple(name in fixtures for name in LASTING_FIXTURES)
        needs[item.path] = tuple(a or b for a, b in zip(needs.get(item.path, mine), mine, strict=True))
    return sorted(items, key=lambda item: needs[item.path])
