"""Images by URL (serve/ingress/url_fetch.py): each SSRF rule with a test that sends nothing outside 127.0.0.0/8.

Traffic goes only to HTTP servers bound to 127.0.0.2 (allowed as `127.0.0.2/32`) and 127.0.0.3 (another
loopback address, never allowed: its server must see no request). Private, link-local (cloud metadata),
multicast and other addresses are classified through a stub resolver and the address check alone, which
connects nowhere. Every test runs with the system resolver stubbed to refuse any name (`no_name_lookups`),
so no name leaves this host either, and a second lookup of a name would show as a failure.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import httpx
import pytest

from siglip_serve.serve.http.errors import REJECTIONS, rejection_error
from siglip_serve.serve.http.url_errors import UrlFetchFailed, UrlNotAllowed, UrlRejected, UrlTimeout, UrlTooLarge
from siglip_serve.serve.ingress.url_fetch import MAX_REDIRECTS, UrlFetcher, pinned
from siglip_serve.serve.plan.config import ConfigError, FetchSettings, ServiceConfig
from siglip_serve.serve.plan.url_allowlist import Allowlist, address_class
from tests.bounds import scaled

IMAGE = bytes(range(256)) * 40  # what /cat.jpg serves: the fetch returns bytes, decoding is not its business
LIMIT = 4096  # max_bytes in the size tests


class Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str) -> None:
        super().__init__((host, 0), Handler)
        self.hits: list[tuple[str, str | None]] = []
        self.active = 0
        self.most_active = 0
        self.lock = threading.Lock()
        self.base = f"http://{host}:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.hits.append((self.path, self.headers.get("Host")))
        path, _, query = self.path.partition("?")
        if path == "/cat.jpg":
            self._send(200, IMAGE)
        elif path == "/redirect":
            self._send(302, headers={"Location": unquote(query)})
        elif path == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif path == "/declared-big":
            self.send_response(200)
            self.send_header("Content-Length", str(LIMIT * 100))
            self.end_headers()
            self.wfile.write(b"x" * 10)
        elif path == "/streamed-big":  # HTTP/1.0, no Content-Length: the body ends when the server closes
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * LIMIT * 4)
        elif path == "/slow":
            time.sleep(2)
            self._send(200, IMAGE)
        elif path == "/busy":
            with self.server.lock:
                self.server.active += 1
                self.server.most_active = max(self.server.most_active, self.server.active)
            time.sleep(0.15)
            with self.server.lock:
                self.server.active -= 1
            self._send(200, IMAGE)
        else:
            self._send(404, b"no")


def _serve(host: str) -> Iterator[Server]:
    server = Server(host)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def allowed_server() -> Iterator[Server]:
    yield from _serve("127.0.0.2")


@pytest.fixture(scope="module")
def other_server() -> Iterator[Server]:
    yield from _serve("127.0.0.3")


@pytest.fixture(autouse=True)
def no_name_lookups(monkeypatch: pytest.MonkeyPatch, allowed_server: Server, other_server: Server) -> Iterator[list]:
    """The system resolver answers address literals only; a name fails (and is recorded) instead of reaching
    any DNS server. The code under test resolves names through its stub resolver, once."""
    real = socket.getaddrinfo
    names: list[str] = []

    def literal_only(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        text = host.decode() if isinstance(host, bytes) else str(host)
        try:
            ipaddress.ip_address(text)
        except ValueError:
            names.append(text)
            raise socket.gaierror(socket.EAI_NONAME, "tests resolve no names") from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", literal_only)
    allowed_server.hits.clear()
    other_server.hits.clear()
    yield names
    assert names == [], f"a name went to the system resolver: {names}"
    assert other_server.hits == [], "127.0.0.3 is never allowed; nothing may reach it"


class StubResolver:
    """Names to addresses from a table; counts each lookup."""

    def __init__(self, table: dict[str, Sequence[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown")
        return list(self.table[host])


def fetcher(*allow: str, resolver: StubResolver | None = None, **settings: float) -> UrlFetcher:
    return UrlFetcher(FetchSettings(allowlist=allow, **settings), resolver=resolver or StubResolver({}))  # type: ignore[arg-type]


def fetch(f: UrlFetcher, url: str, deadline: float = float("inf")) -> bytes:
    async def go() -> bytes:
        try:
            return await f.fetch(url, deadline)
        finally:
            await f.aclose()

    return asyncio.run(go())


def refused(f: UrlFetcher, url: str, kind: type[UrlRejected], deadline: float = float("inf")) -> str:
    with pytest.raises(kind) as caught:
        fetch(f, url, deadline)
    return caught.value.message


def test_with_the_allowlist_empty_every_url_is_refused_naming_the_setting(allowed_server: Server) -> None:
    resolver = StubResolver({"images.test": ["127.0.0.2"]})
    for url in (f"{allowed_server.base}/cat.jpg", "http://images.test/cat.jpg", "https://example.com/a.jpg"):
        message = refused(fetcher(resolver=resolver), url, UrlNotAllowed)
        assert "url_fetch_allowlist is empty" in message
    assert resolver.calls == [] and allowed_server.hits == []
    error = rejection_error(UrlNotAllowed(message), "input[2]")
    assert (error.status, error.error_type.value) == (400, "url_not_allowed")
    assert error.message.startswith("input[2]: image URLs are off")


def test_an_allowed_cidr_fetches_from_127_0_0_2(allowed_server: Server) -> None:
    assert fetch(fetcher("127.0.0.2/32"), f"{allowed_server.base}/cat.jpg") == IMAGE
    # A redirect inside what is allowed is followed (relative Location resolved against the URL).
    assert fetch(fetcher("127.0.0.2/32"), f"{allowed_server.base}/redirect?/cat.jpg") == IMAGE
    assert [path for path, _ in allowed_server.hits] == ["/cat.jpg", "/redirect?/cat.jpg", "/cat.jpg"]


def test_another_loopback_address_and_a_redirect_to_it_are_refused(allowed_server: Server,
                                                                   other_server: Server) -> None:
    message = refused(fetcher("127.0.0.2/32"), f"{other_server.base}/cat.jpg", UrlNotAllowed)
    assert "127.0.0.3 resolves to a loopback address" in message and "url_fetch_allowlist" in message
    message = refused(fetcher("127.0.0.2/32"), f"{allowed_server.base}/redirect?{other_server.base}/cat.jpg",
                      UrlNotAllowed)
    assert "loopback" in message
    assert [path for path, _ in allowed_server.hits] == [f"/redirect?{other_server.base}/cat.jpg"]
    # A name allowed by name is not enough for an internal address: only a CIDR allows those.
    named = StubResolver({"images.test": ["127.0.0.2"]})
    assert "loopback" in refused(fetcher("images.test", resolver=named),
                                 f"http://images.test:{allowed_server.server_address[1]}/cat.jpg", UrlNotAllowed)
    assert allowed_server.hits[1:] == []  # the refusals above connected to nothing (127.0.0.3: the fixture checks)


def test_a_name_is_resolved_once_and_the_connection_goes_to_that_address(allowed_server: Server) -> None:
    port = allowed_server.server_address[1]
    # A rebinding answer: the first lookup says 127.0.0.2, any later one would say 127.0.0.3.
    answers = iter([["127.0.0.2"], ["127.0.0.3"], ["127.0.0.3"]])

    class Rebinding(StubResolver):
        async def __call__(self, host: str, port: int) -> list[str]:
            self.calls.append(host)
            return next(answers)

    resolver = Rebinding({})
    url = f"http://images.test:{port}/cat.jpg"
    assert fetch(fetcher("images.test", "127.0.0.2/32", resolver=resolver), url) == IMAGE
    assert resolver.calls == ["images.test"]
    # The request reached 127.0.0.2 carrying the name: Host is the name and port the client wrote.
    assert allowed_server.hits == [("/cat.jpg", f"images.test:{port}")]


def test_every_redirect_hop_is_resolved_and_checked_again(allowed_server: Server) -> None:
    port = allowed_server.server_address[1]
    resolver = StubResolver({"a.test": ["127.0.0.2"], "b.test": ["127.0.0.3"]})
    url = f"http://a.test:{port}/redirect?http://b.test:{port}/cat.jpg"
    assert "loopback" in refused(fetcher("*.test", "127.0.0.2/32", resolver=resolver), url, UrlNotAllowed)
    assert resolver.calls == ["a.test", "b.test"]


def test_https_goes_to_the_checked_address_with_the_name_as_host_and_tls_server_name() -> None:
    url = httpx.URL("https://images.example.com:8443/a.jpg?x=1")
    target, headers, extensions = pinned(url, ipaddress.ip_address("127.0.0.2"))
    assert str(target) == "https://127.0.0.2:8443/a.jpg?x=1"
    assert headers == {"Host": "images.example.com:8443"} and extensions == {"sni_hostname": "images.example.com"}
    target, headers, extensions = pinned(httpx.URL("http://images.example.com/a.jpg"), ipaddress.ip_address("::1"))
    assert str(target) == "http://[::1]/a.jpg" and headers == {"Host": "images.example.com"} and extensions == {}

    # Through httpx itself (a mock transport: nothing is sent): what httpcore gets for its connection.
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=httpx.ByteStream(IMAGE))  # a stream, as a network gives

    f = UrlFetcher(FetchSettings(allowlist=("images.example.com", "127.0.0.2/32")),
                   resolver=StubResolver({"images.example.com": ["127.0.0.2"]}), transport=httpx.MockTransport(answer))
    assert fetch(f, "https://images.example.com/a.jpg") == IMAGE
    (request,) = seen
    assert request.url.host == "127.0.0.2" and request.headers["host"] == "images.example.com"
    assert request.extensions["sni_hostname"] == "images.example.com"


@pytest.mark.parametrize("address, kind", [
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"), ("fd00:ec2::254", "private"), ("::ffff:169.254.169.254", "link-local"),
    ("fe80::1", "link-local"), ("100.100.100.200", "shared"), ("127.0.0.1", "loopback"), ("::1", "loopback"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.251", "multicast"), ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"), ("2002:a9fe:a9fe::1", "shared or IPv4-translating"),
    ("64:ff9b::a9fe:a9fe", "reserved"), ("192.0.2.1", "private"),
])
def test_internal_addresses_are_refused_behind_any_name_unless_a_cidr_names_them(address: str, kind: str) -> None:
    assert kind in (address_class(ipaddress.ip_address(address)) or "")
    resolver = StubResolver({"images.test": [address]})
    f = fetcher("images.test", "*", resolver=resolver)

    async def check(f: UrlFetcher) -> object:
        try:
            return await f.allowed_address(httpx.URL("http://images.test/a.jpg"))  # resolves and checks only
        finally:
            await f.aclose()

    with pytest.raises(UrlNotAllowed, match=kind.split()[0]):
        asyncio.run(check(f))
    network = ipaddress.ip_network(address)
    allowed = fetcher("images.test", str(network), resolver=resolver)
    assert asyncio.run(check(allowed)) == ipaddress.ip_address(address)


def test_a_public_name_passes_the_check_and_one_internal_address_among_its_answers_fails_it() -> None:
    async def check(f: UrlFetcher, url: str) -> object:
        try:
            return await f.allowed_address(httpx.URL(url))
        finally:
            await f.aclose()

    public = "93.184.215.14"  # a string here: the check resolves through the stub and connects nowhere
    assert address_class(ipaddress.ip_address(public)) is None
    resolver = StubResolver({"cdn.example.com": [public], "mixed.example.com": [public, "169.254.169.254"]})
    assert asyncio.run(check(fetcher("*.example.com", resolver=resolver), "https://cdn.example.com/a.jpg")) \
        == ipaddress.ip_address(public)
    with pytest.raises(UrlNotAllowed, match="link-local"):
        asyncio.run(check(fetcher("*.example.com", resolver=resolver), "https://mixed.example.com/a.jpg"))
    # Not named and no CIDR to try: refused before any lookup.
    with pytest.raises(UrlNotAllowed, match="not in url_fetch_allowlist"):
        asyncio.run(check(fetcher("images.example.org", resolver=resolver), "https://cdn.example.com/a.jpg"))
    assert resolver.calls == ["cdn.example.com", "mixed.example.com"]


def test_redirects_are_followed_at_most_three_times(allowed_server: Server) -> None:
    assert MAX_REDIRECTS == 3
    message = refused(fetcher("127.0.0.2/32"), f"{allowed_server.base}/loop", UrlFetchFailed)
    assert message == "more than 3 redirects"
    assert [path for path, _ in allowed_server.hits] == ["/loop"] * 4


def test_the_size_is_capped_by_content_length_and_while_streaming(allowed_server: Server) -> None:
    message = refused(fetcher("127.0.0.2/32", max_bytes=LIMIT), f"{allowed_server.base}/declared-big", UrlTooLarge)
    assert f"is {LIMIT * 100} bytes, over the {LIMIT} byte limit (max_body_bytes)" in message
    message = refused(fetcher("127.0.0.2/32", max_bytes=LIMIT), f"{allowed_server.base}/streamed-big", UrlTooLarge)
    assert f"over the {LIMIT} byte limit" in message
    assert len(fetch(fetcher("127.0.0.2/32", max_bytes=len(IMAGE)), f"{allowed_server.base}/cat.jpg")) == len(IMAGE)
    error = rejection_error(UrlTooLarge(message), "input")
    assert (error.status, error.error_type.value) == (413, "url_too_large")


def test_the_fetch_ends_at_the_requests_deadline_and_at_its_own_timeout(allowed_server: Server) -> None:
    began = time.monotonic()
    refused(fetcher("127.0.0.2/32"), f"{allowed_server.base}/slow", UrlTimeout, deadline=time.monotonic() + 0.3)
    assert time.monotonic() - began < scaled(1.5)
    began = time.monotonic()
    message = refused(fetcher("127.0.0.2/32", timeout_s=0.3), f"{allowed_server.base}/slow", UrlTimeout)
    assert time.monotonic() - began < scaled(1.5) and "within 0.3 s" in message
    hits = len(allowed_server.hits)
    refused(fetcher("127.0.0.2/32"), f"{allowed_server.base}/cat.jpg", UrlTimeout, deadline=time.monotonic() - 1)
    assert len(allowed_server.hits) == hits  # a request already past its deadline fetches nothing
    error = rejection_error(UrlTimeout(message), "input")
    assert (error.status, error.error_type.value) == (504, "url_timeout")


def test_fetches_at_once_are_bounded_per_fetcher_and_the_wait_counts_in_the_deadline(allowed_server: Server) -> None:
    async def many(f: UrlFetcher, count: int, deadline: float = float("inf")) -> list[bytes | UrlRejected]:
        try:
            return await f.fetch_many([f"{allowed_server.base}/busy"] * count, deadline)
        finally:
            await f.aclose()

    results = asyncio.run(many(fetcher("127.0.0.2/32", concurrency=2), 6))
    assert results == [IMAGE] * 6 and allowed_server.most_active == 2
    # One slot, 0.15 s a fetch, 0.4 s to live: the first two or three fit, the ones still waiting time out.
    results = asyncio.run(many(fetcher("127.0.0.2/32", concurrency=1), 6, time.monotonic() + 0.4))
    assert results[0] == IMAGE and isinstance(results[-1], UrlTimeout)


def test_failures_are_url_fetch_failed_and_never_echo_addresses(allowed_server: Server) -> None:
    assert refused(fetcher("127.0.0.2/32"), f"{allowed_server.base}/missing", UrlFetchFailed) \
        == "the server answered HTTP 404"
    assert refused(fetcher("*.test"), "http://nowhere.test/a.jpg", UrlFetchFailed) == "nowhere.test does not resolve"
    closed = socket.socket()
    closed.bind(("127.0.0.2", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    message = refused(fetcher("127.0.0.2/32"), f"http://127.0.0.2:{port}/a.jpg", UrlFetchFailed)
    assert message == "could not connect to the server"
    error = rejection_error(UrlFetchFailed(message), "images[0]")
    assert (error.status, error.error_type.value) == (400, "url_fetch_failed")


@pytest.mark.parametrize("url", ["ftp://127.0.0.2/a.jpg", "file:///etc/passwd", "gopher://127.0.0.2/",
                                 "http://user:pw@127.0.0.2/a.jpg", "http:///a.jpg", "not a url"])
def test_only_plain_http_and_https_urls_are_fetched(url: str) -> None:
    refused(fetcher("127.0.0.2/32", "*"), url, UrlNotAllowed)


def test_the_allowlist_reads_names_domains_cidrs_and_star_and_refuses_anything_else() -> None:
    allow = Allowlist.parse(["Images.Example.com.", "*.cdn.example.net", "10.0.0.0/8", "127.0.0.2", "[::1]", "*"])
    assert allow.hosts == {"images.example.com"} and allow.domains == (".cdn.example.net",) and allow.any_host
    assert [str(n) for n in allow.networks] == ["10.0.0.0/8", "127.0.0.2/32", "::1/128"]
    domain = Allowlist.parse(["*.example.com"])
    assert domain.names("a.example.com") and domain.names("b.a.example.com")
    assert not domain.names("example.com") and not domain.names("badexample.com")
    assert domain.holds(ipaddress.ip_address("10.0.0.1")) is False
    assert Allowlist.parse([]).empty and not domain.empty
    for bad in ("https://images.example.com", "10.0.0.1/8", "", "a b", "*."):
        with pytest.raises(ValueError, match="url_fetch_allowlist"):
            Allowlist.parse([bad])
    config = ServiceConfig.from_args({"url_fetch_allowlist": "a.example.com, 10.0.0.0/8"})
    assert config.url_fetch_allowlist == ("a.example.com", "10.0.0.0/8")
    assert config.url_fetch == FetchSettings(("a.example.com", "10.0.0.0/8"), config.max_body_bytes, 16, 10.0)
    assert ServiceConfig().url_fetch_allowlist == ()  # off by default
    with pytest.raises(ConfigError, match="url_fetch_allowlist"):
        ServiceConfig.from_args({"url_fetch_allowlist": ["https://a.example.com/"]})


def test_every_url_refusal_has_one_answer_in_the_contract() -> None:
    URL_ERRORS = {cls: answer for cls, answer in REJECTIONS.items() if issubclass(cls, UrlRejected)}
    assert set(URL_ERRORS) == set(UrlRejected.__subclasses__())
    assert {t.value for _, t in URL_ERRORS.values()} == {"url_not_allowed", "url_fetch_failed", "url_too_large",
                                                         "url_timeout"}
