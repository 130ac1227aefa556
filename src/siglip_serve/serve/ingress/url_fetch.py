"""Images by URL, fetched under the operator's allowlist, from the address that was checked, within a deadline.

Off by default: with `url_fetch_allowlist` empty every URL is refused (400 `url_not_allowed`, naming the
setting) before anything is resolved. With it set, one fetch follows these rules (docs/http-api.md,
"Images by URL"), each hop of a redirect chain again:

- http and https only, on a port from 1 to 65535; no user:password@ in the URL.
- The host must be allowed (serve/plan/url_allowlist.py): a name matches a host entry (`images.example.com`), a
  domain entry (`*.example.com`: any name under it, not the apex) or `*` (any name); an address literal,
  or a name whose every address lies in a CIDR entry (`10.0.0.0/8`, `127.0.0.2/32`), is allowed by the CIDR.
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
- Redirects (301, 302, 303, 307, 308, with a Location) are followed by hand, at most MAX_REDIRECTS, each
  target checked as above.
- Only 200 (and 203) is an image; every other status is a failure. The body is taken as sent: the fetch
  asks for `Accept-Encoding: identity` and refuses a body in any other Content-Encoding (gzip, br, zstd,
  ...) without reading it, so no origin can make the fetch inflate a small body into a large one. The
  body is capped at the image byte limit (`max_body_bytes`): by its Content-Length before any of it is
  read, and counted chunk by chunk while it streams.
- At most `url_fetch_concurrency` fetches run at once per UrlFetcher (per ingress replica); the waiting
  ones take turns round-robin across requests (serve/ingress/fair_slots.py), and a quarter of the slots are kept
  for requests that hold none, so one request's many slow URLs do not hold back another request's.
  Waiting for a turn ends at the caller's deadline; the fetch itself (resolving, connecting, every
  redirect, the whole body) at `url_fetch_timeout_s` from when its turn came, or at the deadline if
  that is sooner.

No state passes from one fetch to another: requests go straight to httpx's transport, not through an
httpx client, so there is no cookie jar, no stored credential, no default header beyond the few below;
and connections are not kept alive: a pooled connection is keyed by address, and one opened (and its
certificate verified) for one name must not carry a request for another name on the same address.

Each refusal or failure is one exception class (serve/http/url_errors.py); serve/http/errors.py's
REJECTIONS gives each its status and contract type. Whatever an origin sends, or an HTTP library raises
while talking to it, ends as one of them. Nothing here knows Ray, FastAPI or torch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from siglip_serve.serve.http.embed_request import Item
from siglip_serve.serve.http.errors import rejection_error
from siglip_serve.serve.http.url_errors import UrlFetchFailed, UrlNotAllowed, UrlRejected, UrlTimeout, UrlTooLarge
from siglip_serve.serve.ingress.fair_slots import FairSlots
from siglip_serve.serve.plan.live_settings import FetchSettings
from siglip_serve.serve.plan.url_allowlist import SETTING, Address, Allowlist, address_class, literal_address

log = logging.getLogger(__name__)

MAX_REDIRECTS = 3
SCHEMES = ("http", "https")
OK_STATUSES = (200, 203)
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
# Every header a fetch sends besides Host: nothing a client or an earlier fetch could add to.
HEADERS = {"Accept": "image/*", "Accept-Encoding": "identity", "Connection": "close", "User-Agent": "siglip-serve"}
# (host name, port) -> the addresses it resolves to, as strings, in the resolver's order.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
# Content codings named in a refusal's message as the origin wrote them; anything else is not echoed.
_CODINGS = re.compile(r"[a-z0-9._-]{1,16}(, [a-z0-9._-]{1,16}){0,3}")


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver (getaddrinfo, off the event loop), in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]


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
    # httpx takes any number as a port; the socket layer then raises what the caller cannot catch as a
    # failed fetch (OverflowError, in an ExceptionGroup under anyio on asyncio).
    if parsed.port is not None and not 0 < parsed.port <= 65535:
        raise UrlNotAllowed("not a valid http or https URL: its port is not from 1 to 65535")
    return parsed


def _redirect_target(url: httpx.URL, response: httpx.Response) -> httpx.URL:
    """Where a redirect answer sends the fetch, checked as a URL (not yet as a host)."""
    location = response.headers.get("location", "").strip()
    if not location:
        raise UrlFetchFailed(f"the server answered HTTP {response.status_code} with no Location to go to")
    try:
        target = url.join(location)
    except (httpx.InvalidURL, ValueError):  # ValueError: UnicodeError from IDNA among others
        raise UrlFetchFailed("the server redirected to an invalid URL") from None
    return _parse(target)


def _encoded(response: httpx.Response) -> str | None:
    """The Content-Encoding the body is sent in, for the message; None when it is none or identity."""
    codings = [c.strip().lower() for value in response.headers.get_list("content-encoding") for c in value.split(",")]
    named = ", ".join(c for c in codings if c and c != "identity")
    if not named:
        return None
    return named if _CODINGS.fullmatch(named) else "one it does not name"


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
    """Fetches image URLs under one allowlist; one per ingress replica (its slots are the replica's bound on
    fetches at once). `resolver` and `transport` are for tests (a stub resolver; httpx's transports)."""

    def __init__(self, settings: FetchSettings, resolver: Resolver | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.allowlist = Allowlist.parse(settings.allowlist)
        self._resolve = resolver or system_resolver
        # A quarter of the slots only for a request holding none: a client's first URL starts at once even
        # while other requests' slow URLs hold the rest for their whole timeout.
        self.slots = FairSlots(settings.concurrency, reserve=settings.concurrency // 4)
        # The transport itself, not an httpx client over it: a client keeps a cookie jar across requests,
        # builds the next request of a redirect whether it follows it or not, and reads proxies and .netrc
        # from the environment. retries=0: a connection is made once, to the address that was checked.
        self._transport = transport or httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_keepalive_connections=0), retries=0)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def fetch(self, url: str, deadline: float = math.inf, request: object | None = None) -> bytes:
        """The body at `url` (following up to MAX_REDIRECTS checked redirects). `deadline` is in
        time.monotonic() (the event loop's clock), the request's own; the wait for a turn counts within it.
        `request` is the request the URL belongs to (any object, the same for all its URLs): turns go
        round-robin across requests; None is a request of its own. Raises a UrlRejected subclass."""
        if self.allowlist.empty:
            raise UrlNotAllowed(f"image URLs are off: {SETTING} is empty (name the hosts, *.domains or CIDRs "
                                "images may be fetched from)")
        parsed = _parse(url)
        loop = asyncio.get_running_loop()
        if deadline - loop.time() <= 0:
            raise UrlTimeout("no time is left before the request's deadline")
        turn = object() if request is None else request
        try:
            async with asyncio.timeout_at(None if math.isinf(deadline) else deadline):
                await self.slots.acquire(turn)
        except TimeoutError:
            raise UrlTimeout("no fetch slot came free before the request's deadline") from None
        limit = min(self.settings.timeout_s, deadline - loop.time())
        try:
            async with asyncio.timeout(limit):
                return await self._follow(parsed)
        except TimeoutError:
            raise UrlTimeout(f"the image did not arrive within {limit:.3g} s") from None
        finally:
            self.slots.release(turn)

    async def fetch_many(self, urls: Sequence[str], deadline: float = math.inf) -> list[bytes | UrlRejected]:
        """Every URL at once (as one request's, within the concurrency bound), each its body or its refusal,
        in order."""
        turn = object()

        async def one(url: str) -> bytes | UrlRejected:
            try:
                return await self.fetch(url, deadline, turn)
            except UrlRejected as exc:
                return exc

        return list(await asyncio.gather(*(one(url) for url in urls)))

    async def allowed_address(self, url: httpx.URL) -> Address:
        """The address to connect to for `url`, after every address its host has was checked."""
        host = url.raw_host.decode("ascii").rstrip(".")
        literal = literal_address(host)
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
        addresses = [a for a in (literal_address(str(text).split("%")[0]) for text in found) if a is not None]
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
            target, host, extensions = pinned(url, await self.allowed_address(url))
            try:
                response = await self._transport.handle_async_request(
                    httpx.Request("GET", target, headers={**HEADERS, **host}, extensions=extensions))
                try:
                    if response.status_code in REDIRECT_STATUSES:
                        url = _redirect_target(url, response)
                        continue
                    if response.status_code not in OK_STATUSES:
                        raise UrlFetchFailed(f"the server answered HTTP {response.status_code}")
                    return await self._read(response)
                finally:
                    await response.aclose()
            except UrlRejected:
                raise
            except httpx.HTTPError as exc:  # httpcore's and the network's errors, as httpx's transport maps them
                raise _transport_failure(exc) from None
            except Exception:
                # The origin is anyone's: whatever else the HTTP stack raises on what it sent (h11, anyio's
                # exception groups on asyncio, ssl, idna) is a failed fetch of this URL, never the request's
                # 500 or a bulk job's end. The server's log keeps what it was.
                log.warning("URL fetch failed on an unexpected error", exc_info=True)
                raise UrlFetchFailed("the fetch failed") from None
        raise UrlFetchFailed(f"more than {MAX_REDIRECTS} redirects")

    async def _read(self, response: httpx.Response) -> bytes:
        encoded = _encoded(response)
        if encoded is not None:
            raise UrlFetchFailed(f"the server sent the image in Content-Encoding {encoded}; only an image sent "
                                 "as is (Accept-Encoding: identity, which the fetch asks for) is taken")
        limit = self.settings.max_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise UrlTooLarge(f"the image is {int(declared)} bytes, over the {limit} byte limit (max_body_bytes)")
        body = bytearray()
        async for chunk in response.aiter_raw():  # as sent: aiter_bytes would decode gzip, br, zstd unbounded
            body += chunk
            if len(body) > limit:
                raise UrlTooLarge(f"the image is over the {limit} byte limit (max_body_bytes)")
        return bytes(body)


class _Refused(Exception):
    def __init__(self, index: int, error: UrlRejected) -> None:
        super().__init__(error.message)
        self.index = index
        self.error = error


async def fetch_url_items(items: Sequence[Item], fetcher: UrlFetcher, deadline: float) -> list[Item]:
    """`items` with every url item's value replaced by the image bytes fetched for it (all at once, within
    `deadline`, time.monotonic()); the first refusal cancels the other fetches and is raised as the
    contract's error naming its item (of refusals raised together, the earliest item's)."""
    fetched: dict[int, bytes] = {}
    turn = object()  # this request's queue for the fetcher's slots, shared round-robin across requests

    async def one(i: int) -> None:
        try:
            fetched[i] = await fetcher.fetch(str(items[i].value), deadline, turn)
        except UrlRejected as exc:
            raise _Refused(i, exc) from None

    try:
        async with asyncio.TaskGroup() as group:
            for i, item in enumerate(items):
                if item.url:
                    group.create_task(one(i))
    except* _Refused as refused:
        first = min((e for e in refused.exceptions if isinstance(e, _Refused)), key=lambda e: e.index)
        raise rejection_error(first.error, items[first.index].label) from None
    return [Item("image", fetched[i], item.label) if item.url else item for i, item in enumerate(items)]
