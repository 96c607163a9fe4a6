"""node.serve.waiting: a full server's waiting room admits the highest bid first."""

from __future__ import annotations

import trio

from node.serve.waiting import WaitingRoom
from tests.node.netkit import run


def test_the_highest_bid_gets_the_next_slot_and_equal_bids_keep_their_order():
    room = WaitingRoom(size=4)
    got: list[str] = []

    async def wait(name, bid):
        if await room.wait(bid, timeout=5):
            got.append(name)

    async def main():
        async with trio.open_nursery() as nursery:
            for name, bid in (("a", 5), ("b", 9), ("c", 5), ("d", 7)):
                nursery.start_soon(wait, name, bid)
                await trio.sleep(0.01)
            assert room.waiting == 4 and room.min_bid(ask=1) == 6
            for _ in range(4):
                room.free()
                await trio.sleep(0.01)
        assert room.reserved == 4  # each admitted waiter holds its slot until it takes it
    run(main)
    assert got == ["b", "d", "a", "c"]


def test_a_full_room_refuses_a_low_bid_and_a_higher_one_takes_the_lowest_seat():
    room = WaitingRoom(size=2)
    outcome: dict[str, bool] = {}

    async def wait(name, bid, timeout=5.0):
        outcome[name] = await room.wait(bid, timeout)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "a", 5)
            nursery.start_soon(wait, "b", 6)
            await trio.sleep(0.01)
            await wait("low", 5)  # at or below the lowest seat: told at once
            assert outcome["low"] is False and room.min_bid(ask=1) == 6
            nursery.start_soon(wait, "rich", 8)  # takes a's seat; a is told busy
            await trio.sleep(0.01)
            assert outcome["a"] is False and room.min_bid(ask=1) == 7
            room.free()
            room.free()
    run(main)
    assert outcome == {"a": False, "low": False, "rich": True, "b": True}


def test_a_waiter_gives_up_after_its_timeout():
    room = WaitingRoom(size=1)

    async def main():
        assert await room.wait(5, timeout=0.05) is False
        assert room.waiting == 0 and room.min_bid(ask=3) == 3
    run(main)
