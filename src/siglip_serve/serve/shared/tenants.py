"""API keys, each a tenant: the keys file (`api_keys_file`), who a request's key is, and each key's request rate.

The file is TOML (Python's own tomllib reads it), one `[[keys]]` table per tenant:

    [[keys]]
    name = "search"            # what metrics, access logs and traces show: never the key
    sha256 = "9f86d0...0f00a08" # or key = "..." (the file is then as secret as the key)
    lane = "interactive"       # the key's default lane (core/lanes.py); requests may move down from it
    weight = 4                 # its share within its lane against the other tenants' (core/lanes.py)
    rate_per_s = 50            # optional: requests a second past which it is answered 429

The file is read at start (a bad one stops the start) and again, on each ingress replica, when its modification
time changes (looked at no more often than RELOAD_CHECK_S); `siglip-serve run` touches it on SIGHUP, so a
signal reloads it everywhere. A file that no longer validates keeps the keys read before, with a warning.

Without the file, the single key (`api_key`, `api_key_file`, $SIGLIP_API_KEY) or none is the one tenant
"default" in the default lane, as before.

A rate is each key's across the service: each ingress replica allows its share of it (HAProxy spreads
requests evenly over them), a generic cell rate algorithm (GCRA, the token bucket's one-timestamp form) with
a burst of one second's requests; a request past it is answered 429 with Retry-After the seconds until it
would pass.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from siglip_serve.core.errors import describe_validation
from siglip_serve.core.lanes import DEFAULT_TENANT, LANE_NAMES, Lane, Ticket, lane_named
from siglip_serve.serve.http.errors import ApiError, ErrorType

log = logging.getLogger("siglip_serve.ingress")

# How often, at most, an ingress replica looks at the keys file's modification time.
RELOAD_CHECK_S = 1.0


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="the tenant's name on metrics, logs and traces")
    key: str | None = Field(None, min_length=1, description="the key itself")
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$", description="the key's sha256, hex")
    lane: str = Field("default", description=f"the key's default lane: {', '.join(LANE_NAMES)}")
    weight: float = Field(1.0, gt=0, description="share within its lane against other tenants")
    rate_per_s: float | None = Field(None, gt=0, description="requests a second; past it 429")

    @field_validator("lane")
    @classmethod
    def _lane(cls, value: str) -> str:
        lane_named(value)
        return value

    @model_validator(mode="after")
    def _one_key(self) -> KeyEntry:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of key and sha256")
        return self

    def digest(self) -> str:
        return self.sha256.lower() if self.sha256 is not None else sha256_hex(self.key or "")


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[KeyEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> KeysFile:
        names = [entry.name for entry in self.keys]
        digests = [entry.digest() for entry in self.keys]
        if len(set(names)) != len(names) or len(set(digests)) != len(digests):
            raise ValueError("each key and each name may appear once")
        return self


def sha256_hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_keys(path: str | Path) -> KeysFile:
    """The keys file, validated; ValueError naming what is wrong."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ValueError(f"api_keys_file: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"api_keys_file: {path} is not TOML: {exc}") from None
    try:
        return KeysFile.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"api_keys_file: {path}: {describe_validation(exc.errors(), 'keys')}") from None


def lane_map(keys: KeysFile) -> str:
    """HAProxy's map of each key's sha256 to its default lane (launcher/haproxy_front.py reads it)."""
    return "".join(f"{entry.digest()} {int(lane_named(entry.lane))}\n" for entry in keys.keys)


class Rate:
    """GCRA: at most `per_s` requests a second on average, `burst` at once."""

    def __init__(self, per_s: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / per_s
        self.tolerance = self.interval * max(burst - 1.0, 0.0)
        self.clock = clock
        self.theoretical = 0.0

    def wait_s(self) -> float:
        """0 when a request may pass now (and counts it), else the seconds until one would."""
        now = self.clock()
        arrival = max(self.theoretical, now)
        if arrival - now > self.tolerance:
            return arrival - now - self.tolerance
        self.theoretical = arrival + self.interval
        return 0.0


@dataclass(frozen=True)
class Tenant:
    name: str
    lane: Lane
    weight: float
    rate: Rate | None


class Tenants:
    """Who a request is, from its bearer token: the keys file's tenants, the single key's, or anyone's."""

    def __init__(self, keys_file: str | None, single_key: str | None, share: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, whole_lane: Lane | None = None) -> None:
        """`share`: the part of each key's rate this replica allows (1 / the ingress replicas that share the
        traffic); `whole_lane`: a lane whose keys' requests all meet one replica (ServiceConfig.interactive_ingress),
        so each replica allows those keys their whole rate. Their requests moved down by X-Priority meet the
        other replicas, each of which then allows the whole rate too."""
        self.keys_file = keys_file
        self.single_key = single_key
        self.share = share
        self.whole_lane = whole_lane
        self.clock = clock
        self._by_digest: dict[str, Tenant] = {}
        self._mtime: float | None = None
        self._checked = -math.inf
        if keys_file is not None:
            self._load(load_keys(keys_file))
            self._mtime = self._stat()

    @property
    def required(self) -> bool:
        return self.keys_file is not None or self.single_key is not None

    def ticket(self, authorization: str) -> Ticket:
        """The request's tenant and default lane from its Authorization header: 401 for a missing or wrong key,
        429 with Retry-After for a key past its rate."""
        if not self.required:
            return Ticket()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized()
        if self.keys_file is None:
            if not hmac.compare_digest(token.encode(), (self.single_key or "").encode()):
                raise _unauthorized()
            return Ticket(DEFAULT_TENANT)
        self._maybe_reload()
        tenant = self._by_digest.get(sha256_hex(token))
        if tenant is None:
            raise _unauthorized()
        if tenant.rate is not None and (wait := tenant.rate.wait_s()) > 0:
            raise ApiError(429, ErrorType.RATE_LIMITED, f"key {tenant.name!r} is past its request rate; retry later",
                           {"Retry-After": str(max(1, math.ceil(wait)))})
        return Ticket(tenant.name, tenant.lane, tenant.weight)

    def _load(self, keys: KeysFile) -> None:
        old = {tenant.name: tenant for tenant in self._by_digest.values()}
        loaded = {}
        for entry in keys.keys:
            rate = None
            lane = lane_named(entry.lane)
            if entry.rate_per_s is not None:
                per_s = entry.rate_per_s * (1.0 if lane == self.whole_lane else self.share)
                previous = old.get(entry.name)
                same = previous is not None and previous.rate is not None and previous.rate.interval == 1.0 / per_s
                # A reload keeps an unchanged rate's state: a key cannot reset its limit by the file's touch.
                rate = previous.rate if same and previous is not None else Rate(per_s, max(per_s, 1.0), self.clock)
            loaded[entry.digest()] = Tenant(entry.name, lane, entry.weight, rate)
        self._by_digest = loaded

    def _stat(self) -> float | None:
        try:
            return os.stat(self.keys_file or "").st_mtime
        except OSError:
            return None

    def _maybe_reload(self) -> None:
        now = self.clock()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        mtime = self._stat()
        if mtime is None or mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self._load(load_keys(self.keys_file or ""))
            log.info("api_keys_file %s reloaded: %d key(s)", self.keys_file, len(self._by_digest))
        except ValueError as exc:
            log.warning("%s; keeping the %d key(s) read before", exc, len(self._by_digest))


def _unauthorized() -> ApiError:
    return ApiError(401, ErrorType.UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer ...)",
                    {"WWW-Authenticate": "Bearer"})
