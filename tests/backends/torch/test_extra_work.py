"""The planted slowdown `extra_work` (`xbench_backends.extra_work`) in the torch backend: the
option is validated with a one-line message (no torch needed), and on one CPU device `run`
makes a fraction f more real training steps than it was asked for (counted by the backend's
own step counter, not timed: a count does not depend on how busy the machine is), while
what verification compares (`train`, `gradients`) is the same with the option as without.

The trials run in one child process (this module as a script), as in test_torch_variants, so
that torch and its process group stay out of the pytest process."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.children import child_main, run_children
from xbench.contract import DATA_PARALLEL, PLAIN

CHILD_TIMEOUT_S = 180
FRACTIONS = ("0", "0.5")
WINDOWS, STEPS = 5, 4  # `run` called 5 times for 4 steps: 20 steps asked for


@pytest.mark.parametrize("value", [0, 0.5, 1, "0.2", " 0.25 "])
def test_accepted(value):
    from xbench_backends.torch.ddp import TorchDdpBackend

    TorchDdpBackend().validate_options({"extra_work": value})


@pytest.mark.parametrize("value", [-0.1, "-0.2", "abc", "", "nan", float("inf"), True, None, 2])
def test_refused_in_one_line(value):
    from xbench_backends.torch.ddp import TorchDdpBackend

    with pytest.raises(ValueError, match="extra_work must be a number") as caught:
        TorchDdpBackend().validate_options({"extra_work": value})
    assert "\n" not in str(caught.value)


def test_unknown_option_refused():
    from xbench_backends.torch.ddp import TorchDdpBackend

    with pytest.raises(ValueError, match="unknown option 'bucket_cap_mb'; torch takes only extra_work"):
        TorchDdpBackend().validate_options({"bucket_cap_mb": 10})


# -- what the child process does ----------------------------------------------------------------


def _trial(program: str, extra_work: str):
    from xbench.contract import TimingProtocol, Trial
    from xbench.models.model_spec import ModelSpec

    model = ModelSpec(name="extra-work-test", widths=(16,), batch_sizes=(8,))
    return Trial(backend="torch", model=model, devices=1, global_batch=8, scaling="strong", precision="fp32",
                 platform="cpu", learning_rate=1e-3, seed=0, samples=32, program=program,
                 protocol=TimingProtocol(warmup_steps=0, steps=STEPS, repeats=1),
                 options={"extra_work": extra_work})


def _child() -> dict:
    from xbench.contract.work import build_work
    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    backend.setup(1, "cpu")
    out = {}
    for program in (DATA_PARALLEL, PLAIN):
        for fraction in FRACTIONS:
            trial = _trial(program, fraction)
            work = build_work(trial.model, trial.samples, trial.seed)
            verified = backend.prepare(trial, work)
            loss, gradients = backend.gradients(verified)
            losses = backend.train(verified, 3)
            timed = backend.prepare(trial, work)
            for _ in range(WINDOWS):
                backend.run(timed, STEPS)
            out[program, fraction] = {"steps": timed.step, "loss": loss, "gradients": gradients, "losses": losses,
                                      "fraction": timed.extra.fraction}
    return out


# -- the parent ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    pytest.importorskip("torch")
    return run_children(__file__, {"child": {}}, tmp_path_factory.mktemp("extra_work"), CHILD_TIMEOUT_S)["child"]


@pytest.mark.parametrize("program", [DATA_PARALLEL, PLAIN])
def test_run_makes_extra_steps_verification_unchanged(child, program):
    none, half = child[program, "0"], child[program, "0.5"]
    assert (none["fraction"], half["fraction"]) == (0.0, 0.5)
    assert (none["steps"], half["steps"]) == (WINDOWS * STEPS, WINDOWS * STEPS * 3 // 2)
    assert none["loss"] == half["loss"] and none["losses"] == half["losses"]
    for a, b in zip(none["gradients"], half["gradients"], strict=True):
        np.testing.assert_array_equal(a, b)


if __name__ == "__main__":
    child_main(lambda job: _child())
