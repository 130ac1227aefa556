"""`siglip-serve run`'s SIGHUP (systemd's `ExecReload=`): the settings read again, as at start (`--config FILE`,
SIGLIP_<KEY> variables, the flags: launcher/cli.py run_settings), and what changed put in force where it can be.

The live settings (serve/plan/live_settings.py) go to the ingress deployment as its user_config, deployed
again under the same version (serve/app.py `pinned`), which Serve applies to the running replicas by calling
their `reconfigure`: no replica restarts. A change of any other key needs a restart: it is refused, naming the
keys, and the service runs on as it was. The keys file is touched as well, so an edit of it is read again even
where no setting changed (serve/shared/tenants.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from siglip_serve.core.errors import UserError
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.live_settings import live_settings, restart_keys

log = logging.getLogger("siglip_serve")


class Reload:
    """The settings `run` started with (as asked, before its checks filled any default in), read again on each
    SIGHUP."""

    def __init__(self, read: Callable[[], ServiceConfig] | None, asked: ServiceConfig) -> None:
        """`read`: the settings as asked now (None: nothing to read again, as without --config: SIGHUP then only
        touches the keys file)."""
        self._read = read
        self.asked = asked
        self.in_force = live_settings(asked)

    def changed(self) -> dict[str, Any] | None:
        """The ingress's new user_config, or None where nothing is to change: the settings unchanged, unreadable
        or invalid, or changed where a restart is needed (each logged, naming why)."""
        self._touch_keys_file()
        if self._read is None:
            return None
        try:
            new = self._read()
        except UserError as exc:
            log.error("reload refused: %s; the settings in force stay", exc)
            return None
        restart = restart_keys(self.asked, new)
        if restart:
            log.error("reload refused: %s cannot change without a restart (systemctl restart siglip-serve); "
                      "nothing changed", ", ".join(restart))
            return None
        live = live_settings(new)
        if live == self.in_force:
            log.info("reload: no setting changed")
            return None
        log.info("reload: %s", ", ".join(f"{key} {self.in_force[key]!r} -> {live[key]!r}" for key in live
                                          if live[key] != self.in_force[key]))
        return live

    def applied(self, live: dict[str, Any]) -> None:
        self.in_force = live
        logging.getLogger("siglip_serve").setLevel(live["log_level"])

    def _touch_keys_file(self) -> None:
        keys_file = self.in_force.get("api_keys_file")
        if keys_file:
            try:
                os.utime(keys_file)
            except OSError as exc:
                log.warning("reload: cannot touch api_keys_file %s: %s", keys_file, exc.strerror)
