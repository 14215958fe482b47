"""Device counts the user did not insist on (the default 1 and 2, a spec file's list) that no
backend on this machine has are left out before planning, and the run says so in one line."""

from __future__ import annotations

from xbench.experiment import Spec
from xbench.models.model_spec import preset_model
from xbench.report.words import left_out_line
from xbench.run.cluster import Launch
from xbench.run.readiness import within_the_machine

SPEC = Spec(models=(preset_model("medium"),), devices=(1, 2, 4, 8))


def seen(available: int) -> dict:
    return {"simulated": False, "platform": "gpu", "available": available}


def test_counts_that_no_backend_has_are_left_out_and_those_any_backend_has_kept():
    one_gpu = {"jax": seen(1), "torch": seen(1)}
    launchers = {"jax": "subprocess", "torch": "spmd"}
    spec, left = within_the_machine(SPEC, one_gpu, launchers, Launch())
    assert spec.devices == (1,) and left == (2, 4, 8)
    # one backend with 4 keeps 2 and 4 for every backend: the other's rows say why they skip
    spec, left = within_the_machine(SPEC, {"jax": seen(4), "torch": seen(1)}, launchers, Launch())
    assert spec.devices == (1, 2, 4) and left == (8,)
    spec, left = within_the_machine(SPEC, {"jax": seen(8)}, {"jax": "subprocess"}, Launch())
    assert spec == SPEC and left == ()


def test_the_smallest_count_stays_where_the_machine_has_none_of_them():
    spec, left = within_the_machine(Spec(models=SPEC.models, devices=(2, 4)), {"jax": seen(1)},
                                    {"jax": "subprocess"}, Launch())
    assert spec.devices == (2,) and left == (4,)


def test_the_line_says_what_a_one_device_run_can_and_cannot_answer():
    assert left_out_line((2,), (1,)) == ("2 devices: left out, no backend here has that many; only 1-device rows "
                                         "run, so this run can say which framework is fastest, not whether more "
                                         "devices help")
    assert left_out_line((4, 8), (1, 2)) == "4 and 8 devices: left out, no backend here has that many"
