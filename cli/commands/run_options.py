"""The training options as command flags, generated from `RunOptions` (planner/specs/runspec.py).

`@run_option_flags()` gives a command one `--kebab-name` option per RunOptions field it does not
declare itself: the type (int, float, a Literal's choices, bool as `--x/--no-x`) and the bounds
(`ge`/`le` as the option's range) come from the field, the help is the field's description and
default. A field added to RunOptions is a flag of `meshplan train` and `meshplan submit` with no
edit here or in the commands. The command receives what the user set as `run_options` (field name →
value, unset ones left out), to merge over the config's `[train]` like `--set train.<name>=`;
bounds typer cannot express (`gt`) are checked there by RunOptions itself, naming the flag.

Typer builds a command's options from its signature (`inspect.signature`, then
`typing.get_type_hints` for parameters without a typer annotation): the decorator extends the
function's `__signature__` and `__annotations__` with generated `Annotated[..., typer.Option(...)]`
parameters and strips them again before the call.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Annotated, Any

import typer
from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo

from planner.specs.runspec import RunOptions, flag

PANEL = "Training options (over the config's train section)"


def run_option_flags(exclude: tuple[str, ...] = ()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A flag per RunOptions field the command has no parameter for and `exclude` does not name; the
    command is called with `run_options={field: value}` for those the user set."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "run_options"]
        names = [n for n in RunOptions.model_fields if n not in sig.parameters and n not in exclude]
        kw = inspect.Parameter.KEYWORD_ONLY
        generated = [inspect.Parameter(n, kw, default=None, annotation=option_type(n)) for n in names]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            given = {n: kwargs.pop(n) for n in names}
            return fn(**kwargs, run_options={n: v for n, v in given.items() if v is not None})

        command.__signature__ = sig.replace(parameters=[*own, *generated])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in (*own, *generated)} | {"return": None}
        return command

    return decorate


def option_type(name: str) -> Any:
    """`Annotated[<field type> | None, typer.Option(...)]` for one RunOptions field (None = not given)."""
    info = RunOptions.model_fields[name]
    kind = info.annotation
    lo = next((m.ge for m in info.metadata if isinstance(m, Ge)), None)
    hi = next((m.le for m in info.metadata if isinstance(m, Le)), None)
    decls = [flag(name)] + ([f"--no-{flag(name)[2:]}"] if kind is bool else [])
    option = typer.Option("/".join(decls), min=lo, max=hi, help=help_text(info), rich_help_panel=PANEL)
    return Annotated[kind | None, option]  # type: ignore[valid-type]


def help_text(info: FieldInfo) -> str:
    """The field's description, its open bounds (typer shows the closed ones) and its default."""
    default = info.get_default(call_default_factory=True)
    shown = ("true" if default else "false") if isinstance(default, bool) else default
    bounds = [f"> {m.gt}" for m in info.metadata if isinstance(m, Gt)]
    bounds += [f"< {m.lt}" for m in info.metadata if isinstance(m, Lt)]
    text = f"{info.description or ''}{' (' + ', '.join(bounds) + ')' if bounds else ''}; default {shown}"
    return text.replace("[", r"\[")  # rich markup would eat a [bracketed] word


def toml_value(value: Any) -> str:
    """A flag's value as a TOML `--set` value (nan/inf as TOML spells them, so RunOptions refuses them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def train_overrides(run_options: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """`train.<name>=VALUE` overrides for load_settings, and the flag each comes from (errors name it)."""
    sets = [f"train.{n}={toml_value(v)}" for n, v in run_options.items()]
    return sets, {f"train.{n}": flag(n) for n in run_options}
