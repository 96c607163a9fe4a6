"""Both sides of `/pnode/pol/1.0.0`: serving the archive, and fetching by hash with checks.

Owns `serve_pol` (the request handler over a `PolArchive`) and `PolFetcher`,
the verifier's side (specs/pol.md 8). Every reply is checked against the
hash asked for: a certificate must hash to its `cert_hash`, a tensor to its
digest, a named set to its `tensors_digest` (a part's full state, which
nothing commits as a whole, only for its form: its caller checks it by the
weights it gives, `proof_of_learning.joinaudit`); a reply that does not is
discarded (the peer is marked) and the next holder is asked. A fetcher
that runs out of holders returns None, which the verifier turns into
`UNAVAILABLE`, never a fail.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from libp2p.peer.id import ID

from compute.wiretensor import WireTensorError, decode_tensor, encode_tensor
from ledger import crypto
from ledger.codec import decode, encode
from ledger.errors import DecodeError
from proof_of_learning.units import named_digest, tensor_digest
from node.net import Host, RequestError
from node.pol.archive import PolArchive, state_key
from node.wire import (
    CERT, EVIDENCE, MAX_POL_FRAME, NAMED, POL_KINDS, POL_PROTOCOL, STATE, TENSOR, NamedTensor,
    PolReply, PolRequest,
)
from proof_of_learning.errors import PolError

log = logging.getLogger(__name__)

__all__ = ["ArchiveFetcher", "PolFetcher", "serve_pol"]

_NOT_FOUND = PolReply(0, b"", ())


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return encode_tensor(t)  # raw: bit-exact, so the digest survives the wire


def reply_for(archive: PolArchive, request: PolRequest) -> PolReply:
    """What the archive answers to ``request`` (not found: ``found`` 0)."""
    if request.kind in (CERT, EVIDENCE):
        data = archive.encoded(request.key)
        return _NOT_FOUND if data is None else PolReply(1, data, ())
    if request.kind == TENSOR:
        t = archive.tensor(request.key)
        return _NOT_FOUND if t is None else PolReply(1, b"", (NamedTensor("t", _tensor_bytes(t)),))
    named = archive.named(request.key) if request.kind == NAMED else archive.state(request.key)
    if named is None:
        return _NOT_FOUND
    return PolReply(1, b"", tuple(NamedTensor(n, _tensor_bytes(t))
                                  for n, t in sorted(named.items())))


def serve_pol(archive: PolArchive):
    """The `POL_PROTOCOL` request handler over ``archive`` (for `Host.set_request_handler`).

    Anyone may ask: what a worker keeps is what its receipts already
    commit to, and a verifier's evidence is public (specs/pol.md 6.6).

    Raises (from the handler):
        DecodeError: not a `PolRequest`, or an unknown kind (the host
            resets the stream and marks the peer).
    """
    async def handle(peer: ID, request: bytes) -> bytes:
        req = decode(request, PolRequest)
        if req.kind >= len(POL_KINDS):
            raise DecodeError(f"unknown pol request kind {req.kind}")
        return encode(reply_for(archive, req))
    return handle


class PolFetcher:
    """Fetches certificates, evidence and tensors by hash from a list of peers, checked.

    Args:
        host: this node's host.
        wait_s: most seconds one request waits.
    """

    def __init__(self, host: Host, wait_s: float = 20.0):
        self.host, self.wait_s = host, wait_s
        self.bad: dict[str, str] = {}  # peer: why its last reply was discarded

    async def _ask(self, peers: Sequence[str], kind: int, job_id: bytes, key: bytes, check):
        """The first checked answer from ``peers`` in order; None when none gives one."""
        for peer in peers:
            try:
                request = encode(PolRequest(kind, job_id, key))
                raw = await self.host.request(peer, POL_PROTOCOL, request, timeout=self.wait_s,
                                              max_response_size=MAX_POL_FRAME)
                reply = decode(raw, PolReply, max_size=MAX_POL_FRAME)
                if not reply.found:
                    continue
                return check(reply)
            except RequestError as exc:
                log.info("pol %s %s.. from %s: %s", POL_KINDS[kind], key.hex()[:16], peer, exc)
            except (DecodeError, WireTensorError, PolError, ValueError) as exc:
                self.bad[str(peer)] = f"{POL_KINDS[kind]} {key.hex()[:16]}..: {exc}"
                log.warning("pol: %s sent a bad %s: %s", peer, POL_KINDS[kind], exc)
        return None

    async def cert_bytes(self, peers: Sequence[str], job_id: bytes, key: bytes) -> bytes | None:
        """The encoding of the certificate whose `cert_hash` is ``key`` (not decoded here:
        bytes that hash right but do not decode are the worker's fault, `MALFORMED`)."""
        return await self._ask(peers, CERT, job_id, key, lambda r: _hashing_to(r.data, key))

    async def tensor(self, peers: Sequence[str], job_id: bytes, digest: bytes
                     ) -> torch.Tensor | None:
        def check(reply: PolReply) -> torch.Tensor:
            if len(reply.tensors) != 1:
                raise ValueError(f"{len(reply.tensors)} tensors for one digest")
            t = decode_tensor(reply.tensors[0].data)
            if tensor_digest(t) != digest:
                raise ValueError("a tensor that does not match its digest")
            return t
        return await self._ask(peers, TENSOR, job_id, digest, check)

    async def named(self, peers: Sequence[str], job_id: bytes, key: bytes
                    ) -> tuple[dict[str, torch.Tensor], dict[str, bytes]] | None:
        """The named set whose `tensors_digest` is ``key``, with each tensor's digest."""
        def check(reply: PolReply) -> tuple[dict[str, torch.Tensor], dict[str, bytes]]:
            named = {t.name: decode_tensor(t.data) for t in reply.tensors}
            digests = {n: tensor_digest(t) for n, t in named.items()}
            if len(named) != len(reply.tensors) or named_digest(digests) != key:
                raise ValueError("named tensors that do not match their digest")
            return named, digests
        return await self._ask(peers, NAMED, job_id, key, check)

    async def state(self, peers: Sequence[str], job_id: bytes, step: int, part: int
                    ) -> dict[str, torch.Tensor] | None:
        """A part's full state at ``step`` (weights and AdamW entries by slice key).

        Nothing on chain commits a state as a whole: the caller checks its
        weights against the receipts of ``step`` and its moments by what
        they lead to (`proof_of_learning.joinaudit`). Here only its form is checked.
        """
        def check(reply: PolReply) -> dict[str, torch.Tensor]:
            named = {t.name: decode_tensor(t.data) for t in reply.tensors}
            if len(named) != len(reply.tensors) or not named:
                raise ValueError("a state with no tensors or a name twice")
            return named
        return await self._ask(peers, STATE, job_id, state_key(job_id, step, part), check)


def _hashing_to(data: bytes, key: bytes) -> bytes:
    if crypto.domain_hash(crypto.H_CERT, data) != key:
        raise ValueError("certificate bytes that do not hash to the cert_hash asked for")
    return data


class ArchiveFetcher(PolFetcher):
    """A `PolFetcher` answered by archives in this process, by peer name.

    What `pnode verify cert` judges a window file with (offline), and the
    judge's tests: the same `reply_for` the protocol handler answers with,
    through the codec, and the same checks on every reply.
    """

    def __init__(self, archives: dict[str, PolArchive]):
        super().__init__(host=None)
        self.archives = archives
        self.bytes = 0  # of every reply, as it would cross the wire

    async def _ask(self, peers, kind, job_id, key, check):
        for peer in peers:
            raw = encode(reply_for(self.archives[peer], PolRequest(kind, job_id, key)))
            self.bytes += len(raw)
            reply = decode(raw, PolReply, max_size=MAX_POL_FRAME)
            if reply.found:
                return check(reply)
        return None
