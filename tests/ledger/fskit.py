"""A small real filesystem for disk-full tests: a tmpfs mounted for one test.

`small_fs` mounts it (root only: the test is skipped, with the reason, where
mounting is refused) and unmounts it whatever the test did; `fill_until_free`
takes its space down to a given amount with a filler file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SIZE = "8m"


@pytest.fixture
def small_fs(tmp_path) -> Path:
    """An 8 MiB tmpfs at ``tmp_path/fs``, unmounted at teardown."""
    where = tmp_path / "fs"
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(where)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        # Lazy: a process the test left behind must not keep the mount alive.
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def free_bytes(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


def fill_until_free(where: Path, free: int) -> Path:
    """Write a filler file in ``where`` so that about ``free`` bytes stay free; returns it."""
    filler = where / "filler"
    with open(filler, "ab") as f:
        f.write(b"\0" * max(free_bytes(where) - free, 0))
    return filler
