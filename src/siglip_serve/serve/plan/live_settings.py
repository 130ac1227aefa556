"""The settings an ingress replica changes in place, without a restart: Serve's `user_config` of the ingress
deployment, applied by its `reconfigure()` (serve/ingress/ingress_deployment.py).

Serve's code version of every deployment of an application is a hash of the application's `args`
(ray/serve/_private/deploy_utils.py get_app_code_version), and a new code version restarts every replica
(ray/serve/_private/version.py DeploymentVersion.requires_actor_restart). A deployment's `user_config` is not
in it: a change there alone is applied to the running replicas by calling their `reconfigure`
(DeploymentVersion.requires_actor_reconfigure; ray/serve/_private/replica.py, ReplicaBase.reconfigure). So
the settings below travel there, as a mapping of config keys over the application's args; the rest stay in
the args and need a restart.

`LiveSettings` is their one typed definition (`FrontLive` the part the ingress alone reads): ServiceConfig takes
its fields from it, and the ingress's part of the plan holds one (serve/plan/replica_slices.py FrontSettings).
The user_config is read over the args, never over the previous user_config: a key left out of it is the args'
value again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from siglip_serve.core.cli import LogLevel
from siglip_serve.core.errors import ConfigError, describe_validation
from siglip_serve.serve.plan.url_allowlist import Allowlist

MiB = 1024 * 1024
# The name the ingress deployment has in every application (serve/plan/planner.py `_ingress`): what a Serve
# config's `deployments:` entry names to set its user_config.
INGRESS_DEPLOYMENT = "Ingress"


@dataclass(frozen=True)
class FetchSettings:
    """What serve/ingress/url_fetch.py's UrlFetcher needs, picklable (bulk passes it to its decode tasks)."""

    allowlist: tuple[str, ...] = ()
    max_bytes: int = 20 * 1024 * 1024
    concurrency: int = 16
    timeout_s: float = 10.0


class FrontLive(BaseModel):
    """The live settings the ingress alone reads: its queue, its 503s' Retry-After, its cache and its URL fetcher."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Waiting costs a connection, not memory: under HAProxy they wait in HAProxy's queue (docs/operations.md).
    max_queued_requests: int = Field(256, ge=1, description="requests that may wait for each ingress replica "
                                                            "beyond those it works on; past it: 503 at once")
    retry_after_s: int = Field(1, ge=1, description="Retry-After seconds of a 503")
    # Per ingress replica, in its memory; hits answer without decoding or a forward pass
    # (serve/ingress/embedding_cache.py).
    embedding_cache_mib: float = Field(0, ge=0, description="MiB of embeddings each ingress replica keeps, keyed by "
                                                            "the bytes (or text) sent and the model, weights and "
                                                            "preprocessing, least recently used out first; 0: no "
                                                            "cache")
    # Off by default: a URL names a place the server goes to, on its own network (serve/ingress/url_fetch.py).
    url_fetch_allowlist: tuple[str, ...] = Field((), description="image URLs are fetched only from these: host "
                                                 "names, *.domains (every name under one), CIDRs (which also allow "
                                                 "internal addresses, e.g. 10.0.0.0/8) or * (any name whose addresses "
                                                 "are public); empty: every URL is refused (400 url_not_allowed)")
    url_fetch_concurrency: int = Field(16, ge=1, le=1024, description="URL fetches each ingress replica runs at "
                                                                      "once; more wait, taking turns round-robin "
                                                                      "across requests, within their deadline; a "
                                                                      "quarter of them only start a request's first "
                                                                      "URL")
    url_fetch_timeout_s: float = Field(10.0, gt=0, description="seconds one URL's fetch may take once its turn "
                                                               "comes (resolving, connecting, every redirect, the "
                                                               "whole body), within the request's deadline, which "
                                                               "alone bounds the wait for a turn; past either: 504 "
                                                               "url_timeout")

    @field_validator("url_fetch_allowlist", mode="before")
    @classmethod
    def _split_allowlist(cls, value: object) -> object:
        if isinstance(value, str):  # `--set url_fetch_allowlist=a.example.com,10.0.0.0/8`
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("url_fetch_allowlist")
    @classmethod
    def _parse_allowlist(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        Allowlist.parse(value)  # raises ValueError naming the entry that is none of the forms
        return value

    @property
    def embedding_cache_bytes(self) -> int:
        return int(self.embedding_cache_mib * MiB)

    def fetch_settings(self, max_bytes: int) -> FetchSettings:
        """What serve/ingress/url_fetch.py's UrlFetcher takes: the allowlist, the bounds, `max_bytes` an image's."""
        return FetchSettings(allowlist=self.url_fetch_allowlist, max_bytes=max_bytes,
                             concurrency=self.url_fetch_concurrency, timeout_s=self.url_fetch_timeout_s)


class LiveSettings(FrontLive):
    """What an ingress replica holds once for every model (its front door and keys, its cache, its URL fetcher,
    its log level), so a new value is swapped in whole. The other limits are held by the parts built per model at
    start (image checks, batchers, tower links), which a restart rebuilds. Beside FrontLive's, the live settings a
    model's towers read too, at their start: the deadline (their drain on scale-in), the log level, and the keys
    file (which `interactive_encoder` needs)."""

    # Time queued in HAProxy before the ingress, reading the body, decoding, queueing and encoding all
    # count; past it the remaining work is dropped.
    request_timeout_s: float = Field(30.0, gt=0, description="one deadline per request from the moment the front end "
                                                             "has its headers; past it: 504")
    # Several keys, each a tenant with its lane, weight and rate (serve/shared/tenants.py); read again when it changes.
    api_keys_file: str | None = Field(None, description="a TOML file of API keys, each a tenant (name, key or "
                                                        "sha256, lane, weight, rate_per_s): docs/http-api.md")
    log_level: LogLevel = Field("INFO", description="level of the service's own log lines")

    @model_validator(mode="before")
    @classmethod
    def _no_classify_cache(cls, data: Any) -> Any:
        # Said plainly, not as pydantic's "extra inputs are not permitted": classify's labels have no cache of
        # their own.
        if isinstance(data, Mapping) and "classify_cache_size" in data:
            raise ValueError("classify_cache_size is not a setting: classify's labels are kept in the embedding "
                             "cache with every other text and image; size it with embedding_cache_mib")
        return data


LIVE_KEYS: tuple[str, ...] = tuple(LiveSettings.model_fields)


def keys_problem(api_keys_file: str | None, single_key: bool, needs_keys: Sequence[str]) -> str | None:
    """What is wrong with `api_keys_file` beside the rest of the config, or None: the single key (`single_key`:
    api_key or api_key_file set) given too, or none given where the settings `needs_keys` name need one."""
    if api_keys_file is not None and single_key:
        return "give api_keys_file or the single key (api_key, api_key_file), not both"
    if api_keys_file is None and needs_keys:
        return (f"{needs_keys[0]} needs api_keys_file: only a key's default lane puts a request in the "
                "interactive lane (a request can move itself down, never up)")
    return None


def live_settings(config: LiveSettings) -> dict[str, Any]:
    """The live keys' values of `config` (a ServiceConfig), as the ingress deployment's user_config (JSON's types:
    a Serve config file carries it)."""
    return config.model_dump(mode="json", include=set(LIVE_KEYS))


def apply_live(start: LiveSettings, user_config: Any, single_key: bool = False,
               needs_keys: Sequence[str] = ()) -> LiveSettings:
    """`start` (the application's args') with `user_config`'s keys over it, validated, with the keys file checked
    against the rest of the config (`keys_problem`); ConfigError naming every key that is not live or not valid.
    None or {}: `start` itself."""
    if user_config is None:
        return start
    if not isinstance(user_config, Mapping):
        raise ConfigError(f"the ingress's user_config is a mapping of {', '.join(LIVE_KEYS)}, not "
                          f"{type(user_config).__name__}")
    restart = sorted(set(user_config) - set(LIVE_KEYS))
    if restart:
        raise ConfigError(f"user_config: {', '.join(restart)} cannot change in place (live: {', '.join(LIVE_KEYS)}); "
                          "set them in the application's args, which restarts its replicas")
    if not user_config:
        return start
    try:
        live = LiveSettings.model_validate({**live_settings(start), **user_config})
    except ValidationError as exc:
        raise ConfigError(f"invalid user_config: {describe_validation(exc.errors(), 'user_config')}") from None
    if problem := keys_problem(live.api_keys_file, single_key, needs_keys):
        raise ConfigError(f"invalid user_config: {problem}")
    return live


def restart_keys(old: BaseModel, new: BaseModel) -> list[str]:
    """The keys whose change from `old` to `new` (two ServiceConfigs) needs a restart: every changed key that is
    not live."""
    return sorted(key for key in type(old).model_fields
                  if key not in LIVE_KEYS and getattr(old, key) != getattr(new, key))
