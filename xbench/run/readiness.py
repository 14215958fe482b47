"""Readiness: a spec's backends checked and described before anything is written (their options,
launchers, variants and programs, the devices each finds and whether they agree), and the spec
resolved for this machine. `compare`, `verify`, `allreduce` and `sweep` all start here."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xbench.contract import (
    DATA_PARALLEL,
    PLAIN,
    ValidatesOptions,
    Variant,
    float32_softmax_of,
    fused_attention_of,
    launchers_of,
    programs_of,
    reduction_buffers_of,
    variants_of,
)
from xbench.errors import BackendError, XbenchError, brief
from xbench.experiment import ALL_VARIANTS, Spec, resolve_protocol
from xbench.run import launcher, links, probes, zygote
from xbench.run.cluster import Launch
from xbench.run.memory_check import pretended_memory_bytes
from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup
from xbench.run.registry import BackendEntry, discover, resolve
from xbench.run.worker_process import PER_WORKER, worker_environment
from xbench.run.zygote import ForkServers


def check_options(spec: Spec, entries: list[BackendEntry]) -> None:
    """Each backend validates its own [options.NAME] table, when it has a validator; a table
    for a backend that is not registered at all is a typo."""
    registered = discover()
    for name in spec.options:
        if name not in registered:
            raise BackendError(f"an [options.NAME] table names {brief(name)}, no registered backend; "
                               f"registered: {', '.join(registered)}")
    for entry in entries:
        options = dict(spec.options.get(entry.name, {}))
        if not isinstance(entry.backend, ValidatesOptions):
            if options:
                raise BackendError(f"backend {entry.name!r} takes no options, got {brief(', '.join(options))}")
            continue
        try:
            entry.backend.validate_options(options)
        except ValueError as err:
            raise BackendError(f"[options.{entry.name}]: {err}") from None


def probe_devices(entries: list[BackendEntry], platform: str, log_dir: Path,
                  startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S,
                  servers: ForkServers | None = None) -> dict[str, dict[str, Any]]:
    """Start one short worker per backend, all at once, to learn which devices it sees; each
    writes its output to log_dir/describe-NAME.log. With `servers` (the run's), each is forked
    from its backend's fork server, started here, which the run's workers then fork from too."""
    if servers is not None:  # all at once, from this thread, before any describing worker forks from them
        servers.start([e.target for e in entries], worker_environment(), PER_WORKER)

    answers = probes.describe_all([(e.target, log_dir / f"describe-{e.name}.log") for e in entries], platform,
                                  startup_timeout_s, servers)
    results = dict(zip((e.name for e in entries), answers))
    for name, answer in results.items():
        if "reason" in answer:
            raise BackendError(f"backend {name!r} cannot start on platform {platform!r}: {answer['reason']}")
    return {name: answer["device_info"] for name, answer in results.items()}


def check_device_counts(spec: Spec, devices: dict[str, dict[str, Any]]) -> None:
    """More devices than a backend can use is an error the user fixes with --devices."""
    for name, info in devices.items():
        too_many = [n for n in spec.devices if n > info["available"]]
        if too_many:
            kind = "simulated CPU" if info["simulated"] else info["platform"].upper()
            most = info["available"]
            hint = f"--devices 1,{most}" if most > 1 else "--devices 1"
            raise XbenchError(f"{max(too_many)} devices asked, but backend {name!r} has {most} "
                              f"{kind} device(s); use at most {most}, e.g. {hint}")


def choose_launchers(entries: Sequence[BackendEntry], launch: Launch) -> dict[str, str]:
    """Each backend's launcher: its preferred one under --launcher auto, else the one asked
    for, which the backend must support."""
    chosen = {}
    for entry in entries:
        supported = launchers_of(entry.backend)
        if launch.launcher == "auto":
            chosen[entry.name] = supported[0]
        elif launch.launcher in supported:
            chosen[entry.name] = launch.launcher
        else:
            raise XbenchError(f"backend {entry.name!r} cannot be started by --launcher {launch.launcher} "
                              f"(it supports: {', '.join(supported)})")
    return chosen


def choose_lineups(spec: Spec, entries: Sequence[BackendEntry]) -> dict[str, Lineup]:
    """Each backend's variants (as written first, then those `spec.variants` names, or all of
    them) and whether its plain program runs; a one-line error for a variant that names an
    unselected backend or one the backend lacks."""
    by_name = {entry.name: entry for entry in entries}
    wanted: dict[str, list[str]] = {name: [] for name in by_name}
    for item in spec.variants:
        if item == ALL_VARIANTS:
            for name, entry in by_name.items():
                wanted[name] += list(variants_of(entry.backend))
            continue
        backend, _, variant = item.partition(":")
        if backend not in by_name:
            raise XbenchError(f"variant {brief(item)} names backend {brief(backend)}, which this run does not time; "
                              f"add it to --backends or drop the variant")
        known = variants_of(by_name[backend].backend)
        if variant not in known:
            listed = ", ".join(known) or "none"
            program = "; plain is a program, not a variant: --single-device plain or both" if variant == PLAIN else ""
            raise XbenchError(f"backend {backend!r} has no variant {brief(variant)}; its variants: {listed}{program}")
        wanted[backend].append(variant)
    lineups = {}
    for name, entry in by_name.items():
        variants = variants_of(entry.backend)
        chosen = tuple(variants[w] for w in dict.fromkeys(wanted[name]))
        lineups[name] = Lineup(with_backend_memory((AS_WRITTEN_VARIANT, *chosen), entry),
                               single_device_programs(spec, entry))
        named = [variants[w] for w in wanted[name] if f"{name}:{w}" in spec.variants]
        _check_programs(name, named, lineups[name], spec.devices)
    return lineups


def _check_programs(backend: str, named: Sequence[Variant], lineup: Lineup, devices: Sequence[int]) -> None:
    """A variant asked for by name that applies to none of the programs this run times
    (`Variant.programs`) is an error, not a silent absence."""
    for variant in named:
        if not any(lineup.programs(n, variant) for n in devices):
            programs = " and ".join(variant.programs or ())
            raise XbenchError(f"variant {backend}:{variant.name} applies to the {programs} program, which this run "
                              "does not time (--single-device and --devices choose the programs: --single-device "
                              "both times each on 1 device); add them, or drop the variant")


def with_backend_memory(variants: tuple[Variant, ...], entry: BackendEntry) -> tuple[Variant, ...]:
    """The variants with what the backend declares of its programs' memory where they leave it
    to the backend (None): fused attention where its as-written attention is
    (`fused_attention_of`), a float32 softmax where its is (`float32_softmax_of`), and,
    unsharded, its reduction's buffers (`reduction_buffers_of`). None stays where the backend
    declares nothing, and means none."""
    fused = fused_attention_of(entry.backend)
    buffers = reduction_buffers_of(entry.backend)
    float32_softmax = float32_softmax_of(entry.backend)

    def given(v: Variant) -> Variant:
        return replace(v, fused_attention=True if fused and v.fused_attention is None else v.fused_attention,
                       reduction_buffers=buffers if buffers and not v.sharded and v.reduction_buffers is None
                       else v.reduction_buffers,
                       float32_softmax=True if float32_softmax and v.float32_softmax is None else v.float32_softmax)

    return tuple(given(v) for v in variants)


def single_device_programs(spec: Spec, entry: BackendEntry) -> tuple[str, ...]:
    """The programs a backend times on 1 device: the spec's choice, the data-parallel one
    where the backend has no plain program."""
    if PLAIN not in programs_of(entry.backend) or spec.single_device == DATA_PARALLEL:
        return (DATA_PARALLEL,)
    return (PLAIN,) if spec.single_device == PLAIN else (DATA_PARALLEL, PLAIN)


def check_spmd_devices(spec: Spec, launchers: Mapping[str, str], launch: Launch) -> None:
    """Under spmd every node runs the same share of each trial's ranks."""
    if "spmd" not in launchers.values():
        return
    for n in spec.devices:
        if n % launch.nnodes:
            raise XbenchError(f"{n} devices cannot be split evenly over {launch.nnodes} nodes; "
                              f"use device counts that {launch.nnodes} divides")
        if launch.nproc_per_node is not None and n // launch.nnodes > launch.nproc_per_node:
            raise XbenchError(f"{n} devices need {n // launch.nnodes} processes per node, more than "
                              f"--nproc-per-node {launch.nproc_per_node}")


def check_same_platform(devices: dict[str, dict[str, Any]]) -> None:
    """A comparison across frameworks means something only on the same kind of device."""
    kinds = {name: ("simulated CPU" if info["simulated"] else info["platform"]) for name, info in devices.items()}
    if len(set(kinds.values())) > 1:
        found = ", ".join(f"{name}: {kind}" for name, kind in kinds.items())
        raise XbenchError(f"the backends would run on different devices ({found}); use --platform cpu, "
                          "or install each framework's GPU build")


@dataclass(frozen=True)
class Ready:
    """The backends of a run, checked and described."""

    entries: list[BackendEntry]
    devices: dict[str, dict[str, Any]]  # backend name -> DeviceInfo as a dict (1-device worker)
    launchers: dict[str, str]  # backend name -> launcher
    lineups: dict[str, Lineup]  # backend name -> variants and programs


def ready_backends(spec: Spec, log_dir: Path, strict_devices: bool = True, launch: Launch | None = None,
                   startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S, servers: ForkServers | None = None) -> Ready:
    """The spec's backends, their options and launchers checked and their devices found
    (describe logs go to `log_dir`; workers forked from `servers`, see `probe_devices`);
    one-line errors for anything the user must change."""
    launch = launch or Launch()
    pretended_memory_bytes()  # read before any worker starts: a bad value is input to change
    entries = resolve(spec.backends)
    check_options(spec, entries)
    lineups = choose_lineups(spec, entries)
    launchers = choose_launchers(entries, launch)
    check_spmd_devices(spec, launchers, launch)
    devices = probe_devices(entries, spec.platform, log_dir, startup_timeout_s, servers)
    if strict_devices:
        check_device_counts(spec, {name: _per_node(info, launchers[name], launch) for name, info in devices.items()})
    check_same_platform(devices)
    return Ready(entries, devices, launchers, lineups)


def ready_with_fork_servers(spec: Spec, log_dir: Path, strict_devices: bool = True, launch: Launch | None = None,
                            startup_timeout_s: float = launcher.STARTUP_TIMEOUT_S, p2p: bool | None = None
                            ) -> tuple[Ready, ForkServers | None]:
    """`ready_backends` with the run's fork servers (None where they are off), started to find
    the devices and kept for the run's workers; the caller ends them (`ForkServers.close`),
    except where this raises. They start with NCCL's variables for `p2p` (default the spec's)
    in force, as the run's workers will have them (`links.applied`), so that those fork from
    them too. Each server's own output goes to log_dir's log (the caller copies it into the
    run's); what they note later goes wherever the caller points `ForkServers.log`."""
    servers = ForkServers(log_dir / launcher.LOG_FILE, startup_timeout_s) if zygote.enabled() else None
    with zygote.closed_on_error(servers), links.applied(spec.p2p if p2p is None else p2p):
        return ready_backends(spec, log_dir, strict_devices, launch, startup_timeout_s, servers), servers


def append_logs(log_dir: Path, run_log: Path, servers: ForkServers | None) -> None:
    """Append the logs of finding the devices (log_dir's files) to the run's log, and point the
    fork servers' later notes there; OSError where the run's log cannot be written."""
    with open(run_log, "a", encoding="utf-8") as log:
        for path in sorted(log_dir.iterdir()):
            log.write(path.read_text(encoding="utf-8", errors="replace"))
    if servers is not None:
        servers.log = run_log


def _per_node(info: dict[str, Any], launcher: str, launch: Launch) -> dict[str, Any]:
    """Device counts are per run; under multi-node spmd each node holds a share of them."""
    if launcher != "spmd" or launch.nnodes == 1:
        return info
    return {**info, "available": info["available"] * launch.nnodes}


def within_the_machine(spec: Spec, devices: Mapping[str, Mapping[str, Any]], launchers: Mapping[str, str],
                       launch: Launch) -> tuple[Spec, tuple[int, ...]]:
    """The spec without the device counts no backend here has, and those counts: for counts
    the user did not insist on (the default 1 and 2, a spec file's list), so that a 1-GPU
    machine plans, estimates and starts no 2-device run only to skip it. The smallest count
    stays whatever the machine has, so that its rows say why they cannot run."""
    most = max(_per_node(dict(info), launchers[name], launch)["available"] for name, info in devices.items())
    kept = tuple(n for n in spec.devices if n <= most) or (min(spec.devices),)
    return replace(spec, devices=kept), tuple(n for n in spec.devices if n not in kept)


def resolved(spec: Spec, devices: Mapping[str, Mapping[str, Any]], launch: Launch) -> Spec:
    """The spec with what it left open decided for this machine: replicates (GPUs vary most
    between processes) and the seed of the run order: random, so that independent runs do not
    share an order, except across the nodes of one run, which must agree on it."""
    gpu = any(not info["simulated"] for info in devices.values())
    order_seed = spec.seed if launch.multi_node else secrets.randbelow(2**31)
    return replace(spec, protocol=resolve_protocol(spec.protocol, gpu, order_seed))
