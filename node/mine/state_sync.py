"""Mining: catching up with the job from a holder's state, and answering other nodes' asks.

Owns `StateSync`, both sides of `STATE_PROTOCOL` (`node.wire`'s `StateRequest`
and `StateReply`). A miner more than one update behind the open step (it
joined late, or was down) takes the weights and AdamW state of every part it
holds (its sections and the client part) from another holder at the open
step; it refuses a state that does not fit its slices. Every miner answers
registered nodes with the state of the parts it holds, and anyone with its
version only. The states go through the public `SliceAdamW` methods
(`state_dict`, `check_state`, `load_state`); torch work runs on the torch
thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from libp2p.peer.id import ID

from compute.errors import OptimizerStateError
from compute.wiretensor import WireTensorError, decode_tensor, encode_tensor
from ledger.codec import decode, encode
from ledger.errors import DecodeError
from node import torch_thread
from node.mine.parts import StateAccepts
from node.net import Host, RequestError
from node.wire import (
    CLIENT, MAX_TRAIN_FRAME, STATE_PROTOCOL, NamedTensor, StateReply, StateRequest,
)
from proof_of_learning.phases import Tensors

if TYPE_CHECKING:
    from compute.optim import SliceAdamW

log = logging.getLogger(__name__)

__all__ = ["StateSync"]



class StateSync:
    """The weights and AdamW state of the parts this node holds, fetched and served.

    Args:
        host: this node's host (its peer id; the requests).
        job_id: the job whose state is served.
        held: the sections this node holds (the client part is held by all).
        optimizer: a held part's optimizer, by section or `CLIENT`.
        registered: the peer ids of the registered nodes as the miner's
            current chain view has them, or None before its first look.
        version: the updates the miner has applied (the version it answers).
        wait_s: most seconds one request waits for its answer.
        accepts: ``await accepts(job_id, section, step, state)``: whether to
            take a holder's fitting state (`node.pol.catchup.StateCheck`);
            None takes the first fitting one.

    Attributes:
        weights_version: the updates in the weights as the torch thread
            has them (what a served state is at); whoever steps the
            optimizers sets it, on the torch thread.
    """

    def __init__(self, host: Host, *, job_id: bytes, held: Sequence[int],
                 optimizer: Callable[[int], SliceAdamW],
                 registered: Callable[[], Collection[str] | None],
                 version: Callable[[], int], wait_s: float = 20.0,
                 accepts: StateAccepts | None = None):
        self.host, self.me = host, str(host.peer_id)
        self.accepts = accepts
        self.job_id, self.held, self.optimizer = job_id, list(held), optimizer
        self.registered, self.version, self.wait_s = registered, version, wait_s
        self.weights_version = 0

    # -- catching up --------------------------------------------------------------------

    async def fetch(self, *, job_id: bytes, step: int, miners: Sequence[str],
                    holders: Sequence[Sequence[str]]) -> bool:
        """Take every held part's weights and AdamW state from holders at ``step``.

        Args:
            job_id, step, miners, holders: the chain view to catch up with:
                its job and open step, every registered node, each
                section's holders.

        Returns:
            True once every part is restored (at version ``step``); False,
            with nothing changed, when some part has no holder that sends
            a fitting state at ``step``.
        """
        got = await self.fetch_parts([*self.held, CLIENT], job_id=job_id, step=step,
                                     miners=miners, holders=holders, check=True)
        if got is None:
            return False
        await torch_thread.run_sync(self.restore_all, got, step)
        return True

    async def fetch_parts(self, parts: Sequence[int], *, job_id: bytes, step: int,
                          miners: Sequence[str], holders: Sequence[Sequence[str]],
                          check: bool = False) -> dict[int, Tensors] | None:
        """Each part's state (weights and AdamW moments) at ``step``, from a holder of it.

        Args:
            parts: section indices (or ``CLIENT``).
            check: also ask ``accepts`` (the receipts of the open step) of each.

        Returns:
            part -> its tensors, or None when some part has no holder that
            sends a fitting state at ``step``.
        """
        got: dict[int, Tensors] = {}
        for s in parts:
            group = miners if s == CLIENT else holders[s]
            for peer in (p for p in group if p != self.me):
                try:
                    reply = decode(await self.host.request(
                        peer, STATE_PROTOCOL, encode(StateRequest(job_id, s)),
                        timeout=self.wait_s, max_response_size=MAX_TRAIN_FRAME), StateReply,
                        max_size=MAX_TRAIN_FRAME)
                    tensors = {t.name: decode_tensor(t.data) for t in reply.tensors}
                except (RequestError, DecodeError, WireTensorError) as exc:
                    log.info("state of section %s from %s: %s", s, peer, exc)
                    continue
                if reply.version == step and self.fits(s, tensors) and (
                        not check or self.accepts is None
                        or await self.accepts(job_id, s, step, tensors)):
                    got[s] = tensors
                    break
            if s not in got:
                return None
        return got

    def fits(self, s: int, tensors: Tensors) -> bool:
        """Every parameter, and its AdamW state either whole or absent, with our shapes."""
        try:
            self.optimizer(s).check_state(tensors)
        except OptimizerStateError:
            return False
        return True

    def restore_all(self, got: dict[int, Tensors], version: int) -> None:
        """Load each part's state of ``got`` (checked by `fits`) as version ``version``.

        Runs on the torch thread.

        Raises:
            OptimizerStateError: a state does not fit (`fits` said it does).
        """
        self.weights_version = version
        for s, tensors in got.items():
            self.optimizer(s).load_state(tensors)

    # -- answering ----------------------------------------------------------------------

    def snapshot(self, s: int) -> tuple[int, Tensors]:
        """(updates applied, a held part's weights and AdamW state); on the torch thread."""
        return self.weights_version, self.optimizer(s).state_dict()

    async def serve(self, peer: ID, request: bytes) -> bytes:
        """The `STATE_PROTOCOL` handler: this node's version and, if it holds the part, its state.

        Only registered nodes get the state (it is a full copy of a section).

        Raises:
            DecodeError: not a `StateRequest` (the host resets the stream and
                scores the peer).
        """
        req = decode(request, StateRequest)
        registered = self.registered()
        held = registered is not None and str(peer) in registered and (
            req.job_id == self.job_id and (req.section == CLIENT or req.section in self.held))
        if not held:
            return encode(StateReply(self.version(), ()))
        version, tensors = await torch_thread.run_sync(self.snapshot, req.section)
        return encode(StateReply(version, tuple(
            NamedTensor(n, encode_tensor(t)) for n, t in sorted(tensors.items()))))
