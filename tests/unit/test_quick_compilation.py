"""Verification workers ask their backend for quick compilation (`CompilesQuickly`) before it
sets up, and timed workers never do: verification needs the same arithmetic, timing the
kernels a user's program would get."""

from __future__ import annotations

from pathlib import Path

import pytest

from xbench.contract import CompilesQuickly, DeviceInfo, Process
from xbench.wire import Job
from xbench.worker.main import _setup

PROCESS = Process(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, nnodes=1,
                  coordinator="127.0.0.1:1", hosts=("127.0.0.1",))


class Recording:
    """Notes the calls the worker makes before any trial."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prefer_quick_compilation(self) -> None:
        self.calls.append("quick")

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        self.calls.append("setup")
        return DeviceInfo("none", "0", "cpu", ("fake:0",), simulated=True, available=1)

    def setup_process(self, process: Process, platform: str) -> DeviceInfo:
        self.calls.append("setup_process")
        return self.setup(1, platform)

    def all_gather(self, values: list[float]) -> list[list[float]]:
        return [values]


def job(mode: str, process: Process | None = None) -> Job:
    arrays = Path("/nonexistent") if mode == "verify" else None
    return Job(target="tests:Recording", devices=1, platform="cpu", mode=mode,
               arrays_dir=arrays, process=process)


def test_the_recording_backend_has_the_ability():
    assert isinstance(Recording(), CompilesQuickly)


@pytest.mark.parametrize("process", [None, PROCESS])
def test_a_verification_job_asks_for_quick_compilation_before_setting_up(process):
    backend = Recording()
    _setup(backend, job("verify", process))
    assert backend.calls[:2] == (["quick", "setup"] if process is None else ["quick", "setup_process"])


@pytest.mark.parametrize("mode", ["time", "allreduce"])
def test_timed_jobs_compile_as_a_users_program_would(mode):
    backend = Recording()
    _setup(backend, job(mode))
    assert backend.calls == ["setup"]


def test_a_backend_without_the_ability_is_set_up_as_before():
    class Plain(Recording):
        prefer_quick_compilation = None

    backend = Plain()
    assert not isinstance(backend, CompilesQuickly)
    _setup(backend, job("verify"))
    assert backend.calls == ["setup"]
