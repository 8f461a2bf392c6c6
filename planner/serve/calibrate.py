"""The simulator's per-request samples, from what a serving group's ranks and the router logged.

Each rank logs, per request, when it took it (`t_in`), had its input (`t_fwd`: after the
activation's recv), finished the forward (`t_send`) and had handed it on (`t_out`); the router logs
each request's arrival and reply (`t_arrival`, `t_finish`), all on one monotonic clock. Cut at
those stamps, a request's latency is queueing plus these parts, which is what the simulator draws:

    front     first stage takes it − when both it had arrived and the stage was free: t_in −
              max(t_arrival, the stage's previous t_out) (router → rank, the rank's loop)
    work[s]   stage s's own seconds: t_send − t_fwd (stage 0 also parses: t_send − t_in)
    hop[s]    the hand-off s → s+1: stage s+1's t_fwd − (when both sides were ready: stage s's t_send,
              stage s+1's previous t_out) — header and activation over gloo
    back      last stage's forward done → reply: t_finish − t_send
    tail      last stage's forward done → free again: t_out − t_send (the reply's send)

None of these contains a wait for another request, so they are service figures, not latencies; the
simulator rebuilds the waits (queueing, blocked hand-offs) from them. Requests that arrived while
the first stage was still on an earlier one ("queued") and the others ("idle") are kept apart: under
a queue the ranks and the front end share the CPUs. And the box's speed over the trace (others'
processes come and go) is measured as each request's total over its kind's mean, averaged over ±1 s,
and divided out of the samples; the simulator multiplies it back in at each request's arrival.
"""

from __future__ import annotations

import numpy as np

from planner.serve.cost import KindServing
from planner.serve.simulate import Measured, Service


def measured_samples(
    stages: list[list[dict]], router: list[dict], names: list[str], t0: float | None = None, window_s: float = 1.0
) -> Measured:
    """`stages[s]`: stage s's log in serving order; `router`: the router's rows of the requests to
    use (their ids select the stage entries); `t0`: the router's clock at the trace's time 0. A
    request queued when it arrived while the first stage was still on an earlier one. With `t0`, the
    box's speed over the trace: each request's total service over its (model, queued) mean, averaged
    over the requests within ±`window_s`; samples are stored divided by it (simulate.Measured)."""
    pp = len(stages)
    by_id = [{int(e["id"]): e for e in log} for log in stages]
    ready = []  # per stage: request id → when the stage was free to take it (its previous t_out)
    for log in stages:
        prev, mine = float("-inf"), {}
        for e in log:
            mine[int(e["id"])] = prev
            prev = e["t_out"]
        ready.append(mine)
    reqs = []  # (trace time, queued, model, front, work per stage, hop per boundary, back, tail)
    for row in router:
        rid = int(row["request_id"])
        if not all(rid in b for b in by_id):
            continue  # dropped by the first stage: no service
        es = [b[rid] for b in by_id]
        at = row["t_arrival"] - (t0 if t0 is not None else 0.0)
        front = max(0.0, es[0]["t_in"] - max(row["t_arrival"], ready[0][rid]))
        work = [e["t_send"] - (e["t_in"] if s == 0 else e["t_fwd"]) for s, e in enumerate(es)]
        hop = [max(0.0, es[s]["t_fwd"] - max(es[s - 1]["t_send"], ready[s][rid])) for s in range(1, pp)]
        back = max(0.0, row["t_finish"] - es[-1]["t_send"])
        tail = max(0.0, es[-1]["t_out"] - es[-1]["t_send"])
        queued = row["t_arrival"] < ready[0][rid]
        reqs.append((at, queued, names.index(row["model"]), front, work, hop, back, tail))
    reqs.sort(key=lambda r: r[0])
    at = np.array([r[0] for r in reqs])
    speed = np.ones(len(reqs))
    if t0 is not None and reqs:
        total = np.array([r[3] + sum(r[4]) + sum(r[5]) + r[6] + r[7] for r in reqs])
        x = np.empty(len(reqs))
        for key in {(r[1], r[2]) for r in reqs}:
            sel = np.array([(r[1], r[2]) == key for r in reqs])
            x[sel] = total[sel] / max(float(total[sel].mean()), 1e-12)
        lo, hi = np.searchsorted(at, at - window_s), np.searchsorted(at, at + window_s, side="right")
        speed = np.array([x[a:b].mean() for a, b in zip(lo, hi, strict=True)])
    sets = {waited: ([], {}, [[] for _ in range(pp - 1)], [], []) for waited in (False, True)}
    for (_, queued, m, front, work, hop, back, tail), k in zip(reqs, speed, strict=True):
        fronts, works, hops, backs, tails = sets[queued]
        fronts.append(front / k)
        per = works.setdefault(m, [[] for _ in range(pp)])
        for s, w in enumerate(work):
            per[s].append(w / k)
        for s, h in enumerate(hop):
            hops[s].append(h / k)
        backs.append(back / k)
        tails.append(tail / k)

    def service(front: list, work: dict, hop: list, back: list, tail: list) -> Service:
        arrays = {m: [np.array(w) for w in per] for m, per in work.items()}
        return Service(np.array(front), arrays, [np.array(h) for h in hop], np.array(back), np.array(tail))

    has_speed = t0 is not None and len(reqs) > 0
    return Measured(
        service(*sets[False]),
        service(*sets[True]),
        at if has_speed else np.zeros(0),
        speed if has_speed else np.zeros(0),
    )


def fit_serving(
    measured: list[tuple[str, Measured]], calibration: dict[tuple[str, str, int, int, int], tuple[float, ...]]
) -> dict[str, KindServing]:
    """Each device kind's `KindServing` (planner/serve/cost.py) from the serving runtime's logs:
    `measured` pairs a group's device kind with its per-request samples (`measured_samples`), pooled
    per kind — front end = mean `front` (stage 0's parsing is in its work already), reply = mean
    `back`, hand-off = mean `hop` over every boundary, of the requests that found the group idle (no
    CPU sharing in them); `tp_serial` from the calibration's stage totals of one model and pp at tp
    and at tp 1 on the kind: t_tp / t_1 = 1/tp + σ·(1 − 1/tp), σ averaged over the pairs (the
    measured totals include the all-reduces, so σ is the whole shortfall from 1/tp), clipped to
    [0, 1]. A kind with no samples of a part keeps 0 for it."""
    pooled: dict[str, dict[str, list[np.ndarray]]] = {}
    for kind, m in measured:
        into = pooled.setdefault(kind, {"front": [], "back": [], "hop": []})
        into["front"].append(m.idle.front)
        into["back"].append(m.idle.back)
        into["hop"].extend(m.idle.hop)
    serial: dict[str, list[float]] = {}
    for (kind, name, pp, tp, batch), stages in calibration.items():
        one = calibration.get((kind, name, pp, 1, batch))
        if tp > 1 and one is not None and sum(one) > 0:
            sigma = (sum(stages) / sum(one) - 1 / tp) / (1 - 1 / tp)
            serial.setdefault(kind, []).append(min(1.0, max(0.0, sigma)))

    def mean(xs: list[np.ndarray]) -> float:
        x = np.concatenate(xs) if xs else np.zeros(0)
        return float(x.mean()) if len(x) else 0.0

    out = {}
    for kind in sorted(set(pooled) | set(serial)):
        parts = pooled.get(kind, {"front": [], "back": [], "hop": []})
        out[kind] = KindServing(
            front_s=mean(parts["front"]),
            reply_s=mean(parts["back"]),
            handoff_s=mean(parts["hop"]),
            tp_serial=float(np.mean(serial[kind])) if kind in serial else 0.0,
        )
    return out
