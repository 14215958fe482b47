from __future__ import annotations

import os
import shutil
import tempfile
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

# One thread per operation in every framework the tests start: the suite runs two computing
# workers and their children on two cores, where each framework's own pool of a thread per core
# only contends with the others'. The pools that run operations side by side keep theirs
# (TensorFlow's inter-op pool: MirroredStrategy's collectives need it), and torch's spmd ranks
# set their own share of the cores. Measured on the 2-core machine (2026-12-06): the tf families
# module beside two jax modules, 170 s of wall and 331 s of CPU against 179 s and 349 s with the
# frameworks' defaults; `make test` on a fresh clone, 1,418 s and 1,446 s against 1,682 s, every
# module's share smaller (the numpy fakes' process tests too: OpenBLAS). A user's own setting wins.
ONE_THREAD_PER_OP = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                     "TF_NUM_INTRAOP_THREADS": "1"}
XLA_ONE_THREAD_PER_OP = "--xla_cpu_multi_thread_eigen"


def one_thread_per_op() -> None:
    """ONE_THREAD_PER_OP and XLA's own flag for it, in this process's environment (inherited by
    pytest-xdist's workers and every process a test starts), each unless already set. (The jax
    backend's `default_xla_flag` does the same for XLA_FLAGS, but importing it loads numpy.)"""
    for name, value in ONE_THREAD_PER_OP.items():
        os.environ.setdefault(name, value)
    flags = os.environ.get("XLA_FLAGS", "")
    if not any(token.split("=", 1)[0] == XLA_ONE_THREAD_PER_OP for token in flags.split()):
        os.environ["XLA_FLAGS"] = f"{flags} {XLA_ONE_THREAD_PER_OP}=false".strip()


one_thread_per_op()  # before numpy loads (the xbench import): OpenBLAS reads its count once

from xbench.run import registry  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# jax's persistent compilation cache, for every program however quick to compile (jax's defaults
# keep only programs of a second or more)
JAX_CACHE_SETTINGS = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
_jax_cache_made: list[str] = []


def pytest_configure(config):
    """One jax compilation cache for the whole test run, in a directory of its own (removed at
    the end; a user's JAX_COMPILATION_CACHE_DIR wins): the test processes, pytest-xdist's
    workers (started after this) and every worker process a test starts compile the same small
    programs over and over, and reuse them instead. Measured on the 2-core machine:
    tests/backends/jax/test_families_jax.py 284 s against 382 s, the shard-loss and probe
    tests 53 s against 62 s. Nothing tested depends on it: no test times a compilation."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    path = tempfile.mkdtemp(prefix="xbench-tests-jax-cache-")
    _jax_cache_made.append(path)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.update(JAX_CACHE_SETTINGS)


def pytest_addoption(parser):
    parser.addoption("--waiting-lane", action="store_true",
                     help="with pytest-xdist: the last worker runs only the tests in WAITING (make test)")


# Tests that mostly wait on a bound (a hung or stopped worker, a trial or start-up timeout) while
# the cores idle: by module or by test, measured with each test's CPU time against its wall time
# (2-core machine, 2026-12-05: about 255 s of wall, 45 s of CPU). With --waiting-lane they run in
# a pytest-xdist worker of their own, beside the two that compute. A test that computes for most
# of its time does not belong here: it would take a core from the computing workers.
WAITING = (
    "process/test_bounded_waits.py",
    "process/test_fork_server.py::test_a_forked_worker_that_crashes_or_hangs_costs_only_its_trial",
    "process/test_compare_cli.py::test_a_hanging_trial_times_out_and_the_rest_run",
    "process/test_launcher_spmd.py::test_killed_and_hung_rank_cost_only_their_trial",
    "process/test_launcher_spmd.py::test_a_rank_that_dies_after_reporting_fails_the_next_trial_at_once",
    "process/test_launcher_spmd.py::test_a_fast_ranks_failure_in_the_next_trial_is_not_charged_to_this_one",
    "process/test_faults.py::test_a_killed_run_resumes_and_leaves_no_stray_file",
    "process/test_faults.py::test_a_multi_node_run_whose_peers_never_come_stops_within_the_startup_timeout",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if not config.getoption("waiting_lane"):
        return None
    from tests.support.waiting_lane import WaitingLaneScheduling

    return WaitingLaneScheduling(config, log, waiting=WAITING)


def pytest_unconfigure(config):
    for path in _jax_cache_made:
        shutil.rmtree(path, ignore_errors=True)


def entry_point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=registry.GROUP)


FAKES = [
    entry_point("numpy", "tests.support.fakes:NumpyBackend"),
    entry_point("numpy-spmd", "tests.support.fakes:SpmdNumpyBackend"),
    entry_point("numpy-mlp", "tests.support.fakes:NumpyMlpBackend"),
    entry_point("numpy-peers", "tests.support.fakes:PeersBackend"),
    entry_point("missing", "tests.support.fakes:MissingFrameworkBackend"),
    entry_point("numpy-unforkable", "tests.support.fakes:UnforkableBackend"),
    entry_point("numpy-stopping-preload", "tests.support.fakes:StoppingPreloadBackend"),
    entry_point("numpy-counted", "tests.support.fakes:CountedPreloadBackend"),
    entry_point("numpy-spmd-counted", "tests.support.fakes:CountedSpmdBackend"),
    entry_point("numpy-hanging-preload", "tests.support.fakes:HangingPreloadBackend"),
    entry_point("jax-noreduce", "tests.support.broken_backends:NoAllReduceJax"),
    entry_point("jax-sum", "tests.support.broken_backends:SummedJax"),
    entry_point("jax-eps", "tests.support.broken_backends:KerasEpsilonJax"),
]


@pytest.fixture(autouse=True, scope="session")
def planned_replicates_only():
    """Runs in tests time their planned replicates only (no adaptive rounds, which would run
    noisy fakes to the default time budget); the tests of adaptive replicates pass
    --time-budget. Workers and subprocesses inherit it."""
    import os

    from xbench.experiment.spec import TIME_BUDGET_VARIABLE

    saved = os.environ.get(TIME_BUDGET_VARIABLE)
    os.environ[TIME_BUDGET_VARIABLE] = "0"
    yield
    if saved is None:
        os.environ.pop(TIME_BUDGET_VARIABLE, None)
    else:
        os.environ[TIME_BUDGET_VARIABLE] = saved


@pytest.fixture(autouse=True, scope="session")
def piped_width():
    """The CLI writes as when piped (`xbench.cli.consoles`: PIPED_WIDTH columns), whatever
    $COLUMNS the shell exported or a pytest-xdist worker inherited (80 there), which would wrap
    the tables tests read; a test that wants a width sets it."""
    import os

    saved = os.environ.pop("COLUMNS", None)
    yield
    if saved is not None:
        os.environ["COLUMNS"] = saved


def use_fake_backends(monkeypatch) -> None:
    """The installed backends plus test fakes, until `monkeypatch` undoes it (then call
    `registry.refresh()`); workers can import `tests.support.fakes`."""
    installed = registry.list_entry_points()
    monkeypatch.setattr(registry, "list_entry_points", lambda: installed + FAKES)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    registry.refresh()


@pytest.fixture
def fake_backends(monkeypatch):
    """The installed backends plus test fakes; workers can import `tests.support.fakes`."""
    use_fake_backends(monkeypatch)
    yield
    registry.refresh()


@pytest.fixture
def run_cli(capsys):
    """Run `xbench ARGS...` in-process; returns (exit code, stdout, stderr)."""
    from xbench.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


# The order `make test`'s two computing workers take modules in (`--dist loadfile
# --no-loadscope-reorder`): about the longest first, so that none starts near the end and leaves
# the other worker idle (a module that makes a shared fixture before the modules that read it).
# Worker-seconds from a full run before the waiting lane (2-core machine, 2026-12-05; (w): mostly
# waits, now largely in the lane, WAITING). Modules not listed follow in collection order (quick
# ones, tests/unit last); a module that grows past half a minute belongs here.
LONGEST_FIRST = (
    "backends/jax/test_families_jax.py",  # 268
    "process/test_bounded_waits.py",  # 120 (w)
    "backends/tf/test_families_tf.py",  # 127
    "process/test_launcher_spmd.py",  # 150, a third (w)
    "process/test_backends_real.py",  # 98, makes real_run (test_report reads it later)
    "process/test_breakdown.py",  # 80
    "process/test_fork_server.py",  # 55 (w)
    "process/test_variants.py",  # 73
    "process/test_fsdp_remat_verify.py",  # 74, makes transformer_variants_verified
    "process/test_scaling.py",  # 87
    "backends/torch/test_torch_tuned.py",  # 72
    "process/test_readme_commands.py",  # 72
    "process/test_verify.py",  # 63
    "backends/torch/test_families_torch.py",  # 58
    "backends/jax/test_shard_losses_jax.py",  # 55
    "process/test_docs_commands.py",  # 52
    "process/test_benchmark_fsdp_loops.py",  # 51
    "backends/jax/test_jax_shardmap.py",  # 49
    "process/test_compare_cli.py",  # 40, half (w)
    "backends/tf/test_remat_tf.py",  # 45
    "process/test_faults.py",  # 40
    "backends/torch/test_fsdp_torch.py",  # 38
    "process/test_estimate_wall_time.py",  # 36
    "process/test_step_model.py",  # 31
    "process/test_report.py",  # 30
    "process/test_plugin_example.py",  # 30
    "backends/jax/test_fsdp_jax.py",  # 29
)


def pytest_collection_modifyitems(items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}

    def module_rank(item) -> int:
        where = item.path.relative_to(ROOT / "tests").as_posix() if item.path.is_relative_to(ROOT / "tests") else ""
        return rank.get(where, len(rank))

    items.sort(key=module_rank)  # stable: each module's own order kept


TINY = ("--batch-sizes", "16", "--repeats", "3", "--steps", "2", "--warmup-steps", "0")
# A short unverified protocol for runs of the numpy fakes: windows of 10 ms, not the default 100 ms
# (about 0.3 s of CPU less per replicate, in ~280 worker processes).
FAST = ("--model", "medium", "--repeats", "3", "--steps", "4", "--warmup-steps", "0", "--min-window", "0.01",
        "--no-verify")


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    """One small real comparison of tf and jax on 1 and 2 simulated CPU devices, both seed
    models, verification included; (exit code, run directory), made once for every module and
    worker that asks. Tests must not modify it. Its workers' temporary files go under the run
    directory's sibling "tmp" (in the directory xbench makes there for them, removed when the
    process that made the run exits): the run directory's sibling "left.txt" lists what they left
    there, taken when the run ended."""
    from tests.support.shared import once_per_session, shared_directory

    def make(directory: Path) -> int:
        from xbench.cli.main import main

        (directory / "tmp").mkdir()
        before = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(directory / "tmp")  # read by the workers, started afresh
        try:
            code = main(["compare", "--backends", "tf", "jax", "--model", "medium", "large",
                         "--devices", "1,2", *TINY, "--out", str(directory / "run")])
            left = sorted(path.name for path in (directory / "tmp").rglob("*") if path.is_file())
            (directory / "left.txt").write_text("".join(f"{name}\n" for name in left))
            return code
        finally:
            if before is None:
                os.environ.pop("TMPDIR")
            else:
                os.environ["TMPDIR"] = before

    code = once_per_session(tmp_path_factory, "real_run", make)
    return code, shared_directory(tmp_path_factory, "real_run") / "run"


def order_seed_starting_with(trial_id: str, backend: str, batch_sizes: list[int], devices: list[int],
                             launcher: str = "subprocess") -> str:
    """An --order-seed whose shuffled plan (medium model, 2 replicates) starts with `trial_id`,
    for tests whose trials must run in a known order (a hang after a finished trial, say)."""
    from xbench.experiment import load_spec
    from xbench.run.plan import plan_trials

    overrides = {"models": ["medium"], "batch_sizes": batch_sizes, "devices": devices, "replicates": 2}
    for seed in range(1000):
        spec = load_spec(None, {**overrides, "order_seed": seed})
        if plan_trials(spec, [backend], launchers={backend: launcher})[0].id == trial_id:
            return str(seed)
    raise AssertionError(f"no order seed puts {trial_id} first")
