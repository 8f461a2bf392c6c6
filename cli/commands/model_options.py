"""The `--model` options every command shares: a preset name, `custom` with dimensions, or a model TOML.

`--model gpt2-small` names a preset; `--model custom --layers 32 --hidden 4096 --heads 32
[--kv-heads 8 --ffn-hidden 14336 --vocab 128256 --seq-len 8192 --family llama]` gives the
dimensions as torchtitan/Megatron users write them; `--model path/to/model.toml` reads a file whose
keys are ModelSpec's fields (see examples/models/). A plan records only its model's name and the
dimensions' fingerprint (Plan.provenance.model_fingerprint), so re-pricing a plan made for a custom
model needs the same `--model` again; `model_for_plan` checks the fingerprint and says so.

Like the other command modules this imports only typer at top level (`meshplan --help` stays fast).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from planner.specs.model import ModelSpec
    from planner.specs.plan import Plan

# The one definition of the model options: (parameter, flag, ModelSpec field or None for --model, help).
# `@model_option_flags()` gives a command all of them and calls it with `model_spec` resolved here.
MODEL_OPTIONS: tuple[tuple[str, str, str | None, type, str], ...] = (
    (
        "model",
        "--model",
        None,
        str,
        "preset name, `custom` (give --layers --hidden --heads ...), a model TOML file, "
        "or hf:DIR (a Hugging Face folder with config.json; --seq-len sets the trained length)",
    ),
    ("layers", "--layers", "num_layers", int, "custom model: transformer blocks"),
    ("hidden", "--hidden", "hidden", int, "custom model: hidden size"),
    ("heads", "--heads", "num_heads", int, "custom model: attention heads"),
    ("kv_heads", "--kv-heads", "num_kv_heads", int, "custom model: key/value heads (GQA)"),
    ("ffn_hidden", "--ffn-hidden", "ffn_hidden", int, "custom model: MLP hidden size"),
    ("vocab", "--vocab", "vocab_size", int, "custom model: vocabulary size (default 50257)"),
    ("seq_len", "--seq-len", "seq_len", int, "custom model: sequence length (default 2048)"),
    ("family", "--family", "family", str, "custom model: gpt | llama (default gpt)"),
)
# ModelSpec field -> the option that sets it, so an error names what the user typed
OPTION_OF_FIELD = {field: opt for _, opt, field, _, _ in MODEL_OPTIONS if field}
CUSTOM_DEFAULTS = {"vocab_size": 50257, "seq_len": 2048, "family": "gpt"}
PANEL = "Model (a preset, `custom` with its dimensions, or a model TOML)"


def model_option_flags() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The model options (MODEL_OPTIONS) as flags of the command, which is called with
    `model_spec=` the ModelSpec they name (None: no --model, the config's preset applies)."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        # `model_spec: ModelSpec | None` is the command's own: ModelSpec is imported only for type
        # checking (`meshplan --help` loads no model code), so it evaluates to a stand-in here
        sig = inspect.signature(fn, eval_str=True, locals={"ModelSpec": object})
        own = [p for p in sig.parameters.values() if p.name != "model_spec"]
        kw = inspect.Parameter.KEYWORD_ONLY
        generated = [
            inspect.Parameter(
                name,
                kw,
                default=None,
                annotation=Annotated[kind | None, typer.Option(opt, help=text, rich_help_panel=PANEL)],
            )
            for name, opt, _, kind, text in MODEL_OPTIONS
        ]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            given = {name: kwargs.pop(name) for name, *_ in MODEL_OPTIONS}
            return fn(**kwargs, model_spec=resolve_model(given.pop("model"), given))

        command.__signature__ = sig.replace(parameters=[*own, *generated])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in (*own, *generated)} | {"return": None}
        return command

    return decorate


def resolve_model(model: str | None, dims: dict[str, Any] | None = None) -> ModelSpec | None:
    """The ModelSpec `--model` and the dimension options (by parameter name) name, or None when no
    --model was given (the config's preset applies). The one place the model options are read."""
    from planner.errors import MeshplanError
    from planner.specs.model import get_model

    field = {name: f for name, _, f, _, _ in MODEL_OPTIONS if f}
    given = {field[k]: v for k, v in (dims or {}).items() if v is not None}
    if model is not None and model.startswith("hf:"):
        extra = [OPTION_OF_FIELD[k] for k in given if k != "seq_len"]
        if extra:
            raise MeshplanError("--model", model, f"{' '.join(extra)} come from config.json; pass only --seq-len")
        return read_hf_model(model, given.get("seq_len"))
    if model != "custom":
        if given:
            opts = " ".join(OPTION_OF_FIELD[k] for k in given)
            raise MeshplanError("--model", model, f"{opts} describe a custom model; pass --model custom with them")
        if model is None:
            return None
        if model.endswith(".toml") or Path(model).is_file():
            return read_model_file(Path(model))
        return get_model(model)
    for key in ("num_layers", "hidden", "num_heads"):
        if key not in given:
            raise MeshplanError(
                OPTION_OF_FIELD[key], None, "required with --model custom (with --layers --hidden --heads)"
            )
    return _build({**CUSTOM_DEFAULTS, **given, "name": "custom"}, "--model custom")


def read_model_file(path: Path) -> ModelSpec:
    """A model TOML: ModelSpec's fields at top level (name, family, num_layers, hidden, num_heads, ...)."""
    from planner.errors import MeshplanError
    from planner.inputs import read_input
    from planner.specs.model import ModelSpec
    from planner.validation import parse, parse_toml

    if not path.exists():
        raise MeshplanError("--model", str(path), "no such file; pass a preset, `custom` or a model TOML file")
    data = parse_toml(read_input(path, "--model", "model"), origin=str(path))
    try:
        return parse(ModelSpec, {"name": path.stem, **data}, origin=str(path))
    except MeshplanError as exc:
        # ModelSpec's own checks name "model.hidden" (a config's [model] section); in this file the key
        # is `hidden` at top level: the line names the file and the key the user wrote
        if exc.field.startswith(f"{path}: "):
            raise
        import re

        leaf, fix = exc.field.removeprefix("model."), re.sub(r"\bmodel\.(?=[a-z_]+=)", "", exc.fix)
        raise MeshplanError(f"{path}: {leaf}", exc.value, fix) from None


def read_hf_model(model: str, seq_len: int | None = None) -> ModelSpec:
    """`hf:DIR`: the folder's config.json as a ModelSpec (planner/specs/hf.py), named by the folder."""
    import json

    from planner.errors import MeshplanError
    from planner.specs.hf import from_hf_config

    folder = Path(model[len("hf:") :]).expanduser()
    path = folder / "config.json"
    if not path.is_file():
        raise MeshplanError("--model", model, "no config.json in that folder; pass a folder save_pretrained wrote")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MeshplanError("--model", str(path), f"not a JSON config ({exc.__class__.__name__})") from None
    return from_hf_config(config, name=folder.resolve().name or "hf", seq_len=seq_len)


def _build(data: dict, origin: str) -> ModelSpec:
    from planner.errors import MeshplanError
    from planner.specs.model import ModelSpec
    from planner.validation import parse

    try:
        return parse(ModelSpec, data)
    except MeshplanError as exc:
        # "model.num_kv_heads" or "num_layers" -> the option the user typed
        leaf = exc.field.rsplit(".", 1)[-1].strip()
        raise MeshplanError(OPTION_OF_FIELD.get(leaf, origin), exc.value, exc.fix) from None


def model_for_plan(plan: Plan, given: ModelSpec | None) -> ModelSpec:
    """The model a plan is priced or exported with: its preset, or the --model given, checked against the plan."""
    from planner.errors import MeshplanError
    from planner.specs.model import PRESETS

    recorded = plan.provenance.model_fingerprint
    if given is None:
        # a model file or job named like a preset records other dimensions: the preset is not its model
        if plan.model in PRESETS and (not recorded or PRESETS[plan.model].fingerprint() == recorded):
            return PRESETS[plan.model]
        raise MeshplanError(
            "--model",
            None,
            f"the plan was made for a custom model ({plan.model!r}); pass its dimensions again: "
            "--model custom --layers N --hidden H --heads A ... or --model FILE.toml",
        )
    if recorded and given.fingerprint() != recorded:
        raise MeshplanError(
            "--model",
            given.name,
            f"these dimensions (fingerprint {given.fingerprint()}) are not the plan's model's ({recorded}); "
            f"pass the model the plan was made for ({plan.model})",
        )
    if not recorded and plan.model in PRESETS and given.name != plan.model:
        raise MeshplanError("--model", given.name, f"the plan was written for {plan.model}; pass --model {plan.model}")
    return given
