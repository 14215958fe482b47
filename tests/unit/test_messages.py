"""Each message says what to change, about the right thing, in one line of
reasonable length."""

import pytest

from tests.conftest import entry_point
from xbench.run import registry


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_device_count_below_one_is_named_as_devices(fake_backends, run_cli):
    code, _, err = run_cli("allreduce", "--backends", "numpy", "--devices", "0")
    assert code == 2 and "'devices'" in one_error(err) and "batch_sizes" not in err


def test_bare_xbench_shows_the_help_and_no_empty_error(run_cli):
    code, out, err = run_cli()
    assert code == 2 and "compare" in out and "error" not in err


def test_a_command_line_mistake_is_not_blamed_on_the_file(fake_backends, run_cli, tmp_path):
    config = tmp_path / "spec.toml"
    config.write_text('[protocol]\nsteps = 3\n')
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--steps", "0",
                           "--out", str(tmp_path / "run"))
    assert code == 2 and f"of {config} with the command line's options" in one_error(err)
    config.write_text('[protocol]\nsteps = 0\n')  # the file's own mistake is the file's
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--repeats", "3",
                           "--out", str(tmp_path / "run"))
    assert code == 2 and f"[protocol] of {config} must" in one_error(err)


def test_a_byte_order_mark_is_read_as_text(fake_backends, run_cli, tmp_path):
    config = tmp_path / "spec.toml"
    config.write_bytes(b"\xef\xbb\xbf[protocol]\nsteps = 0\n")
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--out", str(tmp_path / "r"))
    assert code == 2 and "'steps' in [protocol]" in one_error(err)  # parsed: the mark is no "Invalid statement"


def test_a_huge_list_is_not_echoed_whole(fake_backends, run_cli, tmp_path):
    config = tmp_path / "spec.toml"
    config.write_text('[[models]]\npreset = "medium"\nbatch_sizes = [' + ", ".join(["16"] * 100_000) + "]\n")
    code, _, err = run_cli("compare", "--backends", "numpy", "--config", str(config), "--out", str(tmp_path / "r"))
    assert code == 2 and "lists a value twice" in one_error(err) and len(err) < 400


class LongReason:
    """A plugin whose probe explains itself at length."""

    name = "long"

    def probe(self):
        from xbench.contract import Availability

        return Availability(False, reason="x" * 1_000_000)

    def setup(self, devices, platform): ...
    def prepare(self, trial, work): ...
    def run(self, prepared, steps): ...


def test_a_plugins_million_character_reason_is_cut_short():
    entries = registry.load_points([entry_point("long", f"{__name__}:LongReason")])
    reason = entries["long"].availability.reason
    assert len(reason) < 400 and "1,000,000 characters" in reason


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_an_interrupted_run_names_the_command_that_finishes_it(tmp_path, command):
    from xbench.cli.running import _interrupted_message

    (tmp_path / "run.json").write_text("{}")
    assert f"`xbench {command} --resume {tmp_path}`" in _interrupted_message(tmp_path, command)
