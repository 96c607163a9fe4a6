"""The spot voter: re-running the spot cases the chain draws this serving node for.

Owns `SpotVoter`, which a serving node runs beside its `LayerServer`, and
`rerun`, its judgement. After each new tip it lists the open `SpotCase`s
(specs/ledger.md 5.2) that name this node's key among their verifiers and
have no vote from it yet, reads each case's `SpotFraud` from the block that
opened it (two blocks before its draw), re-runs the evidence's steps on the
model it serves (one forward call per chunk, in a fresh KV cache: as the
accused server ran them, specs/network.md 9.5) and submits a signed
`SpotVote`: the accused answer agrees with its own, or disagrees while
another answer agrees, or it cannot judge (another model, layers it does not
hold, an output that agrees with no answer: then its own build is suspect,
not the accused).

It takes the served model as a callable, so node.pol need not import
node.serve: the node passes ``lambda: layer_server.inference``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from compute.kvcache import KVCache
from compute.tolerance import agree, wire_codec
from compute.wiretensor import decode_tensor, encode_tensor
from ledger import audit
from ledger.crypto import SigningKey
from ledger.errors import ValidationError
from ledger.spot import SpotEvidence, step_positions
from ledger.spotrules import CASE_OPEN, case_id
from ledger.state import SPOT
from ledger.types import (
    SPOT_AGREES, SPOT_DISAGREES, SPOT_UNABLE, SPOT_VOTES, ZERO_SIG, SpotFraud, SpotVote, sign,
)
from node import torch_thread
from node.chain import ChainService, TxGossip

log = logging.getLogger(__name__)

__all__ = ["SpotVoter", "rerun"]


def rerun(model: Any, layers: range, evidence: SpotEvidence, device: Any = "cpu") -> int:
    """This model's vote on ``evidence``'s accused answer (on the torch thread).

    Args:
        model: a `compute.model.Transformer` holding ``layers``.
        layers: the span this node serves.
        evidence: evidence that holds (`ledger.spot.check_evidence`).
        device: where the weights are.

    Returns:
        `SPOT_AGREES` when the accused answer agrees with this run's last
        outputs (encoded in the answer's codec, compared by that codec's
        tolerance), `SPOT_DISAGREES` when it does not and another answer
        does, else `SPOT_UNABLE` (layers not held, too long a history, or no
        answer agrees: this build is not one to judge by).
    """
    answers = evidence.answers
    claim = answers[evidence.loser].claim
    start, end = claim.layer_start, claim.layer_end
    total = sum(step_positions(s) for s in evidence.steps)
    if not (layers.start <= start < end <= layers.stop) or total > model.config.max_seq_len:
        return SPOT_UNABLE
    cache = KVCache(model.config, total, layers=range(start, end), device=device)
    outs: list[torch.Tensor] = []
    with torch.inference_mode():
        for step in evidence.steps:
            hidden = decode_tensor(step.hidden).to(torch.float32)
            outs, pos = [], step.pos
            for n in step.chunks or (hidden.shape[1],):
                chunk = hidden[:, pos - step.pos: pos - step.pos + n].to(device)
                outs.append(model.run_layers(chunk, start, end, pos=pos, cache=cache).to("cpu"))
                pos += n
    mine = torch.cat(outs, dim=1)

    def agrees(i: int) -> bool:
        codec = wire_codec(answers[i].hidden)
        return agree(decode_tensor(encode_tensor(mine, codec)), decode_tensor(answers[i].hidden),
                     codec)

    if agrees(evidence.loser):
        return SPOT_AGREES
    others = [i for i in range(len(answers)) if i != evidence.loser]
    return SPOT_DISAGREES if any(agrees(i) for i in others) else SPOT_UNABLE


def accusation_at(chain: Any, height: int, cid: bytes) -> SpotFraud | None:
    """The `SpotFraud` in the main-chain block at ``height`` that opened case ``cid``."""
    if not 0 < height <= chain.height:
        return None
    for tx in chain.block_at(height).txs:
        if isinstance(tx, SpotFraud) and tx.evidence.loser < len(tx.evidence.answers) \
                and case_id(tx.evidence.answers[tx.evidence.loser]) == cid:
            return tx
    return None


class SpotVoter:
    """Votes on the spot cases this node is drawn for (module docstring).

    Args:
        service, txs: the node's chain service and transaction gossip.
        key: the node key (the chain names verifiers by it; it signs votes).
        served: the served `InferenceServer` now (``model``, ``layers``,
            ``model_id``, ``device``), or None while nothing is loaded.
        report: gets a line per vote.
    """

    def __init__(self, service: ChainService, txs: TxGossip, key: SigningKey,
                 served: Callable[[], Any | None], *,
                 report: Callable[[str], None] = lambda line: None):
        self.service, self.txs, self.key, self.served = service, txs, key, served
        self.report = report
        self.voted: set[bytes] = set()  # case ids with a vote submitted (while open)
        self.sent = {name: 0 for name in SPOT_VOTES}

    async def run(self) -> None:
        """Vote on drawn cases until cancelled."""
        tip = None
        while True:
            if tip is not None:
                await self.service.wait_tip_change(tip)
            tip, cases = await self.service.call(self._cases)
            for cid, evidence in cases:
                await self._vote(cid, evidence)

    async def _vote(self, cid: bytes, evidence: SpotEvidence) -> None:
        served = self.served()
        claim = evidence.answers[evidence.loser].claim
        vote = SPOT_UNABLE
        if served is not None and served.model_id == claim.model_id:
            try:
                vote = await torch_thread.run_sync(rerun, served.model, served.layers, evidence,
                                                   served.device)
            except Exception:  # a bug or a bad tensor must not take the node down
                log.exception("re-running spot case %s..", cid.hex()[:16])
        tx = sign(SpotVote(self.service.chain.chain_id, self.key.public, cid, vote, ZERO_SIG),
                  self.key)
        self.voted.add(cid)
        try:
            await self.txs.submit(tx)
        except ValidationError as exc:  # e.g. its window closed meanwhile
            log.info("spot vote on %s.. refused: %s", cid.hex()[:16], exc)
            return
        self.sent[SPOT_VOTES[vote]] += 1
        self.report(f"spot case {cid.hex()[:16]}..: the accused answer {SPOT_VOTES[vote]}")

    def _cases(self) -> tuple[bytes, list[tuple[bytes, SpotEvidence]]]:
        """(tip, the open cases this node must vote on and has not) (chain thread)."""
        chain = self.service.chain
        st, me = chain.state, self.key.public
        cases, open_ids = [], set()
        for cid in st.ids(SPOT):
            case = st.get(SPOT + cid)
            if case.status != CASE_OPEN:
                continue
            open_ids.add(cid)
            if me not in case.verifiers or cid in self.voted \
                    or case.votes[case.verifiers.index(me)] != audit.NO_VOTE:
                continue
            fraud = accusation_at(chain, case.draw_at - 2, cid)
            if fraud is not None:
                cases.append((cid, fraud.evidence))
        self.voted &= open_ids
        return chain.tip_hash, cases
