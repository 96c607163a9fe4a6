"""The swarm as real processes: `pnode start --layers` servers, `pwallet infer --peers` clients.

Each server is its own `pnode start` process on 127.0.0.1 holding a span of
SmolLM2's 30 layers; the reference is the whole model run in this process.
Every process is killed at teardown (the `spawn` fixture).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from compute.generate import generate
from tests.node.netkit import run
from tests.node.prockit import live_status, node_addr, wait_for
from wallet.client import InferRequest
from wallet.client.remote import ClientParts, open_remote

PROMPT = "Write a short poem about the sea."
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def servers(tmp_path, pnode, spawn):
    """Start one `pnode start --layers A:B` per span; returns [(proc, addr, span)]."""
    first = tmp_path / "n0"
    r = pnode("init", "--no-job", "--data-dir", str(first), "--chain-id", "t-serve")
    assert r.code == 0, r.err

    def start(spans, *extra):
        """The first server, then all the others at once (they start in parallel)."""
        out, procs = [], []
        for i, (a, b) in enumerate(spans):
            d = tmp_path / f"n{i}"
            if i:
                r = pnode("init", "--data-dir", str(d), "--genesis", str(first / "genesis.json"))
                assert r.code == 0, r.err
            peers = ["--peers", node_addr(first, procs[0], 60)] if i else []
            proc, _, _ = spawn(f"n{i}", "--data-dir", str(d), "--layers", f"{a}:{b}",
                               "--no-produce", *peers, *extra)
            procs.append(proc)
        for i, (proc, span) in enumerate(zip(procs, spans)):
            out.append((proc, node_addr(tmp_path / f"n{i}", proc, 60), span))
        return out
    return start


@pytest.fixture(scope="module")
def local_tokens(smol, smol_tokenizer):
    def tokens(prompt: str, n: int, *, raw: bool) -> list[int]:
        ids = (smol_tokenizer.encode(prompt) if raw else
               smol_tokenizer.encode_chat([{"role": "user", "content": prompt}]))
        return generate(smol, ids, n, stop_ids=smol_tokenizer.stop_ids)
    return tokens


def client_parts(reader, tokenizer) -> ClientParts:
    """A client's embeddings/head, from the session's shared GGUF reader."""
    from compute.gguf import load_gguf, model_id
    return ClientParts(load_gguf(reader=reader, layers=range(0)), tokenizer, model_id(reader))


async def until_announced(client, count: int) -> None:
    """Refresh the client's view until ``count`` servers are in it (20 s at most)."""
    with trio.fail_after(20):
        while len(client.servers()) < count:
            await trio.sleep(0.3)
            await client.refresh()


def test_pwallet_over_three_server_processes_equals_local_and_keeps_to_trusted_peers(
        servers, pwallet, pnode, tmp_path, local_tokens):
    """One 3-server swarm (starting one costs most of this test) for both checks."""
    nodes = servers([(0, 10), (10, 20), (20, 30)])
    status = wait_for(lambda: (s := live_status(pnode, tmp_path / "n0"))["swarm"][2:] and s,
                      "announcements of all three to reach the first node", limit=20)
    assert status["serving"] == [0, 10] and status["sessions"] == 0
    assert sorted(tuple(a["layers"]) for a in status["swarm"]) == [(0, 10), (10, 20), (20, 30)]
    # Only n0 is registered (at genesis): the others' wallets were never funded.
    r = pwallet("infer", PROMPT, "--peers", nodes[0][1], "--allow-unregistered", "--raw",
                "--greedy", "--max-tokens", "16", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["token_ids"] == local_tokens(PROMPT, 16, raw=True)
    peer_ids = [addr.rsplit("/p2p/", 1)[1] for _, addr, _ in nodes]
    assert [(h["peer_id"], h["start"], h["end"]) for h in doc["route"]] == [
        (p, a, b) for p, (_, _, (a, b)) in zip(peer_ids, nodes)]
    assert doc["failovers"] == 0 and doc["wire_bytes"] > 0
    local = pwallet("infer", PROMPT, "--local", "--raw", "--greedy", "--max-tokens", "16",
                    "--json")
    assert local.code == 0, local.err
    assert {k: doc[k] for k in ("token_ids", "text")} == local.json()
    trusted_peers_that_cannot_cover_the_model_fail_clearly(nodes, pwallet, tmp_path)
    ctrl_c_mid_generation_says_interrupted(nodes[0][1])


def ctrl_c_mid_generation_says_interrupted(addr: str) -> None:
    """SIGINT while tokens stream: one line and exit 130, not a trio traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from wallet.cli import main; main()", "infer",
         "The history of the Roman Empire", "--peers", addr, "--allow-unregistered", "--raw",
         "--greedy", "--max-tokens", "400"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.read(1), "no token streamed"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().endswith("interrupted") and "Traceback" not in err


def test_kill_9_then_a_stall_mid_generation_and_spare_servers_take_over(
        servers, gguf_reader, smol_tokenizer, local_tokens):
    """Two faults, one swarm (starting servers costs most of this test).

    1. kill -9 of the server for layers 10..19 during a 32-token generation:
       the fourth server covers them; other clients stop routing to the dead
       one within seconds.
    2. SIGSTOP (a real stall: the connection stays up, nothing answers) of
       the server for 20..29 during the next generation: the hop before
       pushes into it (push routing, the default) and still answers, the
       client blames the silent one after the step timeout, and the fifth
       server takes over; other clients stop routing to the silent one.
    """
    nodes = servers([(0, 10), (10, 20), (20, 30), (10, 20), (20, 30)])
    parts = client_parts(gguf_reader, smol_tokenizer)
    by_peer = {addr.rsplit("/p2p/", 1)[1]: proc for proc, addr, _ in nodes}
    faults: list[tuple[str, float]] = []
    times: dict[str, list[float]] = {"kill": [], "stall": []}

    def fault_at(client, name: str, nth: int, start: int, sig: int):
        def on_token(token) -> None:
            times[name].append(time.monotonic())
            if len(times[name]) == nth:
                victim = [hop.peer_id for hop in client.route if hop.start == start][0]
                os.kill(by_peer[victim].pid, sig)
                faults.append((victim, time.monotonic()))
        return on_token

    async def main():
        async with open_remote([nodes[0][1]], parts) as client:
            await until_announced(client, 5)
            killed = await client.generate(InferRequest(PROMPT, max_tokens=32),
                                           fault_at(client, "kill", 5, 10, signal.SIGKILL))
        async with open_remote([nodes[0][1]], parts) as other:
            # Other clients stop routing to the dead server promptly: the node
            # that was connected to it drops its announcement on disconnect.
            with trio.fail_after(5):
                while faults[0][0] in {s.peer_id for s in other.servers()}:
                    await trio.sleep(0.2)
                    await other.refresh()
            stalled = await other.generate(InferRequest(PROMPT, max_tokens=12),
                                           fault_at(other, "stall", 3, 20, signal.SIGSTOP))
        # Nor to the stalled one (still stopped, its connections open): its
        # neighbours drop it when it stops answering pings, long before its
        # last announcement's TTL (25 s) runs out.
        with trio.fail_after(8):
            while True:
                async with open_remote([nodes[0][1]], parts) as third:
                    if faults[1][0] not in {s.peer_id for s in third.servers()}:
                        break
                await trio.sleep(0.5)
        return killed, stalled

    results = []

    async def wrapper():
        results.extend(await main())
    try:
        run(wrapper, deadline=150)
    finally:
        for proc in by_peer.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
    killed, stalled = results
    assert killed.token_ids == local_tokens(PROMPT, 32, raw=False)
    assert len(killed.token_ids) == 32 and killed.failovers == 1
    victim = faults[0][0]
    spans = [(s.peer_id, s.start, s.end, s.failed) for s in killed.route]
    assert (victim, 10, 20, True) in spans
    heir = [s for s in killed.route if s.start == 10 and not s.failed]
    assert len(heir) == 1 and heir[0].peer_id != victim
    # The token after the kill came within seconds (no long request timeout).
    assert times["kill"][5] - faults[0][1] < 10

    assert stalled.token_ids == local_tokens(PROMPT, 12, raw=False)
    assert stalled.failovers == 1
    silent = faults[1][0]
    assert [(s.start, s.failed) for s in stalled.route if s.peer_id == silent] == [(20, True)]
    assert sorted((s.start, s.failed) for s in stalled.route if s.peer_id != silent) == [
        (0, False), (10, False), (20, False)]
    # Noticed by the step timeout (5 s + a little per position), not a long one.
    assert 5 <= times["stall"][3] - times["stall"][2] < 15


def trusted_peers_that_cannot_cover_the_model_fail_clearly(nodes, pwallet, tmp_path) -> None:
    trusted = tmp_path / "trusted.txt"
    trusted.write_text(f"# friends\n{nodes[0][1]}\n{nodes[2][1].rsplit('/p2p/', 1)[1]}\n")
    r = pwallet("infer", PROMPT, "--peers", nodes[0][1], "--trusted-peers", str(trusted),
                "--allow-unregistered", "--greedy", "--max-tokens", "4", "--json")
    assert r.code == 2
    assert "layer 10" in r.err and "only trusted peers" in r.err
    trusted.write_text("\n".join(addr for _, addr, _ in nodes))
    r = pwallet("infer", PROMPT, "--peers", nodes[0][1], "--trusted-peers", str(trusted),
                "--allow-unregistered", "--greedy", "--max-tokens", "4", "--no-push",
                "--json")  # client-driven
    assert r.code == 0, r.err
    assert [h["start"] for h in r.json()["route"]] == [0, 10, 20] and r.json()["failovers"] == 0
    bad = tmp_path / "bad.txt"
    bad.write_text("not-a-peer-id!\n")
    r = pwallet("infer", PROMPT, "--peers", nodes[0][1], "--trusted-peers", str(bad))
    assert r.code == 2 and "bad.txt:1" in r.err
