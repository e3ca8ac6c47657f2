"""Where a webhook may be sent: no SSRF (SPEC 8, docs/WEBHOOKS.md "Where deliveries go").

A URL is checked at registration and again before every delivery, against the addresses
its host resolves to at that moment; the delivery then connects to the very address that
was checked (webhooks.transport), so a name that changes its answer between the check
and the connection (DNS rebinding) cannot reach an internal service.

Refused: loopback, private (RFC 1918, ULA), shared (100.64/10), link-local (which holds
the cloud metadata service 169.254.169.254), multicast, unspecified (0.0.0.0 reaches the
local host), reserved and any other non-global address, also when carried inside an
IPv6 address (IPv4-mapped ::ffff:a.b.c.d, NAT64 64:ff9b::/96, 6to4, Teredo). Loopback is
allowed only when settings.TALLY_WEBHOOK_ALLOW_LOOPBACK is true (`make run`, tests).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from django.conf import settings

from webhooks.errors import WebhookEndpointInvalid, WebhookTargetRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class Target:
    """A checked URL: connect to `address`, but speak HTTP(S) to `host` (Host, SNI, certificate)."""

    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent in the request line
    address: str


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def address_refusal(ip: IPAddress, *, allow_loopback: bool) -> str | None:
    """Why `ip` must not be reached, or None if it may."""
    inner = _embedded_ipv4(ip)
    if inner is not None:
        return address_refusal(inner, allow_loopback=allow_loopback)
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return None if allow_loopback else "a loopback address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if ip.is_private:
        return "a private address"
    if not ip.is_global or ip.is_reserved:
        return "not a public address"
    return None


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
    # The request line takes ASCII only: anything else (an accented path, a space) is sent
    # percent-encoded as UTF-8, as browsers do; reserved characters and escapes stay. A `%`
    # that starts no escape is itself encoded: RFC 3986 allows `%` only in an escape, and a
    # strict receiver refuses the request line otherwise.
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


def webhook_target_resolve(*, url: str, unresolvable_ok: bool = False) -> Target | None:
    """Check `url` and the addresses its host resolves to now; return the target to connect to.

    Every resolved address must be allowed (a name with one private answer among public
    ones is refused: the resolver may hand out either). Raises WebhookEndpointInvalid
    for a malformed URL, WebhookTargetRefused for a forbidden target. A name that does not
    resolve returns None if `unresolvable_ok` (registration: it may not be published yet;
    every delivery checks again), else is refused.
    """
    scheme, host, port, path = _url_parts(url)
    try:
        addresses = _resolve(host, port)
    except (OSError, UnicodeError):
        if unresolvable_ok:
            return None
        raise WebhookTargetRefused(f"{host} does not resolve", param="url") from None
    allow_loopback = bool(getattr(settings, "TALLY_WEBHOOK_ALLOW_LOOPBACK", False))
    for ip in addresses:
        reason = address_refusal(ip, allow_loopback=allow_loopback)
        if reason is not None:
            raise WebhookTargetRefused(f"url must reach a public address; {host} is {reason}", param="url")
    if not addresses:
        raise WebhookTargetRefused(f"{host} does not resolve", param="url")
    return Target(scheme=scheme, host=host, port=port, path=path, address=str(addresses[0]))
