"""The Plan: one type for a searched plan and a hand-written one (Alpa's ManualStageOption idea).

A plan is one pipeline of stages, replicated `dp` times. Stage i owns transformer blocks
[layer_start, layer_end); the first stage also holds the embedding, the last the final norm, LM head
and loss. Each stage runs on `dp × tp` devices, listed replica-major (replica r uses
`device_ids[r*tp:(r+1)*tp]`), so replicas may sit on different device kinds. Replica r processes
`batch_shares[r]` samples per step as `batch_shares[r] / micro_batch_size` micro-batches, which
lets unequal replicas take unequal shares; gradients are weighted by share so the update equals the
full-batch one. Under the interleaved schedule the list holds pp × v stages and stage i runs on the
devices of stage i mod pp (v virtual stages per rank).

Stages may differ in tp and in dp (as Metis and Sailor plan). `dp` is then the number of pipeline
replicas, gcd of the stages' dp: batch share r belongs to pipeline replica r, and stage s holds
q_s = dp_s / dp replicas per pipeline replica (replicas r·q_s … (r+1)·q_s − 1), each running every
micro-batch of that pipeline as one of q_s equal slices of micro_batch_size / q_s samples (so q_s
must divide micro_batch_size). `micro_batch_size` is always the micro-batch of one pipeline replica,
which is what every stage boundary carries in total; with one dp for all stages, q_s = 1 and this is
the plain replicated pipeline above. Example: stage 0 at tp2×dp1, stage 1 at tp1×dp2, dp = 1, one
share; stage 1's two replicas each run half of every micro-batch.

Context parallelism (`StagePlan.cp`, equal on every stage): each replica is cp × tp devices, listed
cp-major (cp rank c of replica r uses `device_ids[(r·cp + c)·tp : (r·cp + c + 1)·tp]`), and each cp
rank runs seq_len / cp tokens of every sample: chunks c and 2·cp − 1 − c of 2·cp equal chunks (the
load-balanced causal split of Llama 3 / Megatron-LM), so 2·cp must divide seq_len. A stage has
dp × cp × tp devices; gradients sum over its dp × cp ranks.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import MeshplanError
from planner.validation import parse, parse_json_strict

PLAN_VERSION = 1
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
Recompute = Literal["none", "selective", "full"]
Sharding = Literal["none", "zero1", "zero2", "zero3"]
# How the stack computes attention and the loss (planner.cost.memory prices each):
# sdpa = torch's scaled_dot_product_attention (flash kernel, no s×s matrix kept) on b×heads×s×d
# tensors, whose output is transposed into a new b×s×h copy for the output projection (meshplan's
# runtime); flash = FlashAttention's b×s×heads×d kernel, whose saved output is the projection's
# input (no copy); eager = softmax(QKᵀ)·V materialised, s×s probabilities kept per head.
Attention = Literal["sdpa", "flash", "eager"]
# torch = F.cross_entropy on an fp32 copy of the logits (meshplan's runtime, HF / torch autocast);
# vocab-parallel = Megatron-LM's fused vocab-parallel cross entropy on an fp32 copy, softmax and
# gradient in place; fused = a kernel reading the working-dtype logits and writing their gradient
# (flash-attn's CrossEntropyLoss, llm-foundry's default `fused_crossentropy`).
Loss = Literal["torch", "vocab-parallel", "fused"]
# the Plan fields added after version 1 was frozen: left out of the fingerprint at their default,
# so a plan written before them keeps its id
_LATER_DEFAULTS = {"attention": "sdpa", "loss": "torch", "dropout": False, "fp8": False}
_LATER_STAGE_DEFAULTS = {"sequence_parallel": False, "recompute_every": 1, "cp": 1}


class StagePlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    layer_start: int = Field(ge=0)
    layer_end: int = Field(gt=0)
    device_ids: tuple[int, ...] = Field(min_length=1)
    tp: int = Field(default=1, gt=0)
    dp: int = Field(default=1, gt=0)
    recompute: Recompute = "none"
    sharding: Sharding = "none"
    sequence_parallel: bool = Field(
        default=False, description="norm/dropout activations sharded over tp (Korthikanti et al. 2022 §4.2.2)"
    )
    recompute_every: int = Field(
        default=1,
        ge=1,
        description="with recompute='full', recompute one block in every k (torchtitan's layer AC frequency)",
    )
    cp: int = Field(
        default=1,
        gt=0,
        description="context parallelism: each replica's sequence split over cp ranks (2·cp load-balanced causal "
        "chunks, K/V all-gathered per attention layer as Llama 3 trains); equal on every stage",
    )

    @model_validator(mode="after")
    def _check(self) -> StagePlan:
        if self.layer_end <= self.layer_start:
            raise MeshplanError(
                "stage.layer_end",
                self.layer_end,
                f"must be > layer_start={self.layer_start} (a stage owns at least one block)",
            )
        if len(self.device_ids) != self.tp * self.cp * self.dp:
            need = self.dp * self.cp * self.tp
            shape = f"dp×cp×tp = {self.dp}×{self.cp}×{self.tp}" if self.cp > 1 else f"dp×tp = {self.dp}×{self.tp}"
            raise MeshplanError("stage.device_ids", len(self.device_ids), f"a stage needs {shape} = {need} devices")
        if len(set(self.device_ids)) != len(self.device_ids):
            raise MeshplanError("stage.device_ids", list(self.device_ids), "a device appears twice in one stage")
        if self.recompute_every > 1 and self.recompute != "full":
            raise MeshplanError(
                "stage.recompute_every",
                self.recompute_every,
                f"recomputing every k-th block needs recompute='full' (got {self.recompute!r}); set it or use 1",
            )
        return self

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start

    def replica_devices(self, r: int) -> tuple[int, ...]:
        """Replica r's cp × tp devices, cp-major (cp rank c uses [c·tp, (c+1)·tp) of them)."""
        w = self.tp * self.cp
        return self.device_ids[r * w : (r + 1) * w]

    def tp_devices(self, r: int, c: int = 0) -> tuple[int, ...]:
        """The tp group of replica r's cp rank c."""
        start = (r * self.cp + c) * self.tp
        return self.device_ids[start : start + self.tp]


class CostBreakdown(BaseModel):
    """Predicted cost of one optimizer step (all times in seconds, memory in bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_time_s: float = Field(ge=0)
    compute_s: float = Field(ge=0, description="slowest replica's busiest-stage compute incl. recompute")
    bubble_s: float = Field(ge=0)
    pp_comm_s: float = Field(ge=0, description="exposed send/recv between stages")
    dp_comm_s: float = Field(ge=0, description="exposed gradient sync / parameter gathers")
    tp_comm_s: float = Field(ge=0, description="tensor-parallel collectives inside blocks")
    cp_comm_s: float = Field(default=0.0, ge=0, description="context parallelism's K/V exchange inside blocks")
    optimizer_s: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0)
    mfu: float = Field(ge=0)
    peak_memory_bytes: tuple[int, ...] = Field(description="per stage, the largest over its replicas")
    memory_capacity_bytes: tuple[int, ...] = Field(description="per stage, the smallest device memory")
    bottleneck: str
    feasible: bool = True
    notes: tuple[str, ...] = ()


class Provenance(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: str = "manual"
    cost_model_version: str = ""
    config_fingerprint: str = ""
    profile_fingerprint: str = ""
    cluster_fingerprint: str = ""
    model_fingerprint: str = ""


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = PLAN_VERSION
    model: str = Field(description="model preset name (or 'custom')")
    cluster: str = Field(description="cluster name")
    global_batch_size: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    micro_batch_size: int = Field(gt=0)
    schedule: Schedule = "1f1b"
    virtual_stages: int = Field(default=1, gt=0, description="stages per rank (interleaved schedule only)")
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    attention: Attention = "sdpa"
    loss: Loss = "torch"
    dropout: bool = Field(default=False, description="hidden and attention dropout on (masks kept for backward)")
    fp8: bool = Field(
        default=False,
        description="the blocks' linear layers run fp8 GEMMs (torchao Float8 tensorwise / Transformer Engine); "
        "master weights, attention, embedding, head and the other activations stay in dtype",
    )
    stages: tuple[StagePlan, ...] = Field(min_length=1)
    batch_shares: tuple[int, ...] = Field(min_length=1, description="samples per step per replica")
    predicted: CostBreakdown | None = None
    provenance: Provenance = Provenance()

    @model_validator(mode="after")
    def _check(self) -> Plan:
        st = self.stages
        if st[0].layer_start != 0:
            raise MeshplanError("stages[0].layer_start", st[0].layer_start, "the first stage must start at layer 0")
        for i, (a, b) in enumerate(zip(st, st[1:], strict=False)):
            if b.layer_start != a.layer_end:
                what = "overlap" if b.layer_start < a.layer_end else "leave a gap"
                raise MeshplanError(
                    f"stages[{i + 1}].layer_start",
                    b.layer_start,
                    f"stages {i} and {i + 1} {what}: stage {i} ends at {a.layer_end}; start stage {i + 1} there",
                )
        for i, s in enumerate(st):
            q = s.dp // self.dp
            if self.micro_batch_size % q:
                raise MeshplanError(
                    f"stages[{i}].dp",
                    s.dp,
                    f"stage {i} splits each micro-batch over {q} replicas (dp {s.dp} / {self.dp} pipeline replicas); "
                    f"make micro_batch_size={self.micro_batch_size} a multiple of {q}",
                )
        if len(self.batch_shares) != self.dp:
            raise MeshplanError("batch_shares", list(self.batch_shares), f"need one share per replica (dp={self.dp})")
        if sum(self.batch_shares) != self.global_batch_size:
            raise MeshplanError(
                "batch_shares",
                list(self.batch_shares),
                f"sum {sum(self.batch_shares)} != global_batch_size {self.global_batch_size}; make them add up",
            )
        for r, share in enumerate(self.batch_shares):
            if share <= 0 or share % self.micro_batch_size:
                raise MeshplanError(
                    f"batch_shares[{r}]",
                    share,
                    f"must be a positive multiple of micro_batch_size={self.micro_batch_size}",
                )
        self._check_cp()
        if self.fp8 and self.dtype == "fp32":
            raise MeshplanError(
                "fp8", True, "fp8 linears run under bf16/fp16 mixed precision (torchao, Transformer Engine); set dtype"
            )
        self._check_devices()
        return self

    def _check_cp(self) -> None:
        cps = [s.cp for s in self.stages]
        if len(set(cps)) > 1:
            raise MeshplanError(
                "stages.cp",
                cps,
                "every stage needs the same cp: a boundary sends each cp rank's sequence chunk to the same cp rank "
                "of the next stage; use one value",
            )
        cp = cps[0]
        if cp > 1 and self.seq_len % (2 * cp):
            raise MeshplanError(
                "stages.cp",
                cp,
                f"context parallelism cuts seq_len={self.seq_len} into 2·cp = {2 * cp} equal load-balanced causal "
                f"chunks; choose a cp with 2·cp dividing seq_len",
            )

    def _check_devices(self) -> None:
        v = self.virtual_stages
        if self.schedule != "interleaved-1f1b" and v != 1:
            raise MeshplanError(
                "virtual_stages", v, "only the interleaved-1f1b schedule has virtual stages; set it to 1"
            )
        if len(self.stages) % v:
            raise MeshplanError("stages", len(self.stages), f"interleaved needs pp × virtual_stages stages (v={v})")
        pp = len(self.stages) // v
        seen: dict[int, int] = {}
        for i, s in enumerate(self.stages):
            if i >= pp:
                home = self.stages[i % pp]
                if s.device_ids != home.device_ids or s.tp != home.tp:
                    raise MeshplanError(
                        f"stages[{i}].device_ids",
                        list(s.device_ids[:4]),
                        f"virtual stage {i} must run on the devices of stage {i % pp}",
                    )
                continue
            for d in s.device_ids:
                if d in seen:
                    raise MeshplanError(f"stages[{i}].device_ids", d, f"device {d} is already used by stage {seen[d]}")
                seen[d] = i

    @property
    def dp(self) -> int:
        """Pipeline replicas: every stage's dp when they agree, else their gcd (see the docstring)."""
        return math.gcd(*(s.dp for s in self.stages))

    @property
    def cp(self) -> int:
        """Context-parallel degree (equal on every stage)."""
        return self.stages[0].cp

    @property
    def pp(self) -> int:
        return len(self.stages) // self.virtual_stages

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layer_end

    @property
    def num_devices(self) -> int:
        return sum(len(s.device_ids) for s in self.stages[: self.pp])

    def num_microbatches(self, replica: int = 0) -> int:
        return self.batch_shares[replica] // self.micro_batch_size

    def fingerprint(self) -> str:
        """Id of the layout (excludes predictions and provenance), stable across JSON round trips."""
        data = self.model_dump(mode="json", exclude={"predicted", "provenance"})
        for k, v in _LATER_DEFAULTS.items():
            if data[k] == v:
                del data[k]
        for st in data["stages"]:
            for k, v in _LATER_STAGE_DEFAULTS.items():
                if st[k] == v:
                    del st[k]
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def parse_plan(data: dict, origin: str = "plan") -> Plan:
    return parse(Plan, data, origin)


def parse_plan_json(text: str, origin: str = "plan.json") -> Plan:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeshplanError(origin, "JSON", f"not valid JSON ({exc}); fix the syntax or re-export the plan") from None
    if not isinstance(data, dict):
        raise MeshplanError(origin, type(data).__name__, "a plan is a JSON object; see tests/data/plan_v1.json")
    if data.get("version", PLAN_VERSION) != PLAN_VERSION:
        raise MeshplanError(
            f"{origin}: version", data.get("version"), f"this meshplan reads plan version {PLAN_VERSION}; re-plan"
        )
    return parse_json_strict(Plan, text, origin)


def check_plan_against(plan: Plan, num_layers: int, num_devices: int) -> None:
    """Checks that need the model and cluster: layers covered, device ids in range."""
    if plan.num_layers != num_layers:
        raise MeshplanError(
            "stages[-1].layer_end", plan.num_layers, f"the model has {num_layers} blocks; the last stage must end there"
        )
    for i, s in enumerate(plan.stages):
        bad = [d for d in s.device_ids if not 0 <= d < num_devices]
        if bad:
            raise MeshplanError(f"stages[{i}].device_ids", bad[0], f"the cluster has devices 0..{num_devices - 1}")
