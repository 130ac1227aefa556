"""`siglip-serve run`'s SIGHUP (systemd's `ExecReload=`): the settings read again, as at start (`--config FILE`,
SIGLIP_<KEY> variables, the flags: launcher/cli.py run_settings), and what changed put in force where it can be.

The live settings (serve/plan/live_settings.py) go to the ingress deployment as its user_config, deployed
again under the same version (serve/app.py `pinned`), which Serve applies to the running replicas by calling
their `reconfigure`: no replica restarts. Where the config lists several models, `models:` and `default_model`
may change too: the plan is made again and each deployment keeps its version while its own slice of the plan
is the same, so an added model's towers start, a removed one's stop, and the other models' keep running (the
ingress is replaced, the new replica up before the old one goes). A change of any other key needs a restart:
it is refused, naming the keys, and the service runs on as it was. The keys file is touched as well, so an
edit of it is read again even where no setting changed (serve/shared/tenants.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from siglip_serve.core.errors import UserError
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.live_settings import live_settings, restart_keys

log = logging.getLogger("siglip_serve")


# What a reload may change beside the live settings, where the config lists several models (`models:`).
MODEL_KEYS = ("models", "default_model")


@dataclass(frozen=True)
class Change:
    """What a SIGHUP changes: the ingress's user_config, and the settings as asked now; `replan`: the models
    changed, those settings passed the start's checks and are planned again (False: the plan stays), with
    `text_off`, what the checks found of the default model's text tower (launcher/cli.py `checked`)."""

    live: dict[str, Any]
    asked: ServiceConfig
    replan: bool = False
    text_off: str | None = None


class Reload:
    """The settings `run` started with (as asked, before its checks filled any default in), read again on each
    SIGHUP."""

    def __init__(self, read: Callable[[], ServiceConfig] | None, asked: ServiceConfig,
                 check: Callable[[ServiceConfig], str | None] = lambda config: None) -> None:
        """`read`: the settings as asked now (None: nothing to read again, as without --config: SIGHUP then only
        touches the keys file); `check`: what `run` checks of the settings before it starts (launcher/cli.py
        `checked`), run again on changed models, raising UserError, returning why the default model's text tower
        is off (or None)."""
        self._read = read
        self._check = check
        self.asked = asked
        self._in_force: dict[str, Any] | None = None

    @property
    def in_force(self) -> dict[str, Any]:
        """The live settings in force: the start's, until a reload puts others in force."""
        if self._in_force is None:
            self._in_force = live_settings(self.asked)
        return self._in_force

    def changed(self) -> Change | None:
        """What to put in force, or None where nothing is to change: the settings unchanged, unreadable or
        invalid, changed where a restart is needed, or new models that fail their checks (each logged, naming
        why)."""
        self._touch_keys_file()
        if self._read is None:
            return None
        try:
            new = self._read()
        except UserError as exc:
            log.error("reload refused: %s; the settings in force stay", exc)
            return None
        restart = restart_keys(self.asked, new)
        models = [key for key in restart if key in MODEL_KEYS]
        if self.asked.models and new.models:
            restart = [key for key in restart if key not in MODEL_KEYS]
        if restart:
            log.error("reload refused: %s cannot change without a restart (systemctl restart siglip-serve); "
                      "nothing changed", ", ".join(restart))
            return None
        live = live_settings(new)
        if live == self.in_force and not models:
            log.info("reload: no setting changed")
            return None
        text_off = None
        if models:
            try:
                text_off = self._check(new)
            except UserError as exc:
                log.error("reload refused: %s; nothing changed", exc)
                return None
            log.info("reload: models %s -> %s", _names(self.asked), _names(new))
        if live != self.in_force:
            log.info("reload: %s", ", ".join(f"{key} {self.in_force[key]!r} -> {live[key]!r}" for key in live
                                              if live[key] != self.in_force[key]))
        return Change(live, new, replan=bool(models), text_off=text_off)

    def applied(self, change: Change) -> None:
        self._in_force, self.asked = change.live, change.asked
        logging.getLogger("siglip_serve").setLevel(change.live["log_level"])

    def _touch_keys_file(self) -> None:
        keys_file = self.in_force.get("api_keys_file")
        if keys_file:
            try:
                os.utime(keys_file)
            except OSError as exc:
                log.warning("reload: cannot touch api_keys_file %s: %s", keys_file, exc.strerror)


def _names(config: ServiceConfig) -> str:
    names = [entry.name for entry in config.models]
    default = config.default_model or (names[0] if names else config.model)
    return ", ".join(f"{name} (default)" if name == default else name for name in names)
