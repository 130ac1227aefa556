"""The settings an ingress replica changes in place, without a restart: Serve's `user_config` of the ingress
deployment, applied by its `reconfigure()` (serve/ingress/ingress_deployment.py).

Serve's code version of every deployment of an application is a hash of the application's `args`
(ray/serve/_private/deploy_utils.py get_app_code_version), and a new code version restarts every replica
(ray/serve/_private/version.py DeploymentVersion.requires_actor_restart). A deployment's `user_config` is not
in it: a change there alone is applied to the running replicas by calling their `reconfigure`
(DeploymentVersion.requires_actor_reconfigure; ray/serve/_private/replica.py, ReplicaBase.reconfigure). So
the settings below travel there, as a mapping of config keys over the application's args; the rest stay in
the args and need a restart.

The user_config is read over the args, never over the previous user_config: a key left out of it is the
args' value again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from siglip_serve.core.errors import describe_validation
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig

# What an ingress replica holds once for every model (its front door and keys, its cache, its URL fetcher, its
# log level), so a new value is swapped in whole. The other limits are held by the parts built per model at
# start (image checks, batchers, tower links), which a restart rebuilds.
LIVE_KEYS = ("max_queued_requests", "request_timeout_s", "retry_after_s", "api_keys_file", "log_level",
             "embedding_cache_mib", "url_fetch_allowlist", "url_fetch_concurrency", "url_fetch_timeout_s")
# The name the ingress deployment has in every application (serve/plan/planner.py `_ingress`): what a Serve
# config's `deployments:` entry names to set its user_config.
INGRESS_DEPLOYMENT = "Ingress"


def live_settings(config: ServiceConfig) -> dict[str, Any]:
    """The live keys' values of `config`, as the ingress deployment's user_config (JSON's types: a Serve config
    file carries it)."""
    return config.model_dump(mode="json", include=set(LIVE_KEYS))


def apply_live(config: ServiceConfig, user_config: Any) -> ServiceConfig:
    """`config` (the application's args) with `user_config`'s live keys over it, validated as a whole; ConfigError
    naming every key that is not live or not valid. None or {}: `config` itself."""
    if user_config is None:
        return config
    if not isinstance(user_config, Mapping):
        raise ConfigError(f"the ingress's user_config is a mapping of {', '.join(LIVE_KEYS)}, not "
                          f"{type(user_config).__name__}")
    restart = sorted(set(user_config) - set(LIVE_KEYS))
    if restart:
        raise ConfigError(f"user_config: {', '.join(restart)} cannot change in place (live: {', '.join(LIVE_KEYS)}); "
                          "set them in the application's args, which restarts its replicas")
    try:
        return ServiceConfig.model_validate({**dict(config), **user_config})
    except ValidationError as exc:
        raise ConfigError(f"invalid user_config: {describe_validation(exc.errors(), 'user_config')}") from None


def restart_keys(old: ServiceConfig, new: ServiceConfig) -> list[str]:
    """The keys whose change from `old` to `new` needs a restart: every changed key that is not live."""
    return sorted(key for key in ServiceConfig.model_fields
                  if key not in LIVE_KEYS and getattr(old, key) != getattr(new, key))
