"""compute.device: device names, a missing GPU, and the deterministic settings."""

from __future__ import annotations

import os

import pytest
import torch

from compute.device import (
    CUBLAS_WORKSPACE,
    DeviceSpecError,
    DeviceUnavailableError,
    Settings,
    apply_settings,
    current_settings,
    deterministic,
    resolve_device,
)
from compute.errors import ComputeError, DeviceError


@pytest.fixture
def restore_settings():
    before = current_settings()
    yield before
    apply_settings(before)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend torch sees one CUDA device named "Fake GPU"."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Fake GPU")


@pytest.mark.parametrize("spec", [None, "cpu", torch.device("cpu")])
def test_cpu(spec):
    assert resolve_device(spec) == torch.device("cpu")


BAD = ["gpu", "cuda:-1", "cuda:x", "cuda:0 ", " cpu", "CPU", "mps", "", -1, True, 1.5]


@pytest.mark.parametrize("spec", BAD)
def test_bad_device_names_are_refused(spec):
    with pytest.raises(DeviceSpecError, match="expected") as info:
        resolve_device(spec)
    assert isinstance(info.value, DeviceError) and isinstance(info.value, ComputeError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("spec", ["cuda:0", "cuda", 0, torch.device("cuda", 0), "cuda:3"])
def test_a_missing_gpu_is_an_error_not_a_cpu_fallback(spec):
    want = r"cuda:\d requested .* but torch sees no CUDA device"
    with pytest.raises(DeviceUnavailableError, match=want):
        resolve_device(spec)


def test_a_gpu_index_past_the_last_names_the_ones_that_exist(fake_gpus):
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device(0) == resolve_device("cuda") == torch.device("cuda", 0)
    want = r"cuda:1 requested .* sees only cuda:0 \(Fake GPU\)"
    with pytest.raises(DeviceUnavailableError, match=want):
        resolve_device(1)


def test_deterministic_applies_every_setting(restore_settings, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    previous = deterministic(1, warn_only=False)
    assert previous == restore_settings
    assert current_settings() == Settings(
        threads=1, default_dtype=torch.float32, matmul_tf32=False, cudnn_tf32=False,
        matmul_precision="highest", cudnn_deterministic=True, cudnn_benchmark=False,
        deterministic_algorithms=True, warn_only=False,
    )
    assert torch.get_num_threads() == 1
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    deterministic(2)
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # the default: warn, run
    apply_settings(previous)
    assert current_settings() == restore_settings


def test_deterministic_keeps_a_cublas_setting_already_made(restore_settings, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    deterministic(2)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.parametrize("threads", [0, -2, True, 1.0])
def test_deterministic_refuses_a_bad_thread_count(threads):
    with pytest.raises(DeviceSpecError, match="thread count"):
        deterministic(threads)


def test_pinned_threads_rounds_as_its_count_whatever_the_callers(restore_settings):
    """A float32 sum that torch splits by thread (one output, past its grain) rounds by
    the thread count: `pinned_threads` gives the pinned count's bits from a caller at any
    count, and puts the caller's back. The control: 1 and 2 threads differ unpinned (at
    the first length that shows it; skipped, with what was measured, where none does)."""
    from compute.device import pinned_threads
    g = torch.Generator().manual_seed(0)
    lengths = (40_009, 262_147, 1_000_003)  # past at::internal::GRAIN_SIZE (32768)

    def unpinned_sum(x, threads):
        torch.set_num_threads(threads)
        return x.sum()

    for n in lengths:
        x = torch.randn(n, generator=g)
        at = {t: unpinned_sum(x, t) for t in (1, 2)}
        if not torch.equal(at[1], at[2]):  # the control: the count shows in the bits
            break
    else:
        pytest.skip(f"control not shown: float32 sums of {lengths} elements rounded alike "
                    "at 1 and 2 threads here")
    for caller in (1, 2, 3):
        for pinned in (1, 2):
            torch.set_num_threads(caller)
            with pinned_threads(pinned):
                assert torch.get_num_threads() == pinned
                assert torch.equal(x.sum(), at[pinned])
            assert torch.get_num_threads() == caller


def test_the_compute_class_names_device_build_and_cpu_threads():
    from compute.device import compute_class
    name = compute_class("cpu", 2)
    assert name.startswith("cpu/") and name.endswith("/threads-2") and torch.__version__ in name
    assert compute_class("cpu", 3) != name  # the thread count splits reductions
    assert all(" " <= c <= "~" for c in name) and len(name) <= 128


def test_a_jobs_classes_are_checked_and_left_out_of_its_hash_when_empty():
    from compute.data import JobConfig
    from compute.errors import ConfigError
    from compute.jobfile import config_from_json, config_json
    assert "classes" not in config_json(JobConfig())  # jobs made before keep their hash
    named = JobConfig(classes=("cpu/x86_64/AVX2/torch-2.13.0+cpu/threads-2",))
    assert config_from_json(config_json(named)) == named
    for bad in (("",), ("caf\u00e9",), ("x" * 129,), tuple(str(i) for i in range(17)), ["a"]):
        with pytest.raises(ConfigError, match="classes"):
            JobConfig(classes=bad)
