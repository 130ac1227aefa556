"""Fixtures (real photos, a tiny-model reference, a real local Ray Serve on loopback) and the one hook
that skips hardware-marked tests where the hardware or SDK is missing, saying why, and orders the modules by
the session's lasting services they need, or groups them for pytest-xdist's workers (tests/session_order.py).

Integration tests run the real application (`siglip_serve.serve.app.build`) on `tiny-siglip` under a Ray
started here, on 127.0.0.1 only, and stop it at the end of the session. What tests share besides
fixtures is in tests/helpers.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
import pytest

from siglip_serve.launcher.preflight import free_port
from tests.bounds import RAY_START_ENV, STOP_S, TEST_TIMEOUT_S, cluster_start, scaled
from tests.helpers import (
    API_KEY,
    DEPLOYED,
    TEST_DEVICE,
    TEST_DEVICES,
    TEST_NEURON_CORES,
    ServeCluster,
    TinyReference,
    delete_apps,
    deploy,
    jpeg_bytes,
    wait_for_deleted,
)
from tests.session_order import lasting_services_last, split_for_workers

# Tests pin their own Ray: loopback, no token prompts, no usage reporting.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray starts its workers (every Serve replica) at nice 15 and leaves its driver at 0 (RayConfig
# `worker_niceness`; Ray's job manager sets RAY_worker_niceness=0 for a job's driver alone:
# ray/dashboard/modules/job/job_manager.py). The suite's two pytest workers share the cores, so a replica at 15
# gets a few percent of one beside the other worker's plain processes, and a test timing it stalls for seconds.
# Every Ray the suite starts (its own, and those of the services tests start as subprocesses) runs its workers at 0.
os.environ.setdefault("RAY_worker_niceness", "0")
# Ray's start bounds that it lets a caller raise, raised for every Ray the suite starts (tests/bounds.py).
for _name, _value in RAY_START_ENV.items():
    os.environ.setdefault(_name, _value)


# -- hardware markers and the modules' order: one hook decides, for every test directory -------

def _neuron_problem() -> str | None:
    """The trace line (torch-neuronx 2.9 with trace()), as `--backend neuron` needs it."""
    try:
        import torch_neuronx
    except Exception:  # PyPI's placeholder raises on import, or nothing is there: either way no SDK
        torch_neuronx = None
    if hasattr(torch_neuronx, "trace"):
        return None
    return "needs a Trainium2 with the Neuron SDK (torch-neuronx); none here"


def _neuron_native_problem() -> str | None:
    """The TorchNeuron line (torch-neuronx 2.14). The trace line's check cannot tell: both lines are
    the distribution torch-neuronx."""
    from siglip_serve.models.neuron.env import TorchNeuronRefusal, check_native_sdk, installed_versions

    try:
        check_native_sdk(installed_versions())
    except TorchNeuronRefusal as exc:
        return "needs a Trainium2 with TorchNeuron: " + str(exc).split(";")[0]
    return None


def _nki_problem() -> str | None:
    """The real NKI package (0.2+), which the kernels' simulator runs need; PyPI's nki is a placeholder."""
    from siglip_serve.kernels.nki_launch import nki_status

    usable, reason = nki_status()
    return None if usable else f"needs the real NKI package: {reason}"


def _cuda_problem() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU; none here"


# marker -> why its tests cannot run here (None: they can). Markers are registered in pyproject.toml.
HARDWARE_MARKERS: dict[str, Callable[[], str | None]] = {
    "neuron": _neuron_problem,
    "neuron_native": _neuron_native_problem,
    "nki": _nki_problem,
    "cuda": _cuda_problem,
}


# The environment as the session starts. Importing a test module must not change it: what a module sets
# at import reaches every test collected with it, and every cluster they start, but not the same test
# run alone. Set by the libraries themselves when imported (ray/_private/client_mode_hook.py,
# torch/_inductor, open_clip/tokenizer.py), whatever the tests do:
_ENVIRON_AT_START = dict(os.environ)
_SET_BY_LIBRARY_IMPORTS = frozenset({"RAY_CLIENT_MODE", "TORCHINDUCTOR_CACHE_DIR", "TOKENIZERS_PARALLELISM"})


def environ_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The names whose value differs (set, changed or removed), sorted, less what libraries set on import."""
    return sorted(name for name in before.keys() | after.keys()
                  if before.get(name) != after.get(name) and name not in _SET_BY_LIBRARY_IMPORTS)


# First: pytest-xdist's own hook (registered later, so otherwise called first) reads the groups set here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    changed = environ_changes(_ENVIRON_AT_START, dict(os.environ))
    if changed:
        raise pytest.UsageError(f"importing the test modules changed the environment ({', '.join(changed)}): "
                                "set it inside a test, a fixture or a subprocess's own env")
    problems: dict[str, str | None] = {}
    for item in items:
        # pytest-timeout's bound, its own or the suite's, times the suite's one factor (tests/bounds.py).
        marker = item.get_closest_marker("timeout")
        item.add_marker(pytest.mark.timeout(scaled(marker.args[0] if marker and marker.args else TEST_TIMEOUT_S)),
                        append=False)
        for marker, probe in HARDWARE_MARKERS.items():
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in problems:  # each probe runs once, and only if a collected test needs it
                problems[marker] = probe()
            problem = problems[marker]
            if problem is not None:
                item.add_marker(pytest.mark.skip(reason=problem))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker collects, the controller splits
        split = split_for_workers(items)
        for item, group in split:
            item.add_marker(pytest.mark.xdist_group(group))
        items[:] = [item for item, _ in split]
    else:
        items[:] = lasting_services_last(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """In pytest-xdist's controller, as each worker's collection comes in. loadgroup passes a test's group to
    its scheduler as a suffix of the test's id (every test here has one); where pytest no longer lets it change
    the id (pytest 9.2, pytest-xdist issue #1386), the groups are dropped without a word and every worker starts
    the session's Ray. Stopped instead."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid.rpartition("::")[2]]
    if ungrouped:
        pytest.exit(f"pytest-xdist's loadgroup did not group {ungrouped[0]} (and {len(ungrouped) - 1} more): this "
                    "pytest is one it cannot group under (pyproject.toml pins one it can)", returncode=4)


# -- images and the tiny model --------------------------------------------------------------

@pytest.fixture(scope="session")
def photos() -> list[np.ndarray]:
    """Real photographs shipped with the package (core/sample_photos.py), as RGB uint8 arrays."""
    from siglip_serve.core.sample_photos import photo_array

    return [photo_array(name) for name in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry")]


@pytest.fixture(scope="session")
def photo_jpegs(photos: list[np.ndarray]) -> list[bytes]:
    return [jpeg_bytes(p) for p in photos]


@pytest.fixture(scope="session")
def tiny_reference() -> TinyReference:
    from siglip_serve.models.loading import load_embedder
    from siglip_serve.models.settings import ModelSettings

    embedder, info = load_embedder(ModelSettings(model="tiny-siglip"))
    return TinyReference(embedder, info.image_size)


# -- a real local Ray Serve -----------------------------------------------------------------

@pytest.fixture(scope="session")
def serve_cluster() -> Iterator[ServeCluster]:
    """A local Ray (16 logical CPUs, 2 declared neuron_cores, 2 of a test-only device) with Serve's front
    end on a free port: the default HAProxy one, or Serve's proxy actor with SIGLIP_TEST_FRONT_END=python."""
    import ray
    from ray import serve

    from siglip_serve.launcher.haproxy_front import METRICS_PORT_ENV, use_front_end

    front_end = os.environ.get("SIGLIP_TEST_FRONT_END", "haproxy")
    before = dict(os.environ)
    use_front_end(front_end, local_only=True)
    # Serve keeps a deleted app's direct-ingress replica draining for at least 30 s (Ray 2.60,
    # serve/_private/constants.py), time for an outside load balancer to stop sending to it. No
    # outside balancer here: 2 s, so a test module's app teardown costs 2 s, not 30.
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "2"
    front_end_env = {key for key, value in os.environ.items() if before.get(key) != value}
    haproxy_metrics = os.environ.get(METRICS_PORT_ENV) if front_end == "haproxy" else None
    port = free_port()
    metrics_port = free_port()
    already_there = {p.pid for p in psutil.Process().children(recursive=True)}
    with cluster_start("the session's Ray"):
        ray.init(
            num_cpus=16,
            resources={"neuron_cores": TEST_NEURON_CORES, TEST_DEVICE: TEST_DEVICES},
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            namespace="siglip-serve-tests",
            log_to_driver=False,
            _metrics_export_port=metrics_port,
            # Workers push metrics every second (Ray's default is 10 s), so scrapes see them quickly.
            _system_config={"metrics_report_interval_ms": 1000},
        )
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    # This Ray's processes have the front end's environment now; services the tests start as
    # subprocesses must not inherit its ports. Only those keys: what ray.init itself set stays.
    for key in front_end_env:
        if key in before:
            os.environ[key] = before[key]
        else:
            os.environ.pop(key, None)
    try:
        yield ServeCluster(port, f"http://127.0.0.1:{port}", metrics_port, front_end,
                           int(haproxy_metrics) if haproxy_metrics else None)
    finally:
        left: list[str] = []
        try:
            if ray.is_initialized():
                left = wait_for_deleted(STOP_S)
        finally:
            # As `siglip-serve run` stops its own Ray (launcher/runner.py): no request is in flight, so Serve's
            # graceful stop of every replica would only wait. HAProxy, started by a Ray worker, would outlive
            # its worker: what this Ray started is ended here, as run's session ends it (launcher/session.py).
            started = [p for p in psutil.Process().children(recursive=True) if p.pid not in already_there]
            ray.shutdown()
            for process in started:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            _, alive = psutil.wait_procs(started, timeout=scaled(10))
    assert not left, f"applications still there {STOP_S:.0f} s after their deletion: {left}"
    assert not alive, f"processes of the session's Ray still running after it stopped: {alive}"


@pytest.fixture(scope="module", autouse=True)
def _delete_module_apps() -> Iterator[None]:
    """Delete the apps a module deployed (tests.helpers.deploy) once it ends (the session's `main` app stays),
    without waiting for them to drain: serve_cluster checks at the session's end that they went."""
    before = len(DEPLOYED)
    yield
    names = [name for name in DEPLOYED[before:] if name != "main"]
    del DEPLOYED[before:]
    if names:
        import ray

        if ray.is_initialized():
            delete_apps(names)


@pytest.fixture(scope="session")
def main_app(serve_cluster: ServeCluster) -> str:
    """tiny-siglip, one replica per declared NeuronCore (and one text replica), with an API key, and
    Serve's throughput mode as an accelerator host has it by default. Its replicas start under the cluster-start
    lock, as the session's Ray did."""
    with cluster_start("the session's main app"):
        deploy(
            "main", "/", replicas=TEST_NEURON_CORES, neuron_cores_per_replica=1, api_key=API_KEY, text_replicas=1,
            encoder_num_cpus=0.5, batch_wait_timeout_s=0.01, torch_threads=1, throughput_optimized=True,
        )
    return serve_cluster.base_url
