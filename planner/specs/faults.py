"""`FaultSpec`: the faults a training run injects into its own ranks, one value end to end.

The CLI (`meshplan train --slow-*`), `train_flow`, the launcher and the ranks all hold this one
frozen type: the launcher writes it onto the rank command line once (`--faults JSON`,
`to_arg`), `python -m worker.train` parses it once (`from_arg`), and worker/faults.py acts on it.
Three faults, each off by default:
- slow compute: rank `slow_rank`'s compute lasts `slow_factor` × its healthy mean from step
  `slow_from_step` (a throttled GPU);
- slow link: before rank `link_rank` sends, it waits `link_s_per_mib` s per MiB sent plus
  `link_s_per_msg` s per message, from step `link_from_step` (a degraded link);
- a crash: rank `kill_rank` SIGKILLs itself at the start of step `kill_step`, in the first
  torchrun attempt only (a lost GPU), so the restart-and-resume path runs.
Ranks are global ranks of the launch; a relaunch on another plan moves each fault with its device
(`relabelled`), or drops it with the device.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import MeshplanError
from planner.validation import parse


class FaultSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slow_rank: int = Field(default=-1, ge=-1, description="rank whose compute is stretched; -1 = none")
    slow_factor: float = Field(default=1.0, ge=1.0, description="compute time multiplier (2 = twice as slow)")
    slow_from_step: int = Field(default=0, ge=0, description="first slowed step")
    link_rank: int = Field(default=-1, ge=-1, description="rank whose sends are delayed; -1 = none")
    link_s_per_mib: float = Field(default=0.0, ge=0.0, description="extra seconds per MiB sent")
    link_s_per_msg: float = Field(default=0.0, ge=0.0, description="extra seconds per message sent")
    link_from_step: int = Field(default=0, ge=0, description="first delayed step")
    kill_rank: int = Field(default=-1, ge=-1, description="rank that SIGKILLs itself (first attempt only)")
    kill_step: int = Field(default=0, ge=0, description="step at whose start it does")

    @model_validator(mode="after")
    def _fault_needs_its_rank(self) -> FaultSpec:
        if self.slow_factor > 1.0 and self.slow_rank < 0:
            raise MeshplanError("slow_rank", self.slow_rank, "a slowdown needs the rank it slows (>= 0)")
        if (self.link_s_per_mib > 0 or self.link_s_per_msg > 0) and self.link_rank < 0:
            raise MeshplanError("link_rank", self.link_rank, "a link delay needs the rank whose sends it delays")
        return self

    @property
    def compute_on(self) -> bool:
        return self.slow_rank >= 0 and self.slow_factor > 1.0

    @property
    def link_on(self) -> bool:
        return self.link_rank >= 0 and (self.link_s_per_mib > 0 or self.link_s_per_msg > 0)

    @property
    def kill_on(self) -> bool:
        return self.kill_rank >= 0

    @property
    def any_on(self) -> bool:
        return self.compute_on or self.link_on or self.kill_on

    def to_arg(self) -> str:
        """The compact JSON the launcher passes as `--faults` (only fields off their default)."""
        return self.model_dump_json(exclude_defaults=True)

    @classmethod
    def from_arg(cls, text: str) -> FaultSpec:
        """Parse `--faults`: JSON text of the fields; an error names the field (`--faults: slow_factor`)."""
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise MeshplanError("--faults", text, f"not JSON ({exc.msg}); e.g. '{{\"slow_rank\": 1}}'") from None
        return parse(cls, data, "--faults")

    def relabelled(self, mapping: dict[int, int]) -> FaultSpec:
        """The same faults after a relaunch that renumbers ranks `old -> new`; a dropped rank's fault goes."""
        moved = {f: mapping.get(getattr(self, f), -1) for f in ("slow_rank", "link_rank", "kill_rank")}
        return FaultSpec.model_validate({**self.model_dump(), **moved, **_off_if_dropped(self, moved)})


def _off_if_dropped(spec: FaultSpec, moved: dict[str, int]) -> dict[str, float]:
    """A fault whose rank left the run is off entirely (its factor and delays back to none)."""
    off: dict[str, float] = {}
    if spec.slow_rank >= 0 and moved["slow_rank"] < 0:
        off["slow_factor"] = 1.0
    if spec.link_rank >= 0 and moved["link_rank"] < 0:
        off.update(link_s_per_mib=0.0, link_s_per_msg=0.0)
    return off


NO_FAULTS = FaultSpec()
