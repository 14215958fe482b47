"""The spmd launcher: node geometry, failures of one rank, resume, and real frameworks with
one process per device giving the same training as one process driving every device."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT, order_seed_starting_with
from tests.support.processes import TAG, new_tag, tagged_processes
from xbench.errors import XbenchError
from xbench.results.records import RECORDS_FILE, read_records
from xbench.run.cluster import Launch, expand_nodelist, job_ports, resolve_launch

FAST = ("--model", "medium", "--repeats", "3", "--steps", "4", "--warmup-steps", "0", "--no-verify")
# Batch 16 runs first, then batch 32 in the same worker processes (replicate 0).
B16_FIRST = ("--order-seed", order_seed_starting_with("numpy-spmd/medium/d2/b16/spmd/r0", "numpy-spmd", [16, 32], [2],
                                                      "spmd"))


# -- node geometry ---------------------------------------------------------------------------

def test_slurm_allocation_gives_nodes_rank_and_coordinator():
    env = {"SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[07-08],login1",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_ID": "12345"}
    launch = resolve_launch("spmd", nproc_per_node=4, env=env)
    assert (launch.nnodes, launch.node_rank, launch.source) == (3, 2, "SLURM")
    assert launch.hosts == ("gpu07", "gpu08", "login1") and launch.coordinator.startswith("gpu07:")


def test_torchrun_environment_is_one_xbench_per_node():
    env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
           "LOCAL_WORLD_SIZE": "1"}
    launch = resolve_launch("spmd", env=env)
    assert (launch.nnodes, launch.node_rank, launch.source) == (2, 1, "torchrun environment")
    assert launch.coordinator == "10.0.0.1:29516"  # the ranks' ports follow MASTER_PORT's
    with pytest.raises(XbenchError, match="one xbench per node"):
        resolve_launch("spmd", env={**env, "LOCAL_WORLD_SIZE": "4"})


def test_command_line_wins_over_the_environment_and_bad_geometry_is_refused():
    env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.1"}
    assert resolve_launch("spmd", nnodes=1, env=env).nnodes == 1
    for kwargs, message in [({"nnodes": 2}, "needs --coordinator"),
                            ({"nnodes": 2, "node_rank": 2, "coordinator": "h:1234"}, "--node-rank must be in 0..1"),
                            ({"coordinator": "nohost"}, "HOST:PORT"),
                            ({"nproc_per_node": 0}, "at least 1")]:
        with pytest.raises(XbenchError, match=message):
            resolve_launch("spmd", env={}, **kwargs)
    with pytest.raises(XbenchError, match="need --launcher spmd"):
        resolve_launch("subprocess", nproc_per_node=2, env={})


def test_nodelist_expansion_and_agreed_ports():
    assert expand_nodelist("a[1-3,10],b,c[009-010]") == ("a1", "a2", "a3", "a10", "b", "c009", "c010")
    assert expand_nodelist("rack[1-2]-n[01-02]") == ("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")
    assert expand_nodelist("gpu[01-02]-ib,login1") == ("gpu01-ib", "gpu02-ib", "login1")
    launch = Launch("spmd", 1, nnodes=2, coordinator="node0:30000")
    assert job_ports(launch, 3, 2) == job_ports(launch, 3, 2) != job_ports(launch, 4, 2)
    coordinator, hosts = job_ports(Launch("spmd"), 0, 2)  # one node: free local ports
    assert coordinator.startswith("127.0.0.1:") and hosts == ("127.0.0.1",)


def test_multi_node_allocations_need_spmd_and_one_node_steps_are_one_node():
    slurm = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}
    with pytest.raises(XbenchError, match="2-node SLURM job; use --launcher spmd"):
        resolve_launch("auto", env=slurm)
    step = {**slurm, "SLURM_STEP_NODELIST": "n2", "SLURM_STEP_NUM_NODES": "1"}  # srun -N1 inside it
    launch = resolve_launch("spmd", env=step)
    assert (launch.nnodes, launch.node_rank, launch.hosts) == (1, 0, ("n2",))
    other_job = resolve_launch("spmd", env={**slurm, "SLURM_JOB_ID": "8"})
    assert abs(int(other_job.coordinator.split(":")[1]) - int(launch.coordinator.split(":")[1])) >= 1024


def test_unknown_node_addresses_are_refused_where_they_are_needed():
    from xbench.contract import Process

    launch = Launch("spmd", 1, nnodes=2, coordinator="node0:30000")
    _, hosts = job_ports(launch, 0, 2)
    assert hosts == ()  # not guessed
    with pytest.raises(ValueError, match="XBENCH_HOSTS"):
        Process(1, 2, 0, 1, 1, 2, "node0:30000", hosts).address(1)
    with pytest.raises(XbenchError, match="port up to"):
        resolve_launch("spmd", nnodes=2, node_rank=0, coordinator="h:65000", env={})


def test_launcher_a_backend_lacks_is_a_one_line_error(run_cli, fake_backends):
    code, _, err = run_cli("compare", "--backends", "numpy", "--launcher", "spmd", *FAST)
    assert code == 2 and "backend 'numpy' cannot be started by --launcher spmd (it supports: subprocess)" in err
    code, _, err = run_cli("compare", "--backends", "numpy-spmd", "--launcher", "spmd", "--nproc-per-node", "2",
                           "--devices", "4", *FAST)
    assert code == 2 and "more than --nproc-per-node 2" in err


# -- failures of one rank (numpy fake, one process per device) --------------------------------

def test_killed_and_hung_rank_cost_only_their_trial(run_cli, fake_backends, tmp_path, monkeypatch):
    """Rank 1 dies at batch 16 and hangs at batch 32; batch 48 still runs on both ranks. The
    trial timeout leaves a busy machine room for batch 48's gang (3 s timed it out under load)."""
    tag = new_tag()
    monkeypatch.setenv(TAG, tag)
    code, _, err = run_cli("compare", "--backends", "numpy-spmd", *FAST, "--devices", "2", "--batch-sizes", "16,32,48",
                           "--option", "numpy-spmd.rank=1", "--option", "numpy-spmd.crash_batch=16",
                           "--option", "numpy-spmd.hang_batch=32", "--trial-timeout", "10",
                           "--out", str(tmp_path / "run"))
    records = {r["trial"]["global_batch"]: r for r in read_records(tmp_path / "run")}
    assert code == 1
    assert records[16]["status"] == "crashed" and records[16]["reason"].startswith("rank 1: worker exit code 3")
    assert records[32]["status"] == "timeout"
    assert records[48]["status"] == "ok" and len(records[48]["timing"]["ranks"]) == 2
    assert tagged_processes(tag) == []


def test_failing_rank_fails_the_trial_at_once(run_cli, fake_backends, tmp_path):
    started = time.monotonic()
    code, _, _ = run_cli("compare", "--backends", "numpy-spmd", *FAST, "--devices", "2", "--batch-sizes", "16",
                         "--option", "numpy-spmd.rank=0", "--option", "numpy-spmd.fail_batch=16",
                         "--trial-timeout", "60", "--out", str(tmp_path / "run"))
    records = read_records(tmp_path / "run")
    assert code == 1 and len(records) == 2  # both replicates
    assert all(r["status"] == "failed" and r["reason"] == "rank 0: RuntimeError: planned failure" for r in records)
    assert time.monotonic() - started < 30  # not the trial timeout


def test_a_rank_that_dies_after_reporting_fails_the_next_trial_at_once(run_cli, fake_backends, tmp_path):
    """Rank 0 is slow on batch 16; rank 1 reports it, starts batch 32 and dies there before
    rank 0 has reported: batch 32 is 'crashed', not a timeout."""
    started = time.monotonic()
    run_cli("compare", "--backends", "numpy-spmd", *FAST, "--devices", "2", "--batch-sizes", "16,32", *B16_FIRST,
            "--option", "numpy-spmd.delay_rank=0", "--option", "numpy-spmd.rank=1",
            "--option", "numpy-spmd.crash_batch=32", "--trial-timeout", "60", "--out", str(tmp_path / "run"))
    records = {r["trial"]["global_batch"]: r for r in read_records(tmp_path / "run") if r["trial"]["replicate"] == 0}
    assert records[16]["status"] == "ok"
    assert records[32]["status"] == "crashed" and records[32]["reason"].startswith("rank 1: worker exit code 3")
    assert time.monotonic() - started < 50


def test_a_fast_ranks_failure_in_the_next_trial_is_not_charged_to_this_one(run_cli, fake_backends, tmp_path):
    run_cli("compare", "--backends", "numpy-spmd", *FAST, "--devices", "2", "--batch-sizes", "16,32", *B16_FIRST,
            "--option", "numpy-spmd.delay_rank=0", "--option", "numpy-spmd.rank=1",
            "--option", "numpy-spmd.fail_batch=32", "--out", str(tmp_path / "run"))
    records = {r["trial"]["global_batch"]: r for r in read_records(tmp_path / "run") if r["trial"]["replicate"] == 0}
    assert records[16]["status"] == "ok", records[16]["reason"]
    assert records[32]["status"] == "failed" and records[32]["reason"] == "rank 1: RuntimeError: planned failure"


def test_allreduce_stops_at_a_rank_that_fails(run_cli, fake_backends, tmp_path):
    out = tmp_path / "allreduce.json"
    code, stdout, _ = run_cli("allreduce", "--backends", "numpy-spmd", "--devices", "2", "--sizes", "4KiB", "8KiB",
                              "16KiB", "--option", "numpy-spmd.rank=1", "--option",
                              "numpy-spmd.fail_allreduce_bytes=8192", "--json", str(out))
    results = {r["nbytes"]: r for r in json.loads(out.read_text())}
    assert code == 1 and results[4096]["status"] == "ok"
    # nccl-tests' lines: the timed size is a data line, the failed ones are '#' comments
    rows = [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 1 and rows[0][:5] == ["4096", "1024", "float", "sum", "-1"] and rows[0][8] == "N/A"
    assert float(rows[0][7]) == pytest.approx(results[4096]["busbw_GBps"], abs=0.005)
    assert "# 8192 2048 float sum -1 failed: rank 1: " in " ".join(stdout.split())
    assert f"# Avg bus bandwidth    : {results[4096]['busbw_GBps']:g}" in stdout
    assert results[8192]["status"] == "failed" and results[8192]["reason"].startswith("rank 1: ")
    assert results[16384]["reason"] == "not run: rank 1: failed at 8192 bytes"


def _cli_process(args, tag, extra_env=None):
    script = (
        "import sys\n"
        "from xbench.run import registry\n"
        "from tests.conftest import FAKES\n"
        "installed = registry.list_entry_points()\n"
        "registry.list_entry_points = lambda: installed + FAKES\n"
        "from xbench.cli.main import run\n"
        "run()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), TAG: tag, **(extra_env or {})}
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_during_spmd_trial_keeps_records_and_reaps_every_rank(tmp_path):
    tag, out_dir = new_tag(), tmp_path / "run"
    process = _cli_process(["compare", "--backends", "numpy-spmd", *FAST, "--devices", "2",
                            "--batch-sizes", "16,32", *B16_FIRST, "--option", "numpy-spmd.hang_batch=32",
                            "--out", str(out_dir)], tag)
    records, deadline = out_dir / RECORDS_FILE, time.monotonic() + 60
    while not (records.exists() and records.read_text().count("\n") == 1):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.2)
    time.sleep(1.0)  # both ranks now hang in the second trial
    assert len(tagged_processes(tag)) >= 3  # xbench and two ranks
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130 and "Traceback" not in err, err
    assert [r["status"] for r in read_records(out_dir)] == ["ok"]
    assert tagged_processes(tag) == []


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_terminated_xbench_leaves_no_worker_behind(tmp_path, how):
    """SIGTERM ends a run as Ctrl-C does; after SIGKILL the kernel ends the workers."""
    tag, out_dir = new_tag(), tmp_path / "run"
    process = _cli_process(["compare", "--backends", "numpy-spmd", *FAST, "--devices", "2", "--batch-sizes", "16",
                            "--option", "numpy-spmd.hang_batch=16", "--out", str(out_dir)], tag,
                           {"TMPDIR": str(tmp_path)})  # a killed xbench leaves its workers' directory
    deadline = time.monotonic() + 60
    while len(tagged_processes(tag)) < 3:  # xbench and two hanging ranks
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.2)
    process.send_signal(how)
    _, err = process.communicate(timeout=30)
    assert process.returncode == (130 if how == signal.SIGTERM else -signal.SIGKILL), err
    deadline = time.monotonic() + 10
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == []


def test_resume_runs_only_what_is_missing_or_failed(tmp_path):
    tag, out_dir = new_tag(), tmp_path / "run"
    args = ["compare", "--backends", "numpy-spmd", *FAST, "--devices", "1,2", "--batch-sizes", "16",
            "--option", "numpy-spmd.fail_if_env=XBENCH_FAKE_FAIL", "--option", "numpy-spmd.rank=1",
            "--out", str(out_dir)]
    first = _cli_process(args, tag, {"XBENCH_FAKE_FAIL": "1"})
    first.communicate(timeout=120)
    # rank 1 exists on 2 devices only; each configuration ran in 2 replicates
    status = {r["trial_id"]: r["status"] for r in read_records(out_dir)}
    assert status == {f"numpy-spmd/medium/d{d}/b16/spmd/r{k}": "ok" if d == 1 else "failed"
                      for d in (1, 2) for k in (0, 1)}
    second = _cli_process(["compare", "--resume", str(out_dir)], tag)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "2 trial(s) already recorded, 2 to run" in err
    assert "2 new trial replicate(s) (2 recorded earlier)" in err  # the retried failures are not counted twice
    lines = [json.loads(line) for line in (out_dir / RECORDS_FILE).read_text().splitlines()]
    assert len(lines) == 6 and {r["trial_id"] for r in lines[4:]} == {
        "numpy-spmd/medium/d2/b16/spmd/r0", "numpy-spmd/medium/d2/b16/spmd/r1"}  # the 1-device ones ran once
    assert [r["status"] for r in read_records(out_dir)] == ["ok"] * 4
    assert len(json.loads((out_dir / "run.json").read_text())["resumed"]) == 1
    third = _cli_process(["compare", "--resume", str(out_dir), "--devices", "2", "--seed", "0"], tag)
    _, err = third.communicate(timeout=60)
    assert third.returncode == 2 and "--resume reruns the run's own spec; drop --devices, --seed" in err


# -- real frameworks -------------------------------------------------------------------------

def _references(spec_args, backend, launcher, tmp_path):
    from xbench.experiment import load_spec
    from xbench.run.cluster import Launch
    from xbench.run.readiness import ready_backends
    from xbench.run.verification import verify
    from xbench.wire import load_reference

    spec = load_spec(None, {"backends": [backend], "models": ["medium"], "devices": [2], **spec_args})
    launch = Launch(launcher)
    work = tmp_path / launcher
    work.mkdir()
    ready = ready_backends(spec, work, launch=launch)
    result = verify(spec, ready.entries, [2], work, {}, launch=launch, launchers=ready.launchers)
    assert not result.failed and not result.problems, (result.problems, result.checks)
    return {path.name.split("_d")[1][0]: load_reference(path) for path in work.glob("*.npz")}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "tf"])
def test_one_process_per_device_trains_like_one_process_for_all(backend, tmp_path):
    """2 processes x 1 device against 1 process x 2 devices: the same losses and weights from
    the same start (verify's reference steps, run both ways)."""
    from xbench.results.checks import TOLERANCES
    from xbench.stats import relative_errors

    single = _references({}, backend, "subprocess", tmp_path)
    spmd = _references({}, backend, "spmd", tmp_path)
    for devices in ("1", "2"):
        a, b = spmd[devices], single[devices]
        assert relative_errors([a.loss, *a.gradients], [b.loss, *b.gradients])[2] <= TOLERANCES["gradients"]
        assert relative_errors([np.asarray(a.losses), *a.replicas[0]],
                      [np.asarray(b.losses), *b.replicas[0]])[2] <= TOLERANCES["training"]
    assert spmd["2"].replica_count == 2  # gathered from both processes, compared in the worker


@pytest.mark.slow
def test_two_nodes_on_localhost(tmp_path):
    """Two xbench processes, node ranks 0 and 1, one rank each, meet at one coordinator."""
    from xbench.run.cluster import free_port_block

    tag, port = new_tag(), free_port_block(40)
    common = ["compare", "--backends", "jax", "--launcher", "spmd", "--nproc-per-node", "1", "--nnodes", "2",
              "--coordinator", f"127.0.0.1:{port}", *FAST[:-1], "--batch-sizes", "16"]
    nodes = [_cli_process([*common, "--node-rank", str(rank), "--out", str(tmp_path / f"node{rank}")], tag)
             for rank in (0, 1)]
    try:
        outputs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err
    for rank in (0, 1):
        records = read_records(tmp_path / f"node{rank}")
        assert sorted(r["trial"]["replicate"] for r in records) == [0, 1]  # the nodes agreed on the plan
        for record in records:
            assert record["status"] == "ok" and record["trial"]["devices"] == 2
            assert [r["rank"] for r in record["timing"]["ranks"]] == [0, 1]
    assert tagged_processes(tag) == []


@pytest.mark.slow
def test_all_gather_and_reduce_scatter_on_2_and_4_simulated_devices(run_cli, tmp_path):
    """jax (one process) and torch (one process per device) time all three collectives; the
    all-gather's and reduce-scatter's sizes fall to whole elements per device. torch's ranks
    other than 0 may finish and exit first; that is not a failure (seen on 4 H200s)."""
    out = tmp_path / "collectives.json"
    code, stdout, err = run_cli("allreduce", "--backends", "jax", "torch", "--devices", "2,4", "--sizes", "4100",
                                "--collectives", "allreduce", "allgather", "reducescatter", "--json", str(out))
    assert code == 0, err
    found = {(r["backend"], r["devices"], r["collective"]): (r["nbytes"], r["status"])
             for r in json.loads(out.read_text())}
    for backend in ("jax", "torch"):
        for n, whole in ((2, 4096), (4, 4096)):
            assert found[(backend, n, "allreduce")] == (4100, "ok")
            assert found[(backend, n, "allgather")] == found[(backend, n, "reducescatter")] == (whole, "ok")
    assert stdout.count("# all-gather: all_gather_perf's columns") == 4
    assert "        4096           256     float    none      -1" in stdout  # 4 devices: 256 elements each


def test_workers_do_not_inherit_the_callers_torchrun_variables(monkeypatch):
    """Under torchrun, TORCHELASTIC_USE_AGENT_STORE would make torch's rank 0 wait for a store
    that nobody hosts; RANK etc. are set per worker by xbench's own launcher."""
    from xbench.run.worker_process import worker_environment

    for name, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "RANK": "1", "MASTER_PORT": "29500",
                        "LOCAL_WORLD_SIZE": "1", "CUDA_VISIBLE_DEVICES": "0,1"}.items():
        monkeypatch.setenv(name, value)
    env = worker_environment()
    assert not {"TORCHELASTIC_USE_AGENT_STORE", "RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE"} & set(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["XBENCH_PARENT_PID"] == str(os.getpid())


def test_a_slurm_layout_spmd_cannot_use_does_not_stop_a_one_process_run():
    env = {"SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "8"}
    assert resolve_launch("auto", env=env).launcher == "auto"
    with pytest.raises(XbenchError, match="one xbench per node"):
        resolve_launch("spmd", env=env)


def test_allreduce_ranks_stop_their_windows_together():
    """A rank that ended its windows on its own (steady enough, or out of budget) while another
    went on would leave that one waiting in an all-reduce until gloo's 300 s timeout."""
    from tests.support.fakes import SpmdNumpyBackend
    from xbench.worker.main import Ranks, run_allreduce

    class AnotherRankStops(Ranks):
        """Rank 0's view of a job whose other rank wants to stop after its second window."""

        def __init__(self) -> None:
            super().__init__(SpmdNumpyBackend(), None)
            self.stop_calls = 0

        def any_stop(self, stop: bool) -> bool:
            self.stop_calls += 1  # the first call only starts the windows together
            return stop or self.stop_calls > 2

    events: list = []
    status = run_allreduce(SpmdNumpyBackend(), 4096, {}, events.append, AnotherRankStops())
    assert status == "ok"
    assert len(events[0].timing["window_s"]) == 2 and events[0].timing["stopped"] == "another rank"
