"""What a reader can use: intervals shown as ± only where nearly symmetric, as bounds where
skewed, in words where they span more than a factor of 2; ratios that the printed means
reproduce; names that no table cuts at 80, 100 or 120 columns; a bottom line that says an
undecided result as undecided and a busy machine as busy."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from rich.console import Console

from tests.unit.test_bottom_line import record
from xbench.cli.backends_cmd import backends_table
from xbench.cli.models_cmd import models_table, preset_rows
from xbench.report.bottom_line import bottom_line, machine_moved
from xbench.report.terminal import bottom_line_text, model_tables, rate_with_interval
from xbench.report.words import interval_text, ratio_text
from xbench.results.summary import geomean_rate, rows_from_records

WIDTHS = (80, 100, 120)


def printed(renderables, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


# 1. Intervals a reader can use ------------------------------------------------------------------


def test_a_nearly_symmetric_interval_is_a_plus_minus_a_skewed_one_its_bounds_a_wide_one_words():
    assert interval_text(100.0, 95.0, 105.2, 1.0, str) == "±5%"
    assert interval_text(100.0, 70.0, 135.0, 1.0, lambda v: f"{v:.0f}") == "(70–135)"
    assert interval_text(100.0, 30.0, 300.0, 1.0, str) == "(too few reps)"
    assert interval_text(100.0, 30.0, 300.0, 1.0, str, brief=False) == "too few replicates to say"
    assert interval_text(100.0, 30.0, 300.0, 3.0, str) == "(too noisy)"  # the run's own variation spans 3×
    assert interval_text(100.0, math.nan, math.nan, 1.0, str) == ""


def skewed_rows():
    """Two replicates a configuration whose processes differ by about 2×: intervals that span far
    more than a factor of 2 (the issue's "13,388 ±3025%")."""
    return rows_from_records([record(b, d, 64, r, 1e-3 / d * (2.0 if r else 1.0), spread=0.0)
                              for b in ("fast", "slow") for d in (1, 2) for r in range(2)])


def test_an_interval_spanning_more_than_2x_prints_words_and_no_plus_minus_over_100_percent():
    rows = skewed_rows()
    assert all(r.measured.ci_high / r.measured.ci_low > 2 for r in rows)
    text = printed(model_tables(rows, width=120), 120)
    assert all(rate_with_interval(r).endswith("(too few reps)") for r in rows)
    assert not re.search(r"±\d{3,}%", text)
    speedups = [r.scaling for r in rows if r.scaling is not None]
    assert speedups and all(ratio_text(s).endswith("(too uncertain)") for s in speedups)


def test_a_wide_ratio_wholly_on_one_side_of_1_keeps_its_bounds_where_a_verdict_rests_on_it():
    """On 4 x H200 the seed study printed "slower than 1 at batch 16 (0.31x, too uncertain to
    say)" and "0.46x (too uncertain) | single better": a verdict beside words that deny one."""
    from xbench import stats
    below = stats.Scaling(0, 0.31, 0.0, 0.0, False, 0.20, 0.48)
    astride = stats.Scaling(0, 0.9, 0.0, 0.5, False, 0.4, 2.1)
    assert ratio_text(below) == "0.31× (0.20–0.48)" and ratio_text(below, brief=False) == "0.31× (0.20–0.48)"
    assert ratio_text(astride) == "0.90× (too uncertain)"
    rows = rows_from_records([record("b", d, 64, r, 1e-3 * (5.0 if d == 2 else 1.0) * (1.0, 1.2, 1.4)[r], spread=0.0)
                              for d in (1, 2) for r in range(3)])
    two = next(r for r in rows if r.devices == 2)
    assert two.scaling is not None and two.scaling.ci_high < 1 and two.scaling.ci_high / two.scaling.ci_low > 2
    said = " ".join(bottom_line(rows)[0].sentences)
    assert "slower than 1" in said and "too uncertain" not in said, said
    assert f"({two.scaling.ci_low:.2f}–{two.scaling.ci_high:.2f})" in said


def test_the_speedup_is_the_ratio_of_the_throughputs_the_table_prints():
    rows = rows_from_records([record("b", d, 64, r, 1e-3 / (1.8 if d == 2 else 1), spread=0.3)
                              for d in (1, 2) for r in range(3)])
    one, two = sorted(rows, key=lambda r: r.devices)
    shown = {r.devices: float(rate_with_interval(r).split()[0].replace(",", "")) for r in rows}
    assert two.scaling.speedup == pytest.approx(geomean_rate(two) / geomean_rate(one))
    assert f"{shown[2] / shown[1]:.2f}" == f"{two.scaling.speedup:.2f}"


def busy(out):
    out["replicate"] = {"host_before": {"loadavg_1m": 5.5, "cpu_count": 2}}
    return out


def test_a_speedup_beyond_the_device_count_on_a_busy_machine_names_that_cause():
    # The 1-device replicates ran 3× slower than the machine allows: 2 devices "gain" 6×.
    rows = rows_from_records([busy(record("b", d, 64, r, 3e-3 if d == 1 else 0.5e-3)) for d in (1, 2)
                              for r in range(3)])
    text = printed(model_tables(rows, width=120), 120)
    assert "above linear: a busy machine" in text
    assert "likely a busy machine" in " ".join(bottom_line(rows)[0].sentences)


# 3. Names that no table cuts ----------------------------------------------------------------------


LONG_LABELS = [("torch", "channels-last", "plain", "spmd"), ("jax-shardmap", "fused", "data-parallel", "subprocess"),
               ("jax-shardmap", "fused", "plain", "subprocess"), ("torch", "channels-last", "data-parallel", "spmd")]


def long_named_rows():
    records = []
    for backend, variant, program, launcher in LONG_LABELS:
        for devices in (1, 2) if program != "plain" else (1,):
            for r in range(2):
                out = record(backend, devices, 65536, r, 1e-3 / devices, spread=0.2)
                out["trial"].update(variant=variant, program=program, launcher=launcher)
                records.append(out)
    return rows_from_records(records)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_compare_table_never_cuts_a_program_name(width):
    rows = long_named_rows()
    text = printed(model_tables(rows, width=width), width)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width and "…" not in text
    table = [line for line in lines if re.match(r"^\S.*\s+[12]\s+65,536\s", line)]
    for row in rows:  # each row on one line of the table, its name whole
        assert any(line.startswith(row.label + " ") for line in table), row.label
    for kind in ("plain", "data-parallel"):  # and the fastest tables of both kinds, at every width
        assert f"model m: fastest per configuration, {kind} programs" in text, kind


def plain_and_data_parallel_rows():
    """Two backends' plain programs on 1 device and their data-parallel ones on 1 and 2: b's plain
    program is the faster plain one, a's data-parallel one the faster data-parallel one."""
    records = []
    for backend, program, devices in (("a", "plain", 1), ("b", "plain", 1), ("a", "data-parallel", 1),
                                      ("b", "data-parallel", 1), ("a", "data-parallel", 2), ("b", "data-parallel", 2)):
        slower = (backend == "b") != (program == "plain")
        for r in range(2):
            out = record(backend, devices, 64, r, 1e-3 * (1.5 if slower else 1.0), spread=0.01)
            out["trial"].update(program=program)
            records.append(out)
    return rows_from_records(records)


def fastest_lines(text: str, title: str) -> list[list[str]]:
    """The first words of each configuration's line in the fastest table titled `title`."""
    lines = text[text.index(title + "\n"):].splitlines()[1:]
    assert lines[0].split()[:3] == ["dev", "batch", "fastest"], lines[0]
    found = []
    for line in lines[2:]:
        if not re.match(r"^\s+[12]\s+64\s", line):
            break
        found.append(line.split()[:3])
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_the_fastest_table_says_which_programs_each_row_ranks(width):
    """On 1 device the plain programs and the data-parallel ones are ranked apart: two rows of
    the same devices and batch, in tables whose titles say which programs they rank."""
    text = printed(model_tables(plain_and_data_parallel_rows(), width=width), width)
    assert fastest_lines(text, "model m: fastest per configuration, plain programs") == [["1", "64", "b"]]
    assert fastest_lines(text, "model m: fastest per configuration, data-parallel programs") == [
        ["1", "64", "a"], ["2", "64", "a"]]
    one_kind = printed(model_tables([r for r in plain_and_data_parallel_rows() if r.program != "plain"], width=width),
                       width)
    assert fastest_lines(one_kind, "model m: fastest per configuration") == [["1", "64", "a"], ["2", "64", "a"]]


def test_the_wide_fastest_table_has_a_programs_column():
    text = printed(model_tables(plain_and_data_parallel_rows(), wide=True), 250)
    lines = text[text.index("model m: fastest per configuration"):].splitlines()
    header = next(line for line in lines if "programs" in line)
    assert header.replace("┃", " ").split()[:4] == ["dev", "batch", "programs", "fastest"]
    cells = [[c.strip() for c in line.split("│")][1:4] for line in lines if re.match(r"^│\s+[12]\s+│\s+64", line)]
    assert cells == [["1", "64", "plain"], ["1", "64", "data-parallel"], ["2", "64", "data-parallel"]]


def test_the_reports_fastest_table_says_which_programs_each_row_ranks():
    from xbench.report.pages import fastest_section

    [_, table] = fastest_section("m", plain_and_data_parallel_rows())
    assert table.headers[2] == "programs" and all(len(row) == len(table.headers) for row in table.rows)
    assert [row[2] for row in table.rows] == ["plain", "data-parallel", "data-parallel"]
    assert table.right_aligned == {0, 1, 4, 5, 7, 8, 9}  # dev, batch, rates, intervals, tuned gain
    assert [row[3] for row in table.rows] == ["b plain", "a", "a"]
    # backend a, first in the rows, has no plain program measured: the plain rows still come first
    c_plain = [record("c", 1, 64, r, 2e-3, spread=0.01) for r in range(2)]
    for out in c_plain:
        out["trial"].update(program="plain")
    rows = [r for r in plain_and_data_parallel_rows() if r.label != "a plain"] + rows_from_records(c_plain)
    [_, table] = fastest_section("m", rows)
    assert [row[:4] for row in table.rows] == [("1", "64", "plain", "b plain"), ("1", "64", "data-parallel", "a"),
                                               ("2", "64", "data-parallel", "a")]


@pytest.mark.parametrize("width", WIDTHS)
def test_models_never_cuts_a_preset_or_family_name(width):
    rows = preset_rows()
    text = printed([models_table(rows, width)], width)
    lines = text.splitlines()
    assert "…" not in text and max(len(line.rstrip()) for line in lines) <= width
    for preset, family, *_ in rows:
        assert any(preset in line and family in line for line in lines), preset


@pytest.mark.parametrize("width", WIDTHS)
def test_backends_never_cuts_a_backend_or_plugin_name(width):
    lines_in = [("jax-shardmap", "[green]available[/]", "0.10.2", "subprocess", "data-parallel", "jnp, cudnn, fused",
                 "CPU, up to 2 simulated devices (no GPU found)", "xbench_backends.jax.shardmap:JaxShardMapBackend"),
                ("keras-on-jax-plugin", "[red]unavailable[/]", "", "", "", "",
                 "No module named 'keras'; pip install keras", "my_keras_plugin.backend:KerasOnJaxBackend"),
                ("torch", "[green]available[/]", "2.13.0+cpu", "spmd", "data-parallel, plain",
                 "compile, cuda-graphs, channels-last", "(not probed)", "xbench_backends.torch.ddp:TorchDdpBackend")]
    text = printed([backends_table(lines_in, width)], width)
    lines = text.splitlines()
    assert "…" not in text and max(len(line.rstrip()) for line in lines) <= width
    for line in lines_in:
        for name in (line[0], line[7]):
            assert any(name in out for out in lines), name
        assert any(line[6] in out for out in lines) or width < 100  # the devices too, wrapped at most
    # a line that needs no wrapping ends where its text does: nothing to strip after a copy
    assert "    plugin: xbench_backends.torch.ddp:TorchDdpBackend" in lines or width >= 120


# 6. The bottom line ------------------------------------------------------------------------------


def test_an_undecided_result_is_said_undecided_without_thresholds():
    rows = skewed_rows()
    said = " ".join(bottom_line(rows)[0].sentences)
    assert "Undecided:" in said and "undecided at" in said
    assert not re.search(r"spans \d\.\d\d×", said) and "0.95" not in said and "1.10" not in said
    assert "too uncertain to say" in said
    assert "not at every larger one" not in said


def test_a_busy_machine_is_said_first_in_the_bottom_line():
    records = [busy(record(b, d, n, r, n * 1e-5 / d)) for b in ("fast", "slow") for d in (1, 2) for n in (64, 1024)
               for r in range(3)]
    [found] = bottom_line(rows_from_records(records))
    assert found.sentences[0].startswith("Measured on a busy machine (the host's load averaged 5.5 on 2 cores")
    quiet = [record(b, d, 64, r, 1e-3 / d) for b in ("fast", "slow") for d in (1, 2) for r in range(3)]
    assert not any("busy" in s for s in bottom_line(rows_from_records(quiet))[0].sentences)
    assert "busy machine" in printed([bottom_line_text([found])], 100)


def test_a_machine_that_moved_during_the_run_is_said_in_its_bottom_line():
    controls = [{"when": "before", "host_loop_s": [0.0111, 0.012], "matmul_s": [0.0015, 0.0016]},
                {"when": "after", "host_loop_s": [0.0091, 0.0093], "matmul_s": [0.0015, 0.0016]}]
    said = machine_moved(controls)
    assert said.startswith("The machine moved during the run (its host dispatch loop ran 18% faster at the end")
    assert machine_moved(controls[:1]) == "" and machine_moved([controls[0], {**controls[0], "when": "after"}]) == ""
    rows = rows_from_records([record(b, 1, 64, r, 1e-3) for b in ("fast", "slow") for r in range(3)])
    assert bottom_line(rows, controls)[0].sentences[0] == said


def test_gpu_rows_hear_that_the_host_moved_and_that_its_probes_do_not_time_their_gpus():
    """On one H100 the host's probes moved 14-15 % while every GPU row's replicates agreed within
    0.1 % (results/2026-12-05-h100x1-verify-families/memory): for rows that time their GPUs, the
    movement is the host's, said as such; a host-bound row among them keeps the warning."""
    controls = [{"when": "before", "host_loop_s": [0.0111, 0.012], "matmul_s": [0.0015, 0.0016]},
                {"when": "after", "host_loop_s": [0.0091, 0.0093], "matmul_s": [0.0015, 0.0016]}]

    def on_h100(r):
        r["devices"]["device_names"] = ["NVIDIA H100 80GB HBM3"]
        return r

    gpu = rows_from_records([on_h100(record(b, 1, 64, r, 1e-3)) for b in ("fast", "slow") for r in range(3)])
    said = bottom_line(gpu, controls)[0].sentences[0]
    assert said.startswith("The host moved during the run (its host dispatch loop ran 18% faster") and \
        "which the host's probes do not measure" in said, said
    host_bound = [replace(gpu[0], host_bound="the GPU idled"), *gpu[1:]]
    assert bottom_line(host_bound, controls)[0].sentences[0] == machine_moved(controls)


def test_a_run_that_timed_nothing_does_not_say_the_machine_moved():
    """Where every row did not fit, no replicate was timed early or late: the movement of the
    machine concerns nothing the run printed."""
    controls = [{"when": "before", "host_loop_s": [0.0111, 0.012], "matmul_s": [0.0015, 0.0016]},
                {"when": "after", "host_loop_s": [0.0091, 0.0093], "matmul_s": [0.0015, 0.0016]}]
    unfit = {**record("slow", 1, 64, 0, 0.01), "status": "skipped",
             "reason": "does not fit: needs ~245 GiB per device, has 140 GiB"}
    [found] = bottom_line(rows_from_records([unfit]), controls)
    assert found.sentences[0].startswith("Nothing fit in device memory")
    assert not any("moved" in s for s in found.sentences)


def test_the_report_says_the_machine_moved_from_the_runs_own_controls(tmp_path):
    import json

    from xbench.report.document import to_markdown
    from xbench.report.pages import bottom_line_section
    from xbench.results.control import CONTROL_FILE, read_controls

    controls = [{"when": "before", "host_loop_s": [0.0111, 0.012], "matmul_s": [0.0015, 0.0016]},
                {"when": "after", "host_loop_s": [0.0091, 0.0093], "matmul_s": [0.0015, 0.0016]}]
    (tmp_path / CONTROL_FILE).write_text("".join(json.dumps(c) + "\n" for c in controls))
    records = [record(b, 1, 64, r, 1e-3) for b in ("fast", "slow") for r in range(3)]
    blocks = bottom_line_section(rows_from_records(records), read_controls(tmp_path))
    assert "The machine moved during the run" in to_markdown(blocks)


def test_the_report_sets_the_verifications_wall_time_beside_the_timings(tmp_path):
    import json

    from xbench.report.pages import verification_cost

    records = [{**record("fast", 1, 64, r, 1e-3), "started_at": f"2026-11-28T10:0{r}:00+00:00",
                "finished_at": f"2026-11-28T10:0{r}:30+00:00"} for r in range(3)]
    assert verification_cost(tmp_path, records) == ""  # no verify.json: a --no-verify run says nothing
    (tmp_path / "verify.json").write_text(json.dumps({"wall_s": 95.0}))  # timing: 10:00:00 to 10:02:30
    assert verification_cost(tmp_path, records) == "Verification took 2 min, timing 2 min."
    assert verification_cost(tmp_path, []) == "Verification took 2 min."
    # on GPUs: its largest run's framework peak beside the timed programs'
    peaks = {"peak_bytes": {"a/m/d1/fp32/r0": 3 * 2**30, "a/m/d2/fp32/r0": 5 * 2**30}, "share": 0.3}
    (tmp_path / "verify.json").write_text(json.dumps({"wall_s": 95.0, "memory": peaks}))
    timed = [{**r, "telemetry": {"framework_memory": {"peak_bytes": [6 * 2**30, 7 * 2**30], "scope": "trial"}}}
             for r in records]
    assert verification_cost(tmp_path, timed) == ("Verification took 2 min, timing 2 min; its largest run held "
                                                  "5.0 GiB on a device, the timed programs' largest 7.0 GiB.")
    assert verification_cost(tmp_path, []).endswith("; its largest run held 5.0 GiB on a device.")


def test_the_report_claims_the_n_device_check_only_where_it_ran(tmp_path):
    """A 1-GPU machine running the default device counts verifies and times no 2-device run:
    the report must not say that 2 devices were checked against 1. verify.json decides where
    there is one (a 2-device check that passed while the 2-device timing failed still ran);
    a --no-verify run claims no check at all."""
    import json

    from xbench.report.pages import verification_section

    def timed(devices: int, replicate: int, status: str = "ok", verification: dict | None = None) -> dict:
        found = record("fast", devices, 64, replicate, 1e-3)
        found["trial"].update(variant="as-written", program="data-parallel")
        return {**found, "status": status, "verification": verification or {"status": "passed", "checks": 3}}

    def said(records: list, run_dir=None) -> str:
        return " ".join(block.text for block in verification_section(records, run_dir) if hasattr(block, "text"))

    one = [timed(1, r) for r in range(2)]
    assert "on 1 and N devices" in said(one + [timed(2, r) for r in range(2)])
    for records in (one, one + [timed(2, 0, "skipped")]):
        assert "on 1 and N devices" not in said(records)
        assert "No run on more than one device was verified" in said(records)
    # verify.json, where there is one, says what verification ran
    checks = [{"keys": [["fast", 1, "m"], ["fast", 2, "m"]], "subject": "m: fast d2 vs fast d1", "passed": True}]
    (tmp_path / "verify.json").write_text(json.dumps({"checks": checks, "wall_s": 5.0}))
    assert "on 1 and N devices" in said(one + [timed(2, 0, "failed")], tmp_path)
    one_device_only = [{**checks[0], "keys": [["fast", 1, "m"], ["slow", 1, "m"]]}]
    (tmp_path / "verify.json").write_text(json.dumps({"checks": one_device_only, "wall_s": 5.0}))
    assert "did not run" in said(one + [timed(2, r) for r in range(2)], tmp_path)
    unverified = [timed(d, 0, verification={"status": "skipped", "reason": "--no-verify"}) for d in (1, 2)]
    assert "This run timed its programs without verifying them first (--no-verify)" in said(unverified)


def test_the_report_describes_gpu_to_gpu_links_only_where_there_are_two_gpus_or_more():
    from xbench.report.pages import environment_section

    def links_said(gpus: int) -> list[str]:
        env = {"gpus": [{"index": i, "name": "H100"} for i in range(gpus)], "links": {"p2p": True},
               "gpu_topology": {"matrix": {"available": True, "gpus": ["GPU0", "GPU1"],
                                           "links": {"GPU0": {"GPU1": "NV18"}}}}}
        [_, bullets] = environment_section([{**record("fast", 1, 64, 0, 1e-3), "environment": env}])
        return [item for item in bullets.items if "link" in item]

    assert links_said(0) == [] and links_said(1) == []
    assert links_said(2)[0] == "GPU links (nvidia-smi topo -m): GPU0–GPU1: NV18"
