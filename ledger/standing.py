"""Who stands to work: the bonded nodes, the schedule's candidates, jail strikes.

Owns what both the transaction rules (`ledger.rules`) and the audit rules
(`ledger.auditrules`) read and change about a node's standing: whether its
account's bond lets it work (`bonded_nodes`, `candidates`), its place in the
longest-wait queue (`mark_served`), and its jail term (`jail`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ledger import schedule
from ledger.records import Account, Jail, NodeRecord
from ledger.state import JAIL, NODE, Overlay

#: A jail term is ``unit_timeout << min(strikes - 1, MAX_JAIL_DOUBLINGS)`` blocks.
MAX_JAIL_DOUBLINGS = 6


def bonded_nodes(st: Overlay) -> list[tuple[bytes, NodeRecord, Account]]:
    """Registered nodes whose account holds at least the minimum bond, in node-key order.

    The nodes that may be assigned work, and the servers a client routes
    inference through (`node.chain.views.registry_view`).

    Args:
        st: the state (to read a `ChainDB`'s: ``Overlay(chain.state)``).

    Returns:
        (node key, its record, its account) for each such node.
    """
    min_bond = st.params().min_bond
    out = []
    for node_key in st.ids(NODE):
        node = st.get(NODE + node_key)
        account = st.account(node.account)
        if account.bond >= min_bond:
            out.append((node_key, node, account))
    return out


def candidates(st: Overlay) -> list[schedule.Candidate]:
    """`bonded_nodes`, as the schedule ranks them (with any jail term)."""
    out = []
    for node_key, node, account in bonded_nodes(st):
        term = st.get(JAIL + node.account)
        out.append(schedule.Candidate(node_key, account.last_served_height,
                                      node.layer_start, node.layer_end,
                                      0 if term is None else term.until))
    return out


def jail(st: Overlay, ctx: Any, node_key: bytes) -> None:
    """One more strike for the account of ``node_key``: a term twice the last one.

    Attack note: the jail is kept per account, not per node key, so that
    registering a fresh node key does not walk out of it. A node that missed
    a deadline only because it was slow pays with a shorter queue position,
    never with coins: slashing is for work that verifiably lied.
    """
    node = st.get(NODE + node_key)
    if node is None:  # deregistered since: nothing to keep out
        return
    held = st.get(JAIL + node.account)
    strikes = 1 if held is None else held.strikes + 1
    term = st.params().unit_timeout << min(strikes - 1, MAX_JAIL_DOUBLINGS)
    st.put(JAIL + node.account, Jail(ctx.height + term, min(strikes, 2**32 - 1)))


def mark_served(st: Overlay, node_key: bytes, height: int) -> None:
    """Put ``node_key``'s account at the back of the longest-wait queue, as of ``height``."""
    account_id = st.get(NODE + node_key).account
    st.put_account(account_id, replace(st.account(account_id), last_served_height=height))
