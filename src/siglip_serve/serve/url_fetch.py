"""Images by URL, fetched under the operator's allowlist, from the address that was checked, within a deadline.

Off by default: with `url_fetch_allowlist` empty every URL is refused (400 `url_not_allowed`, naming the
setting) before anything is resolved. With it set, one fetch follows these rules (docs/http-api.md,
"Images by URL"), each hop of a redirect chain again:

- http and https only; no user:password@ in the URL.
- The host must be allowed: a name matches a host entry (`images.example.com`), a domain entry
  (`*.example.com`: any name under it, not the apex) or `*` (any name); an address literal, or a name
  whose every address lies in a CIDR entry (`10.0.0.0/8`, `127.0.0.2/32`), is allowed by the CIDR.
- The name is resolved once (`Resolver`), every address it gives is checked, and the connection is
  made to the first of them: the request goes to `http(s)://<address>:<port>/...` with the Host header
  and TLS's server name (SNI, and the name the certificate is verified against) set to the name
  (httpcore's `sni_hostname` request extension, encode/httpcore docs/extensions.md). Nothing looks the
  name up a second time, so an answer that changes between the check and the connection (DNS
  rebinding) cannot move the fetch.
- Loopback, private, link-local (the cloud metadata service, 169.254.169.254 and fd00:ec2::254),
  multicast, reserved, unspecified, shared (100.64.0.0/10) and translated (6to4, NAT64) addresses are
  refused unless a CIDR entry names them, whatever name led there; an IPv4-mapped IPv6 address is
  judged as its IPv4 address.
- Redirects are followed by hand, at most MAX_REDIRECTS, each target checked as above.
- The body is capped at the image byte limit (`max_body_bytes`): by its Content-Length before any of
  it is read, and while it streams. Only 200 (and 203) is an image; every other status is a failure.
- Waiting for a fetch slot (at most `url_fetch_concurrency` fetches at once per UrlFetcher, i.e. per
  ingress replica) and the fetch itself end at the caller's deadline; the fetch itself also at
  `url_fetch_timeout_s`.

Connections are not kept alive: a pooled connection is keyed by address, and one opened (and its
certificate verified) for one name must not carry a request for another name on the same address.

Each refusal or failure is one exception class (UrlRejected's subclasses); serve/errors.py's
URL_ERRORS gives each its status and contract type. Nothing here knows Ray, FastAPI or torch.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger(__name__)

SETTING = "url_fetch_allowlist"
MAX_REDIRECTS = 3
SCHEMES = ("http", "https")
OK_STATUSES = (200, 203)
ANY_HOST = "*"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host name, port) -> the addresses it resolves to, as strings, in the resolver's order.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

# Not reachable-on-the-internet ranges that ipaddress's flags do not all catch on Python 3.11: shared
# address space (RFC 6598; Alibaba's metadata service is 100.100.100.200), and IPv6 prefixes that carry
# an IPv4 destination (6to4 RFC 3056, NAT64 RFC 6052 and RFC 8215), which a relay may turn into an
# internal IPv4 address. 224.0.0.0/4 counts as is_global there, so multicast is checked by its own flag.
_TRANSLATED_OR_SHARED = tuple(ipaddress.ip_network(n) for n in ("100.64.0.0/10", "2002::/16", "64:ff9b::/96",
                                                                 "64:ff9b:1::/48"))


class UrlRejected(Exception):
    """Base of every URL refusal or failure; raise one of the subclasses. `message` is safe to answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UrlNotAllowed(UrlRejected):
    """The URL may not be fetched: URLs are off, another scheme, a host or address the allowlist does not allow."""


class UrlFetchFailed(UrlRejected):
    """The fetch was tried and failed: no such name, no connection, a status other than 200, too many redirects."""


class UrlTooLarge(UrlRejected):
    """The body is over the image byte limit (declared or streamed)."""


class UrlTimeout(UrlRejected):
    """The fetch (or the wait for a fetch slot) did not finish within the deadline or url_fetch_timeout_s."""


def address_class(address: Address) -> str | None:
    """None for a public unicast address; else what kind of address it is, for the refusal's message."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (where cloud metadata services answer)"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:  # before is_private, which also holds 240.0.0.0/4 on Python 3.11
        return "reserved"
    if address.is_private:
        return "private"
    if any(address in network for network in _TRANSLATED_OR_SHARED):
        return "shared or IPv4-translating"
    if not address.is_global:
        return "non-global"
    return None


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


def _host_of(entry: str) -> str:
    """A host name as httpx sends it (lower case, IDNA), so entries and URLs compare alike; ValueError
    when it is no host name (httpx itself takes `a b` as `a%20b`)."""
    try:
        host = httpx.URL(f"http://{entry}/").raw_host.decode("ascii").rstrip(".")
    except (httpx.InvalidURL, UnicodeError):
        host = ""
    if not host or not all(_LABEL.fullmatch(label) for label in host.split(".")):
        raise ValueError(f"{SETTING}: {entry!r} is not a host name, a *.domain, a CIDR or *")
    return host


@dataclass(frozen=True)
class Allowlist:
    """`url_fetch_allowlist` parsed: host names, domains (suffixes, with their dot), networks, and `*`."""

    hosts: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()
    networks: tuple[Network, ...] = ()
    any_host: bool = False

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        """Raises ValueError naming the first entry that is none of: name, *.domain, address, CIDR, *."""
        hosts: set[str] = set()
        domains: list[str] = []
        networks: list[Network] = []
        any_host = False
        for raw in entries:
            entry = raw.strip()
            if "://" in entry or not entry:
                raise ValueError(f"{SETTING}: {raw!r} is not a host name, a *.domain, a CIDR or * (no scheme, "
                                 "no path)")
            if entry == ANY_HOST:
                any_host = True
            elif entry.startswith("*."):
                domains.append("." + _host_of(entry[2:]))
            elif "/" in entry or _literal(entry.strip("[]")) is not None:
                try:
                    networks.append(ipaddress.ip_network(entry.strip("[]"), strict=True))
                except ValueError as exc:
                    raise ValueError(f"{SETTING}: {raw!r}: {exc}") from None
            else:
                hosts.add(_host_of(entry))
        return cls(frozenset(hosts), tuple(domains), tuple(networks), any_host)

    @property
    def empty(self) -> bool:
        return not (self.hosts or self.domains or self.networks or self.any_host)

    def names(self, host: str) -> bool:
        """Whether a host *name* is allowed by a host entry, a domain entry or `*`."""
        return self.any_host or host in self.hosts or any(host.endswith(domain) for domain in self.domains)

    def holds(self, address: Address) -> bool:
        """Whether a CIDR entry names this address (mapped IPv4 addresses as themselves too)."""
        candidates = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        return any(a in network for a in candidates for network in self.networks if a.version == network.version)


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (getaddrinfo, off the event loop), in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]


@dataclass(frozen=True)
class FetchSettings:
    """What a UrlFetcher needs, picklable (bulk passes it to its decode tasks). ServiceConfig.url_fetch builds it."""

    allowlist: tuple[str, ...] = ()
    max_bytes: int = 20 * 1024 * 1024
    concurrency: int = 16
    timeout_s: float = 10.0


def pinned(url: httpx.URL, address: Address) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """The request that reaches `address` for `url`: the URL with the address as its host, the Host header
    of the name (and port), and for https the TLS server name (SNI and certificate check) of the name."""
    extensions: dict[str, Any] = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    return url.copy_with(host=str(address)), {"Host": url.netloc.decode("ascii")}, extensions


def _parse(url: str | httpx.URL) -> httpx.URL:
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError):
        raise UrlNotAllowed("not a valid http or https URL") from None
    if parsed.scheme not in SCHEMES:
        raise UrlNotAllowed(f"only http and https URLs are fetched, not {parsed.scheme or 'this'}")
    if not parsed.raw_host:
        raise UrlNotAllowed("the URL has no host")
    if parsed.userinfo:
        raise UrlNotAllowed("a URL with user:password@ is not fetched")
    return parsed


def _transport_failure(exc: httpx.HTTPError) -> UrlRejected:
    """An httpx error as the contract's words: what failed, never the exception's text (it names addresses)."""
    if isinstance(exc, httpx.TimeoutException):
        return UrlTimeout("the server did not answer in time")
    if isinstance(exc, httpx.ConnectError):
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            return UrlFetchFailed("the server's TLS certificate does not verify for its name")
        return UrlFetchFailed("could not connect to the server")
    if isinstance(exc, httpx.RemoteProtocolError):
        return UrlFetchFailed("the server's answer is not valid HTTP")
    if isinstance(exc, httpx.TransportError):
        return UrlFetchFailed("the connection to the server broke")
    return UrlFetchFailed("the fetch failed")


class UrlFetcher:
    """Fetches image URLs under one allowlist; one per ingress replica (its semaphore is the replica's bound
    on fetches at once). `resolver` and `transport` are for tests (a stub resolver; httpx's transports)."""

    def __init__(self, settings: FetchSettings, resolver: Resolver | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.allowlist = Allowlist.parse(settings.allowlist)
        self._resolve = resolver or system_resolver
        self._slots = asyncio.Semaphore(settings.concurrency)
        self.in_flight = 0
        self._client = httpx.AsyncClient(
            # No proxy, .netrc or SSL_CERT_* from the environment: the connection goes where it was checked.
            trust_env=False,
            follow_redirects=False,
            transport=transport or httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0),
                                                            retries=0),
            # identity: an image is already compressed, and a gzip bomb would inflate past the cap's
            # count only after decompression (the cap counts decoded bytes either way).
            headers={"Accept": "image/*", "Accept-Encoding": "identity", "User-Agent": "siglip-serve"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str, deadline: float = math.inf) -> bytes:
        """The body at `url` (following up to MAX_REDIRECTS checked redirects). `deadline` is in
        time.monotonic() (the event loop's clock), the request's own; the slot wait counts within it.
        Raises a UrlRejected subclass."""
        if self.allowlist.empty:
            raise UrlNotAllowed(f"image URLs are off: {SETTING} is empty (name the hosts, *.domains or CIDRs "
                                "images may be fetched from)")
        parsed = _parse(url)
        loop = asyncio.get_running_loop()
        limit = min(self.settings.timeout_s, deadline - loop.time())
        if limit <= 0:
            raise UrlTimeout("no time is left before the request's deadline")
        try:
            async with asyncio.timeout_at(None if math.isinf(deadline) else deadline):
                async with self._slots:
                    self.in_flight += 1
                    try:
                        async with asyncio.timeout(self.settings.timeout_s):
                            return await self._follow(parsed)
                    finally:
                        self.in_flight -= 1
        except TimeoutError:
            raise UrlTimeout(f"the image did not arrive within {limit:.3g} s") from None

    async def fetch_many(self, urls: Sequence[str], deadline: float = math.inf) -> list[bytes | UrlRejected]:
        """Every URL at once (within the concurrency bound), each its body or its refusal, in order."""
        async def one(url: str) -> bytes | UrlRejected:
            try:
                return await self.fetch(url, deadline)
            except UrlRejected as exc:
                return exc

        return list(await asyncio.gather(*(one(url) for url in urls)))

    async def allowed_address(self, url: httpx.URL) -> Address:
        """The address to connect to for `url`, after every address its host has was checked."""
        host = url.raw_host.decode("ascii").rstrip(".")
        literal = _literal(host)
        named = literal is None and self.allowlist.names(host)
        if literal is None and not named and not self.allowlist.networks:
            raise UrlNotAllowed(f"{host} is not in {SETTING}")
        if literal is not None:
            addresses: list[Address] = [literal]
        else:
            addresses = await self._addresses(host, url.port or (443 if url.scheme == "https" else 80))
        for address in addresses:
            self._check(host, address, named or (literal is not None and self.allowlist.any_host))
        return addresses[0]

    async def _addresses(self, host: str, port: int) -> list[Address]:
        try:
            found = await self._resolve(host, port)
        except (OSError, UnicodeError):  # socket.gaierror is an OSError
            raise UrlFetchFailed(f"{host} does not resolve") from None
        addresses = [a for a in (_literal(str(text).split("%")[0]) for text in found) if a is not None]
        if not addresses:
            raise UrlFetchFailed(f"{host} does not resolve")
        return list(dict.fromkeys(addresses))

    def _check(self, host: str, address: Address, named: bool) -> None:
        if self.allowlist.holds(address):
            return
        kind = address_class(address)
        if named and kind is None:
            return
        if kind is None:
            raise UrlNotAllowed(f"{host} is not in {SETTING}")
        # The address stays in the server's log: telling the client what an internal name resolves to
        # would map the network for it.
        log.info("URL fetch refused: %s resolves to %s, a %s address", host, address, kind)
        raise UrlNotAllowed(f"{host} resolves to a {kind} address, which {SETTING} does not name (a CIDR "
                            "entry allows such addresses)")

    async def _follow(self, url: httpx.URL) -> bytes:
        for _ in range(MAX_REDIRECTS + 1):
            target, headers, extensions = pinned(url, await self.allowed_address(url))
            try:
                async with self._client.stream("GET", target, headers=headers, extensions=extensions) as response:
                    if response.is_redirect:
                        url = _parse(url.join(response.headers["location"]))
                        continue
                    if response.status_code not in OK_STATUSES:
                        raise UrlFetchFailed(f"the server answered HTTP {response.status_code}")
                    return await self._read(response)
            except httpx.HTTPError as exc:
                raise _transport_failure(exc) from None
        raise UrlFetchFailed(f"more than {MAX_REDIRECTS} redirects")

    async def _read(self, response: httpx.Response) -> bytes:
        limit = self.settings.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise UrlTooLarge(f"the image is {int(declared)} bytes, over the {limit} byte limit (max_body_bytes)")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limit:
                raise UrlTooLarge(f"the image is over the {limit} byte limit (max_body_bytes)")
        return bytes(body)
