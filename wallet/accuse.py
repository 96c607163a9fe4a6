"""A client's accusation on chain: a `SpotFraud` built from a spot check's evidence file.

`pwallet accuse` reads a ``.spot`` file (`wallet.client.spotcheck` writes
one for each settled mismatch, specs/network.md 9.5), checks here what the
chain would check without its state (the evidence holds together, it names
a loser, the transaction fits), and signs the accusation; the chain's rules
(`ledger.spotrules`, specs/ledger.md 5.2) judge the rest: whether the
accused key is a bonded node's, whether the answer was accused before.
"""

from __future__ import annotations

from pathlib import Path

from ledger.codec import decode, encode
from ledger.crypto import SigningKey
from ledger.errors import DecodeError
from ledger.spot import SpotEvidence, check_evidence
from ledger.types import MAX_SPOT_FRAUD_BYTES, ZERO_SIG, SpotFraud, sign
from wallet.errors import BadEvidence


def read_evidence(path: str | Path) -> SpotEvidence:
    """The evidence in ``path``, if the chain could take it.

    Raises:
        BadEvidence: not an encoded `SpotEvidence`, evidence that does not
            hold (`ledger.spot.check_evidence`), or unsettled (no loser).
        OSError: the file cannot be read.
    """
    try:
        evidence = decode(Path(path).read_bytes(), SpotEvidence)
    except DecodeError as exc:
        raise BadEvidence(f"{path} is not spot-check evidence: {exc}") from None
    why = check_evidence(evidence)
    if why is None and evidence.loser >= len(evidence.answers):
        why = "it is unsettled (no majority): it accuses nobody"
    if why is not None:
        raise BadEvidence(f"{path}: the chain would refuse it: {why}")
    return evidence


def spot_fraud(evidence: SpotEvidence, key: SigningKey, chain_id: str, nonce: int,
               deposit: int) -> tuple[SpotFraud, int]:
    """The signed accusation of ``evidence``'s loser by ``key``'s account, and its size.

    Raises:
        BadEvidence: the accusation is over `MAX_SPOT_FRAUD_BYTES` encoded.
    """
    tx = sign(SpotFraud(chain_id, key.public, evidence, deposit, nonce, ZERO_SIG), key)
    size = len(encode(tx))
    if size > MAX_SPOT_FRAUD_BYTES:
        raise BadEvidence(f"an accusation of {size} bytes: the chain takes at most "
                          f"{MAX_SPOT_FRAUD_BYTES} (a shorter history: an earlier lie)")
    return tx, size
