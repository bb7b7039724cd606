"""Which addresses a media URL may point at: public ones only, IPv4 embedded in IPv6 included.

An IPv6 address can carry an IPv4 address that a gateway or tunnel will reach on the client's
behalf; such an address is judged by what it embeds as well as by itself:

- IPv4-mapped `::ffff:a.b.c.d` and IPv4-compatible `::a.b.c.d` (deprecated, still routed by some stacks);
- NAT64: the well-known prefix `64:ff9b::/96` (RFC 6052) and the local-use `64:ff9b:1::/48` (RFC 8215),
  the IPv4 address in the last 32 bits;
- 6to4 `2002::/16` (RFC 3056), the IPv4 address in bits 16-47;
- Teredo `2001::/32` (RFC 4380): the server address and the (de-obfuscated) client address;
- ISATAP (RFC 5214): any prefix with the interface identifier `0:5efe:a.b.c.d` or `200:5efe:a.b.c.d`,
  the IPv4 address in the last 32 bits.

Site-local `fec0::/10` (deprecated by RFC 3879, still routed inside some networks) is refused like a
private range; Python's `is_private` and `is_global` do not cover it.
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
#: Forms whose own prefix says nothing about the target: only the IPv4 they carry is judged.
_JUDGED_BY_EMBEDDED = frozenset({"IPv4-mapped", "NAT64", "6to4"})
_ISATAP_MARK = 0x00005EFE
#: The universal/local and group bits of the interface identifier's first octet: either may be set.
_ISATAP_FLAGS = 0x03000000


def _last_32_bits(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)


def _isatap(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    identifier_high = (int(address) >> 32) & 0xFFFFFFFF
    if identifier_high & ~_ISATAP_FLAGS != _ISATAP_MARK:
        return None
    return _last_32_bits(address)


def embedded_ipv4(address: Address) -> tuple[tuple[str, ipaddress.IPv4Address], ...]:
    """Every (form's name, IPv4 address) the address carries; empty when it carries none."""
    if isinstance(address, ipaddress.IPv4Address):
        return ()
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    if address.ipv4_mapped is not None:
        found.append(("IPv4-mapped", address.ipv4_mapped))
    if address.sixtofour is not None:
        found.append(("6to4", address.sixtofour))
    if address.teredo is not None:
        found.extend(("Teredo", inner) for inner in address.teredo)
    if address in _NAT64 or address in _NAT64_LOCAL:
        found.append(("NAT64", _last_32_bits(address)))
    if address in _COMPATIBLE and int(address) > 1:  # `::` and `::1` are judged as themselves
        found.append(("IPv4-compatible", _last_32_bits(address)))
    isatap = _isatap(address)
    if isatap is not None:
        found.append(("ISATAP", isatap))
    return tuple(found)


def _own_reason(address: Address) -> str | None:
    checks = (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local (cloud metadata lives there)", address.is_link_local),
        ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    )
    found = next((name for name, hit in checks if hit), None)
    if found is None and not address.is_global:
        found = "non-public"
    return found


def refused_reason(address: Address, *, detail: bool = True) -> str | None:
    """Why an address may not be fetched from, or None for a public one.

    An address embedding IPv4 is refused for what it embeds first (with `detail`, the message names
    the form and the real target), then for itself: a NAT64 local-use prefix is never public,
    whatever it carries. Without `detail` only the kind of address is given, for a resolved name
    whose addresses the client must not learn.
    """
    embedded = embedded_ipv4(address)
    for form, inner in embedded:
        reason = _own_reason(inner)
        if reason is not None:
            return f"{reason} ({form} form of {inner})" if detail else reason
    if any(form in _JUDGED_BY_EMBEDDED for form, _ in embedded):
        return None if address not in _NAT64_LOCAL else "non-public (NAT64 local-use)"
    return _own_reason(address)
