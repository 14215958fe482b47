"""Verification's side-by-side jobs start on different GPUs: every 1-device run went to the
first GPU, so on 4 GPUs up to 8 verification workers shared GPU 0 while three stood idle."""

from __future__ import annotations

import pytest

from xbench.run.launcher import VISIBLE_GPUS, spread_environment
from xbench.run.verify_phase import gpus_to_spread


def gpu(available: int, simulated: bool = False, platform: str = "gpu") -> dict:
    return {"available": available, "simulated": simulated, "platform": platform}


def test_each_job_starts_on_its_own_gpu_in_turn():
    gpus = ("0", "1", "2", "3")
    seen = [spread_environment(gpus, index)[VISIBLE_GPUS] for index in range(5)]
    assert seen == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2", "0,1,2,3"]
    assert spread_environment((), 3) == {}


def test_real_gpus_are_spread_and_nothing_else(monkeypatch):
    monkeypatch.delenv(VISIBLE_GPUS, raising=False)
    assert gpus_to_spread({"jax": gpu(4), "torch": gpu(4)}) == ("0", "1", "2", "3")
    assert gpus_to_spread({"jax": gpu(1)}) == ()  # one GPU: nothing to spread over
    assert gpus_to_spread({"jax": gpu(8, simulated=True, platform="cpu")}) == ()


@pytest.mark.parametrize("visible, expected", [("2,3", ("2", "3")), ("GPU-a1, GPU-b2", ("GPU-a1", "GPU-b2"))])
def test_the_users_visible_gpus_are_the_ones_spread(monkeypatch, visible, expected):
    monkeypatch.setenv(VISIBLE_GPUS, visible)
    assert gpus_to_spread({"torch": gpu(2)}) == expected


@pytest.mark.parametrize("verifying, expected", [(True, "1,0"), (False, None)])
def test_only_verification_jobs_are_spread(tmp_path, monkeypatch, verifying, expected):
    """A timed job sees the GPUs as the user does: its devices are the first ones, always."""
    from tests.unit.test_estimate import trial
    from xbench.run import launcher
    from xbench.run.plan import Group

    started = []
    monkeypatch.setattr(launcher.Gang, "start", lambda jobs, *rest: started.append(jobs))
    ctx = launcher.Context(run_id="r", run_dir=tmp_path, environment={}, write=lambda record: None,
                           arrays_dir=tmp_path if verifying else None, spread_gpus=("0", "1"))
    one = trial(8)
    launcher.start_gang(Group(one.backend, "target", 1, (one,)), [one], ctx, job_index=1)
    [(job, env)] = started[0]
    assert env.get(VISIBLE_GPUS) == expected and job.mode == ("verify" if verifying else "time")
