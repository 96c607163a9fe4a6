"""The wall clock the node's services are handed: `Clock` and the real one, `now_ms`.

Services never read the time themselves: they take a `Clock`, so tests run
them on a clock they control. Consensus code in ledger/ takes times as
arguments and reads no clock at all.
"""

from __future__ import annotations

import time
from typing import Callable

Clock = Callable[[], int]  # wall-clock time in milliseconds since the Unix epoch


def now_ms() -> int:
    """The wall clock, in whole milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
