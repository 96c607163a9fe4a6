"""node.serve.sessions: sessions over real libp2p streams on 127.0.0.1, a tiny random model.

The server's outputs are compared with the same model run in this process
(the reference): a session must compute exactly what `run_layers` computes.
"""

from __future__ import annotations

import struct

import pytest
import torch
import trio

from compute.kvcache import KVCache
from compute.wiretensor import decode_tensor, encode_tensor
from ledger.codec import decode, encode
from node.net.framing import FrameEOF, FramingError, read_frame, write_frame
from node.serve.sessions import InferenceServer, SessionConfig
from node.wire.serve import (
    INFERENCE_PROTOCOL, Busy, Link, OpenSession, SessionAccepted, SessionError, Step, StepResult,
)
from tests.compute.helpers import TINY, tiny_model
from tests.node.netkit import eventually, ident, run

MODEL_ID = "tiny-test-model"


@pytest.fixture(scope="module")
def model():
    return tiny_model(torch.Generator().manual_seed(7))


def hidden(seed: int, t: int) -> torch.Tensor:
    return torch.randn(1, t, TINY.dim, generator=torch.Generator().manual_seed(seed))


async def serving(nursery, model, config=SessionConfig()):
    """A server host with the tiny model's layers 0..1 and a client host, connected."""
    from node.net.host import open_host  # noqa: PLC0415 (kept next to its use)

    server_host = await nursery_enter(nursery, open_host(ident(1)))
    client_host = await nursery_enter(nursery, open_host(ident(2)))
    server = InferenceServer(server_host, model, range(0, 2), MODEL_ID, config=config)
    server.start()
    await client_host.connect(server_host.addrs[0])
    return server, server_host, client_host


async def nursery_enter(stack, cm):
    return await stack.enter_async_context(cm)


async def open_session(client_host, server_host, *, start=0, end=2, max_len=32, codec="raw",
                       model_id=MODEL_ID):
    stream = await client_host.open_stream(server_host.peer_id, INFERENCE_PROTOCOL)
    await write_frame(stream, encode(OpenSession(model_id, start, end, max_len, codec)))
    reply = decode(await read_frame(stream), (SessionAccepted, Busy, SessionError))
    return stream, reply


async def step(stream, x, pos, chunks=(), codec="raw"):
    await write_frame(stream, encode(Step(pos, chunks, encode_tensor(x, codec))))
    reply = decode(await read_frame(stream), (StepResult, SessionError))
    return reply if isinstance(reply, SessionError) else decode_tensor(reply.hidden)


def reference(model, xs):
    """Incremental run_layers over the chunks xs, as a session would."""
    cache = KVCache(TINY, 32)
    with torch.inference_mode():
        return [model.run_layers(x, 0, 2, cache=cache) for x in xs]


def with_hosts(body, deadline: float = 20.0):
    from contextlib import AsyncExitStack

    async def main():
        async with AsyncExitStack() as stack:
            await body(stack)
    run(main, deadline)


def test_session_equals_local_run_step_by_step(model):
    xs = [hidden(1, 5), hidden(2, 1), hidden(3, 1)]
    want = reference(model, xs)

    async def body(stack):
        server, sh, ch = await serving(stack, model)
        stream, reply = await open_session(ch, sh)
        assert isinstance(reply, SessionAccepted) and reply.max_len == 32 and len(reply.token) == 32
        assert server.status()["sessions"] == 1
        pos = 0
        for x, w in zip(xs, want):
            got = await step(stream, x, pos)
            assert torch.equal(got, w)
            pos += x.shape[1]
        await stream.close()
        await eventually(lambda: not server.sessions, "the session to close")
        assert server.served_tokens == 7
    with_hosts(body)


def test_replay_in_original_chunks_rebuilds_a_bit_identical_cache(model):
    """A replacement server given the kept inputs in their chunks continues exactly."""
    xs = [hidden(1, 6), hidden(2, 1), hidden(3, 1), hidden(4, 1)]
    want = reference(model, xs)

    async def body(stack):
        _, sh, ch = await serving(stack, model)
        stream, _ = await open_session(ch, sh)
        replay = torch.cat(xs[:3], dim=1)
        got = await step(stream, replay, 0, chunks=(6, 1, 1))
        assert torch.equal(got, torch.cat(want[:3], dim=1))
        assert torch.equal(await step(stream, xs[3], 8), want[3])
    with_hosts(body)


def test_sub_span_session_runs_only_its_layers(model):
    x = hidden(5, 3)
    with torch.inference_mode():
        want = model.run_layers(x, 1, 2, cache=KVCache(TINY, 8, layers=range(1, 2)))

    async def body(stack):
        _, sh, ch = await serving(stack, model)
        stream, reply = await open_session(ch, sh, start=1, end=2, max_len=8)
        assert isinstance(reply, SessionAccepted)
        assert torch.equal(await step(stream, x, 0), want)
    with_hosts(body)


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_outputs_come_back_in_the_sessions_codec(model, codec):
    x = hidden(6, 4)
    (want,) = reference(model, [x])

    async def body(stack):
        _, sh, ch = await serving(stack, model)
        stream, _ = await open_session(ch, sh, codec=codec)
        await write_frame(stream, encode(Step(0, (), encode_tensor(x, "raw"))))
        reply = decode(await read_frame(stream), StepResult)
        # Exactly the reference's output, put through the codec: no other loss.
        assert reply.hidden == encode_tensor(want, codec)
        assert len(reply.hidden) < len(encode_tensor(want, "raw"))
    with_hosts(body)


@pytest.mark.parametrize("request_, says", [
    (dict(model_id="another-model"), "serves model"),
    (dict(start=1, end=3), "holds layers 0..1"),
    (dict(codec="fp8"), "unknown codec"),
    (dict(max_len=4096), "at most"),
])
def test_refused_sessions_say_why(model, request_, says):
    async def body(stack):
        server, sh, ch = await serving(stack, model)
        stream, reply = await open_session(ch, sh, **request_)
        assert isinstance(reply, SessionError) and says in reply.reason
        with pytest.raises(FrameEOF):
            await read_frame(stream)
        assert not server.sessions and not sh.misbehaving
    with_hosts(body)


@pytest.mark.parametrize("bad_step, says", [
    (lambda x: Step(3, (), encode_tensor(x)), "position 3"),
    (lambda x: Step(0, (2, 2), encode_tensor(x)), "chunks sum"),
    (lambda x: Step(0, (), encode_tensor(x[:, :, :8])), "expected hidden states"),
    (lambda x: Step(30, (), encode_tensor(x)), "position 30"),
    (lambda x: Step(0, (), b"\x00garbage"), "bad hidden states"),
])
def test_bad_steps_end_the_session_with_a_reason(model, bad_step, says):
    async def body(stack):
        server, sh, ch = await serving(stack, model)
        stream, _ = await open_session(ch, sh, max_len=32)
        await write_frame(stream, encode(bad_step(hidden(1, 3))))
        reply = decode(await read_frame(stream), SessionError)
        assert says in reply.reason
        await eventually(lambda: not server.sessions, "the session to be dropped")
    with_hosts(body)


def test_budget_is_enforced_before_any_work(model):
    async def body(stack):
        server, sh, ch = await serving(stack, model)
        stream, _ = await open_session(ch, sh, max_len=4)
        got = await step(stream, hidden(1, 5), 0)
        # The decoder's `TooManyElements`, told from garbage by its type:
        assert isinstance(got, SessionError), got
        assert got.reason.startswith("step past the session budget of 4 positions"), got.reason
        assert server.served_tokens == 0
    with_hosts(body)


def test_a_full_server_answers_busy_with_a_retry_hint(model):
    # One client fills the server: its own limit must not be what refuses it here.
    config = SessionConfig(max_sessions=2, max_sessions_per_peer=2, busy_retry_ms=750)

    async def body(stack):
        server, sh, ch = await serving(stack, model, config)
        first = [await open_session(ch, sh) for _ in range(2)]
        assert all(isinstance(r, SessionAccepted) for _, r in first)
        _, reply = await open_session(ch, sh)
        assert reply.retry_after_ms == 750 and isinstance(reply, Busy)
        assert reply.reason == "2 sessions open"  # `ServerFull`: not this client's limit
        assert server.refused_busy == 1 and server.refused_limit == 0
        await first[0][0].close()
        await eventually(lambda: len(server.sessions) == 1, "a slot to free")
        _, again = await open_session(ch, sh)
        assert isinstance(again, SessionAccepted)
    with_hosts(body)


def test_concurrent_sessions_each_get_their_own_cache(model):
    """Interleaved steps of two sessions give each the result of running alone."""
    a = [hidden(10, 4), hidden(11, 1), hidden(12, 1)]
    b = [hidden(20, 2), hidden(21, 1), hidden(22, 1)]
    want_a, want_b = reference(model, a), reference(model, b)

    async def body(stack):
        _, sh, ch = await serving(stack, model)
        sa, _ = await open_session(ch, sh)
        sb, _ = await open_session(ch, sh)
        got: dict[str, list] = {"a": [], "b": []}

        async def drive(name, stream, xs):
            pos = 0
            for x in xs:
                got[name].append(await step(stream, x, pos))
                pos += x.shape[1]
        async with trio.open_nursery() as n:
            n.start_soon(drive, "a", sa, a)
            n.start_soon(drive, "b", sb, b)
        assert all(torch.equal(g, w) for g, w in zip(got["a"], want_a))
        assert all(torch.equal(g, w) for g, w in zip(got["b"], want_b))
    with_hosts(body)


@pytest.mark.parametrize("payload", [
    b"not msgpack at all",
    struct.pack(">I", 2**31) + b"x",  # an absurd length prefix, sent raw
])
def test_garbage_first_frame_resets_the_stream_and_scores_the_peer(model, payload):
    async def body(stack):
        server, sh, ch = await serving(stack, model)
        stream = await ch.open_stream(sh.peer_id, INFERENCE_PROTOCOL)
        if payload.startswith(b"not"):
            await write_frame(stream, payload)
        else:
            await stream.write(payload)
        with pytest.raises(FramingError):
            await read_frame(stream)
        await eventually(lambda: sh.misbehaving.get(ch.peer_id, 0) >= 1, "a misbehaviour point")
        # ... and the server goes on serving everyone.
        stream2, reply = await open_session(ch, sh)
        assert isinstance(reply, SessionAccepted)
        assert not server.sessions or len(server.sessions) == 1
    with_hosts(body)


def test_an_idle_session_is_closed_and_its_cache_freed(model):
    async def body(stack):
        server, sh, ch = await serving(stack, model, SessionConfig(idle_timeout=0.3))
        stream, _ = await open_session(ch, sh)
        assert len(server.sessions) == 1
        await eventually(lambda: not server.sessions, "the idle session to close", limit=5)
    with_hosts(body)


def test_link_frames_alone_do_not_keep_a_session(model):
    """Idle means no forward: an empty `Link` every 0.1 s does not hold the slot."""
    async def body(stack):
        server, sh, ch = await serving(stack, model, SessionConfig(idle_timeout=0.5))
        stream, _ = await open_session(ch, sh)
        await step(stream, hidden(1, 3), 0)  # a forward: the clock starts again from here
        began = trio.current_time()
        with trio.move_on_after(5):
            while server.sessions:
                try:
                    await write_frame(stream, encode(Link("", (), bytes(32))))
                except Exception:  # the server closed the session
                    break
                await trio.sleep(0.1)
        assert not server.sessions, "keepalive frames held an idle session"
        assert trio.current_time() - began < 2.0
    with_hosts(body)


def test_measured_throughput_is_positive(model):
    async def body(stack):
        server, _, _ = await serving(stack, model)
        assert server.measure_throughput(tokens=3) > 0
    with_hosts(body)


def test_one_peer_cannot_hold_every_slot(model):
    config = SessionConfig(max_sessions=4, max_sessions_per_peer=2)

    async def body(stack):
        from node.net.host import open_host
        server, sh, ch = await serving(stack, model, config)
        replies = [(await open_session(ch, sh))[1] for _ in range(3)]
        assert [type(r) for r in replies] == [SessionAccepted, SessionAccepted, Busy]
        other = await stack.enter_async_context(open_host(ident(3)))
        await other.connect(sh.addrs[0])
        _, reply = await open_session(other, sh)
        assert isinstance(reply, SessionAccepted)  # another client still gets in
    with_hosts(body)


def test_a_long_replay_takes_turns_with_other_sessions(model):
    """The limiter is taken per chunk: a 60-chunk replay does not hold the server."""
    async def body(stack):
        server, sh, ch = await serving(stack, model)
        replay, _ = await open_session(ch, sh, max_len=60)
        decoder, _ = await open_session(ch, sh)
        order: list[str] = []
        real_run = server._run

        def traced(s, chunk, pos):
            order.append("replay" if s.id == 1 else "decode")
            return real_run(s, chunk, pos)
        server._run = traced
        x = hidden(1, 60)

        async def long_replay():
            await step(replay, x, 0, chunks=(1,) * 60)

        async def two_decodes():
            while "replay" not in order:  # the replay is under way
                await trio.sleep(0.001)
            await step(decoder, hidden(2, 1), 0)
            await step(decoder, hidden(3, 1), 1)
        async with trio.open_nursery() as n:
            n.start_soon(long_replay)
            n.start_soon(two_decodes)
        assert order.count("replay") == 60 and order.count("decode") == 2
        # Both decodes ran between replay chunks, not after all 60.
        assert order[-1] == "replay"
    with_hosts(body)


async def another_client(stack, server_host, n: int):
    """A client host of identity ``n`` connected to the server (also on 127.0.0.1)."""
    from node.net.host import open_host
    host = await stack.enter_async_context(open_host(ident(n)))
    await host.connect(server_host.addrs[0])
    return host


def test_two_identities_cannot_hold_every_slot_with_the_default_limits(model):
    """Issue 15: two identities taking sessions until refused held all 8 slots (4 each);
    with the defaults (a quarter each) they hold 4 and an honest client gets in."""
    async def body(stack):
        server, sh, ch = await serving(stack, model)  # SessionConfig(): 8 sessions
        attackers = [ch, await another_client(stack, sh, 3)]
        for attacker in attackers:
            replies = [(await open_session(attacker, sh))[1] for _ in range(5)]
            taken = [r for r in replies if isinstance(r, SessionAccepted)]
            assert len(taken) == 2
            busy = [r for r in replies if isinstance(r, Busy)]
            assert busy and all("this client's limit" in r.reason for r in busy)
            assert all(r.retry_after_ms == server.config.busy_retry_ms for r in busy)
        honest = await another_client(stack, sh, 4)
        _, reply = await open_session(honest, sh)
        assert isinstance(reply, SessionAccepted)
        assert len(server.sessions) == 5 and server.refused_limit == 6
    with_hosts(body)


def test_the_per_address_limit_counts_every_identity_of_one_address(model):
    """Loopback is exempt by default (local wallets share it); here it is counted."""
    config = SessionConfig(max_sessions=8, max_sessions_per_address=3, limit_loopback=True)

    async def body(stack):
        server, sh, ch = await serving(stack, model, config)
        clients = [ch] + [await another_client(stack, sh, n) for n in (3, 4)]
        replies = [(await open_session(c, sh))[1] for c in clients for _ in range(2)]
        assert sum(isinstance(r, SessionAccepted) for r in replies) == 3
        refused = [r for r in replies if isinstance(r, Busy)]
        assert "at most 3 per address" in refused[0].reason and "127.0.0.1" in refused[0].reason
        assert {s.address for s in server.sessions.values()} == {"127.0.0.1"}
    with_hosts(body)


def test_an_over_cap_step_is_refused_and_the_server_serves_others(model):
    config = SessionConfig(max_chunk_positions=4, max_sessions_per_peer=3)
    x = hidden(1, 6)
    (one,) = reference(model, [x[:, :1]])
    in_chunks = torch.cat(reference(model, [x[:, :4], x[:, 4:]]), dim=1)

    async def body(stack):
        server, sh, ch = await serving(stack, model, config)
        other, _ = await open_session(ch, sh)
        greedy, _ = await open_session(ch, sh)
        got = await step(greedy, x, 0)  # one call of 6 positions: over the cap
        assert isinstance(got, SessionError) and "cap of 4 positions per call" in got.reason
        assert torch.equal(await step(other, x[:, :1], 0), one)  # the other session goes on
        # The same positions in chunks within the cap are served, bit-identically.
        chunked, _ = await open_session(ch, sh)
        assert torch.equal(await step(chunked, x, 0, chunks=(4, 2)), in_chunks)
        assert isinstance(await step(chunked, hidden(2, 5), 6, chunks=(5,)), SessionError)
        assert server.refused_steps == 2 and not sh.misbehaving
    with_hosts(body)


def test_the_session_cap_is_announced_and_enforced(model):
    async def body(stack):
        server, sh, ch = await serving(stack, model, SessionConfig(max_len=16))
        assert server.max_session_positions == 16
        _, reply = await open_session(ch, sh, max_len=17)
        assert isinstance(reply, SessionError) and "at most 16" in reply.reason
        stream, reply = await open_session(ch, sh, max_len=16)
        assert isinstance(reply, SessionAccepted)
        got = await step(stream, hidden(1, 17), 0, chunks=(8, 9))
        assert isinstance(got, SessionError) and "budget" in got.reason
    with_hosts(body)


def test_compute_is_metered_per_session_per_client_and_in_total(model):
    async def body(stack):
        server, sh, ch = await serving(stack, model, SessionConfig(max_chunk_positions=8))
        a, _ = await open_session(ch, sh)
        other = await another_client(stack, sh, 3)
        b, _ = await open_session(other, sh)
        for x, pos, chunks in [(hidden(1, 12), 0, (8, 4)), (hidden(2, 1), 12, ()),
                               (hidden(3, 13), 0, (8, 4, 1))]:  # a replay counts again
            assert isinstance(await step(a, x, pos, chunks), torch.Tensor)
        assert isinstance(await step(b, hidden(4, 2), 0), torch.Tensor)
        status = server.status()
        by_peer = {s["peer"]: s for s in status["open"]}
        mine, theirs = by_peer[str(ch.peer_id)], by_peer[str(other.peer_id)]
        assert (mine["positions"], mine["steps"]) == (26, 3)
        assert (theirs["positions"], theirs["steps"]) == (2, 1)
        assert mine["forward_s"] > 0 and mine["address"] == "127.0.0.1"
        assert status["compute"]["positions"] == 28 and status["compute"]["steps"] == 4
        heaviest = status["heaviest_peers"]  # by forward seconds
        assert [p["forward_s"] for p in heaviest] == sorted(
            (p["forward_s"] for p in heaviest), reverse=True)
        assert {p["peer"]: p["positions"] for p in heaviest} == {
            str(ch.peer_id): 26, str(other.peer_id): 2}
        # The session cap: the configured 2,048, or the tiny model's context if shorter.
        assert status["max_chunk_positions"] == 8
        assert status["max_session_positions"] == min(2048, TINY.max_seq_len)
        await a.close()
        await eventually(lambda: len(server.sessions) == 1, "the session to close")
        # A closed session's compute stays with its client.
        assert {p["peer"]: p["positions"] for p in server.status()["heaviest_peers"]}[
            str(ch.peer_id)] == 26
    with_hosts(body)


def test_a_full_server_reclaims_dripping_sessions_for_a_new_client(model):
    """Issue 28 item 5: sessions stepping now and then held every slot (one step every
    40 s kept one). A full server closes the longest idle one for a new client, tells
    its client why, and still refuses when every session is at work."""
    config = SessionConfig(max_sessions=4, max_sessions_per_peer=2, reclaim_idle_s=2.0)
    x = hidden(1, 2)
    (want,) = reference(model, [x])

    async def body(stack):
        server, sh, ch = await serving(stack, model, config)
        drippers = [ch, await another_client(stack, sh, 3)]
        newcomer, late = [await another_client(stack, sh, n) for n in (4, 5)]
        drips = [(await open_session(c, sh))[0] for c in drippers for _ in range(2)]
        for pos, stream in enumerate(drips):  # one step each, the first the longest ago
            assert isinstance(await step(stream, hidden(10 + pos, 1), 0), torch.Tensor)
        assert isinstance((await open_session(newcomer, sh))[1], Busy)  # they just stepped
        await trio.sleep(2.1)  # now every drip session is idle for reclaim_idle_s
        stream, reply = await open_session(newcomer, sh)
        assert isinstance(reply, SessionAccepted)
        assert torch.equal(await step(stream, x, 0), want)  # served
        told = decode(await read_frame(drips[0]), SessionError)  # the longest idle
        assert "reclaimed" in told.reason and "no forward for" in told.reason
        await eventually(lambda: len(server.sessions) == 4, "the reclaimed session to close")
        assert server.reclaimed == 1 and server.status()["reclaimed"] == 1
        for k, stream in enumerate(drips[1:]):  # the others carry on, now stepping often
            assert isinstance(await step(stream, hidden(20 + k, 1), 1), torch.Tensor)
        _, refused = await open_session(late, sh)
        assert isinstance(refused, Busy) and refused.reason == "4 sessions open"
    with_hosts(body)


def test_every_answer_signs_the_running_hash_of_the_sessions_inputs(model):
    """Each `StepResult` is the server key's signature over a claim naming the step and the
    running hash of every step the cache holds (9.5): rolled back with the cache."""
    from node.wire import S_STEP, SignedAnswer, history_of, step_claim

    xs = [hidden(1, 5), hidden(2, 1), hidden(3, 1), hidden(4, 1)]

    async def body(stack):
        server, sh, ch = await serving(stack, model)
        stream, accepted = await open_session(ch, sh)
        key = server.host.identity.key_pair.public_key.to_bytes()

        async def signed(history: list[Step]) -> bool:
            await write_frame(stream, encode(history[-1]))
            reply = decode(await read_frame(stream), StepResult)
            claim = step_claim(accepted.token, MODEL_ID, 0, 2, history[-1], reply.hidden,
                               history_of(history))
            return SignedAnswer(key, claim, reply.hidden, reply.signature).verified()
        steps = [Step(0, (), encode_tensor(xs[0])), Step(5, (), encode_tensor(xs[1])),
                 Step(6, (), encode_tensor(xs[2]))]
        assert [await signed(steps[: k + 1]) for k in range(3)] == [True] * 3
        again = Step(5, (), encode_tensor(xs[3]))  # rolls back to position 5
        assert await signed([steps[0], again])
        assert not await signed([steps[0], steps[1], again])  # not the history it holds
    with_hosts(body)
