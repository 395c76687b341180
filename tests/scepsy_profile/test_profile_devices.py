"""Device detection shared by the profiler backends: CPU from /proc and cgroups, CUDA device names
mapped to catalog GPUs, the MPS daemon seen (never started), shares as thread counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scepsy_profile.catalog import default_catalog
from scepsy_profile.profiling import devices
from scepsy_profile.profiling.backend import DeviceInfo
from scepsy_profile.profiling.devices import (
    catalog_gpu_name,
    cpu_device,
    cpu_info,
    device_label,
    mps_status,
    threads_for_share,
    usable_cores,
)

MEMINFO = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:    8192000 kB\n"
CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core\n"


@pytest.mark.parametrize(("device_name", "memory", "expected"), [
    ("NVIDIA H200", 139.8, "H200"),
    ("NVIDIA H200", None, "H200"),
    ("NVIDIA H200 NVL", 139.8, "H200"),
    ("NVIDIA A100-SXM4-80GB", 79.3, "A100-80GB"),
    ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", 79.2, "A100-80GB"),
    ("NVIDIA A100 PCIe", 39.4, "A100-40GB"),    # no memory word: the memory decides
    ("NVIDIA A100 PCIe", 79.2, "A100-80GB"),
    ("NVIDIA A100 PCIe", None, None),           # ambiguous without the memory
    ("NVIDIA A100 PCIe", 12.0, None),           # no A100 of that memory
    ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB"),
    ("NVIDIA H100 PCIe", 79.6, "H100-80GB"),
    ("NVIDIA A10", 22.0, "A10"),                # not A100
    ("NVIDIA L4", 22.0, "L4"),
    ("NVIDIA B200", 179.0, "B200"),
    ("NVIDIA GB200", 185.0, "GB200"),           # not B200
    ("NVIDIA L40S", 44.5, None),
    ("NVIDIA A10G", 22.0, None),
    ("Tesla V100-SXM2-32GB", 31.7, None),
])
def test_cuda_names_map_to_catalog_gpus(device_name: str, memory: float | None,
                                        expected: str | None) -> None:
    assert catalog_gpu_name(device_name, memory) == expected


def test_every_catalog_gpu_is_found_under_its_own_name() -> None:
    catalog = default_catalog()
    for name, spec in catalog.gpus.items():
        assert catalog_gpu_name(f"NVIDIA {name}", spec.memory_gib) == name
        assert catalog_gpu_name(name.lower(), spec.memory_gib) == name


def test_unknown_gpus_keep_their_own_name_without_vendor_words() -> None:
    assert device_label("NVIDIA L40S") == "L40S"
    assert device_label("NVIDIA GeForce RTX 4090") == "4090"
    assert device_label("Tesla V100-SXM2-32GB") == "V100-SXM2-32GB"


def _fake_proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "cpuinfo").write_text(CPUINFO)
    return proc


def test_cpu_info_reads_proc(tmp_path: Path) -> None:
    info = cpu_info(_fake_proc(tmp_path), tmp_path / "no-cgroup")
    assert info.model == "AMD EPYC 9654 96-Core"
    assert info.memory_gib == pytest.approx(16384000 * 1024 / 2**30, abs=1e-3)
    assert info.available_gib == pytest.approx(8192000 * 1024 / 2**30, abs=1e-3)
    assert info.cores == usable_cores(tmp_path / "no-cgroup") >= 1


def test_cgroup_limits_cap_memory_and_cores(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{2 * 2**30}\n")
    (cgroup / "cpu.max").write_text("100000 100000\n")  # one core's worth
    info = cpu_info(_fake_proc(tmp_path), cgroup)
    assert info.memory_gib == pytest.approx(2.0)
    assert info.available_gib == pytest.approx(2.0)
    assert info.cores == 1
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "cpu.max").write_text("max 100000\n")
    unlimited = cpu_info(tmp_path / "proc", cgroup)
    assert unlimited.memory_gib > 15 and unlimited.cores == usable_cores(tmp_path / "none")


def test_missing_proc_files_give_unknown_not_a_crash(tmp_path: Path) -> None:
    info = cpu_info(tmp_path / "nothing", tmp_path / "nothing")
    assert info.model == "unknown" and info.memory_gib == 0.0 and info.cores >= 1


def test_this_machine_is_read() -> None:
    info = cpu_info()
    assert info.cores >= 1 and info.memory_gib > 0 and 0 < info.available_gib <= info.memory_gib


@pytest.mark.parametrize(("share", "cores", "threads"), [
    (1.0, 2, 2), (0.5, 2, 1), (0.3, 2, 1), (0.2, 2, 0), (0.25, 2, 1), (0.1, 2, 0),
    (1.0, 16, 16), (0.5, 16, 8), (0.3, 16, 5), (0.03, 16, 0), (1 / 3, 3, 1),
])
def test_share_as_threads(share: float, cores: int, threads: int) -> None:
    assert threads_for_share(share, cores) == threads


def test_threads_grow_with_the_share() -> None:
    for cores in (1, 2, 7, 16, 64):
        counts = [threads_for_share(k / 100, cores) for k in range(1, 101)]
        assert counts == sorted(counts) and counts[-1] == cores
        assert all(abs(t - k / 100 * cores) <= 0.5 for k, t in zip(range(1, 101), counts,
                                                                    strict=True))


def test_cpu_device_counts_the_threads_it_uses(tmp_path: Path) -> None:
    info = cpu_info(_fake_proc(tmp_path), tmp_path)
    dev = cpu_device(3, info, engine_version="x 1")
    assert isinstance(dev, DeviceInfo)
    assert (dev.name, dev.kind, dev.count, dev.memory_gib) == ("cpu", "cpu", 3, info.memory_gib)
    assert dev.detail["cpu_model"] == info.model and dev.detail["threads"] == 3
    assert dev.detail["cores"] == info.cores and dev.detail["engine_version"] == "x 1"


def test_mps_daemon_seen_through_its_control_pipe(tmp_path: Path) -> None:
    pipes = tmp_path / "mps"
    pipes.mkdir()
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes)}
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    absent = mps_status(empty_proc, env)
    assert not absent.running and str(pipes) in absent.evidence
    (pipes / "control").write_text("")
    present = mps_status(empty_proc, env)
    assert present.running and present.pipe_dir == str(pipes) and "control" in present.evidence


def test_mps_daemon_seen_as_a_process(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, argv in (("17", b"/usr/bin/python\0x.py\0"), ("42", b"bash\0"), ("self", b"")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(argv)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no-pipes")}
    assert not mps_status(proc, env).running
    (proc / "99").mkdir()
    (proc / "99" / "cmdline").write_bytes(b"/usr/bin/nvidia-cuda-mps-control\0-d\0")
    seen = mps_status(proc, env)
    assert seen.running and "99" in seen.evidence


def test_default_pipe_directory() -> None:
    status = mps_status(Path("/nonexistent-proc"), {})
    assert status.pipe_dir == devices.MPS_DEFAULT_PIPE_DIR


def test_importing_the_profilers_imports_no_engine() -> None:
    code = ("import sys; import scepsy_profile.profiling.devices, "
            "scepsy_profile.profiling.torch_backend; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
