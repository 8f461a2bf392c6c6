"""A value off its default for every field of a RunSpec-like model, made from the field's type, so a
field added to RunSpec is covered by the round-trip tests without editing them."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from planner.specs.faults import FaultSpec


def off_default(model: type[BaseModel], name: str) -> Any:
    info = model.model_fields[name]
    kind, default = info.annotation, info.default
    example = (info.json_schema_extra or {}).get("example") if isinstance(info.json_schema_extra, dict) else None
    if example is not None:  # a field whose values the edge checks names a valid one
        return example
    if get_origin(kind) in (types.UnionType, typing.Union):  # `str | None`: the non-None arm
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Literal:
        return next(a for a in get_args(kind) if a != default)
    if kind is FaultSpec:
        return FaultSpec(slow_rank=1, slow_factor=2.5, slow_from_step=3, link_rank=0, link_s_per_msg=0.03, kill_rank=1)
    if kind is bool:
        return not default
    if kind is int:
        return (default or 0) + 3
    if kind is float:
        return (default or 0.0) * 2 + 0.125
    if kind is str:
        return f"/tmp/{name}-value"
    raise AssertionError(f"teach tests/support/runspec.py a non-default value for {model.__name__}.{name}: {kind}")


def all_off_default(model: type[BaseModel], names: typing.Iterable[str] | None = None) -> dict[str, Any]:
    return {n: off_default(model, n) for n in (model.model_fields if names is None else names)}
