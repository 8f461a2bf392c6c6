"""Turn pydantic validation failures into one-line `MeshplanError`s naming field, value and fix."""

from __future__ import annotations

import tomllib
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from planner.errors import MeshplanError

M = TypeVar("M", bound=BaseModel)

_FIXES = {
    "extra_forbidden": "unknown field; remove it or check its spelling",
    "missing": "required; add it",
    "greater_than": "too small",
    "greater_than_equal": "too small",
    "less_than_equal": "too large",
    "int_type": "must be a JSON integer, not a string or a decimal",
    "float_type": "must be a JSON number, not a string",
    "bool_type": "must be true or false",
}


def parse(model: type[M], data: Any, origin: str = "") -> M:
    """Validate `data` as `model`; on failure raise a MeshplanError for the first problem found."""
    try:
        return model.model_validate(data)
    except MeshplanError:
        raise
    except ValidationError as exc:
        raise _as_error(exc, origin) from None


def parse_json_strict(model: type[M], text: str, origin: str = "") -> M:
    """Validate JSON text as `model` in strict mode: a number written as a string (`"tp": "2"`) is
    refused naming the field, not silently converted, since a file whose types drift is one a
    person or another tool edited by hand and may mean something else."""
    try:
        return model.model_validate_json(text, strict=True)
    except MeshplanError:
        raise
    except ValidationError as exc:
        raise _as_error(exc, origin) from None


def _as_error(exc: ValidationError, origin: str) -> MeshplanError:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or model_name(exc)
    if origin:
        field = f"{origin}: {field}"
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, MeshplanError):
        return MeshplanError(f"{field}" if not cause.field else cause.field, cause.value, cause.fix)
    msg = err["msg"].removeprefix("Value error, ")
    fix = _FIXES.get(err["type"], "")
    fix = f"{fix} ({msg})" if fix and fix not in msg else msg
    value = err.get("input", None) if err["type"] != "missing" else None
    if isinstance(value, dict):
        value = "{…}"
    return MeshplanError(field, value, fix)


def model_name(exc: ValidationError) -> str:
    return exc.title


def parse_toml(text: str, origin: str) -> dict[str, Any]:
    """TOML text to a dict; a syntax error names the file, line and column."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MeshplanError(origin, "TOML", f"not valid TOML: {exc}; fix the syntax there") from None
