"""Real trials of the built-in backends on simulated CPU devices (TF and JAX installed).

One small comparison serves several checks: identical work across frameworks, the precision
policy each backend applied, and a real 2-device trial per backend.
"""

import json

import pytest

from tests.conftest import TINY
from xbench.results.records import read_records

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fp32_run(real_run):
    return real_run[0], read_records(real_run[1])


def test_every_trial_ran(fp32_run):
    code, records = fp32_run
    assert code == 0
    # On 1 device each backend runs its plain program (no distribution strategy, no pmap) and its
    # data-parallel one, the baseline of its own speedup.
    programs = {1: ("/plain", ""), 2: ("",)}
    assert sorted(r["trial_id"] for r in records) == sorted(
        f"{b}/{m}/d{d}/b16{program}/r{k}" for b in ("tf", "jax") for m in ("medium", "large") for d in (1, 2)
        for program in programs[d] for k in (0, 1))
    assert all(r["status"] == "ok" for r in records), [r["reason"] for r in records]


def test_tf_and_jax_pass_verification_on_one_and_two_devices(real_run):
    """The run's verification (what `xbench verify --backends tf jax --devices 2` checks, with
    the same plan and checks): every check passed, across devices and across frameworks."""
    _, out = real_run
    saved = json.loads((out / "verify.json").read_text())
    subjects = {" ".join(c["subject"].split()) for c in saved["checks"]}
    assert {"medium: tf d2 vs tf d1", "large: jax d2 vs jax d1", "large: jax d1 vs tf d1"} <= subjects
    assert [c["subject"] for c in saved["checks"] if not c["passed"]] == []
    assert saved["failed_backends"] == [] and saved["problems"] == {}


def test_workers_exit_as_python_does_leaving_no_temporary_files(real_run):
    """A worker that finished its job is let exit, not killed, so that exit handlers run:
    TensorFlow's removes the code autograph generated for every tf.function."""
    left = (real_run[1].parent / "left.txt").read_text().split()  # in the workers' own directory, at the run's end
    assert real_run[0] == 0 and not [name for name in left if name.startswith("__autograph_generated")], left


def test_identical_work_across_frameworks(fp32_run):
    _, records = fp32_run
    for model, params in (("medium", 54_403), ("large", 2_021_379)):
        mine = [r for r in records if r["trial"]["model"]["name"] == model]
        assert {r["work"]["params"] for r in mine} == {params}
        assert {r["backend"]["params"] for r in mine} == {params}  # counted by each framework
        assert len({r["work"]["weights_hash"] for r in mine}) == 1
        assert len({r["work"]["data_hash"] for r in mine}) == 1
        # The weights each framework holds on its devices, read back, hash to the core's.
        assert {r["backend"]["weights_hash"] for r in mine} == {mine[0]["work"]["weights_hash"]}


def test_two_device_trials_use_two_devices(fp32_run):
    _, records = fp32_run
    for record in records:
        assert len(record["devices"]["device_names"]) == record["trial"]["devices"]
        assert record["devices"]["simulated"] is True  # this suite runs on CPU machines


def test_fp32_policy_is_applied(fp32_run):
    _, records = fp32_run
    for record in records:
        expected = {"jax": {"jax_default_matmul_precision": "float32", "compute_dtype": "float32"},
                    "tf": {"tensor_float_32_execution": False, "keras_policy": "float32"}}[record["trial"]["backend"]]
        assert record["backend"]["precision"] == expected


def test_jax_steadies_the_cpu_scheduler(fp32_run):
    """On CPU devices jax's workers run with XLA's concurrency-optimized scheduler off (it made
    2-device steps bimodal on 2 cores), and the record says so."""
    _, records = fp32_run
    jax_records = [r for r in records if r["trial"]["backend"] == "jax"]
    assert jax_records
    for record in jax_records:
        flags = record["replicate"]["settings"]["XLA_FLAGS"].split()
        assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in flags


# The runs below skip verification: it runs in strict precision and one step per call whatever
# the run's --precision and --steps-per-call, so it would repeat real_run's.


def test_tf32_policy_and_fused_steps_per_call(tmp_path):
    """The tf32 policy, and several steps inside one compiled call (lax.scan in jax, a tf.range
    loop in tf), in one run: each its own run cost a start and compilation of both frameworks."""
    from xbench.cli.main import main

    code = main(["compare", "--backends", "tf", "jax", "--model", "medium", "--devices", "2",
                 "--batch-sizes", "16", "--repeats", "2", "--steps", "4", "--warmup-steps", "2",
                 "--steps-per-call", "2", "--samples", "64", "--precision", "tf32", "--no-verify",
                 "--out", str(tmp_path / "run")])
    records = read_records(tmp_path / "run")
    assert code == 0 and len(records) == 4  # 2 backends x 2 replicates
    assert sorted(r["trial"]["backend"] for r in records) == ["jax", "jax", "tf", "tf"]
    assert all(r["status"] == "ok" and r["trial"]["protocol"]["steps_per_call"] == 2 for r in records)
    for record in records:
        precision = record["backend"]["precision"]
        if record["trial"]["backend"] == "jax":
            assert precision["jax_default_matmul_precision"] == "tensorfloat32"
        else:
            assert precision["tensor_float_32_execution"] is True


def test_bf16_policy_is_applied(tmp_path):
    """Each backend's data-parallel program (its plain one applies the policy the same way, in
    prepare; timing both only cost a compilation more per worker)."""
    from xbench.cli.main import main

    code = main(["compare", "--backends", "tf", "jax", "--model", "medium", "--devices", "1",
                 "--single-device", "data-parallel", "--precision", "bf16", "--no-verify", *TINY,
                 "--out", str(tmp_path / "run")])
    found = read_records(tmp_path / "run")
    records = {r["trial"]["backend"]: r for r in found}
    assert code == 0 and len(found) == 4 and all(r["status"] == "ok" for r in found)  # 2 backends x 2 replicates
    assert records["jax"]["backend"]["precision"] == {"jax_default_matmul_precision": "bfloat16",
                                                      "compute_dtype": "bfloat16"}
    assert records["tf"]["backend"]["precision"]["keras_policy"] == "mixed_bfloat16"
    # fp32 master weights: the same initial weights as every other precision
    assert {r["backend"]["weights_hash"] for r in records.values()} == {records["jax"]["work"]["weights_hash"]}
