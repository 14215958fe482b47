"""`recommend` answers from one stored fit, the one of this machine's devices
(else the closest, saying so plainly), names the fits it left out, refuses a question outside
the fit in one line that names the range and the sweep, and runs the README's example."""

import json
import shutil

import pytest

from tests.conftest import ROOT
from xbench.results.fitting import read_fits
from xbench.results.recommend import (
    OTHER_MACHINE,
    SAME_DEVICES,
    SAME_PLATFORM,
    Candidate,
    Question,
    choose,
    closeness,
    sweep_command,
)

CPU_SWEEP = ROOT / "results" / "2026-11-25-cpu-step-model"
H200_SWEEP = ROOT / "results" / "2026-11-25-h200x1-step-model"
CPU = "simulated CPU devices (AMD EPYC)"
README_EXAMPLE = ("recommend", "--params", "5e5", "--global-batch", "64")


def stored(tmp_path, name: str, machine: str, created: str, source=CPU_SWEEP / "A" / "fit.json"):
    """A copy of a committed fit.json, said to be measured on `machine` at `created`."""
    raw = json.loads(source.read_text())
    raw.update(machine=machine, created=created)
    path = tmp_path / "fits" / name / "fit.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(raw))
    return path


@pytest.fixture
def here(monkeypatch):
    """This machine, as recommend sees it."""
    def be(machine: str) -> None:
        monkeypatch.setattr("xbench.cli.recommend_cmd.this_machine", lambda: machine)
    return be


def words(text: str) -> str:
    return " ".join(text.split())


def test_closeness_of_machines():
    assert closeness("1 x NVIDIA H200", "8 x NVIDIA H200") == SAME_DEVICES
    assert closeness(CPU, CPU) == SAME_DEVICES
    assert closeness("1 x NVIDIA H200", "2 x NVIDIA H100 80GB HBM3") == SAME_PLATFORM
    assert closeness(CPU, "simulated CPU devices (Intel(R) Xeon(R) Processor)") == SAME_PLATFORM
    assert closeness("1 x NVIDIA H200", CPU) == OTHER_MACHINE
    assert closeness("unknown machine", "unknown machine") == SAME_DEVICES
    assert closeness("unknown machine", CPU) == OTHER_MACHINE


def test_choose_prefers_this_machine_then_the_closest_that_covers_then_the_newest():
    cpu, gpu = read_fits(CPU_SWEEP / "A" / "fit.json"), read_fits(H200_SWEEP / "mlp" / "fit.json")
    question = Question(5e5, None, "mlp", (64,), 0)
    found = [Candidate(gpu, gpu.fits), Candidate(cpu, cpu.fits)]
    choice = choose(found, "simulated CPU devices (Intel Xeon)", question)
    assert choice.answer.stored is cpu and choice.closeness == SAME_PLATFORM
    assert choice.others == ()  # the GPU fit does not cover 500 k parameters: not worth naming
    choice = choose(found, "4 x NVIDIA H200", Question(4e6, None, "mlp", (1024,), 0))
    assert choice.answer.stored is gpu and choice.closeness == SAME_DEVICES and choice.others == ()
    choice = choose(found, "simulated CPU devices (Intel Xeon)", Question(4e6, None, "mlp", (1024,), 0))
    assert choice.answer.stored is gpu and choice.closeness == OTHER_MACHINE  # the closest that can answer
    choice = choose(found, CPU, Question(4e6, None, "mlp", (1024,), 0))
    assert choice.answer.stored is cpu  # this machine's, though out of range: recommend says so, naming the other
    assert choice.others == (found[0],)


def test_the_sweep_to_run_covers_what_the_fit_does_not():
    gpu = read_fits(H200_SWEEP / "mlp" / "fit.json").fits
    assert sweep_command(gpu) == "xbench sweep --backends jax torch --precision tf32"
    assert sweep_command(gpu, Question(2e8, None, "mlp", (64,), 0)) == (
        "xbench sweep --backends jax torch --precision tf32 --params 1e8 2e8 4e8 --per-device-batch 32 64 128")


def test_a_machine_that_matches_no_fit_hears_so_and_gets_the_named_fits_answer(run_cli, here, tmp_path):
    path = stored(tmp_path, "cpu", CPU, "2026-11-25T04:13:36+00:00")
    here("2 x NVIDIA H100 80GB HBM3")
    code, out, err = run_cli(*README_EXAMPLE, "--fits", str(tmp_path / "fits"))
    assert code == 0, err
    first = words(out).split(" global batch 64 ")[0]
    assert first == ("no fit was measured on this machine (2 x NVIDIA H100 80GB HBM3); answering from the fit of "
                     f"{CPU} in {path} (fitted 2026-11-25T04:13:36+00:00) — run `xbench sweep --backends jax torch` "
                     "here for a fit of your own")
    assert "jax (fp32): use one device" in out and "samples/s" in out


def test_two_fits_of_this_machine_give_one_answer_naming_which(run_cli, here, tmp_path):
    """Runs A and B of the same sweep disagree at the margin (B: jax's 2 devices break even at
    global batch 1,024; A: never): the newer answers, the other is named, never both."""
    old = stored(tmp_path, "A", CPU, "2026-11-25T04:13:36+00:00")
    new = stored(tmp_path, "B", CPU, "2026-11-25T04:18:43+00:00", source=CPU_SWEEP / "B" / "fit.json")
    here(CPU)
    code, out, err = run_cli(*README_EXAMPLE, "--fits", str(tmp_path / "fits"))
    assert code == 0, err
    text = words(out)
    assert text.startswith(f"answering from {new} ({CPU}, fitted 2026-11-25T04:18:43+00:00) ")
    assert (f"also covering this question, not used: {old} ({CPU}, fitted 2026-11-25T04:13:36+00:00); "
            "`--fits PATH` answers") in text
    assert text.count("global batch 64") == 1 and text.count("jax (fp32): use one device") == 1
    assert text.count("2 devices beat 1 (jax, fp32)") == 1 and "from 3.28e+05 params" in text
    code, out, err = run_cli(*README_EXAMPLE, "--fits", str(old))  # the other, when asked for
    assert code == 0 and f"answering from {old}" in words(out) and "not used" not in out


def test_this_machines_fit_answers_before_a_newer_one_of_another(run_cli, here, tmp_path):
    mine = stored(tmp_path, "mine", CPU, "2026-01-01T00:00:00+00:00")
    stored(tmp_path, "theirs", "2 x NVIDIA H200", "2026-12-01T00:00:00+00:00")
    here(CPU)
    code, out, err = run_cli(*README_EXAMPLE, "--fits", str(tmp_path / "fits"))
    assert code == 0 and words(out).startswith(f"answering from {mine} ")
    assert "(2 x NVIDIA H200, fitted 2026-12-01T00:00:00+00:00); `--fits PATH`" in words(out)  # the newer, named


@pytest.mark.parametrize("args, outside, sweep", [
    (("--params", "5e6", "--global-batch", "64"), "5,000,000 parameters",
     "xbench sweep --backends jax torch --params 2.5e6 5e6 1e7"),
    (("--params", "5e5", "--global-batch", "4"), "global batch 4",
     "xbench sweep --backends jax torch --per-device-batch 2 4 8"),
    (("--params", "5e5", "--global-batch", "4096", "--devices", "2"), "global batch 4,096",
     "xbench sweep --backends jax torch --per-device-batch 2048 4096 8192"),
])
def test_a_question_outside_the_fit_is_one_line_naming_the_range_and_the_sweep(run_cli, here, args, outside, sweep):
    here(CPU)
    code, out, err = run_cli("recommend", *args, "--fits", str(CPU_SWEEP / "B" / "fit.json"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words(err) == (f"error: {outside} is outside the fit that answers here ({CPU_SWEEP / 'B' / 'fit.json'}, "
                          f"{CPU}: mlp of 31,363-1,030,659 parameters, 16-1,024 samples per device on 1-2 devices); "
                          f"`{sweep}` here would measure a fit that covers it")


def test_outside_this_machines_fit_names_another_that_covers_it(run_cli, here):
    here(CPU)
    code, _, err = run_cli("recommend", "--params", "5e6", "--global-batch", "1024", "--fits", str(CPU_SWEEP / "B"),
                           str(H200_SWEEP / "mlp"))
    gpu = H200_SWEEP / "mlp" / "fit.json"
    assert code == 2 and words(err).endswith(f"; {gpu} (1 x NVIDIA H200) covers it: --fits {gpu}"), err


def test_the_readme_example_runs_on_a_fresh_clone(run_cli, here, monkeypatch, tmp_path):
    """Only the committed fits, default --fits (results/ of the working directory), on this
    project's CPU machine (which none of them was measured on): an answer from a committed CPU
    fit, said to be which."""
    for sweep in (CPU_SWEEP, H200_SWEEP):
        for fit in sweep.glob("*/fit.json"):
            target = tmp_path / "results" / sweep.name / fit.parent.name / "fit.json"
            target.parent.mkdir(parents=True)
            shutil.copy(fit, target)
    monkeypatch.chdir(tmp_path)
    here("simulated CPU devices (Intel(R) Xeon(R) Processor)")  # this project's CPU machine, as fits name it
    code, out, err = run_cli(*README_EXAMPLE)
    assert code == 0, err
    assert words(out).startswith(
        "no fit was measured on this machine (simulated CPU devices (Intel(R) Xeon(R) Processor)); answering from "
        f"the fit of {CPU} in results/2026-11-25-cpu-step-model/B/fit.json (fitted 2026-11-25T04:18:43+00:00) — ")
    assert "also covering this question, not used: results/2026-11-25-cpu-step-model/A/fit.json" in words(out)
    assert "jax (fp32): use one device" in out and "torch (spmd) (fp32): use one device" in out


def test_batch_is_a_hidden_old_name_of_global_batch(run_cli, here):
    here(CPU)
    fit = str(CPU_SWEEP / "B" / "fit.json")
    code, out, _ = run_cli("recommend", "--params", "5e5", "--batch", "64", "--global-batch", "256", "--fits", fit)
    assert code == 0 and "global batch 64" in out and "global batch 256" in out
    code, out, _ = run_cli("recommend", "--help")
    assert code == 0 and "--global-batch" in out and "INT..." in out and "--batch " not in out
    assert "<list[" not in out and "PATH..." in out and "[default: mlp]" in out
