"""`pnode start`'s logs: what it prints, what it writes to its log file, and how repeats go quiet.

Owns `setup_logging`. A running node says what it does in report lines
(`Node(report=...)`); they go to the ``pnode`` logger at INFO, printed on
stdout (or above the live status line) and appended to the log file
(``DATA_DIR/node.log`` by default), both at ``--log-level``. Libraries'
warnings and errors (py-libp2p's) go to stderr and the same file (their
debug output is noise to an operator, so it is never shown).

Repeats. A node that runs for days would print the same kind of line
every slot (a produced block) or every redial of a client that left. At
any level but debug, lines of one *shape* (the line with its numbers, hex
strings and peer ids blanked) are shown three times in ten minutes, the
third saying so, and dropped after that until the ten minutes are over.
Loss lines (``step N: loss X``) are the training's progress and are always
kept.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["LEVELS", "setup_logging"]

LEVELS = ("debug", "info", "warning", "error")
_SHAPE = re.compile(r"[0-9a-fA-F]{6,}|[0-9]+(\.[0-9]+)?|12D3KooW[1-9A-HJ-NP-Za-km-z]+")
_ALWAYS = ("step ",)  # the training's progress
#: Lines of one shape shown per window; the rest only at --log-level debug.
BURST, WINDOW_S = 3, 600.0
_NOTE = "  (more lines like this one in the next 10 minutes: --log-level debug)"


class QuietRepeats(logging.Filter):
    """Drops a line once lines of its shape came too often (module docstring).

    Args:
        burst: lines of one shape shown per ``window_s`` (the last says so).
        window_s: seconds after which a shape may be shown again.
        clock: monotonic seconds.
    """

    def __init__(self, burst: int = BURST, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self.seen: dict[str, tuple[float, int]] = {}  # shape: (window start, lines in it)

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = getattr(record, "pnode_keep", None)  # each handler asks: decide once
        if verdict is None:
            verdict = record.pnode_keep = self._keep(record)
        return verdict

    def _keep(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_ALWAYS):
            return True
        shape, now = _SHAPE.sub("#", message), self.clock()
        start, count = self.seen.get(shape, (now, 0))
        if now - start > self.window_s:
            start, count = now, 0
        self.seen[shape] = (start, count + 1)
        if count + 1 == self.burst:
            record.msg, record.args = message + _NOTE, ()
        return count < self.burst


class _LibraryLevel(logging.Filter):
    """Lets a library's record through only at ``level`` or above (pnode's own: all)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] == "pnode" or record.levelno >= self.level


class _Printer(logging.Handler):
    """Hands each record's message to ``print`` (stdout, or the live status line)."""

    def __init__(self, print_line: Callable[[str], None]) -> None:
        super().__init__()
        self.print_line = print_line

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.print_line(record.getMessage())  # a traceback goes to the log file only
        except Exception:  # a closed stdout must not stop the node
            self.handleError(record)


def log_traceback(exc: BaseException, what: str) -> None:
    """Append ``exc``'s traceback to the log file (not to the terminal: there it is one line).

    Args:
        exc: the error (or group) that stopped the node.
        what: the line before the traceback.
    """
    record = logging.LogRecord("pnode", logging.ERROR, __file__, 0, what, None,
                               (type(exc), exc, exc.__traceback__))
    for handler in logging.getLogger("pnode").handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def setup_logging(level: str, log_file: Path | None,
                  print_line: Callable[[str], None]) -> Callable[[str], None]:
    """Wire the node's report lines and the libraries' logs; return the ``report`` callable.

    Args:
        level: one of ``LEVELS``.
        log_file: where every line also goes, with its time (None: no file).
        print_line: prints one report line for a person.

    Raises:
        OSError: the log file cannot be opened.
    """
    threshold = getattr(logging, level.upper())
    quiet = QuietRepeats() if threshold > logging.DEBUG else None
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(max(threshold, logging.WARNING))  # libraries: warnings and errors only
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handlers: list[logging.Handler] = [stderr]
    if log_file is not None:
        to_file = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers.append(to_file)
    for handler in handlers:
        root.addHandler(handler)
    # py-libp2p keeps its logs to itself (no propagation, so only Python's last-resort
    # handler prints them, unfiltered): send them through ours.
    libp2p = logging.getLogger("libp2p")
    libp2p.handlers.clear()
    libp2p.propagate = True
    libp2p.setLevel(logging.NOTSET)
    pnode = logging.getLogger("pnode")
    pnode.propagate = False
    pnode.handlers.clear()
    pnode.setLevel(threshold)
    printer = _Printer(print_line)
    for handler in (printer, *handlers[1:]):
        pnode.addHandler(handler)
    libraries = _LibraryLevel(max(threshold, logging.WARNING))
    for handler in handlers:  # a library's own logger may be set lower than the root's
        handler.addFilter(libraries)
    if quiet is not None:  # one filter for all, so a line is dropped everywhere or nowhere
        for handler in (printer, *handlers):
            handler.addFilter(quiet)
    return pnode.info
