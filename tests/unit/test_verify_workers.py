"""How verification packs its runs into worker processes (`verify_plan.verification_groups`)."""

from collections import Counter

import pytest

from xbench.contract import DATA_PARALLEL, PLAIN, Variant
from xbench.experiment import build_spec
from xbench.run.plan import AS_WRITTEN_VARIANT, Lineup, group_trials
from xbench.run.verify_plan import GROUPS_PER_SLOT, groups_per_slot, verification_groups, verification_trials

TARGETS = {"a": "x:A", "b": "x:B"}
LINEUP = Lineup((AS_WRITTEN_VARIANT, Variant("compiled", "the same, compiled", same_formula=True),
                 Variant("kernel", "another kernel"), Variant("low", "bf16 only", precisions=("bf16",))),
                (DATA_PARALLEL, PLAIN))


def plan():
    """Two backends, four variants (one bf16 only), both programs, GPT-2 small and an MLP on 1
    and 2 devices: fp32 runs, float64 referees, bf16 references and full-size probes."""
    spec = build_spec({"models": [{"preset": "gpt2-small", "batch_sizes": [16]}, {"preset": "medium"}],
                       "devices": [1, 2]})
    return verification_trials(spec, ["a", "b"], [2], lineups={"a": LINEUP, "b": LINEUP})


@pytest.mark.parametrize("parallel", [1, 2, 8])
def test_each_run_is_in_one_worker_of_its_backend_device_count_and_launcher(parallel):
    trials = plan()
    groups = verification_groups(trials, TARGETS, parallel)
    assert Counter(t.id for g in groups for t in g.trials) == Counter(t.id for t in trials)
    for group in groups:
        assert {(t.backend, t.devices, t.launcher) for t in group.trials} == {(group.backend, group.devices,
                                                                              group.launcher)}
        assert group.target == TARGETS[group.backend]
    positions = [p for g in groups for p in g.positions]
    assert len(set(positions)) == len(positions) == len(trials)


def test_a_worker_runs_every_kind_of_run_and_far_fewer_workers_start():
    """The plan's 90-odd runs took a worker per variant, device count and replicate number;
    now a worker runs fp32 runs, float64 referees, bf16 references and probes alike, and as
    few start as keep every slot busy twice over."""
    trials = plan()
    parallel = 2
    groups = verification_groups(trials, TARGETS, parallel)
    before = len(group_trials(trials, TARGETS))
    assert len(trials) > 80 and before > 30
    processes = {(t.backend, t.devices, t.launcher) for t in trials}
    assert GROUPS_PER_SLOT * parallel <= len(groups) <= GROUPS_PER_SLOT * parallel + len(processes)
    assert len(groups) < before / 4
    kinds = {(t.precision, t.replicate) for t in trials}
    assert len(kinds) >= 4  # fp32 and bf16 runs, float64 referees, bf16 references, probes
    mixed = [g for g in groups if len({(t.precision, t.replicate) for t in g.trials}) >= 3]
    assert mixed, [[t.id for t in g.trials] for g in groups]


def test_many_slots_get_twice_the_workers_per_slot():
    trials = plan()
    processes = len({(t.backend, t.devices, t.launcher) for t in trials})
    for parallel, per_slot in ((2, GROUPS_PER_SLOT), (8, 2 * GROUPS_PER_SLOT)):
        least = per_slot * parallel
        assert least <= len(verification_groups(trials, TARGETS, parallel)) <= least + processes


def test_the_longest_workers_come_first_and_start_on_the_gpus_in_turn():
    groups = verification_groups(plan(), TARGETS, 8)
    sizes = [len(g.trials) for g in groups]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    assert [g.positions[0] for g in groups] == list(range(len(groups)))  # `launcher.spread_environment`
    cap = -(-sum(sizes) // (groups_per_slot(8) * 8))
    assert max(sizes) <= cap


def test_one_slot_runs_each_backend_and_device_count_in_about_two_workers():
    trials = plan()
    groups = verification_groups(trials, TARGETS, 1)
    per_process = Counter((g.backend, g.devices) for g in groups)
    assert set(per_process) == {("a", 1), ("a", 2), ("b", 1), ("b", 2)}
    assert len(groups) <= GROUPS_PER_SLOT + len(per_process)
