"""Logging inside Serve replicas: Ray configures its own `ray.serve` logger, not ours."""

from __future__ import annotations

import logging

from siglip_serve.core.cli import LOG_FORMAT


def configure_replica_logging(level: str) -> None:
    """Send `siglip_serve.*` records (every module's `__name__` logger too) to stderr (Ray captures it per replica)."""
    logger = logging.getLogger("siglip_serve")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False
