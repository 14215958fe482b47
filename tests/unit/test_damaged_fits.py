"""`recommend` with a fit.json that no fitter made (NaN or negated coefficients,
a damaged file in a --fits directory) names the file in one line instead of answering with
NaN, a complex number or "no stored fit"."""

import json
import shutil

import pytest

from tests.conftest import ROOT

FIT = ROOT / "results" / "2026-11-25-cpu-step-model" / "A" / "fit.json"
QUESTION = ("recommend", "--params", "1e5", "--global-batch", "512")


def damaged_copy(tmp_path, change) -> str:
    raw = json.loads(FIT.read_text())
    change(raw["fits"][0])
    path = tmp_path / "fits" / "fit.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    return str(path)


def test_the_stored_fit_answers(run_cli):
    code, out, err = run_cli(*QUESTION, "--fits", str(FIT))
    assert code == 0 and "samples/s" in out + err and "nan" not in (out + err).lower()


@pytest.mark.parametrize("change, needle", [
    (lambda fit: fit.update(theta=[float("nan")] * len(fit["theta"])), "not 9 finite ones"),
    (lambda fit: fit.update(theta=[-v for v in fit["theta"]]), "outside the fitter's bounds"),
    (lambda fit: fit.update(theta=fit["theta"][:3]), "theta of 3 values"),
    (lambda fit: fit.update(flops_ref=-1.0), "flops_ref -1.0"),
    (lambda fit: fit.update(residual_sd=float("inf")), "residual_sd"),
], ids=["nan", "negated", "short", "negative-flops", "infinite-spread"])
def test_a_fit_no_fitter_made_is_named_in_one_line(run_cli, tmp_path, change, needle):
    path = damaged_copy(tmp_path, change)
    for fits in (path, str(tmp_path / "fits")):  # the file named, and found in a directory
        code, out, err = run_cli(*QUESTION, "--fits", fits)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and "Traceback" not in err and "nan samples" not in out, err
        assert len(errors) == 1 and path in errors[0] and needle in errors[0], err


def test_a_damaged_fit_beside_a_good_one_is_left_out_with_a_word(run_cli, tmp_path):
    damaged_copy(tmp_path, lambda fit: fit.update(theta=[float("nan")] * len(fit["theta"])))
    (tmp_path / "fits" / "good").mkdir()
    shutil.copy(FIT, tmp_path / "fits" / "good" / "fit.json")
    code, out, err = run_cli(*QUESTION, "--fits", str(tmp_path / "fits"))
    assert code == 0 and "left out" in err and "samples/s" in out + err
