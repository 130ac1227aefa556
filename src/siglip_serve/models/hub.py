"""Before any download: are the pretrained weights on disk already, and can the model hub be reached?

open_clip and huggingface_hub retry an unreachable hub for about a minute, with a warning per try,
before they give up. These checks answer in seconds: a cache lookup that needs no network, then
`HF_HUB_OFFLINE`, then one TCP connect to the hub with a short timeout.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# Long enough for a slow but working link; short enough that "no network" is a few seconds.
CONNECT_TIMEOUT_S = 3.0
OFFLINE_HINT = ("Offline, `make serve MODEL=tiny-siglip` serves the tiny random-weight model; or pass "
                "--checkpoint PATH (a state dict saved with torch.save(model.state_dict())) or "
                "--random-weights (embeddings then mean nothing).")


class HubUnreachable(RuntimeError):
    """The weights are not cached and the hub cannot be reached; the message says what to do."""


def offline_requested() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hf_parts(cfg: dict[str, Any]) -> tuple[str, list[str]] | None:
    hub = cfg.get("hf_hub") or ""
    if not hub:
        return None
    from open_clip.pretrained import HF_WEIGHTS_NAME, _get_safe_alternatives

    # open_clip's convention: 'org/model/' means the default file name, 'org/model/file.pt' a named one;
    # it tries the safetensors alternatives first, as here.
    model_id, filename = os.path.split(hub)
    filename = filename or HF_WEIGHTS_NAME
    return model_id, [*_get_safe_alternatives(filename), filename]


def cached_weights(cfg: dict[str, Any]) -> Path | None:
    """The local file open_clip would load for this pretrained config, if it is on disk already."""
    if cfg.get("file"):
        return Path(cfg["file"])
    parts = _hf_parts(cfg)
    if parts is None:
        return None
    from huggingface_hub import try_to_load_from_cache

    model_id, names = parts
    for name in names:
        found = try_to_load_from_cache(model_id, name)
        if isinstance(found, str):
            return Path(found)
    return None


def hub_address(cfg: dict[str, Any]) -> tuple[str, int]:
    url = os.environ.get("HF_ENDPOINT", "https://huggingface.co") if cfg.get("hf_hub") else cfg.get("url", "")
    parsed = urlparse(url)
    return parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)


def reachable(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """One TCP connect within `timeout_s`, name lookup included (getaddrinfo has no timeout of its
    own, so it runs in a daemon thread that is abandoned if it hangs)."""
    result: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=attempt, daemon=True, name="hub-check")
    worker.start()
    worker.join(timeout_s + 0.5)
    return bool(result and result[0])


def check_weights_reachable(cfg: dict[str, Any], model: str, tag: str | None) -> Path | None:
    """The cached weights file, or None when a download can start; HubUnreachable when it cannot."""
    cached = cached_weights(cfg)
    if cached is not None:
        return cached
    what = f"pretrained weights {tag!r} for {model}"
    if offline_requested():
        raise HubUnreachable(f"{what} are not in the local cache and HF_HUB_OFFLINE is set (no network). "
                             f"{OFFLINE_HINT}")
    host, port = hub_address(cfg)
    if not reachable(host, port):
        raise HubUnreachable(f"{what} are not in the local cache and the model hub {host}:{port} is unreachable "
                             f"(no network?). {OFFLINE_HINT}")
    return None
