"""Account bookkeeping every transaction rule shares: nonces, credits and minting.

Pure, over an `Overlay`. The transaction rules (`rules`, `tabrules`, `jobrules`,
`spotrules`) debit and credit through here, so an account's record changes in
one way.
"""

from __future__ import annotations

from dataclasses import replace

from ledger.errors import BadAmount, BadNonce, InsufficientFunds
from ledger.state import KEY_SUPPLY, Overlay

__all__ = ["U64_MAX", "check_credits", "check_nonce", "credit", "debit_deposit", "mint"]

U64_MAX = 2**64 - 1


def check_nonce(st: Overlay, account_id: bytes, nonce: int) -> None:
    """Raise unless ``nonce`` is the account's next.

    Raises:
        BadNonce: replayed (lower) or out of order (higher: ``ahead``).
    """
    expected = st.account(account_id).nonce
    if nonce != expected:
        what = "replayed" if nonce < expected else "out of order"
        raise BadNonce(f"nonce {nonce} is {what}: account expects {expected}",
                       ahead=nonce > expected)


def check_credits(st: Overlay, credits: dict[bytes, int]) -> None:
    """Raise if crediting each account its amount would take a balance past U64_MAX.

    Raises:
        BadAmount: naming the first account that would overflow.
    """
    for account_id, amount in credits.items():
        if st.account(account_id).balance + amount > U64_MAX:
            raise BadAmount(f"the balance of {account_id.hex()[:16]}.. would overflow")


def debit_deposit(st: Overlay, account_id: bytes, amount: int) -> None:
    """Take a transaction's ``amount`` deposit from its sender and use its nonce (the
    caller checked the nonce).

    Raises:
        InsufficientFunds: the balance is below ``amount``; nothing written.
    """
    account = st.account(account_id)
    if account.balance < amount:
        raise InsufficientFunds(f"balance {account.balance} < deposit of {amount} "
                                "(base units)")
    st.put_account(account_id, replace(account, balance=account.balance - amount,
                                        nonce=account.nonce + 1))


def credit(st: Overlay, account_id: bytes, amount: int) -> None:
    """Add ``amount`` to an account's balance (the caller checked it fits)."""
    account = st.account(account_id)
    st.put_account(account_id, replace(account, balance=account.balance + amount))


def mint(st: Overlay, account_id: bytes, amount: int) -> None:
    """Mint ``amount`` to an account, unless it would take the supply past U64_MAX (then nothing).

    So no balance can overflow: a reward that would is forfeited.
    """
    supply = st.get(KEY_SUPPLY)
    if amount and supply.premine + supply.minted - supply.burned + amount <= U64_MAX:
        credit(st, account_id, amount)
        st.put(KEY_SUPPLY, replace(supply, minted=supply.minted + amount))
