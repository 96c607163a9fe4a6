"""Transport benchmark: what one message costs on py-libp2p against its floor.

A swarm token crosses four process boundaries over three hops (client, three
servers, client), each one message of about 2.3 KB (a raw float32 hidden
state and its framing). This bench measures the round trip of such a
message between two processes on loopback, echoed by a server process:

  libp2p   a libp2p stream as pnode uses it (`node.net.host.Host`: TCP, Noise,
           pnode's yamux `node.net.yamux.conn`; frames by `node.net.framing`), the
           server echoing each frame;
  py-yamux the same with py-libp2p 0.8.1's own yamux on both hosts (what
           pnode used before `node.net.yamux.conn`);
  lean     the floor of any encrypted, framed channel written in Python on
           trio: one ChaCha20-Poly1305 seal per frame (what Noise's
           transport phase does), a 12-byte header as yamux's and the 4-byte
           frame length, on a plain trio TCP stream; no handshake, a fixed
           key: a measuring stick, never a transport;
  noise    py-libp2p's Noise session alone (its handshake and transport
           phase, as `node.net.host` configures it) on a trio TCP stream, frames
           written straight onto it: no yamux, so the gap between this row
           and the two above is what each muxer costs;
  raw tcp  the same bytes on a plain trio TCP stream (the baseline).

Each is timed back to back and with --gap-ms of sleep between round trips
(a hop waits about that long while the others compute, and a process that
slept pays its wake-ups). The py-yamux row also reports the yamux window
updates the echoing side sent per message read (each one is an extra
encrypted frame and socket write on the reading side before the read
returns; `node.net.yamux.conn` sends one per half window, none here). Kinds
alternate within each repeat; figures are medians.

Usage:  .venv/bin/python bench/transport_bench.py [--messages 300] [--repeats 3]
            [--size 2318] [--gap-ms 20] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import trio  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305  # noqa: E402

from libp2p.crypto.x25519 import create_new_key_pair as noise_key_pair  # noqa: E402
from libp2p.io.trio import TrioTCPStream  # noqa: E402
from libp2p.network.connection.raw_connection import RawConnection  # noqa: E402
from libp2p.peer.id import ID  # noqa: E402
from libp2p.security.noise.transport import Transport as NoiseTransport  # noqa: E402
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream  # noqa: E402
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX, Yamux  # noqa: E402

import benchkit  # noqa: E402
from node.net.framing import FrameReader, write_frame  # noqa: E402
from node.net.host import Host  # noqa: E402
from node.net.identity import PeerIdentity  # noqa: E402

PROTOCOL = "/pnode/bench-echo/1.0.0"
KINDS = ("libp2p", "py-yamux", "noise", "lean", "raw tcp")
MAX_FRAME = 1 << 20


class LeanChannel:
    """Length-prefixed ChaCha20-Poly1305 frames on a trio stream (see module docstring)."""

    def __init__(self, stream: trio.abc.Stream):
        self.stream, self.buffer = stream, bytearray()
        self.aead = ChaCha20Poly1305(b"\x07" * 32)
        self.sent = self.received = 0

    async def send(self, payload: bytes) -> None:
        header = struct.pack(">BBHII", 0, 0, 0, 1, len(payload) + 4)  # yamux's layout
        body = header + struct.pack(">I", len(payload)) + payload
        sealed = self.aead.encrypt(self.sent.to_bytes(12, "little"), body, None)
        self.sent += 1
        await self.stream.send_all(struct.pack(">H", len(sealed)) + sealed)

    async def receive(self) -> bytes:
        while (sealed := take_frame(self.buffer, ">H")) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError
            self.buffer += data
        body = self.aead.decrypt(self.received.to_bytes(12, "little"), sealed, None)
        self.received += 1
        return body[16:]


def take_frame(buffer: bytearray, prefix: str) -> bytes | None:
    """The first length-prefixed frame's body, cut from ``buffer``; None while incomplete."""
    start = struct.calcsize(prefix)
    if len(buffer) < start:
        return None
    (size,) = struct.unpack_from(prefix, buffer)
    if len(buffer) < start + size:
        return None
    body = bytes(buffer[start:start + size])
    del buffer[:start + size]
    return body


class NoiseFrames:
    """4-byte length-prefixed frames written straight onto a py-libp2p Noise session."""

    def __init__(self, session):
        self.session, self.buffer = session, bytearray()

    async def send(self, payload: bytes) -> None:
        await self.session.write(struct.pack(">I", len(payload)) + payload)

    async def receive(self) -> bytes:
        while (payload := take_frame(self.buffer, ">I")) is None:
            self.buffer += await self.session.read(None)  # one Noise message
        return payload


def with_py_libp2p_yamux(host: Host) -> Host:
    """``host``, made to negotiate py-libp2p's own yamux instead of `node.net.yamux.conn`."""
    upgrader = host._host.get_network().upgrader
    upgrader.muxer_multistream = MuxerMultistream({YAMUX: Yamux})
    return host


def noise_transport(identity: PeerIdentity) -> NoiseTransport:
    return NoiseTransport(identity.key_pair, noise_privkey=noise_key_pair().private_key)


# -- the echo server (a process of its own) ----------------------------------

async def serve(info_path: str) -> None:
    """Echo on all three transports; write their addresses; print counters per stream."""
    async def libp2p_echo(stream) -> None:
        reader, reads = FrameReader(stream), 0
        try:
            while True:
                await write_frame(stream, await reader.read_frame(MAX_FRAME))
                reads += 1
        except Exception:  # the client closed the stream
            pass
        muxed = stream.muxed_stream
        if not isinstance(muxed.muxed_conn, Yamux):
            return  # node.net.yamux.conn keeps no counters (and sends no update here)
        updates = sum(v for k, v in vars(muxed).items()
                      if k.startswith("_window_update_") and k != "_window_update_hysteresis_skips")
        print(json.dumps({"reads": reads, "window_updates": updates}), flush=True)

    async def lean_echo(stream) -> None:
        channel = LeanChannel(stream)
        try:
            while True:
                await channel.send(await channel.receive())
        except (EOFError, trio.BrokenResourceError):
            pass

    identity = PeerIdentity.from_seed(b"s" * 32)
    noise = noise_transport(identity)

    async def noise_echo(stream) -> None:
        session = await noise.secure_inbound(RawConnection(TrioTCPStream(stream), False))
        frames = NoiseFrames(session)
        try:
            while True:
                await frames.send(await frames.receive())
        except Exception:  # the client closed the connection
            pass

    async def raw_echo(stream) -> None:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        host = await nursery.start(Host(identity).run)
        host._host.set_stream_handler(PROTOCOL, libp2p_echo)
        py_host = await nursery.start(with_py_libp2p_yamux(Host(identity)).run)
        py_host._host.set_stream_handler(PROTOCOL, libp2p_echo)
        ports = {}
        for kind, handler in (("noise", noise_echo), ("lean", lean_echo), ("raw tcp", raw_echo)):
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            nursery.start_soon(trio.serve_listeners, handler, listeners)
            ports[kind] = listeners[0].socket.getsockname()[1]
        Path(info_path).write_text(json.dumps({
            "libp2p": host.addrs[0], "py-yamux": py_host.addrs[0],
            "peer_id": str(host.peer_id), "ports": ports}))


# -- the client (this process) ------------------------------------------------

async def time_round_trips(send, receive, payload: bytes, n: int, gap: float) -> float:
    """Median seconds of n round trips, ``gap`` seconds of sleep between them."""
    times = []
    for _ in range(n + 10):
        start = time.perf_counter()
        await send(payload)
        assert await receive() == payload
        times.append(time.perf_counter() - start)
        if gap:
            await trio.sleep(gap)
    return statistics.median(times[10:])  # the first few warm the path


async def measure(info: dict, kind: str, hosts: dict[str, Host], payload: bytes, n: int,
                  gap: float) -> float:
    if kind in hosts:
        host = hosts[kind]
        peer = await host.connect(info[kind])
        stream = await host.open_stream(peer, PROTOCOL)
        reader = FrameReader(stream)
        try:
            return await time_round_trips(lambda p: write_frame(stream, p),
                                          lambda: reader.read_frame(MAX_FRAME), payload, n, gap)
        finally:
            await stream.close()
    tcp = await trio.open_tcp_stream("127.0.0.1", info["ports"][kind])
    async with tcp:
        if kind == "noise":
            noise = noise_transport(PeerIdentity.from_seed(b"c" * 32))
            session = await noise.secure_outbound(RawConnection(TrioTCPStream(tcp), True),
                                                  ID.from_base58(info["peer_id"]))
            frames = NoiseFrames(session)
            return await time_round_trips(frames.send, frames.receive, payload, n, gap)
        if kind == "lean":
            channel = LeanChannel(tcp)
            return await time_round_trips(channel.send, channel.receive, payload, n, gap)

        async def receive_raw() -> bytes:
            data = b""
            while len(data) < len(payload):
                data += await tcp.receive_some(65536)
            return data
        return await time_round_trips(tcp.send_all, receive_raw, payload, n, gap)


async def run_client(info: dict, args) -> dict:
    payload = os.urandom(args.size)
    results: dict[tuple[str, float], list[float]] = {}
    async with trio.open_nursery() as nursery:
        identity = PeerIdentity.from_seed(b"c" * 32)
        hosts = {"libp2p": await nursery.start(Host(identity).run),
                 "py-yamux": await nursery.start(with_py_libp2p_yamux(Host(identity)).run)}
        for r in range(args.repeats):
            for gap in (0.0, args.gap_ms / 1000):
                for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
                    rtt = await measure(info, kind, hosts, payload, args.messages, gap)
                    results.setdefault((kind, gap), []).append(rtt)
            print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
        for host in hosts.values():
            host.stop()
        nursery.cancel_scope.cancel()
    return {f"{kind}|{gap}": statistics.median(v) for (kind, gap), v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=2318, help="payload bytes (default: "
                        "a raw hidden state of dim 576 with its step header)")
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", metavar="INFO_FILE", help=argparse.SUPPRESS)
    args = benchkit.parse_args(parser, {"messages": 5, "repeats": 1, "gap_ms": 1.0})
    if args.serve:
        trio.run(serve, args.serve)
        return
    info_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"transport-bench-{os.getpid()}.json"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(info_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        while not info_path.exists() or not info_path.read_text():
            if server.poll() is not None:
                sys.exit("the echo server exited before it listened")
            time.sleep(0.1)
        medians = trio.run(run_client, json.loads(info_path.read_text()), args)
    finally:
        server.terminate()
        counters = [json.loads(line) for line in server.communicate(timeout=30)[0].splitlines()
                    if line.startswith("{")]
        info_path.unlink(missing_ok=True)
    reads = sum(c["reads"] for c in counters)
    updates_per_read = sum(c["window_updates"] for c in counters) / max(reads, 1)
    table = {}
    for gap in (0.0, args.gap_ms / 1000):
        base = medians[f"raw tcp|{gap}"]
        for kind in KINDS:
            rtt = medians[f"{kind}|{gap}"]
            table[f"{kind}, gap {gap * 1000:g} ms"] = {"rtt_ms": 1000 * rtt, "vs_raw": rtt / base}

    def show() -> None:
        print(f"round trip of a {args.size}-byte message between two processes on loopback "
              f"({args.messages} x {args.repeats}, medians)")
        print(f"{'transport':<26}{'rtt ms':>9}{'vs raw tcp':>12}")
        for name, row in table.items():
            print(f"{name:<26}{row['rtt_ms']:>9.3f}{row['vs_raw']:>11.2f}x")
        print(f"py-libp2p yamux window updates sent by the echoing side: {updates_per_read:.2f} "
              f"per read")
    benchkit.report(args, {"size": args.size, "rows": table,
                           "yamux_window_updates_per_read": updates_per_read}, show, indent=None)


if __name__ == "__main__":
    main()
