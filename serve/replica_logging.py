"""Logging inside Serve replicas: Ray configures its own `ray.serve` logger, not ours."""

from __future__ import annotations

import logging

from models.cli_args import LOG_FORMAT


def configure_replica_logging(level: str) -> None:
    """Send `siglip_serve.*` and `models.*` records to stderr (Ray captures it per replica)."""
    for name in ("siglip_serve", "models"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            logger.addHandler(handler)
            logger.propagate = False
