"""A report of a run that did not finish says so at its top: how many of its planned trial
replicates ran, which did not, and that `--resume` runs them."""

from __future__ import annotations

import json

from tests.conftest import FAST
from xbench.report.pages import write_report
from xbench.results.records import RECORDS_FILE


def test_a_partly_recorded_run_reports_itself_incomplete_at_the_top(tmp_path, fake_backends, run_cli):
    out = tmp_path / "run"
    code, _, err = run_cli("compare", "--backends", "numpy", *FAST, "--global-batch", "16", "32", "--devices", "1",
                           "--replicates", "2", "--time-budget", "0", "--platform", "cpu", "--out", str(out))
    assert code == 0, err
    assert "plan: 2 configuration(s) x 2 replicate(s); estimated" in err  # the cost, said before the run
    complete = (out / "report.md").read_text()
    assert "## Incomplete run" not in complete

    records = (out / RECORDS_FILE).read_text().splitlines(keepends=True)
    assert len(records) == 4  # 2 batches x 2 replicates
    # As if interrupted after two trials, the second held back as not fitting: a row the run
    # decided, not one it left out.
    held = {**json.loads(records[1]), "status": "skipped", "reason": "does not fit: needs ~9 GiB per device, has 8"}
    (out / RECORDS_FILE).write_text(records[0] + json.dumps(held) + "\n")
    write_report(out, html=False, plots=False)
    report = (out / "report.md").read_text()
    top = report[:report.index("## Bottom line")] if "## Bottom line" in report else report
    assert "## Incomplete run" in top
    assert ("2 of its 4 planned trial replicates have a result; 2 have none (never started, or stopped before "
            "they ended)") in top
    assert "numpy (1 device: 2)" in top
    assert f"`xbench compare --resume {out}` runs the rest" in top

    code, _, err = run_cli("compare", "--resume", str(out))  # the rest runs, and the report is whole again
    assert code == 0, err
    assert "## Incomplete run" not in (out / "report.md").read_text()
