"""Model FLOPs utilisation: the model's FLOPs per training sample, the devices' peaks, and the
MFU the table, report and export show."""

import numpy as np
import pytest

from tests.process.test_replicates import record
from xbench.experiment import load_spec
from xbench.models.model_spec import training_flops_per_sample
from xbench.report.export import flat_rows
from xbench.report.words import RESULT_HEADERS, model_facts, result_cells
from xbench.results.peaks import TERA, peak_for
from xbench.results.summary import geomean_rate, mfu, rows_from_records


def counted_training_flops(sizes):
    """FLOPs of a training step counted from the matmuls numpy would do for one sample."""
    flops = 0
    activations = [np.zeros((1, sizes[0]))]
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        kernel = np.zeros((fan_in, fan_out))
        flops += 2 * activations[-1].shape[0] * fan_in * fan_out  # forward x @ W
        activations.append(activations[-1] @ kernel)
    for layer in range(len(sizes) - 1, 0, -1):
        fan_in, fan_out = sizes[layer - 1], sizes[layer]
        flops += 2 * fan_in * fan_out  # weight gradient x.T @ delta
        if layer > 1:
            flops += 2 * fan_out * fan_in  # input gradient delta @ W.T, not needed for the data
    return flops


@pytest.mark.parametrize("preset", ["medium", "large"])
def test_flops_per_sample_match_the_counted_matmuls(preset):
    model = load_spec(None, {"models": [preset]}).models[0]
    assert model.training_flops_per_sample == counted_training_flops(model.layer_sizes)
    # about 6 per parameter, less the first layer's input gradient
    assert 4 * model.params < model.training_flops_per_sample < 6 * model.params


def test_peaks_match_the_most_specific_name_and_cpus_have_none():
    assert peak_for("gpu:0 NVIDIA H200", "tf32").flops == pytest.approx(494.7 * TERA)
    assert peak_for("cuda:0 NVIDIA H100 80GB HBM3", "bf16").flops == pytest.approx(989.4 * TERA)
    assert peak_for("NVIDIA H100 PCIe", "fp32").device == "H100 PCIe"
    assert peak_for("NVIDIA GH200 480GB", "tf32").device == "GH200"
    assert peak_for("NVIDIA H200 NVL", "bf16").device == "H200 NVL"
    assert peak_for("NVIDIA A100-SXM4-80GB", "fp32").unit == "CUDA cores"
    assert peak_for("cpu:0 cpu", "fp32") is None
    assert peak_for("NVIDIA H200", "fp8") is None


def gpu_record(batch, replicate, step_s, name="NVIDIA H200", precision="tf32", simulated=False):
    out = record(batch, 1, replicate, step_s, seed=replicate)
    out["trial"].update(precision=precision, protocol={"steps_per_call": 1})
    out["devices"] = {"platform": "gpu", "simulated": simulated, "device_names": [f"gpu:0 {name}"]}
    return out


def test_mfu_is_throughput_times_flops_over_the_peak_with_its_interval():
    records = [gpu_record(1024, r, s) for r, s in enumerate((1e-3, 1.1e-3, 0.9e-3))]
    [row] = rows_from_records(records)
    flops = training_flops_per_sample([3, 4, 1])  # the test record's model
    mean, low, high = mfu(row)
    assert mean == pytest.approx(geomean_rate(row) * flops / (494.7 * TERA))
    assert low < mean < high
    cells = dict(zip(RESULT_HEADERS, result_cells(row)))
    assert cells["MFU"].endswith("%")
    assert "494.7 TFLOP/s per device (H200 SXM, tf32, tensor cores)" in model_facts([row])
    exported = flat_rows(records)[0]
    assert exported["mfu"] == pytest.approx(mean) and exported["peak_device"] == "H200 SXM"


@pytest.mark.parametrize("name, simulated", [("NVIDIA RTX 4090", False), ("NVIDIA H200", True)])
def test_mfu_is_unknown_without_a_peak(name, simulated):
    [row] = rows_from_records([gpu_record(64, 0, 1e-3, name=name, simulated=simulated)])
    assert mfu(row) is None
    assert dict(zip(RESULT_HEADERS, result_cells(row)))["MFU"] == "unknown"
    assert flat_rows([gpu_record(64, 0, 1e-3, name=name, simulated=simulated)])[0]["mfu"] is None


def test_a_tiny_mfu_says_so_instead_of_zero():
    [row] = rows_from_records([gpu_record(8, 0, 1e-3)])  # 8 samples of a 9-parameter model per ms
    assert dict(zip(RESULT_HEADERS, result_cells(row)))["MFU"] == "<0.01%"


def test_the_terminal_drops_a_column_of_unknowns_and_says_why():
    from rich.console import Console

    from xbench.report.terminal import model_tables

    def terminal(records):
        console = Console(width=250, record=True)
        for table in model_tables(rows_from_records(records), wide=True):
            console.print(table)
        return console.export_text()

    def header(text):
        return next(line for line in text.splitlines() if "program" in line and "┃" in line)

    cpu = terminal([gpu_record(64, r, 1e-3, simulated=True) for r in range(2)])
    assert "MFU: unknown here" in cpu and "MFU" not in header(cpu)
    gpu = terminal([gpu_record(64, r, 1e-3) for r in range(2)])
    assert "MFU" in header(gpu) and "unknown here" not in gpu
