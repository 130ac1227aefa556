"""The service's one typed config, filled from the Serve YAML `args:` or the CLI, checked at start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from siglip_serve.core.backends import backend_record
from siglip_serve.core.constants import API_KEY_ENV as API_KEY_ENV
from siglip_serve.core.errors import ConfigError as ConfigError
from siglip_serve.core.errors import describe_validation
from siglip_serve.models.preprocess import ImageLimits
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.live_settings import FetchSettings as FetchSettings
from siglip_serve.serve.plan.live_settings import LiveSettings, MiB, keys_problem
from siglip_serve.serve.plan.replica_slices import FrontDoorKey
from siglip_serve.serve.plan.scaling import Autoscaling as Autoscaling
from siglip_serve.serve.plan.scaling import IngressAutoscaling as IngressAutoscaling


class Observability(BaseModel):
    """What the service says about its requests beside the metrics (the log level is a live setting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    access_log: bool = Field(False, description="Ray Serve's access log: one line per request from the proxy and "
                                               "every replica")
    tracing: bool = Field(False, description="OpenTelemetry spans per request stage, exported over OTLP/HTTP to "
                                             "OTEL_EXPORTER_OTLP_ENDPOINT (docs/observability.md)")


class ServiceConfig(LiveSettings, FrontDoorKey, Observability, ModelSettings):
    """Model settings, the live ones (serve/plan/live_settings.py) and how the service runs them. Field names are
    the YAML `args:` keys."""

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
    # A backfill's batches fill every encoder replica's queue; an interactive request behind one waits for a whole
    # batch's forward pass. Kept apart, a replica (a NeuronCore on neuron) runs that lane's few requests alone.
    interactive_encoder: bool = Field(False, description="keep one of the image replicas (of each model) for the "
                                                         "interactive lane's requests and send it no others (needs "
                                                         "api_keys_file and at least 2 replicas; not with "
                                                         "autoscaling)")
    # On neuron a replica is one logical NeuronCore, so a node's count is fixed: scaling adds replicas
    # that stay pending until Ray's autoscaler adds a node (deploy/kuberay/rayservice.yaml).
    autoscaling: Autoscaling | None = Field(None, description="scale the encoder replicas with load between "
                                            "min_replicas and max_replicas (replicas must be unset)")
    ingress_autoscaling: IngressAutoscaling | None = Field(None, description="scale the ingress replicas with "
                                                           "their CPU between min_replicas and max_replicas "
                                                           "(ingress_replicas must be unset)")
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
    ingress_num_cpus: float = Field(0.5, ge=0, description="CPUs each ingress replica asks Ray for")
    # Pillow releases the GIL, so decode threads run in parallel.
    decode_threads: int = Field(4, ge=1, le=64, description="threads per ingress replica that decode and resize")

    batch_wait_timeout_s: float = Field(0.005, ge=0, le=10,
                                        description="seconds the batcher waits to fill a batch")
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
    min_ready_replicas: int = Field(1, ge=1, description="/readyz answers 200 while at least this many encoder "
                                                         "replicas are warm (capped at replicas)")
    # On SIGTERM /readyz turns 503 and new requests get 503 before Serve and Ray stop.
    drain_timeout_s: float = Field(30.0, ge=0, description="seconds accepted requests get to finish on SIGTERM")

    # A deliberate, documented difference from open_clip (cosine >= 0.9999 kept).
    fast_jpeg_decode: bool = Field(True, description="decode large JPEGs at a reduced DCT scale (>= 2x the model's "
                                                     "input), then resize; false gives open_clip's exact pixels")
    # nvJPEG on the GPU instead of the ingress's cores (models/device_decode.py); cpu allows it for tests.
    device_jpeg_decode: bool = Field(False, description="cuda: decode 8-bit RGB/grey JPEGs in the encoder replica on "
                                                        "the GPU (nvJPEG); every limit is still checked in the ingress")
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
    # The text tower (POST /v1/embeddings with text, /v1/classify) runs in its own replicas with its own
    # batcher, so texts never queue behind images nor images behind texts. A text replica on cuda or
    # neuron needs a GPU / NeuronCore of its own (and on neuron an artifact compiled with --text).
    text_replicas: int | None = Field(None, ge=0, description="text tower replicas; 0 turns the text routes off "
                                                              "(default: on cpu 1 when the tokenizer is found - "
                                                              "local, or the hub answers at start - else 0; 0 on "
                                                              "cuda and neuron)")
    text_num_cpus: float = Field(0.5, ge=0, description="CPUs each text replica asks Ray for")
    max_texts_per_request: int = Field(64, ge=1, description="texts (or classify labels) in one request, checked "
                                                             "before tokenizing")
    max_text_chars: int = Field(1000, ge=1, description="characters in one text, checked before tokenizing")
    # SigLIP is not trained for truncation (Matryoshka): a shorter vector loses accuracy, so `dimensions`
    # below the model's size is refused unless the operator accepts that here.
    allow_dimension_truncation: bool = Field(False, description="honour `dimensions` below the model's size by "
                                             "truncating and re-normalising (lossy); off: such requests get 400")
    # Ray still sets NEURON_RT_VISIBLE_CORES per replica itself.
    env_vars: dict[str, str] = Field(default_factory=dict, description="environment variables of every encoder "
                                                                       "replica (Ray runtime_env), e.g. "
                                                                       "NEURON_LOGICAL_NC_CONFIG on trn2")
    throughput_optimized: bool | None = Field(None, description="Ray Serve's throughput-optimized mode (gRPC between "
                                              "replicas, user code on the replica's own event loop; "
                                              "docs/capacity.md): true: in every replica; false: Serve's "
                                              "defaults everywhere; default: in the ingress always, in the "
                                              "towers unless the model runs on the host's cores (backend cpu)")
    # Several models behind one front door, each on replicas of its own (serve/plan/served_models.py).
    models: tuple[dict[str, Any], ...] = Field(
        (), description="several models in one service: each entry `name` (what a request's `model` names) and "
                        "that model's own settings over the ones above (model, weights, backend, buckets, "
                        "replicas, text_replicas, ...); empty: the one model above, named by `model`")
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
    def _check_serving(self) -> ServiceConfig:
        if isinstance(self.replicas, int) and self.replicas < 1:
            raise ValueError("replicas must be at least 1 (or 'auto')")
        if isinstance(self.ingress_replicas, int) and self.ingress_replicas < 1:
            raise ValueError("ingress_replicas must be at least 1 (or 'auto')")
        if isinstance(self.ingress_max_ongoing_requests, int) and self.ingress_max_ongoing_requests < 1:
            raise ValueError("ingress_max_ongoing_requests must be at least 1 (or 'auto')")
        if self.autoscaling is not None and self.replicas is not None:
            raise ValueError(f"replicas: {self.replicas} and autoscaling contradict; with autoscaling the encoder "
                             "count is autoscaling.min_replicas..max_replicas (leave replicas unset)")
        if self.ingress_autoscaling is not None and self.ingress_replicas != "auto":
            raise ValueError(f"ingress_replicas: {self.ingress_replicas} and ingress_autoscaling contradict; with "
                             "ingress_autoscaling the count is its min_replicas..max_replicas (leave "
                             "ingress_replicas unset)")
        if problem := keys_problem(self.api_keys_file, self.single_key, self.needs_keys):
            raise ValueError(problem)
        if self.interactive_ingress and self.ingress_autoscaling is not None:
            raise ValueError("interactive_ingress and ingress_autoscaling contradict: the interactive replica's "
                             "count is one, whatever the others' load; name ingress_replicas instead")
        if self.interactive_encoder and self.autoscaling is not None:
            raise ValueError("interactive_encoder and autoscaling contradict: the kept replica is one, whatever the "
                             "load; name replicas instead")
        if self.model_apps and not self.models:
            raise ValueError("model_apps: true needs models: (each model's towers in an application of its own)")
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

    def resolve_api_key(self, environ: Mapping[str, str]) -> str | None:
        """The key clients must send (serve/plan/replica_slices.py FrontDoorKey.key_to_send)."""
        return self.key_to_send(self.api_keys_file, environ)

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> ServiceConfig:
        """Validate Serve YAML `args:` (or CLI options); raise ConfigError naming every bad key."""
        try:
            return cls.model_validate(args or {})
        except ValidationError as exc:
            raise ConfigError(f"invalid siglip-serve config: {describe_validation(exc.errors(), 'config')}") from None
