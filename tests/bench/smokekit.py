"""Running a bench's ``--smoke`` mode as a process of its own, and what its output must hold.

A bench is run by hand, seldom; what it calls (a control op, a function, a
CLI flag) can be renamed under it and nothing notices until someone wants a
figure. The smoke tests run ``python bench/NAME.py --smoke`` (real nodes,
real control ops, at tiny sizes): it must exit 0 and print the load-average
line (bench/benchkit.py) and a figure of its own table, so a rename fails a
test instead. Each bench runs alone, in a fresh process group that is killed
when it ends, so no test depends on another and none leaves servers behind.

The benches are split over two test files (tests/bench/test_smoke.py and
tests/bench/test_smoke_swarm.py) only so that pytest-xdist's ``--dist
loadfile`` can run the two halves side by side.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: Modules in bench/ that are not benches: the shared helpers, compute_bench's parts,
#: and Petals' client (bench/ttft_bench.py runs it in a Petals environment, never here).
NOT_BENCHES = {"benchkit", "compute_wire", "llama_cpp_baseline", "petals_client"}
LIMIT_S = 600  # a smoke run takes seconds to two minutes on a loaded 2-core machine
LOAD_LINE = re.compile(r"^load average: start [\d.]+ [\d.]+ [\d.]+, end [\d.]+ [\d.]+ [\d.]+",
                       re.M)
NUMBER = r"[\d,.]+"

#: Bench -> a figure its smoke output must hold (a row of its table: labels and numbers).
FIGURES = {
    "ab_mining": rf"\| 1 x 2 \| 1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \| \d of 1 \|",
    "ab_swarm": rf"\| 1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \| \d of 1 \|",
    "cold_forward_bench": rf"back-to-back\s+{NUMBER}\s+{NUMBER}\s+1\.00x",
    "compute_bench": rf"decode 2 greedy tok\W+{NUMBER}\W+transformers generate\(\)\W+{NUMBER}",
    "daemon_read_bench": rf"ledger show \(tip\)\s+{NUMBER} ms\s+{NUMBER} ms",
    "data_bench": rf"pnode /pnode/data/1\.0\.0\s+{NUMBER} MB/s",
    "export_bench": rf"read: load_gguf \(\.gguf\)\s+{NUMBER}\s+{NUMBER}x",
    "free_flood": rf"shipped\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x",
    "gpu_check": rf"\| 1 GPU server\(s\) \| {NUMBER} / - \| {NUMBER} \| \d of 2 tokens \|",
    "ledger_bench": rf"{NUMBER} tx/s\W+Ed25519 verify {NUMBER}/s",
    "merkle_bench": rf"verify_inclusion, 1,000-leaf tree\W+{NUMBER} proofs/s",
    "paid_bench": rf"decode tokens/s\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}",
    "paid_risk": rf"greedy\s+(-|{NUMBER} \({NUMBER}\))\s+{NUMBER} \({NUMBER}\)",
    "pol_bench": rf"judge / train, median over steps\s+{NUMBER}x",
    "pol_noise": rf"cheat\s+9e-05\s+9e-05\s+9e-05\s+1\s+1",
    "pol_devnet": r"scaled-gradients\s+\d+\s+\d+\s+\d+\s+[\d.]+ / (True|False)",
    "wiretensor_bench": rf"float32 copy\W+{NUMBER}\W+{NUMBER}",
    "push_copy": rf"tokens/s, copies / none \(paired median\): {NUMBER}x",
    "smol_job_bench": rf"1 node \(k=3\)\s+{NUMBER} s\s+{NUMBER}x\s+True",
    "spot_check": rf"\| on \(rate 0\.02\) \| {NUMBER} \| {NUMBER} \|",
    "spot_detect": r"\| 1 \| new \| 1 \| [01] \| \d+% \|",
    "swarm_bench": rf"\| 2 server\(s\) \| {NUMBER} \| {NUMBER} \| {NUMBER} \|",
    "train_bench": rf"\| 1 \| 1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \|",
    "train_local_bench": rf"whole\s+3 steps in {NUMBER} s",
    "transport_bench": rf"libp2p, gap 0 ms\s+{NUMBER}\s+{NUMBER}x",
    "ttft_bench": rf"pnode paid\s+\d+\s+{NUMBER}\s+True",
}
#: The benches that serve SmolLM2 from `pnode start` servers (tests/bench/test_smoke_swarm.py).
SWARM = {"ab_swarm", "gpu_check", "paid_bench", "spot_check", "swarm_bench", "ttft_bench"}


def benches() -> set[str]:
    """The benches in bench/, by module name."""
    return {p.stem for p in BENCH.glob("*.py")} - NOT_BENCHES


def run_smoke(name: str) -> subprocess.CompletedProcess:
    """``python bench/NAME.py --smoke`` on this checkout's code; output and errors as one text."""
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path),
               COLUMNS="200")  # rich's tables keep a row on one line
    proc = subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), "--smoke"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{name} --smoke ran past {LIMIT_S} s:\n{out[-4000:]}")
    finally:
        try:  # whatever the bench started and left running (its group outlives it)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def check_smoke(name: str) -> None:
    """Run ``name``'s smoke mode: exit 0, the load-average line and its figure, or fail."""
    r = run_smoke(name)
    assert r.returncode == 0, f"{name} --smoke exited {r.returncode}:\n{r.stdout[-4000:]}"
    assert LOAD_LINE.search(r.stdout), f"{name}: no load-average line:\n{r.stdout[-2000:]}"
    assert re.search(FIGURES[name], r.stdout), f"{name}: no figure:\n{r.stdout[-3000:]}"
