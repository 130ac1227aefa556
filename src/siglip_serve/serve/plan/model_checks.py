"""Checks of the model's files, each failing in one line: the weights (fetched once, or refused at once
when there is no hub) and the text tower's tokenizer (which decides whether text is on by default: what it
finds is an input of the plan, never a change of the config).

They read the machine they run on, so they run where the model is used: `siglip-serve run` calls both
before it starts its local Ray (its replicas run on this machine), and every replica and bulk actor
checks its weights as it starts (serve/towers/replica_start.py). A Serve YAML's builder runs on the head,
which may see neither the cache nor the hub, and calls neither (serve/app.py)."""

from __future__ import annotations

import logging

from siglip_serve.core.backends import backend_record
from siglip_serve.models.settings import ModelSettings
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.plan.policy import policy_of

log = logging.getLogger("siglip_serve")


def preflight_weights(config: ModelSettings) -> None:
    """Fetch pretrained weights once, here, before any replica starts; fail with one clear message.

    Not cached and no hub (HF_HUB_OFFLINE, or no connect within seconds): fail at once, before the
    hub client's minute of retries. A hub model's repository files likewise (models/hub_repo.py): its
    configuration always, its weights where they are read."""
    if config.source.on_hub and backend_record(config.backend).runs_model:
        from siglip_serve.models.hub_repo import hub_model

        hub_model(config.source, weights=config.needs_weights)  # ModelLoadError: one line naming what is missing
        return
    if not config.needs_weights:
        return
    from siglip_serve.models.loading import ModelLoadError, open_clip_module  # torch: after the backend's env

    if config.checkpoint is not None:
        if not config.checkpoint.is_file():
            raise ModelLoadError(f"checkpoint file not found: {config.checkpoint}")
        return
    from siglip_serve.models.hub import OFFLINE_HINT, HubUnreachable, check_weights_reachable

    open_clip = open_clip_module()
    cfg = open_clip.get_pretrained_cfg(config.model, config.pretrained or "")
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(config.model)
        raise ModelLoadError(f"no pretrained tag {config.pretrained!r} for {config.model}; known tags: {tags}")
    try:
        if check_weights_reachable(cfg, config.model, config.pretrained) is not None:
            return
    except HubUnreachable as exc:
        raise ModelLoadError(str(exc)) from None
    log.info("fetching pretrained weights %s/%s (cached after the first time)", config.model, config.pretrained)
    try:
        open_clip.download_pretrained(cfg)
    except Exception as exc:  # broad on purpose: hub clients raise many kinds; all mean "no weights"
        raise ModelLoadError(
            f"could not download pretrained weights {config.pretrained!r} for {config.model} "
            f"({type(exc).__name__}: no network?). {OFFLINE_HINT}"
        ) from None


def preflight_tokenizer(config: ServiceConfig) -> str | None:
    """Why the default model's text tower is off, where its default turned it off (None: as the config says), found
    before any replica starts; the planner plans no text tower for it then (serve/plan/planner.py `text_off`).

    Asked for (`text_replicas: N` or `tokenizer: DIR`): the tokenizer is checked here, so a missing one
    fails in a second with the fix, not as a text replica that never starts. Not named (the cpu
    default): on when the tokenizer is local or the hub answers within seconds, else off with one log
    line saying how to turn it on; an image service from a local checkpoint on an air-gapped host then
    starts without minutes of hub retries."""
    settings = config.model_settings()
    if policy_of(config).text_replicas == 0 or config.models:  # several models: each entry's text tower as it says
        return None
    from siglip_serve.core.errors import ModelLoadError
    from siglip_serve.models.hub import hub_address, offline_requested, reachable
    from siglip_serve.models.tokenizer_files import tokenizer_dir

    asked = config.text_replicas is not None or config.tokenizer is not None
    # A hub model's tokenizer is a file of its repository, fetched with the same quick checks (models/hub_repo.py).
    if tokenizer_dir(settings) is None and not settings.source.on_hub and not offline_requested():
        host, port = hub_address({"hf_hub": config.model})
        if not reachable(host, port):
            why = f"no tokenizer: DIR is set and the model hub {host}:{port} is unreachable"
            if asked:
                raise ModelLoadError(f"text_replicas: {config.text_replicas} needs {config.model}'s tokenizer, but "
                                     f"{why}; set tokenizer: DIR to a local copy of its tokenizer files "
                                     "(tokenizer.json, tokenizer_config.json), or text_replicas: 0")
            return text_off(config, why)
    try:
        check_tokenizer(settings)
    except ModelLoadError as exc:
        if asked:
            raise
        return text_off(config, str(exc))
    return None


def check_tokenizer(settings: ModelSettings) -> None:
    """Raise ModelLoadError (one line) where the text replicas could not load the tokenizer: parsed here without
    torch or open_clip where this machine holds its `tokenizer.json` (models/tokenizer_files.py), else loaded as
    the replicas load it."""
    from siglip_serve.models.image_only import model_config
    from siglip_serve.models.model_towers import model_tokenizer
    from siglip_serve.models.tokenizer_files import check_fast_tokenizer

    if not settings.source.on_hub and check_fast_tokenizer(settings, (model_config(settings.model) or {}).get(
            "text_cfg") or {}):
        return
    model_tokenizer(settings)  # torch and transformers with it


def text_off(config: ServiceConfig, why: str) -> str:
    """`why` the default turned the text tower of `config`'s model off, logged with the two ways to settle it."""
    log.warning("text routes off (%s): set tokenizer: DIR to a local copy of %s's tokenizer files, or "
                "text_replicas: 0 to say so and skip this check", why, config.model)
    return why
