"""Verification that scales: the reduced instance verify trains, the full-size probe and its
summaries, and each device's share of the batch (xbench.results.full_size)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from xbench.contract import DATA_PARALLEL, PLAIN, Variant
from xbench.experiment import build_spec
from xbench.models.model_spec import preset_model
from xbench.report.verify_text import probes_caption
from xbench.results.checks import Check, verification_model
from xbench.results.full_size import (
    FULL_SIZE_REPLICATE,
    FULL_SIZE_TOLERANCES,
    full_size_checks,
    full_size_model,
    shard_checks,
    sizes_checked,
    summary_error,
    unreported_shares,
)
from xbench.run.plan import Lineup, plan_trials
from xbench.run.verification import _lent_failures
from xbench.run.verify_plan import lent_probes, probe_borrowers, verification_trials
from xbench.wire import Reference, load_reference, save_reference
from xbench.worker.capture import summarize


def probe(loss: float, gradients: list[np.ndarray], shards: dict | None = None) -> Reference:
    return Reference(loss, [], [], [], summaries=summarize(gradients), shard_losses=shards or {})


def gradients(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32),
            rng.standard_normal((32, 8)).astype(np.float32)]


def test_the_reduced_instance_keeps_width_and_caps_depth_and_length():
    gpt2 = preset_model("gpt2-small")
    reduced = dict(verification_model(gpt2, [1, 2]).dims)
    assert reduced == {**dict(gpt2.dims), "layers": 2, "context": 64}
    assert dict(verification_model(preset_model("resnet50"), [1, 2]).dims)["image"] == 32


def test_a_resnet_is_verified_at_two_blocks_a_stage_of_its_own_kind():
    """ResNet-50 trains as ResNet-26 (bottleneck blocks, a projection and an identity block in
    every stage), ResNet-34 as ResNet-18 (basic); the full-size probe keeps every block."""
    from xbench.models import cnn

    resnet50 = preset_model("resnet50")
    reduced = dict(verification_model(resnet50, [1, 2]).dims)
    assert reduced["depth"] == 26 and cnn.bottleneck(reduced)
    assert dict(full_size_model(resnet50, [1, 2]).dims)["depth"] == 50
    blocks = [conv.name.split(".")[:2] for conv in cnn.convolutions(reduced) if conv.name[1].isdigit()]
    assert sorted({tuple(b) for b in blocks}) == [(f"s{s}", f"b{b}") for s in range(4) for b in range(2)]
    assert sum(conv.name.endswith(".down.conv") for conv in cnn.convolutions(reduced)) == 4
    resnet34 = replace(resnet50, dims=tuple(sorted({**dict(resnet50.dims), "depth": 34}.items())))
    assert dict(verification_model(resnet34, [1]).dims)["depth"] == 18
    assert dict(verification_model(preset_model("resnet18"), [1]).dims)["depth"] == 18


def test_only_a_model_the_reduced_instance_shrinks_is_probed_at_full_size():
    assert full_size_model(preset_model("medium"), [1, 2]) is None
    assert full_size_model(preset_model("transformer-tiny"), [1, 2]) is None
    full = full_size_model(preset_model("gpt2-small"), [1, 2])
    assert full is not None and full.dims == preset_model("gpt2-small").dims
    assert full.batch_sizes == (4,) and full.dropout == 0.0  # 2 per device on 2: no more than timing holds


def test_verify_plans_one_probe_per_trained_program_and_no_run_of_a_variant_on_a_family_it_does_not_build():
    spec = build_spec({"models": [{"preset": "gpt2-small"}, {"preset": "resnet18"}], "devices": [1, 2]})
    only_transformers = Variant("fast-attention", "a transformer-only kernel", families=("transformer",))
    lineup = Lineup(variants=(Lineup().variants[0], only_transformers))
    trials = verification_trials(spec, ["jax"], [1, 2], lineups={"jax": lineup})
    probes = [t for t in trials if t.replicate == FULL_SIZE_REPLICATE]
    assert {(t.model.name, t.variant, t.devices) for t in probes} == {
        ("gpt2-small", v, n) for v in ("as-written", "fast-attention") for n in (1, 2)}
    assert all(t.protocol.steps == 0 and t.global_batch == 4 and dict(t.model.dims)["layers"] == 12 for t in probes)
    assert not [t for t in trials if t.variant == "fast-attention" and t.model.name == "resnet18"]


def lineup_of_kinds(*extra: Variant) -> Lineup:
    """As written, a compiled variant (the same formula), a sharded one, another kernel."""
    compiled = Variant("compile", "the same step compiled", same_formula=True)
    sharded = Variant("fsdp", "sharded", same_formula=True, sharded=True, programs=(DATA_PARALLEL,))
    kernel = Variant("cudnn", "another attention kernel")
    return Lineup(variants=(Lineup().variants[0], compiled, sharded, kernel, *extra))


def test_a_variant_of_the_same_formula_uses_its_programs_probe_and_a_sharded_one_is_probed_itself():
    """Measured on 2 H200s: the full-size probes of torch's compiled variants of ResNet-50 took
    2-3 minutes each, re-checking model code their as-written program's probe checks."""
    spec = build_spec({"models": [{"preset": "gpt2-small"}], "devices": [1, 2]})
    lineup = lineup_of_kinds()
    trials = verification_trials(spec, ["jax"], [1, 2], lineups={"jax": lineup})
    borrowers = probe_borrowers(["jax"], {"jax": lineup})
    assert borrowers == {("jax", "compile")}
    lent = lent_probes(trials, borrowers)
    by_id = {t.id: t for t in trials}
    assert {(by_id[own].variant, by_id[own].devices, by_id[base].variant) for own, base in lent.items()} == {
        ("compile", 1, "as-written"), ("compile", 2, "as-written")}
    assert all(by_id[own].replicate == by_id[base].replicate == FULL_SIZE_REPLICATE for own, base in lent.items())


def test_a_probe_is_lent_only_where_the_lenders_runs_at_the_same_precision():
    spec = build_spec({"models": [{"preset": "gpt2-small"}], "devices": [1, 2]})
    low = Variant("bf16-graphs", "the same step, bf16 only", same_formula=True, precisions=("bf16",))
    lineup = lineup_of_kinds(low)
    trials = verification_trials(spec, ["jax"], [1, 2], lineups={"jax": lineup})
    probes = [t for t in trials if t.replicate == FULL_SIZE_REPLICATE]
    as_written = [t.id for t in probes if t.variant == "as-written" and t.devices == 1]
    lent = lent_probes(trials, probe_borrowers(["jax"], {"jax": lineup}), not_run=as_written)
    by_id = {t.id: t for t in trials}
    assert {(by_id[own].variant, by_id[own].devices) for own in lent} == {("compile", 2)}  # d1's lender would not fit
    assert not [own for own in lent if by_id[own].variant == "bf16-graphs"]  # its lender is fp32: it probes itself


def test_a_lent_probes_failures_are_its_borrowers_too():
    failed = Check("full size: N devices = 1 device", "gpt2-small: jax d2 vs jax d1 (tensor 3)", ("jax",),
                   0.5, 0.5, 0.5, 1e-3, keys=(("jax", 2, "gpt2-small"),))
    passed = replace(failed, backends=("torch",), norm_rel=0.0, subject="gpt2-small: torch d2 vs torch d1")
    probe = "torch/gpt2-small/d1/b4/r10"
    problems, owners, unverifiable = {probe: "crashed"}, {probe: "torch"}, {}
    _lent_failures({"jax+compile": "jax", "torch+compile": "torch", "tf+xla": "tf"}, [failed, passed], problems, owners,
                   unverifiable, {"tf": "gpt2-small: out of memory at full size"}, {probe})
    assert owners["jax+compile: full size"] == "jax+compile"
    assert "gpt2-small: jax d2 vs jax d1" in problems["jax+compile: full size"]
    lent = f"{probe} (for torch+compile)"
    assert owners[lent] == "torch+compile" and problems[lent] == "crashed"
    assert unverifiable == {"tf+xla": "gpt2-small: out of memory at full size"}


def test_no_run_is_planned_of_a_variant_on_a_program_it_is_not_a_variant_of():
    """Measured on 2 H200s: 14 of 147 verification runs started a worker only to hear "unsupported"
    (a sharded variant of the plain program, a plain-only variant of the data-parallel one)."""
    spec = build_spec({"models": [{"preset": "medium"}], "devices": [1, 2]})
    sharded = Variant("fsdp", "sharded", programs=(DATA_PARALLEL,))
    plain_only = Variant("functional", "another plain step", programs=(PLAIN,))
    lineup = Lineup(variants=(Lineup().variants[0], sharded, plain_only), single_device=(DATA_PARALLEL, PLAIN))
    checked = {(t.variant, t.program, t.devices) for t in verification_trials(spec, ["jax"], [1, 2],
                                                                               lineups={"jax": lineup})}
    timed = {(t.variant, t.program, t.devices) for t in plan_trials(spec, ["jax"], lineups={"jax": lineup})}
    for planned in (checked, timed):
        assert {(v, p) for v, p, _ in planned} == {("as-written", DATA_PARALLEL), ("as-written", PLAIN),
                                                   ("fsdp", DATA_PARALLEL), ("functional", PLAIN)}
        assert ("fsdp", DATA_PARALLEL, 2) in planned and ("functional", PLAIN, 1) in planned


def test_summaries_see_a_skipped_layer_and_a_wrong_width_as_errors_of_order_one():
    good = probe(2.3, gradients())
    assert summary_error(good, probe(2.3, gradients())) == (0.0, " (the loss)")
    skipped = gradients()
    skipped[2] = np.zeros_like(skipped[2])
    error, where = summary_error(probe(2.3, skipped), good)
    assert error >= 1.0 and where == " (tensor 2)"
    narrow = gradients()[:2]
    assert summary_error(probe(2.3, narrow), good)[0] == float("inf")


def test_a_summary_error_tracks_the_tensors_normwise_error():
    base = gradients()
    moved = [g.copy() for g in base]
    moved[0] = moved[0] + 1e-4 * np.linalg.norm(moved[0]) * gradients(1)[0] / np.linalg.norm(gradients(1)[0])
    error, _ = summary_error(probe(2.3, moved), probe(2.3, base))
    assert 1e-5 < error <= 4e-4  # ||g - g'|| / ||g|| = 1e-4, within the projections' factor of a few


def test_a_sum_that_cancels_is_judged_against_its_terms_not_the_norm():
    """A gradient whose terms cancel (a weight feeding a normalisation sums to ~0): rounding
    of 0.4 % in one direction moved GPT-2 small's bf16 probe's sums by 2.4 x the tensor's norm
    on a GPU, same program as the fp32 one; against the absolute sum it is the 0.4 % it is. A
    real shift of the whole tensor is still of order one."""
    g = np.random.default_rng(0).standard_normal(1_000_000)
    g -= g.mean()
    rounded = g + 4e-3 * np.abs(g)
    assert abs(rounded.sum() - g.sum()) / np.linalg.norm(g) > 2  # what the norm alone said
    error, _ = summary_error(probe(2.3, [rounded]), probe(2.3, [g]))
    assert error < FULL_SIZE_TOLERANCES["bf16"] / 10
    shifted = g + np.abs(g).mean()
    assert summary_error(probe(2.3, [shifted]), probe(2.3, [g]))[0] >= 0.5


def test_summaries_recorded_before_the_absolute_sum_are_still_compared():
    def four_columns(reference):
        return replace(reference, summaries=reference.summaries[:, :4])

    four = four_columns(probe(2.3, gradients()))
    skipped = gradients()
    skipped[2] = np.zeros_like(skipped[2])
    older = four_columns(probe(2.3, skipped))
    assert summary_error(four, four)[0] == 0.0 and summary_error(older, four)[0] >= 1.0
    g = np.random.default_rng(0).standard_normal(10_000)
    g -= g.mean()
    rounded = g + 4e-3 * np.abs(g)  # four columns: the sum still divided by the norm
    assert summary_error(four_columns(probe(2.3, [rounded])), four_columns(probe(2.3, [g])))[0] > 0.2


def test_full_size_checks_compare_n_devices_with_one_and_each_backend_with_the_reference():
    ref = {("jax", 1, "m"): probe(2.3, gradients()), ("jax", 2, "m"): probe(2.3, gradients()),
           ("torch", 1, "m"): probe(2.3, gradients())}
    wrong = gradients()
    wrong[1] = 2 * wrong[1]
    ref[("torch", 2, "m")] = probe(2.3, wrong)
    precisions = dict.fromkeys(ref, "fp32")
    checks = {c.subject.split(" (")[0]: c for c in full_size_checks(ref, precisions, "jax")}
    assert checks["m: jax d2 vs jax d1"].passed and checks["m: torch d1 vs jax d1"].passed
    failed = checks["m: torch d2 vs torch d1"]
    assert not failed.passed and failed.backends == ("torch",) and failed.norm_rel == pytest.approx(1.0, rel=1e-6)


def test_a_program_that_computes_the_whole_batch_on_one_device_fails_the_share_check():
    slices = (2.29, 2.35)  # each half of the batch on one device
    whole = sum(slices) / 2
    runs = {("honest", 1, "m"): Reference(whole, [], [], [], shard_losses={2: slices}),
            ("honest", 2, "m"): Reference(whole, [], [], [], shard_losses={2: slices}),
            ("copies", 1, "m"): Reference(whole, [], [], [], shard_losses={2: slices}),
            ("copies", 2, "m"): Reference(whole, [], [], [], shard_losses={2: (whole, whole)}),
            ("silent", 2, "m"): Reference(whole, [], [], [])}
    checks = {c.backends[0]: c for c in shard_checks(runs, dict.fromkeys(runs, "fp32"), "")}
    assert checks["honest"].passed
    assert not checks["copies"].passed and checks["copies"].norm_rel > 1e-2
    assert "silent" not in checks and unreported_shares(runs) == {"silent"}


def test_summaries_and_slice_losses_survive_the_arrays_file(tmp_path):
    ref = probe(2.3, gradients(), {2: (1.0, 2.0), 4: (1.0, 2.0, 3.0, 4.0)})
    save_reference(tmp_path / "r.npz", ref)
    back = load_reference(tmp_path / "r.npz")
    assert np.array_equal(back.summaries, ref.summaries) and back.shard_losses == ref.shard_losses
    assert back.gradients == [] and back.loss == 2.3


def test_verify_says_at_which_size_and_precision_it_checked_each_model():
    assert sizes_checked(preset_model("medium"), [1, 2], "fp32") == (
        "medium: trajectory 10 steps at full size, batch 32, fp32, float64 referee")
    text = sizes_checked(preset_model("gpt2-small"), [1, 2], "fp32")
    assert "reduced instance (context 64, layers 2)" in text
    assert "full size (context 1024, layers 12): initial loss and per-tensor gradient summaries, batch 4, fp32" in text


def test_a_model_too_large_to_probe_leaves_its_program_unverified_with_a_one_line_reason():
    from xbench.run.verification import verdict

    spec = build_spec({"models": [{"preset": "gpt2-small"}], "devices": [1]})
    [probe] = [t for t in verification_trials(spec, ["jax"], [1]) if t.replicate == FULL_SIZE_REPLICATE]
    record = {"trial_id": probe.id, "status": "failed",
              "reason": "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 83.00GiB."}
    result = verdict(spec, ["jax"], [probe], [record])
    why = result.outcome("jax")
    assert why["status"] == "unverifiable" and "\n" not in why["reason"]
    assert why["reason"].startswith("gpt2-small is too large to verify on 1 device(s) here: failed: RESOURCE_EXHAUSTED")


def test_summaries_are_the_norm_sum_two_fixed_sign_projections_and_absolute_sum_chunk_for_chunk():
    """Summaries taken a chunk at a time equal those of the whole tensor: the norm, the sum,
    and the projections on signs that depend only on the tensor's index (not on the chunks)."""
    from xbench.worker import capture

    g = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    whole = summarize([g, g])
    assert whole[0, 0] == pytest.approx(np.linalg.norm(g.astype(np.float64)))
    assert whole[0, 1] == pytest.approx(g.astype(np.float64).sum())
    assert whole[0, 4] == pytest.approx(np.abs(g.astype(np.float64)).sum())
    assert whole[0, 2] != whole[1, 2]  # another tensor, other signs
    signs = capture._signs(capture._sign_stream(0, 1), g.size)
    assert set(np.unique(signs)) == {-1.0, 1.0} and whole[0, 2] == pytest.approx(g.astype(np.float64) @ signs)
    chunked = capture.SUMMARY_CHUNK
    try:
        capture.SUMMARY_CHUNK = 64
        np.testing.assert_allclose(summarize([g, g]), whole, rtol=1e-12)
    finally:
        capture.SUMMARY_CHUNK = chunked


def test_verify_says_which_programs_use_another_programs_probe():
    assert probes_caption({}) is None
    caption = probes_caption({"torch+compile": "torch", "torch+cuda-graphs": "torch", "jax+fused": "jax"})
    assert caption == ("jax+fused use jax's full-size probe (the same formula over the same model code and parameter "
                       "layout: no probe of their own); torch+compile, torch+cuda-graphs use torch's full-size probe "
                       "(the same formula over the same model code and parameter layout: no probe of their own).")
