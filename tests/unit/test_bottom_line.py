"""The bottom line and the compact tables: sentences from the same statistics as the tables,
and tables that keep every column at 80-120 characters."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from rich.console import Console

from xbench.report.bottom_line import bottom_line, contests
from xbench.report.terminal import bottom_line_text, compact_headers, model_tables
from xbench.report.words import speedup_text
from xbench.results.summary import rows_from_records


def record(backend, devices, batch, replicate, step_s, spread=0.02, framework=None):
    """A replicate whose mean step time is `step_s` times a per-replicate factor (the spread
    between processes), with quiet windows."""
    rng = np.random.default_rng(zlib.crc32(f"{backend}/{devices}/{batch}/{replicate}".encode()))
    factor = 1 + spread * rng.standard_normal()
    trial = {"backend": backend, "model": {"name": "m", "widths": [4], "inputs": 3, "outputs": 1},
             "devices": devices, "global_batch": batch, "scaling": "strong", "precision": "fp32",
             "launcher": "subprocess", "all_reduce": True, "replicate": replicate}
    return {"trial_id": f"{backend}/m/d{devices}/b{batch}/r{replicate}", "trial": trial, "status": "ok",
            "reason": None, "work": {"params": 9},
            "devices": {"framework": framework or backend, "framework_version": "1", "platform": "gpu",
                        "device_names": ["X"] * devices, "simulated": False, "available": devices, "details": {}},
            "timing": {"first_call_s": 1.0, "steps_per_window": 10, "stopped": "repeats",
                       "window_s": [10 * step_s * factor * (1 + 0.001 * k) for k in range(8)]}}


def study(step_s, replicates=4, spread=0.02):
    """`step_s(backend, devices, batch)`: the mean step time of each configuration."""
    return rows_from_records([record(b, d, n, r, step_s(b, d, n), spread) for b in ("fast", "slow")
                              for d in (1, 2) for n in (64, 1024) for r in range(replicates)])


def sentences(rows) -> list[str]:
    [found] = bottom_line(rows)
    return list(found.sentences)


def test_a_framework_ahead_everywhere_is_named_with_its_margin_and_every_lead_significant():
    rows = study(lambda b, d, n: n * 1e-5 * (1.0 if b == "fast" else 1.5) / d ** 0.5)
    lead = sentences(rows)[0]
    assert lead.startswith("Fastest: fast leads in 4 of 4 configurations") and "every lead significant" in lead
    assert re.search(r"by 1\.[45]\d× to 1\.[45]\d× over the next framework", lead)


def test_frameworks_within_their_intervals_are_said_to_tie():
    rows = study(lambda b, d, n: n * 1e-5 * (1.0 if b == "fast" else 1.005), spread=0.05)
    assert "no lead is significant: the frameworks tie" in sentences(rows)[0]


def test_devices_help_from_the_batch_where_the_verdict_turns_beneficial():
    # Two devices lose at batch 64 (communication dominates) and win at 1024.
    rows = study(lambda b, d, n: (n * 1e-5 / d + (2e-3 if d == 2 else 0)) * (1.0 if b == "fast" else 1.3))
    said = " ".join(sentences(rows))
    assert "fast: 2 devices beat 1 from batch 1,024 on" in said
    assert "below it: slower than 1 at batch 64" in said


def test_the_speedup_a_sentence_quotes_is_the_one_the_table_prints():
    rows = study(lambda b, d, n: (n * 1e-5 / d + (2e-3 if d == 2 else 0)) * (1.0 if b == "fast" else 1.3))
    table_cells = {speedup_text(r) for r in rows if r.devices == 2}
    quoted = re.findall(r"\d\.\d\d× \(\d\.\d\d–\d\.\d\d\)", " ".join(sentences(rows)))
    assert quoted and set(quoted) <= table_cells


def test_an_undecided_speedup_says_what_would_decide_it():
    # A 10 % speedup with 15 % process-to-process spread and two replicates: inconclusive.
    rows = study(lambda b, d, n: n * 1e-5 / (1.1 if d == 2 else 1.0), replicates=2, spread=0.15)
    said = " ".join(sentences(rows))
    assert "Undecided:" in said and "more replicates would decide it" in said


def test_one_framework_is_said_to_have_no_rival():
    rows = [r for r in study(lambda b, d, n: n * 1e-5) if r.backend == "fast"]
    assert sentences(rows)[0] == "Only fast was measured: no framework comparison."


def test_backends_of_one_framework_are_not_each_others_rivals():
    records = [record(b, 1, 64, r, 1e-3 * (1.0 if b == "j1" else 1.2 if b == "j2" else 2.0), framework=f)
               for b, f in (("j1", "jx"), ("j2", "jx"), ("t", "tx")) for r in range(3)]
    lead = sentences(rows_from_records(records))[0]
    assert "jx leads in 1 of 1 configuration (j1 in 1)" in lead and re.search(r"by 2\.\d\d×", lead)


def rendered(rows, width, wide=False) -> str:
    console = Console(width=width, record=True)
    for table in model_tables(rows, width=width, wide=wide):
        console.print(table)
    console.print(bottom_line_text(bottom_line(rows)))
    return console.export_text()


@pytest.mark.parametrize("width", [100, 120])
def test_the_compact_table_keeps_every_column_whole_at_100_and_120(width):
    rows = study(lambda b, d, n: n * 1e-5 / d)
    text = rendered(rows, width)
    header = next(line for line in text.splitlines() if line.startswith("program"))
    assert all(h in header for h in compact_headers(rows))
    assert max(len(line) for line in text.splitlines()) <= width


def test_at_80_columns_the_notes_move_under_the_table():
    rows = study(lambda b, d, n: n * 1e-5 / d, replicates=2, spread=0.3)
    text = rendered(rows, 80)
    header = next(line for line in text.splitlines() if line.startswith("program"))
    assert "notes" not in header and "reps" in header
    assert re.search(r"^\w+ d\d b\d+: .*unstable", text, re.M)  # the notes, row by row
    assert max(len(line) for line in text.splitlines()) <= 80


def test_wide_shows_every_column_and_the_full_verdict_words():
    rows = study(lambda b, d, n: n * 1e-5 * (1.0 if d == 1 else 2.0))
    text = rendered(rows, 250, wide=True)
    assert "1st call s" in text and "eff." in text and "single device preferred" in text
    assert "single better" in rendered(rows, 100)


def test_one_replicate_a_side_is_said_to_be_untested_not_a_tie():
    rows = study(lambda b, d, n: n * 1e-5 * (1.0 if b == "fast" else 1.5), replicates=1)
    lead = sentences(rows)[0]
    assert "no lead can be called" in lead and "tie" not in lead


def test_under_weak_scaling_every_sentence_names_the_per_device_batch():
    records = [record(b, d, n, r, n * 1e-5 * (1.0 if d == 1 else 1.02)) for b in ("fast", "slow") for d in (1, 2)
               for n in (64, 1024) for r in range(2)]
    for rec in records:  # weak scaling: the global batch is the per-device batch times the devices
        trial = rec["trial"]
        trial["scaling"], trial["global_batch"] = "weak", trial["global_batch"] * trial["devices"]
    said = " ".join(sentences(rows_from_records(records)))
    assert "per-device batch" in said and " batch 128" not in said and " batch 2,048" not in said


def test_the_speedup_floor_counts_both_sides_run_variation():
    # 40 replicates a side on simulated devices (run-level 3 % a side): the interval is at its
    # floor, so more replicates would not decide a 1.03x speedup.
    records = [record("a", d, 64, r, 1e-3 / (1.03 if d == 2 else 1.0), spread=0.01) for d in (1, 2)
               for r in range(40)]
    for rec in records:
        rec["devices"]["simulated"] = True
        rec["trial"]["protocol"] = {"run_variation": 0.03, "interval_target": 0.1}
    said = " ".join(sentences(rows_from_records(records)))
    assert "more replicates will not decide it" in said


# -- like with like: a program against itself, the plain program apart -------------------------

def program_record(backend, devices, batch, replicate, step_s, program="data-parallel", framework=None):
    out = record(backend, devices, batch, replicate, step_s, spread=0.01, framework=framework)
    out["trial"]["program"] = program
    out["trial_id"] = f"{backend}/m/d{devices}/b{batch}" + ("/plain" if program == "plain" else "") + \
        f"/r{replicate}"
    return out


def plain_slower_study(backends=("fast",), replicates=4):
    """The plain 1-device program 3x slower than the data-parallel program on 1 device, and the
    data-parallel program 0.8x as fast on 2 devices as on 1: the program gives 3x, the devices
    lose, 2.4x in all."""
    records = []
    for backend in backends:
        for r in range(replicates):
            records += [program_record(backend, 1, 64, r, 3e-3, program="plain"),
                        program_record(backend, 1, 64, r, 1e-3),
                        program_record(backend, 2, 64, r, 1e-3 / 0.8)]
    return rows_from_records(records)


def test_devices_are_judged_on_the_same_program_and_the_plain_program_apart():
    rows = plain_slower_study()
    two = next(r for r in rows if r.devices == 2)
    assert two.scaling.speedup == pytest.approx(0.8, rel=0.03) and two.baseline == "data-parallel"
    assert two.vs_plain.speedup == pytest.approx(2.4, rel=0.03)
    text = rendered(rows, 120)
    line = next(line for line in text.splitlines() if line.startswith("fast ") and "  2  " in line)
    assert re.search(r"0\.[78]\d× \(", line) and re.search(r"  2\.[34]\d×  ", line) and "single better" in line
    said = " ".join(sentences(rows))
    assert "beat 1" not in said and "2 devices are slower than 1" in said
    assert re.search(r"fast against fast plain .*on 2 devices 2\.[34]\d× \(.*\) at batch 64 = 3\.0\d× from the "
                     r"program × 0\.[78]\d× from the devices", said)


def test_plain_programs_are_ranked_among_themselves_and_a_backend_without_one_on_its_data_parallel_program():
    # "plug" declares no plain program: on 1 device it meets jax's data-parallel program only.
    records = [program_record("jax", d, 64, r, s, program=p) for r in range(3)
               for d, p, s in ((1, "plain", 3e-3), (1, "data-parallel", 1e-3), (2, "data-parallel", 0.6e-3))]
    records += [program_record("plug", d, 64, r, s) for r in range(3) for d, s in ((1, 1.1e-3), (2, 0.65e-3))]
    found = contests(rows_from_records(records))
    assert {(c.devices, c.best.program, c.rival.program) for c in found} == {(1, "data-parallel", "data-parallel"),
                                                                         (2, "data-parallel", "data-parallel")}
    lead = sentences(rows_from_records(records))[0]
    assert "jax leads in 2 of 2 configurations" in lead and re.search(r"by 1\.0\d× to 1\.1\d×", lead)


def test_a_speedup_over_the_plain_program_asked_explicitly_says_it_is_over_another_program():
    records = [program_record("fast", d, 64, r, s, program=p) for r in range(3)
               for d, p, s in ((1, "plain", 3e-3), (2, "data-parallel", 1e-3))]
    rows = rows_from_records(records)
    two = next(r for r in rows if r.devices == 2)
    assert two.baseline == "plain" and two.vs_plain is None
    assert speedup_text(two).endswith("vs plain")
    said = " ".join(sentences(rows))
    assert "beat 1" not in said and "another program" in said and "--single-device both" in said
    assert "Above linear" in said and "another program, the plain one" in said
    assert "above linear" in rendered(rows, 120)


def test_a_speedup_beyond_the_device_count_is_flagged_with_its_likely_cause():
    records = [program_record("fast", d, 64, r, 1e-3 / (2.6 if d == 2 else 1.0)) for r in range(3) for d in (1, 2)]
    rows = rows_from_records(records)
    said = " ".join(sentences(rows))
    assert "Above linear, so not the devices' doing alone: 2." in said and "likely" in said
    assert "above linear" in rendered(rows, 120)


def test_a_single_batch_speedup_is_quoted_with_its_interval():
    records = [program_record("fast", d, 64, r, 1e-3 / (1.9 if d == 2 else 1.0)) for r in range(3) for d in (1, 2)]
    said = " ".join(sentences(rows_from_records(records)))
    assert re.search(r"2 devices beat 1 at every batch measured \(1\.\d\d× \(1\.\d\d–1\.\d\d\)\)", said)
