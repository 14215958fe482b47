"""The torch backend (DistributedDataParallel, one process per device) tested directly, without
the core's spmd launcher: this file starts the ranks itself, each a child process running this
module as a script (`python tests/test_torch_ddp.py JOB.json`), and compares what they report.

One small fp32 verification trial (medium MLP, dropout off, global batch 32) runs as:
- torch on 1 process (also prepares tf32 and bf16 trials, for their precision settings),
- torch on 2 processes (gloo on CPU): the all-reduced trial, then the compute-only twin,
- jax on 1 CPU device (the reference backend), in its own process.
The 2-process run's ranks start together; the other processes as run_children's share of
the cores allows. Every wait has a timeout and every child is killed in a `finally`.

Each torch process also reports `shard_losses(prepared, 2)` (each rank's loss of its own half
of the step's batch, gathered by rank; on 1 process the two halves one by one) for the
verification trial and for small trials of transformer-tiny (its blocks; shorter context and
vocabulary), resnet18 (BatchNorm: each half its own statistics; also channels-last) and an MLP
with dropout on (2 ranks), each before its gradients: the halves must agree across process
counts, average to the global loss, and change nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.support.children import child_log, child_main, run_children
from xbench.contract import ALL_GATHER, REDUCE_SCATTER
from xbench.run.cluster import free_port_block

CHILD_TIMEOUT_S = 180  # for all jobs; a hang in a collective fails the test instead of blocking CI
STEPS = 10
COMPUTE_ONLY_STEPS = 3


def _trial(devices: int, **changes):
    """The fp32 verification trial of the medium model for `devices` ranks (backend torch)."""
    from xbench.experiment import build_spec
    from xbench.run.verify_plan import verification_trials

    spec = build_spec({"models": [{"preset": "medium"}], "devices": [1, 2]})
    trial = next(t for t in verification_trials(spec, ["torch", "jax"], [1, 2])
                 if t.devices == devices and t.backend == changes.get("backend", "torch"))
    return replace(trial, **changes)


SHARDS_AGREE = 1e-5  # relative: one half's loss on 1 process and on 2 ranks
SHARD_BATCH = 8


def _shard_trial(family: str, devices: int, **changes):
    """A small trial (global batch 8, 2 batches) for `shard_losses`."""
    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol
    from xbench.models.model_spec import preset_model

    preset, dims, dropout = {"transformer": ("transformer-tiny", {"context": 16, "vocab": 64}, 0.0),
                             "cnn": ("resnet18", {}, 0.0), "mlp": ("medium", {}, 0.2)}[family]
    model = preset_model(preset, batch_sizes=(SHARD_BATCH,))
    model = replace(model, dims=tuple(sorted({**dict(model.dims), **dims}.items())), dropout=dropout)
    trial = Trial(backend="torch", model=model, devices=devices, global_batch=SHARD_BATCH, scaling="strong",
                  precision="fp32", platform="cpu", learning_rate=1e-3, seed=0, samples=SHARD_BATCH * 2,
                  protocol=TimingProtocol(warmup_steps=0, steps=2, repeats=1))
    return replace(trial, **changes)


def _shard_trials(devices: int) -> dict:
    trials = {"transformer": _shard_trial("transformer", devices), "cnn": _shard_trial("cnn", devices),
              "cnn channels-last": _shard_trial("cnn", devices, variant="channels-last")}
    if devices == 1:
        trials["transformer plain"] = _shard_trial("transformer", 1, program="plain")
    else:
        trials["mlp dropout"] = _shard_trial("mlp", devices)
    return trials


# -- what each child process does --------------------------------------------------------------


def _child(job: dict) -> dict:
    from xbench.contract import Trial

    trials = {name: Trial.from_dict(raw) for name, raw in job["trials"].items()}
    out: dict = {}
    if job["framework"] == "jax":
        from xbench_backends.jax.pmap import JaxPmapBackend

        backend = JaxPmapBackend()
        backend.setup(1, "cpu")
        _verification(backend, trials["fp32"], out)
        return out

    from xbench_backends.torch.ddp import TorchDdpBackend

    backend = TorchDdpBackend()
    try:
        return _torch_child(backend, job, trials, out)
    finally:
        # The group is destroyed now, while both ranks are up, not by the backend's atexit hook:
        # once in CI a rank aborted at exit after its work was done ("terminate called without
        # an active exception", gloo's threads at interpreter shutdown).
        backend.teardown()


def _torch_child(backend, job: dict, trials: dict, out: dict) -> dict:
    from xbench.contract import Process
    from xbench.contract.work import build_work

    if job["world"] == 1:
        out["device"] = backend.setup(1, "cpu")
    else:
        process = Process(rank=job["rank"], world_size=job["world"], local_rank=job["rank"],
                          local_world_size=job["world"], node_rank=0, nnodes=1,
                          coordinator=f"127.0.0.1:{job['port']}", hosts=("127.0.0.1",))
        out["device"] = backend.setup_process(process, "cpu")
    prepared = _verification(backend, trials["fp32"], out)
    out["memory"] = backend.memory_peak_bytes(prepared)
    out["shard_runs"] = {name: _shard_run(backend, trial, job["world"]) for name, trial in trials.items()
                         if name.startswith(("transformer", "cnn", "mlp"))}
    if job["world"] == 1:
        out["gpu_refusal"] = _gpu_refusal()
        for precision in ("tf32", "bf16"):
            prepared = backend.prepare(trials[precision], build_work(trials[precision].model, trials[precision].samples,
                                                                     trials[precision].seed))
            out[f"info_{precision}"] = prepared.info
            out[f"losses_{precision}"] = backend.train(prepared, 2)
    else:
        twin = trials["compute_only"]
        prepared = backend.prepare(twin, build_work(twin.model, twin.samples, twin.seed))
        out["info_compute_only"] = prepared.info
        backend.train(prepared, COMPUTE_ONLY_STEPS)
        out["replicas_compute_only"] = backend.replica_weights(prepared)
        out["gathered"] = backend.all_gather([float(job["rank"]), 0.5])
        buffer = backend.allreduce_prepare(64, {})
        backend.allreduce_run(buffer, 3)
        out["allreduce"] = buffer.buffer.numpy().copy()
        for collective in (ALL_GATHER, REDUCE_SCATTER):  # 64 bytes in all: 8 float32 per rank's share
            prepared = backend.collective_prepare(collective, 64, {})
            backend.collective_run(prepared, 2)
            out[collective] = prepared.output.numpy().copy()
    return out


def _gpu_refusal() -> str | None:
    """What setup says when asked for a GPU on a machine without one (None where CUDA works)."""
    import torch

    from xbench.contract import DeviceUnavailable
    from xbench_backends.torch.ddp import TorchDdpBackend

    if torch.cuda.is_available():
        return None
    try:
        TorchDdpBackend().setup(1, "gpu")
    except DeviceUnavailable as err:
        return str(err)
    return "setup(1, 'gpu') did not refuse"


def _verification(backend, trial, out: dict):
    from xbench.contract.work import build_work

    prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
    out["info"] = prepared.info
    out["halves"] = backend.shard_losses(prepared, 2)  # first: the checks below see whether it changed anything
    out["loss"], out["gradients"] = backend.gradients(prepared)
    out["losses"] = backend.train(prepared, STEPS)
    out["replicas"] = backend.replica_weights(prepared)
    out["halves later"] = backend.shard_losses(prepared, 2)  # after STEPS steps: another batch
    return prepared


def _shard_run(backend, trial, world: int) -> dict:
    """A trial's halves before anything else ran, whether they left BatchNorm's running
    statistics and the random stream alone, the global loss `gradients` then gives, and the
    refusals of shard counts that do not fit."""
    import torch

    from xbench.contract.work import build_work

    prepared = backend.prepare(trial, build_work(trial.model, trial.samples, trial.seed))
    buffers, stream = [b.clone() for b in prepared.model.buffers()], torch.get_rng_state()
    halves = backend.shard_losses(prepared, 2)
    kept = all(torch.equal(a, b) for a, b in zip(buffers, prepared.model.buffers()))
    out = {"halves": halves, "kept": kept and torch.equal(stream, torch.get_rng_state()), "buffers": len(buffers),
           "loss": backend.gradients(prepared)[0], "refused": []}
    for shards in (3, 4 if world == 2 else 1):
        try:
            out["refused"].append(len(backend.shard_losses(prepared, shards)))
        except ValueError as err:
            out["refused"].append(str(err))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("torch_ddp")
    one = {"fp32": _trial(1), "tf32": _trial(1, precision="tf32"), "bf16": _trial(1, precision="bf16"),
           **_shard_trials(1)}
    two = {"fp32": _trial(2), "compute_only": _trial(2, all_reduce=False), **_shard_trials(2)}
    port = free_port_block(1)

    def raw(trials):
        return {name: trial.to_dict() for name, trial in trials.items()}

    jobs = {
        "torch1": {"framework": "torch", "world": 1, "rank": 0, "trials": raw(one)},
        **{f"torch2_rank{r}": {"framework": "torch", "world": 2, "rank": r, "port": port, "trials": raw(two),
                               "gang": "torch2"} for r in (0, 1)},
        "jax1": {"framework": "jax", "trials": raw({"fp32": _trial(1, backend="jax")})},
    }
    results = run_children(__file__, jobs, tmp_path, CHILD_TIMEOUT_S)
    for name in jobs:
        print(name, child_log(tmp_path, name))  # shown by pytest only on failure
    return results


def _errors(actual, expected) -> float:
    from xbench.stats import relative_errors

    return relative_errors(actual, expected)[2]  # normwise relative


# -- fast checks: no torch imported ----------------------------------------------------------


def test_module_imports_no_torch():
    code = ("import sys\n"
            "from xbench.contract import DeviceUnavailable, launchers_of\n"
            "from xbench_backends.torch.ddp import TorchDdpBackend\n"
            "b = TorchDdpBackend()\n"
            "assert b.probe().installed and b.name == 'torch' and launchers_of(b) == ('spmd',)\n"
            "try:\n    b.setup(2, 'cpu')\nexcept DeviceUnavailable as err:\n    assert 'spmd' in str(err)\n"
            "else:\n    raise SystemExit('setup(2) did not refuse')\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT / "tests")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_options_are_refused():
    from xbench_backends.torch.ddp import TorchDdpBackend

    TorchDdpBackend().validate_options({})
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        TorchDdpBackend().validate_options({"bucket_cap_mb": 10})


# -- real processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_all_reduce_to_the_one_process_gradient(runs):
    """(a) DDP averages over ranks: 2 ranks x 16 rows give the gradient of 1 rank x 32 rows."""
    one, ranks = runs["torch1"], (runs["torch2_rank0"], runs["torch2_rank1"])
    for rank in ranks:
        error = _errors([rank["loss"], *rank["gradients"]], [one["loss"], *one["gradients"]])
        print(f"2-process vs 1-process gradient: normwise relative error {error:.2e}")
        assert error <= 1e-5
    for a, b in zip(ranks[0]["gradients"], ranks[1]["gradients"]):
        assert np.array_equal(a, b)  # both ranks apply the same all-reduced gradient


@pytest.mark.slow
def test_two_processes_train_like_one(runs):
    """(b) After 10 steps both ranks hold identical weights, and the losses and weights match
    the 1-process run."""
    one, rank0, rank1 = runs["torch1"], runs["torch2_rank0"], runs["torch2_rank1"]
    assert rank0["losses"] == rank1["losses"]  # the global mean loss, all-reduced
    assert len(rank0["replicas"]) == 2
    for replicas in (rank0["replicas"], rank1["replicas"]):
        for a, b in zip(replicas[0], replicas[1]):
            assert np.array_equal(a, b)
    loss_error = _errors([np.asarray(rank0["losses"])], [np.asarray(one["losses"])])
    weight_error = _errors(rank0["replicas"][0], one["replicas"][0])
    print(f"2 vs 1 process after {STEPS} steps: losses {loss_error:.2e}, weights {weight_error:.2e}")
    assert loss_error <= 1e-4 and weight_error <= 1e-4
    assert len(one["losses"]) == STEPS and one["losses"][-1] < one["losses"][0]


@pytest.mark.slow
def test_compute_only_twin_skips_the_all_reduce(runs):
    """(c) Under ddp.no_sync() each rank applies its own gradient, so the replicas drift apart."""
    replicas = runs["torch2_rank0"]["replicas_compute_only"]
    drift = _errors(replicas[1], replicas[0])
    print(f"compute-only replicas after {COMPUTE_ONLY_STEPS} steps differ by {drift:.2e}")
    assert drift > 1e-4
    other = runs["torch2_rank1"]["replicas_compute_only"]  # the same gather, seen from rank 1
    assert all(np.array_equal(a, b) for r0, r1 in zip(replicas, other) for a, b in zip(r0, r1))
    assert any("no_sync" in note for note in runs["torch2_rank0"]["info_compute_only"].notes)


@pytest.mark.slow
def test_matches_jax(runs):
    """(d) The same start, gradients and Adam steps as the jax backend (the reference)."""
    from xbench.contract.work import build_work

    torch, jax = runs["torch1"], runs["jax1"]
    trial = _trial(1)
    work = build_work(trial.model, trial.samples, trial.seed)
    assert torch["info"].weights_hash == jax["info"].weights_hash == work.weights_hash
    assert torch["info"].params == jax["info"].params == work.params
    gradient_error = _errors([torch["loss"], *torch["gradients"]], [jax["loss"], *jax["gradients"]])
    training_error = _errors([np.asarray(torch["losses"]), *torch["replicas"][0]],
                             [np.asarray(jax["losses"]), *jax["replicas"][0]])
    print(f"torch vs jax: gradients {gradient_error:.2e}, {STEPS} steps {training_error:.2e}")
    assert gradient_error <= 1e-4
    assert training_error <= 1e-4  # another Adam formula (eps placement) would show here


@pytest.mark.slow
def test_precision_is_applied_and_read_back(runs):
    """(e) fp32 strict, tf32 allowed, bf16 autocast over float32 parameters."""
    one = runs["torch1"]
    fp32, tf32, bf16 = one["info"].precision, one["info_tf32"].precision, one["info_bf16"].precision
    assert fp32 == {"cuda_matmul_allow_tf32": False, "cudnn_allow_tf32": False,
                    "float32_matmul_precision": "highest", "autocast_dtype": None, "param_dtype": "float32",
                    "loss_dtype": "float32"}
    assert tf32 == {**fp32, "cuda_matmul_allow_tf32": True, "cudnn_allow_tf32": True,
                    "float32_matmul_precision": "high"}
    assert bf16 == {**fp32, "autocast_dtype": "bfloat16"}
    # float32 master weights: the same initial weights at every precision
    assert one["info_bf16"].weights_hash == one["info_tf32"].weights_hash == one["info"].weights_hash
    assert all(np.isfinite(one["losses_bf16"])) and all(np.isfinite(one["losses_tf32"]))


@pytest.mark.slow
def test_device_info_and_collectives(runs):
    one, rank0, rank1 = runs["torch1"], runs["torch2_rank0"], runs["torch2_rank1"]
    assert one["device"].platform == "cpu" and one["device"].simulated and one["device"].device_names == ("cpu:0 cpu",)
    assert one["device"].details["dist_backend"] == "gloo" and one["device"].details["world_size"] == 1
    cores = os.cpu_count() or 1
    assert one["device"].details["threads"] == cores
    assert rank1["device"].details["threads"] == max(1, cores // 2)  # ranks share the cores
    assert rank1["device"].device_names == ("cpu:1 cpu",) and rank1["device"].details["rank"] == 1
    assert rank0["gathered"] == rank1["gathered"] == [[0.0, 0.5], [1.0, 0.5]]
    assert rank0["allreduce"].shape == (16,) and np.all(rank0["allreduce"] == 2.0 ** 3)  # 3 sums of 2 ranks
    assert rank0[ALL_GATHER].shape == (16,) and np.all(rank0[ALL_GATHER] == 1.0)  # both ranks' shares
    assert rank1[REDUCE_SCATTER].shape == (8,) and np.all(rank1[REDUCE_SCATTER] == 2.0)  # its share, summed
    assert one["memory"] is None  # no peak counter on CPU
    if one["gpu_refusal"] is not None:  # a machine without CUDA
        assert one["gpu_refusal"].startswith("torch finds no CUDA device"), one["gpu_refusal"]


def _relative(a, b) -> float:
    return float(np.max(np.abs(np.subtract(a, b)) / np.abs(b)))


@pytest.mark.slow
def test_each_rank_computes_its_own_half(runs):
    """(f) shard_losses: rank r's loss of its own half (rows r*16 .. of the global batch of 32),
    gathered by rank, equals the 1-process program's loss of that half; their mean is the global
    loss; the halves differ; after 10 steps they follow the step's batch. Both ranks see all of
    them; the jax reference's halves agree too."""
    one, rank0, rank1, jax = runs["torch1"], runs["torch2_rank0"], runs["torch2_rank1"], runs["jax1"]
    print(f"halves: 1 process {one['halves']}, 2 ranks {rank0['halves']}, jax {jax['halves']}")
    assert rank0["halves"] == rank1["halves"] and rank0["halves later"] == rank1["halves later"]
    for when in ("halves", "halves later"):
        assert len(rank0[when]) == 2 and _relative(rank0[when], one[when]) <= SHARDS_AGREE, when
        assert _relative(one[when][0], one[when][1]) > 1e-4, when
        assert _relative(jax[when], one[when]) <= SHARDS_AGREE, when
    assert _relative(np.mean(rank0["halves"]), rank0["loss"]) <= 1e-6
    assert _relative(np.mean(one["halves"]), one["loss"]) <= 1e-6
    assert _relative(one["halves"], one["halves later"]) > 1e-4


@pytest.mark.slow
def test_shard_losses_of_each_family(runs):
    """(g) transformer-tiny (the data-parallel and the plain program), resnet18 (as written and
    channels-last) and an MLP with dropout: the 2-rank halves are the 1-process halves; for the
    transformer their mean is the global loss; for resnet18 it is the 2-rank loss (each rank
    normalises over its half) but not the 1-process one (statistics over all 8 images); with
    dropout, the 2-rank halves are the masks the step draws (the random stream is forked, not
    advanced), so their mean is the loss `gradients` sees. BatchNorm's running statistics and the
    random stream are left as they were; shard counts that do not fit are refused."""
    one, rank0, rank1 = (runs[name]["shard_runs"] for name in ("torch1", "torch2_rank0", "torch2_rank1"))
    for name, found in rank0.items():
        print(f"{name}: 2 ranks {found['halves']}, 1 process {one.get(name, {}).get('halves')}")
        assert found["halves"] == rank1[name]["halves"], name
        assert _relative(found["halves"][0], found["halves"][1]) > 1e-4, name
        assert _relative(np.mean(found["halves"]), found["loss"]) <= 1e-6, name
        if name in one:
            # channels-last: oneDNN's convolutions round otherwise with a rank's half of the
            # cores (8e-6 measured; a rank computing another share would be off by ~0.5)
            agree = 1e-4 if "channels-last" in name else SHARDS_AGREE
            assert _relative(found["halves"], one[name]["halves"]) <= agree, name
        assert found["refused"] == ["3 shards do not divide the global batch of 8",
                                    "a program on 2 ranks reports 2 shards (one per rank), not 4"], name
    for name, found in one.items():
        assert found["kept"] and rank0.get(name, found)["kept"] and rank1.get(name, found)["kept"], name
        assert found["refused"] == ["3 shards do not divide the global batch of 8", 1], name
        if name.startswith("transformer"):
            assert _relative(np.mean(found["halves"]), found["loss"]) <= 1e-6, name
            assert _relative(found["halves"], one["transformer"]["halves"]) <= SHARDS_AGREE, name
        else:
            assert found["buffers"] > 0 and _relative(np.mean(found["halves"]), found["loss"]) > 1e-3, name
    assert rank0["mlp dropout"]["kept"] and set(rank0) == {"transformer", "cnn", "cnn channels-last", "mlp dropout"}


if __name__ == "__main__":
    child_main(_child)
