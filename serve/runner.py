"""`siglip-serve run`: start a local Ray, deploy the application, wait for a signal, tear down.

SIGTERM or Ctrl-C shuts Serve and the Ray processes this command started down, so nothing is
left behind. With `--address` it joins an existing cluster instead and leaves that cluster up.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
from typing import Any

from serve.config import ServiceConfig

log = logging.getLogger("siglip_serve")

APP_NAME = "siglip"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def preflight_weights(config: ServiceConfig) -> None:
    """Fetch pretrained weights once, here, before any replica starts; fail with one clear message."""
    if config.uses_random_weights or config.checkpoint is not None:
        return
    import open_clip

    from models.loading import ModelLoadError, _register_tiny

    _register_tiny()
    cfg = open_clip.get_pretrained_cfg(config.model, config.pretrained or "")
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(config.model)
        raise ModelLoadError(f"no pretrained tag {config.pretrained!r} for {config.model}; known tags: {tags}")
    log.info("fetching pretrained weights %s/%s (cached after the first time)", config.model, config.pretrained)
    try:
        open_clip.download_pretrained(cfg)
    except Exception as exc:  # noqa: BLE001 - hub clients raise many kinds; all mean "no weights"
        raise ModelLoadError(
            f"could not download pretrained weights {config.pretrained!r} for {config.model} "
            f"({type(exc).__name__}: no network?). Either pass --checkpoint PATH (a state dict saved "
            "with torch.save(model.state_dict())) or --random-weights (embeddings then mean nothing)."
        ) from None


def preflight_tokenizer(config: ServiceConfig) -> None:
    """Load the text tower's tokenizer once, here, so a missing one fails in a second with the fix,
    not as a text replica that never starts. Nothing to do with text off."""
    if config.text_replica_count == 0:
        return
    import open_clip

    from models.loading import _register_tiny
    from models.text import load_tokenizer

    _register_tiny()
    cfg = open_clip.get_model_config(config.model) or {}
    load_tokenizer(config.model_settings(), cfg.get("text_cfg", {}))


def ray_resources(config: ServiceConfig, replicas: int | None) -> dict[str, Any]:
    """CPUs to declare so every replica fits even on a 2-core machine (Ray's CPUs are logical)."""
    count = replicas if replicas is not None else 1
    needed = (count * config.encoder_num_cpus + config.ingress_replicas * config.ingress_num_cpus
              + config.text_replica_count * config.text_num_cpus)
    return {"num_cpus": max(os.cpu_count() or 1, math.ceil(needed))}


def run_service(config: ServiceConfig, host: str, port: int, metrics_port: int | None,
                address: str | None, neuron_cores: int | None) -> int:
    import ray
    from ray import serve

    from serve.app import build

    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    started_ray = address is None
    init_args: dict[str, Any] = {"namespace": "siglip-serve", "log_to_driver": True}
    if started_ray:
        replicas = config.replicas if isinstance(config.replicas, int) else None
        init_args.update(ray_resources(config, replicas))
        init_args["_node_ip_address"] = "127.0.0.1"
        if neuron_cores:
            init_args["resources"] = {"neuron_cores": neuron_cores}
        if metrics_port:
            init_args["_metrics_export_port"] = metrics_port
    else:
        init_args["address"] = address
    log.info("starting Ray (%s)", "local" if started_ray else address)
    ray.init(**init_args)
    # After ray.init: Ray's core worker installs a SIGTERM handler that aborts the process.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        serve.start(http_options={"host": host, "port": port})
        log.info("deploying %s on %s: loading and warming up the model in every replica...",
                 config.model, config.backend)
        began = time.monotonic()
        serve.run(build(config), name=APP_NAME, route_prefix="/", blocking=False)
        log.info("ready in %.1f s: http://%s:%d (POST /v1/embeddings, /v1/embeddings/image)",
                 time.monotonic() - began, host, port)
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        log.info("stopping Serve and Ray")
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
