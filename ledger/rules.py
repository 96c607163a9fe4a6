"""Transaction rules and the per-block bookkeeping of jobs and rewards.

Each ``_apply_*`` function checks everything first and writes only after the
last check, so a transaction that fails leaves the overlay untouched (the
block producer relies on this to drop bad transactions cheaply).

``ctx`` is the ``transition.Context`` of the block being applied: its
``height``, ``prev_hash``, ``chain_id`` and the ``log_appends`` list.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger import audit, crypto, merkle, schedule
from ledger.accounts import U64_MAX, check_nonce, credit
from ledger.auditrules import apply_appeal, apply_verdict, draw_audits, settle_pending
from ledger.jobrules import apply_job, give_up_stalled, job_queue
from ledger.spotrules import apply_spot_fraud, apply_spot_vote
from ledger.errors import (
    BadAmount, BadRegistration, BadSignature, InsufficientFunds,
    NotRegistered, PeerIdError, UnassignedReceipt, UnchainedReceipt, WrongChainId,
)
from ledger.standing import bonded_nodes, candidates, jail, mark_served
from ledger.tab import Claim, OpenTab
from ledger.tabrules import apply_claim, apply_open_tab
from ledger.state import JAIL, JOB, NODE, PENDING, UNIT, KEY_LOG, Overlay
from ledger.crypto import ZERO32
from ledger.codec import encode
from ledger.types import (
    BACKWARD, FORWARD, Appeal, Job, Receipt, Register, SpotFraud, SpotVote, Transfer,
    UnitTemplate, Verdict, binding_ok, peer_binding_ok, signature_ok, tx_hash, unit_id,
)
from ledger.records import Assignment, JobRecord, NodeRecord, Pending

#: Re-exported: the nodes that may work, as the chain's other readers know them.
__all__ = ["U64_MAX", "apply_tx", "bonded_nodes", "candidates", "draw_audits", "open_steps",
           "reassign_timeouts", "settle_pending"]


def apply_tx(st: Overlay, ctx: Any, tx: Any, encoded: bytes | None = None) -> None:
    """Check one transaction against the state and apply it.

    Args:
        st: the state to change.
        ctx: the block being applied.
        tx: the transaction.
        encoded: ``encode(tx)``, if the caller has it already.

    Raises:
        ValidationError: a subclass naming the broken rule; nothing written.
    """
    if tx.chain_id != ctx.chain_id:
        raise WrongChainId(f"signed for chain {tx.chain_id!r}, this is {ctx.chain_id!r}")
    handler = _HANDLERS.get(type(tx))
    if handler is None:  # the codec only builds known types; guard all the same
        raise BadAmount(f"not a transaction: {type(tx).__name__}")
    encoded = encode(tx) if encoded is None else encoded
    if not signature_ok(tx, encoded):
        raise BadSignature(f"{type(tx).__name__} signature does not verify")
    handler(st, ctx, tx, encoded)


# -- accounts ----------------------------------------------------------------------


def _apply_transfer(st: Overlay, ctx: Any, tx: Transfer, raw: bytes) -> None:
    check_nonce(st, tx.sender, tx.nonce)
    if tx.amount == 0:
        raise BadAmount("transfer of 0")
    if tx.recipient == tx.sender:
        raise BadAmount("transfer to self")
    sender = st.account(tx.sender)
    if sender.balance < tx.amount:
        raise InsufficientFunds(f"balance {sender.balance} < transfer of {tx.amount} (base units)")
    if st.account(tx.recipient).balance + tx.amount > U64_MAX:
        raise BadAmount("recipient balance would overflow")
    st.put_account(tx.sender, replace(sender, balance=sender.balance - tx.amount,
                                      nonce=sender.nonce + 1))
    credit(st, tx.recipient, tx.amount)


# -- nodes -------------------------------------------------------------------------


def _apply_register(st: Overlay, ctx: Any, tx: Register, raw: bytes) -> None:
    check_nonce(st, tx.account, tx.nonce)
    if not binding_ok(tx):
        raise BadSignature("node key did not sign the binding to this account")
    try:
        crypto.peer_public_key(tx.peer_id)
    except PeerIdError as exc:
        raise BadRegistration(f"cannot bind this peer id: {exc}") from None
    # Without the peer key's own signature an account could claim another
    # node's peer id, and clients would route to that node as this account's.
    if not peer_binding_ok(tx):
        raise BadRegistration("peer signature is missing or wrong: the key inside the peer id "
                              "did not sign the binding to this account and node key")
    if not tx.layer_start < tx.layer_end:
        raise BadRegistration(f"layers [{tx.layer_start}, {tx.layer_end}) are empty")
    account = st.account(tx.account)
    if account.balance < tx.bond:
        raise InsufficientFunds(f"balance {account.balance} < bond of {tx.bond} (base units)")
    taken = st.get(NODE + tx.node_key)
    if taken is not None and taken.account != tx.account:
        raise BadRegistration("node key is registered to another account")
    min_bond = st.params().min_bond
    if account.bond + tx.bond < min_bond:
        raise BadRegistration(f"bond {account.bond + tx.bond} is under the minimum {min_bond}")
    previous = _node_of(st, tx.account)
    if previous is not None and previous != tx.node_key:
        st.delete(NODE + previous)
    # A newly registered node queues behind those already waiting; else a
    # node could jump the longest-wait queue by re-registering a fresh key.
    served = account.last_served_height if previous is not None else ctx.height
    since = taken.registered_height if taken is not None else ctx.height
    st.put(NODE + tx.node_key, NodeRecord(tx.account, tx.peer_id, tx.layer_start, tx.layer_end,
                                          since))
    st.put_account(tx.account, replace(
        account, balance=account.balance - tx.bond, bond=account.bond + tx.bond,
        nonce=account.nonce + 1, last_served_height=served))


def _node_of(st: Overlay, account_id: bytes) -> bytes | None:
    for node_key in st.ids(NODE):
        if st.get(NODE + node_key).account == account_id:
            return node_key
    return None


# -- compute work ------------------------------------------------------------------


def _apply_receipt(st: Overlay, ctx: Any, tx: Receipt, raw: bytes) -> None:
    assignment = st.get(UNIT + tx.unit_id)
    if assignment is None or assignment.job_id != tx.job_id:
        raise UnassignedReceipt(f"unit {tx.unit_id.hex()[:16]}.. is not an open unit of that job")
    if assignment.node_key != tx.node_key:
        raise UnassignedReceipt(f"unit {tx.unit_id.hex()[:16]}.. is assigned to "
                                f"{assignment.node_key.hex()[:16]}.., not the signer")
    if assignment.done:
        raise UnassignedReceipt(f"unit {tx.unit_id.hex()[:16]}.. already has a receipt")
    node = st.get(NODE + tx.node_key)
    if node is None:
        raise NotRegistered("receipt signer is no longer registered")
    _check_links(st, assignment, tx)
    receipt_hash = tx_hash(tx, raw)
    unit = st.get(JOB + assignment.job_id).job.units[assignment.index]
    window = st.params().challenge_window
    st.put(UNIT + tx.unit_id, replace(assignment, done=True, input_hash=tx.input_hash,
                                      output_hash=tx.output_hash))
    jail = st.get(JAIL + node.account)
    if jail is not None and jail.until <= ctx.height:  # served its term and works again
        st.delete(JAIL + node.account)
    # Its audit is drawn at height + 2, from the beacon of the block in between,
    # which nobody knew when it was signed and its producer cannot choose.
    st.put(PENDING + receipt_hash, Pending(tx.job_id, node.account, tx.node_key,
                                           unit.layer_start, unit.layer_end, ctx.height,
                                           ctx.height + window, ZERO32, ZERO32, audit.DRAW_DUE,
                                           ctx.height + 2))
    log = st.log()
    frontier = merkle.Frontier(log.size, log.peaks).append(merkle.leaf_hash(raw))
    st.put(KEY_LOG, replace(log, size=frontier.size, peaks=frontier.peaks))
    ctx.log_appends.append(raw)


def _linked(a: UnitTemplate, b: UnitTemplate) -> bool:
    """Whether unit ``b`` takes unit ``a``'s output as its input.

    Whole-layer units of one kind and replica that meet: a forward unit
    ending where the next begins, a backward unit starting where the next
    (lower) one ends. Pieces of a layer are not chained (they share an input
    and are summed), nor are the units of different replicas (other data).
    """
    whole = a.head_start == a.head_end == 0 and b.head_start == b.head_end == 0
    if not whole or a.kind != b.kind or a.replica != b.replica:
        return False
    if a.kind == FORWARD:
        return a.layer_end == b.layer_start
    return a.kind == BACKWARD and b.layer_end == a.layer_start


def _check_links(st: Overlay, assignment: Assignment, tx: Receipt) -> None:
    """A receipt's hashes must chain with its done neighbours' (the units before and after).

    Attack note: this only makes the receipts of one step consistent with
    each other; it cannot tell which of two disagreeing receipts lied (the
    later one is refused). Re-execution (Proof-of-Learning verdicts) is what
    checks the hashes against the work.
    """
    units = st.get(JOB + assignment.job_id).job.units
    i = assignment.index
    for j, before in ((i - 1, True), (i + 1, False)):
        if not 0 <= j < len(units):
            continue
        a, b = (units[j], units[i]) if before else (units[i], units[j])
        if not _linked(a, b):
            continue
        other = st.get(UNIT + unit_id(assignment.job_id, assignment.step, units[j]))
        if other is None or not other.done:
            continue
        if before and other.output_hash != tx.input_hash:
            raise UnchainedReceipt(f"input hash {tx.input_hash.hex()[:16]}.. is not the output "
                                   f"{other.output_hash.hex()[:16]}.. of unit {j}")
        if not before and other.input_hash != tx.output_hash:
            raise UnchainedReceipt(f"output hash {tx.output_hash.hex()[:16]}.. is not the input "
                                   f"{other.input_hash.hex()[:16]}.. of unit {j}")


_HANDLERS = {
    Transfer: _apply_transfer, Register: _apply_register, Receipt: _apply_receipt,
    Verdict: apply_verdict, Appeal: apply_appeal, Job: apply_job, OpenTab: apply_open_tab,
    Claim: apply_claim, SpotFraud: apply_spot_fraud, SpotVote: apply_spot_vote,
}


# -- per-block bookkeeping ------------------------------------------------------------


def reassign_timeouts(st: Overlay, ctx: Any) -> None:
    """Jail every node that let a deadline pass; hand its units to the next-longest waiter."""
    late = [(uid, st.get(UNIT + uid)) for uid in st.ids(UNIT)]
    late = [(uid, a) for uid, a in late if not a.done and a.deadline < ctx.height]
    if not late:
        return
    for node_key in sorted({a.node_key for _, a in late}):
        jail(st, ctx, node_key)
    able = candidates(st)
    units = []
    for _, a in late:
        t = st.get(JOB + a.job_id).job.units[a.index]
        units.append((t.layer_start, t.layer_end))
    chosen = schedule.assign_units(units, able, ctx.prev_hash, ctx.height,
                                   exclude=[a.node_key for _, a in late])
    deadline = ctx.height + st.params().unit_timeout
    for (uid, a), node_key in zip(late, chosen):
        st.put(UNIT + uid, replace(a, node_key=node_key or a.node_key, deadline=deadline))
        if node_key is not None:
            mark_served(st, node_key, ctx.height)


def open_steps(st: Overlay, ctx: Any) -> None:
    """Move the training job on: close its step once every unit has a receipt, assign the next.

    One job trains at a time (`ledger.jobrules`): the started one, or, once
    it is finished (or given up: `give_up_stalled`), the first queued job
    whose first step can be assigned.
    """
    give_up_stalled(st, ctx)
    for job_id in job_queue(st):
        record = st.get(JOB + job_id)
        uids = [unit_id(job_id, record.step, t) for t in record.job.units]
        assignments = [st.get(UNIT + uid) for uid in uids]
        if any(a is not None for a in assignments):  # its step is open
            if not all(a is not None and a.done for a in assignments):
                return
            for uid in uids:
                st.delete(UNIT + uid)
            record = replace(record, step=record.step + 1)
            st.put(JOB + job_id, record)
            if record.step >= record.job.steps:
                continue  # finished: the next job may start in this block
            uids = [unit_id(job_id, record.step, t) for t in record.job.units]
        if _assign_step(st, ctx, job_id, record, uids):
            st.put(JOB + job_id, replace(record, started=True, moved=ctx.height))
            return
        if record.started:
            return  # it waits for nodes that serve its layers; no other job overtakes it


def _assign_step(st: Overlay, ctx: Any, job_id: bytes, record: JobRecord, uids: list) -> bool:
    """Assign the units of ``record``'s open step; False when some unit has no node to take it."""
    units = [(t.layer_start, t.layer_end) for t in record.job.units]
    chosen = schedule.assign_units(units, candidates(st), ctx.prev_hash, ctx.height)
    if any(node_key is None for node_key in chosen):
        return False  # some unit has no node serving its layers: try again next block
    deadline = ctx.height + st.params().unit_timeout
    for index, (uid, node_key) in enumerate(zip(uids, chosen)):
        st.put(UNIT + uid, Assignment(job_id, record.step, index, node_key, deadline, False,
                                      ZERO32, ZERO32))
        mark_served(st, node_key, ctx.height)
    return True
