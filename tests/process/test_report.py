"""Reports, plots, export and diff, checked against the data they come from."""

import shutil

import pytest

from xbench.report.words import rate_cells
from xbench.results.records import read_records
from xbench.results.summary import rows_from_records, verdict

FAST = ("--model", "medium", "--repeats", "4", "--steps", "4", "--warmup-steps", "0", "--no-verify",
        "--batch-sizes", "16,32", "--devices", "1,2")


@pytest.fixture(scope="module")
def report_dir(real_run, tmp_path_factory):
    """A copy of the real run (which compare already reported on), reported again here."""
    code, run_dir = real_run
    assert code == 0
    copy = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(run_dir, copy)
    from xbench.report.pages import write_report

    write_report(copy, html=True)
    return copy


@pytest.mark.slow
def test_compare_wrote_the_report(real_run):
    _, run_dir = real_run
    assert (run_dir / "report.md").exists() and (run_dir / "report.html").exists()


@pytest.mark.slow
def test_report_tables_hold_every_measured_trial(report_dir):
    text = (report_dir / "report.md").read_text()
    rows = rows_from_records(read_records(report_dir))
    assert "## Model medium (54,403 parameters, 298 kFLOP per training sample)" in text
    assert "## Model large (2,021,379 parameters, 12 MFLOP per training sample)" in text
    for row in rows:
        rate = " | ".join(rate_cells(row))
        line = f"| {row.label} | {row.devices} | {row.global_batch} | {rate} | {row.step_ms:.3f} |"
        assert line in text, line
        assert verdict(row) in text
    assert "`tf`: passed" in text and "`jax`: passed" in text
    assert "simulated CPU devices" in text
    assert "multi-device beneficial (≥ 1.10)" in text  # the verdict thresholds are stated


@pytest.mark.slow
def test_plots_show_the_measured_series(report_dir):
    from xbench.report.plots import speedup_figure, throughput_figure

    rows = [r for r in rows_from_records(read_records(report_dir)) if r.model == "medium"]
    fig = throughput_figure(rows, "medium")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}
    # On 1 device each backend runs its plain program (no strategy, no pmap), a series of its own,
    # besides its data-parallel program, the baseline of the speedup.
    assert set(lines) == {"tf plain, 1 device", "tf, 1 device", "tf, 2 devices", "jax plain, 1 device",
                          "jax, 1 device", "jax, 2 devices"}
    for row in rows:
        label = f"{row.label}, {row.devices} device{'s' if row.devices > 1 else ''}"
        assert list(lines[label].get_ydata()) == [row.throughput.mean]
        assert list(lines[label].get_xdata()) == [row.global_batch]
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "samples/s" in ax.get_ylabel() and "global batch" in ax.get_xlabel() and "medium" in ax.get_title()
    speed = {line.get_label(): line for line in speedup_figure(rows, "medium").axes[0].get_lines()}
    assert {"1.0: no gain", "ideal on 2 devices", "tf, 2 devices", "jax, 2 devices"} <= set(speed)
    jax2 = next(r for r in rows if (r.backend, r.devices) == ("jax", 2))
    assert list(speed["jax, 2 devices"].get_ydata()) == [jax2.scaling.speedup]
    for name in ("throughput-medium.png", "speedup-medium.png", "throughput-large.png", "speedup-large.png"):
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_html_report_is_self_contained(report_dir):
    page = (report_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "<table>" in page and 'src="http' not in page


def test_failed_trials_are_listed_with_reasons(fake_backends, run_cli, tmp_path):
    code, _, _ = run_cli("compare", "--backends", "numpy", *FAST, "--option", "numpy.fail_batch=32",
                         "--out", str(tmp_path / "run"))
    assert code == 1
    text = (tmp_path / "run" / "report.md").read_text()
    assert "## Trials without a result" in text
    assert "| numpy/medium/d1/b32 | failed | RuntimeError: planned failure |" in text


def test_diff_flags_a_slower_run_and_exits_1(fake_backends, run_cli, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    # Four replicates a side: with two, a configuration whose processes happen to differ
    # a lot is (rightly) not called significant.
    assert run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "4", "--out", str(a))[0] == 0
    assert run_cli("compare", "--backends", "numpy", *FAST, "--replicates", "4", "--option", "numpy.work_factor=8",
                   "--out", str(b))[0] == 0
    code, out, err = run_cli("diff", str(a), str(b), "--threshold", "5%")
    assert code == 1 and "significant slowdown" in err
    assert out.count("│ regression") == 4  # all four configurations
    code, out, err = run_cli("diff", str(a), str(a))
    # Simulated CPU devices carry the default run-to-run variation (3 %): a 5 % change between
    # two single runs is below what any number of replicates could show.
    assert code == 0 and "│ regression" not in out and out.count("│ machine too noisy to tell") == 4


def test_diff_and_export_errors(run_cli, tmp_path):
    code, _, err = run_cli("diff", str(tmp_path), str(tmp_path))
    assert code == 2 and "no records.jsonl" in err
    code, _, err = run_cli("diff", str(tmp_path), str(tmp_path), "--threshold", "150%")
    assert code == 2 and "--threshold takes a fraction" in err
    code, _, err = run_cli("export", str(tmp_path))
    assert code == 2 and "choose one of --csv or --parquet" in err
    (tmp_path / "records.jsonl").write_text("")
    code, _, err = run_cli("report", str(tmp_path))
    assert code == 2 and "holds no records" in err


def test_export_csv_and_parquet(fake_backends, run_cli, tmp_path):
    import pandas as pd

    run = tmp_path / "run"
    assert run_cli("compare", "--backends", "numpy", *FAST, "--out", str(run))[0] == 0
    assert run_cli("export", str(run), "--csv")[0] == 0
    assert run_cli("export", str(run), "--parquet", "--out", str(tmp_path / "t.parquet"))[0] == 0
    csv, parquet = pd.read_csv(run / "configurations.csv"), pd.read_parquet(tmp_path / "t.parquet")
    rows = rows_from_records(read_records(run))
    for frame in (csv, parquet):
        assert len(frame) == len(rows) == 4
        assert list(frame["samples_per_s_mean"]) == pytest.approx([r.throughput.mean for r in rows])
        assert set(frame["verdict"]) <= {"baseline", "about even", "inconclusive", "multi-device beneficial",
                                         "single device preferred"}
