"""`RunSpec`: everything a training rank is told, written once.

One frozen value travels from the config to the ranks unchanged: `[train]` (TrainConfig) is
`RunOptions` plus the launch-side knobs, `TrainRequest` (flows/requests.py) holds a `RunSpec`, the
launcher's `Launch` holds it, writes it onto the rank command line (`to_argv`), and every rank of
`python -m worker.train` parses it back (`from_argv`) — no other parser, no restated defaults.

- `RunOptions`: the training options a config or a job may set (steps, lr, optimizer, ...). A field
  added here is a `[train]` key, a `meshplan train --set train.<name>=` override, a job option and a
  rank flag `--<name>` at once; only its use in the rank's loop (worker/train.py) is left to write.
- `RunSpec` = `RunOptions` + what a run names for itself (the model, resume, faults): not config.
- `RankSite`: where one launch's ranks run (plan file, run folder, generation) — facts the flow and
  launcher fill in per launch, not options; on the same command line, with the same codec.

The command line is `--<field-with-dashes> VALUE` for every field off its default; a nested model
(faults) is its compact JSON, a tuple of numbers comma-joined (`--message-sizes 1024,16384`). A bad or unknown flag is one MeshplanError naming it.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Self, get_origin

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import MeshplanError
from planner.limits import MAX_LR, MAX_SEED, MAX_STEPS
from planner.specs.faults import NO_FAULTS, FaultSpec
from planner.validation import parse


class ArgvModel(BaseModel):
    """A frozen model that writes itself as `--flag value` pairs and reads them back."""

    # nan/inf are never a meaningful rate or timeout: refused like any other bad value
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    def to_argv(self) -> list[str]:
        """`--name value` for every field off its default, in field order."""
        out: list[str] = []
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if not info.is_required() and value == info.get_default(call_default_factory=True):
                continue
            if isinstance(value, BaseModel):  # a nested spec writes itself (FaultSpec.to_arg: compact JSON)
                text = value.to_arg() if hasattr(value, "to_arg") else value.model_dump_json(exclude_defaults=True)
            elif isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, tuple | list):
                text = ",".join(map(str, value))
            else:
                text = str(value)  # str(float) round-trips exactly
            out += [flag(name), text]
        return out

    @classmethod
    def from_argv(cls, argv: list[str]) -> Self:
        return cls.from_pairs(argv_pairs(argv))

    @classmethod
    def from_pairs(cls, pairs: dict[str, str]) -> Self:
        data: dict[str, Any] = {}
        for name, text in pairs.items():
            info = cls.model_fields.get(name)
            if info is None:
                known = ", ".join(flag(f) for f in cls.model_fields)
                raise MeshplanError(flag(name), text, f"unknown option; known: {known}")
            kind = info.annotation
            if isinstance(kind, type) and hasattr(kind, "from_arg"):
                data[name] = kind.from_arg(text)  # errors name the nested field: `--faults: slow_factor`
            elif get_origin(kind) in (tuple, list):
                data[name] = [x.strip() for x in text.split(",") if x.strip()]  # items validated below
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                try:
                    data[name] = json.loads(text) if text.strip() else {}
                except json.JSONDecodeError as exc:
                    raise MeshplanError(flag(name), text, f"not JSON ({exc.msg})") from None
            else:
                data[name] = text  # validated (and converted) by the field's own type below
        return parse(cls, data, "argv")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def argv_pairs(argv: list[str]) -> dict[str, str]:
    """`--a-b 1 --c=x` → {"a_b": "1", "c": "x"}; a stray word or a flag without its value is refused."""
    pairs: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--") or len(word) == 2:
            raise MeshplanError("argv", word, "expected --option VALUE")
        name, eq, value = word[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise MeshplanError(word, None, "give it a value")
            value, i = argv[i + 1], i + 1
        pairs[name.replace("-", "_")] = value
        i += 1
    return pairs


class RunOptions(ArgvModel):
    """The training options: `[train]` keys, job options and rank flags, each with its one default."""

    steps: int = Field(default=20, gt=0, description="train until this many optimizer steps in total")
    data: str = Field(
        default="text",
        min_length=1,
        max_length=4096,
        description="training batches: synthetic | text | a folder `meshplan data prepare` wrote",
        json_schema_extra={"example": "synthetic"},
    )
    lr: float = Field(default=3e-3, gt=0, le=MAX_LR, description="learning rate")
    optimizer: Literal["adamw", "sgd"] = Field(
        default="adamw", description="adamw; sgd for exact-equivalence tests (its update is linear in the gradient)"
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="weight init and synthetic data seed")
    checkpoint_every: int = Field(default=10, ge=0, description="steps between checkpoints; 0 = only at the end")
    collective_timeout_s: float = Field(
        default=300.0, gt=0, description="process-group / store timeout inside the ranks"
    )
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        default="auto", description="compute dtype of the ranks; auto = the plan's dtype on CUDA, fp32 on CPU"
    )
    grad_clip_norm: float = Field(
        default=0.0, ge=0, description="clip the global gradient norm (over every rank) to this; 0 = off"
    )
    init: str = Field(
        default="",
        max_length=4096,
        description="initial weights: hf:DIR (a Hugging Face folder's safetensors); empty = seeded random init",
    )
    eval_every: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="validation loss every this many steps (a prepared --data); 0 = off"
    )
    eval_batches: int = Field(default=2, gt=0, le=10_000, description="validation batches per evaluation")


class RunSpec(RunOptions):
    """Everything a rank is told: the options plus what this run names for itself."""

    model: str = Field(default="", description="model preset; empty = the plan's model")
    model_json: str | None = Field(
        default=None, description="ModelSpec JSON file: the model by its dimensions (a custom model); None = a preset"
    )
    resume: str = Field(default="auto", description="auto | none | a checkpoint or run folder (may be another plan's)")
    fresh_start: bool = Field(
        default=False, description="when every checkpoint of the run folder is unreadable, train from step 0"
    )
    faults: FaultSpec = Field(default=NO_FAULTS, description="faults the ranks inject (planner/specs/faults.py)")

    @property
    def resume_mode(self) -> str:
        """What the rank resumes from: `fresh-start` is `auto` that may start over (worker/checkpoint.py)."""
        return "fresh-start" if self.fresh_start and self.resume == "auto" else self.resume


def option_fields() -> tuple[str, ...]:
    return tuple(RunOptions.model_fields)


class RankSite(ArgvModel):
    """Where one launch's ranks run: filled in per launch by the flow and the launcher, never configured."""

    plan: str = Field(description="plan JSON file in the run folder")
    run_dir: str = Field(description="run folder: telemetry, checkpoints, control.json")
    run_id: str = Field(default="", description="the run's id; empty = the run folder's name")
    generation: int = Field(default=0, ge=0, description="this launch's generation; ranks exit once superseded")
    control_from_version: int = Field(default=0, ge=0, description="control.json versions up to this are not ours")


def rank_argv(site: RankSite, spec: RunSpec) -> list[str]:
    """The arguments of `python -m worker.train`."""
    return site.to_argv() + spec.to_argv()


def parse_rank_argv(argv: list[str]) -> tuple[RankSite, RunSpec]:
    """`python -m worker.train`'s arguments back into (site, spec); an unknown flag names itself."""
    pairs = argv_pairs(argv)
    unknown = sorted(set(pairs) - set(RankSite.model_fields) - set(RunSpec.model_fields))
    if unknown:
        known = ", ".join(flag(f) for f in (*RankSite.model_fields, *RunSpec.model_fields))
        raise MeshplanError(flag(unknown[0]), pairs[unknown[0]], f"unknown option; known: {known}")
    site = RankSite.from_pairs({k: v for k, v in pairs.items() if k in RankSite.model_fields})
    spec = RunSpec.from_pairs({k: v for k, v in pairs.items() if k in RunSpec.model_fields})
    return site, spec
