"""The service's one typed config, filled from the Serve YAML `args:` or the CLI, checked at start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, SecretStr, ValidationError, model_validator

from models.preprocess import ImageLimits
from models.cli_args import model_settings_of
from models.settings import ModelSettings

MiB = 1024 * 1024
# The environment variable the ingress reads the API key from when the config names none.
API_KEY_ENV = "SIGLIP_API_KEY"


class ConfigError(ValueError):
    """The config does not validate; the message lists every problem."""


class ServiceConfig(ModelSettings):
    """Model settings plus how the service runs them. Field names are the YAML `args:` keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Encoder replicas. "auto": one per logical NeuronCore the Ray cluster declares.
    replicas: int | Literal["auto"] = 1
    # Logical NeuronCores each encoder replica asks Ray for. None: 1 on the neuron backend, else 0.
    neuron_cores_per_replica: int | None = Field(default=None, ge=0, le=1)
    encoder_num_cpus: float = Field(default=1.0, ge=0)
    ingress_replicas: int = Field(default=1, ge=1)
    ingress_num_cpus: float = Field(default=0.5, ge=0)
    # Threads per ingress replica that decode and resize (Pillow releases the GIL).
    decode_threads: int = Field(default=4, ge=1, le=64)

    batch_wait_timeout_s: float = Field(default=0.005, ge=0, le=10)
    # Encoder calls (each up to the largest bucket's images) each ingress may hold beyond what the
    # replicas run at once; past it a request is answered 503 at once (Ingress._encode).
    max_queued_requests: int = Field(default=256, ge=1)
    # One deadline per request, from the moment the ingress receives it: reading the body,
    # decoding, queueing and encoding all count. Past it the request is answered 504 and its
    # remaining work is dropped.
    request_timeout_s: float = Field(default=30.0, gt=0)
    retry_after_s: int = Field(default=1, ge=1)
    # /readyz answers 200 while at least this many encoder replicas are warm (capped at `replicas`).
    min_ready_replicas: int = Field(default=1, ge=1)
    # `siglip-serve run` on SIGTERM: /readyz turns 503, new requests get 503, and accepted ones get
    # this long to finish before Serve and Ray stop.
    drain_timeout_s: float = Field(default=30.0, ge=0)

    # Decode large JPEGs at a reduced DCT scale (>= 2x the model's input), then resize: a deliberate,
    # documented difference from open_clip (cosine >= 0.9999 kept); false gives its exact pixels.
    fast_jpeg_decode: bool = True
    max_body_bytes: int = Field(default=20 * MiB, ge=1024)
    max_image_pixels: int = Field(default=40_000_000, ge=1)
    # Longest side of one image, from its header (a 1 x 39,000,000 PNG is 76 KB).
    max_image_side: int = Field(default=16384, ge=1)
    # Pixels of all images of one request together, from their headers, before any is decoded.
    max_request_pixels: int = Field(default=160_000_000, ge=1)
    # Bytes the decodes running at once in one ingress may hold (header-declared cost); past it a
    # decode waits its turn (serve/decode_queue.py).
    decode_memory_budget_bytes: int = Field(default=1024 * MiB, ge=MiB)
    max_images_per_request: int = Field(default=64, ge=1)
    # Prefer SIGLIP_API_KEY (environment) or api_key_file: a key in args shows in the Serve config.
    api_key: SecretStr | None = None
    api_key_file: str | None = None
    # The text tower (POST /v1/embeddings with text, /v1/classify) runs in its own replicas with its own
    # batcher, so texts never queue behind images nor images behind texts. None: 1 replica on cpu; 0
    # (text off) on cuda and neuron, where a text replica needs a GPU / NeuronCore of its own (and on
    # neuron an artifact compiled with --text). 0 turns the text routes off (404).
    text_replicas: int | None = Field(default=None, ge=0)
    text_num_cpus: float = Field(default=0.5, ge=0)
    # Texts (or classify labels) in one request, and characters in one text, checked before tokenizing.
    max_texts_per_request: int = Field(default=64, ge=1)
    max_text_chars: int = Field(default=1000, ge=1)
    # Classify prompts (label in template) whose text embeddings each ingress keeps, least recently
    # used out first: a fixed label set is embedded once, not per request. 0: no cache.
    classify_cache_size: int = Field(default=4096, ge=0)
    # Environment variables of every encoder replica (Ray runtime_env), e.g. NEURON_LOGICAL_NC_CONFIG
    # or NEURON_RT_* settings on trn2. Ray still sets NEURON_RT_VISIBLE_CORES per replica itself.
    env_vars: dict[str, str] = Field(default_factory=dict)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Ray Serve's access log, one line per request from the proxy and every replica: opt-in.
    access_log: bool = False

    @model_validator(mode="after")
    def _check_serving(self) -> "ServiceConfig":
        if isinstance(self.replicas, int) and self.replicas < 1:
            raise ValueError("replicas must be at least 1 (or 'auto')")
        if self.replicas == "auto" and self.cores_per_replica == 0:
            raise ValueError("replicas: auto counts logical NeuronCores; it needs neuron_cores_per_replica: 1")
        return self

    @property
    def cores_per_replica(self) -> int:
        if self.neuron_cores_per_replica is not None:
            return self.neuron_cores_per_replica
        return 1 if self.backend in ("neuron", "neuron-native") else 0

    @property
    def text_replica_count(self) -> int:
        if self.text_replicas is not None:
            return self.text_replicas
        return 1 if self.backend == "cpu" else 0

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_bytes=self.max_body_bytes, max_pixels=self.max_image_pixels,
                           max_side=self.max_image_side)

    def resolve_api_key(self, environ: Mapping[str, str]) -> str | None:
        """The key clients must send: `api_key`, else the first line of `api_key_file`, else $SIGLIP_API_KEY."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_file is not None:
            try:
                with open(self.api_key_file, encoding="utf-8") as handle:
                    key = handle.readline().strip()
            except OSError as exc:
                raise ConfigError(f"api_key_file: cannot read {self.api_key_file}: {exc.strerror}") from None
            if not key:
                raise ConfigError(f"api_key_file: {self.api_key_file} is empty")
            return key
        return environ.get(API_KEY_ENV) or None

    def model_settings(self) -> ModelSettings:
        return model_settings_of(self)

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> "ServiceConfig":
        """Validate Serve YAML `args:` (or CLI options); raise ConfigError naming every bad key."""
        try:
            return cls.model_validate(args or {})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"invalid siglip-serve config: {problems}") from None
