"""Which addresses an outbound request may reach: a pure function of the resolved addresses.

A tenant names a URL; without a check, Sundial would make requests *from inside* the deployment to
wherever that name points — the cloud metadata service, a database on the private network, the process's
own loopback ports (server-side request forgery). So the host is resolved **once**, every address it
resolves to is checked here, and the sender connects to the very address that was checked: a second
resolution, which a short-TTL DNS record could answer differently (DNS rebinding), never happens.

Refused unless an administrator allowed the network: loopback, ``0.0.0.0/8`` and ``::``, private networks
(RFC 1918, ``fc00::/7``), link-local (``169.254/16`` with the metadata address, ``fe80::/10``), carrier-grade
NAT (``100.64/10``), multicast and reserved ranges, IPv4-mapped and NAT64 IPv6 forms (``::ffff:0:0/96``,
``64:ff9b::/96``), and anything else Python does not call global. A name that resolves to several addresses
is refused when any of them is: one public record must not smuggle in a private one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Named ranges, checked in order, so a refusal says which rule applied.
REFUSED_NETWORKS: tuple[tuple[str, IPNetwork], ...] = tuple(
    (name, ipaddress.ip_network(net))
    for name, net in (
        ("the unspecified network", "0.0.0.0/8"),
        ("loopback", "127.0.0.0/8"),
        ("a cloud metadata address", "169.254.169.254/32"),
        ("link-local", "169.254.0.0/16"),
        ("a private network", "10.0.0.0/8"),
        ("a private network", "172.16.0.0/12"),
        ("a private network", "192.168.0.0/16"),
        ("carrier-grade NAT", "100.64.0.0/10"),
        ("multicast", "224.0.0.0/4"),
        ("a reserved network", "240.0.0.0/4"),
        ("the unspecified address", "::/128"),
        ("loopback", "::1/128"),
        ("an IPv4-mapped address", "::ffff:0:0/96"),
        ("a NAT64 address", "64:ff9b::/96"),
        ("a cloud metadata address", "fd00:ec2::254/128"),
        ("a unique local (private) network", "fc00::/7"),
        ("link-local", "fe80::/10"),
        ("multicast", "ff00::/8"),
    )
)


class AddressRefused(ValueError):
    """The destination resolves to an address requests may not go to (the message says which and why)."""


@dataclass(frozen=True)
class AddressPolicy:
    """The networks an administrator allowed on top of the public internet (e.g. ``10.20.0.0/16``)."""

    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_strings(cls, networks: Iterable[str]) -> AddressPolicy:
        """Parse ``networks`` (CIDR or single addresses); a bad one raises :class:`ValueError` naming it."""
        parsed: list[IPNetwork] = []
        for text in networks:
            try:
                parsed.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                raise ValueError(f"not a network or address: {text!r}") from None
        return cls(tuple(parsed))

    def with_allowed(self, networks: Iterable[IPNetwork]) -> AddressPolicy:
        return AddressPolicy(self.allowed + tuple(networks))


def refusal(address: IPAddress, policy: AddressPolicy) -> str | None:
    """What ``address`` is that may not be reached under ``policy`` ("loopback" …), or None when it may."""
    if any(address.version == net.version and address in net for net in policy.allowed):
        return None
    for name, net in REFUSED_NETWORKS:
        if address.version == net.version and address in net:
            return name
    if not address.is_global:
        return "not a public address"
    return None


def check_addresses(host: str, addresses: Sequence[IPAddress], policy: AddressPolicy) -> IPAddress:
    """The address to connect to: the first of ``addresses``, once every one of them is allowed.

    Raises :class:`AddressRefused` when ``host`` resolved to nothing or to any refused address.
    """
    if not addresses:
        raise AddressRefused(f"{host} resolves to no address")
    for address in addresses:
        reason = refusal(address, policy)
        if reason is not None:
            what = f"{address} is {reason}" if str(address) == host else f"{host} resolves to {address}, {reason}"
            raise AddressRefused(f"{what}: requests may not go there unless an administrator allows it")
    return addresses[0]
