"""RunConfig: every knob of a meshplan run, read from TOML at the CLI edge.

`--set section.key=value` overrides a field (the value is parsed as TOML, so `search.top_k=5`
is an int and `profile.mbs=[1,2]` a list). Each component receives only its own section.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import MeshplanError
from planner.limits import MAX_GLOBAL_BATCH, MAX_SEQ, MAX_TOP
from planner.specs.runspec import RunOptions
from planner.validation import parse, parse_toml

# The plan search's time budget wherever a search runs without one given: `meshplan plan`, plan_flow,
# re-planning's relayout search, the scheduler's speed model and planner.search.search itself. The
# search is anytime (it stops at the budget once it holds a plan, and says what it may have missed);
# the budget counts the search thread's CPU seconds, so a loaded machine gets the same plans.
SEARCH_BUDGET_S = 2.0
# How long `meshplan serve` waits for its groups of ranks to come up (weights built, connected to the
# router) before it stops them: the serving session's one launch timeout (tasks/serve.py, launcher/serving.py).
SERVE_START_TIMEOUT_S = 300.0
# The launch timeouts no flag sets, each of one subprocess started through launcher/: the identity probe
# (a torch import's time: launcher/host.py identify, discovery's probe-identity task), the profiler's
# device probe (tasks/profile.py local_device) and the checkpoint-to-Hugging-Face export (tasks/weights.py).
IDENTIFY_TIMEOUT_S = 120.0
DEVICE_PROBE_TIMEOUT_S = 150.0
EXPORT_TIMEOUT_S = 1800.0
# A Prefect task that waits on such a subprocess times out this much after the subprocess's own timeout,
# so the subprocess is stopped first and its one-line reason is what the user reads.
TASK_GRACE_S = 60.0
# Waits that are no launch's but have no flag either: a served request's wait for its ranks' answer
# (launcher/router.py; the replaying client waits as long) and one Slurm control command (sbatch,
# squeue, scontrol, scancel: launcher/slurm.py).
SERVE_REQUEST_TIMEOUT_S = 60.0
SLURM_COMMAND_TIMEOUT_S = 30.0


class _Section(BaseModel):
    # nan/inf are never a meaningful budget, rate or timeout: refused like any other bad value
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class StateConfig(_Section):
    dir: str = Field(default=".meshplan", description="state folder: DuckDB file, Prefect home, run folders")
    db: str = Field(default="", description="DuckDB file; empty = <dir>/meshplan.duckdb")


class DiscoverConfig(_Section):
    cluster: str = Field(default="", description="cluster TOML file; empty = probe this machine")
    num_ranks: int = Field(default=2, gt=0, le=64, description="CPU ranks to probe when no GPU is present")
    matmul_size: int = Field(default=1024, gt=0, description="square matmul size for the FLOP/s probe")
    message_sizes: tuple[int, ...] = Field(
        default=(1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22), description="bytes per message for the α–β fit"
    )
    refresh: bool = Field(default=False, description="re-measure even if a snapshot of this hardware exists")
    repeats: int = Field(default=5, gt=0, description="timed repetitions per measurement (median reported)")
    timeout_s: float = Field(default=300, gt=0, description="outer kill for the torchrun bench")


class ProfileConfig(_Section):
    mbs: tuple[int, ...] = Field(default=(1, 2, 4), description="micro-batch sizes to profile")
    seq: tuple[int, ...] = Field(default=(), description="sequence lengths; empty = the model's seq_len")
    tp: tuple[int, ...] = Field(default=(1, 2), description="tensor-parallel degrees to profile")
    dtype: Literal["fp32", "bf16", "fp16"] = Field(default="fp32", description="dtype on CPU (GPUs use bf16)")
    repeats: int = Field(default=5, gt=0, description="timed repetitions per measurement (median reported)")
    timeout_s: float = Field(default=600, gt=0)
    recompute: tuple[bool, ...] = Field(default=(False, True), description="activation-recompute settings to profile")
    min_block_s: float = Field(default=0.05, gt=0, description="minimum seconds of one timed block of iterations")
    retries: int = Field(default=2, ge=0, description="profiler subprocess retries (a retry resumes its out file)")

    @property
    def task_timeout_s(self) -> float:
        """The Prefect timeout of a profiling task: every try of its subprocess, then the grace."""
        return self.timeout_s * (self.retries + 1) + TASK_GRACE_S


class SearchConfig(_Section):
    global_batch: int = Field(default=8, gt=0, le=MAX_GLOBAL_BATCH, description="samples per optimizer step")
    seq: int = Field(default=0, ge=0, le=MAX_SEQ, description="sequence length; 0 = the model's seq_len")
    top_k: int = Field(default=5, gt=0, le=MAX_TOP)
    time_budget_s: float = Field(default=SEARCH_BUDGET_S, gt=0, description="plan search budget; the search is anytime")
    fp8: bool = Field(
        default=False,
        description="also search fp8 linears where every device has an fp8 peak (plans to export: the runtime runs dtype)",
    )
    runtime: Literal["meshplan", "torchtitan", "megatron", "deepspeed", "composer"] = Field(
        default="meshplan",
        description="the training runtime plans are priced for (planner.cost.runtimes); --runtime overrides it",
    )


class TrainConfig(RunOptions):
    """`[train]`: the ranks' training options (RunOptions, planner/specs/runspec.py: their one
    definition and default) plus how the flow launches them."""

    nproc_per_node: int | None = Field(
        default=None, gt=0, description="ranks per node; None = the plan's devices ÷ nodes"
    )
    max_restarts: int = Field(
        default=0, ge=0, description="torchrun elastic restarts (resume from the latest checkpoint)"
    )
    timeout_s: float = Field(default=900, gt=0, description="outer kill of the whole training job")
    rdzv_endpoint: str = Field(default="127.0.0.1:29500", description="HOST:PORT of node 0 for multi-node runs")

    def options(self) -> dict[str, Any]:
        """The RunOptions fields of this section, as RunSpec keys."""
        return {k: getattr(self, k) for k in RunOptions.model_fields}


class ReplanConfig(_Section):
    threshold: float = Field(default=0.10, gt=0, description="relative slowdown that counts")
    persistence_steps: int = Field(default=5, gt=0, description="steps in the rolling median a slowdown must move")
    window: int = Field(default=10, gt=1, description="steps in the robust baseline")
    margin_s: float = Field(default=1.0, ge=0, description="extra gain a switch must earn")
    min_gain: float = Field(default=0.05, ge=0, lt=1, description="relative step-time gain a switch needs (hysteresis)")
    cooldown_steps: int = Field(default=5, ge=0, description="steps after a switch before the next one")
    search_budget_s: float = Field(default=SEARCH_BUDGET_S, gt=0, description="plan-search budget for a relayout")
    relayout: bool = Field(default=True, description="consider relayouts (checkpoint → relaunch), not only rebalances")
    poll_s: float = Field(default=0.5, gt=0, description="seconds between telemetry polls of a live run")


class UiConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=4200, gt=0, lt=65536)


class RunConfig(_Section):
    model: str = Field(default="tiny", description="model preset name")
    state: StateConfig = StateConfig()
    discover: DiscoverConfig = DiscoverConfig()
    profile: ProfileConfig = ProfileConfig()
    search: SearchConfig = SearchConfig()
    train: TrainConfig = TrainConfig()
    replan: ReplanConfig = ReplanConfig()
    ui: UiConfig = UiConfig()

    def fingerprint(self, section: str | None = None) -> str:
        data = self.model_dump(mode="json") if section is None else getattr(self, section).model_dump(mode="json")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` strings to a config dict; values are TOML literals (bare words = strings)."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise MeshplanError("--set", item, "write it as section.key=value, e.g. --set search.top_k=3")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        *path, leaf = key.strip().split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise MeshplanError("--set", item, f"{part} is a value, not a section")
        node[leaf] = value
    return out


def load_config(
    text: str | None = None, overrides: list[str] | None = None, origin: str = "meshplan.toml"
) -> RunConfig:
    """RunConfig from TOML text (None = embedded defaults) plus overrides; errors name the field."""
    data = parse_toml(text, origin) if text else {}
    return parse(RunConfig, apply_overrides(data, overrides or []), origin)
