"""Every error the ledger package raises.

One root, `LedgerError`, so callers can catch the package as a whole; small
subclasses that say what was expected and what came. Consensus rejections
derive from `ValidationError` so a node can tell "this block is invalid"
(punish the sender) from "my disk is broken" (stop).
"""

from __future__ import annotations


class LedgerError(Exception):
    """Root of every error raised by the ledger package."""


# -- encoding ---------------------------------------------------------------


class DecodeError(LedgerError):
    """Bytes that are not a canonical encoding of the expected object."""


class PeerIdError(LedgerError, ValueError):
    """Bytes that are not a libp2p peer id with an inlined Ed25519 key."""


class EncodeError(LedgerError):
    """An object that cannot be encoded (wrong field type or range)."""


# -- storage ----------------------------------------------------------------


class StoreError(LedgerError):
    """The key-value store failed or holds something it should not."""


class StoreLockedError(StoreError):
    """Another process holds the store open."""


class StoreClosedError(StoreError):
    """The store was used after close()."""


class StoreCorruptError(StoreError):
    """The store's contents contradict themselves (a bug or a damaged disk)."""


class StoreFailedError(StoreError):
    """A write failed (a full disk, an I/O error): the handle was closed at once.

    Attack note: LevelDB appends a failed write's bytes to its log anyway; a
    later write that succeeds lands after that torn record, and recovery on the
    next open drops everything from the tear on: blocks the node had already
    announced. Closing the handle on the first failure means nothing can.
    """


class StoreRecoveryError(StoreCorruptError):
    """Opening the store found damage that LevelDB's recovery would drop (strict mode)."""


# -- validation -------------------------------------------------------------


class ValidationError(LedgerError):
    """A transaction or block breaks a consensus rule."""


class BadSignature(ValidationError):
    """A signature that does not verify under the key it must come from."""


class WrongChainId(ValidationError):
    """An object signed for another chain."""


class BadNonce(ValidationError):
    """A replayed or out-of-order account nonce.

    A field, not a subclass, tells the two apart: the class's name is part
    of the refusal's text on the wire (a control answer, a `TxResult`).

    Attributes:
        ahead: the nonce is above the account's next ("out of order": its
            predecessors may still come), not below it (replayed).
    """

    def __init__(self, message: str, *, ahead: bool = False):
        super().__init__(message)
        self.ahead = ahead


def in_context(exc: LedgerError, where: str) -> LedgerError:
    """``exc`` again, its text prefixed by ``where`` (its type and fields kept)."""
    again = type(exc)(f"{where}: {exc}")
    again.__dict__.update(exc.__dict__)
    return again


class InsufficientFunds(ValidationError):
    """A spend (or bond) larger than the balance (covers double spends)."""


class BadAmount(ValidationError):
    """A zero, overflowing or otherwise impossible amount."""


class WrongPrevHash(ValidationError):
    """A header whose prev_hash is not its parent's hash."""


class WrongHeight(ValidationError):
    """A header whose height is not its parent's height + 1."""


class WrongProducer(ValidationError):
    """A block signed by a node that may not produce at this height."""


class BadTime(ValidationError):
    """A block time before its slot, not after its parent, or too far ahead."""


class TimeInFuture(BadTime):
    """A block time further ahead of the local clock than the chain allows."""


class BadBeacon(ValidationError):
    """A VRF proof (a block's beacon, specs/ledger.md 5.1) that does not verify."""


class BadTxsRoot(ValidationError):
    """A header whose txs_root does not match its transactions."""


class BadLogRoot(ValidationError):
    """A header whose log_root / log_size do not match the receipt log."""


class BadStateRoot(ValidationError):
    """A header whose state_root does not match the state after the block."""


class TooManyTxs(ValidationError):
    """A block with more transactions than the chain allows."""


class UnassignedReceipt(ValidationError):
    """A receipt for a unit that is not (or no longer) assigned to its signer."""


class UnchainedReceipt(ValidationError):
    """A receipt whose input or output hash does not match its neighbour unit's receipt."""


class NotRegistered(ValidationError):
    """A node key or account that the transaction needs to be registered."""


class BadRegistration(ValidationError):
    """A registration with bad layers, a too-small bond, a taken node key, or a peer id
    whose key did not sign the binding."""


class BadVerdict(ValidationError):
    """A verdict on an unknown receipt, from the wrong verifier, or repeated."""


class BadAppeal(ValidationError):
    """An appeal against no failing verdict, out of its window, or by another node."""


class BadSpotFraud(ValidationError):
    """A spot-check accusation whose evidence does not hold, accuses no bonded node, was
    judged already, is oversize, or whose deposit is short (specs/ledger.md 5.2)."""


class BadSpotVote(ValidationError):
    """A vote on no open spot case, by a node not drawn for it, repeated, or unknown."""


class BadJob(ValidationError):
    """A job from a creator who may not post jobs, or with a malformed plan."""


class BadTab(ValidationError):
    """An `OpenTab` with no lanes, a lane twice, a zero cap, or an expiry out of range."""


class UnknownTab(ValidationError):
    """A claim on a tab that was never opened, or that expired or closed since."""


class BadVoucher(ValidationError):
    """A voucher not signed by its tab's client, or not naming one amount per lane."""


class NotALane(ValidationError):
    """A claim from a node key that is not one of its tab's lanes."""


class LaneClosed(ValidationError):
    """A claim from a lane that its server closed already."""


class StaleVoucher(ValidationError):
    """A claim whose voucher pays no lane anything new (and does not close a lane)."""


class BadGenesis(ValidationError):
    """A genesis description that cannot start a chain."""


class UnknownParent(ValidationError):
    """A block whose parent this node does not have (sync first)."""


class ForkTooDeep(ValidationError):
    """A side branch that forks further back than a node will reorganise."""


class SupplyMismatch(ValidationError):
    """Balances, bonds and the coins tabs and jobs lock do not add up to the coins minted by rule."""
