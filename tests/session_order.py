"""The order the suite runs its modules in, by the session's lasting services each needs (tests/conftest.py), and
how a run split over workers (pytest-xdist, `-n 2 --dist loadgroup`) shares them out.

Once a test starts one of the session's lasting services (its Ray with Serve, then the `main` app on it), that
service stays up to the session's end, and idle it still takes a share of this machine's cores (Ray's agents,
Serve's controller and proxy, the app's replicas) from every test that runs beside it: most of all from the tests
that start a service of their own. So in one process the modules that need none run first, then those that need
Ray alone, then those that need the `main` app too, each group in its collected order. A module stays whole, its
module-scoped fixtures set up once.

Split over workers, the modules that need a lasting service are one group, run by one worker in that same order
(so the session's Ray and app start once, in one worker), and every other module is a group of its own: the
other worker runs them one after another beside it, each whole; except the modules marked `own_cluster`, which
start Rays of their own (a `siglip-serve run`, `ray start`, a bench, bulk or rehearsal run): they are one group too,
so the other worker runs them one after another and no two of them overlap. The lasting group comes first, as it
is the longest, then the own clusters' group: whichever worker ends first takes what is left. Two starts never run
at once whatever the split: each takes the machine's cluster-start lock (tests/bounds.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

# The session's lasting services, by fixture, in the order they start: Ray (with Serve), then the `main` app.
LASTING_FIXTURES = ("serve_cluster", "main_app")
# The group (pytest-xdist's xdist_group) of every module that needs one of them.
LASTING_GROUP = "lasting-services"
# The marker of a module that starts Rays of its own (registered in pyproject.toml), and its modules' group.
OWN_CLUSTER_MARKER = "own_cluster"
OWN_CLUSTER_GROUP = "own-clusters"


class Collected(Protocol):
    """What the order reads of a collected test (a pytest.Item): its module's path, and the fixtures it needs
    (`fixturenames`, every one it needs through others too; an item that is no test function has none)."""

    @property
    def path(self) -> Path: ...

    def get_closest_marker(self, name: str) -> object | None: ...


T = TypeVar("T", bound=Collected)


def _needs(items: Sequence[Collected]) -> dict[Path, tuple[bool, ...]]:
    """Each module's path -> which of LASTING_FIXTURES any of its tests needs."""
    needs: dict[Path, tuple[bool, ...]] = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        mine = tuple(name in fixtures for name in LASTING_FIXTURES)
        needs[item.path] = tuple(a or b for a, b in zip(needs.get(item.path, mine), mine, strict=True))
    return needs


def lasting_services_last(items: Sequence[T]) -> list[T]:
    """`items` with each module placed by the lasting services any of its tests needs, fewest first, stably."""
    needs = _needs(items)
    return sorted(items, key=lambda item: needs[item.path])


def split_for_workers(items: Sequence[T]) -> list[tuple[T, str]]:
    """`items` for a run over workers, each with its group: the modules that need a lasting service first, as
    LASTING_GROUP in lasting_services_last's order among themselves; then the modules marked OWN_CLUSTER_MARKER
    that need none, as OWN_CLUSTER_GROUP in their collected order; then every other module, in its collected
    order, as a group named by its path (relative to the working directory, the same in every worker)."""
    needs = _needs(items)
    own = {item.path for item in items if item.get_closest_marker(OWN_CLUSTER_MARKER) is not None}

    def group(item: T) -> str:
        if any(needs[item.path]):
            return LASTING_GROUP
        return OWN_CLUSTER_GROUP if item.path in own else os.path.relpath(item.path)

    rank = {LASTING_GROUP: 0, OWN_CLUSTER_GROUP: 1}
    ordered = sorted(items, key=lambda item: (rank.get(group(item), 2), needs[item.path]))
    return [(item, group(item)) for item in ordered]
