"""Hosts of their own: each node in its own Linux network namespace (test harness).

A `Net` (a context manager; the `netns` fixture yields one) builds, for one test:

- a hub namespace ``<prefix>-hub`` holding a bridge ``br0`` (nothing in the root
  namespace is touched: no bridge, veth or address there, so tests never see or
  disturb the machine's own network);
- per host ``name``, a namespace ``<prefix>-<name>`` with loopback up and an
  ``eth0`` at ``10.231.S.H/24``, whose veth peer ``v-<name>`` is a port of the bridge.
  S is the test's own /24, derived from the xdist worker id and a per-process
  counter, so parallel workers get distinct subnets (they could not collide anyway,
  each bridge living in its own hub namespace). ``prefix`` is ``pn<pid>x<counter>``,
  unique per process and test, so two pytest runs never share a namespace name.

`Host.run` / `Host.popen` run a command inside with ``ip netns exec``;
`Host.link(False)` takes the host's bridge port down (a cut cable), `link(True)`
brings it back. On exit (also on a failure or Ctrl-C) every process still alive in
the namespaces is killed and every namespace deleted, which deletes its veths and
the bridge with it. A run killed outright (SIGKILL: no `finally`) leaves its
namespaces; the next `Net` deletes those whose process (the pid in the name) is gone.

Where namespaces cannot be made (not root, no ``ip``, no netns support) `require()`
skips the test with the reason; it never passes silently.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.node.prockit import ROOT

_COUNTER = itertools.count()
BRIDGE = "br0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def why_not() -> str | None:
    """Why namespaces cannot be made here (None: they can), found by making one."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root, as CI does)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces"
    probe = f"pn{os.getpid()}probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` fails here: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def sweep_orphans() -> list[str]:
    """Delete namespaces of this scheme whose making process is dead; their names."""
    gone = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        m = re.match(r"(pn(\d+)x\d+-\w+)", line)
        if m and not Path(f"/proc/{m.group(2)}").exists():
            _ip("netns", "del", m.group(1), check=False)
            gone.append(m.group(1))
    return gone


def require() -> None:
    """Skip the calling test, with the reason, where namespaces cannot be made."""
    reason = why_not()
    if reason:
        pytest.skip(f"no network namespaces: {reason}")


def _subnet(counter: int) -> int:
    """The third octet of this test's /24: worker id and counter, distinct per worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    return (n * 16 + counter % 16) % 250 + 1


@dataclass
class Host:
    """One namespace with one address on the test's bridge."""

    net: "Net"
    name: str
    ns: str
    ip: str

    def argv(self, *cmd: str) -> list[str]:
        """``cmd`` wrapped to run inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns, *cmd]

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*cmd), capture_output=True, text=True, timeout=timeout)

    def popen(self, *cmd: str, out: Path, err: Path, env: dict | None = None) -> subprocess.Popen:
        """Start ``cmd`` inside; `ip netns exec` execs it, so the pid is the command's."""
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.Popen(self.argv(*cmd), cwd=ROOT, env=env, stdout=fo, stderr=fe)
        self.net.procs.append(proc)
        return proc

    def python(self, *args: str, out: Path, err: Path, env: dict | None = None) -> subprocess.Popen:
        """``python ARGS`` inside (this interpreter, the worktree's code)."""
        return self.popen(sys.executable, *args, out=out, err=err, env=env)

    def link(self, up: bool) -> None:
        """Plug (True) or cut (False) this host's cable: its port on the bridge."""
        _ip("-n", self.net.hub, "link", "set", f"v-{self.name}", "up" if up else "down")


@dataclass
class Net:
    """A bridge and hosts on it, in namespaces of their own; cleans up on exit."""

    prefix: str = ""
    subnet: int = 0
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        k = next(_COUNTER)
        self.prefix = self.prefix or f"pn{os.getpid()}x{k}"
        self.subnet = self.subnet or _subnet(k)

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def namespaces(self) -> list[str]:
        """This net's namespaces that exist now (after exit: none)."""
        listed = _ip("netns", "list").stdout.split("\n")
        return [line.split()[0] for line in listed
                if line.strip() and line.split()[0].startswith(self.prefix + "-")]

    def __enter__(self) -> "Net":
        sweep_orphans()
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", self.hub, "link", "set", BRIDGE, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, name: str) -> Host:
        """A new host ``name`` (letters/digits, at most 12) on the bridge, its own IP."""
        assert name.isalnum() and len(name) <= 12 and name not in self.hosts, name
        ns = f"{self.prefix}-{name}"
        ip = f"10.231.{self.subnet}.{10 + len(self.hosts)}"
        _ip("netns", "add", ns)
        host = Host(self, name, ns, ip)
        self.hosts[name] = host
        port = f"v-{name}"
        # Both ends are made in the hub and one is moved: the root namespace sees neither.
        _ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        _ip("-n", self.hub, "link", "set", port, "master", BRIDGE)
        _ip("-n", self.hub, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Kill what runs in the namespaces, then delete them all (veths and bridge go too)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.namespaces():
            # Anything else started inside (a child of a child) is ours too.
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            for _ in range(50):  # a namespace is busy until its last process is gone
                if _ip("netns", "del", ns, check=False).returncode == 0:
                    break
                time.sleep(0.1)


@pytest.fixture
def netns():
    """A `Net` for this test, torn down whatever happens (skips without namespaces)."""
    require()
    with Net() as net:
        yield net
    assert net.namespaces() == [], f"namespaces left behind: {net.namespaces()}"
