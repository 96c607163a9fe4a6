"""node.control: the control socket of a real in-process `Node` on a real data dir.

The node runs under trio in the test; its clients are `control_request` and
raw Unix-socket connections speaking the framing by hand.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys

import pytest
import trio

from ledger.codec import encode
from ledger.crypto import SigningKey
from ledger.tab import Lane, OpenTab
from ledger.types import COIN, ZERO_SIG, Transfer, sign
from node.clock import now_ms
from node.control import (
    MAX_REQUEST, ControlError, ControlServer, NodeNotRunning, control_call, control_request,
)
from node.datadir import DataDir
from node.errors import BadRequest, DataDirError, NodeError
from node.datadir import read_key_file
from node.net.framing import read_frame, write_frame
from node.node import Node, ProduceConfig
from tests.node.netkit import run
from tests.node.prockit import ROOT


@pytest.fixture
def data_dir(tmp_path, pnode):
    d = tmp_path / "n"
    r = pnode("init", "--no-job", "--data-dir", str(d), "--chain-id", "t-control", "--slot-ms", "50")
    assert r.code == 0, r.err
    return d


def wallet_key(d) -> SigningKey:
    return SigningKey(read_key_file(d / "wallet.json", "correct horse"))


class Serving(Node):
    """A node whose status says what it serves (the hook for later components)."""

    def extra_status(self):
        return {"serving": [0, 30], "sessions": 0}


def test_status_account_and_submit_tx(data_dir):
    key = wallet_key(data_dir)
    bob = SigningKey(b"\x05" * 32).public

    async def main():
        node = Serving(data_dir, now_ms, produce=ProduceConfig(enabled=False))
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(node.run)
            status = await control_request(data_dir, "status")
            assert status["ok"] and status["chain_id"] == "t-control" and status["height"] == 0
            assert status["listen"] == addr and addr.endswith(status["peer_id"])
            assert status["address"] == key.public.hex() and status["registered"]
            assert status["layers"] == [0, 30] and status["bond"] == 10 * COIN
            assert (status["peers"], status["misbehaving"], status["mempool"]) == ([], {}, 0)
            assert (status["serving"], status["sessions"]) == ([0, 30], 0)  # the hook
            assert status["producing"] is False and status["jailed_until"] is None

            mine = await control_request(data_dir, "account", address=key.public.hex())
            assert (mine["balance"], mine["nonce"], mine["queued"]) == (990 * COIN, 1, 0)
            tx = sign(Transfer("t-control", key.public, bob, 2 * COIN, 1, ZERO_SIG), key)
            done = await control_request(data_dir, "submit_tx", tx=encode(tx).hex())
            again = await control_request(data_dir, "submit_tx", tx=encode(tx).hex())
            assert done["txid"] == again["txid"]  # a duplicate is no error, queued once
            mine = await control_request(data_dir, "account", address=key.public.hex())
            assert (mine["queued"], mine["next_nonce"]) == (1, 2)
            # A queued tab (no `sender` field) takes the next nonce too.
            node_key = DataDir(data_dir).node_key().public
            tab = sign(OpenTab("t-control", key.public, b"\x5e" * 32, (Lane(node_key, COIN),),
                               40, 2, ZERO_SIG), key)
            await control_request(data_dir, "submit_tx", tx=encode(tab).hex())
            mine = await control_request(data_dir, "account", address=key.public.hex())
            assert (mine["queued"], mine["next_nonce"]) == (2, 3)
            assert (await control_request(data_dir, "status"))["mempool"] == 2
            stale = sign(Transfer("t-control", key.public, bob, COIN, 1, ZERO_SIG), key)
            with pytest.raises(ControlError, match="BadNonce"):
                await control_request(data_dir, "submit_tx", tx=encode(stale).hex())
            nobody = await control_request(data_dir, "account", address=bob.hex())
            assert (nobody["balance"], nobody["nonce"]) == (0, 0)
            nursery.cancel_scope.cancel()
        assert not (data_dir / "node.sock").exists()
        with pytest.raises(NodeNotRunning):
            await control_request(data_dir, "status")
    run(main)


async def ask_raw(path, payload: bytes) -> dict:
    """Send one frame by hand on a fresh connection; the decoded answer."""
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        conn = _Conn(stream)
        await write_frame(conn, payload)
        return json.loads(await read_frame(conn, 1 << 20, timeout=5))


class _Conn:
    def __init__(self, stream):
        self.stream = stream

    async def read(self, n=None):
        return await self.stream.receive_some(n)

    async def write(self, data):
        await self.stream.send_all(data)


@pytest.mark.parametrize("payload, error", [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"op": 5}', "JSON object"),
    (b'{"op": "reboot"}', "unknown op 'reboot'"),
    (b'{"op": "account"}', "address"),
    (b'{"op": "account", "address": "zz"}', "address"),
    (b'{"op": "submit_tx", "tx": 7}', "hex"),
    (b'{"op": "submit_tx", "tx": "0001"}', "DecodeError"),
    # A chain view's bad argument is a `BadRequest` too: answered as its own text.
    (b'{"op": "view", "name": "block", "args": {"height": 7}}', "no block at height 7"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_a_malformed_request_gets_an_error_and_the_node_lives_on(data_dir, payload, error):
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(Node(data_dir, now_ms, produce=ProduceConfig(enabled=False)).run)
            reply = await ask_raw(data_dir / "node.sock", payload)
            assert reply["ok"] is False and error in reply["error"], reply
            assert not reply["error"].startswith("BadRequest"), reply  # the text alone
            assert (await control_request(data_dir, "status"))["height"] == 0
            nursery.cancel_scope.cancel()
    run(main)


def test_a_bad_request_is_answered_with_its_text_and_other_refusals_with_their_type(tmp_path):
    async def bad(args):  # a view's bad argument and an op's are one error
        raise BadRequest('"height" must be a whole number')

    async def refused(args):
        raise DataDirError("the data dir is locked")

    server = ControlServer(tmp_path / "node.sock", {"bad": bad, "refused": refused})
    assert issubclass(BadRequest, NodeError)
    assert trio.run(server.handle, b'{"op": "bad"}') == {
        "ok": False, "error": '"height" must be a whole number'}
    assert trio.run(server.handle, b'{"op": "refused"}') == {
        "ok": False, "error": "DataDirError: the data dir is locked"}


def test_oversize_and_broken_frames_do_not_stop_the_server(tmp_path):
    path = tmp_path / "node.sock"

    async def echo(args):
        return {"echo": args}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(ControlServer(path, {"echo": echo}).run)
            stream = await trio.open_unix_socket(str(path))
            async with stream:  # announces more than the limit: an answer, then hang-up
                await stream.send_all(struct.pack(">I", MAX_REQUEST + 1) + b"{}")
                reply = json.loads(await read_frame(_Conn(stream), 1 << 20, timeout=5))
                assert reply["ok"] is False and "too large" in reply["error"]
            stream = await trio.open_unix_socket(str(path))
            async with stream:  # hangs up inside a frame
                await stream.send_all(struct.pack(">I", 100) + b"{")
            # several requests on one connection, one at a time
            stream = await trio.open_unix_socket(str(path))
            async with stream:
                conn = _Conn(stream)
                for i in range(3):
                    await write_frame(conn, json.dumps({"op": "echo", "n": i}).encode())
                    answer = json.loads(await read_frame(conn, 1 << 20, timeout=5))
                    assert answer == {"ok": True, "echo": {"n": i}}
            nursery.cancel_scope.cancel()
    run(main)


def test_socket_mode_stale_socket_long_path_and_no_node(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "node.sock"
    assert len(str(path)) > 108  # too long for a sockaddr_un: reached via /proc/self/fd
    with pytest.raises(NodeNotRunning):
        control_call(deep, "status")

    async def status(args):
        return {"alive": True}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(ControlServer(path, {"status": status}).run)
            assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600
            assert (await control_request(deep, "status"))["alive"] is True
            with pytest.raises(DataDirError, match="another process"):
                await ControlServer(path, {}).run()
            nursery.cancel_scope.cancel()
        assert not path.exists()
    run(main)

    short = tmp_path / "node.sock"  # a socket file left by a killed node
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short))
    stale.close()
    assert short.is_socket()
    with pytest.raises(NodeNotRunning, match="refused"):
        control_call(tmp_path, "status")

    async def replace_it():
        async with trio.open_nursery() as nursery:
            await nursery.start(ControlServer(short, {"status": status}).run)
            assert (await control_request(tmp_path, "status"))["alive"] is True
            nursery.cancel_scope.cancel()
    run(replace_it)

    short.write_text("not a socket")
    with pytest.raises(DataDirError, match="not a socket"):
        trio.run(ControlServer(short, {}).run)


def test_the_cli_side_of_the_channel_does_not_load_libp2p():
    """`pnode status` / `pwallet balance` stay quick: no libp2p import on their path."""
    code = ("import sys, node.control, node.chain.producer, node.cli, wallet.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'libp2p', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_burst_of_clients_is_queued_and_answered(tmp_path):
    """More clients at once than the old backlog of 16: every one gets its answer."""
    path = tmp_path / "node.sock"

    async def echo(args):
        await trio.sleep(0.01)
        return {"echo": args}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(ControlServer(path, {"echo": echo}).run)
            answers = []

            async def client(i):
                answers.append(await control_request(tmp_path, "echo", n=i))

            async with trio.open_nursery() as clients:
                for i in range(200):
                    clients.start_soon(client, i)
            assert sorted(a["echo"]["n"] for a in answers) == list(range(200))
            nursery.cancel_scope.cancel()
    run(main)


def test_a_request_over_the_limit_is_refused_by_the_client(tmp_path):
    path = tmp_path / "node.sock"

    async def echo(args):
        return {"echo": len(args["blob"])}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(ControlServer(path, {"echo": echo}).run)
            with pytest.raises(ControlError, match="request too large"):
                await control_request(tmp_path, "echo", blob="x" * (MAX_REQUEST + 1))
            assert (await control_request(tmp_path, "echo", blob="x" * 3_000_000))["echo"] \
                == 3_000_000
            nursery.cancel_scope.cancel()
    run(main)
