"""Bad input: spec values of the wrong kind or size, and malformed SLURM, torchrun
or XBENCH_HOSTS variables. Each is one line naming what to change, exit status 2, no
traceback, and nothing written."""

import pytest

from xbench.errors import SpecError, XbenchError
from xbench.experiment import MAX_ELEMENTS, MAX_NAME_LENGTH, MAX_SEED, build_spec, load_spec
from xbench.run.cluster import resolve_launch

FAST = ("--repeats", "3", "--steps", "2", "--warmup-steps", "0", "--no-verify")
MEDIUM = '[[models]]\npreset = "medium"\nbatch_sizes = [16]\n'


def assert_refused(code: int, err: str, out_dir, *needles: str) -> None:
    """Exit 2 with one `error:` line holding every needle, and no run directory."""
    line = " ".join(err.split())
    assert code == 2, err
    assert err.strip().count("\n") == 0 and line.startswith("error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in line, err
    assert not out_dir.exists()


# -- 4. spec values of the wrong kind or size ----------------------------------------------------

@pytest.mark.parametrize("toml, needles", [
    ('[[models]]\npreset = ["medium"]\n', ("'preset'", "must be a string", "medium, large")),
    ('[[models]]\npreset = {a = 1}\n', ("'preset'", "must be a string")),
    ('[[models]]\npreset = "medium"\nname = {a = 1}\n', ("model name {'a': 1}", "1 to 64 letters")),
    ('[[models]]\npreset = "medium"\nname = ["m"]\n', ("model name ['m']",)),
    ('[[models]]\npreset = "medium"\nname = 7\n', ("model name 7",)),
    (f'[[models]]\npreset = "medium"\nname = "{"m" * 300}"\n', ("(300 characters)", "file names")),
    ('[[models]]\npreset = "medium"\nname = "a/b"\n', ("model name 'a/b'", "'_', '.' or '-'")),
    ('[[models]]\npreset = "medium"\nname = ".hidden"\n', ("model name '.hidden'", "starting with a letter")),
    ('[[models]]\npreset = "medium"\nname = ""\n', ("model name ''",)),
    ('[[models]]\nname = "m"\nwidths = "8"\nbatch_sizes = [16]\n', ("'widths'", "positive integers")),
    ('[[models]]\nname = "m"\nwidths = []\nbatch_sizes = [16]\n', ("'widths'", "non-empty")),
    ('[[models]]\nname = "m"\nwidths = [8, true]\nbatch_sizes = [16]\n', ("'widths'", "got [8, True]")),
    ('[[models]]\nname = "m"\nwidths = [8.5]\nbatch_sizes = [16]\n', ("'widths'",)),
    ('[[models]]\nname = "m"\nwidths = [65536, 65536]\nbatch_sizes = [16]\n',
     ("parameter dense1.kernel [65536, 65536]", "int32 indexing", "make the model smaller")),
    ('[[models]]\npreset = "medium"\ndropout = "0.1"\n', ("'dropout'", "[0, 1)")),
    ('[[models]]\npreset = "medium"\ndropout = 1.0\n', ("'dropout'", "got 1.0")),
    ('[[models]]\npreset = "medium"\nbatch_sizes = []\n', ("'batch_sizes'",)),
    ('[[models]]\npreset = "medium"\nbatch_sizes = [0]\n', ("'batch_sizes'", "positive integers")),
    ('[[models]]\npreset = "medium"\nbatch_sizes = [true]\n', ("'batch_sizes'",)),
    ('[[models]]\npreset = "medium"\nbatch_sizes = 16\n', ("'batch_sizes'",)),
    ('[[models]]\npreset = "medium"\nbatch_sizes = [16]\ninputs = true\n', ("'inputs'", "got True")),
    ('[[models]]\npreset = "medium"\nbatch_sizes = [16]\ninputs = 2\n', ("'inputs'", ">= 3")),
    ('[[models]]\npreset = "medium"\nbatch_sizes = [16]\noutputs = 0\n', ("'outputs'", "1..2147483647")),
    ('[[models]]\npreset = "medium"\nbatch_sizes = [16]\noutputs = 1.5\n', ("'outputs'",)),
    ("seed = 99999999999999999999\n" + MEDIUM, ("'seed'", "99999999999999999999", "0..2147483647")),
    ("seed = -1\n" + MEDIUM, ("'seed'", "got -1", "0..2147483647")),
    ("seed = 1.5\n" + MEDIUM, ("'seed'", "got 1.5")),
    ("devices = [1, 100000]\n" + MEDIUM, ("'devices'", "<= 65536")),
    ("protocol = 5\n" + MEDIUM, ("'protocol' must be a table",)),
    (MEDIUM + "[data]\nsamples = 10000000000\n", ("'samples'", "1..2147483647")),
    (MEDIUM + "[data]\nsamples = 50000000\n", ("its data", "int32 indexing", "lower [data] samples")),
    (MEDIUM + "[protocol]\nsteps_per_call = 100000000\n", ("'steps_per_call'", "1..1000000")),
    (MEDIUM + "[protocol]\ntrial_timeout_s = 1e300\n", ("'trial_timeout_s'", "at most 604800")),
    (MEDIUM + "[protocol]\ntarget_ci = 5\n", ("'target_ci'", "0..1", "0.05")),
])
def test_a_bad_spec_value_is_one_line_exit_2_and_writes_nothing(fake_backends, run_cli, tmp_path, toml, needles):
    config = tmp_path / "bad.toml"
    config.write_text("devices = [1]\n" + toml if not toml.startswith("devices") else toml)
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), *FAST, "--out", str(out_dir))
    assert_refused(code, err, out_dir, *needles)


@pytest.mark.parametrize("args, needles", [
    (("--seed", "99999999999999999999"), ("'seed'", "must be an integer <= 2147483647", "every framework")),
    (("--seed", str(2**40)), ("'seed'", str(2**40), "0..2147483647")),
    (("--seed", "-1"), ("'seed'", "got -1")),
    (("--batch-sizes", str(2**32)), ("'batch_sizes'", str(2**32))),
    (("--batch-sizes", "16", "--samples", str(10**10)), ("'samples'", "1..2147483647")),
    (("--batch-sizes", "16777216", "--samples", "16777216"), ("activations", "int32 indexing", "batch_sizes")),
    (("--repeats", "100000"), ("'repeats'", "2..10000")),
    (("--trial-timeout", "1e300"), ("'trial_timeout_s'",)),
    (("--target-ci", "5"), ("'target_ci'",)),
])
def test_a_bad_override_is_one_line_exit_2_and_writes_nothing(fake_backends, run_cli, tmp_path, args, needles):
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", "--model", "medium", "--devices", "1", *FAST, *args,
                           "--out", str(out_dir))
    assert_refused(code, err, out_dir, *needles)


def test_selecting_models_checks_the_tables_it_picks_from(fake_backends, run_cli, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('devices = [1]\n[[models]]\npreset = "medium"\nname = {a = 1}\nbatch_sizes = [16]\n')
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--model", "medium", *FAST,
                           "--out", str(out_dir))
    assert_refused(code, err, out_dir, "model name {'a': 1}")


def test_options_that_are_no_table_are_refused_when_merged(fake_backends, run_cli, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("options = [1]\ndevices = [1]\n" + MEDIUM)
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--option", "numpy.x=1",
                           *FAST, "--out", str(out_dir))
    assert_refused(code, err, out_dir, "'options' must be a table")


@pytest.mark.parametrize("overrides", [{"models": [["medium"]]}, {"models": [{"a": 1}]}, {"models": "medium"},
                                       {"batch_sizes": 16}])
def test_library_overrides_of_the_wrong_kind_are_spec_errors(overrides):
    with pytest.raises(SpecError) as info:
        load_spec(None, overrides)
    assert "\n" not in str(info.value)


def test_the_limits_themselves_are_accepted():
    name = "M" + "-_.9" * ((MAX_NAME_LENGTH - 1) // 4) + "x" * ((MAX_NAME_LENGTH - 1) % 4)
    assert len(name) == MAX_NAME_LENGTH
    spec = build_spec({"seed": MAX_SEED, "devices": [1],
                       "models": [{"name": name, "widths": [8], "batch_sizes": [16], "inputs": 3, "outputs": 1}]})
    assert spec.seed == MAX_SEED and spec.models[0].name == name
    with pytest.raises(SpecError, match="model name"):
        build_spec({"models": [{"name": name + "x", "widths": [8], "batch_sizes": [16]}]})
    with pytest.raises(SpecError, match="'seed'"):
        build_spec({"seed": MAX_SEED + 1})
    # The largest data array the int32 bound allows, and one row more.
    rows = MAX_ELEMENTS // 50
    build_spec({"devices": [1], "data": {"samples": rows}})
    with pytest.raises(SpecError, match="int32 indexing"):
        build_spec({"devices": [1], "data": {"samples": rows + 1}})


# -- 5a. environment values validated where they are read -----------------------------------------

SLURM = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}
TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
            "LOCAL_WORLD_SIZE": "1"}
LAUNCH_VARIABLES = sorted({*SLURM, *TORCHRUN, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_STEP_NUM_NODES",
                           "SLURM_NTASKS_PER_NODE", "GROUP_RANK", "XBENCH_HOSTS"})

BAD_ENVIRONMENTS = [
    ({**SLURM, "SLURM_NNODES": "two"}, "SLURM_NNODES='two'", "integer >= 1"),
    ({**SLURM, "SLURM_NNODES": "0"}, "SLURM_NNODES='0'", "integer >= 1"),
    ({**SLURM, "SLURM_NODEID": "x"}, "SLURM_NODEID='x'", "integer >= 0"),
    ({**SLURM, "SLURM_NODEID": "-1"}, "SLURM_NODEID='-1'", "integer >= 0"),
    ({**SLURM, "SLURM_NODEID": "2"}, "SLURM_NODEID='2'", "node rank in 0..1"),
    ({**SLURM, "SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc'", "integer >= 0"),
    ({**SLURM, "SLURM_STEP_NUM_NODES": ""}, "SLURM_STEP_NUM_NODES=''", "integer >= 1"),
    ({**SLURM, "SLURM_STEP_NUM_NODES": "²"}, "SLURM_STEP_NUM_NODES='²'", "integer >= 1"),
    ({**SLURM, "SLURM_NODELIST": "n[1-"}, "SLURM_NODELIST='n[1-'", "a bracket is not closed"),
    ({**SLURM, "SLURM_NODELIST": "n]1-2["}, "SLURM_NODELIST='n]1-2['", "not a SLURM host list"),
    ({**SLURM, "SLURM_NODELIST": "n[[1-2]]"}, "SLURM_NODELIST='n[[1-2]]'", "not a SLURM host list"),
    ({**SLURM, "SLURM_NODELIST": "n[a-b]"}, "SLURM_NODELIST='n[a-b]'", "not a number or a range"),
    ({**SLURM, "SLURM_NODELIST": "n[]"}, "SLURM_NODELIST='n[]'", "not a number or a range"),
    ({**SLURM, "SLURM_NODELIST": "n[2-1]"}, "SLURM_NODELIST='n[2-1]'", "runs downwards"),
    ({**SLURM, "SLURM_NODELIST": "n[1-999999999]"}, "SLURM_NODELIST='n[1-999999999]'", "more than 65536 hosts"),
    ({**SLURM, "SLURM_NODELIST": "a[1-1000]b[1-1000]"}, "SLURM_NODELIST=", "more than 65536 hosts"),
    ({**SLURM, "SLURM_NODELIST": ",,"}, "SLURM_NODELIST=',,'", "names no host"),
    ({**SLURM, "SLURM_NODELIST": "n1"}, "SLURM_NODELIST='n1'", "names 1 host(s), but SLURM_NNODES says 2 nodes"),
    ({**SLURM, "SLURM_STEP_NODELIST": "n[1-x]"}, "SLURM_STEP_NODELIST='n[1-x]'", "not a SLURM host list"),
    ({**TORCHRUN, "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'", "integer >= 1"),
    ({**TORCHRUN, "WORLD_SIZE": "9" * 5000}, "WORLD_SIZE='9999", "(5,000 characters)"),
    ({**TORCHRUN, "RANK": "-1"}, "RANK='-1'", "integer >= 0"),
    ({**TORCHRUN, "RANK": "2"}, "RANK='2'", "node rank in 0..1 (WORLD_SIZE says 2 nodes)"),
    ({**TORCHRUN, "GROUP_RANK": "x"}, "GROUP_RANK='x'", "integer >= 0"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "z"}, "LOCAL_WORLD_SIZE='z'", "integer >= 1"),
    ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT='http'", "integer 1..64479"),
    ({**TORCHRUN, "MASTER_PORT": "65000"}, "MASTER_PORT='65000'", "integer 1..64479"),
    ({**TORCHRUN, "MASTER_ADDR": " "}, "MASTER_ADDR=' '", "node 0's host name"),
    ({"XBENCH_HOSTS": "a,,b"}, "XBENCH_HOSTS='a,,b'", "none empty"),
    ({"XBENCH_HOSTS": "a,b,"}, "XBENCH_HOSTS='a,b,'", "none empty"),
    ({**TORCHRUN, "XBENCH_HOSTS": " , "}, "XBENCH_HOSTS=' , '", "none empty"),
]


@pytest.mark.parametrize("launcher", ["spmd", "auto", "subprocess"])
@pytest.mark.parametrize("env, variable, expected", BAD_ENVIRONMENTS)
def test_a_malformed_launch_variable_is_named(env, variable, expected, launcher):
    """Under every launcher: a value that cannot be read might hide a multi-node job."""
    with pytest.raises(XbenchError) as info:
        resolve_launch(launcher, env=env)
    message = str(info.value)
    assert "\n" not in message and f"environment variable {variable}" in message and expected in message
    assert "correct or unset it" in message


def test_well_formed_variables_still_give_the_layout():
    launch = resolve_launch("spmd", env={**SLURM, "SLURM_NODELIST": " n[1-2] ", "XBENCH_HOSTS": "h1, h2"})
    assert (launch.nnodes, launch.node_rank, launch.hosts) == (2, 1, ("h1", "h2"))
    launch = resolve_launch("spmd", env={**TORCHRUN, "GROUP_RANK": "0", "RANK": "7"})
    assert launch.node_rank == 0 and launch.coordinator == "10.0.0.1:29516"  # GROUP_RANK wins over RANK


@pytest.mark.parametrize("variables, variable", [
    ({**SLURM, "SLURM_NNODES": "two"}, "SLURM_NNODES='two'"),
    ({**SLURM, "SLURM_NODELIST": "gpu[01-"}, "SLURM_NODELIST='gpu[01-'"),
    ({**TORCHRUN, "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'"),
    ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"XBENCH_HOSTS": "a,,b"}, "XBENCH_HOSTS='a,,b'"),
])
@pytest.mark.parametrize("launcher", [(), ("--launcher", "spmd")])
def test_a_malformed_launch_variable_stops_compare_with_exit_2(fake_backends, run_cli, monkeypatch, tmp_path,
                                                               variables, variable, launcher):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", *launcher, "--model", "medium", "--devices", "1",
                           *FAST, "--out", str(out_dir))
    assert_refused(code, err, out_dir, f"environment variable {variable}", "correct or unset it")


@pytest.mark.parametrize("value", ["16GB", "-4", "0", "nan"])
@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_a_bad_device_memory_variable_stops_the_run_before_any_worker(fake_backends, run_cli, monkeypatch, tmp_path,
                                                                      value, command):
    """Read with the other input: a unit test starts no process, so reaching a worker fails here."""
    from xbench.run.memory_check import MEMORY_VARIABLE

    monkeypatch.setenv(MEMORY_VARIABLE, value)
    out_dir = tmp_path / "run"
    args = ("--model", "medium", "--devices", "1", *FAST) if command == "compare" else ("--devices", "1")
    code, _, err = run_cli(command, "--backends", "numpy", *args, "--out", str(out_dir))
    assert_refused(code, err, out_dir, f"{MEMORY_VARIABLE}={value!r} is not a positive number of GiB")


def test_a_coordinator_port_of_other_digits_is_refused(fake_backends, run_cli, tmp_path):
    out_dir = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", "--launcher", "spmd", "--nnodes", "2", "--node-rank", "0",
                           "--coordinator", "node0:²", *FAST, "--out", str(out_dir))
    assert_refused(code, err, out_dir, "--coordinator must be HOST:PORT")
