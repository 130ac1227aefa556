"""What a backend is: a record of the platform's facts, which every caller asks instead of its name,
and the implementation its module provides, imported only when a tower is built or a check runs.

Modelled on vLLM's platforms (vllm/platforms/interface.py `Platform`: `ray_device_key`, the Ray
resource a worker holds, and `device_control_env_var`, the variable that names its devices; the
built-in ones listed by qualified name in vllm/platforms/__init__.py and resolved lazily) and on
Triton's `instance_group` (a kind of device and a count of instances per device,
docs/user_guide/model_configuration.md, "Instance Groups"). Torch-free: the config, the placement
plan and the command lines read records without loading a model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch: only where a tower is built
    from siglip_serve.models.settings import ModelSettings
    from siglip_serve.models.tower import Tower

IMAGE = "image"
TEXT = "text"


@dataclass(frozen=True)
class BackendRecord:
    """One backend's facts. A replica of either tower holds `per_replica` of `ray_resource`."""

    name: str
    # What torch calls the device the model runs on ("cpu", "cuda", "neuron"); "none": no model runs.
    device: str
    # "module:attribute" of its Implementation, imported on first use (it imports torch and SDKs).
    implementation: str
    # The Ray resource one replica holds (vLLM's ray_device_key; Ray's accelerator managers'
    # get_resource_name: "GPU", "neuron_cores"), and how much of it. None: it asks Ray for CPUs only.
    ray_resource: str | None = None
    per_replica: float = 0.0
    # The variable Ray sets to the devices a replica holds (vLLM's device_control_env_var; Ray's
    # get_visible_accelerator_ids_env_var); a process pinned by hand (the multi-core bench) sets it.
    visible_devices_env: str | None = None
    # The model's forward passes run on the host's cores, beside HTTP and decoding (threads, CPU plan).
    host_cores: bool = False
    # It runs only its compiled bucket sizes, padding the last chunk (TEI's `is_padded`); or it does
    # where the ModelSettings flag `graphs_setting` is on (one CUDA graph per bucket).
    static_shapes: bool = False
    graphs_setting: str | None = None
    # It can decode JPEGs on its device inside the replica (`device_jpeg_decode`).
    device_decode: bool = False
    # The towers it builds.
    towers: tuple[str, ...] = (IMAGE, TEXT)
    # False: no model runs and no weights are read (zeros-no-model, the host ceiling).
    runs_model: bool = True
    # Its replicas load the model from a compiled artifact (artifact_dir), which holds the weights: none
    # are read or fetched for it (ModelSettings.needs_weights), on any node.
    reads_artifact: bool = False
    # "module:function", torch-free: (ModelSettings) -> the environment its replica sets on itself before
    # it imports torch (neuron-native: the artifact's recipe). Called where the replica runs, since only
    # that node may see the artifact (serve/replica_start.py).
    replica_env: str | None = None
    # The ModelSettings fields that are its own (shown beside its results, e.g. accuracy's sides).
    settings: tuple[str, ...] = ()

    def builds(self, tower: str) -> bool:
        return tower in self.towers

    def runs_static_shapes(self, settings: ModelSettings) -> bool:
        return self.static_shapes or bool(self.graphs_setting and getattr(settings, self.graphs_setting))

    @property
    def resources(self) -> dict[str, float]:
        """The device resources one replica asks Ray for: {} where it runs on CPUs alone."""
        return {self.ray_resource: self.per_replica} if self.ray_resource and self.per_replica else {}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackendRecord:
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**values)


@dataclass(frozen=True)
class Implementation:
    """What a backend's module provides: the towers it builds (each a tower's pre/post around the
    backend's one Runner, models/tower.py) and its checks."""

    # The tower (IMAGE or TEXT) on this backend, loaded and ready to warm up.
    build: Callable[[ModelSettings, str], Tower]
    # Before any Ray process starts: can this machine run it? `env`: what the replicas will see (None:
    # joining a cluster started elsewhere, skip what depends on it). Raises BackendUnavailable.
    check_available: Callable[[ModelSettings, Mapping[str, str] | None], None] | None = None
    # Without an SDK, on the machine that will run it (`siglip-serve run`, before Ray starts): can it build
    # this tower from what is on disk?
    check_tower: Callable[[ModelSettings, str], None] | None = None
    # What its compiled artifact was compiled for (e.g. {"lnc": 2, "auto_cast": "matmult"}), for results.
    compiled_for: Callable[[ModelSettings], Mapping[str, Any]] | None = None
