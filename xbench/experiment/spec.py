"""The experiment spec: one frozen description of what to run, validated in one place.

A spec comes from a TOML file (or the built-in defaults, which equal `configs/quick.toml`)
plus command-line overrides. `build_spec` turns that raw mapping into a `Spec` or raises a
`SpecError` whose one-line message names the key and what to change.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from xbench.contract.timing import (
    DEFAULT_ADAPTIVE_FLOOR,
    DEFAULT_DEVICE_RUN_VARIATION,
    DEFAULT_INTERVAL_TARGET,
    DEFAULT_RUN_VARIATION,
    DEFAULT_TIME_BUDGET_S,
    TimingProtocol,
)
from xbench.errors import SpecError, brief
from xbench.experiment.values import (
    MAX_COUNT,
    MAX_DEVICES,
    MAX_ELEMENTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TARGET_CI,
    SEED_RANGE_WHY,
    as_table,
    boolean,
    choice,
    integer,
    non_negative_number,
    positive_list,
    positive_number,
    reject_unknown,
    str_list,
)
from xbench.models import Dim, broken_families, families, family, presets
from xbench.models.model_spec import ModelSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

PRECISIONS = ("fp32", "tf32", "bf16")  # bf16: mixed, bf16 compute with fp32 master weights
SCALINGS = ("strong", "weak")
SINGLE_DEVICE = ("plain", "data-parallel", "both")
PLATFORMS = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class DataSpec:
    """Synthetic regression data: `samples` rows, the seed's generator."""

    samples: int = 4096


# Replicates (fresh worker processes) per configuration, before adaptive ones, when the spec
# leaves it open. More on GPUs, where processes differ most and a device-bound row's interval
# rests mostly on its replicates: two processes that happen to get the same autotuned kernels
# look precise (the large seed MLP at global batch 8,192 on one H100: 18 processes at 2.62-3.45 M
# samples/s; a run whose two agreed within 0.5 % missed a rerun 14 % lower).
DEFAULT_REPLICATES = {"gpu": 3, "cpu": 2}
MIN_REPLICATES = 2  # an interval over replicate means needs two of them
COMPILE_CACHES = ("run", "off")


@dataclass(frozen=True)
class Spec:
    models: tuple[ModelSpec, ...]
    backends: tuple[str, ...] = ()  # empty: every backend that can run here
    devices: tuple[int, ...] = (1, 2)
    scaling: str = "strong"
    precision: str = "fp32"
    platform: str = "auto"
    learning_rate: float = 1e-3
    seed: int = 0
    data: DataSpec = DataSpec()
    protocol: TimingProtocol = TimingProtocol()
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Variants to time besides each backend's program as written: "BACKEND:VARIANT" names,
    # or "all" (every variant of every selected backend); checked against the backends later.
    variants: tuple[str, ...] = ()
    # The 1-device trials: "both" (the data-parallel program with one replica, the baseline of
    # its own speedup, and each backend's plain single-device program without distribution,
    # where it has one, compared separately), "data-parallel" alone, or "plain" alone (the
    # speedup is then taken over another program, and every output says so).
    single_device: str = "both"
    # GPU-to-GPU links: True, the machine's own (NVLink, PCIe peer-to-peer); False, every
    # collective that goes through NCCL stages through host memory, as on a PCIe machine without
    # peer-to-peer (`xbench.run.links` sets NCCL's variables in every worker).
    p2p: bool = True

    def global_batch(self, batch: int, devices: int) -> int:
        """The batch one step processes over all devices."""
        return batch if self.scaling == "strong" else batch * devices


# Built-in defaults: a CPU-friendly quick comparison. configs/quick.toml spells out the same.
DEFAULT_RAW: dict[str, Any] = {
    "models": [
        {"preset": "medium", "batch_sizes": [32, 256]},
        {"preset": "large", "batch_sizes": [32, 256]},
    ],
}

_TOP_KEYS = {
    "models", "backends", "devices", "scaling", "precision", "platform",
    "learning_rate", "seed", "data", "protocol", "options", "variants", "single_device", "p2p",
}
ALL_VARIANTS = "all"
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
# Model names become parts of file names (throughput-<model>.png) and trial ids
# (jax/<model>/d2/b32/r0): no '/', spaces or leading dot, and short enough for any file system.
MAX_NAME_LENGTH = 64
_MODEL_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME_LENGTH - 1}}}")
_MODEL_KEYS = {"name", "preset", "family", "dropout", "batch_sizes"}  # and the family's shape keys


def load_raw(path: Path | None) -> dict[str, Any]:
    """Read a TOML spec file into a plain mapping (the defaults when `path` is None)."""
    if path is None:
        return {key: value for key, value in DEFAULT_RAW.items()}
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # editors that add a byte-order mark
    except OSError as err:
        raise SpecError(f"cannot read config {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise SpecError(f"config {path} is not UTF-8 text; save it as UTF-8 TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path} is not valid TOML: {err}") from None


def load_spec(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Spec:
    """Load a spec file, apply command-line overrides, validate, and freeze."""
    raw = load_raw(path)
    source = str(path) if path is not None else "the built-in defaults"
    if not overrides:
        return build_spec(raw, source)
    try:
        return build_spec(apply_overrides(raw, overrides), source)
    except SpecError:
        if not _valid(raw, source):
            raise  # the file's own fault, named as the file's
    # The file alone is fine: the command line's options made the fault, so say so.
    return build_spec(apply_overrides(raw, overrides), f"{source} with the command line's options")


def _valid(raw: Mapping[str, Any], source: str) -> bool:
    try:
        build_spec(raw, source)
    except SpecError:
        return False
    return True


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of `raw` with command-line overrides applied (None means 'not given').

    Keys: the top-level spec keys, `models` (names or presets to keep), `batch_sizes`
    (for every selected model), `samples` (data size), and protocol keys (`repeats`, ...).
    """
    merged = dict(raw)
    protocol = as_table(merged.get("protocol", {}), "protocol")
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "models":
            merged["models"] = _select_models(merged.get("models", []), value)
        elif key == "batch_sizes":
            sizes = list(value) if isinstance(value, (list, tuple)) else value  # _positive_list says what is wrong
            merged["models"] = [{**as_table(m, "models"), "batch_sizes": sizes}
                                for m in merged.get("models", [])]
        elif key in TimingProtocol.__dataclass_fields__:
            protocol[key] = value
        elif key == "samples":
            merged["data"] = {**as_table(merged.get("data", {}), "data"), "samples": value}
        elif key == "options":
            merged["options"] = _merge_options(merged.get("options", {}), value)
        else:
            merged[key] = value
    if protocol:
        merged["protocol"] = protocol
    return merged


def _select_models(tables: Any, wanted: Any) -> list[dict[str, Any]]:
    by_name = {}
    for table in tables if isinstance(tables, list) else []:
        table = as_table(table, "models")
        by_name[_model_key(table, "[[models]]")] = table
    chosen = []
    for name in str_list({"models": wanted}, "models", None, "the command line"):
        if name in by_name:
            chosen.append(by_name[name])
        elif name in presets():
            chosen.append({"preset": name})
        else:
            known = sorted(set(presets()) | {str(n) for n in by_name})
            raise SpecError(f"unknown model {brief(name)}; choose one of: {', '.join(known)}")
    return chosen


def _merge_options(base: Any, extra: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    merged = {name: as_table(table, f"options.{name}") for name, table in as_table(base or {}, "options").items()}
    for name, table in as_table(extra, "options").items():
        merged.setdefault(name, {}).update(as_table(table, f"options.{name}"))
    return merged


def build_spec(raw: Mapping[str, Any], source: str = "spec") -> Spec:
    """Validate a raw mapping and return the frozen `Spec`; the single validation point."""
    reject_unknown(raw, _TOP_KEYS, "the top level", source)
    defaults = Spec(models=())
    spec = Spec(
        models=_models(raw.get("models"), source),
        backends=tuple(str_list(raw, "backends", None, source)) if "backends" in raw else (),
        devices=tuple(positive_list(raw, "devices", defaults.devices, source, maximum=MAX_DEVICES)),
        scaling=choice(raw, "scaling", SCALINGS, defaults.scaling, source),
        precision=choice(raw, "precision", PRECISIONS, defaults.precision, source),
        platform=choice(raw, "platform", PLATFORMS, defaults.platform, source),
        learning_rate=positive_number(raw, "learning_rate", defaults.learning_rate, source),
        seed=integer(raw, "seed", defaults.seed, source, minimum=0, maximum=MAX_SEED, why=SEED_RANGE_WHY),
        data=_data(raw.get("data", {}), source),
        protocol=_protocol(raw.get("protocol", {}), source),
        options=_options(raw.get("options", {}), source),
        variants=_variants(raw, source),
        single_device=choice(raw, "single_device", SINGLE_DEVICE, defaults.single_device, source),
        p2p=boolean(raw, "p2p", defaults.p2p, source),
    )
    _check_batches(spec)
    _check_array_sizes(spec)
    return spec


def _models(value: Any, source: str) -> tuple[ModelSpec, ...]:
    if value is None:
        value = DEFAULT_RAW["models"]
    if not isinstance(value, list) or not value:
        raise SpecError(f"'models' in {source} must be a non-empty list of [[models]] tables")
    models = tuple(_model(as_table(table, "models"), source) for table in value)
    names = [m.name for m in models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"model name {brief(duplicates[0])} appears twice in {source}; give each a distinct 'name'")
    return models


def _model(table: dict[str, Any], source: str) -> ModelSpec:
    where = f"[[models]] of {source}"
    name = _model_key(table, where)
    family_name = _family_name(table, where)
    fam = family(family_name)
    reject_unknown(table, _MODEL_KEYS | set(fam.dims), f"a [[models]] table of family {brief(family_name)}", source)
    preset = presets()[table["preset"]][1] if "preset" in table else {}
    if name is None:
        raise SpecError(f"a model of family {brief(family_name)} without a 'preset' in {source} needs a 'name'")
    dims = {key: _dim(table, key, dim, preset, where, family_name) for key, dim in fam.dims.items()}
    try:
        fam.check(dims)
    except ValueError as err:
        raise SpecError(f"model {brief(name)} in {source}: {err}") from None
    dropout = table.get("dropout", preset.get("dropout", 0.0))
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise SpecError(f"'dropout' in {where} must be a number in [0, 1), got {brief(dropout)}")
    if dropout and family_name != "mlp":
        raise SpecError(f"model {brief(name)} in {source}: family {brief(family_name)} has no dropout; "
                        "remove 'dropout'")
    batch_sizes = tuple(positive_list(table, "batch_sizes", preset.get("batch_sizes"), where, maximum=MAX_ELEMENTS))
    if family_name == "mlp":
        return ModelSpec(name=name, widths=tuple(dims["widths"]), dropout=float(dropout), batch_sizes=batch_sizes,
                         inputs=dims["inputs"], outputs=dims["outputs"])
    return ModelSpec(name=name, batch_sizes=batch_sizes, family=family_name, dims=tuple(sorted(dims.items())))


def _family_name(table: Mapping[str, Any], where: str) -> str:
    """The model's family: its 'family', else its preset's, else "mlp" when it gives 'widths'."""
    from_preset = presets()[table["preset"]][0] if "preset" in table else None
    given = table.get("family")
    if given is not None and (not isinstance(given, str) or given not in families()):
        broken = broken_families().get(given) if isinstance(given, str) else None
        if broken:
            raise SpecError(f"model family {brief(given)} in {where} failed to load: {broken}")
        raise SpecError(f"unknown model family {brief(given)} in {where}; choose one of: {', '.join(families())}")
    if given is not None and from_preset is not None and given != from_preset:
        raise SpecError(f"preset {brief(table['preset'])} in {where} is of family {brief(from_preset)}, "
                        f"not {brief(given)}; drop one of 'preset' and 'family'")
    name = given or from_preset or ("mlp" if "widths" in table else None)
    if name is None:
        raise SpecError(f"each model in {where} needs a 'preset' ({', '.join(presets())}), a 'family' "
                        f"({', '.join(families())}) with its shape keys, or MLP 'widths'")
    return name


def _dim(table: Mapping[str, Any], key: str, dim: Dim, preset: Mapping[str, Any], where: str, family_name: str):
    """One shape key: from the table, else the preset, else its default; checked."""
    default = preset.get(key, dim.default)
    if key not in table and default is None:
        raise SpecError(f"model family {brief(family_name)} in {where} needs {brief(key)} ({dim.doc})")
    if dim.is_list:
        return tuple(positive_list(table, key, default, where, unique=False, maximum=dim.maximum))
    return integer(table, key, default, where, minimum=dim.minimum, maximum=dim.maximum, why=dim.doc)


def _model_key(table: Mapping[str, Any], where: str) -> str | None:
    """A model table's name: its 'name', else its preset's; None when it has neither.
    Checks both, since names become parts of file names and trial ids."""
    preset_name = table.get("preset")
    if preset_name is not None and not isinstance(preset_name, str):
        raise SpecError(f"'preset' in {where} must be a string, one of: {', '.join(presets())}; "
                        f"got {brief(preset_name)}")
    if preset_name is not None and preset_name not in presets():
        raise SpecError(f"unknown model preset {brief(preset_name)} in {where}; choose one of: {', '.join(presets())}")
    if "name" not in table:
        return preset_name
    name = table["name"]
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name):
        raise SpecError(
            f"model name {brief(name)} in {where} must be a string of 1 to {MAX_NAME_LENGTH} letters, digits, "
            "'_', '.' or '-', starting with a letter or digit (it becomes part of file names and trial ids)"
        )
    return name


def _data(table: Any, source: str) -> DataSpec:
    table = as_table(table, "data")
    reject_unknown(table, set(DataSpec.__dataclass_fields__), "[data]", source)
    return DataSpec(samples=integer(table, "samples", DataSpec.samples, f"[data] of {source}", minimum=1,
                                     maximum=MAX_ELEMENTS))


def _protocol(table: Any, source: str) -> TimingProtocol:
    table = as_table(table, "protocol")
    where = f"[protocol] of {source}"
    reject_unknown(table, set(TimingProtocol.__dataclass_fields__), "[protocol]", source)
    d = TimingProtocol()
    protocol = TimingProtocol(
        warmup_steps=integer(table, "warmup_steps", d.warmup_steps, where, minimum=0, maximum=MAX_STEPS),
        steps=integer(table, "steps", d.steps, where, minimum=1, maximum=MAX_STEPS),
        repeats=integer(table, "repeats", d.repeats, where, minimum=2, maximum=MAX_COUNT),
        steps_per_call=integer(table, "steps_per_call", d.steps_per_call, where, minimum=1, maximum=MAX_STEPS),
        trial_timeout_s=positive_number(table, "trial_timeout_s", d.trial_timeout_s, where, maximum=MAX_SECONDS),
        min_window_s=non_negative_number(table, "min_window_s", d.min_window_s, where, maximum=MAX_SECONDS),
        replicates=(None if table.get("replicates") is None
                    else integer(table, "replicates", None, where, minimum=MIN_REPLICATES, maximum=MAX_COUNT)),
        target_ci=non_negative_number(table, "target_ci", d.target_ci, where, maximum=MAX_TARGET_CI,
                                       why="a fraction of the mean: write 5 % as 0.05"),
        window_budget_s=positive_number(table, "window_budget_s", d.window_budget_s, where),
        compile_cache=choice(table, "compile_cache", COMPILE_CACHES, d.compile_cache, where),
        order_seed=(None if table.get("order_seed") is None
                    else integer(table, "order_seed", None, where, minimum=0, maximum=MAX_SEED)),
        interval_target=(None if table.get("interval_target") is None
                         else non_negative_number(table, "interval_target", 0.0, where, maximum=MAX_TARGET_CI,
                                                   why="a fraction of the mean: write 5 % as 0.05")),
        time_budget_s=(None if table.get("time_budget_s") is None
                       else non_negative_number(table, "time_budget_s", 0.0, where, maximum=MAX_SECONDS)),
        max_replicates=integer(table, "max_replicates", d.max_replicates, where, minimum=MIN_REPLICATES,
                                maximum=MAX_COUNT),
        run_variation=(None if table.get("run_variation") is None
                       else non_negative_number(table, "run_variation", 0.0, where, maximum=MAX_TARGET_CI,
                                                 why="a fraction of the mean: write 5 % as 0.05")),
        device_run_variation=(None if table.get("device_run_variation") is None
                              else non_negative_number(table, "device_run_variation", 0.0, where,
                                                        maximum=MAX_TARGET_CI,
                                                        why="a fraction of the mean: write 0.2 % as 0.002")),
    )
    if protocol.steps % protocol.steps_per_call:
        raise SpecError(
            f"'steps' ({protocol.steps}) in {where} must be a multiple of "
            f"steps_per_call ({protocol.steps_per_call})"
        )
    needed = protocol.least_windows * protocol.min_window_s
    if protocol.window_budget_s < needed:
        raise SpecError(
            f"'window_budget_s' ({protocol.window_budget_s:g}) in {where} cannot hold one replicate: "
            f"{protocol.least_windows} windows of at least min_window_s ({protocol.min_window_s:g} s) need "
            f"{needed:g} s; raise window_budget_s or lower min_window_s"
        )
    return protocol


def resolve_protocol(protocol: TimingProtocol, gpu: bool, order_seed: int) -> TimingProtocol:
    """Fill what the spec left open once the devices are known: replicates, the interval
    target, the time budget of adaptive replicates and the run-level variation (each the
    platform's), and the seed of the run order."""
    return replace(
        protocol,
        replicates=protocol.replicates or DEFAULT_REPLICATES["gpu" if gpu else "cpu"],
        interval_target=(protocol.interval_target if protocol.interval_target is not None
                         else DEFAULT_INTERVAL_TARGET["gpu" if gpu else "cpu"]),
        time_budget_s=(protocol.time_budget_s if protocol.time_budget_s is not None
                       else default_time_budget_s(gpu)),
        adaptive_floor=(protocol.adaptive_floor if protocol.adaptive_floor is not None
                        else 0.0 if protocol.time_budget_s is not None or TIME_BUDGET_VARIABLE in os.environ
                        else DEFAULT_ADAPTIVE_FLOOR),
        run_variation=(protocol.run_variation if protocol.run_variation is not None
                       else DEFAULT_RUN_VARIATION["gpu" if gpu else "cpu"]),
        device_run_variation=(protocol.device_run_variation if protocol.device_run_variation is not None
                              else DEFAULT_DEVICE_RUN_VARIATION),
        order_seed=protocol.order_seed if protocol.order_seed is not None else order_seed,
    )


TIME_BUDGET_VARIABLE = "XBENCH_TIME_BUDGET_S"  # the default --time-budget on this machine (CI: 0)


def default_time_budget_s(gpu: bool) -> float:
    """The time budget of a spec that gives none: $XBENCH_TIME_BUDGET_S where set, else
    DEFAULT_TIME_BUDGET_S for the platform."""
    text = os.environ.get(TIME_BUDGET_VARIABLE)
    if text is None:
        return DEFAULT_TIME_BUDGET_S["gpu" if gpu else "cpu"]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_SECONDS:
        raise SpecError(f"{TIME_BUDGET_VARIABLE}={brief(text)} must be a number of seconds >= 0; unset it or fix it")
    return value


def _options(table: Any, source: str) -> dict[str, dict[str, Any]]:
    table = as_table(table, "options")
    return {str(name): dict(as_table(opts, f"options.{name}")) for name, opts in table.items()}


def _check_batches(spec: Spec) -> None:
    """Strong scaling splits each global batch evenly; the data must hold one global batch."""
    for model in spec.models:
        for batch in model.batch_sizes:
            for devices in spec.devices:
                if spec.scaling == "strong" and batch % devices:
                    raise SpecError(
                        f"global batch {batch} of model {brief(model.name)} is not divisible by "
                        f"{devices} devices; use batch sizes divisible by every device count, "
                        "or --scaling weak"
                    )
                global_batch = spec.global_batch(batch, devices)
                if global_batch > spec.data.samples:
                    raise SpecError(
                        f"global batch {global_batch} of model {brief(model.name)} exceeds "
                        f"data.samples ({spec.data.samples}); raise [data] samples"
                    )


def _check_array_sizes(spec: Spec) -> None:
    """Every array the spec implies (the data xbench builds, each parameter, each device's
    inputs and largest activation) stays within int32 indexing (MAX_ELEMENTS), which the
    frameworks need."""
    from xbench.contract.work import make_data
    for model in spec.models:
        if model.family == "mlp":
            features = max(model.inputs, model.outputs)
            _within_int32(spec.data.samples * features, model,
                          f"its data ([data] samples {spec.data.samples} x {features} features)",
                          "lower [data] samples")
        for param in model.kind.parameters(model.shape):
            _within_int32(math.prod(param.shape), model, f"parameter {param.name} {list(param.shape)}",
                          "make the model smaller")
        one_input = math.prod(make_data(model, 1, spec.seed)[0].shape)
        per_sample, what = max((model.kind.largest_activation(model.shape), (one_input, "inputs")))
        for batch in model.batch_sizes:
            for devices in spec.devices:
                per_device = batch // devices if spec.scaling == "strong" else batch
                _within_int32(per_device * per_sample, model, f"a device's {what} (batch {per_device})",
                              "lower its batch_sizes or its size")


def _within_int32(elements: int, model: ModelSpec, what: str, fix: str) -> None:
    if elements > MAX_ELEMENTS:
        raise SpecError(f"model {brief(model.name)}: {what} would have {elements} elements, more than the "
                        f"{MAX_ELEMENTS} that the frameworks' int32 indexing allows; {fix}")


def _variants(table: Mapping[str, Any], source: str) -> tuple[str, ...]:
    """'all', or BACKEND:VARIANT names (checked against the backends once they are known)."""
    if "variants" not in table:
        return ()
    names = str_list(table, "variants", None, source)
    for name in names:
        backend, _, variant = name.partition(":")
        if name != ALL_VARIANTS and not (_NAME.fullmatch(backend) and _NAME.fullmatch(variant)):
            raise SpecError(f"variant {brief(name)} in {source} must be BACKEND:VARIANT (a backend's name and one "
                            f"of its variants) or '{ALL_VARIANTS}'; `xbench backends` lists each backend's variants")
    return tuple(names)
