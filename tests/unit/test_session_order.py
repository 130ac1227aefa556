"""The suite's module order (tests/session_order.py): the modules that need fewer of the session's lasting services
run first, each module whole and in its collected order, as pytest's collection hands the order to the run; split
over workers, the modules that need them are one group, first."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.session_order import (
    LASTING_GROUP,
    OWN_CLUSTER_GROUP,
    OWN_CLUSTER_MARKER,
    lasting_services_last,
    split_for_workers,
)


@dataclass(frozen=True)
class Item:
    path: Path
    name: str
    fixturenames: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.markers else None


def test_modules_run_by_the_lasting_services_they_need_each_whole_and_in_order() -> None:
    a = Path("test_a.py")  # one test needs the main app (and so Ray): the whole module goes last
    b = Path("test_b.py")  # Ray alone
    c = Path("test_c.py")  # nothing lasting
    items = [Item(a, "a1", ("photos",)), Item(a, "a2", ("main_app", "serve_cluster")),
             Item(b, "b1", ("serve_cluster",)), Item(c, "c1"), Item(b, "b2"), Item(c, "c2", ("tmp_path",))]
    assert [item.name for item in lasting_services_last(items)] == ["c1", "c2", "b1", "b2", "a1", "a2"]


def test_split_over_workers_the_lasting_services_modules_are_one_group_first_and_every_other_module_its_own() -> None:
    a = Path("test_a.py")  # the main app
    b = Path("test_b.py")  # Ray alone
    c = Path("test_c.py")  # nothing lasting
    d = Path("test_d.py")  # nothing lasting
    items = [Item(d, "d1"), Item(d, "d2"), Item(a, "a1"), Item(a, "a2", ("main_app", "serve_cluster")),
             Item(c, "c1"), Item(b, "b1", ("serve_cluster",)), Item(b, "b2")]
    assert [(item.name, group) for item, group in split_for_workers(items)] == [
        ("b1", LASTING_GROUP), ("b2", LASTING_GROUP), ("a1", LASTING_GROUP), ("a2", LASTING_GROUP),
        ("d1", "test_d.py"), ("d2", "test_d.py"), ("c1", "test_c.py")]


def test_split_over_workers_the_modules_that_start_their_own_clusters_are_one_group_after_the_lasting_one() -> None:
    own = (OWN_CLUSTER_MARKER,)
    a = Path("test_a.py")  # the main app, and a Ray of its own: the lasting group it needs wins
    c = Path("test_c.py")  # nothing lasting
    e = Path("test_e.py")  # its own clusters
    f = Path("test_f.py")  # its own clusters
    items = [Item(e, "e1", markers=own), Item(e, "e2", markers=own), Item(c, "c1"), Item(a, "a1", ("main_app",), own),
             Item(f, "f1", markers=own)]
    assert [(item.name, group) for item, group in split_for_workers(items)] == [
        ("a1", LASTING_GROUP), ("e1", OWN_CLUSTER_GROUP), ("e2", OWN_CLUSTER_GROUP), ("f1", OWN_CLUSTER_GROUP),
        ("c1", "test_c.py")]


def test_this_suite_runs_the_service_starting_modules_before_the_session_ray_and_its_main_app() -> None:
    """The real modules, by their real fixtures' closure as pytest reports it."""

    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             # Given the other way round: the order is the hook's, not the command line's.
                             "tests/integration/test_http_api.py", "tests/integration/test_autoscaling.py",
                             "tests/integration/test_shutdown.py"],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    modules = list(dict.fromkeys(line.split("::")[0] for line in listed.stdout.splitlines() if "::" in line))
    assert modules == ["tests/integration/test_shutdown.py", "tests/integration/test_autoscaling.py",
                       "tests/integration/test_http_api.py"], modules
