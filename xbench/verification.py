"""Run verification through worker processes and gather the checks (see xbench.verify)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xbench import launcher
from xbench.cluster import Launch
from xbench.contract import implementation_of
from xbench.plan import Lineup, group_trials
from xbench.registry import BackendEntry
from xbench.spec import Spec
from xbench.verify import (
    Check, compared_in_float64, failed_backends, is_referee, load_reference, referee_checks, rounding_floors,
    run_checks, verification_precision, verification_trials,
)


@dataclass(frozen=True)
class Verification:
    # Backends are named with their variant and program here ("torch+compile", "jax plain"):
    # each is verified, and blamed, on its own.
    checks: tuple[Check, ...]
    problems: dict[str, str]  # trial id -> why it produced no reference
    problem_backends: frozenset[str]  # a verification trial failed, crashed or timed out
    unverifiable: dict[str, str]  # backend -> which capability it lacks
    owners: dict[str, str] = field(default_factory=dict)  # trial id of a problem -> its backend
    floors: dict[tuple[str, str], float] = field(default_factory=dict)  # (implementation, model) -> rounding floor
    no_floor: dict[tuple[str, str], str] = field(default_factory=dict)  # (implementation, model) -> why none

    @property
    def failed(self) -> set[str]:
        """Backends a failed check or a failed verification trial implicates."""
        return failed_backends(self.checks) | set(self.problem_backends)

    def outcome(self, backend: str) -> dict[str, Any]:
        """The verification summary stored in each of the backend's (implementation's) records."""
        mine = [c for c in self.checks if backend in c.backends]
        if backend in self.unverifiable and backend not in self.failed:
            return {"status": "unverifiable", "reason": self.unverifiable[backend], "checks": 0, "failed": []}
        return {
            "status": "failed" if backend in self.failed else "passed",
            "checks": len(mine),
            "failed": [f"{c.check} ({c.subject}): rel {c.norm_rel:.2e} > {c.tolerance:.1e}"
                       for c in mine if not c.passed]
                      + [f"{tid}: {why}" for tid, why in self.problems.items() if self.owners.get(tid) == backend],
        }


def verify(spec: Spec, entries: Sequence[BackendEntry], devices: Sequence[int], work_dir: Path,
           environment: dict[str, Any], listener: launcher.Listener | None = None,
           log_dir: Path | None = None, launch: Launch | None = None,
           launchers: Mapping[str, str] | None = None, parallel: int = 1,
           lineups: Mapping[str, Lineup] | None = None,
           startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S) -> Verification:
    """Run every backend's reference steps on 1 and each of `devices` devices, then check.

    Arrays go to `work_dir` (tens of MB for large models: use a temporary directory);
    worker output goes to `log_dir`/workers.log (default `work_dir`). Up to `parallel` worker
    processes run at once (nothing here is timed)."""
    names = [e.name for e in entries]
    trials = verification_trials(spec, names, devices, launchers, lineups)
    records: list[dict[str, Any]] = []
    ctx = launcher.Context(run_id="verify", run_dir=log_dir or work_dir, environment=environment,
                           write=records.append, job_extra={"mode": "verify", "arrays_dir": str(work_dir)},
                           launch=launch or Launch(), startup_timeout_s=startup_timeout_s)
    if listener is not None:
        ctx.listener = listener
    launcher.run_groups(group_trials(trials, {e.name: e.target for e in entries}), ctx, parallel)
    runs = _sorted_records(records)
    reference = next((n for n in names if n not in runs.unverifiable), names[0])
    per_device = {m.name for m in spec.models if m.kind.batch_statistics}
    float64 = {m.name for m in spec.models if verification_precision(m) == "fp64"}
    floors, rejected = rounding_floors(runs.refs, runs.referees)
    float64_checks = referee_checks({key: runs.referees[key] for key in floors}, reference)
    checks = run_checks(runs.refs, reference_backend=reference, per_device_statistics=per_device,
                        float64=float64, floors=floors, compared=compared_in_float64(float64_checks))
    no_floor = {key: why for key, why in {**runs.no_referee, **rejected}.items() if key[0] not in runs.unverifiable}
    return Verification(tuple(checks + float64_checks), runs.problems, frozenset(runs.owners.values()),
                        runs.unverifiable, runs.owners, floors, no_floor)


@dataclass
class _Runs:
    """The verification records sorted: fp32 (or the family's precision) references, float64
    referees, and what failed or could not run."""

    refs: dict = field(default_factory=dict)  # (implementation, devices, model) -> Reference
    referees: dict = field(default_factory=dict)  # (implementation, model) -> its float64 Reference
    no_referee: dict = field(default_factory=dict)  # (implementation, model) -> why its float64 run failed
    problems: dict = field(default_factory=dict)  # trial id -> why it produced no reference
    owners: dict = field(default_factory=dict)  # trial id of a problem -> its implementation
    unverifiable: dict = field(default_factory=dict)  # implementation -> the capability it lacks


def _sorted_records(records: Sequence[dict[str, Any]]) -> _Runs:
    runs = _Runs()
    for record in records:
        name, status = implementation_of(record["trial"]), record["status"]
        model = record["trial"]["model"]["name"]
        if is_referee(record["trial"]):
            if status == "ok":
                runs.referees[(name, model)] = load_reference(Path(record["arrays"]))
            elif status != "skipped":
                runs.no_referee[(name, model)] = f"{status}: {record['reason']}"
        elif status == "ok":
            runs.refs[(name, record["trial"]["devices"], model)] = load_reference(Path(record["arrays"]))
        elif status == "unsupported":
            runs.unverifiable[name] = record["reason"]
        elif status != "skipped":  # skipped: devices this machine lacks (their timing is skipped too)
            runs.problems[record["trial_id"]] = f"{status}: {record['reason']}"
            runs.owners[record["trial_id"]] = name
    return runs


def checks_as_dicts(checks: Sequence[Check]) -> list[dict[str, Any]]:
    return [{**asdict(c), "passed": c.passed} for c in checks]
