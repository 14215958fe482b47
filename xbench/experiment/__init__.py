"""The experiment: the TOML spec and the command line, validated into one frozen `Spec`
(`spec`), and the design of a `sweep`."""

from xbench.experiment.spec import (
    ALL_VARIANTS,
    COMPILE_CACHES,
    DEFAULT_RAW,
    DEFAULT_REPLICATES,
    MAX_NAME_LENGTH,
    MIN_REPLICATES,
    PLATFORMS,
    PRECISIONS,
    SCALINGS,
    SINGLE_DEVICE,
    DataSpec,
    Spec,
    apply_overrides,
    build_spec,
    load_raw,
    load_spec,
    presets,
    resolve_protocol,
)
from xbench.experiment.values import MAX_ELEMENTS, MAX_SECONDS, MAX_SEED

__all__ = [
    "ALL_VARIANTS", "COMPILE_CACHES", "DEFAULT_RAW", "DEFAULT_REPLICATES", "MAX_ELEMENTS", "MAX_NAME_LENGTH",
    "MAX_SECONDS", "MAX_SEED", "MIN_REPLICATES", "PLATFORMS", "PRECISIONS", "SCALINGS", "SINGLE_DEVICE", "DataSpec",
    "Spec", "apply_overrides", "build_spec", "load_raw", "load_spec", "presets", "resolve_protocol",
]
