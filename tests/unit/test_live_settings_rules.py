"""Live settings (serve/plan/live_settings.py): the ingress's user_config over the live settings of its plan (the
args'), validated with the keys file checked against the rest of the config, refused naming a key that needs a
restart, and put in force by the ingress without a new Ingress."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from siglip_serve.serve.ingress.embedding_cache import cache_key
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.plan.live_settings import LIVE_KEYS, live_settings, restart_keys
from siglip_serve.serve.plan.planner import front_settings
from tests.helpers import TowerHandle, stand_in_ingress


def _keys(path: Path, *keys: str) -> str:
    path.write_text("".join(f'[[keys]]\nname = "{key}"\nkey = "{key}"\n' for key in keys))
    return str(path)


def test_the_live_settings_are_the_live_keys_of_the_config_as_json() -> None:
    config = ServiceConfig.from_args({"model": "tiny-siglip", "request_timeout_s": 12, "log_level": "DEBUG"})
    live = live_settings(config)
    assert set(live) == set(LIVE_KEYS)
    assert live["request_timeout_s"] == 12.0 and live["log_level"] == "DEBUG" and live["api_keys_file"] is None


def test_user_config_goes_over_the_args_and_a_key_left_out_is_the_args_value_again() -> None:
    args = front_settings(ServiceConfig.from_args({"model": "tiny-siglip", "max_queued_requests": 100,
                                                   "retry_after_s": 3}))
    first = args.with_live({"max_queued_requests": 5})
    assert (first.live.max_queued_requests, first.live.retry_after_s) == (5, 3)
    again = args.with_live({"retry_after_s": 9})  # over the args, not over `first`
    assert (again.live.max_queued_requests, again.live.retry_after_s) == (100, 9)
    assert args.with_live(None) is args and args.with_live({}) is args
    assert again.model_copy(update={"live": args.live}) == args  # nothing but the live settings changed


def test_a_key_that_needs_a_restart_or_a_bad_value_is_refused_naming_it() -> None:
    config = ServiceConfig.from_args({"model": "tiny-siglip"})
    args = front_settings(config)
    with pytest.raises(ConfigError, match=r"user_config: decode_threads, replicas cannot change in place"):
        args.with_live({"replicas": 2, "decode_threads": 2, "retry_after_s": 2})
    with pytest.raises(ConfigError, match=r"invalid user_config: .*retry_after_s"):
        args.with_live({"retry_after_s": 0})
    with pytest.raises(ConfigError, match=r"invalid user_config: .*url_fetch_allowlist"):
        args.with_live({"url_fetch_allowlist": ["not a host/8"]})
    with pytest.raises(ConfigError, match="a mapping"):
        args.with_live(["retry_after_s"])
    # The keys file is checked against the rest of the config: interactive_ingress needs the keys file the
    # user_config takes away, and the single key leaves no room for one.
    lanes = front_settings(config.model_copy(update={"interactive_ingress": True, "api_keys_file": "/k.toml"}))
    with pytest.raises(ConfigError, match="interactive_ingress needs api_keys_file"):
        lanes.with_live({"api_keys_file": None})
    single = front_settings(ServiceConfig.from_args({"model": "tiny-siglip", "api_key": "k"}))
    with pytest.raises(ConfigError, match="api_keys_file or the single key"):
        single.with_live({"api_keys_file": "/k.toml"})


def test_restart_keys_names_every_changed_key_that_is_not_live() -> None:
    old = ServiceConfig.from_args({"model": "tiny-siglip"})
    new = ServiceConfig.from_args({"model": "tiny-siglip", "decode_threads": 2, "retry_after_s": 5,
                                   "embedding_cache_mib": 8, "max_images_per_request": 4})
    assert restart_keys(old, new) == ["decode_threads", "max_images_per_request"]


def test_the_ingress_puts_new_keys_and_limits_in_force_and_keeps_them_when_a_keys_file_is_bad(
        tmp_path: Path) -> None:
    first = _keys(tmp_path / "first.toml", "old-key")
    ingress = stand_in_ingress(TowerHandle(), None, api_keys_file=first, embedding_cache_mib=0.01)
    door, args = ingress.door, ingress.front
    assert door.tenants.ticket("Bearer old-key").tenant == "old-key"
    second = _keys(tmp_path / "second.toml", "old-key", "new-key")

    ingress.reconfigure(args.with_live({"api_keys_file": second, "max_queued_requests": 3, "retry_after_s": 7,
                                        "request_timeout_s": 2.5, "log_level": "DEBUG"}))
    assert door.tenants.ticket("Bearer new-key").tenant == "new-key"
    assert (door.slots.queued, door.slots.retry_after_s, door.front.live.request_timeout_s) == (3, 7, 2.5)
    assert door.retry_after() == {"Retry-After": "7"}
    assert ingress.towers["image"].client.retry_after_s == 7
    kept = door.tenants

    # The cache's bound and the URL fetcher, which every model's rows share.
    cache = ingress.cache
    for n in range(8):
        cache.put(cache_key(b"scope", "image", bytes([n])), np.zeros(64, np.float32))
    held = cache.bytes
    ingress.reconfigure(args.with_live({"api_keys_file": second, "embedding_cache_mib": 0.002,
                                        "url_fetch_allowlist": ["images.example.com"], "url_fetch_timeout_s": 3}))
    assert cache.max_bytes == int(0.002 * 1024 * 1024) and 0 < cache.bytes <= cache.max_bytes < held
    assert ingress.cache is cache and door.slots.queued == args.live.max_queued_requests  # left out: the args
    fetcher = ingress.fetcher
    assert fetcher.settings.allowlist == ("images.example.com",) and fetcher.settings.timeout_s == 3
    assert all(served.scheduler.rows.fetcher is fetcher for served in ingress.served.values())

    with pytest.raises(ConfigError, match="cannot read"):
        ingress.reconfigure(args.with_live({"api_keys_file": str(tmp_path / "gone.toml"), "retry_after_s": 5,
                                            "embedding_cache_mib": 1}))
    assert door.tenants is kept and door.slots.retry_after_s == args.live.retry_after_s != 5
    assert cache.max_bytes == int(0.002 * 1024 * 1024) and ingress.fetcher is fetcher
