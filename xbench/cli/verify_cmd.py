"""`xbench verify`: prove that every backend does the same work and really all-reduces."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from xbench.cli.consoles import data_console, status_console
from xbench.cli.options import (
    LauncherOption,
    P2pOption,
    Platform,
    SingleDeviceOption,
    StartupTimeoutOption,
    VariantsOption,
    integers,
    names,
    p2p_value,
    startup_timeout_s,
    value,
)
from xbench.cli.progress import watching_verification
from xbench.errors import XbenchError
from xbench.experiment import load_spec
from xbench.report.verify_text import (
    checks_table,
    floors_caption,
    memory_caption,
    precision_floors_caption,
    probes_caption,
    verify_caption,
)
from xbench.results.links import links_record, notes
from xbench.run import links
from xbench.run.cluster import resolve_launch
from xbench.run.environment import host_environment
from xbench.run.readiness import ready_with_fork_servers
from xbench.run.verification import verify as run_verification
from xbench.run.verify_phase import gpus_to_spread, parallel_verification


def verify(
    backends: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Backends to check; the first is the reference (default: every installed "
                                "one).")] = None,
    config: Annotated[Optional[Path], typer.Option(
        metavar="TOML", help="Experiment spec for models, seed, options (default: configs/quick.toml's).")] = None,
    model: Annotated[Optional[list[str]], typer.Option(
        metavar="NAME...", help="Models to check (default: all in the spec).")] = None,
    devices: Annotated[Optional[list[str]], typer.Option(
        metavar="INT...", help="Device counts to check against 1 device, e.g. 2 (default: the spec's, 1 2).")] = None,
    platform: Annotated[Optional[Platform], typer.Option(
        help="auto: GPUs when present, else simulated CPU devices (default auto).")] = None,
    seed: Annotated[Optional[int], typer.Option(metavar="INT", help="Seed for weights and data (default 0).")] = None,
    p2p: P2pOption = None,
    launcher: LauncherOption = None,
    variants: VariantsOption = None,
    single_device: SingleDeviceOption = None,
    startup_timeout: StartupTimeoutOption = None,
) -> int:
    """Check that every backend does identical work, without timing anything.

    Identical initial loss and gradients across backends, N-device = 1-device gradients, and
    agreeing 10-step training, with dropout off and strict fp32, for each backend's programs
    (data-parallel, plain) and the variants asked for. Exits 1 when a check fails or a backend
    cannot be verified (compare would time it anyway, marked so)."""
    startup = startup_timeout_s(startup_timeout)
    launch = resolve_launch(value(launcher) or "auto")
    if launch.multi_node:
        raise XbenchError(f"verify runs on one node, and this {launch.source} job spans {launch.nnodes}; "
                          "run it in a one-node step (e.g. srun -N1 xbench verify ...)")
    spec = load_spec(config, {"backends": names(backends), "models": names(model),
                              "devices": integers(devices, "--devices"), "platform": value(platform),
                              "seed": seed, "variants": names(variants), "single_device": value(single_device),
                              "p2p": p2p_value(p2p)})
    err = status_console()
    with tempfile.TemporaryDirectory(prefix="xbench-verify-") as tmp, links.applied(spec.p2p) as nccl:
        with err.status("finding devices for each backend…"):
            ready, servers = ready_with_fork_servers(spec, Path(tmp), launch=launch, startup_timeout_s=startup)
        entries = ready.entries
        environment = {**host_environment(), "links": links_record(spec.p2p, nccl, ready.devices, spec.devices)}
        for line in notes(environment["links"]):
            err.print(escape(line), soft_wrap=True)
        try:  # the verification workers fork from the servers that found the devices
            with watching_verification(err, "running each backend's reference steps") as progress:
                result = run_verification(spec, entries, spec.devices, Path(tmp), environment, progress,
                                          launch=launch, launchers=ready.launchers, lineups=ready.lineups,
                                          startup_timeout_s=startup, parallel=parallel_verification(ready.devices),
                                          spread=gpus_to_spread(ready.devices), device_info=ready.devices,
                                          fork_servers=servers)
        finally:
            if servers is not None:
                servers.close()
    console = data_console()
    console.print(checks_table(result.checks))
    err.print(verify_caption(spec, entries[0].name))
    floors = floors_caption(result.floors, result.no_floor, result.floor_of)
    for caption in (floors, precision_floors_caption(result.precision_floors), probes_caption(result.probe_of),
                    memory_caption(result.memory_peaks, result.memory_share)):
        if caption:
            err.print(escape(caption))
    if result.shares_unchecked:
        err.print(f"[yellow]each device's share of the batch went unchecked[/] for {', '.join(result.shares_unchecked)}"
                  " (their backends report no shard_losses)")
    for trial_id, why in result.not_probed.items():
        err.print(f"[yellow]{trial_id}[/]: {escape(why)}")
    for trial_id, why in result.problems.items():
        err.print(f"[red]{trial_id}[/]: {escape(why)}")
    # A variant or plain program that cannot run on this platform (CUDA graphs on a CPU) is
    # not run here, and so not timed either; a backend whose own program cannot be verified is.
    selected = {entry.name for entry in entries}
    unverifiable = {name: why for name, why in result.unverifiable.items() if name in selected}
    for backend, why in result.unverifiable.items():
        what = "cannot be verified" if backend in selected else "does not run here"
        err.print(f"[yellow]{backend} {what}[/]: {escape(why)}")
    if result.failed or unverifiable:
        bad = sorted(result.failed | set(unverifiable))
        err.print(f"[red]verification failed[/] for: {', '.join(bad)}")
        return 1
    err.print(f"[green]all {len(result.checks)} checks passed[/]")
    return 0
