"""The planted slowdown `extra_work` (`xbench_backends.extra_work`) in the jax backends, in-process
on simulated CPU devices: the option is validated with a one-line message, `run` makes a
fraction f more calls of the real compiled step than it was asked for (counted, not timed:
a count does not depend on how busy the machine is), and what verification compares
(`train`, `gradients`) is the same with the option as without."""

from __future__ import annotations

import numpy as np
import pytest

from xbench.contract import AS_WRITTEN, DATA_PARALLEL, PLAIN, Trial
from xbench.contract.timing import TimingProtocol
from xbench.contract.work import build_work
from xbench.models.model_spec import ModelSpec
from xbench_backends.extra_work import ExtraWork, parse

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.backends.jax.cpu_devices import DEVICES, simulated_devices  # noqa: E402
from xbench_backends.jax.pmap import JaxPmapBackend  # noqa: E402
from xbench_backends.jax.shardmap import JaxShardMapBackend  # noqa: E402

BATCH = 8
MODEL = ModelSpec(name="extra-work-test", widths=(16,), batch_sizes=(BATCH,))


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 1, "0", "0.2", " 0.25 "])
def test_accepted(value):
    JaxPmapBackend().validate_options({"extra_work": value})
    JaxShardMapBackend().validate_options({"extra_work": value})


@pytest.mark.parametrize("value", [-0.1, "-0.2", "abc", "", "nan", "inf", float("nan"), True, None, [0.2], 1.5])
def test_refused_in_one_line(value):
    with pytest.raises(ValueError, match="extra_work must be a number") as caught:
        JaxPmapBackend().validate_options({"extra_work": value})
    assert "\n" not in str(caught.value)


def test_unknown_option_refused():
    JaxPmapBackend().validate_options({})
    with pytest.raises(ValueError, match="unknown option 'bucket_cap_mb'; jax takes only extra_work"):
        JaxPmapBackend().validate_options({"bucket_cap_mb": 10})


@pytest.mark.parametrize(("fraction", "window", "calls", "extra"),
                         [(0.0, 7, 70, 0), (0.2, 1, 100, 20), (0.2, 3, 99, 19), (0.5, 2, 100, 50), (0.3, 10, 100, 30),
                          (0.29, 1, 100, 29), (1.0, 4, 40, 40)])
def test_owed_calls_add_up(fraction, window, calls, extra):
    account = ExtraWork(parse(fraction))
    assert sum(account.owed(window) for _ in range(calls // window)) == extra


@pytest.fixture(scope="module")
def devices():
    """2 simulated CPU devices (jax fixes its device count at its first operation)."""
    return simulated_devices(DEVICES)


def _trial(backend: str, devices: int, program: str, variant: str, steps_per_call: int, extra_work) -> Trial:
    protocol = TimingProtocol(warmup_steps=0, steps=4, repeats=1, steps_per_call=steps_per_call, trial_timeout_s=600)
    return Trial(backend=backend, model=MODEL, devices=devices, global_batch=BATCH, scaling="strong",
                 precision="fp32", platform="cpu", learning_rate=1e-3, seed=0, samples=4 * BATCH, protocol=protocol,
                 options={"extra_work": extra_work}, launcher="subprocess", variant=variant, program=program)


def _counted(prepared) -> list[int]:
    """Counts the calls `run` makes of the prepared step (the compiled program itself runs)."""
    calls = [0]
    step = prepared.step

    def counting(*args):
        calls[0] += 1
        return step(*args)

    prepared.step = counting
    return calls


# (backend class, devices, program, variant, steps per call): the pmapped program, the NNX and the
# functional plain programs, the fused variant, and jax-shardmap (which runs through jax's `run`).
PROGRAMS = [
    pytest.param(JaxPmapBackend, 2, DATA_PARALLEL, AS_WRITTEN, 1, id="pmap"),
    pytest.param(JaxPmapBackend, 1, PLAIN, AS_WRITTEN, 1, id="plain-nnx"),
    pytest.param(JaxPmapBackend, 1, PLAIN, "functional", 1, id="plain-functional"),
    pytest.param(JaxPmapBackend, 1, DATA_PARALLEL, "fused", 2, id="fused"),
    pytest.param(JaxShardMapBackend, 2, DATA_PARALLEL, AS_WRITTEN, 1, id="shardmap"),
]


@pytest.mark.parametrize(("cls", "n", "program", "variant", "per_call"), PROGRAMS)
def test_run_makes_extra_calls_verification_unchanged(devices, cls, n, program, variant, per_call):
    backend = cls()
    backend.devices = devices[:n]
    work = build_work(MODEL, 4 * BATCH, 0)
    counts, losses, grads = {}, {}, {}
    for fraction in ("0", "0.5"):
        trial = _trial(backend.name, n, program, variant, per_call, fraction)
        plain = backend.prepare(trial, work)
        losses[fraction] = backend.train(plain, 3 * per_call)  # what verification compares: no extra calls
        grads[fraction] = backend.gradients(plain)[1]
        timed = backend.prepare(trial, work)
        calls = _counted(timed)
        for _ in range(5):  # windows of 4 steps: 20 steps
            backend.run(timed, 4 * per_call)
        counts[fraction] = calls[0]
    assert counts == {"0": 20, "0.5": 30}
    assert losses["0"] == losses["0.5"]
    for a, b in zip(grads["0"], grads["0.5"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_option_reaches_prepared(devices):
    backend = JaxPmapBackend()
    backend.devices = devices[:1]
    trial = _trial("jax", 1, PLAIN, AS_WRITTEN, 1, "0.25")
    assert backend.prepare(trial, build_work(MODEL, 4 * BATCH, 0)).extra.fraction == 0.25
