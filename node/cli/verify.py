"""`pnode proof` and `pnode verify chain|block|proof`: proofs written and checked, exit 1 when wrong."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from ledger.codec import from_json
from ledger.errors import DecodeError, ValidationError
from ledger.proofs import ReceiptProof, TxProof, verify_receipt_proof, verify_tx_proof
from node.cli import common
from node.cli.common import EXIT_CHECK_FAILED, data_dir_option, emit, json_option, read_view
from node.cli.pol import verify_cert, verify_pol
from node.datadir import DataDir
from node.errors import ChainCorruptError, ProofError


@click.command()
@click.argument("receipt_id", metavar="ID")
@data_dir_option
def proof(receipt_id, data_dir) -> None:
    """Write the inclusion proof of a receipt or a transaction (JSON) to stdout.

    A receipt (a unit's, in the log) gets a proof against the tip's log root;
    any other transaction (a transfer, a tab, a claim that paid a server)
    one against its block's transaction root. ID is the id in hex or, as
    `pnode job` commands take, a prefix that only one id starts with.

    \b
    Examples:
      pnode proof 3fa1...c9 --data-dir D > receipt.proof
      pnode proof 3f73260d --data-dir D > receipt.proof      # a prefix will do
      pnode proof "$(pwallet infer Hi --max-price 10 --json | jq -r '.claims[0]')" > claim.proof
      pnode verify proof claim.proof --data-dir D
    """
    found = read_view(DataDir(data_dir), "proof", txid=receipt_id)  # an id or a prefix
    found.pop("running")
    click.echo(json.dumps(found, indent=2))


@click.group()
def verify() -> None:
    """Check the ledger, a proof or a window of work; exit 0 if it holds, 1 if it does not."""


@verify.command("chain")
@data_dir_option
@json_option
def verify_chain(data_dir, as_json) -> None:
    """Re-validate every block from genesis, the supply and the stored state.

    \b
    Example:
      pnode verify chain --data-dir D && echo ok
    """
    _verify(data_dir, as_json, upto=None)


def _verify(data_dir: str, as_json: bool, upto: int | None) -> None:
    from node.errors import BadRequest

    try:
        with _progress(as_json, upto) as progress:
            result = read_view(DataDir(data_dir), "verify", local={"progress": progress},
                               upto=upto)
    except ChainCorruptError as exc:
        result = {"ok": False, "error": type(exc).__name__, "reason": str(exc)}
    except BadRequest as exc:
        raise click.BadParameter(str(exc)) from None
    _report(as_json, result, lambda: f"ok: {result['height'] + 1} blocks valid, up to "
                                     f"{result['tip'][:16]}")


def _report(as_json: bool, result: dict, ok_text) -> None:
    """Print a check's result; exit 1 when it failed."""
    if result["ok"]:
        emit(as_json, result, ok_text)
        return
    emit(as_json, result, f"FAIL {result['error']}: {result['reason']}")
    sys.exit(EXIT_CHECK_FAILED)


@contextmanager
def _progress(quiet: bool, upto: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal's stderr, fed with the height verified so far."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True,
                  disable=quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("verifying blocks", total=None)
        yield lambda h: bar.update(task, completed=h, total=max(upto or 0, h, 1))


@verify.command("block")
@click.argument("height", type=click.IntRange(0))
@data_dir_option
@json_option
def verify_block(height, data_dir, as_json) -> None:
    """Re-validate the chain from genesis up to block HEIGHT.

    \b
    Example:
      pnode verify block 42 --data-dir D
    """
    _verify(data_dir, as_json, upto=height)


@verify.command("proof")
@click.argument("proof_file", type=click.Path(dir_okay=False))
@click.option("--block-hash", help="Also require the proof's header to be this block.")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Also require the proof's header to be on this node's main chain.")
@json_option
def verify_proof(proof_file, block_hash, data_dir, as_json) -> None:
    """Check a receipt or transaction proof written by `pnode proof`.

    \b
    Examples:
      pnode verify proof receipt.proof
      pnode verify proof claim.proof --data-dir D   # header must be on our chain
    """
    try:
        doc = json.loads(Path(proof_file).read_text())
        kind = TxProof if isinstance(doc, dict) and doc.pop("kind", None) == "TxProof" else \
            ReceiptProof
        proof_obj = from_json(doc, kind)
    except (OSError, ValueError, DecodeError) as exc:
        raise ProofError(f"cannot read proof file {proof_file}: {exc}") from None
    trusted = common.parse_address(block_hash) if block_hash else None
    if data_dir:
        found = read_view(DataDir(data_dir), "hash", height=proof_obj.header.height)["hash"]
        # Above our tip, a header cannot be on our chain: nothing matches 32 zero bytes.
        trusted = bytes.fromhex(found) if found else b"\x00" * 32
    try:
        (verify_tx_proof if kind is TxProof else verify_receipt_proof)(proof_obj, trusted)
        result = {"ok": True, "kind": kind.__name__, "height": proof_obj.header.height,
                  "index": proof_obj.index}
    except ValidationError as exc:
        result = {"ok": False, "error": type(exc).__name__, "reason": str(exc)}
    what = (f"{type(proof_obj.tx).__name__} is transaction {proof_obj.index} of the block"
            if kind is TxProof else f"receipt is leaf {proof_obj.index} of the log")
    _report(as_json, result, lambda: f"ok: {what} at height {proof_obj.header.height}")


verify.add_command(verify_cert)  # node/cli/pol.py: re-executing a window file
verify.add_command(verify_pol)  # node/cli/pol.py: the join-time audit
