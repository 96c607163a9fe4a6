"""`pnode pol export` and `pnode verify cert`: window files of a worker's units, re-checked offline.

A running mining node keeps, for its verifiers, every unit it ran whose
audit can still come (specs/pol.md 8). `pnode pol export` asks it (over
the control socket) to write those of some steps to a window file;
`pnode verify cert FILE` checks every byte of the file against its job and
receipts, then re-executes every unit of it with the verifier's own
procedure, step by step, anywhere, with no network: exit 0 when every
byte and unit passes, 1 when any fails (specs/pol.md 10).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from node.cli.common import EXIT_CHECK_FAILED, data_dir_option, emit, json_option
from node.errors import ProofError


@click.group()
def pol() -> None:
    """Proof of Learning: a worker's units, exported for anyone to re-check."""


@pol.command("export")
@data_dir_option
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="The window file to write.")
@click.option("--from-step", "first", type=click.IntRange(0), default=None,
              help="The window's first step [default: the oldest step the node keeps].")
@click.option("--steps", type=click.IntRange(1, 1_000_000), default=None,
              help="How many steps [default: every kept step from --from-step].")
@json_option
def export(data_dir, out, first, steps, as_json) -> None:
    """Write the running node's kept units of some steps to a window file.

    A node keeps a unit until no audit of it can come (its receipt's window
    closed), so a window must be exported while its steps are recent.

    \b
    Examples:
      pnode pol export --data-dir D --out w.pol            # every kept step
      pnode pol export --data-dir D --out w.pol --from-step 12 --steps 3
      pnode verify cert w.pol
    """
    from node.control import control_call

    args = {"out": str(Path(out).resolve())}
    if first is not None:
        args["first"] = first
    if steps is not None:
        args["steps"] = steps
    info = control_call(data_dir, "pol_export", **args)
    info.pop("ok", None)
    last = info["first_step"] + info["steps"] - 1
    emit(as_json, info, lambda: f"wrote {info['units']} units of steps {info['first_step']}.."
                                f"{last} to {info['path']} ({info['bytes']:,} bytes); receipts "
                                f"root {info['receipts_root'][:16]}..")


@click.command("cert")
@click.argument("window_file", type=click.Path(dir_okay=False))
@json_option
def verify_cert(window_file, as_json) -> None:
    """Check every byte of a window file (`pnode pol export`), then re-execute every unit of
    it; exit 1 if a byte or a unit fails.

    First, every byte of the file must be what its job and receipts commit:
    the job's signed transaction (it hashes to the job id; its config is the
    one the job commits), every receipt (signed; the receipts root), every
    certificate, named set and tensor (each hashes to what a receipt or
    certificate names), and nothing else. A failed check names the field,
    and no unit is re-executed. Then, step by step: the units judged, how
    many failed, the largest distance (0: bit-exact) and the committed loss;
    then each failing unit with its reason. Runs offline: everything needed
    is in the file. Compare the job id printed with the chain's
    (`pnode job show`).

    \b
    Examples:
      pnode verify cert w.pol
      pnode verify cert w.pol --json | jq .problems
    """
    from rich.console import Console
    from rich.progress import Progress

    from node.pol import WindowError, read_window, verify_window

    try:
        window = read_window(window_file)
    except (OSError, WindowError) as exc:
        raise ProofError(f"cannot read window file {window_file}: {exc}") from None
    with Progress(console=Console(stderr=True), transient=True,
                  disable=as_json or not sys.stderr.isatty()) as bar:
        task = bar.add_task("re-executing units", total=len(window.receipts))
        try:
            report = verify_window(window, lambda i, n: bar.update(task, completed=i))
        except WindowError as exc:
            raise ProofError(f"cannot check {window_file}: {exc}") from None
    result = {"passed": report.passed, "job": report.job_id.hex(),
              "first_step": report.first_step, "steps": report.steps,
              "problems": [p.as_dict() for p in report.problems],
              "per_step": report.per_step(), "units": report.units}
    emit(as_json, result, lambda: _text(report))
    if not report.passed:
        sys.exit(EXIT_CHECK_FAILED)


#: Most failed byte checks the text output lists (--json lists every one).
SHOWN_PROBLEMS = 20


def _text(report) -> str:
    span = f"steps {report.first_step}..{report.first_step + report.steps - 1} of job " \
           f"{report.job_id.hex()[:16]}.."
    if report.problems:
        lines = [f"FAIL {p}" for p in report.problems[:SHOWN_PROBLEMS]]
        if len(report.problems) > SHOWN_PROBLEMS:
            lines.append(f"... and {len(report.problems) - SHOWN_PROBLEMS} more (--json: all)")
        lines.append(f"FAIL: the window of {span} is not what its job and receipts commit "
                     f"({len(report.problems)} failed checks); no unit re-executed")
        return "\n".join(lines)
    lines = [f"{'step':>6} {'units':>6} {'failed':>7} {'max distance':>13} {'loss':>8}"]
    for s in report.per_step():
        loss = "" if s["loss"] is None else f"{s['loss']:.4f}"
        lines.append(f"{s['step']:>6} {s['units']:>6} {s['failed']:>7} "
                     f"{s['max_distance']:>13.3g} {loss:>8}")
    for u in report.units:
        if u["reason"] != "pass":
            lines.append(f"FAIL step {u['step']} unit {u['index']} of {u['worker'][:16]}..: "
                         f"{u['reason']}" + (f" ({u['detail']})" if u["detail"] else ""))
    lines.append(f"{'ok' if report.passed else 'FAIL'}: every byte checked; {len(report.units)} "
                 f"units of {span} re-executed")
    return "\n".join(lines)


#: Most seconds `pnode verify pol` waits for the node: a replay of a long job is long
#: (a 200-step devnet job: about 20 s; the default control wait is 30 s).
AUDIT_TIMEOUT_S = 3600.0


@click.command("pol")
@data_dir_option
@click.option("--count", type=click.IntRange(1, 100_000), default=8, show_default=True,
              help="Receipts to sample (with the node's own randomness).")
@click.option("--windows", type=click.IntRange(0, 100_000), default=2, show_default=True,
              help="Windows of the job's steps (one per checkpoint interval, the job's "
                   "state_every) to replay, drawn with the node's own randomness.")
@click.option("--all", "everything", is_flag=True,
              help="Judge every recent receipt, and replay every closed step of the job "
                   "from its initial model.")
@click.option("--blocks", type=click.IntRange(1, 1_000_000), default=256, show_default=True,
              help="How far back to look for receipts to judge, in blocks.")
@json_option
def verify_pol(data_dir, count, windows, everything, blocks, as_json) -> None:
    """The join-time audit of the chain's training, through the running node; exit 1 on a fail.

    Two checks. Receipts of the last BLOCKS blocks, drawn with the node's
    own randomness (or all of them): each unit is fetched from its worker as
    a verifier would, re-executed and judged; a unit its worker no longer
    keeps is "unavailable", not a failure. And windows of the job's steps,
    replayed whole: from the initial model, or from the full state of every
    part that miners keep at each checkpoint; every unit's receipt hashes
    must come out bit for bit (specs/pol.md 10.3). A window that
    disagrees names the first step that does and the units at fault there.
    Nothing is sent to the chain.

    \b
    Examples:
      pnode verify pol --data-dir D                 # 8 receipts, 2 windows, drawn at random
      pnode verify pol --data-dir D --windows 0     # receipts only
      pnode verify pol --data-dir D --all --json    # everything, from the initial model
    """
    from rich.console import Console

    from node.control import control_call

    with Console(stderr=True).status("judging receipts and replaying windows",
                                     spinner="dots") if not as_json and sys.stderr.isatty() \
            else contextlib.nullcontext():
        info = control_call(data_dir, "pol_audit", count=count, all=everything, blocks=blocks,
                            windows=windows, timeout_s=AUDIT_TIMEOUT_S)
    info.pop("ok", None)
    emit(as_json, info, lambda: _audit_text(info))
    if info["failed"] or info["windows_failed"]:
        sys.exit(EXIT_CHECK_FAILED)


_DIFFERS = {"weights": "read other weights", "input": "took another input",
            "output": "committed other results", "missing": "no receipt on chain"}


def _audit_text(info: dict) -> str:
    lines = [f"step {u['step']} unit {u['index']} of {u['worker'][:16]}.. (height "
             f"{u['height']}): {u['reason']}" + (f" ({u['detail']})" if u["detail"] else "")
             for u in info["units"]]
    lines.append(f"{'FAIL' if info['failed'] else 'ok'}: {info['judged']} of "
                 f"{info['receipts_seen']} recent receipts judged: {info['passed']} passed, "
                 f"{info['failed']} failed, {info['unavailable']} unavailable")
    for w in info["windows"]:
        last = w["first_step"] + w["steps"] - 1
        line = f"window of steps {w['first_step']}..{last} (from {w['start']}): {w['status']}, " \
               f"{w['replayed']} steps replayed, {w['matched']} units bit-exact"
        lines.append(line + (f"; {w['detail']}" if w["detail"] else ""))
        for d in w["differing"]:
            lines.append(f"  step {d['step']} unit {d['index']} of {d['worker'][:16]}..: "
                         f"{_DIFFERS[d['status']]}" + (" (at fault)" if d["at_fault"] else ""))
    return "\n".join(lines)
