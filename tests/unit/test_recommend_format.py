"""`recommend` writes its numbers as `compare` does: a speedup "1.84× (1.27–2.68)", a
throughput "598,588 (460k–779k)" or "3.567M ±0.4%", compare's column names; no "[a, b]"."""

import re

from tests.conftest import ROOT
from xbench.cli.recommend_cmd import speedup_text
from xbench.report.words import ratio_text
from xbench.stats import Scaling

FOUR_GPUS = ROOT / "results" / "2026-11-28-h200x4-four-gpus" / "fit-on-1-2-gpus.json"
QUESTION = ("recommend", "--fits", str(FOUR_GPUS), "--params", "2e7", "--global-batch", "1024", "65536",
            "--devices", "4")


def words(text: str) -> str:
    return " ".join(text.split())


def test_recommend_writes_intervals_as_compare_does(run_cli, monkeypatch):
    monkeypatch.setattr("xbench.cli.recommend_cmd.this_machine", lambda: "simulated CPU devices (AMD EPYC)")
    code, out, err = run_cli(*QUESTION)
    assert code == 0, err
    said = words(out + err)
    assert said.startswith("no fit was measured on this machine") and "4 x NVIDIA H200" in said
    assert "fitted 2026-11-28" in said  # the fit's machine and date, first
    assert not re.search(r"\[[^\]]*\d, [^\]]*\]", said), "an interval in [a, b] brackets"
    assert not re.search(r"\d\.\d\dx\b", said), "a speedup with x instead of ×"
    assert "jax (fp32): use 4 devices — 4 devices: 1.84× (1.27–2.68);" in said
    assert "torch (spmd) (fp32): measure — 4 devices: 1.43× (0.89–2.28), the interval straddles 1×" in said
    assert re.search(r"\d\.\d\d× \(\d\.\d\d–\d\.\d\d\)", said)  # the table's speedup cells
    assert re.search(r"[\d,]+ \([\d.]+k–[\d.]+k\)", said)  # a skewed throughput interval: its bounds
    assert "program" in said and "speedup (95%)" in said and "backend" not in said.split("global batch")[1]
    assert "batch 1024: from 3.38e+06 params (1.03e+06–1.02e+07)" in said


def test_a_speedup_reads_as_compares_ratio():
    assert speedup_text((1.95, 1.94, 1.97)) == ratio_text(Scaling(2, 1.95, 0.975, 0.0, True, 1.94, 1.97)) \
        == "1.95× (1.94–1.97)"
    assert speedup_text((1.84, 1.27, 2.68)) == "1.84× (1.27–2.68)"  # wide: compare's words, here its bounds
