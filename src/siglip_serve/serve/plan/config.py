"""The service's one typed config, filled from the Serve YAML `args:` or the CLI, checked at start: validated input
only, in groups, the group a key is declared in deciding its scope (one model's, the front's alone, or the whole
service's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from siglip_serve.core.backends import backend_record
from siglip_serve.core.constants import API_KEY_ENV as API_KEY_ENV
from siglip_serve.core.errors import ConfigError as ConfigError
from siglip_serve.core.errors import describe_validation
from siglip_serve.models.preprocess import ImageLimits
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.live_settings import FetchSettings as FetchSettings
from siglip_serve.serve.plan.live_settings import FrontLive, LiveSettings, MiB, keys_problem
from siglip_serve.serve.plan.model_entry import NAME, ModelEntry, ModelServing
from siglip_serve.serve.plan.replica_slices import FrontDoorKey
from siglip_serve.serve.plan.scaling import Autoscaling as Autoscaling
from siglip_serve.serve.plan.scaling import IngressAutoscaling as IngressAutoscaling


class FrontDoor(BaseModel):
    """What the ingress alone reads, beyond its live settings and its key: its replicas, what one request may
    carry, how it decodes, how it drains. Left out of a model's own application (`model_apps`,
    serve/plan/served_models.py model_app_args), so a change rolls the ingress only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # One ingress process carries about two cores of decoding and HTTP (serve/plan/cpu_plan.py).
    ingress_replicas: int | Literal["auto"] = Field(
        "auto", description="HTTP ingress replicas, or 'auto': one per two of this host's cores that the encoder "
                            "replicas and Ray's own processes leave free (at least 1)")
    # A backfill's decoding shares an ingress process's event loop, decode threads and GIL with every other request
    # it meets there; HAProxy can keep one process for the interactive lane alone (launcher/haproxy_front.py).
    interactive_ingress: bool = Field(False, description="one more ingress replica, to which HAProxy sends the "
                                                         "interactive lane's requests and no others (needs "
                                                         "api_keys_file, whose keys name the lane, and the HAProxy "
                                                         "front end)")
    ingress_autoscaling: IngressAutoscaling | None = Field(None, description="scale the ingress replicas with "
                                                           "their CPU between min_replicas and max_replicas "
                                                           "(ingress_replicas must be unset)")
    ingress_num_cpus: float = Field(0.5, ge=0, description="CPUs each ingress replica asks Ray for")
    # Pillow releases the GIL, so decode threads run in parallel.
    decode_threads: int = Field(4, ge=1, le=64, description="threads per ingress replica that decode and resize")
    # Enough to keep this ingress's share of the encoders' calls full twice over (one set running, the next
    # gathering) plus its decode threads (serve/ingress/front_door.py); HAProxy sends each replica no more at once.
    ingress_max_ongoing_requests: int | Literal["auto"] = Field(
        "auto", description="requests each ingress replica works on at once (reading, decoding, encoding), or "
                            "'auto': twice the images its share of the encoder calls carries, plus decode_threads")
    share_beside_others: float = Field(1.0, gt=0, le=1, description="the share of an ingress replica's requests at "
                                       "work that one tenant's requests in one lane may hold while another tenant's "
                                       "of the same lane, or any of a higher lane, are there or arrived within the "
                                       "last second (core/lanes.py OTHERS_HOLD_S); alone, they take every slot. 1 "
                                       "(the default): no cap; lower trades a backfill's throughput for the others' "
                                       "latency (docs/guides/lanes-and-tenants.md)")
    # On SIGTERM /readyz turns 503 and new requests get 503 before Serve and Ray stop.
    drain_timeout_s: float = Field(30.0, ge=0, description="seconds accepted requests get to finish on SIGTERM")
    # The image limits' defaults are ImageLimits' (models/preprocess.py): one source for both.
    max_body_bytes: int = Field(ImageLimits.max_bytes, ge=1024, description="largest request body")
    max_image_pixels: int = Field(ImageLimits.max_pixels, ge=1, description="most pixels of one image, from its "
                                                                            "header")
    # A 1 x 39,000,000 PNG is 76 KB.
    max_image_side: int = Field(ImageLimits.max_side, ge=1, description="longest side of one image, from its header")
    max_request_pixels: int = Field(160_000_000, ge=1, description="pixels of all images of one request together, "
                                                                   "from their headers, before any is decoded")
    # Header-declared cost; see serve/ingress/decode_queue.py.
    decode_memory_budget_bytes: int = Field(1024 * MiB, ge=MiB, description="bytes the decodes running at once in "
                                                                            "one ingress may hold; past it a decode "
                                                                            "waits its turn")
    max_images_per_request: int = Field(64, ge=1, description="images in one request")
    max_texts_per_request: int = Field(64, ge=1, description="texts (or classify labels) in one request, checked "
                                                             "before tokenizing")
    max_text_chars: int = Field(1000, ge=1, description="characters in one text, checked before tokenizing")
    # `run` sets Serve's own access log from it too (launcher/runner.py); a Serve config sets Serve's in its
    # logging_config.
    access_log: bool = Field(False, description="Ray Serve's access log: one line per request from the proxy and "
                                                "every replica")

    @model_validator(mode="after")
    def _check_ingress(self) -> FrontDoor:
        if isinstance(self.ingress_replicas, int) and self.ingress_replicas < 1:
            raise ValueError("ingress_replicas must be at least 1 (or 'auto')")
        if isinstance(self.ingress_max_ongoing_requests, int) and self.ingress_max_ongoing_requests < 1:
            raise ValueError("ingress_max_ongoing_requests must be at least 1 (or 'auto')")
        if self.ingress_autoscaling is not None and self.ingress_replicas != "auto":
            raise ValueError(f"ingress_replicas: {self.ingress_replicas} and ingress_autoscaling contradict; with "
                             "ingress_autoscaling the count is its min_replicas..max_replicas (leave "
                             "ingress_replicas unset)")
        if self.interactive_ingress and self.ingress_autoscaling is not None:
            raise ValueError("interactive_ingress and ingress_autoscaling contradict: the interactive replica's "
                             "count is one, whatever the others' load; name ingress_replicas instead")
        return self


class ModelList(BaseModel):
    """Several models behind one front door, each on replicas of its own (serve/plan/served_models.py). The
    ingress's: a model's own application (`model_apps`) holds its one entry instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[ModelEntry, ...] = Field(
        (), description="several models in one service: each entry `name` (what a request's `model` names) and "
                        "that model's own settings over the service's, any of the per-model keys (model, weights, "
                        "backend, buckets, replicas, text_replicas, ...); empty: the one model of the per-model "
                        "keys, named by `model`")
    default_model: str | None = Field(None, description="the model that answers a request naming none (default: "
                                                        "the first of models)")
    # Serve gives every deployment of an application one code version, hashed from the application's args
    # (ray/serve/_private/deploy_utils.py get_app_code_version), so a tower inside the front application
    # restarts whenever the set of models changes; in an application of its own it does not.
    model_apps: bool = Field(False, description="several models: each model's towers run in a Serve application "
                                                "of their own, named <this application>-<model name> "
                                                "(siglip_serve.serve.app:build_model_app), and this application "
                                                "holds the ingress alone, so models can be added and removed "
                                                "without restarting the others (docs/operations.md)")

    @model_validator(mode="after")
    def _check_models(self) -> ModelList:
        if self.model_apps and not self.models:
            raise ValueError("model_apps: true needs models: (each model's towers in an application of its own)")
        names = [entry.name for entry in self.models]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"models[{index}].name: {name!r} is named twice")
        return self


class Cluster(BaseModel):
    """How the service's deployments run on the Ray cluster, every model's alike (a model's own application reads
    them too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A backfill's batches fill every encoder replica's queue; an interactive request behind one waits for a whole
    # batch's forward pass. Kept apart, a replica (a NeuronCore on neuron) runs that lane's few requests alone.
    interactive_encoder: bool = Field(False, description="keep one of the image replicas (of each model) for the "
                                                         "interactive lane's requests and send it no others (needs "
                                                         "api_keys_file and at least 2 replicas; not with "
                                                         "autoscaling)")
    # KubeRay submits the Serve config once the head pod is ready, before its workers register: a check
    # against that cluster would refuse what the workers will hold (serve/plan/cluster_fit.py).
    cluster_grows: bool | None = Field(
        None, description="whether Ray nodes join after the application deploys (KubeRay's workers, Ray's "
                          "autoscaler, a later `ray start --address`): what does not fit yet is then deployed "
                          "with a warning, for Serve to place as nodes join, not refused (default: true under "
                          "KubeRay, seen from its RAY_CLUSTER_NAME, and for `siglip-serve run --address`; else "
                          "false)")
    cluster_wait_s: float = Field(
        600.0, ge=0, description="where the cluster grows, how long `replicas: auto` on neuron waits for the "
                                 "neuron_cores to register and stop changing before it counts them (none by "
                                 "then: refused)")
    throughput_optimized: bool | None = Field(None, description="Ray Serve's throughput-optimized mode (gRPC between "
                                              "replicas, user code on the replica's own event loop; "
                                              "docs/capacity.md): true: in every replica; false: Serve's "
                                              "defaults everywhere; default: in the ingress always, in the "
                                              "towers unless the model runs on the host's cores (backend cpu)")


class Observability(BaseModel):
    """What the service says about its requests beside the metrics (the log level is a live setting, the access
    log the front door's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tracing: bool = Field(False, description="OpenTelemetry spans per request stage, exported over OTLP/HTTP to "
                                             "OTEL_EXPORTER_OTLP_ENDPOINT (docs/observability.md)")


class ServiceConfig(LiveSettings, FrontDoorKey, FrontDoor, ModelList, Cluster, Observability, ModelServing,
                    ModelSettings):
    """The service's settings, in groups, each of one scope (serve/plan/model_entry.py PER_MODEL; FRONT_ONLY and
    SERVICE_WIDE below). Field names are the YAML `args:` keys. What a user wrote, validated; what it means is the
    planner's (serve/plan/planner.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _check_serving(self) -> ServiceConfig:
        needs = self.needs_keys
        if problem := keys_problem(self.api_keys_file, self.single_key, needs):
            raise ValueError(problem)
        if self.interactive_encoder and self.autoscaling is not None:
            raise ValueError("interactive_encoder and autoscaling contradict: the kept replica is one, whatever the "
                             "load; name replicas instead")
        if self.device_jpeg_decode and not backend_record(self.backend).device_decode:
            raise ValueError(f"device_jpeg_decode needs backend cuda (nvJPEG), not {self.backend}")
        return self

    @property
    def url_fetch(self) -> FetchSettings:
        """What serve/ingress/url_fetch.py's UrlFetcher takes: the allowlist, the image byte limit, the bounds."""
        return self.fetch_settings(self.max_body_bytes)

    @property
    def needs_keys(self) -> tuple[str, ...]:
        """The settings set that need api_keys_file."""
        return tuple(kept for kept in ("interactive_ingress", "interactive_encoder") if getattr(self, kept))

    @classmethod
    def from_args(cls, args: Mapping[str, Any] | None) -> ServiceConfig:
        """Validate Serve YAML `args:` (or CLI options); raise ConfigError naming every bad key, an entry of
        `models:` by its place and name."""
        try:
            return cls.model_validate(args or {})
        except ValidationError as exc:
            raise ConfigError(f"invalid siglip-serve config: {_described(exc.errors(), args or {})}") from None


def _fields(*groups: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for group in groups for name in group.model_fields)


# Each key's scope is the group that declares it (tests/unit/test_config.py holds the three to a partition of
# ServiceConfig's keys):
# - per model: serve/plan/model_entry.py PER_MODEL, what a models: entry may set;
# - the front's alone: what the ingress alone reads, left out of a model's own application (`model_apps`), so
#   changing it rolls the ingress only (the towers' code version is their application's args' hash);
# - service-wide: what every model's towers read too, the same for all.
FRONT_ONLY: frozenset[str] = _fields(FrontDoor, FrontDoorKey, FrontLive, ModelList)
SERVICE_WIDE: frozenset[str] = _fields(LiveSettings, Cluster, Observability) - _fields(FrontLive)


def entry_label(index: int, name: object) -> str:
    """How a message names the `models:` entry at `index`: `models[1] (new)`, or `models[1]` where its name is no
    name."""
    return f"models[{index}] ({name})" if isinstance(name, str) and NAME.fullmatch(name) else f"models[{index}]"


def _described(errors: list[Any], args: Mapping[str, Any]) -> str:
    """pydantic's errors as one line (core/errors.py describe_validation), each in a `models:` entry named by its
    place and name: `models[1] (new): buckets: ...`."""
    entries = args.get("models") if isinstance(args, Mapping) else None
    parts = []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if len(loc) < 2 or loc[0] != "models" or not isinstance(loc[1], int) or not isinstance(entries, Sequence):
            parts.append(describe_validation([error], "config"))
            continue
        entry = entries[loc[1]] if loc[1] < len(entries) else None
        name = entry.get("name") if isinstance(entry, Mapping) else getattr(entry, "name", None)
        where = entry_label(loc[1], name)
        parts.append(f"{where}: {describe_validation([{**error, 'loc': loc[2:]}])}" if loc[2:] else
                     f"{where}: {error.get('msg')}")
    return "; ".join(parts)
