"""The backend record, the registry and the placement plan: callers ask a record, never a name; one
runner per backend serves both towers; one function places every replica (serve/plan/placement.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from siglip_serve.core.backends import (
    BACKENDS,
    BUILTIN,
    IMAGE,
    TEXT,
    BackendRecord,
    backend_record,
    extra_backends_env,
    load,
    registered,
)
from siglip_serve.core.constants import EXTRA_BACKENDS_ENV
from siglip_serve.core.errors import BackendUnavailable
from siglip_serve.models.backends import cuda
from siglip_serve.models.backends.implementation import (
    Implementation,
    create_encoder,
    create_text_encoder,
    implementation,
)
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.cluster_fit import check_cluster_fits
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.placement import replica_asks
from siglip_serve.serve.plan.planner import plan_service
from tests.bounds import scaled
from tests.helpers import SRC

# The places outside models/backends/ that may still compare a backend's name with a literal, each
# argued: the compile command of the two Neuron lines dispatches to the line's compiler (its own CLI).
NAME_BRANCHES_ALLOWED = {"models/neuron/cli.py"}


def test_every_builtin_records_import_strings_resolve() -> None:
    assert tuple(r.name for r in BUILTIN) == BACKENDS
    for record in BUILTIN:
        assert isinstance(implementation(record.name), Implementation), record.name
        # Its other import strings resolve too (relative to models/backends, as the builders read them).
        assert record.replica_env is None or callable(load(record.replica_env)), record.name
        assert record.backend_options is None or issubclass(load(record.backend_options), BaseModel), record.name
        # `preflight` says whether the implementation has checks, so a backend without any is checked unimported.
        checks = implementation(record.name)
        assert record.preflight == (checks.check_available is not None or checks.check_tower is not None), record.name


def test_checking_a_backend_without_checks_imports_no_torch() -> None:
    code = ("import sys; from siglip_serve.models.backends.implementation import check_backend_available, "
            "check_tower; from siglip_serve.models.settings import ModelSettings; "
            "s = ModelSettings(model='tiny-siglip', backend='cpu'); check_backend_available(s, {}); "
            "check_tower(s, 'image'); check_tower(s, 'text'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120), check=True)
    assert out.stdout.strip() == "False"


def _what_its_towers_do(settings: ModelSettings) -> dict[str, Any]:
    """The towers the backend's implementation builds, the device its runner holds, whether it holds a
    model, and the sizes its runner is handed for 3 inputs with buckets (1, 4) (no device work: each
    forward answers ones)."""
    image = create_encoder(settings)
    sizes: list[int] = []

    def forward(batch: torch.Tensor) -> torch.Tensor:
        sizes.append(int(batch.shape[0]))
        return torch.ones((int(batch.shape[0]), image.embed_dim))

    image.runner.forward = forward  # type: ignore[method-assign]
    image.encode(np.zeros((3, 3, 64, 64), dtype=np.uint8))
    towers = [IMAGE]
    try:
        create_text_encoder(settings)
        towers.append(TEXT)
    except BackendUnavailable:
        pass
    runs_model = isinstance(getattr(image.runner, "module", None), torch.nn.Module)
    return {"towers": tuple(towers), "device": image.device.type if runs_model else "none",
            "runs_model": runs_model, "padded": sizes == [4]}


def _what_its_record_says(settings: ModelSettings) -> dict[str, Any]:
    record = backend_record(settings.backend)
    return {"towers": record.towers, "device": record.device, "runs_model": record.runs_model,
            "padded": bool(record.graphs_setting and getattr(settings, record.graphs_setting))}


# The backends whose runner this machine builds (cuda's with its device work left out, `no_gpu_needed`);
# the Neuron lines need an artifact and are built through their doubles in test_text_neuron.py and
# tests/integration.
@pytest.mark.parametrize("backend, flags", [
    ("cpu", {}), ("cuda", {"cuda_graphs": False}), ("cuda", {"cuda_graphs": True}), ("zeros-no-model", {}),
])
def test_a_record_says_what_its_runner_does(no_gpu_needed: None, backend: str, flags: dict[str, Any]) -> None:
    settings = ModelSettings(model="tiny-siglip", backend=backend, buckets=(1, 4), text_buckets=(1, 4),
                             torch_threads=1, **flags)
    assert _what_its_towers_do(settings) == _what_its_record_says(settings)


def test_asking_records_imports_no_torch_and_a_registered_backend_travels_in_the_environment() -> None:
    record = BackendRecord("elsewhere", device="cpu", implementation="nowhere:IMPLEMENTATION", ray_resource="X",
                           per_replica=0.5, towers=(IMAGE,))
    with registered(record):
        env = extra_backends_env()
    assert json.loads(env[EXTRA_BACKENDS_ENV])[0]["name"] == "elsewhere"
    assert extra_backends_env() == {}  # unregistered: nothing travels
    code = ("import sys; from siglip_serve.core.backends import backend_record; "
            "from siglip_serve.serve.plan.placement import replica_asks; "
            "from siglip_serve.serve.plan.config import ServiceConfig; "
            "r = backend_record('elsewhere'); "
            "p = replica_asks(ServiceConfig(model='tiny-siglip', backend='elsewhere')); "
            "print(r.per_replica, r.towers, p.image.actor_options(), p.text.actor_options(), "
            "sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**env, "PATH": "/usr/bin:/bin"})
    assert out.stdout.split("\n")[0] == ("0.5 ('image',) {'num_cpus': 1.0, 'resources': {'X': 0.5}} "
                                         "{'num_cpus': 0.5, 'resources': {'X': 0.5}} []")


@pytest.mark.parametrize("args, image, text", [
    ({"backend": "cpu"}, {"num_cpus": 1.0}, {"num_cpus": 0.5}),
    ({"backend": "cuda"}, {"num_cpus": 1.0, "num_gpus": 1}, {"num_cpus": 0.5, "num_gpus": 1}),
    ({"backend": "neuron"}, {"num_cpus": 1.0, "resources": {"neuron_cores": 1}},
     {"num_cpus": 0.5, "resources": {"neuron_cores": 1}}),
    # the tests' stand-in for neuron: CPU image replicas placed on declared cores; the text replica is not
    ({"backend": "cpu", "neuron_cores_per_replica": 1}, {"num_cpus": 1.0, "resources": {"neuron_cores": 1}},
     {"num_cpus": 0.5}),
    ({"backend": "neuron-native", "neuron_cores_per_replica": 0}, {"num_cpus": 1.0}, {"num_cpus": 0.5}),
    ({"backend": "zeros-no-model"}, {"num_cpus": 1.0}, {"num_cpus": 0.5}),
])
def test_one_plan_places_both_towers_from_the_record(args: dict, image: dict, text: dict) -> None:
    asks = replica_asks(ServiceConfig(model="tiny-siglip", **args))
    assert (asks.image.actor_options(), asks.text.actor_options()) == (image, text)


def test_the_cluster_check_counts_every_device_a_record_asks_for() -> None:
    config = ServiceConfig(model="tiny-siglip", backend="cuda", replicas=2, text_replicas=1, ingress_replicas=1)
    check_cluster_fits(plan_service(config), total={"CPU": 8.0, "GPU": 3.0})
    with pytest.raises(ConfigError, match=r"needs 3 GPU \(2 encoder replica\(s\) x 1 \+ 1 text replica\(s\) x 1\) "
                                          r"but the Ray cluster declares 2; .*--num-gpus N"):
        check_cluster_fits(plan_service(config), total={"CPU": 8.0, "GPU": 2.0})


class CaptureRecorder(cuda.CudaRunner):
    """The cuda backend's real runner (its dtype choice, which buckets get a graph, static shapes) with the
    device work left out: each capture records the example it was given and moves nothing. It proves that
    both towers get graphs for their own buckets from the one runner; it does not prove that a capture or
    a replay works on a GPU (tests/device/test_cuda_backend.py does, where a GPU is lent)."""

    examples: list[torch.Tensor] = []

    def _capture(self, example: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        CaptureRecorder.examples.append(example)
        return None, example, example  # type: ignore[return-value]  # no graph without a GPU


@pytest.fixture
def no_gpu_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "CudaRunner", CaptureRecorder)
    monkeypatch.setattr(cuda, "check_available", lambda settings, env=None: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "double")
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *args, **kwargs: self)
    CaptureRecorder.examples = []


def test_cuda_graphs_are_captured_for_both_towers_or_for_neither(no_gpu_needed: None) -> None:
    settings = ModelSettings(model="tiny-siglip", backend="cuda", cuda_graphs=True, buckets=(1, 2),
                             text_buckets=(1, 4, 8))
    image, text = create_encoder(settings), create_text_encoder(settings)
    assert type(image.runner) is type(text.runner) is CaptureRecorder
    # Graphs by input shape: here one per bucket, as each bucket takes one shape.
    assert sorted(image.runner.graphs) == [(1, 3, 64, 64), (2, 3, 64, 64)]
    assert sorted(text.runner.graphs) == [(1, 16), (4, 16), (8, 16)]
    assert image.static_shapes and text.static_shapes  # both pad to their buckets, to replay a graph
    assert text.describe()["cuda_graphs"] == [1, 4, 8] and text.describe()["autocast_dtype"] == "bfloat16"
    assert [(tuple(e.shape), e.dtype) for e in CaptureRecorder.examples] == [
        ((1, 3, 64, 64), torch.uint8), ((2, 3, 64, 64), torch.uint8),
        ((1, 16), torch.int64), ((4, 16), torch.int64), ((8, 16), torch.int64)]
    eager = create_text_encoder(settings.model_copy(update={"cuda_graphs": False}))
    assert eager.runner.graphs == {} and not eager.static_shapes  # no graph: real sizes, as the image tower


def test_the_cuda_default_captures_a_graph_per_bucket(no_gpu_needed: None) -> None:
    """cuda_graphs is on unless a config says otherwise: without graphs the encoder replica's one Python thread
    launching kernels, not the GPU, set the served rate on an H200 (docs/dev/benchmark-log.md)."""
    image = create_encoder(ModelSettings(model="tiny-siglip", backend="cuda", buckets=(1, 2)))
    assert image.describe()["cuda_graphs"] == [1, 2] and image.static_shapes


def _name_branches(path) -> list[int]:
    """Lines comparing something named *backend* with a string literal (==, !=, in, not in)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        named = any("backend" in ast.unparse(o).lower() for o in operands if isinstance(o, (ast.Name, ast.Attribute)))
        literal = any(isinstance(o, ast.Constant) and isinstance(o.value, str)
                      or isinstance(o, (ast.Tuple, ast.List, ast.Set)) and any(
                          isinstance(e, ast.Constant) and isinstance(e.value, str) for e in o.elts) for o in operands)
        if named and literal:
            found.append(node.lineno)
    return found


def test_outside_the_backends_package_no_code_branches_on_a_backends_name() -> None:
    found = {str(p.relative_to(SRC)): lines for p in sorted(SRC.rglob("*.py"))
             if "backends" not in p.relative_to(SRC).parts[:2] and (lines := _name_branches(p))}
    assert set(found) == NAME_BRANCHES_ALLOWED, found
    assert sum(len(lines) for lines in found.values()) <= 5
