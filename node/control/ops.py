"""Every op a running node answers on its control socket (``D/node.sock``).

Owns `NodeOps`: ``status``, ``account``, ``view``, ``submit_tx`` and
``hold_production`` read or feed the chain; ``pol_export``, ``pol_audit``
and ``export_job`` reach the mining node's `node.mine.JobRunner` (refused
while the node mines no job). The channel itself, and how an op's
`BadRequest` becomes a one-line error answer, is `node.control.server`'s.
A new op is a method here named in `NodeOps.table`.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Protocol

import trio

from ledger.codec import decode
from ledger.types import TX_TYPES
from node.chain import LOCAL_ONLY, ChainService, account_view, node_status_view, read_views
from node.control.server import ControlOp
from node.errors import BadRequest

__all__ = ["NodeOps", "RunningNode"]


class RunningNode(Protocol):
    """What the ops read of the running `node.node.Node` (None while not yet, or no more)."""

    service: ChainService | None
    txs: Any  # node.chain.TxGossip
    producer: Any  # node.chain.Producer
    jobs: Any  # node.mine.JobRunner (a mining node's)
    addr: str | None
    address: bytes | None
    node_key: bytes | None
    production_held: bool

    def extra_status(self) -> dict[str, Any]: ...


class NodeOps:
    """The control ops of one running node.

    Args:
        node: the node whose chain, producer and job runner the ops read.
    """

    def __init__(self, node: RunningNode) -> None:
        self.node = node

    def table(self) -> dict[str, ControlOp]:
        """Op name -> handler, for `node.control.ControlServer`."""
        return {"status": self.status, "account": self.account, "submit_tx": self.submit_tx,
                "hold_production": self.hold_production, "view": self.view,
                "pol_export": self.pol_export, "pol_audit": self.pol_audit,
                "export_job": self.export_job}

    # -- the chain ------------------------------------------------------------------------

    async def status(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``status`` op: chain tip, peers, this node's registration and wallet."""
        service = self._running()
        host = service.host
        info = await service.call(self._chain_status)
        info.update(
            pid=os.getpid(), peer_id=str(host.peer_id), listen=self.node.addr,
            peers=sorted(str(p) for p in host.connected_peers()),
            misbehaving={str(p): n for p, n in host.misbehaving.items()},
            producing=bool(self.node.producer and self.node.producer.eligible),
            blocks_produced=len(self.node.producer.made) if self.node.producer else 0)
        info.update(self.node.extra_status())
        return info

    async def hold_production(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``hold_production`` op: seal no more blocks, keep following the chain.

        A devnet winding down holds every producer, lets the last block
        spread, and only then stops the nodes: they end on one tip.
        """
        self._running()
        self.node.production_held = True
        if self.node.producer is not None:
            self.node.producer.hold()
        return {"held": True}

    async def account(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``account`` op: ``address`` (hex) -> balance, bond, nonce, queued txs."""
        text = args.get("address")
        try:
            account_id = bytes.fromhex(text) if isinstance(text, str) else b""
        except ValueError:
            account_id = b""
        if len(account_id) != 32:
            raise BadRequest('"address" must be an account id: 64 hex digits')
        return await self._running().call(self._account, account_id)

    async def view(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``view`` op: ``name`` of a `read_views` view, ``args`` -> ``view``: its answer."""
        views = read_views()
        fn, kwargs = views.get(args.get("name")), args.get("args", {})
        if fn is None:
            raise BadRequest(f'"name" must be one of {", ".join(sorted(views))}')
        allowed = [p for p in list(inspect.signature(fn).parameters)[1:] if p not in LOCAL_ONLY]
        if not isinstance(kwargs, dict) or not set(kwargs) <= set(allowed):
            raise BadRequest(f'"args" of view {args["name"]} are among '
                             f'{", ".join(allowed) or "none"}')
        service = self._running()
        return {"view": await service.call(lambda: fn(service.chain, **kwargs))}

    async def submit_tx(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``submit_tx`` op: ``tx`` (hex of ``encode(tx)``) -> admitted and gossiped.

        Raises:
            BadRequest: ``tx`` is not hex.
            DecodeError, ValidationError: not a transaction, or it does not fit.
        """
        text = args.get("tx")
        try:
            raw = bytes.fromhex(text) if isinstance(text, str) else None
        except ValueError:
            raw = None
        if raw is None:
            raise BadRequest('"tx" must be the hex of an encoded transaction')
        self._running()
        txid = await self.node.txs.submit(decode(raw, TX_TYPES))
        return {"txid": txid.hex()}

    def _running(self) -> ChainService:  # the chain service, unless the node is stopping
        if self.node.service is None or self.node.txs is None:
            raise BadRequest("the node is stopping")
        return self.node.service

    def _chain_status(self) -> dict[str, Any]:
        """Chain fields of ``status`` (on the chain service's thread)."""
        return node_status_view(self.node.service.chain, self.node.address, self.node.node_key)

    def _account(self, account_id: bytes) -> dict[str, Any]:
        """The ``account`` op's answer (on the chain service's thread)."""
        return account_view(self.node.service.chain, account_id)


    # -- the job runner -------------------------------------------------------------------

    def _jobs(self):
        """The node's `JobRunner`, refused while the node mines no job."""
        if self.node.jobs is None:
            raise BadRequest("this node mines no job")
        return self.node.jobs

    async def pol_export(self, args: dict) -> dict:
        """The ``pol_export`` op: a window file of the kept units (`node.pol.export_op`)."""
        from ledger.state import JOB
        from node.pol import export_op

        jobs, job = self._jobs(), None
        if jobs.miner is not None:  # the window carries the job's signed transaction
            service, job_id = self._running(), jobs.miner.job_id
            record = await service.call(lambda: service.chain.state.get(JOB + job_id))
            job = record.job if record is not None else None
        return await _pol_refusal(export_op(jobs.archive, job, args))

    async def pol_audit(self, args: dict) -> dict:
        """The ``pol_audit`` op: judge recent receipts, replay windows (`Verifier.audit`)."""
        verifier = self._jobs().verifier
        if verifier is None:
            raise BadRequest("this node runs no verifier yet (it has no job to mine)")
        return await _pol_refusal(verifier.audit(args))

    async def export_job(self, args: dict) -> dict:
        """The ``export_job`` op: write a job's whole model (`Miner.export_weights`) to ``out``.

        Args (of the op): ``job`` (an id or hex prefix of a job this node
        mined), ``out`` (an absolute path ending in .safetensors or .gguf,
        `compute.export`).

        Returns:
            job (id), step (updates in the weights), out, format, bytes,
            tensors, parameters and sha256 (of the file).

        Raises:
            BadRequest: no such job mined here, a path it cannot write, or a
                format the job's model cannot take.
            MinerError: the weights cannot be gathered (see `Miner.export_weights`).
        """
        from compute.errors import ModelFileError
        from compute.export import FORMATS, save_export
        from compute.hashing import file_sha256
        from compute.jobfile import config_json

        miners = self._jobs().miners
        text, out = str(args.get("job") or "").lower(), args.get("out")
        found = [j for j in miners if j.hex().startswith(text)] if text else []
        if len(found) != 1:
            raise BadRequest(f"this node mined no job with an id starting {text!r}" if not found
                           else f"{len(found)} jobs mined here start with {text!r}")
        if not isinstance(out, str) or not out.startswith("/") or \
                not out.endswith(FORMATS):
            raise BadRequest(f'"out" must be an absolute path ending in {" or ".join(FORMATS)}')
        miner, path = miners[found[0]], Path(out)
        version, weights = await miner.export_weights()
        try:
            await trio.to_thread.run_sync(save_export, path, weights, config_json(miner.config),
                                          found[0].hex(), version)
        except ModelFileError as exc:
            raise BadRequest(str(exc)) from None
        except OSError as exc:
            raise BadRequest(f"cannot write {out}: {exc.strerror}") from None
        return {"job": found[0].hex(), "step": version, "out": out, "format": path.suffix[1:],
                "bytes": path.stat().st_size, "tensors": len(weights),
                "parameters": sum(t.numel() for t in weights.values()),
                "sha256": await trio.to_thread.run_sync(file_sha256, path)}



async def _pol_refusal(call):
    """``await call``, a `PolError` (a bad window, a bad request) turned into a refusal."""
    from proof_of_learning.errors import PolError

    try:
        return await call
    except PolError as exc:
        raise BadRequest(str(exc)) from None
