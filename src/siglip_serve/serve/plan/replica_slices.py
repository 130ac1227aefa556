"""What each deployment reads beside its counts: its own part of the plan, resolved from the config once by the
planner (serve/plan/planner.py), so that no replica reads the config.

- A tower replica (serve/towers/) is bound with its `TowerPlan` and its model's `TowerRun`.
- The ingress (serve/ingress/) is bound with the service plan, whose ingress part holds `FrontSettings` (what it
  holds once for every model, the live settings among them) and each model's `ModelFront` (what it checks of
  that model's requests and how it calls that model's towers).

Torch-free: the ingress reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from siglip_serve.core.cli import LogLevel
from siglip_serve.core.constants import API_KEY_ENV
from siglip_serve.core.errors import ConfigError
from siglip_serve.models.preprocess import ImageLimits
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.live_settings import FetchSettings, LiveSettings, apply_live


class PlanRecord(BaseModel):
    """A part of the plan: data, checked once, never changed in place."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TowerRun(PlanRecord):
    """What each tower replica of one model runs with beside its TowerPlan."""

    settings: ModelSettings  # the model's, as configured (each replica sets its plan's torch_threads over them)
    batch_wait_timeout_s: float
    env_vars: dict[str, str]  # the operator's, which the backend's own environment is checked against
    log_level: LogLevel
    tracing: bool


class ModelFront(PlanRecord):
    """What the ingress checks of one model's requests, and how it calls that model's towers."""

    weights: str  # where the weights come from (ModelSettings.weights_source): /v1/models and the cache's scope
    buckets: tuple[int, ...]
    image_limits: ImageLimits
    max_request_pixels: int
    max_images_per_request: int
    max_texts_per_request: int
    max_text_chars: int
    allow_dimension_truncation: bool
    fast_jpeg_decode: bool
    device_jpeg_decode: bool
    decode_threads: int
    decode_memory_budget_bytes: int
    text_off_reason: str | None  # why its text tower is off, where the start turned it off
    model_on_host_cores: bool
    tower_calls_by_grpc: bool


class FrontDoorKey(BaseModel):
    """The one API key of a service without tenants (`api_keys_file`, a live setting, holds several): fields of the
    config (serve/plan/config.py ServiceConfig) and of the ingress's FrontSettings alike."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A key in args shows in the Serve config; `siglip-serve run` refuses it on its command line.
    api_key: SecretStr | None = Field(None, description="require Authorization: Bearer KEY (shows in the Serve "
                                                        f"config: prefer api_key_file or the {API_KEY_ENV} "
                                                        "environment variable; not on run's command line)")
    api_key_file: str | None = Field(None, description="require the key on this file's first line")

    @property
    def single_key(self) -> bool:
        return self.api_key is not None or self.api_key_file is not None

    def key_to_send(self, api_keys_file: str | None, environ: Mapping[str, str]) -> str | None:
        """The key clients must send: `api_key`, else the first line of `api_key_file`, else $SIGLIP_API_KEY (none
        with `api_keys_file`: serve/shared/tenants.py has the keys)."""
        if api_keys_file is not None:
            return None
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


class FrontSettings(FrontDoorKey, PlanRecord):
    """What an ingress replica holds once for every model: the live settings as the application's args give them,
    and what its front door reads beside them."""

    live: LiveSettings
    max_body_bytes: int
    needs_keys: tuple[str, ...] = ()  # the settings set that need api_keys_file (ServiceConfig.needs_keys)
    tracing: bool = False
    access_log: bool = False  # a line per request naming its tenant and lane, beside Serve's own

    @property
    def url_fetch(self) -> FetchSettings:
        return self.live.fetch_settings(self.max_body_bytes)

    def with_live(self, user_config: Any) -> FrontSettings:
        """These settings with a deployment's user_config over the live ones (serve/plan/live_settings.py
        apply_live): ConfigError naming every key that is not live or not valid."""
        live = apply_live(self.live, user_config, self.single_key, self.needs_keys)
        return self if live is self.live else self.model_copy(update={"live": live})

    def resolve_api_key(self, environ: Mapping[str, str]) -> str | None:
        return self.key_to_send(self.live.api_keys_file, environ)
