"""The namespace harness itself: hosts reach each other only on the bridge, a cut
cable cuts, the shaper runs between two hosts, and nothing is left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.node.netns.nskit import Net, require, sweep_orphans
from tests.node.prockit import ROOT, read, wait_for

# Inside a namespace: connect to HOST:PORT, send a line, print what comes back.
CLIENT = """
import socket, sys, time
t0 = time.monotonic()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.sendall(b"hello\\n"); t1 = time.monotonic()
print(s.recv(100).decode().strip(), time.monotonic() - t1)
"""
# Inside a namespace: echo one connection at a time on HOST:PORT.
SERVER = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("up", flush=True)
while True:
    c, _ = srv.accept()
    c.sendall(c.recv(100)); c.close()
"""


def _ask(host, ip: str, port: int) -> subprocess.CompletedProcess:
    return host.run(sys.executable, "-c", CLIENT, ip, str(port), timeout=30)


def test_hosts_talk_over_the_bridge_a_cut_cable_cuts_and_all_is_cleaned(netns, tmp_path):
    a, b = netns.add("a"), netns.add("b")
    assert a.ip != b.ip and a.ip.rsplit(".", 1)[0] == b.ip.rsplit(".", 1)[0]
    server = b.python("-c", SERVER, b.ip, "7000", out=tmp_path / "s.out", err=tmp_path / "s.err")
    wait_for(lambda: "up" in read(tmp_path / "s.out"), "the echo server")
    r = _ask(a, b.ip, 7000)
    assert r.returncode == 0 and r.stdout.startswith("hello"), r.stderr
    # The root namespace holds nothing of the test's: no address, no port, no bridge.
    root = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert f"10.231.{netns.subnet}." not in root and "v-a" not in root
    b.link(False)
    assert _ask(a, b.ip, 7000).returncode != 0  # cable cut: no connection
    b.link(True)
    r = wait_for(lambda: (r := _ask(a, b.ip, 7000)).returncode == 0 and r, "the link back")
    assert r.stdout.startswith("hello")
    assert server.poll() is None
    assert set(netns.namespaces()) == {netns.hub, a.ns, b.ns}


def test_cleanup_happens_when_the_test_body_fails(tmp_path):
    require()
    net = Net()
    try:
        with net:
            h = net.add("x")
            h.python("-c", "import time; time.sleep(600)", out=tmp_path / "o", err=tmp_path / "e")
            raise KeyError("boom")
    except KeyError:
        pass
    assert net.namespaces() == []
    assert all(p.poll() is not None for p in net.procs)


def test_the_shaper_between_two_hosts_delays_the_round_trip(netns, tmp_path):
    a, relay, b = netns.add("a"), netns.add("r"), netns.add("b")
    b.python("-c", SERVER, b.ip, "7000", out=tmp_path / "s.out", err=tmp_path / "s.err")
    relay.python("-m", "tests.node.netns.shaper", "--listen", f"{relay.ip}:7001", "--target",
                 f"{b.ip}:7000", "--delay-ms", "50", out=tmp_path / "r.out", err=tmp_path / "r.err")
    wait_for(lambda: "up" in read(tmp_path / "s.out"), "the echo server")
    r = wait_for(lambda: (r := _ask(a, relay.ip, 7001)).returncode == 0 and r, "the relay")
    reply, rtt = r.stdout.split()
    assert reply == "hello" and float(rtt) >= 0.1, r.stdout  # 50 ms each way


def test_namespaces_of_a_killed_run_are_swept(tmp_path):
    require()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process has now: a run that was SIGKILLed
    left = f"pn{dead.pid}x0-a"
    assert subprocess.run(["ip", "netns", "add", left]).returncode == 0
    try:
        assert left in sweep_orphans()
        with Net() as net:
            assert net.namespaces() == [net.hub]
    finally:
        subprocess.run(["ip", "netns", "del", left], capture_output=True)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert left not in listed


def test_without_the_right_to_make_namespaces_the_tests_skip_saying_why(tmp_path):
    """Root without CAP_SYS_ADMIN (a container's root): skipped with the reason, not passed."""
    require()
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv to drop CAP_SYS_ADMIN with")
    r = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--",
         sys.executable, "-m", "pytest", "tests/node/netns/test_hosts.py", "-q", "-rs",
         "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0",
         "--basetemp", str(tmp_path / "inner")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and " skipped" in r.stdout and "passed" not in r.stdout, r.stdout
    assert "no network namespaces: `ip netns add` fails here" in r.stdout, r.stdout
