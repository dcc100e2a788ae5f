"""Whether a host is this machine: the one loopback check of the client and the collector.

Standard library only, so that the collector can use it without importing the client's modules.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_localhost_name", "is_loopback"]


def _bare(host: str) -> str:
    """``host`` in lower case without the brackets of an IPv6 literal or the trailing dot of a name."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        return name[1:-1]
    return name[:-1] if name.endswith(".") else name


def is_localhost_name(host: str) -> bool:
    """``localhost`` or a name under it (``collector.localhost``), in any case, with or without a trailing dot.

    RFC 6761 reserves these names for loopback: the flusher connects to them on 127.0.0.1 (then ``::1``)
    without asking any resolver, so they never reach DNS (or a proxy).
    """
    name = _bare(host)
    return name == "localhost" or name.endswith(".localhost")


def is_loopback(host: str, *, localhost_names: bool = False) -> bool:
    """Whether ``host`` is this machine: the name ``localhost``, or an address in 127.0.0.0/8, ``::1`` or
    ``::ffff:127.0.0.0/104``, with or without the brackets of an IPv6 literal.

    IPv4-mapped addresses are checked explicitly: :mod:`ipaddress` calls them loopback only from Python 3.13 on.

    ``localhost_names`` also accepts every :func:`is_localhost_name` (``collector.localhost``, ``LOCALHOST.``),
    and an address with a name's trailing dot: the client's rule (plain ``http://`` only to such a host, and
    never through a proxy), as the client connects to such names on the loopback addresses itself. The collector
    leaves it false: it hands a host to the system resolver (to bind, to forward to GA4 through urllib3), where
    only ``localhost`` itself is this machine for certain (the hosts file).
    """
    if localhost_names:
        if is_localhost_name(host):
            return True
        literal = _bare(host)
    else:
        if host == "localhost":
            return True
        literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
