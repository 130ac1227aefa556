"""API keys, each a tenant (serve/shared/tenants.py): the keys file, its reload, the single key still working,
and 429 past a key's rate."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from siglip_serve.core.lanes import Lane
from siglip_serve.launcher import cli
from siglip_serve.serve.http.errors import ApiError, ErrorType
from siglip_serve.serve.plan.config import ConfigError, ServiceConfig
from siglip_serve.serve.shared.tenants import Rate, Tenants, lane_map, load_keys

KEYS = """
[[keys]]
name = "search"
key = "search-key"
lane = "interactive"
weight = 4

[[keys]]
name = "backfill"
sha256 = "{digest}"
lane = "bulk"
rate_per_s = 2
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(KEYS.format(digest=hashlib.sha256(b"backfill-key").hexdigest()))
    return path


def test_each_key_is_its_tenant_with_its_lane_and_weight(tmp_path: Path) -> None:
    tenants = Tenants(str(_keys(tmp_path)), None)
    search = tenants.ticket("Bearer search-key")
    assert (search.tenant, search.lane, search.weight) == ("search", Lane.INTERACTIVE, 4.0)
    backfill = tenants.ticket("bearer backfill-key")  # the key by its sha256 in the file
    assert (backfill.tenant, backfill.lane) == ("backfill", Lane.BULK)
    for header in ("", "Bearer wrong", "Basic search-key", "Bearer "):
        with pytest.raises(ApiError) as refused:
            tenants.ticket(header)
        assert refused.value.status == 401 and refused.value.error_type == ErrorType.UNAUTHORIZED


def test_a_key_past_its_rate_gets_429_with_retry_after(tmp_path: Path) -> None:
    clock = Clock()
    tenants = Tenants(str(_keys(tmp_path)), None, clock=clock)
    tenants.ticket("Bearer backfill-key")
    tenants.ticket("Bearer backfill-key")  # a burst of one second's requests
    with pytest.raises(ApiError) as refused:
        tenants.ticket("Bearer backfill-key")
    assert refused.value.status == 429 and refused.value.error_type == ErrorType.RATE_LIMITED
    assert refused.value.headers == {"Retry-After": "1"}
    assert "backfill" in refused.value.message and "backfill-key" not in refused.value.message
    tenants.ticket("Bearer search-key")  # another key is not limited by it
    clock.now += 0.5
    tenants.ticket("Bearer backfill-key")


def test_each_ingress_replica_allows_its_share_of_a_rate() -> None:
    clock = Clock()
    rate = Rate(per_s=10 * 0.5, burst=1, clock=clock)
    assert rate.wait_s() == 0
    assert rate.wait_s() == pytest.approx(0.2)


def test_the_keys_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_old(tmp_path: Path) -> None:
    clock = Clock()
    path = _keys(tmp_path)
    tenants = Tenants(str(path), None, clock=clock)
    path.write_text('[[keys]]\nname = "new"\nkey = "new-key"\n')
    os.utime(path, (1, 1))
    clock.now += 2
    assert tenants.ticket("Bearer new-key").tenant == "new"
    with pytest.raises(ApiError):
        tenants.ticket("Bearer search-key")
    path.write_text("not toml [")
    os.utime(path, (2, 2))
    clock.now += 2
    assert tenants.ticket("Bearer new-key").tenant == "new"


def test_the_single_key_still_works_as_the_default_tenant() -> None:
    tenants = Tenants(None, "only-key")
    assert tenants.ticket("Bearer only-key").tenant == "default"
    assert tenants.ticket("Bearer only-key").lane == Lane.DEFAULT
    with pytest.raises(ApiError):
        tenants.ticket("Bearer other")
    assert Tenants(None, None).ticket("").tenant == "default"  # no key at all: anyone


def test_a_bad_keys_file_stops_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[keys]]\nname = "x"\nkey = "k"\nsha256 = "' + "0" * 64 + '"\n')

    def run_config() -> ServiceConfig:
        return cli.service_config(cli.build_parser().parse_args(["--set", f"api_keys_file={bad}"]), {})

    with pytest.raises(ConfigError, match="exactly one of key and sha256"):
        run_config()
    bad.write_text('[[keys]]\nname = "x"\nkey = "k"\nlane = "urgent"\n')
    with pytest.raises(ConfigError, match="lane must be one of"):
        run_config()
    # The config alone reads no file: a Serve YAML's builder validates it on a head that may not mount it.
    assert ServiceConfig.from_args({"api_keys_file": str(bad)}).api_keys_file == str(bad)
    with pytest.raises(ValueError, match="lane must be one of"):  # the ingress replica that reads it refuses
        Tenants(str(bad), None)
    with pytest.raises(ConfigError, match="not both"):
        ServiceConfig.from_args({"api_keys_file": str(_keys(tmp_path)), "api_key": "x"})
    config = ServiceConfig.from_args({"api_keys_file": str(_keys(tmp_path))})
    assert config.key_to_send(config.api_keys_file, {"SIGLIP_API_KEY": "env"}) is None


def test_haproxy_gets_each_keys_lane_by_its_hash_never_the_key(tmp_path: Path) -> None:
    text = lane_map(load_keys(_keys(tmp_path)))
    assert text == (f"{hashlib.sha256(b'search-key').hexdigest()} 0\n"
                    f"{hashlib.sha256(b'backfill-key').hexdigest()} 2\n")
    assert "search-key" not in text


@pytest.mark.parametrize("interactive_ingress", [False, True])
def test_with_a_replica_kept_for_the_interactive_lane_its_keys_get_their_whole_rate_on_each(
        tmp_path: Path, interactive_ingress: bool, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three ingress replicas: without interactive_ingress each allows a third of every key's rate; with it two share
    the traffic (half each), and the interactive lane's requests all meet the third, which allows their whole rate."""
    from siglip_serve.core.front_door import LIMITS_DIR_ENV, FrontDoorLimits
    from siglip_serve.serve.ingress.front_door import FrontDoor
    from siglip_serve.serve.plan.planner import front_settings

    monkeypatch.delenv(LIMITS_DIR_ENV, raising=False)  # no HAProxy of ours: what the log line below is about

    path = tmp_path / "keys.toml"
    path.write_text('[[keys]]\nname = "search"\nkey = "search-key"\nlane = "interactive"\nrate_per_s = 6\n\n'
                    '[[keys]]\nname = "backfill"\nkey = "backfill-key"\nlane = "bulk"\nrate_per_s = 6\n')
    config = ServiceConfig.from_args({"model": "tiny-siglip", "api_keys_file": str(path),
                                      "interactive_ingress": interactive_ingress})
    limits = FrontDoorLimits(4, 8, 10.0, 1, interactive_server=interactive_ingress)
    # ingress_replicas: IngressPlan.sharing_replicas
    door = FrontDoor(front_settings(config), limits, "siglip", "r", 2 if interactive_ingress else 3)

    def passing(key: str) -> int:  # a burst is one second's requests at the replica's rate
        for count in range(10):
            try:
                door.tenants.ticket(f"Bearer {key}")
            except ApiError as refused:
                assert refused.status == 429
                return count
        return 10

    assert (passing("search-key"), passing("backfill-key")) == ((6, 3) if interactive_ingress else (2, 2))
    # No HAProxy front end of ours in this process: nothing could keep a replica apart, and the log says so.
    assert ("no replica is kept for the interactive lane" in caplog.text) == interactive_ingress


def test_run_refuses_interactive_ingress_behind_serves_proxy(tmp_path: Path) -> None:
    keys = ["--set", f"api_keys_file={_keys(tmp_path)}", "--set", "interactive_ingress=true"]
    with pytest.raises(ConfigError, match="use --front-end haproxy"):
        cli.service_config(cli.build_parser().parse_args([*keys, "--front-end", "python"]), {})
    assert cli.service_config(cli.build_parser().parse_args(keys), {}).interactive_ingress
