"""What each model of a service sets for itself: the settings of its model (models/settings.py ModelSettings) and of
how it is served (`ModelServing`), and a `models:` entry, which is both with the model's `name`.

The types decide which key belongs to a model: an entry takes exactly `ModelEntry`'s fields, and the service's
config (serve/plan/config.py ServiceConfig) inherits both groups, as the settings of its one model, or the ones
every entry's own settings go over (serve/plan/served_models.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.scaling import Autoscaling

# A name goes into deployment names, URLs' query strings and metric labels as it is.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class ModelServing(BaseModel):
    """How one model is served: its towers' replicas and what each asks of the cluster, its batching, and what its
    requests may ask of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # On cpu one replica per core beat one replica with a thread per core for small models (serve/plan/cpu_plan.py).
    replicas: int | Literal["auto"] | None = Field(
        None, description="encoder replicas, or 'auto': one per device of the kind each replica holds that the "
                          "Ray cluster declares (a logical NeuronCore on neuron, a GPU on cuda), less the text "
                          "replicas'; on cpu one per core for an image tower up to 150 M parameters (one with "
                          "every core above), as many as memory holds (default: auto on cpu, else 1)")
    neuron_cores_per_replica: int | None = Field(
        None, ge=0, le=1, description="logical NeuronCores each encoder replica asks Ray for (default: 1 on the "
                                      "neuron backends, else 0)")
    encoder_num_cpus: float = Field(1.0, ge=0, description="CPUs each encoder replica asks Ray for")
    # On neuron a replica is one logical NeuronCore, so a node's count is fixed: scaling adds replicas
    # that stay pending until Ray's autoscaler adds a node (deploy/kuberay/rayservice.yaml).
    autoscaling: Autoscaling | None = Field(None, description="scale the encoder replicas with load between "
                                            "min_replicas and max_replicas (replicas must be unset)")
    batch_wait_timeout_s: float = Field(0.005, ge=0, le=10,
                                        description="seconds the batcher waits to fill a batch")
    min_ready_replicas: int = Field(1, ge=1, description="/readyz answers 200 while at least this many encoder "
                                                         "replicas are warm (capped at replicas)")
    # The text tower (POST /v1/embeddings with text, /v1/classify) runs in its own replicas with its own
    # batcher, so texts never queue behind images nor images behind texts. A text replica on cuda or
    # neuron needs a GPU / NeuronCore of its own (and on neuron an artifact compiled with --text).
    text_replicas: int | None = Field(None, ge=0, description="text tower replicas; 0 turns the text routes off "
                                                              "(default: on cpu 1 when the tokenizer is found - "
                                                              "local, or the hub answers at start - else 0; 0 on "
                                                              "cuda and neuron)")
    text_num_cpus: float = Field(0.5, ge=0, description="CPUs each text replica asks Ray for")
    # Ray still sets NEURON_RT_VISIBLE_CORES per replica itself.
    env_vars: dict[str, str] = Field(default_factory=dict, description="environment variables of every encoder "
                                                                       "replica (Ray runtime_env), e.g. "
                                                                       "NEURON_LOGICAL_NC_CONFIG on trn2")
    # Deliberate, documented differences from open_clip (docs/preprocessing.md; cosine >= 0.9999 kept).
    fast_jpeg_decode: bool = Field(True, description="decode large JPEGs at a reduced DCT scale (>= 2x the model's "
                                                     "input), then resize on PyTorch's vectorised bicubic (a level "
                                                     "or two from Pillow's pixels); false gives open_clip's exact "
                                                     "pixels")
    # nvJPEG on the GPU instead of the ingress's cores (models/device_decode.py); cpu allows it for tests.
    device_jpeg_decode: bool = Field(False, description="cuda: decode 8-bit RGB/grey JPEGs in the encoder replica on "
                                                        "the GPU (nvJPEG); every limit is still checked in the ingress")
    # SigLIP is not trained for truncation (Matryoshka): a shorter vector loses accuracy, so `dimensions`
    # below the model's size is refused unless the operator accepts that here.
    allow_dimension_truncation: bool = Field(False, description="honour `dimensions` below the model's size by "
                                             "truncating and re-normalising (lossy); off: such requests get 400")

    @model_validator(mode="after")
    def _check_replicas(self) -> ModelServing:
        if isinstance(self.replicas, int) and self.replicas < 1:
            raise ValueError("replicas must be at least 1 (or 'auto')")
        if self.autoscaling is not None and self.replicas is not None:
            raise ValueError(f"replicas: {self.replicas} and autoscaling contradict; with autoscaling the encoder "
                             "count is autoscaling.min_replicas..max_replicas (leave replicas unset)")
        return self


class ModelEntry(ModelServing, ModelSettings):
    """One entry of a config's `models:`: the model's name and the settings it sets over the service's. What it
    leaves out is the service's; a key it sets is its own even where the value is the default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="what a request's `model` names: letters, digits, '.', '_' or '-' (at most 63); "
                                  "its deployments and metric labels carry it")

    @model_validator(mode="before")
    @classmethod
    def _named_with_own_keys(cls, data: Any) -> Any:
        # Said plainly, not as pydantic's "field required" or "extra inputs are not permitted": what a name is, and
        # where a key that is not a model's own goes.
        if not isinstance(data, Mapping):
            return data
        name = data.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError("name: give each model a name of letters, digits, '.', '_' or '-' (at most 63), the "
                             f"name requests' `model` uses; got {name!r}")
        service = sorted(set(data) - set(cls.model_fields))
        if service:
            raise ValueError(f"{', '.join(service)} belong to the service, not one model; set them beside models:, "
                             f"or per model only {', '.join(sorted(PER_MODEL))}")
        return data

    @field_validator("backend_options")
    @classmethod
    def _check_backend_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # The backend they are for may be the service's, set beside models:: they are checked with the model's
        # whole config (serve/plan/served_models.py), where the two meet.
        return value

    def __eq__(self, other: object) -> bool:
        # An entry is what it sets: a key set to its default still overrides the service's value, where a key left
        # out takes it, so two entries are equal only where they name the same model and set the same keys alike.
        if not isinstance(other, ModelEntry):
            return NotImplemented
        return self.name == other.name and self.own() == other.own()

    def own(self) -> dict[str, Any]:
        """The settings this entry sets, its name left out: what goes over the service's."""
        return self.model_dump(exclude_unset=True, exclude={"name"})


# The keys each model may set for itself, beside models: or in its entry.
PER_MODEL: frozenset[str] = frozenset(ModelEntry.model_fields) - {"name"}
