"""`pnode pol export` and `pnode verify cert`: window files of a worker's units, re-checked offline.

A running mining node keeps, for its verifiers, every unit it ran whose
audit can still come (specs/pol.md 8). `pnode pol export` asks it (over
the control socket) to write those of some steps to a window file;
`pnode verify cert FILE` re-executes every unit of the file with the
verifier's own procedure, step by step, anywhere, with no network: exit 0
when every unit passes, 1 when any fails (specs/pol.md 10).
"""

from __future__ import annotations

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
    """Re-execute every unit of a window file (`pnode pol export`); exit 1 if any fails.

    Prints, step by step, the units judged, how many failed, the largest
    distance (0: bit-exact) and the committed loss; then each failing unit
    with its reason. Runs offline: everything needed is in the file.

    \b
    Examples:
      pnode verify cert w.pol
      pnode verify cert w.pol --json | jq .passed
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
              "receipts_root_ok": report.root_ok, "signatures_ok": report.signatures_ok,
              "per_step": report.per_step(), "units": report.units}
    emit(as_json, result, lambda: _text(report))
    if not report.passed:
        sys.exit(EXIT_CHECK_FAILED)


def _text(report) -> str:
    lines = [f"{'step':>6} {'units':>6} {'failed':>7} {'max distance':>13} {'loss':>8}"]
    for s in report.per_step():
        loss = "" if s["loss"] is None else f"{s['loss']:.4f}"
        lines.append(f"{s['step']:>6} {s['units']:>6} {s['failed']:>7} "
                     f"{s['max_distance']:>13.3g} {loss:>8}")
    for u in report.units:
        if u["reason"] != "pass":
            lines.append(f"FAIL step {u['step']} unit {u['index']} of {u['worker'][:16]}..: "
                         f"{u['reason']}" + (f" ({u['detail']})" if u["detail"] else ""))
    if not report.root_ok:
        lines.append("FAIL the receipts do not hash to the window's receipts root")
    if not report.signatures_ok:
        lines.append("FAIL a receipt's signature does not hold")
    lines.append(f"{'ok' if report.passed else 'FAIL'}: {len(report.units)} units of steps "
                 f"{report.first_step}..{report.first_step + report.steps - 1} re-executed")
    return "\n".join(lines)


@click.command("pol")
@data_dir_option
@click.option("--count", type=click.IntRange(1, 100_000), default=8, show_default=True,
              help="Receipts to sample (with the node's own randomness).")
@click.option("--all", "everything", is_flag=True, help="Judge every receipt, not a sample.")
@click.option("--blocks", type=click.IntRange(1, 1_000_000), default=256, show_default=True,
              help="How far back to look, in blocks.")
@json_option
def verify_pol(data_dir, count, everything, blocks, as_json) -> None:
    """Re-execute recent receipts of the chain's job through the running node; exit 1 if any fails.

    The join-time audit: the node draws receipts of the last BLOCKS blocks
    with its own randomness (or takes all of them), fetches each unit from
    its worker as a verifier would, re-executes it and prints the verdict.
    A unit its worker no longer keeps is "unavailable", not a failure.
    Nothing is sent to the chain.

    \b
    Examples:
      pnode verify pol --data-dir D                 # 8 receipts, drawn at random
      pnode verify pol --data-dir D --all --blocks 50 --json
    """
    from node.control import control_call

    info = control_call(data_dir, "pol_audit", count=count, all=everything, blocks=blocks)
    info.pop("ok", None)
    emit(as_json, info, lambda: "\n".join(
        [f"step {u['step']} unit {u['index']} of {u['worker'][:16]}.. (height {u['height']}): "
         f"{u['reason']}" + (f" ({u['detail']})" if u["detail"] else "") for u in info["units"]]
        + [f"{'FAIL' if info['failed'] else 'ok'}: {info['judged']} of {info['receipts_seen']} "
           f"recent receipts judged: {info['passed']} passed, {info['failed']} failed, "
           f"{info['unavailable']} unavailable"]))
    if info["failed"]:
        sys.exit(EXIT_CHECK_FAILED)
