"""The listen address's port, checked before the host binds it.

py-libp2p's TCP listener (0.8.1) sets SO_REUSEPORT, so a second node told
to listen on a port another node holds binds it too, and the kernel shares
the incoming connections between the two: each node sees half its peers.
`check_port_free` binds the port once without that option first, so a taken
port is a clear error before anything starts.
"""

from __future__ import annotations

import errno
import socket

import multiaddr

from node.net.identity import HostError


class AddressInUse(HostError):
    """The listen address's TCP port is held by another socket (another node?)."""


def check_port_free(listen: multiaddr.Multiaddr) -> None:
    """Raise unless ``listen``'s TCP port can be bound by this process alone.

    Port 0 (any free port) and addresses without ``/tcp`` pass. The probe
    socket sets SO_REUSEADDR as listeners do, so a port that only has
    connections in TIME_WAIT from a node that just stopped is free.

    Raises:
        AddressInUse: the port is taken; the message says how to pick another.
    """
    try:
        port = int(listen.value_for_protocol("tcp"))
    except Exception:  # no /tcp: nothing to check here
        return
    if port == 0:
        return
    family, host = socket.AF_INET, "0.0.0.0"
    for proto, fam in (("ip4", socket.AF_INET), ("ip6", socket.AF_INET6)):
        try:
            host, family = listen.value_for_protocol(proto), fam
            break
        except Exception:
            continue
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise HostError(f"cannot listen on {listen}: {exc.strerror}") from None
            raise AddressInUse(
                f"cannot listen on {listen}: port {port} is in use (another node?); choose "
                f"another port, or tcp/0 for any free one") from None


def keep_addrs_while_closing(host) -> None:
    """Make ``host.get_addrs()`` (and ``get_transport_addrs()``) answer their last addresses
    while the host's listeners close.

    py-libp2p (0.8.1) reads the addresses from the listening sockets each time
    and closes those sockets before it stops pubsub: a gossip message
    forwarded in that window asks for them (to sign its peer record) and gets
    ``OSError: [Errno 9] Bad file descriptor``, which then stops the node with
    that error instead of a clean exit.

    Args:
        host: a py-libp2p ``BasicHost`` (its methods are wrapped on the instance).
    """
    for name in ("get_addrs", "get_transport_addrs"):
        setattr(host, name, _last_when_closed(getattr(host, name)))


def _last_when_closed(read_addrs):
    last: list[multiaddr.Multiaddr] = []

    def addrs() -> list[multiaddr.Multiaddr]:
        try:
            last[:] = read_addrs()
        except OSError:  # a listener closed under us: the host is going down
            pass
        return list(last)
    return addrs
