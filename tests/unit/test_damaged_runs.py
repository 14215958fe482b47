"""A damaged run.json, out-of-range numbers in a record and a record of
another run are refused by every reader with one line naming the file, never used, never a
traceback."""

import json
from pathlib import Path

import pytest

from tests.conftest import FAKES, FAST, ROOT
from xbench.errors import XbenchError
from xbench.results.records import read_records, read_run
from xbench.run import registry


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One small finished run of the numpy fake backend (made once, copied per test)."""
    from xbench.cli.main import main

    out = tmp_path_factory.mktemp("finished") / "run"
    installed = registry.list_entry_points()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "list_entry_points", lambda: installed + FAKES)
        patch.setenv("PYTHONPATH", str(ROOT))
        registry.refresh()
        code = main(["compare", "--backends", "numpy", *FAST, "--batch-sizes", "16", "--devices", "1",
                     "--platform", "cpu", "--out", str(out)])
    registry.refresh()
    assert code == 0
    return out


@pytest.fixture
def run_dir(finished, tmp_path, fake_backends):
    copy = tmp_path / "run"
    copy.mkdir()
    for path in finished.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    return copy


def rewrite_records(run_dir: Path, change) -> None:
    path = run_dir / "records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    change(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def rewrite_run(run_dir: Path, change) -> None:
    path = run_dir / "run.json"
    run = json.loads(path.read_text())
    change(run)
    path.write_text(json.dumps(run))


def assert_one_line_refusal(run_cli, run_dir: Path, *needles: str) -> None:
    """report, export, diff and --resume all refuse, each with one line and exit 2."""
    for args in (("report", str(run_dir)), ("export", str(run_dir), "--csv"), ("diff", str(run_dir), str(run_dir)),
                 ("compare", "--resume", str(run_dir))):
        code, out, err = run_cli(*args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and "Traceback" not in err, (args, code, err)
        assert len(lines) == 1 and all(n in lines[0] for n in needles), (args, err)


def set_timing(key, value):
    def change(records):
        records[0]["timing"][key] = value
    return change


@pytest.mark.parametrize("key, value, needle", [
    ("steps_per_window", 10**400, "timing.steps_per_window"),
    ("window_s", [5e-324, 5e-324, 5e-324], "timing.window_s"),
    ("window_s", [1e-3, float("inf"), 1e-3], "timing.window_s"),
    ("first_call_s", float("nan"), "timing.first_call_s"),
], ids=["huge-steps", "subnormal-windows", "infinite-window", "nan-first-call"])
def test_out_of_range_numbers_are_a_damaged_record(run_dir, run_cli, key, value, needle):
    rewrite_records(run_dir, set_timing(key, value))
    with pytest.raises(XbenchError, match=needle):
        read_records(run_dir)
    assert_one_line_refusal(run_cli, run_dir, "records.jsonl:1", needle)


def test_a_record_of_another_run_is_refused_not_used(run_dir, run_cli):
    def foreign(records):
        records.append({**records[0], "run_id": "someone-else"})
    rewrite_records(run_dir, foreign)
    with pytest.raises(XbenchError, match="mixes runs"):
        read_records(run_dir)
    assert_one_line_refusal(run_cli, run_dir, "someone-else", "mixes runs")


@pytest.mark.parametrize("change, needle", [
    (lambda run: run["spec"].update(protocol=None), "spec.protocol None"),
    (lambda run: run.setdefault("launch", {}).update(nnodes="x"), "launch.nnodes 'x'"),
    (lambda run: run.setdefault("launch", {}).update(node_rank=3, nnodes=2), "launch.node_rank 3 of 2"),
    (lambda run: run.setdefault("launch", {}).update(hosts="a,b"), "launch.hosts"),
], ids=["protocol-null", "nnodes-text", "node-rank-past-nodes", "hosts-text"])
def test_a_damaged_run_json_is_refused_by_resume_and_every_reader(run_dir, run_cli, change, needle):
    rewrite_run(run_dir, change)
    with pytest.raises(XbenchError, match="run.json"):
        read_run(run_dir)
    assert_one_line_refusal(run_cli, run_dir, "run.json", needle)
    before = (run_dir / "records.jsonl").read_bytes()
    code, _, _ = run_cli("compare", "--resume", str(run_dir))
    assert code == 2 and (run_dir / "records.jsonl").read_bytes() == before  # nothing ran
