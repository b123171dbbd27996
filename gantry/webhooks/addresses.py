"""Where a webhook may be sent: the rule, judged at registration and again at every send (DNS may change).

A receiver that resolves to a private, loopback, link-local (cloud metadata),
multicast, reserved or unspecified address is refused, unless
``GANTRY_WEBHOOK_ALLOW_PRIVATE`` is set: otherwise an org admin could make
Gantry's workers call into the network they run in. Every address a name
resolves to must pass (a name with one public and one private address is
refused), and the sender connects to the address judged here, never to a
second resolution of the name.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

from gantry.core.errors import InvalidRequest, WebhookUrlForbidden

SCHEMES = {"http": 80, "https": 443}


def parse(url: str) -> SplitResult:
    """``url`` split, when it is an absolute http(s) URL with a host; InvalidRequest otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidRequest("url is not a valid URL") from None
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise InvalidRequest("url must be an absolute http:// or https:// URL")
    if parts.username or parts.password:
        raise InvalidRequest("url must not carry credentials; the secret signs each delivery")
    del port
    return parts


def forbidden(address: str) -> bool:
    """Whether ``address`` (an IP) is one no webhook may reach without GANTRY_WEBHOOK_ALLOW_PRIVATE."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def resolve(url: str) -> tuple[SplitResult, str]:
    """``url`` split, and the address to connect to: its host's first address, every one of them allowed.

    InvalidRequest for a malformed URL or a name that does not resolve;
    WebhookUrlForbidden for a refused address.
    """
    parts = parse(url)
    host = parts.hostname or ""
    port = parts.port or SCHEMES[parts.scheme]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidRequest(f"url's host {host!r} does not resolve: {exc}") from None
    addresses = [str(info[4][0]) for info in infos]
    if not settings.GANTRY_WEBHOOK_ALLOW_PRIVATE:
        bad = [a for a in addresses if forbidden(a)]
        if bad:
            raise WebhookUrlForbidden(
                f"url's host {host!r} resolves to {bad[0]}, a private, loopback or link-local address; "
                "webhooks go to public addresses only (GANTRY_WEBHOOK_ALLOW_PRIVATE)"
            )
    return parts, addresses[0]
