"""`pnode start`'s logging: repeats go quiet, loss lines never, the file has every kept line."""

from __future__ import annotations

import logging

import pytest

from node.cli.logs import BURST, QuietRepeats, setup_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    for logger in (root, logging.getLogger("pnode")):
        for handler in logger.handlers:
            handler.close()
    root.handlers[:], root.level = saved
    logging.getLogger("pnode").handlers.clear()


def test_a_repeated_line_shows_three_times_then_goes_quiet(tmp_path, restore_logging):
    printed = []
    report = setup_logging("info", tmp_path / "node.log", printed.append)
    for h in range(1, 8):
        report(f"produced block {h} {h:016x} txs=0 rank=0 (extended)")
        report(f"step {h}: loss {5.0 - h / 10:.4f}")
    report("mining job 5e3c00aa11..: holding sections [0:2] and the client part")
    blocks = [line for line in printed if line.startswith("produced block")]
    assert len(blocks) == BURST and "--log-level debug" in blocks[-1]
    assert len([line for line in printed if line.startswith("step ")]) == 7
    assert printed[-1].startswith("mining job")  # another shape is another line
    logging.getLogger("libp2p.test").warning("redial of 12D3KooWAbc failed")
    logging.getLogger("libp2p.test").info("chatter")  # libraries: warnings and up only
    chatty = logging.getLogger("libp2p.chatty")
    chatty.setLevel(logging.INFO)  # as py-libp2p sets some of its loggers
    chatty.info("more chatter")
    text = (tmp_path / "node.log").read_text()
    assert text.count("produced block") == BURST and text.count("step ") == 7
    assert "redial of" in text and "chatter" not in text and "more chatter" not in text and " INFO pnode: " in text


def test_debug_shows_every_line(restore_logging):
    printed = []
    report = setup_logging("debug", None, printed.append)
    for h in range(10):
        report(f"produced block {h} ab{h:014x}")
    assert len(printed) == 10


def test_a_shape_comes_back_after_its_window():
    now = [0.0]
    quiet = QuietRepeats(burst=2, window_s=10, clock=lambda: now[0])

    def keep(msg):
        return quiet.filter(logging.LogRecord("pnode", logging.INFO, "", 0, msg, (), None))
    assert [keep(f"synced {n} blocks") for n in range(4)] == [True, True, False, False]
    now[0] = 11.0
    assert keep("synced 9 blocks") and keep("synced 10 blocks") and not keep("synced 11 blocks")


def test_the_error_that_stops_a_node_leaves_its_traceback_in_the_file_only(tmp_path,
                                                                           restore_logging):
    from node.cli.logs import log_traceback

    printed = []
    setup_logging("info", tmp_path / "node.log", printed.append)

    def inner():
        raise OSError(9, "Bad file descriptor")
    try:
        try:
            inner()
        except OSError as exc:
            raise ExceptionGroup("node", [exc])
    except ExceptionGroup as group:
        log_traceback(group, "the node stopped on this error:")
    text = (tmp_path / "node.log").read_text()
    assert "the node stopped on this error:" in text and "Traceback" in text
    assert "in inner" in text and "OSError: [Errno 9] Bad file descriptor" in text
    assert printed == []  # the terminal gets the one-line error from the CLI instead
