"""`report.md` and `report.html` for a run directory, built from its records alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from xbench.contract import implementation
from xbench.report.bottom_line import bottom_line
from xbench.report.document import Block, Bullets, Heading, Image, Paragraph, TableBlock, to_html, to_markdown
from xbench.report.terminal import (
    ALLREDUCE_HEADERS,
    ALLREDUCE_NOTE,
    Busbw,
    allreduce_rows,
    busbw_by_size,
    cost_columns,
    format_p,
)
from xbench.report.words import (
    NUMERIC_COLUMNS,
    PROGRAMS,
    READING_NOTES,
    TIED,
    both_kinds,
    busy_text,
    duration,
    fastest_cells,
    fastest_headers,
    left_out_line,
    model_facts,
    result_cells,
    result_headers,
    spread_text,
)
from xbench.results.allreduce import ok_results
from xbench.results.conditions import busy_host
from xbench.results.control import read_controls
from xbench.results.fit import DOES_NOT_FIT, does_not_fit
from xbench.results.links import notes
from xbench.results.records import (
    ALLREDUCE_FILE,
    RUN_FILE,
    AllReduceRecord,
    Record,
    RunInfo,
    StoredDeviceInfo,
    VerificationOutcome,
    read_records,
    read_run,
    recorded_trials,
    write_atomic,
)
from xbench.results.schema import NO_VERIFY, REPORT_HTML, REPORT_MD, VERIFY_FILE
from xbench.results.summary import Row, fastest_rows, full_rows, rows_from_records


def write_report(run_dir: Path, html: bool = True, plots: bool = True) -> list[Path]:
    """Write report.md (and report.html, plots) into `run_dir`; returns the files written."""
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    run = read_run(run_dir) if (run_dir / RUN_FILE).exists() else None  # results kept without it still report
    rows = rows_from_records(records)
    allreduce = read_records(run_dir, ALLREDUCE_FILE) if (run_dir / ALLREDUCE_FILE).exists() else []
    images = draw_plots(rows, allreduce, run_dir) if plots else {}
    blocks = build_report(records, run, rows, images, allreduce, run_dir)
    written = [run_dir / REPORT_MD]
    write_atomic(written[0], to_markdown(blocks).encode("utf-8"))
    if html:
        written.append(write_atomic(run_dir / REPORT_HTML, to_html(blocks, title=_title(records, run)).encode("utf-8")))
    return written + [image.path for group in images.values() for image in group]


ALLREDUCE_KEY = "all-reduce"  # the images of the all-reduce section


def draw_plots(rows: Sequence[Row], allreduce: Sequence[AllReduceRecord], run_dir: Path) -> dict[str, list[Image]]:
    """Per model: throughput, speedup, scaling with device count (with three or more device
    counts) and (with --breakdown) time-breakdown plots; and the all-reduce bandwidth plot
    when the run measured it."""
    from xbench.report.drawing import save
    from xbench.report.plots import breakdown_figure, busbw_figure, scaling_figure, speedup_figure, throughput_figure

    images: dict[str, list[Image]] = {}
    for model in _models(rows):
        mine = [r for r in full_rows(rows) if r.model == model]
        images[model] = []
        for kind, draw in (("throughput", throughput_figure), ("speedup", speedup_figure),
                           ("scaling", scaling_figure), ("breakdown", breakdown_figure)):
            figure = draw(mine, model)
            if figure is not None:
                path = save(figure, run_dir / f"{kind}-{_safe(model)}.png")
                images[model].append(Image(path, f"{kind} of model {model}"))
    figure = busbw_figure(ok_results(allreduce))
    images[ALLREDUCE_KEY] = [Image(save(figure, run_dir / "allreduce-busbw.png"), "all-reduce busbw")] if figure else []
    return images





def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def build_report(records: Sequence[Record], run: RunInfo | None,
                 rows: Sequence[Row], images: Mapping[str, list[Image]],
                 allreduce: Sequence[AllReduceRecord] = (), run_dir: Path | None = None) -> list[Block]:
    blocks: list[Block] = [Heading(_title(records, run), 1)]
    if run:
        blocks.append(Paragraph(f"Command: `{run.get('command', '?')}` — started {run.get('started_at', '?')}."))
        if run.get("devices_left_out"):
            blocks.append(Paragraph(left_out_line(run["devices_left_out"], run["spec"]["devices"]) + "."))
    blocks += incomplete_section(run, run_dir)
    blocks += bottom_line_section(rows, read_controls(run_dir) if run_dir is not None else ())
    blocks += environment_section(records)
    blocks += verification_section(records, run_dir)
    busbw = busbw_by_size(allreduce)
    for model in _models(rows):
        blocks += model_section(model, [r for r in rows if r.model == model], images.get(model, []), busbw)
    blocks += allreduce_section(allreduce, images.get(ALLREDUCE_KEY, []))
    blocks += problems_section(rows)
    blocks += reading_section(rows)
    return blocks


def incomplete_section(run: RunInfo | None, run_dir: Path | None) -> list[Block]:
    """A run that did not finish says so first: how many of its planned trial replicates
    (run.json's "planned" ids) have a record, which have none, by backend and devices, and the
    command that runs them. A row held back (does not fit, verification failed) or failed has
    its record, and its reason in the tables: the run decided it."""
    planned = run.get("planned") if run is not None else None
    if run_dir is None or not isinstance(planned, list) or not planned:
        return []
    done = recorded_trials(run_dir)
    missing = [str(trial_id) for trial_id in planned if trial_id not in done]
    if not missing:
        return []
    counts: dict[str, dict[str, int]] = {}
    for trial_id in missing:
        backend, _, devices, *_ = [*trial_id.split("/"), "", ""]
        per_devices = counts.setdefault(backend, {})
        per_devices[devices.lstrip("d")] = per_devices.get(devices.lstrip("d"), 0) + 1
    which = ", ".join(f"{backend} (" + ", ".join(f"{n} device{'' if n == '1' else 's'}: {count}"
                                                 for n, count in sorted(found.items())) + ")"
                      for backend, found in counts.items())
    words = str(cast(Mapping[str, Any], run).get("command", "")).split()
    command = words[1] if len(words) > 1 and words[1] in ("compare", "sweep") else "compare"
    return [Heading("Incomplete run"), Paragraph(
        f"**This run is incomplete:** {len(planned) - len(missing)} of its {len(planned)} planned trial replicates "
        f"have a result; {len(missing)} have none (never started, or stopped before they ended): {which}. The "
        f"tables and the bottom line below cover only what ran. `xbench {command} --resume {run_dir}` runs the rest.")]


def bottom_line_section(rows: Sequence[Row], controls: Sequence[Mapping[str, Any]] = ()) -> list[Block]:
    """What the reader came for, first: the same sentences `xbench compare` ends with."""
    found = bottom_line(rows, controls)
    if not found:
        return []
    blocks: list[Block] = [Heading("Bottom line")]
    for item in found:
        blocks += [Heading(f"Model {item.model}", 3), Bullets(item.sentences)]
    return blocks


def environment_section(records: Sequence[Record]) -> list[Block]:
    env = records[0]["environment"] if records else {}
    gpus = env.get("gpus") or []
    items = [
        f"Host {env.get('host', '?')}, {env.get('os', '?')}, Python {env.get('python', '?')}, "
        f"xbench {env.get('xbench', '?')}",
        f"CPU: {env.get('cpu', '?')} ({env.get('cpu_count', '?')} logical cores), "
        f"memory {env.get('memory_gib', '?')} GiB",
        "GPUs: " + ("; ".join(f"{g.get('index')}: {g.get('name')}, driver {g.get('driver_version')}, "
                              f"{g.get('memory.total')}" for g in gpus) if gpus else "none found by nvidia-smi"),
    ]
    if len(gpus) > 1:  # a CPU, or one GPU, has no GPU-to-GPU links to describe
        items += _links(env)
    for backend, info in _devices_by_backend(records).items():
        kind = ("simulated CPU devices (one CPU split; not a multi-GPU measurement)" if info["simulated"]
                else f"{info['platform'].upper()}: {', '.join(info['device_names'])}")
        items.append(f"Backend `{backend}`: {info['framework']} {info['framework_version']} on {kind}")
    busy = busy_host(records)
    if busy is not None:
        items.append(busy_text(busy))
    return [Heading("Environment"), Bullets(tuple(items))]


def _links(env: Mapping[str, Any]) -> list[str]:
    """The GPU-to-GPU links: nvidia-smi's matrix, and what the run's collectives were allowed."""
    items = []
    matrix = ((env.get("gpu_topology") or {}).get("matrix")) or {}
    if matrix.get("available"):
        pairs = [f"{a}–{b}: {matrix['links'][a][b]}" for i, a in enumerate(matrix["gpus"])
                 for b in matrix["gpus"][i + 1:]]
        items.append("GPU links (nvidia-smi topo -m): " + ", ".join(pairs))
    said = notes(env.get("links") or {})
    return items + (said or (["GPU-to-GPU links: the machine's own (P2P on)"] if env.get("links") else []))


def verification_section(records: Sequence[Record], run_dir: Path | None = None) -> list[Block]:
    outcome: dict[str, VerificationOutcome] = {}
    for record in records:  # a record without one (xbench verify's own) says "unknown"
        trial = record["trial"]
        name = implementation(trial["backend"], trial["variant"], trial["program"])
        outcome.setdefault(name, record.get("verification") or {"status": "unknown"})
    items = []
    for backend, result in outcome.items():
        status = result.get("status", "unknown")
        detail = {"passed": f"{result.get('checks', 0)} checks passed",
                  "skipped": result.get("reason", ""),
                  "unverifiable": result.get("reason", "")}.get(status, "; ".join(result.get("failed", [])))
        items.append(f"`{backend}`: {status}" + (f" — {detail}" if detail else ""))
    stored = read_verify(run_dir)
    cost = verification_cost(run_dir, records, stored)
    return [Heading("Identical work"), Paragraph(_what_was_checked(records, stored) + (f" {cost}" if cost else "")),
            Bullets(tuple(items))]


CHECKS = ("Before timing, xbench checks that each backend starts from the same weights, computes the same "
          "gradients{across}, and trains the same way (details in verify.json).")


def read_verify(run_dir: Path | None) -> dict[str, Any] | None:
    """verify.json of a run directory, or None where there is none or it cannot be read."""
    try:
        stored = json.loads((run_dir / VERIFY_FILE).read_text(encoding="utf-8")) if run_dir else None
    except (OSError, ValueError):
        return None
    return stored if isinstance(stored, dict) else None


def _what_was_checked(records: Sequence[Record], stored: Mapping[str, Any] | None) -> str:
    """What verification checked: nothing under --no-verify; the 1-vs-N-device check only where
    verify.json holds a check of a run on more than one device (else, without one, where a
    configuration ran on more than one device)."""
    if records and all(_unverified(r) for r in records):
        return ("This run timed its programs without verifying them first (--no-verify): nothing here checks "
                "that they did the same work.")
    checked = _checked_on_many_devices(stored)
    if checked is None:
        checked = any(r["trial"]["devices"] > 1 and r.get("status") == "ok" for r in records)
    if checked:
        return CHECKS.format(across=" on 1 and N devices")
    return CHECKS.format(across="") + (" No run on more than one device was verified, so the check that N devices "
                                       "compute what 1 does did not run.")


def _unverified(record: Record) -> bool:
    """Whether a record was timed under --no-verify (`verify_phase.unverified`'s reason)."""
    outcome: Mapping[str, Any] = record.get("verification") or {}
    return outcome.get("reason") == NO_VERIFY


def _checked_on_many_devices(stored: Mapping[str, Any] | None) -> bool | None:
    """Whether verify.json holds a check of a run on more than one device (its checks' keys:
    [program, devices, model]); None where there is no readable verify.json."""
    checks = stored.get("checks") if stored is not None else None
    if not isinstance(checks, list):
        return None
    return any(isinstance(key, list) and len(key) > 1 and isinstance(key[1], int) and key[1] > 1
               for check in checks if isinstance(check, dict) for key in check.get("keys") or [])


def verification_cost(run_dir: Path | None, records: Sequence[Record],
                      stored: Mapping[str, Any] | None = None) -> str:
    """The verification's wall time (verify.json's, `stored` where the caller read it) beside
    the timing's (from the first timed trial's start to the last one's end), and its largest
    run's framework peak memory beside the timed programs' (GPUs); "" where verify.json does
    not say."""
    stored = stored if stored is not None else read_verify(run_dir)
    if stored is None or not isinstance(stored.get("wall_s"), (int, float)):
        return ""
    wall = stored["wall_s"]
    stamps = [(r["started_at"], r["finished_at"]) for r in records if r.get("started_at") and r.get("finished_at")]
    said = f"Verification took {duration(wall)}"
    if stamps:
        timing = (datetime.fromisoformat(max(f for _, f in stamps)) - datetime.fromisoformat(min(s for s, _ in stamps)))
        said += f", timing {duration(timing.total_seconds())}"
    return said + _memory_beside_timing(stored.get("memory"), records) + "."


def _memory_beside_timing(memory: Any, records: Sequence[Record]) -> str:
    """"; its largest run held 12.1 GiB on a device, the timed programs' largest 30.2 GiB"
    (frameworks' own peaks), or "" where verification recorded none."""
    peaks = memory.get("peak_bytes") if isinstance(memory, dict) else None
    if not isinstance(peaks, dict) or not peaks:
        return ""
    timed = [peak for r in records if (held := r.get("telemetry", {}).get("framework_memory"))
             for peak in held.get("peak_bytes") or ()]
    said = f"; its largest run held {max(peaks.values()) / 2**30:.1f} GiB on a device"
    return said + (f", the timed programs' largest {max(timed) / 2**30:.1f} GiB" if timed else "")


def model_section(model: str, rows: Sequence[Row], images: Sequence[Image], busbw: Busbw) -> list[Block]:
    facts = model_facts(rows)
    measured = [row for row in full_rows(rows) if row.throughput is not None]
    blocks: list[Block] = [Heading(f"Model {model}" + (f" ({facts})" if facts else ""))]
    if measured:
        blocks.append(TableBlock(result_headers(rows), tuple(result_cells(row) for row in measured),
                                 right_aligned=NUMERIC_COLUMNS))
        blocks += fastest_section(model, rows)
        blocks += replicates_section(model, [row for row in rows if row.throughput is not None])
    else:
        blocks.append(Paragraph("No trial of this model finished."))
    costs = cost_columns(rows, busbw)
    if costs is not None:
        blocks += [Heading(f"Where the time goes, model {model}", 3),
                   TableBlock(costs.headers, costs.rows, right_aligned=frozenset(range(1, len(costs.headers)))),
                   Bullets(costs.notes)]
    return blocks + list(images)


def fastest_section(model: str, rows: Sequence[Row]) -> list[Block]:
    found = fastest_rows(rows)
    if not found:
        return []
    kinds = both_kinds(found)
    headers = fastest_headers(rows, kinds)
    words = {"fastest", "fastest as written", PROGRAMS, TIED}  # the rest are numbers: aligned right
    return [Heading(f"Fastest per configuration, model {model}", 3),
            TableBlock(headers, tuple(fastest_cells(f, kinds) for f in found),
                       right_aligned=frozenset(i for i, header in enumerate(headers) if header not in words))]


REPLICATE_HEADERS = ("program", "dev", "batch", "replicate means (samples/s)", "between / within sd",
                     "ANOVA p", "windows", "stopped", "unstable")


def replicates_section(model: str, rows: Sequence[Row]) -> list[Block]:
    """Each configuration's replicates: their means, the two variance components (as relative
    standard deviations), and the test behind the unstable label."""
    lines = []
    for row in rows:
        t = row.measured
        stopped = sorted({r.stopped for r in row.replicates if r.stopped})
        lines.append((row.label + ("" if row.all_reduce else " (compute-only)"), str(row.devices),
                      str(row.global_batch), ", ".join(f"{m:,.0f}" for m in t.means), spread_text(row),
                      "" if t.anova_p != t.anova_p else format_p(t.anova_p).removeprefix("p="),
                      str(t.windows), ", ".join(stopped), "yes" if t.unstable else ""))
    return [Heading(f"Replicates, model {model}", 3),
            TableBlock(REPLICATE_HEADERS, tuple(lines), right_aligned=frozenset({1, 2, 5, 6})),
            Bullets(("between / within sd: the standard deviation between replicates (after the window noise in "
                     "their means is taken out) and of windows within a replicate, both over the mean; stopped: "
                     "why replicates ended their windows (repeats, target_ci: steady enough, window_budget_s).",))]


def allreduce_section(records: Sequence[AllReduceRecord], images: Sequence[Image]) -> list[Block]:
    if not ok_results(records):
        return []
    return [Heading("All-reduce"),
            Paragraph("Each backend's own all-reduce (float32 SUM) of the models' gradient bytes and a sweep of "
                      "sizes, timed like a training step."),
            TableBlock(ALLREDUCE_HEADERS, tuple(allreduce_rows(records)), right_aligned=frozenset(range(2, 8))),
            Bullets((ALLREDUCE_NOTE,)),
            *images]


def problems_section(rows: Sequence[Row]) -> list[Block]:
    problems = tuple((r.trial_id, DOES_NOT_FIT if does_not_fit(r) else r.status, r.reason or "")
                     for r in rows if r.throughput is None)
    if not problems:
        return []
    return [Heading("Trials without a result"), TableBlock(("trial", "status", "reason"), problems)]


def reading_section(rows: Sequence[Row]) -> list[Block]:
    modes = " and ".join(sorted({r.scaling_mode for r in rows})) or "strong"
    return [Heading("How to read this"), Bullets((
        *READING_NOTES,
        f"Scaling is {modes}: strong splits a fixed global batch across devices; weak keeps the per-device "
        "batch.",
    ))]


def _title(records: Sequence[Record], run: RunInfo | None) -> str:
    run_id = (run["run_id"] if run else None) or (records[0]["run_id"] if records else "?")
    return f"xbench report: run {run_id}"


def _models(rows: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(r.model for r in rows))


def _devices_by_backend(records: Sequence[Record]) -> dict[str, StoredDeviceInfo]:
    """The widest device set each backend used."""
    found: dict[str, StoredDeviceInfo] = {}
    for record in records:
        info = record.get("devices")
        backend = record["trial"]["backend"]
        if info and (backend not in found or len(info["device_names"]) > len(found[backend]["device_names"])):
            found[backend] = info
    return found

