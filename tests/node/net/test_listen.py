"""A taken listen port is an error, not a port shared with SO_REUSEPORT (node.net.listen)."""

from __future__ import annotations

import socket

import multiaddr
import pytest
import trio

from node.net import AddressInUse, check_port_free, open_host
from tests.node.netkit import ident, run


def held_port(reuseport: bool) -> socket.socket:
    """A listening socket on a free 127.0.0.1 port (as py-libp2p's listener, if ``reuseport``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("reuseport", [True, False])
def test_a_held_port_is_refused_with_what_to_do(reuseport):
    with held_port(reuseport) as sock:
        port = sock.getsockname()[1]
        with pytest.raises(AddressInUse, match=f"port {port} is in use .*tcp/0 for any free one"):
            check_port_free(multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"))
    check_port_free(multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"))  # closed: free again


def test_port_zero_and_a_free_port_pass():
    check_port_free(multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0"))
    with held_port(False) as sock:
        port = sock.getsockname()[1]
    check_port_free(multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}"))


def test_a_second_host_on_a_first_hosts_port_fails_and_the_first_keeps_it():
    """Without the check, py-libp2p's second listener would bind the port too."""
    async def main():
        async with open_host(ident(1)) as first:
            port = multiaddr.Multiaddr(str(first.addrs[0])).value_for_protocol("tcp")
            with pytest.raises(AddressInUse):
                async with open_host(ident(2), f"/ip4/127.0.0.1/tcp/{port}"):
                    pass
            async with open_host(ident(3)) as third:  # the first still answers on it
                await third.connect(str(first.addrs[0]))
                assert first.peer_id in third.connected_peers()
    run(main, 20)


def test_trio_is_left_clean_after_a_refused_listen():
    async def main():
        with held_port(True) as sock:
            with pytest.raises(AddressInUse):
                async with open_host(ident(4), f"/ip4/127.0.0.1/tcp/{sock.getsockname()[1]}"):
                    pass
        await trio.sleep(0)
    run(main, 10)


def test_a_hosts_addresses_outlive_its_listeners_closing():
    """py-libp2p closes its listening sockets before pubsub stops: a gossip message
    forwarded then reads the addresses from a closed socket (EBADF, which stopped the
    node with an error). A real host's methods answer; the closed socket is the one
    fault a test cannot time, so it is stood in for after two reads."""
    from node.net.listen import keep_addrs_while_closing

    async def main():
        async with open_host(ident(6)) as host:
            listening = host._host.get_addrs()
            assert listening and [str(a) for a in listening] == host.addrs
            cls, calls = type(host._host), {"n": 0}

            class Closing:  # py-libp2p's host, whose listening socket closes after two reads
                def get_addrs(self):
                    return self._read(cls.get_addrs)

                def get_transport_addrs(self):
                    return self._read(cls.get_transport_addrs)

                def _read(self, method):
                    calls["n"] += 1
                    if calls["n"] > 2:
                        raise OSError(9, "Bad file descriptor")
                    return method(host._host)
            closing = Closing()
            keep_addrs_while_closing(closing)
            assert closing.get_addrs() == listening  # read from the socket
            transport = closing.get_transport_addrs()
            assert transport and transport[0] == listening[0].decapsulate("/p2p")
            assert closing.get_addrs() == listening  # the socket closed: the last ones
            assert closing.get_transport_addrs() == transport
            assert calls["n"] == 4
    run(main, 20)
