"""Memory per device as a result: the check before launching (the estimate against the device's
memory, replicated and sharded), the device memory it is checked against, a framework's
out-of-memory error turned into the same kind of row, and what tables and the bottom line say
of the rows that did not fit."""

from __future__ import annotations

import pytest

from tests.unit.test_bottom_line import record
from xbench.errors import XbenchError
from xbench.models.memory import GiB
from xbench.models.model_spec import preset_model
from xbench.report.bottom_line import bottom_line, fit_sentence
from xbench.report.export import flat_rows
from xbench.report.terminal import cost_columns, status_cell, unmeasured_line
from xbench.results.conditions import memory_gib, memory_is_bound
from xbench.results.fit import MARGIN, check, does_not_fit, fit_or_not, fit_words, measured_reason, out_of_memory
from xbench.results.summary import rows_from_records
from xbench.run.memory_check import MEMORY_VARIABLE, device_memory_bytes

GPT2 = preset_model("gpt2-small")


# -- the decision ------------------------------------------------------------------------------

def test_a_configuration_fits_below_the_device_less_the_margin_and_not_above():
    needed = check(GPT2, 8, 1, "bf16", False, None).estimate.total
    assert check(GPT2, 8, 1, "bf16", False, None).fits  # no device memory known: never held back
    assert check(GPT2, 8, 1, "bf16", False, int(needed / (1 - MARGIN)) + 1).fits
    tight = check(GPT2, 8, 1, "bf16", False, needed)  # fits the device exactly, not its margin
    assert not tight.fits
    assert tight.reason.startswith(f"does not fit: needs ~{needed / GiB:.3g} GiB per device, has ")
    assert "activations" in tight.reason and "5%" in tight.reason


def test_sharding_the_state_over_devices_makes_a_large_model_fit_where_replicas_do_not():
    model, capacity = preset_model("gpt2-xl"), 16 * GiB  # 1.56e9 parameters: 25 GiB of state replicated
    replicated = check(model, 2, 4, "bf16", False, capacity)
    sharded = check(model, 2, 4, "bf16", True, capacity)
    assert not replicated.fits and sharded.fits
    assert sharded.estimate.sharded and sharded.facts()["sharded"]
    # On one device a sharded program holds everything: no better than a replica.
    assert not check(model, 2, 1, "bf16", True, capacity).fits


def test_a_variant_that_recomputes_its_blocks_is_checked_with_fewer_activations():
    from xbench.contract import Variant
    from xbench.run.memory_check import memory_checks
    from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup

    capacity = 8 * GiB  # GPT-2 small at 8 sequences of 1,024 tokens: ~20 GiB kept, ~6 GiB recomputed
    assert not check(GPT2, 8, 1, "fp32", False, capacity).fits
    assert check(GPT2, 8, 1, "fp32", False, capacity, recompute=True).fits
    remat = Variant("remat", "blocks recomputed", recompute=True)
    trials = [_trial(GPT2, 8, variant) for variant in ("as-written", "remat")]
    lineup = Lineup(variants=(AS_WRITTEN_VARIANT, remat))
    found = memory_checks(trials, {"jax": lineup}, {"jax": {}}, {})
    kept, recomputed = (found[t.config_id].estimate for t in trials)
    assert recomputed.recompute and not kept.recompute and recomputed.total < kept.total


def test_a_fused_attention_kernel_is_checked_without_the_attention_probabilities():
    """A backend declares whether its as-written attention is fused; its variants inherit
    that unless they say otherwise (jax's cudnn), and the check follows the variant."""
    from xbench.contract import Availability, Variant
    from xbench.experiment import Spec
    from xbench.run.memory_check import memory_checks
    from xbench.run.readiness import choose_lineups
    from xbench.run.registry import BackendEntry

    class Fused:
        fused_attention = True
        variants = (Variant("compile", "compiled"), Variant("naive", "unfused", fused_attention=False))

    class Unfused:
        variants = (Variant("cudnn", "cuDNN attention", fused_attention=True),)

    installed = Availability(installed=True)
    entries = [BackendEntry("torch", "t:T", Fused(), installed), BackendEntry("jax", "j:J", Unfused(), installed)]
    spec = Spec(models=(GPT2,), variants=("torch:compile", "torch:naive", "jax:cudnn"))
    lineups = choose_lineups(spec, entries)
    flags = {(name, v.name): v.fused_attention for name, lineup in lineups.items() for v in lineup.variants}
    assert flags == {("torch", "as-written"): True, ("torch", "compile"): True, ("torch", "naive"): False,
                     ("jax", "as-written"): None, ("jax", "cudnn"): True}
    trials = [_trial(GPT2, 8, variant) for variant in ("as-written", "cudnn")]
    found = memory_checks(trials, lineups, {"jax": {}}, {})
    unfused, fused = (found[t.config_id].estimate for t in trials)
    assert fused.activations < unfused.activations


def test_a_backends_reduction_buffers_are_checked_for_its_replicated_data_parallel_programs():
    """A backend declares its data-parallel reduction's buffers (DDP's buckets); its unsharded
    variants carry them, its sharded ones and its plain program do not."""
    from dataclasses import replace

    from xbench.contract import PLAIN, Availability, Variant
    from xbench.experiment import Spec
    from xbench.run.memory_check import memory_checks
    from xbench.run.readiness import choose_lineups
    from xbench.run.registry import BackendEntry

    class Bucketed:
        reduction_buffers = 2
        float32_softmax = True
        programs = ("data-parallel", PLAIN)
        variants = (Variant("compile", "compiled"), Variant("fsdp", "sharded", sharded=True),
                    Variant("own", "says for itself", reduction_buffers=1, float32_softmax=False))

    entries = [BackendEntry("jax", "j:J", Bucketed(), Availability(installed=True))]
    lineups = choose_lineups(Spec(models=(GPT2,), variants=("jax:compile", "jax:fsdp", "jax:own")), entries)
    assert {v.name: (v.reduction_buffers, v.float32_softmax) for v in lineups["jax"].variants} == {
        "as-written": (2, True), "compile": (2, True), "fsdp": (None, True), "own": (1, False)}
    ddp, plain = _trial(GPT2, 8, "as-written"), replace(_trial(GPT2, 8, "as-written"), program=PLAIN)
    found = memory_checks([ddp, plain], lineups, {"jax": {}}, {})
    with_buffers, without = found[ddp.config_id].estimate, found[plain.config_id].estimate
    assert with_buffers.reduction == 2 * without.gradients and without.reduction == 0


def _trial(model, global_batch: int, variant: str):
    from dataclasses import replace

    from xbench.contract import Trial
    from xbench.contract.timing import TimingProtocol

    return Trial(backend="jax", model=replace(model, batch_sizes=(global_batch,)), devices=1,
                 global_batch=global_batch, scaling="strong", precision="fp32", platform="gpu", learning_rate=1e-3,
                 seed=0, samples=global_batch * 10, protocol=TimingProtocol(warmup_steps=0, steps=10, repeats=1),
                 variant=variant)


def test_the_per_device_batch_decides_under_strong_scaling():
    model = preset_model("medium")
    capacity = int(3e6 / (1 - MARGIN))  # medium at global batch 1024: ~4.5 MB on 1 device, ~2.6 MB on 2
    assert not check(model, 1024, 1, "fp32", False, capacity).fits
    assert check(model, 1024, 2, "fp32", False, capacity).fits


def test_an_unknown_precision_is_not_checked():
    assert check(GPT2, 8, 1, "fp8", False, GiB) is None


# -- the device memory checked against ---------------------------------------------------------

GPU = {"simulated": False, "platform": "gpu"}
H100S = {"gpus": [{"memory.total": "81559 MiB"}, {"memory.total": "81559 MiB"}]}


def test_device_memory_is_the_smallest_gpu_and_simulated_devices_are_not_checked(monkeypatch):
    monkeypatch.delenv(MEMORY_VARIABLE, raising=False)
    assert device_memory_bytes(GPU, H100S) == 81559 * 2**20
    assert device_memory_bytes(GPU, {"gpus": [{"memory.total": "[N/A]"}]}) is None
    assert device_memory_bytes({"simulated": True, "platform": "cpu"}, H100S) is None
    monkeypatch.setenv(MEMORY_VARIABLE, "0.5")
    assert device_memory_bytes({"simulated": True, "platform": "cpu"}, {}) == GiB // 2
    assert device_memory_bytes(GPU, H100S) == GiB // 2  # the variable wins: a smaller GPU, pretended


@pytest.mark.parametrize("value", ["lots", "0", "-2", "nan", "inf"])
def test_a_malformed_limit_is_one_line_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(MEMORY_VARIABLE, value)
    with pytest.raises(XbenchError, match=MEMORY_VARIABLE):
        device_memory_bytes(GPU, H100S)


# -- a framework's out-of-memory error ---------------------------------------------------------

@pytest.mark.parametrize("text, oom", [
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.", True),
    ("ResourceExhaustedError: OOM when allocating tensor with shape[64,1024] (resource exhausted)", True),
    ("worker exit code 1; last output: torch.OutOfMemoryError: CUDA out of memory", True),
    ("RuntimeError: planned failure", False), ("room for zoom", False), (None, False)])
def test_out_of_memory_is_matched_by_its_words(text, oom):
    assert out_of_memory(text) is oom


def failed(status, reason, devices=2, batch=128):
    return {**record("torch", devices, batch, 0, 0.01), "status": status, "reason": reason}


def test_an_out_of_memory_failure_becomes_a_does_not_fit_row_and_others_stay_failures():
    error = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    became = fit_or_not(failed("failed", error))
    assert became["status"] == "skipped"
    assert became["reason"] == f"does not fit: out of memory at batch 64 per device on 2 device(s) (measured): {error}"
    crashed = fit_or_not(failed("crashed", "worker exit code 1; last output: RESOURCE_EXHAUSTED: Out of memory"))
    assert crashed["status"] == "skipped" and crashed["reason"].startswith("does not fit: out of memory at batch 64")
    assert fit_or_not(failed("failed", "RuntimeError: planned failure"))["status"] == "failed"
    assert len(measured_reason(128, 2, "x" * 5000)) < 400  # a long error is clipped


# -- rows, tables and the bottom line ----------------------------------------------------------

def not_fitting(devices, batch, reason):
    return {**record("slow", devices, batch, 0, 0.01), "status": "skipped", "reason": reason}


def test_a_row_that_did_not_fit_says_so_and_the_bottom_line_names_the_fastest_that_fit():
    estimated = check(preset_model("medium"), 1024, 1, "fp32", False, 2 * 10**6)
    assert estimated is not None and not estimated.fits
    measured = measured_reason(1024, 2, "CUDA out of memory")
    records = ([record(b, d, 64, r, {"fast": 0.01, "slow": 0.02}[b] / d) for b in ("fast", "slow")
                for d in (1, 2) for r in range(3)]
               + [not_fitting(1, 1024, estimated.reason), not_fitting(2, 1024, measured)])
    rows = rows_from_records(records)
    missing = [r for r in rows if does_not_fit(r)]
    assert [(r.devices, r.global_batch) for r in missing] == [(1, 1024), (2, 1024)]
    assert status_cell(missing[0]) == "[yellow]does not fit[/]"
    assert unmeasured_line(missing[0]).startswith("slow/m/d1/b1024: does not fit: needs ~")
    assert fit_words(missing[1].reason) == "out of memory at batch 512 per device on 2 device(s)"
    sentence = fit_sentence(rows)
    assert sentence.startswith("Did not fit in device memory: slow on 1 device at batch 1,024 (needs ~")
    assert "slow on 2 devices at batch 1,024 (out of memory at batch 512 per device on 2 device(s))" in sentence
    assert ("Fit: fast (2 of 2 configurations), slow (2 of 4 configurations); the fastest of them is fast on 2 "
            "devices at batch 64 (") in sentence
    assert sentence in bottom_line(rows)[0].sentences
    assert fit_sentence([r for r in rows if not does_not_fit(r)]) == ""
    assert fit_sentence(missing).startswith("Nothing fit in device memory: ")


def test_the_cost_table_shows_the_estimate_beside_the_measured_peak():
    telemetry = {"framework_memory": {"peak_bytes": [3 * GiB, 5 * GiB]}, "devices": []}
    records = [{**record("fast", 1, 64, r, 0.01), "telemetry": telemetry,
                "memory": {"estimate_bytes": 4 * GiB, "capacity_bytes": 80 * GiB, "sharded": False}} for r in range(2)]
    columns = cost_columns(rows_from_records(records), {})
    assert columns is not None
    line = dict(zip(columns.headers, columns.rows[0]))
    assert (line["mem GiB"], line["est. GiB"]) == ("5.00", "4.00")
    assert any("est. GiB: xbench's estimate before launching" in note for note in columns.notes)


def test_a_trials_own_peak_wins_over_a_worker_processs_bound():
    """jax's counter covers its worker: a replicate whose trial set the process's peak says
    "trial"; another, run after a larger program in the same worker, only bounds it."""
    own = {"framework_memory": {"peak_bytes": [3 * GiB], "scope": "trial"}, "devices": []}
    bound = {"framework_memory": {"peak_bytes": [9 * GiB], "scope": "worker process"}, "devices": []}
    records = [{**record("fast", 1, 64, r, 0.01), "telemetry": t} for r, t in enumerate((own, bound))]
    [row] = rows_from_records(records)
    assert memory_gib(row) == 3.0
    assert not memory_is_bound(row)
    [row] = rows_from_records(records[1:])
    assert memory_gib(row) == 9.0 and memory_is_bound(row)  # no replicate knows better: the bound
    for rec in records:
        rec["trial"]["protocol"] = {"steps_per_call": 1}
    assert flat_rows(records[1:])[0]["memory_is_bound"] is True


def test_a_counter_that_names_no_scope_is_no_bound():
    """A backend whose counter says nothing of its scope claims neither (no "≤")."""
    plain = {"framework_memory": {"peak_bytes": [4 * GiB]}, "devices": []}
    [row] = rows_from_records([{**record("fast", 1, 64, 0, 0.01), "telemetry": plain}])
    assert memory_gib(row) == 4.0 and not memory_is_bound(row)


def test_a_bound_is_marked_in_the_cost_table():
    """A peak that only bounds the trial (a worker process's counter) reads "≤" in the table."""
    bound = {"framework_memory": {"peak_bytes": [9 * GiB], "scope": "worker process"}, "devices": []}
    records = [{**record("fast", 1, 64, r, 0.01), "telemetry": bound} for r in range(2)]
    columns = cost_columns(rows_from_records(records), {})
    assert columns is not None
    assert dict(zip(columns.headers, columns.rows[0]))["mem GiB"] == "≤9.00"


def test_export_has_the_estimate_beside_the_measured_peak():
    telemetry = {"framework_memory": {"peak_bytes": [3 * GiB, 5 * GiB]}, "devices": []}
    estimated = {"estimate_bytes": 4 * GiB, "capacity_bytes": 80 * GiB, "sharded": False}
    records = [{**record("fast", 1, 64, r, 0.01), "telemetry": telemetry, "memory": estimated} for r in range(2)]
    records.append(record("fast", 2, 64, 0, 0.01))  # launched without an estimate
    for rec in records:
        rec["trial"]["protocol"] = {"steps_per_call": 1}
    exported = {row["devices"]: row for row in flat_rows(records)}
    assert (exported[1]["memory_gib"], exported[1]["memory_estimate_gib"]) == (5.0, 4.0)
    assert list(exported[1]).index("memory_estimate_gib") == list(exported[1]).index("memory_gib") + 1
    assert exported[2]["memory_estimate_gib"] is None


def test_an_spmd_jobs_peak_is_the_trials_own_only_where_every_ranks_is():
    from xbench.worker.main import Ranks

    ranks = Ranks.__new__(Ranks)  # the gathering part only: rank 0 own, rank 1 a bound
    ranks.gather = lambda values: [values, [7.0 * GiB, 0.0]]
    mine = {"peak_bytes": [5 * GiB], "scope": "trial"}
    assert ranks.peaks(mine) == {"peak_bytes": [5 * GiB, 7 * GiB], "scope": "worker process"}
    ranks.gather = lambda values: [values, [7.0 * GiB, 1.0]]
    assert ranks.peaks(mine) == {"peak_bytes": [5 * GiB, 7 * GiB], "scope": "trial"}
