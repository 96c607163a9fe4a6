"""wallet.client.remote over real hosts on 127.0.0.1, serving the real SmolLM2 in parts.

Servers run in this process (each holds only its layers); the reference is
the whole model run locally. Process-level runs (kill -9) are in
tests/node/serve/test_serve_processes.py.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from compute.generate import generate
from compute.gguf import model_id
from node.clock import now_ms
from node.net.host import open_host
from node.serve.layer_server import LayerServer, ServeConfig
from node.serve.sessions import SessionConfig
from node.serve.swarm import Announcer
from tests.node.netkit import ident, run
from wallet.client import InferRequest
from wallet.errors import NoRoute, RouteBusy, SessionTooLong
from wallet.client.generation import Generation
from wallet.client.remote import ClientConfig, ClientParts, RemoteError, open_remote
from wallet.client.session import RouteRun

PROMPT = "What is the capital of France?"
LONG_PROMPT = "Write a short poem about the sea."


@pytest.fixture(scope="module")
def parts(gguf_reader, smol_tokenizer):
    from compute.gguf import load_gguf
    return ClientParts(load_gguf(reader=gguf_reader, layers=range(0)), smol_tokenizer,
                       model_id(gguf_reader))


@pytest.fixture(scope="module")
def local_tokens(smol, smol_tokenizer):
    def tokens(n: int, prompt: str = PROMPT) -> list[int]:
        ids = smol_tokenizer.encode_chat([{"role": "user", "content": prompt}])
        return generate(smol, ids, n, stop_ids=smol_tokenizer.stop_ids)
    return tokens


async def swarm(stack: AsyncExitStack, reader, spans, configs=None):
    """Servers (seeds 1, 2, ...) of the given spans, all connected to the first.

    Each host gets a nursery of its own for its components, cancelled before
    the host closes (the stack unwinds in reverse).
    """
    hosts, servers = [], []
    for i, span in enumerate(spans, 1):
        host = await stack.enter_async_context(open_host(ident(i)))
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        announcer = Announcer(host, now_ms, interval=0.3)
        server = LayerServer(host, ident(i), announcer, now_ms,
                             ServeConfig(layers=span, sessions=(configs or {}).get(i, SessionConfig())),
                             reader=reader)
        announcer.make_announce = server.announce
        await nursery.start(announcer.run)
        if hosts:
            await host.connect(hosts[0].addrs[0])
        await nursery.start(server.run)
        hosts.append(host)
        servers.append(server)
    await trio.sleep(1.0)  # a few announcement rounds
    return hosts, servers


@pytest.mark.parametrize("push", (False, True))
def test_three_servers_generate_exactly_what_the_local_model_does(gguf_reader, parts,
                                                                  local_tokens, push):
    async def main():
        async with AsyncExitStack() as stack:
            hosts, servers = await swarm(stack, gguf_reader, [(0, 10), (10, 20), (20, 30)])
            async with open_remote([hosts[0].addrs[0]], parts,
                                   config=ClientConfig(push=push)) as client:
                seen = []
                result = await client.generate(InferRequest(PROMPT, max_tokens=16), seen.append)
            assert result.token_ids == local_tokens(16)
            # Pushed: hops 2 and 3 got every step (the prefill, then one per
            # token after the first) from the hop before.
            n = len(result.token_ids)
            pushed = [s.inference.pushed_steps for s in servers]
            assert pushed == ([0, n, n] if push else [0, 0, 0])
            assert [t.id for t in seen] == result.token_ids
            assert [(s.peer_id, s.start, s.end) for s in result.route] == [
                (str(h.peer_id), a, b) for h, (a, b) in zip(hosts, [(0, 10), (10, 20), (20, 30)])]
            assert result.failovers == 0
    run(main, deadline=90)


def test_a_hop_replaced_by_two_servers_and_a_second_failure_inside_the_replacement(
        gguf_reader, parts, local_tokens):
    """B (10..19) dies: D (10..14) + E (15..19) replay its inputs; then D dies: F
    (10..14) replays the inputs D had got from the replay's split outputs.

    Client-driven (``push=False``); failover of pushed routes: the next test
    and the process tests."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (10, 15), (15, 20), (10, 15)]
            hosts, _ = await swarm(stack, gguf_reader, spans)
            by_id = {str(h.peer_id): h for h in hosts}
            async with open_remote([hosts[0].addrs[0]], parts,
                                   config=ClientConfig(push=False)) as client:
                killed: list[tuple[int, int]] = []

                def kill(token) -> None:
                    seen.append(token.id)
                    if len(seen) in (4, 9):
                        hop = [h for h in client.route if h.start == 10][0]
                        killed.append((hop.start, hop.end))
                        by_id[hop.peer_id].stop()
                seen: list[int] = []
                result = await client.generate(InferRequest(LONG_PROMPT, max_tokens=20), kill)
            assert result.token_ids == local_tokens(20, LONG_PROMPT)
            assert result.failovers == 2 and killed == [(10, 20), (10, 15)]
            spans_used = sorted((s.start, s.end, s.failed) for s in result.route)
            assert spans_used == [(0, 10, False), (10, 15, False), (10, 15, True),
                                  (10, 20, True), (15, 20, False), (20, 30, False)]
    run(main, deadline=150)


def stop_hop_after(tokens: int, start: int, client, hosts):
    """An ``on_token`` that stops the route's server for layer ``start`` at token ``tokens``."""
    by_id = {str(h.peer_id): h for h in hosts}
    seen: list[int] = []

    def on_token(token) -> None:
        seen.append(token.id)
        if len(seen) == tokens:
            by_id[[h for h in client.route if h.start == start][0].peer_id].stop()
    return on_token


async def generate_losing_a_hop(entry: str, parts, hosts, *, at: int, start: int,
                                tokens: int):
    """A pushed generation of ``tokens`` whose hop for layer ``start`` stops after ``at``.

    Spot checks off: their checker sessions would add forward calls that
    the callers count (tests/wallet/client/test_spotcheck.py covers them).
    """
    async with open_remote([entry], parts,
                           config=ClientConfig(push=True, spot_check_rate=0.0)) as client:
        kill = stop_hop_after(at, start, client, hosts)
        return await client.generate(InferRequest(PROMPT, max_tokens=tokens), kill)


def test_a_pushed_route_loses_its_last_hop_and_the_client_rebuilds_its_inputs(
        gguf_reader, parts, local_tokens):
    """Linked hops answer only at the end of the chain, so when C (20..29)
    dies the client holds none of its inputs: it replays A's through A and
    B (both rolled back to position 0) and D takes over, bit for bit."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (20, 30)]
            hosts, servers = await swarm(stack, gguf_reader, spans)
            result = await generate_losing_a_hop(hosts[0].addrs[0], parts, hosts,
                                                 at=6, start=20, tokens=12)
            assert result.token_ids == local_tokens(12)
            assert result.failovers == 1
            last = [(s.start, s.failed) for s in result.route if s.start == 20]
            assert sorted(last) == [(20, False), (20, True)]
            # B got its steps pushed until the failure, then from the client.
            assert 0 < servers[1].inference.pushed_steps < 12
    run(main, deadline=120)


def test_a_hop_that_fails_while_rebuilding_inputs_is_replaced_first(
        gguf_reader, parts, local_tokens):
    """Pushed A (0..9), B, C: C dies; while A replays to rebuild C's inputs A
    dies too and becomes A1 (0..4) + A2 (5..9); C is still the one replaced
    after (B, the only server of 10..19, stays)."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (0, 5), (5, 10), (20, 30)]
            hosts, servers = await swarm(stack, gguf_reader, spans)
            a = servers[0].inference
            step_of_a = a._step

            async def dies_on_a_replay(session, step):
                if len(step.chunks) > 1:  # only the client's rebuild replays through A
                    hosts[0].stop()
                    return False
                return await step_of_a(session, step)
            a._step = dies_on_a_replay
            result = await generate_losing_a_hop(hosts[1].addrs[0], parts, hosts,
                                                 at=5, start=20, tokens=10)
            assert result.token_ids == local_tokens(10)
            assert result.failovers == 2
            failed = sorted((s.start, s.end) for s in result.route if s.failed)
            assert failed == [(0, 10), (20, 30)]
            assert [s.failed for s in result.route if s.start == 10] == [False]
    run(main, deadline=120)


def test_trusted_peers_only_and_a_clear_error_when_they_cannot_cover(gguf_reader, parts,
                                                                   local_tokens):
    async def main():
        async with AsyncExitStack() as stack:
            hosts, _ = await swarm(stack, gguf_reader,
                                   [(0, 10), (10, 20), (20, 30), (0, 30)])
            trusted = {str(h.peer_id) for h in hosts[:3]}  # not the whole-model server
            async with open_remote([hosts[0].addrs[0]], parts, trusted=trusted) as client:
                result = await client.generate(InferRequest(PROMPT, max_tokens=8))
            assert result.token_ids == local_tokens(8)
            assert {s.peer_id for s in result.route} == trusted

            only_two = {str(hosts[0].peer_id), str(hosts[2].peer_id)}
            async with open_remote([hosts[0].addrs[0]], parts, trusted=only_two) as client:
                with pytest.raises(NoRoute, match="layer 10 .*only trusted peers"):
                    await client.generate(InferRequest(PROMPT, max_tokens=8))
    run(main, deadline=120)


def test_a_busy_server_is_routed_around(gguf_reader, parts, local_tokens):
    async def main():
        async with AsyncExitStack() as stack:
            one_session = {1: SessionConfig(max_sessions=1), 2: SessionConfig(max_sessions=1)}
            hosts, servers = await swarm(stack, gguf_reader, [(0, 30), (0, 30)], one_session)
            async with open_remote([hosts[0].addrs[0]], parts) as a, \
                    open_remote([hosts[0].addrs[0]], parts) as b:
                results = {}

                async def gen(name, client):
                    results[name] = await client.generate(InferRequest(PROMPT, max_tokens=8))
                async with trio.open_nursery() as clients:
                    clients.start_soon(gen, "a", a)
                    clients.start_soon(gen, "b", b)
            assert results["a"].token_ids == results["b"].token_ids == local_tokens(8)
            # Each server takes one session at a time: the two clients ran on both.
            used = {results["a"].route[0].peer_id, results["b"].route[0].peer_id}
            assert used == {str(h.peer_id) for h in hosts}
    run(main, deadline=120)


def test_a_full_swarm_says_busy_not_uncovered(gguf_reader, parts):
    """The one server of the layers holds its one session: "busy, try again", not "no server"."""
    async def main():
        async with AsyncExitStack() as stack:
            hosts, _ = await swarm(stack, gguf_reader, [(0, 30)],
                                   {1: SessionConfig(max_sessions=1, busy_retry_ms=300)})
            async with open_remote([hosts[0].addrs[0]], parts) as a, \
                    open_remote([hosts[0].addrs[0]], parts,
                                config=ClientConfig(busy_wait=0.2)) as b, \
                    trio.open_nursery() as readers:
                # ``a`` holds the one slot with an open session (a generation could end
                # early at the model's end-of-text token and free it).
                held = RouteRun(a.directory, a.host, a.config, Generation(), 64, readers)
                await held.open(0, 30)
                try:
                    with pytest.raises(RouteBusy, match=r"layer 0 is busy; try again in \d+\.\d s") \
                            as refused:
                        await b.generate(InferRequest(PROMPT, max_tokens=4))
                finally:
                    await held.close()
                    readers.cancel_scope.cancel()
                # The server's hint, or a second when its announcement said it was full.
                assert refused.value.retry_after_ms in (300, 1000)
                assert isinstance(refused.value, NoRoute)
    run(main, deadline=120)


def test_no_reachable_peer_is_a_clear_error(parts):
    async def main():
        with pytest.raises(RemoteError, match="no peer reachable"):
            async with open_remote([f"/ip4/127.0.0.1/tcp/9/p2p/{ident(9).peer_id}"], parts,
                                   config=ClientConfig()):
                pass
    run(main, deadline=60)


def record_calls(server) -> list[int]:
    """The positions of every forward call ``server`` (a `LayerServer`) runs from now on."""
    calls: list[int] = []
    inference = server.inference
    real_run = inference._run

    def traced(session, chunk, pos):
        calls.append(chunk.shape[1])
        return real_run(session, chunk, pos)
    inference._run = traced
    return calls


@pytest.mark.parametrize("push", (False, True))
def test_a_prompt_longer_than_the_chunk_caps_goes_in_chunks_and_is_metered(
        gguf_reader, parts, local_tokens, smol_tokenizer, push):
    """Caps of 16, 8 and 32 positions per call: the 37-token prompt goes in calls of
    8 (the route's smallest cap) through every hop, pushed or not; same tokens."""
    async def main():
        async with AsyncExitStack() as stack:
            caps = {1: SessionConfig(max_chunk_positions=16),
                    2: SessionConfig(max_chunk_positions=8),
                    3: SessionConfig(max_chunk_positions=32)}
            hosts, servers = await swarm(stack, gguf_reader, [(0, 10), (10, 20), (20, 30)],
                                         caps)
            calls = [record_calls(s) for s in servers]
            async with open_remote([hosts[0].addrs[0]], parts,
                                   config=ClientConfig(push=push)) as client:
                result = await client.generate(InferRequest(PROMPT, max_tokens=8))
            assert result.token_ids == local_tokens(8)
            prompt = len(smol_tokenizer.encode_chat([{"role": "user", "content": PROMPT}]))
            assert prompt == 37
            decode = len(result.token_ids) - 1
            for server, made in zip(servers, calls):
                assert made == [8, 8, 8, 8, 5] + [1] * decode
                # Metering: exactly the positions the client sent, one step per token.
                status = server.inference.status()
                assert status["compute"]["positions"] == prompt + decode
                assert status["compute"]["steps"] == 1 + decode
                assert status["refused_steps"] == 0
    run(main, deadline=120)


def test_a_pushed_chunked_route_loses_a_hop_and_replays_within_the_caps(
        gguf_reader, parts, local_tokens):
    """Every server runs at most 8 positions a call: C's replacement D gets the rebuilt
    inputs in the original calls (8, 8, 8, 8, 5, 1, ...), never one longer call."""
    async def main():
        async with AsyncExitStack() as stack:
            spans = [(0, 10), (10, 20), (20, 30), (20, 30)]
            narrow = {i: SessionConfig(max_chunk_positions=8) for i in range(1, 5)}
            hosts, servers = await swarm(stack, gguf_reader, spans, narrow)
            calls = [record_calls(s) for s in servers]
            result = await generate_losing_a_hop(hosts[0].addrs[0], parts, hosts,
                                                 at=4, start=20, tokens=10)
            assert result.token_ids == local_tokens(10)
            assert result.failovers == 1
            assert all(max(made, default=0) <= 8 for made in calls)
            assert all(s.inference.refused_steps == 0 for s in servers)
            # A and B replayed (rolled back to 0) to rebuild the inputs of the new hop.
            assert calls[0][:5] == [8, 8, 8, 8, 5] and calls[0].count(8) == 8
    run(main, deadline=150)


def test_a_generation_longer_than_a_servers_session_cap_is_routed_around_or_refused(
        gguf_reader, parts, local_tokens):
    async def main():
        async with AsyncExitStack() as stack:
            hosts, servers = await swarm(stack, gguf_reader, [(0, 30), (0, 30)],
                                         {1: SessionConfig(max_len=40)})
            short, long = (str(h.peer_id) for h in hosts)
            async with open_remote([hosts[0].addrs[0]], parts) as client:
                assert {s.peer_id: s.max_session_positions for s in client.servers()} == {
                    short: 40, long: 2048}
                result = await client.generate(InferRequest(PROMPT, max_tokens=8))  # 44
            assert result.token_ids == local_tokens(8)
            assert [s.peer_id for s in result.route] == [long]
            async with open_remote([hosts[0].addrs[0]], parts, trusted={short}) as client:
                with pytest.raises(SessionTooLong, match="44 positions .* at most 40") as err:
                    await client.generate(InferRequest(PROMPT, max_tokens=8))
                assert isinstance(err.value, RemoteError)
                # Refused up front: the short server never saw a session.
                assert servers[0].inference.refused_busy == 0
                assert servers[0].inference.compute.steps == 0
                # What fits is served by it.
                fits = await client.generate(InferRequest(PROMPT, max_tokens=4))
                assert fits.token_ids == local_tokens(4)
    run(main, deadline=120)
