"""node.serve.admission: address buckets, open-session limits, the fair queue (pure logic)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from node.serve.admission import (
    ClientAtLimit, FairScheduler, InferenceError, Meter, Seat, ServerFull, SessionBusy,
    SessionConfig, SessionConfigError, SessionLimits, SessionRefused, address_key, flow_key,
    is_loopback, reclaim_choice, refusal,
)


@pytest.mark.parametrize("ip, key", [
    ("203.0.113.7", "203.0.113.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),  # same /64, same bucket
    ("::ffff:198.51.100.3", "198.51.100.3"),  # IPv4-mapped: the IPv4 client it is
    ("fe80::1%eth0", "fe80::/64"),
    ("not an address", None),
    (None, None),
])
def test_address_buckets(ip, key):
    assert address_key(ip) == key


def test_loopback_buckets():
    assert is_loopback(address_key("127.0.0.1")) and is_loopback(address_key("127.3.2.1"))
    assert is_loopback(address_key("::1"))
    assert not is_loopback(address_key("192.0.2.1")) and not is_loopback(None)


@pytest.mark.parametrize("max_sessions, per_peer, per_address", [
    (8, 2, 4), (16, 4, 8), (2, 1, 1), (1, 1, 1),
])
def test_default_limits_are_a_quarter_and_a_half_at_least_one(max_sessions, per_peer,
                                                              per_address):
    limits = SessionConfig(max_sessions=max_sessions).limits()
    assert (limits.per_peer, limits.per_address) == (per_peer, per_address)
    assert not limits.limit_loopback


def test_explicit_limits_and_bad_caps():
    limits = SessionConfig(max_sessions_per_peer=5, max_sessions_per_address=6,
                           limit_loopback=True).limits()
    assert (limits.per_peer, limits.per_address, limits.limit_loopback) == (5, 6, True)
    for bad in (dict(max_sessions=0), dict(max_chunk_positions=0), dict(max_len=0),
                dict(free_call_positions=0)):
        with pytest.raises(SessionConfigError, match="at least 1"):
            SessionConfig(**bad)


def test_refusal_reasons_name_the_clients_limit():
    limits = SessionLimits(max_sessions=8, per_peer=2, per_address=3)
    held = [("a", "192.0.2.1"), ("a", "192.0.2.1")]
    by_peer = refusal(limits, held, "a", "192.0.2.1")
    assert isinstance(by_peer, ClientAtLimit) and (by_peer.held, by_peer.limit) == (2, 2)
    assert by_peer.address is None
    assert str(by_peer) == ("this client's limit: it holds 2 sessions here, "
                            "at most 2 per client")  # the `Busy` reason, as it always read
    assert refusal(limits, held, "b", "192.0.2.1") is None
    held.append(("b", "192.0.2.1"))
    by_address = refusal(limits, held, "c", "192.0.2.1")
    assert isinstance(by_address, ClientAtLimit) and by_address.address == "192.0.2.1"
    assert str(by_address) == ("this client's limit: 3 sessions are open from its address "
                               "192.0.2.1, at most 3 per address")
    assert refusal(limits, held, "c", "192.0.2.2") is None  # another address
    assert refusal(limits, held, "c", None) is None  # unknown: not limited by address
    full = [(str(i), f"192.0.2.{i}") for i in range(8)]
    busy = refusal(limits, full, "z", "198.51.100.1")
    assert isinstance(busy, ServerFull) and busy.open_sessions == 8
    assert str(busy) == "8 sessions open"


def test_busy_is_no_refusal():
    # A server catches `SessionRefused` (a `SessionError`) apart from `SessionBusy` (`Busy`).
    for cls in (ServerFull, ClientAtLimit):
        assert issubclass(cls, SessionBusy) and issubclass(cls, InferenceError)
        assert not issubclass(cls, SessionRefused)


def test_loopback_is_exempt_from_the_address_limit_unless_asked():
    held = [(str(i), "127.0.0.1") for i in range(3)]
    assert refusal(SessionLimits(8, 2, 3), held, "x", "127.0.0.1") is None
    assert refusal(SessionLimits(8, 2, 3, limit_loopback=True), held, "x", "127.0.0.1")
    assert refusal(SessionLimits(8, 2, 3), held[:2] + [("x", "127.0.0.1")] * 2,
                   "x", "127.0.0.1")  # the per-peer limit still holds on loopback


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["10.0.0.1", "10.0.0.2",
                                                                    "127.0.0.1", None])),
                max_size=12),
       st.sampled_from("abcde"), st.sampled_from(["10.0.0.1", "10.0.0.3", "127.0.0.1", None]),
       st.integers(1, 10), st.integers(1, 5), st.integers(1, 5), st.booleans())
def test_refusal_is_exactly_the_three_limits(held, peer, address, total, per_peer,
                                             per_address, loopback):
    limits = SessionLimits(total, per_peer, per_address, loopback)
    over = (len(held) >= total
            or sum(p == peer for p, _ in held) >= per_peer
            or (address is not None and (loopback or address != "127.0.0.1")
                and sum(a == address for _, a in held) >= per_address))
    assert (refusal(limits, held, peer, address) is not None) == over


# -- the fair queue ---------------------------------------------------------------------

def serve_in_turns(scheduler: FairScheduler, calls, order: list[str]):
    """Start each (name, meter, seconds) call's task in order, as a waiting queue.

    The first takes the turn and holds it until every other one waits; each
    call then charges its seconds (no time passes: the order is all we see).
    """
    async def call(name, meter, seconds, ready):
        async with scheduler.turn(meter):
            order.append(name)
            if ready is not None:
                await ready.wait()  # hold the turn until the others queue
            meter.forward_s += seconds

    async def main():
        ready = trio.Event()
        async with trio.open_nursery() as n:
            for k, (name, meter, seconds) in enumerate(calls):
                n.start_soon(call, name, meter, seconds, ready if k == 0 else None)
                await trio.testing.wait_all_tasks_blocked()
            assert scheduler.waiting == len(calls) - 1
            ready.set()
    trio.run(main)


def test_a_session_that_used_less_goes_first():
    scheduler, order = FairScheduler(), []
    heavy, light, fresh = Meter(finish=5.0), Meter(finish=1.0), Meter()
    serve_in_turns(scheduler, [("first", Meter(), 0.5), ("heavy", heavy, 1.0),
                               ("light", light, 0.1), ("fresh", fresh, 0.1)], order)
    # fresh starts level with the call in service (tag 0), not ahead of its past.
    assert order == ["first", "fresh", "light", "heavy"]
    assert heavy.finish == 6.0 and light.finish == 1.1


def test_priority_goes_first_and_a_big_chunk_waits_its_share():
    scheduler, order = FairScheduler(), []
    big = Meter()
    paid = Meter(priority=1, finish=100.0)
    serve_in_turns(scheduler, [("big", big, 2.0), ("paid", paid, 0.1),
                               ("decode", Meter(), 0.01)], order)
    assert order == ["big", "paid", "decode"]
    # The big call's session now starts 2 s later than a newcomer: it waits its turn.
    order.clear()
    serve_in_turns(scheduler, [("holder", Meter(), 0.0), ("big again", big, 2.0),
                               ("newcomer", Meter(), 0.01)], order)
    assert order == ["holder", "newcomer", "big again"]


def test_a_cancelled_waiter_leaves_the_queue_and_the_turn_passes_on():
    async def main():
        scheduler = FairScheduler()
        got: list[str] = []
        release = trio.Event()

        async def hold():
            async with scheduler.turn(Meter()):
                await release.wait()

        async def wait_for_turn(name):
            async with scheduler.turn(Meter()):
                got.append(name)
        async with trio.open_nursery() as n:
            n.start_soon(hold)
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(wait_for_turn, "kept")
            await trio.testing.wait_all_tasks_blocked()
            cancelled = trio.CancelScope()

            async def doomed():
                with cancelled:
                    await wait_for_turn("cancelled")
            n.start_soon(doomed)
            await trio.testing.wait_all_tasks_blocked()
            assert scheduler.waiting == 2
            cancelled.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert scheduler.waiting == 1
            release.set()
        assert got == ["kept"] and scheduler.waiting == 0
        async with scheduler.turn(Meter()):  # free again: no wait
            got.append("after")
        assert got == ["kept", "after"]
    trio.run(main)


def test_a_decode_step_goes_before_two_alternating_heavy_sessions():
    """Two heavy sessions alternating keep their start tags level with the running
    call; a decode step arriving then ties with the waiting one and wins on compute
    used: it waits behind the running call only."""
    scheduler, order = FairScheduler(), []
    a, b = Meter(forward_s=8.0, finish=4.0), Meter(forward_s=8.0, finish=4.0)
    serve_in_turns(scheduler, [("a", a, 4.0), ("b", b, 4.0), ("decode", Meter(), 0.01)], order)
    assert order == ["a", "decode", "b"]


def test_two_sessions_of_one_client_share_its_turns():
    """The fair queue counts a client (its flow), not a session: a client that ran
    a call on one session waits behind another client's call on its other one."""
    scheduler, order = FairScheduler(), []
    flood, honest = Meter(), Meter()
    first, second = Meter(), Meter()  # the flood client's two sessions

    async def calls():
        async def call(name, meter, flow, seconds, hold=None):
            async with scheduler.turn(meter, flow):
                order.append(name)
                if hold is not None:
                    await hold.wait()
                flow.forward_s += seconds
        hold = trio.Event()
        async with trio.open_nursery() as n:
            n.start_soon(call, "flood 1", first, flood, 1.0, hold)
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(call, "flood 2", second, flood, 1.0)
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(call, "honest", Meter(), honest, 0.01)
            await trio.testing.wait_all_tasks_blocked()
            hold.set()
    trio.run(calls)
    # flood 2 queued level with flood 1's start, but its client ran 1 s meanwhile:
    # the tag is read when the turn passes, so the honest call goes first (counted
    # per session, flood 2 would tie with it and go first, having arrived first).
    assert order == ["flood 1", "honest", "flood 2"]
    assert flood.finish == 2.0 and honest.finish == 0.01


def test_flow_keys_count_a_limited_address_once_and_everything_else_by_account():
    limits = SessionLimits(8, 2, 4)
    assert flow_key(limits, False, "peer-a", "192.0.2.1") == flow_key(
        limits, False, "peer-b", "192.0.2.1") == "address 192.0.2.1"
    assert flow_key(limits, False, "peer-a", "127.0.0.1") == "account peer-a"  # exempt
    assert flow_key(limits, False, "peer-a", None) == "account peer-a"
    assert flow_key(limits, True, "client", "192.0.2.1") == "account client"  # paid
    assert flow_key(SessionLimits(8, 2, 4, limit_loopback=True), False, "p",
                    "127.0.0.1") == "address 127.0.0.1"


RECLAIM = SessionConfig(reclaim_idle_s=10.0, share_idle_s=2.0)
LIMITS = RECLAIM.limits()


def test_a_full_server_reclaims_the_longest_idle_free_session():
    seats = [Seat(1, "192.0.2.1", False, 0, 11.0), Seat(2, "192.0.2.2", False, 0, 30.0),
             Seat(3, "192.0.2.3", True, 5, 60.0), Seat(4, "192.0.2.4", False, 0, 0.1),
             Seat(5, "192.0.2.5", False, 0, 50.0, stepping=True)]
    key, why = reclaim_choice(LIMITS, RECLAIM, seats, paid=False, priority=0,
                              address="198.51.100.1")
    assert key == 2 and "no forward for 30.0 s" in why and "replay" in why
    # A paid request takes a free one first, then a paid one of a bid at most its own.
    assert reclaim_choice(LIMITS, RECLAIM, seats, paid=True, priority=9,
                          address="198.51.100.1")[0] == 2
    paid_only = [seats[2], seats[3]]
    assert reclaim_choice(LIMITS, RECLAIM, paid_only, paid=True, priority=9,
                          address=None)[0] == 3
    assert reclaim_choice(LIMITS, RECLAIM, paid_only, paid=True, priority=4,
                          address=None) is None
    # A free request never closes a paid session, nor one in a step, nor a busy one.
    assert reclaim_choice(LIMITS, RECLAIM, paid_only, paid=False, priority=0,
                          address=None) is None
    assert reclaim_choice(LIMITS, RECLAIM, [seats[4], seats[3]], paid=False, priority=0,
                          address=None) is None


def test_an_address_over_its_share_makes_way_for_a_lighter_one():
    """Issue 28 item 5: two addresses held all 8 slots; a third one's request takes
    the idlest session of the heaviest address (idle for share_idle_s, not 10 s)."""
    seats = [Seat(k, f"192.0.2.{1 + k // 4}", False, 0, 2.0 + k / 2) for k in range(8)]
    key, why = reclaim_choice(LIMITS, RECLAIM, seats, paid=False, priority=0,
                              address="198.51.100.1")
    assert key == 7 and "192.0.2.2 held 4 sessions" in why
    # An address already level (holding one less than the most) takes nothing,
    after = seats[:7] + [Seat(7, "198.51.100.1", False, 0, 3.0)]  # 4, 3 and 1
    assert reclaim_choice(LIMITS, RECLAIM, after, paid=False, priority=0,
                          address="192.0.2.2") is None
    assert reclaim_choice(LIMITS, RECLAIM, after, paid=False, priority=0,
                          address="198.51.100.1")[0] == 3  # 1 against 4: the idlest of 4
    # nor one unlimited (loopback, unknown), nor from sessions stepping every second.
    for address in ("127.0.0.1", None):
        assert reclaim_choice(LIMITS, RECLAIM, seats, paid=False, priority=0,
                              address=address) is None
    busy = [Seat(k, f"192.0.2.{1 + k // 4}", False, 0, 1.0) for k in range(8)]
    assert reclaim_choice(LIMITS, RECLAIM, busy, paid=False, priority=0,
                          address="198.51.100.1") is None
