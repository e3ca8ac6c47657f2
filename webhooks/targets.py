"""Where a webhook may be sent: no SSRF (SPEC 8; the rules: docs/WEBHOOKS.md "Where deliveries go").

An allow-list, not `is_global`: a range `is_global` misjudges (Python 3.11 passes fec0::/10
and 192.0.0.8) or one registered later is refused."""

from __future__ import annotations

import bisect
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlsplit

from django.conf import settings

from webhooks.errors import WebhookEndpointInvalid, WebhookTargetRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
V4, V6 = ipaddress.IPv4Network, ipaddress.IPv6Network
Net = TypeVar("Net", ipaddress.IPv4Network, ipaddress.IPv6Network)

# IANA IPv4 Special-Purpose Address Registry, the blocks whose "Globally Reachable" is not
# True, plus multicast and the reserved 240/4 (both outside unicast).
_NOT_GLOBAL_V4 = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # shared address space (carrier NAT; some clouds' metadata)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link local (cloud metadata 169.254.169.254)
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments (DS-Lite, the dummy 192.0.0.8, NAT64 discovery)
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.88.99.0/24",  # 6to4 relay anycast, deprecated
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
)
# Blocks inside those that the registry marks globally reachable (anycast services).
_GLOBAL_INSIDE_V4 = ("192.0.0.9/32", "192.0.0.10/32")

# IANA IPv6 Special-Purpose Address Registry, inside 2000::/3; everything outside 2000::/3
# (loopback, ULA fc00::/7, link local, site local fec0::/10, multicast, the IPv4 forms,
# discard-only, SRv6 SIDs, reserved space) is off the list by construction.
_NOT_GLOBAL_V6 = (
    "2001::/23",  # IETF protocol assignments: Teredo 2001::/32, benchmarking, ORCHID (deprecated)...
    "2001:db8::/32",  # documentation
    "2002::/16",  # 6to4: judged by the IPv4 address it carries, not as IPv6
    "3fff::/20",  # documentation
)
# ...except the blocks of 2001::/23 the registry marks globally reachable.
_GLOBAL_INSIDE_V6 = (
    "2001:1::1/128",  # PCP anycast
    "2001:1::2/128",  # TURN anycast
    "2001:1::3/128",  # DNS-SD service registration protocol anycast
    "2001:3::/32",  # AMT
    "2001:4:112::/48",  # AS112-v6
    "2001:20::/28",  # ORCHIDv2
    "2001:30::/28",  # drone remote ID (DRIP) entity tags
)


def _allow_list(space: Net, holes: tuple[str, ...], exceptions: tuple[str, ...]) -> tuple[Net, ...]:
    """`space` without `holes`, plus `exceptions`: disjoint networks in address order."""
    remaining: list[Net] = [space]
    for hole in map(type(space), holes):
        remaining = [
            piece
            for net in remaining
            if not hole.supernet_of(net)
            for piece in (net.address_exclude(hole) if net.overlaps(hole) else [net])
        ]
    remaining.extend(map(type(space), exceptions))
    return tuple(sorted(remaining, key=lambda net: int(net.network_address)))


# The allow-lists: an address may be reached only if it is in one of these networks.
GLOBAL_V4 = _allow_list(V4("0.0.0.0/0"), _NOT_GLOBAL_V4, _GLOBAL_INSIDE_V4)
GLOBAL_V6 = _allow_list(V6("2000::/3"), _NOT_GLOBAL_V6, _GLOBAL_INSIDE_V6)
# Where each allow-list network starts, to find the one an address could be in by bisection
# (118 IPv4 networks: scanning them all cost 60 us a check).
_STARTS = {4: [int(net.network_address) for net in GLOBAL_V4], 6: [int(net.network_address) for net in GLOBAL_V6]}
_NAT64 = V6("64:ff9b::/96")
_SIX_TO_FOUR = V6("2002::/16")


@dataclass(frozen=True)
class Target:
    """A checked URL: connect to `address`, but speak HTTP(S) to `host` (Host, SNI, certificate)."""

    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent in the request line
    address: str


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a packet to `ip` ends up at, for the forms that carry one through
    to an IPv4 host: IPv4-mapped, NAT64 (well-known prefix) and 6to4."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR:
        return ip.sixtofour
    return None


def address_refusal(ip: IPAddress, *, allow_loopback: bool) -> str | None:
    """Why `ip` must not be reached (words for the operator), or None if it is on the
    allow-list (IPv4 carried in IPv6: judged as its IPv4 address)."""
    inner = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    if inner is not None:
        return address_refusal(inner, allow_loopback=allow_loopback)
    allowed = GLOBAL_V6 if isinstance(ip, ipaddress.IPv6Address) else GLOBAL_V4
    at = bisect.bisect_right(_STARTS[ip.version], int(ip)) - 1  # the last network starting at or below it
    if (at >= 0 and ip in allowed[at]) or (ip.is_loopback and allow_loopback):
        return None
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    return "a private or special-purpose address, not globally routable"


def _url_parts(url: str) -> tuple[str, str, int, str]:
    allow_http = bool(getattr(settings, "TALLY_WEBHOOK_ALLOW_HTTP", settings.DEBUG))
    allowed = {"https", "http"} if allow_http else {"https"}
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port out of range, a malformed IPv6 literal
        raise WebhookEndpointInvalid("url has an invalid host or port", param="url") from None
    # Plain http only where settings allow it (local development and tests); production
    # deliveries carry payment data and must be encrypted in transit.
    if parts.scheme not in allowed or not parts.hostname or parts.username or parts.password:
        raise WebhookEndpointInvalid("url must be an https URL without credentials", param="url")
    if port == 0:
        raise WebhookEndpointInvalid("url has an invalid host or port", param="url")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    # The request line takes ASCII only (docs/WEBHOOKS.md): a lone `%` is encoded too, as a strict receiver refuses it.
    path = _LONE_PERCENT.sub("%25", quote(path, safe="/?=&%:@!$'()*+,;~[]"))
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def webhook_target_resolve(*, url: str) -> Target:
    """Check `url` and every address its host resolves to now (one private answer among
    public ones is refused: the resolver may hand out either); return the target to connect
    to. Raises WebhookEndpointInvalid (malformed) or WebhookTargetRefused (the operator's words)."""
    scheme, host, port, path = _url_parts(url)
    try:
        addresses = _resolve(host, port)
    except (OSError, UnicodeError, ValueError):  # ValueError: a NUL in the name
        raise WebhookTargetRefused(f"{host} does not resolve", param="url") from None
    for ip in addresses:
        _address_check(host=host, ip=ip)
    if not addresses:
        raise WebhookTargetRefused(f"{host} does not resolve", param="url")
    return Target(scheme=scheme, host=host, port=port, path=path, address=str(addresses[0]))


def target_address_check(*, host: str, address: str) -> None:
    """Raise WebhookTargetRefused unless `address` (one `host` resolved to) may be reached
    now: webhooks.transport checks it again as a connection opens its socket."""
    _address_check(host=host, ip=ipaddress.ip_address(address))


def _address_check(*, host: str, ip: IPAddress) -> None:
    reason = address_refusal(ip, allow_loopback=bool(getattr(settings, "TALLY_WEBHOOK_ALLOW_LOOPBACK", False)))
    if reason is not None:
        raise WebhookTargetRefused(f"url must reach a public address; {host} is {reason}", param="url")
