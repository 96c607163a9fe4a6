"""Neighbour averaging over the network: `/pnode/averaging/1.0.0` (specs/consensus.md 3.1).

Owns `Averager`, which runs one averaging round of a replica with its current
neighbours (the math is `compute.averaging`, eq. 7-8):

- each pair of neighbours exchanges weights once: the peer with the smaller
  peer id opens a stream and sends an `AverageOffer` (round, its degree, its
  tensors); the other answers an `AverageReply` (its degree, its tensors);
- both sides then know ``W_ij = 1 / (1 + max(d_i, d_j))`` from the two
  degrees, and each sets ``x_i' = x_i + sum_j W_ij (x_j - x_i)`` over the
  neighbours it heard from (the same as ``sum_j W_ij x_j`` with
  ``W_ii = 1 - sum_j W_ij``);
- a neighbour that does not answer within ``timeout`` (dead, stalled, or not
  in this round) is left out: the round goes on without it and without
  waiting further. W stays symmetric between every pair that exchanged, so
  the mean over the replicas is preserved when no exchange failed halfway
  (one side got the weights, the other did not: then the mean moves by that
  pair's share, bounded by ``W_ij * |x_i - x_j|``).

Tensors travel as wire tensors (compute/wiretensor.py, raw float32 by default, so
the average is exact to the float32 cast); torch work runs on the process's
torch thread (`node.torch_thread`). The messages are `node.wire.averaging`'s.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from compute.averaging import mix
from compute.wiretensor import decode_tensor, encode_tensor
from ledger.codec import decode, encode
from ledger.errors import DecodeError
from node import torch_thread
from node.errors import NodeError
from node.net import FramingError, Host, RequestError, read_frame, write_frame
from node.wire import (
    AVERAGING_PROTOCOL, MAX_AVERAGING_FRAME, AverageOffer, AverageReply, NamedTensor,
)

log = logging.getLogger(__name__)

class AveragingError(NodeError):
    """A round that could not use a neighbour's tensors (mismatched, malformed)."""


@dataclass(slots=True)
class RoundResult:
    """What one round did."""

    heard: list[str]  # neighbours whose tensors were averaged in
    missed: list[str]  # neighbours left out (no answer in time, or refused)


class Averager:
    """One replica's averaging with its neighbours over ``host``.

    Args:
        host: the running host.
        section: which section's replicas average together (a name).
        get_weights: the replica's current tensors (name -> tensor).
        set_weights: install the averaged tensors.
        timeout: seconds to wait for each neighbour within a round.
    """

    def __init__(self, host: Host, section: str,
                 get_weights: Callable[[], dict[str, torch.Tensor]],
                 set_weights: Callable[[dict[str, torch.Tensor]], None], *,
                 timeout: float = 10.0):
        self.host, self.section = host, section
        self.get_weights, self.set_weights = get_weights, set_weights
        self.timeout = timeout
        self.round = 0
        self.degree = 0
        self._snapshot: dict[str, torch.Tensor] | None = None
        self._heard: dict[str, tuple[int, dict[str, torch.Tensor]]] = {}
        self._done = trio.Event()

    def start(self) -> None:
        """Answer neighbours' offers for this section.

        A host has one handler for the protocol; it passes each offer to the
        `Averager` of the offer's section (a node may hold several sections).
        """
        sections = _AVERAGERS.get(self.host)
        if sections is None:
            sections = _AVERAGERS[self.host] = {}
            self.host.set_handler(AVERAGING_PROTOCOL, _dispatch(sections))
        sections[self.section] = self

    async def average(self, neighbours: Collection[str], round: int | None = None
                      ) -> RoundResult:
        """Run one round with ``neighbours`` (peer ids); returns who took part.

        Each neighbour must run its round concurrently (it answers only while
        its own round is open); one that does not within ``timeout`` is left
        out.

        Args:
            neighbours: peer ids (base58) of this round's neighbours.
            round: the round's number, the same at every replica (e.g. the
                training step); None: one more than this averager's last.
        """
        me = str(self.host.peer_id)
        self.round = self.round + 1 if round is None else round
        self.degree = len(neighbours)
        self._snapshot = {n: t.detach().clone() for n, t in self.get_weights().items()}
        self._heard = {}
        self._done = trio.Event()
        expected = set(neighbours)
        with trio.move_on_after(self.timeout):
            async with trio.open_nursery() as nursery:
                for peer in sorted(expected):
                    if me < peer:  # the smaller id opens the pair's exchange
                        nursery.start_soon(self._offer, peer)
                nursery.start_soon(self._wait_for, expected)
        heard = {p: v for p, v in self._heard.items() if p in expected}
        mine = self._snapshot
        self._snapshot = None  # the round is closed: late offers are refused
        averaged = await torch_thread.run_sync(mix, mine, self.degree, list(heard.values()))
        self.set_weights(averaged)
        return RoundResult(sorted(heard), sorted(expected - set(heard)))

    async def _wait_for(self, expected: set[str]) -> None:
        while not expected <= set(self._heard):
            self._done = trio.Event()
            await self._done.wait()

    def _record(self, peer: str, degree: int, tensors: dict[str, torch.Tensor]) -> None:
        self._heard[peer] = (degree, tensors)
        self._done.set()

    async def _offer(self, peer: str) -> None:
        offer = AverageOffer(self.section, self.round, self.degree, _encode(self._snapshot))
        try:
            data = await self.host.request(peer, AVERAGING_PROTOCOL, encode(offer),
                                           timeout=self.timeout,
                                           max_response_size=MAX_AVERAGING_FRAME)
            reply = decode(data, AverageReply, max_size=MAX_AVERAGING_FRAME)
            self._record(peer, reply.degree, _decode(reply.tensors, self._snapshot))
        except (RequestError, DecodeError, AveragingError) as exc:
            log.info("averaging with %s left out: %s", peer, exc)

    async def _answer(self, stream: INetStream, peer_id: ID, offer: AverageOffer) -> None:
        # Wait (briefly) for our own round to open: the two sides start at nearly once.
        with trio.move_on_after(self.timeout):
            while self._snapshot is None or self.round < offer.round:
                await trio.sleep(0.01)
        if self._snapshot is None or offer.section != self.section or offer.round != self.round:
            return  # not in the same round: close without an answer (the opener leaves us out)
        try:
            theirs = _decode(offer.tensors, self._snapshot)
        except AveragingError as exc:
            log.info("averaging offer of %s refused: %s", peer_id, exc)
            return
        reply = AverageReply(self.degree, _encode(self._snapshot))
        try:
            await write_frame(stream, encode(reply), timeout=self.timeout)
        except FramingError:
            return  # it gave up on us: it leaves us out, so we leave it out too
        self._record(str(peer_id), offer.degree, theirs)


_AVERAGERS: weakref.WeakKeyDictionary[Host, dict[str, Averager]] = weakref.WeakKeyDictionary()


def _dispatch(sections: dict[str, Averager]):
    """The host's one handler: an offer goes to its section's `Averager`."""
    async def answer(stream: INetStream, peer_id: ID) -> None:
        timeout = max((a.timeout for a in sections.values()), default=10.0)
        offer = decode(await read_frame(stream, MAX_AVERAGING_FRAME, timeout=timeout),
                       AverageOffer, max_size=MAX_AVERAGING_FRAME)
        averager = sections.get(offer.section)
        if averager is not None:  # else: close without an answer (we hold no such section)
            await averager._answer(stream, peer_id, offer)
    return answer


def _encode(tensors: dict[str, torch.Tensor]) -> tuple[NamedTensor, ...]:
    return tuple(NamedTensor(n, encode_tensor(tensors[n])) for n in sorted(tensors))


def _decode(named, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A neighbour's tensors, checked against ours (names, shapes, dtypes)."""
    out = {}
    for item in named:
        name, data = item.name, item.data
        if name in out:
            raise AveragingError(f"tensor {name!r} sent twice")
        if name not in like:
            raise AveragingError(f"unexpected tensor {name!r}")
        try:
            t = decode_tensor(data)
        except Exception as exc:
            raise AveragingError(f"tensor {name!r}: {exc}") from None
        if t.shape != like[name].shape or t.dtype != like[name].dtype:
            raise AveragingError(f"tensor {name!r} is {tuple(t.shape)} {t.dtype}, "
                                 f"expected {tuple(like[name].shape)} {like[name].dtype}")
        out[name] = t
    if set(out) != set(like):
        raise AveragingError(f"missing tensors {sorted(set(like) - set(out))[:4]}")
    return out


async def average_round(averagers: dict[int, Averager], groups: dict[int, Collection[str]],
                        me: str, version: int) -> None:
    """One averaging round per section in ``averagers`` with the other peers of its group
    (its holders; the client part's: every miner), at update ``version``."""
    for s, averager in averagers.items():
        neighbours = [p for p in groups[s] if p != me]
        if neighbours:
            result = await averager.average(neighbours, round=version)
            if result.missed:
                log.info("averaging section %s at %d left out %s", s, version, result.missed)
