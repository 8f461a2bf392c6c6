"""The simulator's per-request samples, from what a serving group's ranks and the router logged.

Each rank logs, per request, when it took it (`t_in`), had its input (`t_fwd`: after the
activation's recv), finished the forward (`t_send`) and had handed it on (`t_out`); the router logs
each request's arrival and reply (`t_arrival`, `t_finish`), all on one monotonic clock. Cut at
those stamps, a request's latency is queueing plus these parts, which is what the simulator draws:

    work[s]   stage s's own seconds: t_send − t_fwd (stage 0 also parses: t_send − t_in)
    hop[s]    the hand-off s → s+1: stage s+1's t_fwd − (when both sides were ready: stage s's t_send,
              stage s+1's previous t_out) — header and activation over gloo
    front     router → first stage: t_in − t_arrival, for requests that found the first stage idle
              (a request that found it busy waited in the socket: queueing, not front end)
    back      last stage's forward done → reply sent: t_finish − t_send

None of these contains a wait for another request, so they are service figures, not latencies; the
simulator rebuilds the waits (queueing, blocked hand-offs) from them.
"""

from __future__ import annotations

import numpy as np

from planner.serve.simulate import Measured, Service


def measured_samples(stages: list[list[dict]], router: list[dict], names: list[str]) -> Measured:
    """`stages[s]`: stage s's log in serving order; `router`: the router's rows of the requests to
    use (their ids select the stage entries). A request queued when it arrived while the first
    stage was still on an earlier one."""
    pp = len(stages)
    by_id = [{int(e["id"]): e for e in log} for log in stages]
    ready = []  # per stage: request id → when the stage was free to take it (its previous t_out)
    for log in stages:
        prev, mine = float("-inf"), {}
        for e in log:
            mine[int(e["id"])] = prev
            prev = e["t_out"]
        ready.append(mine)
    sets = {waited: (dict(), [[] for _ in range(pp - 1)], []) for waited in (False, True)}
    front = []
    for row in router:
        rid = int(row["request_id"])
        if not all(rid in b for b in by_id):
            continue  # dropped by the first stage: no service
        es = [b[rid] for b in by_id]
        waited = row["t_arrival"] < ready[0][rid]
        work, hop, back = sets[waited]
        per = work.setdefault(names.index(row["model"]), [[] for _ in range(pp)])
        for s, e in enumerate(es):
            per[s].append(e["t_send"] - (e["t_in"] if s == 0 else e["t_fwd"]))
            if s:
                hop[s - 1].append(max(0.0, e["t_fwd"] - max(es[s - 1]["t_send"], ready[s][rid])))
        if not waited:
            front.append(max(0.0, es[0]["t_in"] - row["t_arrival"]))
        back.append(max(0.0, row["t_finish"] - es[-1]["t_send"]))

    def service(work: dict, hop: list, back: list) -> Service:
        return Service(
            {m: [np.array(w) for w in per] for m, per in work.items()}, [np.array(h) for h in hop], np.array(back)
        )

    return Measured(np.array(front), service(*sets[False]), service(*sets[True]))
