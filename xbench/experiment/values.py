"""Reading one value of a spec: each reader returns a clean value or raises a one-line
`SpecError` that names the key, where it was, and what is accepted; and the limits that keep
values within what every framework can index and every wait can bound."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from xbench.errors import SpecError, brief


def as_table(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"'{name}' must be a table, got {type(value).__name__}")
    return dict(value)


def reject_unknown(table: Mapping[str, Any], known: set[str], where: str, source: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise SpecError(
            f"unknown key {brief(unknown[0])} in {where} of {source}; known keys: {', '.join(sorted(known))}"
        )


# Seeds: numpy's default_rng takes any integer >= 0, torch.manual_seed (given seed + rank)
# and jax.random.key up to 2**63 - 1, Keras's set_random_seed up to 2**32 - 1; 2**31 - 1 also
# fits the frameworks' int32 seed arguments and is the order seed's range, which a multi-node
# run takes from the seed.
MAX_SEED = 2**31 - 1
SEED_RANGE_WHY = "a seed every framework accepts"
MAX_COUNT = 10_000  # replicates, repeats: more is a typo, not a protocol
# Sizes (samples, batch sizes, widths, inputs, outputs) and the arrays built from them stay
# within int32 indexing: XLA, TF's GPU kernels and some torch kernels index arrays with int32,
# and fail or overflow past it. See `_check_array_sizes`.
MAX_ELEMENTS = 2**31 - 1
MAX_DEVICES = 65_536  # xbench starts a process per device (spmd); more is a typo
# Steps per window, per call and of warmup: the jax backends count steps in int32 (the dropout
# keys fold in step * devices + device), which must stay far from overflow.
MAX_STEPS = 1_000_000
# Seconds (trial timeout, least window): a week; the orchestrator waits with these as
# timeouts, which Python refuses past threading.TIMEOUT_MAX (about 292 years).
MAX_SECONDS = 7 * 24 * 3600.0
MAX_TARGET_CI = 1.0  # an interval as wide as the mean says nothing; larger is a percentage typed as is


def integer(table: Mapping[str, Any], key: str, default: int | None, where: str, minimum: int,
             maximum: int | None = None, why: str = "") -> int:
    value = table.get(key, default)
    accepted = "" if maximum is None else f" (accepted: {minimum}..{maximum}{', ' + why if why else ''})"
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpecError(f"'{key}' in {where} must be an integer >= {minimum}, got {brief(value)}{accepted}")
    if maximum is not None and value > maximum:
        raise SpecError(f"'{key}' in {where} must be an integer <= {maximum}, got {brief(value)}{accepted}")
    return value


def positive_number(table: Mapping[str, Any], key: str, default: float, where: str,
                     maximum: float = math.inf) -> float:
    value = table.get(key, default)
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or value <= 0):
        raise SpecError(f"'{key}' in {where} must be a positive finite number, got {brief(value)}")
    if value > maximum:
        raise SpecError(f"'{key}' in {where} must be at most {maximum:g}, got {brief(value)}")
    return float(value)


def non_negative_number(table: Mapping[str, Any], key: str, default: float, where: str,
                         maximum: float = math.inf, why: str = "") -> float:
    value = table.get(key, default)
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or value < 0):
        raise SpecError(f"'{key}' in {where} must be a finite number >= 0, got {brief(value)}")
    if value > maximum:
        raise SpecError(f"'{key}' in {where} must be in 0..{maximum:g}{' (' + why + ')' if why else ''}, "
                        f"got {brief(value)}")
    return float(value)


def positive_list(table: Mapping[str, Any], key: str, default: Any, where: str,
                   unique: bool = True, maximum: int = MAX_ELEMENTS) -> list[int]:
    value = table.get(key, default)
    if isinstance(value, tuple):
        value = list(value)
    if (not isinstance(value, list) or not value
            or any(not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= maximum for v in value)):
        raise SpecError(f"'{key}' in {where} must be a non-empty list of positive integers <= {maximum}, "
                        f"got {brief(value)}")
    if unique and len(set(value)) != len(value):
        raise SpecError(f"'{key}' in {where} lists a value twice: {brief(value)}")
    return value


def str_list(table: Mapping[str, Any], key: str, default: Any, where: str) -> list[str]:
    value = table.get(key, default)
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not value or any(not isinstance(v, str) or not v for v in value):
        raise SpecError(f"'{key}' in {where} must be a non-empty list of names, got {brief(value)}")
    if len(set(value)) != len(value):
        raise SpecError(f"'{key}' in {where} lists a name twice: {brief(value)}")
    return value


def choice(table: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str, where: str) -> str:
    value = table.get(key, default)
    if value not in choices:
        raise SpecError(f"'{key}' in {where} must be one of {', '.join(choices)}, got {brief(value)}")
    return value


def boolean(table: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """A TOML true or false (not 1, 0 or a string: `p2p = "off"` is a mistake worth naming)."""
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"'{key}' in {where} must be true or false, got {brief(value)}")
    return value
