"""What `pnode` and `pwallet` share: error handling, options, passphrases, coins.

Every expected failure (bad argument, missing data dir, corrupt file, wrong
passphrase, rejected transaction) ends as one line on stderr and exit code
2, never a traceback. `verify` commands use exit code 1 for "checked, and it
is wrong", so scripts can tell a failed check from a failed invocation.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable

import click

from compute.errors import ComputeError
from ledger.chaindb import ChainDB
from ledger.errors import LedgerError
from ledger.types import COIN, format_coins  # noqa: F401 (re-exported for the CLIs)
from node.datadir import DEFAULT_DATA_DIR, DataDir
from node.errors import NodeError

EXIT_USAGE = 2
#: `pnode start`'s port when no --listen is given (specs/network.md 5).
DEFAULT_PORT = 4411
EXIT_CHECK_FAILED = 1
#: How long a command waits for a starting node (store held, no control socket yet).
STARTING_NODE_WAIT_S = 30.0

data_dir_option = click.option(
    "--data-dir", "data_dir", type=click.Path(file_okay=False), default=str(DEFAULT_DATA_DIR),
    show_default=True, envvar="PNODE_DATA_DIR", help="Node data directory.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def single_leaf(group: BaseExceptionGroup) -> BaseException:
    """The one leaf of a (nested) exception group, or the group itself."""
    leaves = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for e in exc.exceptions:
                walk(e)
        else:
            leaves.append(exc)
    walk(group)
    return leaves[0] if len(leaves) == 1 else group


def run_trio_interruptibly(async_fn: Callable[..., Any], *args: Any) -> Any:
    """``trio.run(async_fn, *args)``, where Ctrl-C cancels the run, then raises KeyboardInterrupt.

    By default trio raises KeyboardInterrupt in whichever task happens to run
    when SIGINT arrives; a library task that catches BaseException (some of
    py-libp2p's do) can swallow it, and a generation then failed over and ran
    to its end instead of stopping. Here one task takes SIGINT, cancels the
    whole run, and the interrupt is raised once everything has unwound.

    Returns:
        What ``async_fn`` returned.

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT) during the run, whatever the
            cancelled tasks raised while they unwound.
    """
    import trio

    interrupted = False

    async def main() -> Any:
        work, watching = trio.CancelScope(), trio.Event()

        async def watch() -> None:  # a system task: never in the way of async_fn's errors
            nonlocal interrupted
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                watching.set()
                async for _ in signals:
                    interrupted = True
                    work.cancel()
                    return

        trio.lowlevel.spawn_system_task(watch)
        await watching.wait()
        with work:
            return await async_fn(*args)

    try:
        result = trio.run(main)
    except BaseException:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    if interrupted:  # async_fn gave up quietly when cancelled
        raise KeyboardInterrupt
    return result


# The roots of every error a command expects: one line and exit 2, never a traceback.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (LedgerError, NodeError, ComputeError, OSError)


def _main(group: click.Group) -> None:
    try:
        group.main(standalone_mode=False)
    except BaseExceptionGroup as eg:  # trio nurseries wrap, e.g., a Ctrl-C mid-generation
        raise single_leaf(eg) from None


def run(group: click.Group, expected: tuple[type[BaseException], ...] = ()) -> None:
    """Run a click group, turning expected errors into one line and exit 2.

    Args:
        group: the command group to run on ``sys.argv``.
        expected: error roots of the caller's own package, expected besides
            `EXPECTED_ERRORS` (pwallet passes `WalletError`: node never
            imports wallet).
    """
    try:
        _main(group)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click's wrapping of a Ctrl-C
            click.echo("interrupted", err=True)
            sys.exit(130)
        click.echo("aborted", err=True)
        sys.exit(EXIT_USAGE)
    except click.UsageError as exc:  # one line, with where to look for help
        where = exc.ctx.command_path if exc.ctx else group.name
        click.echo(f"error: {exc.format_message()} (see '{where} --help')", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except EXPECTED_ERRORS + expected as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


def emit(as_json: bool, data: dict[str, Any], text: Callable[[], str] | str) -> None:
    """Print ``data`` as JSON, or the human-readable ``text``."""
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(text() if callable(text) else text)


def passphrase(passphrase_file: str | None, *, confirm: bool = False) -> str:
    """The wallet passphrase: from a file, $PNODE_PASSPHRASE, or a prompt.

    Raises:
        click.UsageError: none given and there is no terminal to ask on.
    """
    if passphrase_file:
        try:
            with open(passphrase_file, encoding="utf-8") as f:
                return f.read().rstrip("\n")
        except OSError as exc:
            raise click.UsageError(f"cannot read passphrase file: {exc}") from None
    if "PNODE_PASSPHRASE" in os.environ:
        return os.environ["PNODE_PASSPHRASE"]
    if not sys.stdin.isatty():
        raise click.UsageError("no passphrase: pass --passphrase-file or set PNODE_PASSPHRASE")
    return click.prompt("Wallet passphrase", hide_input=True, confirmation_prompt=confirm)


passphrase_option = click.option(
    "--passphrase-file", type=click.Path(dir_okay=False),
    help="File holding the wallet passphrase (else $PNODE_PASSPHRASE, else a prompt).")


def parse_coins(text: str) -> int:
    """'2.5' coins -> base units. At most 6 decimals, more than zero.

    Raises:
        click.BadParameter: not a positive amount with at most 6 decimals.
    """
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise click.BadParameter(f"{text!r} is not a number of coins") from None
    units = value * COIN
    if not value.is_finite() or units != units.to_integral_value() or units <= 0:
        raise click.BadParameter(f"{text!r}: amounts are positive, with at most 6 decimals")
    if units >= 2**64:
        raise click.BadParameter(f"{text!r} is more coins than can exist")
    return int(units)


def parse_address(text: str) -> bytes:
    """A hex account id (32 bytes).

    Raises:
        click.BadParameter: not 64 hex digits.
    """
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise click.BadParameter(f"{text!r} is not an address (64 hex digits)")
    return raw


def datadir(path: str) -> DataDir:
    return DataDir(path)


def parse_layers(text: str) -> tuple[int, int]:
    """A layer span ``START:END`` (0 <= START < END), or click.BadParameter."""
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not START:END") from None
    if not 0 <= start < end:
        raise click.BadParameter(f"layers {text!r}: need 0 <= START < END")
    return start, end


def read_peer_list(path: str) -> list[str]:
    """The peer ids (base58) listed in a trusted-peers file.

    One entry per line: a peer id, or a multiaddr ending in ``/p2p/<peer id>``;
    blank lines and ``#`` comments are skipped.

    Raises:
        click.BadParameter: unreadable file, a line that names no peer, or no entry.
    """
    from libp2p.peer.id import ID

    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise click.BadParameter(f"cannot read trusted-peers file: {exc}") from None
    peers = []
    for number, line in enumerate(lines, 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        text = entry.rsplit("/p2p/", 1)[-1] if "/p2p/" in entry else entry
        try:
            raw = ID.from_base58(text).to_bytes()
        except Exception:
            raw = b""
        # A peer id is a multihash: identity (0x00 <len> key) or sha2-256 (0x12 0x20 <32>).
        if (len(raw) > 2 and raw[0] == 0 and raw[1] == len(raw) - 2) or (
                len(raw) == 34 and raw[:2] == b"\x12\x20"):
            peers.append(text)
        else:
            raise click.BadParameter(f"{path}:{number}: {entry!r} is not a peer id or a "
                                     ".../p2p/<peer id> multiaddr") from None
    if not peers:
        raise click.BadParameter(f"{path} lists no peers")
    return peers


def parse_multiaddr(text: str, *, peer: bool) -> str:
    """Check a multiaddr from the command line; ``peer``: it must end in /p2p/<peer id>.

    Raises:
        click.BadParameter: not a multiaddr (or names no peer).
    """
    import multiaddr  # not libp2p: a second to import, and a bad argument should fail fast

    try:
        addr = multiaddr.Multiaddr(text)
        if peer and [p.name for p in addr.protocols()][-1:] != ["p2p"]:
            raise ValueError("it does not end in /p2p/<peer id>")
        if peer:
            addr.value_for_protocol("p2p")  # a peer id that decodes
    except Exception as exc:
        what = "peer address (need .../p2p/<peer id>)" if peer else "listen address"
        raise click.BadParameter(f"bad {what} {text!r}: {exc}") from None
    return text


def parse_peer_addr(text: str) -> str:
    """A peer's full multiaddr (with /p2p/<peer id>); see `parse_multiaddr`."""
    return parse_multiaddr(text, peer=True)


def ask_node_or_store(dd: DataDir, op: str, offline: Callable[[ChainDB], dict[str, Any]],
                      **args: Any) -> dict[str, Any]:
    """The running node's answer to control op ``op``, else ``offline`` of the stored chain.

    While a node runs it holds the store, so a command asks it over the
    control socket; without one, the command opens the store itself. The
    answer's ``running`` says which.

    Args:
        dd: the data dir.
        op: the control op (``status``, ``account``, ...).
        offline: builds the same answer from the store (`node.chain.views`).
        args: the op's arguments.

    A node that is starting holds the store before its control socket
    answers: the command waits for it (``STARTING_NODE_WAIT_S`` at most).

    Raises:
        DataDirError: no node runs and the store cannot be opened (a
            `ChainLockedError` when a process holds it that never answers).
    """
    import time

    from node.control import NodeNotRunning, control_call
    from node.errors import ChainLockedError

    deadline = time.monotonic() + STARTING_NODE_WAIT_S
    while True:
        try:
            info = control_call(dd.path, op, **args)
            info.pop("ok", None)
            info["running"] = True
            return info
        except NodeNotRunning:
            pass
        try:
            with dd.open_chain() as db:
                info = offline(db)
            info["running"] = False
            return info
        except ChainLockedError:  # a node that is starting (or stopping) holds the store
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def read_view(dd: DataDir, name: str, local: dict[str, Any] | None = None,
              **args: Any) -> dict[str, Any]:
    """A chain view (`node.chain.read_views`) from the running node, else from the store.

    Args:
        dd: the data dir.
        name: the view.
        local: arguments only for the store's own call (e.g. a progress
            callback; `node.chain.LOCAL_ONLY`).
        args: the view's arguments (JSON values).

    Raises:
        DataDirError: no node runs and the store cannot be opened.
        NodeError: the view's own refusal (a bad argument).
    """
    from node.chain import read_views

    answer = ask_node_or_store(
        dd, "view", lambda db: {"view": read_views()[name](db, **args, **(local or {}))},
        name=name, args=args)
    return {**answer["view"], "running": answer["running"]}


def account_info(dd: DataDir, account_id: bytes) -> dict[str, Any]:
    """An account as the running node sees it (mempool included), else as the store holds it.

    Returns:
        `node.chain.account_view`'s fields, and ``running``.
    """
    from node.chain import account_view

    return ask_node_or_store(dd, "account", lambda db: account_view(db, account_id),
                             address=account_id.hex())


def submit_tx(dd: DataDir, tx: Any, running: bool) -> bytes:
    """Queue a signed transaction: through the running node (admitted and gossiped), else
    into the stopped node's mempool, sent when it next runs. Returns its id.

    Raises:
        ControlError, ValidationError: the node or the store refused it.
    """
    from ledger.codec import encode
    from node.control import control_call

    if running:
        return bytes.fromhex(control_call(dd.path, "submit_tx", tx=encode(tx).hex())["txid"])
    with dd.open_chain() as db:
        return db.admit(tx)


def registry_info(dd: DataDir) -> dict[str, Any]:
    """The registered, bonded nodes as the running node sees them, else as the store holds them.

    Returns:
        `node.chain.registry_view`'s fields, and ``running``.

    Raises:
        DataDirError: no node runs and the store cannot be opened (e.g. the
            data dir is not initialised).
    """
    return read_view(dd, "registry")


def plural(count: float | str, word: str, words: str | None = None) -> str:
    """``count`` and ``word``, plural unless the count is one: "1 server", "2 servers".

    Args:
        count: a number, or a decimal string (an amount as `format_coins` writes it).
        word: the singular; words: the plural (default: ``word`` + "s").
    """
    one = count == "1" if isinstance(count, str) else count == 1
    return f"{count} {word if one else words or word + 's'}"


def coins(amount: int | str) -> str:
    """An amount in base units (an int) or in coins (a decimal string, as the views give
    it) as "1 coin", "2.5 coins"."""
    return plural(format_coins(amount) if isinstance(amount, int) else amount, "coin")


def in_coins(doc: dict[str, Any], *names: str) -> dict[str, Any]:
    """``doc`` with each money field ``name`` (base units) given as coins, a decimal string,
    and its base units beside it as ``name_units``: the CLIs' one money format in JSON."""
    out = dict(doc)
    for name in names:
        if isinstance(out.get(name), int):
            units = out[name]
            out[name] = ("-" if units < 0 else "") + format_coins(abs(units))
            out[f"{name}_units"] = units
    return out


def read_job_file(path: str | None, option: str):
    """The job config of a job file (JSON), or the built-in default job when ``path`` is None.

    Raises:
        click.BadParameter: the file is missing, not JSON, or not a job config
            (one line naming the option and what was wrong).
    """
    from compute.data import JobConfig  # torch loads with it
    from compute.errors import ComputeError
    from compute.jobfile import config_from_json

    if path is None:
        return JobConfig()
    try:
        return config_from_json(Path(path).read_text())
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint=option) from None
    except (ValueError, ComputeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint=option) from None
