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

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from planner.specs.model import ModelSpec
    from planner.specs.plan import Plan

ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="preset name, `custom` (give --layers --hidden --heads ...) or a model TOML file"),
]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="custom model: transformer blocks")]
HiddenOpt = Annotated[int | None, typer.Option("--hidden", help="custom model: hidden size")]
HeadsOpt = Annotated[int | None, typer.Option("--heads", help="custom model: attention heads")]
KvHeadsOpt = Annotated[int | None, typer.Option("--kv-heads", help="custom model: key/value heads (GQA)")]
FfnOpt = Annotated[int | None, typer.Option("--ffn-hidden", help="custom model: MLP hidden size")]
VocabOpt = Annotated[int | None, typer.Option("--vocab", help="custom model: vocabulary size (default 50257)")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", help="custom model: sequence length (default 2048)")]
FamilyOpt = Annotated[str | None, typer.Option("--family", help="custom model: gpt | llama (default gpt)")]

# ModelSpec field -> the option that sets it, so an error names what the user typed
OPTION_OF_FIELD = {
    "num_layers": "--layers",
    "hidden": "--hidden",
    "num_heads": "--heads",
    "num_kv_heads": "--kv-heads",
    "ffn_hidden": "--ffn-hidden",
    "vocab_size": "--vocab",
    "seq_len": "--seq-len",
    "family": "--family",
}
CUSTOM_DEFAULTS = {"vocab_size": 50257, "seq_len": 2048, "family": "gpt"}


def resolve_model(
    model: str | None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    vocab: int | None = None,
    seq_len: int | None = None,
    family: str | None = None,
) -> ModelSpec | None:
    """The ModelSpec the options name, or None when no --model was given (the config's preset applies)."""
    from planner.errors import MeshplanError
    from planner.specs.model import get_model

    dims = {
        "num_layers": layers,
        "hidden": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden": ffn_hidden,
        "vocab_size": vocab,
        "seq_len": seq_len,
        "family": family,
    }
    given = {k: v for k, v in dims.items() if v is not None}
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
    data = parse_toml(read_input(path, "--model", "model"), origin=path.name)
    return parse(ModelSpec, {"name": path.stem, **data}, origin=path.name)


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
