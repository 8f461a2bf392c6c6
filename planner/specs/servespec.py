"""`ServeSpec`: everything a serving rank is told, written once (the serving twin of runspec.RunSpec).

launcher/serving.py builds one per placement group and generation, writes it onto the rank command
line (`to_argv`, the codec of planner/specs/runspec.py: `--<field-with-dashes> VALUE` for every field
off its default) and every rank of `python -m worker.serve` parses it back (`from_argv`) — no other
parser, no restated defaults. A bad or unknown flag is one MeshplanError naming it.
"""

from __future__ import annotations

from pydantic import Field

from planner.limits import MAX_SEED
from planner.specs.runspec import ArgvModel


class ServeSpec(ArgvModel):
    """One serving group's launch: where its ranks find the placement and the router, which group they are."""

    placement: str = Field(description="placement JSON in the serving run folder (rundir.serve_placement_path)")
    router: str = Field(description="HOST:PORT of the router's rank socket (launcher/router.py)")
    run_dir: str = Field(description="serving run folder: calib_rankR.json, stage_rankR.json")
    group: int = Field(default=0, ge=0, description="the placement group these ranks are (one torchrun per group)")
    base_rank: int = Field(
        default=0, ge=0, description="the group's first rank in the placement's order (file names, CUDA device index)"
    )
    generation: int = Field(default=0, ge=0, description="the group's launch count: the router ignores older ones")
    calib_reps: int = Field(default=8, gt=0, le=1000, description="timed forwards per model at start-up")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="weight init seed (every group builds alike)")
    timeout_s: float = Field(default=120.0, gt=0, le=86400, description="process-group timeout inside the ranks")

    @property
    def router_address(self) -> tuple[str, int]:
        host, _, port = self.router.rpartition(":")
        return host, int(port)
