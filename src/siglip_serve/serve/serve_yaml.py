"""The service in a Serve config file (the YAML `serve deploy` takes): its application's `args:`, for commands
that act as the service does without running it (`siglip-serve embed --service-config`). Not imported by the
application itself, which Serve hands its args directly."""

from __future__ import annotations

from typing import Any

from siglip_serve.serve.plan.config import ConfigError

# The application builder of the service, as a Serve config names it (import_path).
BUILDER = "siglip_serve.serve.app:build_app"


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
