"""Backends for tests: a numpy one that really computes, and plugins that misbehave.

The numpy backend can be told, through its options, to crash, hang or fail on one global
batch size, so tests can check that the launcher loses nothing else.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from xbench.contract import Availability, DeviceInfo, DeviceUnavailable, PreparedInfo, Trial, Work

FAKE_DEVICES = 4
ACTIONS = ("crash_batch", "hang_batch", "fail_batch", "work_factor", "rank", "fail_if_env", "delay_rank",
           "fail_allreduce_bytes")


@dataclass
class NumpyPrepared:
    info: PreparedInfo
    trial: Trial
    x: np.ndarray
    kernel: np.ndarray


class NumpyBackend:
    """Forward passes of the first layer in numpy: real work, no framework."""

    name: ClassVar[str] = "numpy"
    install_hint: ClassVar[str] = "nothing to install"

    def probe(self) -> Availability:
        return Availability(True, version=np.__version__)

    def validate_options(self, options: dict[str, Any]) -> None:
        unknown = set(options) - set(ACTIONS)
        if unknown:
            raise ValueError(f"unknown option {sorted(unknown)[0]!r}")

    def setup(self, devices: int, platform: str) -> DeviceInfo:
        if devices > FAKE_DEVICES:
            raise DeviceUnavailable(f"asked for {devices} devices; numpy fakes {FAKE_DEVICES}")
        return DeviceInfo("numpy", np.__version__, "cpu", tuple(f"fake:{i}" for i in range(devices)),
                          simulated=True, available=FAKE_DEVICES)

    def prepare(self, trial: Trial, work: Work) -> NumpyPrepared:
        info = PreparedInfo(params=work.params, weights_hash=work.weights_hash,
                            precision={"numpy": trial.precision})
        return NumpyPrepared(info, trial, work.x[: trial.global_batch], work.weights[0][0])

    def run(self, prepared: NumpyPrepared, steps: int) -> None:
        batch = prepared.trial.global_batch
        options = {k: int(v) for k, v in prepared.trial.options.items() if k != "fail_if_env"}
        if options.pop("delay_rank", -1) == _rank():
            time.sleep(2.0)  # a slow rank: the others report first
        if "rank" in options and options["rank"] != _rank():
            options = {"work_factor": options.get("work_factor", 1)}  # the planned mishap is another rank's
        elif os.environ.get(str(prepared.trial.options.get("fail_if_env", "")) or "-"):
            raise RuntimeError("planned failure (environment)")
        if options.get("crash_batch") == batch:
            os._exit(3)
        if options.get("hang_batch") == batch:
            time.sleep(3600)
        if options.get("fail_batch") == batch:
            raise RuntimeError("planned failure")
        for _ in range(steps * options.get("work_factor", 1)):  # work_factor: a planned slowdown
            np.maximum(prepared.x @ prepared.kernel, 0)


class SpmdNumpyBackend(NumpyBackend):
    """The numpy backend started one process per device (spmd launcher). Its `all_gather` is
    not a collective: it repeats this rank's values, enough for launcher tests. Option
    `rank=R` confines crash/hang/fail to rank R."""

    name: ClassVar[str] = "numpy-spmd"
    launchers: ClassVar[tuple[str, ...]] = ("spmd",)

    def setup_process(self, process: Any, platform: str) -> DeviceInfo:
        self.world = process.world_size
        return DeviceInfo("numpy", np.__version__, "cpu", (f"fake:{process.local_rank}",),
                          simulated=True, available=FAKE_DEVICES)

    def all_gather(self, values: list[float]) -> list[list[float]]:
        return [list(values) for _ in range(self.world)]

    def allreduce_prepare(self, nbytes: int, options: dict[str, Any]) -> np.ndarray:
        """Option fail_allreduce_bytes=N (with rank=R): that rank fails at that size."""
        planned = int(options.get("fail_allreduce_bytes", -1)) == nbytes
        if planned and int(options.get("rank", _rank())) == _rank():
            raise RuntimeError("planned all-reduce failure")
        return np.ones(nbytes // 4, np.float32)

    def allreduce_run(self, prepared: np.ndarray, iterations: int) -> None:
        for _ in range(iterations):
            prepared += 1.0  # work of a sum that never overflows


class PeersBackend(SpmdNumpyBackend):
    """The spmd numpy backend with a rendezvous: in a multi-node job a process of node > 0
    waits for node 0's coordinator port to open, as a framework's distributed start does."""

    name: ClassVar[str] = "numpy-peers"

    def setup_process(self, process: Any, platform: str) -> DeviceInfo:
        host, port = process.coordinator.rsplit(":", 1)
        while process.node_rank > 0:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return super().setup_process(process, platform)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class MissingFrameworkBackend(NumpyBackend):
    name: ClassVar[str] = "missing"
    install_hint: ClassVar[str] = "pip install 'xbench[missing]'"

    def probe(self) -> Availability:
        return Availability(False, reason=f"missingframework not installed; {self.install_hint}")


class IncompleteBackend:
    """Lacks `run`: must show as unavailable, not crash the tool."""

    name: ClassVar[str] = "incomplete"

    def probe(self) -> Availability:
        return Availability(True, version="0")

    def setup(self, devices: int, platform: str) -> DeviceInfo: ...
    def prepare(self, trial: Trial, work: Work) -> Any: ...
