"""Where the backend may fetch task images from: the operator's allow-list, and public
addresses, decided on the addresses a host resolves to, before any connection.

A caller of ``/predict`` names the URLs; the operator decides which may be fetched:

- a host the operator named (``--allow-fetch-host HOST[:PORT]``, and the host of
  ``--label-studio-url``) is fetched whatever it resolves to: the operator trusts it;
- an address or network the operator named (``--allow-fetch-host 10.0.0.0/8``,
  ``127.0.0.1:8080``) is fetched on that port (any port when none is given);
- any other host is fetched only if every address it resolves to is public (not loopback,
  private, link-local, multicast, reserved or unspecified, IPv4 inside IPv6 included) and
  the port is 80 or 443, and only unless ``--no-public-fetch``.

The check runs again for every redirect, and the connection goes to the address that was
checked (never resolved a second time). Refusals all read the same, whether the host does
not resolve, resolves to an internal address, or is on another port, so an answer never
tells whether an internal host exists or answered.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
PUBLIC_PORTS = (80, 443)
SCHEMES = {"http": 80, "https": 443}


class FetchRefused(Exception):
    """A URL the policy does not fetch; the message is the same for every reason."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


@dataclass(frozen=True)
class AllowedHost:
    """One entry of the allow-list: a host name, or an address or network; any port when
    ``port`` is None."""

    name: str | None = None
    network: IPNetwork | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> AllowedHost:
        """``HOST``, ``HOST:PORT``, ``[IPv6]:PORT``, an address, or a network in CIDR
        notation; ValueError saying what is accepted."""
        entry = text.strip()
        accepted = (
            "expected HOST, HOST:PORT, an IP address ([IPv6]:PORT with a port) or a CIDR network"
        )
        if not entry:
            raise ValueError(f"{text!r}: {accepted}")
        try:
            return cls(network=ipaddress.ip_network(entry, strict=False))
        except ValueError:
            pass
        parts = urlsplit(f"//{entry}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(
                f"{text!r}: the port is not a number in 1..65535; {accepted}"
            ) from None
        host = parts.hostname
        if not host or parts.path or parts.query or parts.username or parts.password:
            raise ValueError(f"{text!r}: {accepted}")
        if port == 0:
            raise ValueError(f"{text!r}: the port is not a number in 1..65535; {accepted}")
        try:
            return cls(network=ipaddress.ip_network(host), port=port)
        except ValueError:
            return cls(name=normal_host(host), port=port)

    def allows_name(self, host: str, port: int) -> bool:
        return self.name is not None and self.name == normal_host(host) and self._port_ok(port)

    def allows_address(self, address: IPAddress, port: int) -> bool:
        if self.network is None or not self._port_ok(port):
            return False
        return _unmapped(address) in self.network or address in self.network

    def _port_ok(self, port: int) -> bool:
        return self.port is None or self.port == port


def normal_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


def is_public(address: IPAddress) -> bool:
    """A global unicast address: not loopback, private, link-local, multicast, reserved,
    unspecified or shared; an IPv4 address carried in IPv6 is judged as IPv4."""
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # an IPv4 address in IPv6 clothes: judged as one
            candidates = [address.ipv4_mapped]
        if address.sixtofour is not None:
            candidates.append(address.sixtofour)
        if address.teredo is not None:
            candidates.extend(address.teredo)
    return all(
        a.is_global
        and not (
            a.is_private
            or a.is_loopback
            or a.is_link_local
            or a.is_multicast
            or a.is_reserved
            or a.is_unspecified
        )
        for a in candidates
    )


def _unmapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class FetchPolicy:
    """The operator's allow-list, and whether other public hosts may be fetched."""

    allowed: tuple[AllowedHost, ...] = ()
    public: bool = True

    @classmethod
    def of(cls, entries: tuple[str, ...], public: bool = True) -> FetchPolicy:
        return cls(tuple(AllowedHost.parse(entry) for entry in entries), public)

    def target(self, url: str) -> tuple[str, str, int]:
        """(scheme, host, port) of a URL the policy may consider: http(s), a host, no
        credentials in it; FetchRefused otherwise."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise FetchRefused(url) from None
        scheme = parts.scheme.lower()
        host = parts.hostname
        if scheme not in SCHEMES or not host or parts.username is not None or port == 0:
            raise FetchRefused(url)
        return scheme, host, port or SCHEMES[scheme]

    def trusts_name(self, host: str, port: int) -> bool:
        """The operator named this host (and port): fetched wherever it resolves."""
        return any(entry.allows_name(host, port) for entry in self.allowed)

    def allows_addresses(self, addresses: list[IPAddress], port: int) -> bool:
        """Every address the host resolved to may be connected to on ``port``."""
        return bool(addresses) and all(self._allows(address, port) for address in addresses)

    def _allows(self, address: IPAddress, port: int) -> bool:
        if any(entry.allows_address(address, port) for entry in self.allowed):
            return True
        return self.public and port in PUBLIC_PORTS and is_public(address)

    def names_allowed(self, url: str) -> bool:
        """The URL's host is one the operator allowed by name or by address literal (what
        a /setup hostname must be to be used at all)."""
        try:
            _, host, port = self.target(url)
        except FetchRefused:
            return False
        if self.trusts_name(host, port):
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(entry.allows_address(address, port) for entry in self.allowed)


__all__ = ["AllowedHost", "FetchPolicy", "FetchRefused", "is_public", "normal_host"]
