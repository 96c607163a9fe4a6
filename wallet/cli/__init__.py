"""`pwallet`: wallet keys, balances, transfers and history.

Works against a local data dir. While `pnode start` runs on it, `balance`
and `send` ask the node through its control socket (the node holds the
store): `send` then takes its nonce from the node's view, queued
transactions included, and the node admits the transfer to its mempool and
gossips it. Otherwise `send` checks the transfer against the stored chain
and queues it in the mempool for `pnode produce`. No rule lives here.
"""

from __future__ import annotations

import json
import os
import time

import click

from ledger.crypto import SigningKey
from ledger.types import ZERO_SIG, Transfer, sign
from node.cli import common
from node.cli.common import (
    coins, data_dir_option, emit, format_coins, in_coins, json_option, parse_address,
    parse_coins, passphrase_option, read_view,
)
from node.datadir import DataDir
from node.datadir import read_key_file, read_public_key, write_key_file
from wallet.cli.infer import _account_view, _light, infer, wallet_option
from wallet.errors import WalletError

light_option = click.option("--peers", "peer", metavar="MULTIADDR", default=None,
                            help="Ask this node (with /p2p/<peer id>) over the network "
                                 "instead of one on --data-dir: a wallet without a node.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main_group() -> None:
    """pwallet: spend and track pnode coins.

    \b
    Examples:
      pwallet create --name bob                 # a new encrypted key
      pwallet balance --json
      pwallet send 5e3c...a1 2.5                # send 2.5 coins
      pwallet history
      pwallet accuse EVIDENCE.spot             # a server a spot check caught lying
    """


@main_group.command()
@data_dir_option
@click.option("--name", required=True, help="Wallet name: stored as wallets/NAME.json.")
@passphrase_option
@json_option
def create(data_dir, name, passphrase_file, as_json) -> None:
    """Create a new wallet key, encrypted with a passphrase.

    \b
    Example:
      PNODE_PASSPHRASE=secret pwallet create --name savings
    """
    dd = DataDir(data_dir)  # a node's, or a wallet-only one (`pwallet --peers` uses it)
    path = dd.wallet_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = SigningKey(os.urandom(32))
    write_key_file(path, key.seed(), common.passphrase(passphrase_file, confirm=True))
    emit(as_json, {"name": name, "address": key.public.hex(), "file": str(path)},
         f"created wallet {name}: {key.public.hex()}")


@main_group.command()
@click.argument("address", required=False)
@data_dir_option
@wallet_option
@light_option
@json_option
def balance(address, data_dir, wallet_name, peer, as_json) -> None:
    """Balance and bond of an address (default: this wallet).

    \b
    Examples:
      pwallet balance
      pwallet balance 5e3c...a1 --json
      pwallet balance --peers /ip4/10.0.0.5/tcp/4001/p2p/12D3KooW...   # no node here
    """
    dd = DataDir(data_dir)
    account_id = _account(dd, address, wallet_name)
    view = _account_view(dd, account_id, peer)
    info = {k: view[k] for k in ("address", "height", "balance", "bond", "nonce", "queued",
                                 "running")}
    emit(as_json, in_coins(info, "balance", "bond"),
         f"{coins(info['balance'])} (bond {format_coins(info['bond'])}) at height "
         f"{info['height']}")


@main_group.command()
@click.argument("recipient")
@click.argument("amount")
@data_dir_option
@wallet_option
@passphrase_option
@light_option
@click.option("--wait", "wait", is_flag=True,
              help="Wait until the transfer is in a block; print its height and inclusion proof.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 86_400), default=120.0,
              show_default=True, help="Seconds --wait waits before it gives up (exit 1).")
@json_option
def send(recipient, amount, data_dir, wallet_name, passphrase_file, peer, wait, timeout_s,
         as_json) -> None:
    """Send AMOUNT coins to RECIPIENT (queued for the next block).

    \b
    Examples:
      pwallet send 5e3c...a1 2.5 --passphrase-file pass.txt
      pwallet send 5e3c...a1 2.5 --wait --json | jq .proof > transfer.proof
      pwallet send 5e3c...a1 2.5 --peers MULTIADDR      # through that node: no node here
    """
    to, units = parse_address(recipient), parse_coins(amount)
    if wait and peer:
        raise click.UsageError("--wait follows the node on --data-dir: not with --peers")
    dd = DataDir(data_dir)
    key = SigningKey(read_key_file(dd.wallet_path(wallet_name),
                                   common.passphrase(passphrase_file)))
    view = _account_view(dd, key.public, peer)
    if wait and not view["running"]:
        raise click.UsageError(f"--wait needs a running node on {dd.path}: a stopped one "
                               "seals nothing (`pnode start`, or `pnode produce`)")
    nonce = view["next_nonce"]
    tx = sign(Transfer(view["chain_id"], key.public, to, units, nonce, ZERO_SIG), key)
    if peer:  # the peer admits and gossips it
        txid = _light(peer, lambda p: p.submit(tx))
    else:
        txid = common.submit_tx(dd, tx, view["running"])
    info = {"txid": txid.hex(), "nonce": nonce, "amount": format_coins(units),
            "amount_units": units, "running": view["running"]}
    queued = f"queued {coins(units)} to {recipient[:16]}..  txid {txid.hex()}"
    if not wait:
        emit(as_json, info, queued)
        return
    if not as_json:
        click.echo(queued)
    proof = _wait_included(dd, txid, timeout_s)
    info.update(height=proof["header"]["height"], index=proof["index"], proof=proof)
    emit(as_json, info, f"in block {info['height']} as transaction {info['index']}; its "
                        f"inclusion proof:\n{json.dumps(proof, indent=2)}")


def _wait_included(dd: DataDir, txid: bytes, timeout_s: float) -> dict:
    """The inclusion proof of ``txid`` once a main-chain block holds it.

    Raises:
        WalletError: not included within ``timeout_s`` seconds.
    """
    from node.errors import NodeError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            proof = read_view(dd, "proof", txid=txid.hex())
            proof.pop("running")
            return proof
        except NodeError:  # not in a block yet
            if time.monotonic() > deadline:
                raise WalletError(f"transaction {txid.hex()} is not in a block after "
                                  f"{timeout_s:g} s (still queued: see `pnode status`)") from None
            time.sleep(0.25)


@main_group.command()
@click.argument("address", required=False)
@data_dir_option
@wallet_option
@json_option
def history(address, data_dir, wallet_name, as_json) -> None:
    """Transactions that moved coins of an address, oldest first, then queued ones.

    A tab's row shows the caps it locked; each claim's, what it paid this
    address's lanes or refunded it as the tab's client (a TabRefund row: a
    claim that paid no server, an unused tab given back); a TabExpired row,
    the rest an expired tab gave back.

    \b
    Example:
      pwallet history --json
    """
    dd = DataDir(data_dir)
    account_id = _account(dd, address, wallet_name)
    info = read_view(dd, "history", address=account_id.hex())
    rows = info["history"]
    emit(as_json, in_coins(info, "balance"), lambda: "\n".join(
        f"{'queued' if r['height'] is None else r['height']:>7}  {r['type']:10} "
        f"{_signed_coins(r['amount_units']):>14}  "
        f"{(r['counterparty'] or '')[:16]:16}  {r['txid'][:16]}" for r in rows)
        or "no transactions")


@main_group.command()
@click.argument("evidence_file", type=click.Path(exists=True, dir_okay=False))
@data_dir_option
@wallet_option
@passphrase_option
@click.option("--deposit", metavar="COINS", default=None,
              help="Locked until the case is judged; the accused's if its answer was right "
                   "[default: the chain's least, max(1, 3 x verify_fee)].")
@json_option
def accuse(evidence_file, data_dir, wallet_name, passphrase_file, deposit, as_json) -> None:
    """Accuse the server a spot check caught: a SpotFraud from EVIDENCE_FILE (a .spot file).

    Checked here, then queued through the node on --data-dir. Verifiers that
    hold the layers re-run the steps; if most find the answer wrong, its
    server's bond is slashed, the deposit comes back and half the slash is
    paid to this wallet (specs/ledger.md 5.2).

    \b
    Examples:
      pwallet accuse ~/.pnode/evidence/1732790000000-x9QdTq-12.spot
      pwallet accuse E.spot --deposit 5 --json
    """
    from libp2p.peer.id import ID

    from ledger.crypto import libp2p_peer_id
    from ledger.spotrules import case_id, min_deposit
    from wallet.accuse import read_evidence, spot_fraud

    dd = DataDir(data_dir)
    evidence = read_evidence(evidence_file)
    units = parse_coins(deposit) if deposit else min_deposit(dd.read_genesis().params)
    key = SigningKey(read_key_file(dd.wallet_path(wallet_name),
                                   common.passphrase(passphrase_file)))
    view = _account_view(dd, key.public, None)
    tx, size = spot_fraud(evidence, key, view["chain_id"], view["next_nonce"], units)
    txid = common.submit_tx(dd, tx, view["running"])
    answer = evidence.answers[evidence.loser]
    info = {"txid": txid.hex(), "case_id": case_id(answer).hex(), "bytes": size,
            "accused": ID(libp2p_peer_id(answer.public_key)).to_base58(),
            "deposit": format_coins(units), "deposit_units": units, "running": view["running"]}
    emit(as_json, info, f"queued the accusation of {info['accused']} (case "
                        f"{info['case_id'][:16]}.., deposit {coins(units)})  txid {txid.hex()}")


def _account(dd: DataDir, address: str | None, wallet_name: str | None) -> bytes:
    """The account named on the command line, else the wallet's own."""
    return parse_address(address) if address else read_public_key(dd.wallet_path(wallet_name))


def _signed_coins(units: int | None) -> str:
    if units is None:
        return "(pending)"
    return ("-" if units < 0 else "+") + format_coins(abs(units))


main_group.add_command(infer)


def main() -> None:
    """Console entry point."""
    common.run(main_group, expected=(WalletError,))
