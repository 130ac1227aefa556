"""`url_fetch_allowlist` read, and what kind of address an address is: the checks serve/ingress/url_fetch.py makes
before it connects anywhere (its docstring, and docs/http-api.md "Images by URL", give the rules)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

SETTING = "url_fetch_allowlist"
ANY_HOST = "*"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Not reachable-on-the-internet ranges that ipaddress's flags do not all catch on Python 3.11: shared
# address space (RFC 6598; Alibaba's metadata service is 100.100.100.200), and IPv6 prefixes that carry
# an IPv4 destination (6to4 RFC 3056, NAT64 RFC 6052 and RFC 8215), which a relay may turn into an
# internal IPv4 address. 224.0.0.0/4 counts as is_global there, so multicast is checked by its own flag.
_TRANSLATED_OR_SHARED = tuple(ipaddress.ip_network(n) for n in ("100.64.0.0/10", "2002::/16", "64:ff9b::/96",
                                                                 "64:ff9b:1::/48"))



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


def literal_address(host: str) -> Address | None:
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
            elif "/" in entry or literal_address(entry.strip("[]")) is not None:
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
