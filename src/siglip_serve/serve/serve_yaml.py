"""The service in a Serve config file (the YAML `serve deploy` takes): its application's `args:`, for commands
that act as the service does without running it (`siglip-serve embed --service-config`). Not imported by the
application itself, which Serve hands its args directly."""

from __future__ import annotations

from typing import Any

from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.served_models import model_app_args, model_app_name

# The application builder of the service, as a Serve config names it (import_path).
BUILDER = "siglip_serve.serve.app:build_app"
# The builder of one model's own application under `model_apps`.
MODEL_BUILDER = "siglip_serve.serve.app:build_model_app"


def model_apps_config(name: str, route_prefix: str, args: dict[str, Any]) -> dict[str, Any]:
    """The Serve config (`serve deploy`'s YAML, as a mapping) of the service `args` with each model in an
    application of its own: the front application `name` at `route_prefix` (the ingress, every arg, `model_apps:
    true`), then per model `name-MODEL` (serve/plan/served_models.py `model_app_name`), not on HTTP, whose args
    are that model's alone (`model_app_args`)."""
    front = {**args, "model_apps": True}
    config = ServiceConfig.from_args(front)  # refused here, naming the key, rather than by Serve's builder
    apps: list[dict[str, Any]] = [{"name": name, "route_prefix": route_prefix, "import_path": BUILDER, "args": front}]
    for entry in config.models:
        apps.append({"name": model_app_name(name, entry.name), "route_prefix": None, "import_path": MODEL_BUILDER,
                     "args": model_app_args(front, entry.name)})
    return {"applications": apps}


def service_args(document: Any, app: str | None = None) -> dict[str, Any]:
    """The service's `args:` in a Serve config file (`serve deploy`'s YAML): the application named `app`, else
    the one its builder builds (BUILDER); a mapping without `applications:` is taken as the args themselves."""
    if not isinstance(document, dict):
        raise ConfigError("a Serve config (applications: [...]) or a mapping of the service's args, please")
    if "applications" not in document:
        return document
    apps = [entry for entry in document["applications"] or [] if isinstance(entry, dict)]
    if app is not None:
        found = [entry for entry in apps if entry.get("name") == app]
        what = f"no application named {app!r}"
    else:
        found = [entry for entry in apps if entry.get("import_path") == BUILDER]
        what = f"{len(found)} applications built by {BUILDER}; name one"
    if len(found) != 1:
        raise ConfigError(f"{what} (the config's: {', '.join(repr(entry.get('name')) for entry in apps)})")
    return dict(found[0].get("args") or {})
