"""The verification phase of a run: identical work checked before timing (`verification`
runs the reference runs), verify.json written, and each program's outcome as its records carry
it; or why a run goes unverified."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from xbench.results.checks import verification_precision
from xbench.results.full_size import sizes_checked
from xbench.results.records import RECORDS_FILE, iter_records, read_run, write_json
from xbench.results.schema import NO_VERIFY, VERIFY_FILE
from xbench.run.comparison import Comparison, Observer
from xbench.run.launcher import VISIBLE_GPUS
from xbench.run.verification import Progress as VerificationProgress
from xbench.run.verification import Verification, checks_as_dicts, verify
from xbench.run.zygote import ForkServers


def verify_backends(comparison: Comparison, environment: dict[str, Any],
                    progress: VerificationProgress | None = None, servers: ForkServers | None = None
                    ) -> Verification:
    """Check identical work and real all-reduces for the backends and device counts about to
    be timed (`progress` hears of each reference run), in workers forked from the run's
    `servers` (None: servers of its own); writes verify.json. Arrays stay in a temporary
    directory."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="xbench-verify-") as tmp:
        result = verify(comparison.spec, comparison.entries, comparison.spec.devices, Path(tmp),
                        environment, progress, log_dir=comparison.run_dir, launch=comparison.launch,
                        launchers=comparison.launchers, parallel=parallel_verification(comparison.devices),
                        spread=gpus_to_spread(comparison.devices),
                        lineups=comparison.lineups, startup_timeout_s=comparison.startup_timeout_s,
                        device_info=comparison.devices, fork_servers=servers)
    write_json(comparison.run_dir / VERIFY_FILE, {
        "checks": checks_as_dicts(result.checks),
        "problems": result.problems,
        "failed_backends": sorted(result.failed),
        "rounding_floors": [{"backend": b, "model": m, "floor": f} for (b, m), f in sorted(result.floors.items())],
        "no_floor": [{"backend": b, "model": m, "why": why} for (b, m), why in sorted(result.no_floor.items())],
        "floor_of": result.floor_of,  # a variant of the same formula -> the program whose float64 run stands for it
        "precision_floors": [{"backend": b, "model": m, "precision": p, "gradients": start, "training": steps}
                             for (b, m, p), (start, steps) in sorted(result.precision_floors.items())],
        "unverifiable": result.unverifiable,
        "not_probed": result.not_probed,
        "probe_of": result.probe_of,  # a variant of the same formula -> the program whose full-size probe stands for it
        "shares_unchecked": list(result.shares_unchecked),
        "sizes_checked": [sizes_checked(m, comparison.spec.devices, verification_precision(m))
                          for m in comparison.spec.models],
        "outcomes": {name: result.outcome(name) for name in comparison.implementations},
        "kernel_settings": result.settings,
        # trial id -> its framework's peak bytes on a device; each worker's share where GPUs were shared
        "memory": {"peak_bytes": result.memory_peaks, "share": result.memory_share},
        "wall_s": round(time.monotonic() - started, 1),  # the report sets it beside the timing's
    })
    return result


GPU_WORKERS_PER_GPU = 8  # verification workers that may share one GPU (see parallel_verification)


def parallel_verification(devices: Mapping[str, Mapping[str, Any]]) -> int:
    """Worker processes that may verify at once: verification is not timed, so the backends and
    device counts run side by side, one per two cores (most of a verification worker's time is
    the framework's import and compilation, on the host, a few threads each), and at most
    `GPU_WORKERS_PER_GPU` per GPU: on one H200, GPT-2 small and ResNet-50 workers held 26 GiB
    four at a time and at most 12.6 GiB alone, so eight stay within a GPU's memory;
    `verification.verify` lowers it further where the largest run's estimated memory says so.
    Simulated CPU devices share the host's cores, so there at most one per core: their
    collectives wait for each other, and deadlock."""
    cores = os.cpu_count() or 1
    if any(info["simulated"] for info in devices.values()):
        return max(1, min(2, cores))
    gpus = max((int(info.get("available", 1)) for info in devices.values()
                if info.get("platform") == "gpu"), default=1)
    return max(1, min(GPU_WORKERS_PER_GPU * max(1, gpus), cores // 2))


def gpus_to_spread(devices: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The GPUs verification's side-by-side jobs start on in turn: those this process sees
    (the user's CUDA_VISIBLE_DEVICES, else as many as the backends found), where there are
    real GPUs and more than one; else none (simulated devices, one GPU, CPUs)."""
    gpus = [info for info in devices.values() if info.get("platform") == "gpu" and not info.get("simulated")]
    count = max((int(info.get("available", 0)) for info in gpus), default=0)
    if count < 2:
        return ()
    visible = [g.strip() for g in os.environ.get(VISIBLE_GPUS, "").split(",") if g.strip()]
    return tuple(visible[:count]) if visible else tuple(str(i) for i in range(count))


def unverified(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def failed_verification(run_dir: Path) -> list[str]:
    """The programs verify.json says failed (none without one: a --no-verify run)."""
    try:
        saved = json.loads((run_dir / VERIFY_FILE).read_text(encoding="utf-8"))
        return [str(name) for name in saved.get("failed_backends", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def started_without_verify(run_dir: Path) -> bool:
    """Whether a run was started with --no-verify: run.json says so, or (a run from before it
    did) its records were timed unverified for that reason."""
    saved = read_run(run_dir)
    if "no_verify" in saved:
        return saved["no_verify"] is True
    if not (run_dir / RECORDS_FILE).exists():
        return False
    return any(r.get("verification") == unverified(NO_VERIFY) for r in iter_records(run_dir / RECORDS_FILE))


def verifies(run_dir: Path, implementations: Collection[str], no_verify: bool, resumed: bool) -> bool:
    """Whether a run verifies before timing: not with --no-verify, and a resumed run not when
    its start was --no-verify (its rest is not verified either) or its start's verification
    finished (`saved_outcomes`: not repeated)."""
    if no_verify:
        return False
    return not resumed or not (started_without_verify(run_dir) or saved_outcomes(run_dir, implementations) is not None)


def saved_outcomes(run_dir: Path, implementations: Collection[str]) -> dict[str, dict[str, Any]] | None:
    """Each program's outcome as the run's verify.json keeps it, when it holds every one of
    `implementations` (a verification that finished before the run was interrupted); else None."""
    try:
        saved = json.loads((run_dir / VERIFY_FILE).read_text(encoding="utf-8")).get("outcomes")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(name), dict) for name in implementations):
        return None
    return {name: saved[name] for name in implementations}


def verification_outcome(comparison: Comparison, environment: dict[str, Any], observer: Observer,
                         no_verify: bool, resumed: bool = False, servers: ForkServers | None = None
                         ) -> dict[str, dict[str, Any]]:
    if comparison.launch.multi_node and not no_verify:
        observer.note("verify is not run across nodes; run `xbench verify --launcher spmd` on one node")
        return {name: unverified("multi-node run: run xbench verify on one node")
                for name in comparison.implementations}
    if no_verify:
        return {name: unverified(NO_VERIFY) for name in comparison.implementations}
    # A resumed run times the programs its start verified: the spec and devices are the same
    # (run.json), so the verification would be repeated to the same end (minutes for large models).
    saved = saved_outcomes(comparison.run_dir, comparison.implementations) if resumed else None
    if saved is not None:
        observer.note(f"verification: as the run's start found it ({VERIFY_FILE}); not repeated")
        observer.verified(saved)
        return saved
    with observer.verifying("verifying identical work and all-reduce (skip with --no-verify)") as progress:
        verification = verify_backends(comparison, environment, progress, servers)
    outcome = {name: verification.outcome(name) for name in comparison.implementations}
    observer.verified(outcome)
    return outcome
