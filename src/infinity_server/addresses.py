"""Which addresses a media URL may point at: public ones only, IPv4 embedded in IPv6 included.

An IPv6 address can carry an IPv4 address that a gateway or tunnel will reach on the client's
behalf; such an address is judged by what it embeds as well as by itself:

- IPv4-mapped `::ffff:a.b.c.d` and IPv4-compatible `::a.b.c.d` (deprecated, still routed by some stacks);
- NAT64: the well-known prefix `64:ff9b::/96` (RFC 6052) and the local-use `64:ff9b:1::/48` (RFC 8215),
  the IPv4 address in the last 32 bits;
- 6to4 `2002::/16` (RFC 3056), the IPv4 address in bits 16-47;
- Teredo `2001::/32` (RFC 4380): the server address and the (de-obfuscated) client address.
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def _last_32_bits(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def embedded_ipv4(address: Address) -> tuple[str, tuple[ipaddress.IPv4Address, ...]]:
    """(the form's name, the IPv4 addresses it carries); ("", ()) when it carries none."""
    if isinstance(address, ipaddress.IPv4Address):
        return "", ()
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", (address.ipv4_mapped,)
    if address.sixtofour is not None:
        return "6to4", (address.sixtofour,)
    if address.teredo is not None:
        return "Teredo", address.teredo
    if address in _NAT64 or address in _NAT64_LOCAL:
        return "NAT64", (_last_32_bits(address),)
    if address in _COMPATIBLE and int(address) > 1:  # `::` and `::1` are judged as themselves
        return "IPv4-compatible", (_last_32_bits(address),)
    return "", ()


def _own_reason(address: Address) -> str | None:
    checks = (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local (cloud metadata lives there)", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    )
    found = next((name for name, hit in checks if hit), None)
    if found is None and not address.is_global:
        found = "non-public"
    return found


def refused_reason(address: Address) -> str | None:
    """Why an address may not be fetched from, or None for a public one.

    An address embedding IPv4 is refused for what it embeds first (so the message names the real
    target), then for itself: a NAT64 local-use prefix is never public, whatever it carries.
    """
    form, embedded = embedded_ipv4(address)
    for inner in embedded:
        reason = _own_reason(inner)
        if reason is not None:
            return f"{reason} ({form} form of {inner})"
    if form in ("IPv4-mapped", "NAT64", "6to4"):
        return None if address not in _NAT64_LOCAL else "non-public (NAT64 local-use)"
    return _own_reason(address)
