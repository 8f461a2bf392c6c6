"""planner/serve: workload validation, Gamma traces, the serving simulator and the placement search."""

import numpy as np
import pytest

from planner.errors import MeshplanError
from planner.serve.calibrate import fit_serving, measured_samples
from planner.serve.cost import Config, KindServing, ServeCost
from planner.serve.placement import (
    Evaluator,
    GroupPlacement,
    Placement,
    Problem,
    Slot,
    check_placement,
    planning_problem,
    resolve_slos,
    search,
    selective_replication,
    serve_everyone,
)
from planner.serve.simulate import Measured, Service, SimGroup, replicate, simulate
from planner.serve.workload import ServedModel, Trace, Workload, make_trace, parse_trace_csv
from planner.specs.cluster import parse_cluster
from planner.validation import parse

V100 = parse_cluster(
    {
        "name": "v100x8",
        "nodes": [
            {
                "name": "n",
                "device": "V100-SXM2-16GB",
                "num_devices": 8,
                "intra_link": "nvlink2",
                "inter_link": "eth-100g",
            }
        ],
    }
)


def test_gamma_arrivals_have_the_asked_rate_and_cv() -> None:
    w = Workload(models=(ServedModel(name="a", preset="gpt2-small", rate=50, cv=3, slo_s=1),), duration_s=400, seed=7)
    t = make_trace(w).arrival_s
    gaps = np.diff(t)
    assert abs(len(t) / 400 - 50) < 50 * 0.1
    assert abs(gaps.std() / gaps.mean() - 3) < 0.3
    assert np.array_equal(t, make_trace(w).arrival_s)  # seeded


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("model,arrival_s\na,0.5\na,-1\n", "trace.csv:3 arrival_s=-1.0: must be ≥ 0"),
        ("model,arrival_s\na,0.5\na,0.2\n", "trace.csv:3 arrival_s=0.2: times must be sorted ascending"),
        ("model,arrival_s\nzz,0.5\n", "trace.csv:2 model='zz': not a served model; one of a"),
        ("time\n1\n", "the first line must be `model,arrival_s`"),
    ],
)
def test_bad_traces_are_one_line_naming_the_row(text: str, needle: str) -> None:
    with pytest.raises(MeshplanError) as e:
        parse_trace_csv(text, ["a"])
    assert needle in str(e.value)


def test_slo_must_be_positive_and_given_once() -> None:
    with pytest.raises(MeshplanError, match=r"models.a.slo_s=0.0: must be > 0"):
        parse(Workload, {"models": [{"name": "a", "preset": "gpt2-small", "slo_s": 0.0}]})
    with pytest.raises(MeshplanError, match="give exactly one of slo_s or slo_scale"):
        parse(Workload, {"models": [{"name": "a", "preset": "gpt2-small"}]})


def test_pipelined_fcfs_with_drops_by_hand() -> None:
    """Two stages of 1 s, three requests at t=0: they leave at 2, 3, 4 (one stage apart); with a
    3.5 s SLO the third would finish at 4 and is dropped, freeing the group for a fourth at t=2."""
    g = SimGroup(2, {0: [(1.0, 1.0)]})
    tr = Trace(np.array([0.0, 0.0, 0.0]), np.zeros(3, dtype=np.int64), 10.0)
    r = simulate([g], {0: [0]}, tr, np.array([10.0]))
    assert r.latency_s.tolist() == [2.0, 3.0, 4.0]
    tr = Trace(np.array([0.0, 0.0, 0.0, 2.0]), np.zeros(4, dtype=np.int64), 10.0)
    r = simulate([g], {0: [0]}, tr, np.array([3.5]))
    assert r.latency_s[:2].tolist() == [2.0, 3.0] and np.isnan(r.latency_s[2]) and r.latency_s[3] == 2.0
    rows = r.per_model(["m"])
    assert rows[0]["dropped"] == 1 and rows[0]["attainment"] == 0.75 and rows[0]["goodput_rps"] == 0.3


def test_batching_bound_and_replicas() -> None:
    """max_batch 2: the two queued requests run as one batch (1.5 s) after the first; two replicas
    split simultaneous requests."""
    g = SimGroup(1, {0: [(1.0,), (1.5,)]}, max_batch=2)
    tr = Trace(np.array([0.0, 0.1, 0.2]), np.zeros(3, dtype=np.int64), 5.0)
    r = simulate([g], {0: [0]}, tr, np.array([10.0]))
    assert np.allclose(r.latency_s, [1.0, 2.4, 2.3])
    a, b = SimGroup(1, {0: [(1.0,)]}), SimGroup(1, {0: [(1.0,)]})
    tr = Trace(np.array([0.0, 0.0]), np.zeros(2, dtype=np.int64), 5.0)
    r = simulate([a, b], {0: [0, 1]}, tr, np.array([10.0]))
    assert r.latency_s.tolist() == [1.0, 1.0] and r.group_busy_s == [1.0, 1.0]


def _one(*xs: float) -> list[np.ndarray]:
    return [np.array([x]) for x in xs]


def test_measured_service_hand_off_and_front_end_by_hand() -> None:
    """Measured samples, one value each: front 0.1, back 0.2, tail 0.3 (the last stage's reply),
    hand-off 0.5 (holding both stages); a request that found the first stage free works (1, 1),
    one that queued (1, 2). Three requests at t=0 leave at 2.8, 5.6 and 8.4."""
    idle = Service(np.array([0.1]), {0: _one(1.0, 1.0)}, _one(0.5), np.array([0.2]), np.array([0.3]))
    queued = Service(np.array([0.1]), {0: _one(1.0, 2.0)}, _one(0.5), np.array([0.2]), np.array([0.3]))
    g = SimGroup(2, {0: [(1.0, 1.0)]}, measured=Measured(idle, queued))
    tr = Trace(np.zeros(3), np.zeros(3, dtype=np.int64), 10.0)
    r = simulate([g], {0: [0]}, tr, np.array([10.0]))
    # r0: starts 0.1, stage 0 done 1.1, hand-off to 1.6, stage 1 done 2.6 (+ back 0.2), free at 2.9;
    # r1 (queued): starts 1.6 + 0.1, done 2.7, hand-off max(2.7, 2.9) + 0.5 = 3.4, done 5.4, free 5.7;
    # r2 (queued): starts 3.5, done 4.5, hand-off max(4.5, 5.7) + 0.5 = 6.2, done 8.2
    assert np.allclose(r.latency_s, [2.8, 5.6, 8.4])
    r = simulate([g], {0: [0]}, tr, np.array([7.0]))  # the third would finish at 8.4: dropped
    assert np.isnan(r.latency_s[2]) and r.per_model(["m"])[0]["dropped"] == 1


def test_drawn_service_times_queue_like_pollaczek_khinchine() -> None:
    """One stage, Poisson arrivals at 0.5/s, service drawn from exponential samples of mean 1 s
    (ρ = 0.5): the mean wait is λ·E[S²] / (2(1 − ρ)) = 1 s (M/M/1); with the mean alone (the
    mean-only model) it is half that (M/D/1). The variance is what the drawn samples add."""
    rng = np.random.default_rng(0)
    samples = rng.exponential(1.0, 4000)
    arrivals = np.cumsum(rng.exponential(2.0, 40_000))
    tr = Trace(arrivals, np.zeros(len(arrivals), dtype=np.int64), float(arrivals[-1]))
    svc = Service(np.zeros(0), {0: [samples]}, [], np.zeros(0), np.zeros(0))
    drawn = SimGroup(1, {0: [(1.0,)]}, measured=Measured(svc, svc))
    lat = simulate([drawn], {0: [0]}, tr, np.array([1e9])).latency_s
    s2 = float(np.mean(samples**2))
    expect = 0.5 * s2 / (2 * (1 - 0.5 * samples.mean()))
    assert abs((lat.mean() - samples.mean()) / expect - 1) < 0.1
    mean_only = simulate([SimGroup(1, {0: [(float(samples.mean()),)]})], {0: [0]}, tr, np.array([1e9])).latency_s
    assert abs((mean_only.mean() - samples.mean()) / (expect * samples.mean() ** 2 / s2) - 1) < 0.1
    rows = replicate([drawn], {0: [0]}, tr, np.array([1e9]), ["m"], 3)
    assert rows[0]["p50_s"] == pytest.approx(float(np.median(lat)), rel=0.05)


def test_measured_samples_cut_each_request_at_its_time_stamps() -> None:
    """Two requests on a 2-stage group: the second arrives while the first is on stage 0 (queued).
    work = t_send − t_in (stage 0) / t_send − t_fwd; hop = stage 1's t_fwd − when both were ready;
    front (only of the request that found stage 0 free) = t_in − arrival; back = finish − last t_send."""
    s0 = [
        {"id": 0, "model": "a", "t_in": 1.0, "t_fwd": 1.0, "t_send": 2.0, "t_out": 2.5},
        {"id": 1, "model": "b", "t_in": 2.5, "t_fwd": 2.5, "t_send": 3.0, "t_out": 4.0},
    ]
    s1 = [
        {"id": 0, "model": "a", "t_in": 2.1, "t_fwd": 2.4, "t_send": 3.5, "t_out": 3.6},
        {"id": 1, "model": "b", "t_in": 3.7, "t_fwd": 3.9, "t_send": 4.5, "t_out": 4.6},
    ]
    router = [
        {"request_id": 0, "model": "a", "t_arrival": 0.9, "t_finish": 3.7},
        {"request_id": 1, "model": "b", "t_arrival": 1.5, "t_finish": 4.8},
    ]
    m = measured_samples([s0, s1], router, ["a", "b"])
    assert np.allclose(m.idle.front, [0.1]) and np.allclose(m.queued.front, [0.0])  # 2.5 − max(1.5, 2.5)
    assert set(m.idle.work) == {0} and np.allclose([w[0] for w in m.idle.work[0]], [1.0, 1.1])
    assert set(m.queued.work) == {1} and np.allclose([w[0] for w in m.queued.work[1]], [0.5, 0.6])
    assert np.allclose(m.idle.hop[0], [0.4]) and np.allclose(m.queued.hop[0], [0.3])  # 3.9 − max(3.0, 3.6)
    assert np.allclose(m.idle.back, [0.2]) and np.allclose(m.queued.back, [0.3])
    assert np.allclose(m.idle.tail, [0.1]) and np.allclose(m.queued.tail, [0.1])


def test_the_box_speed_over_time_scales_the_drawn_times() -> None:
    """One stage; two requests near t=0 took 1 s, two near t=10 took 2 s (other processes ran then):
    the measured speed is 2/3 and 4/3 of the mean there, every stored sample 1.5 s, and a request
    simulated at t=0 takes 1 s, one at t=10 takes 2 s — not the 1.5 s mean."""
    arrivals, works = [0.0, 1.2, 10.0, 12.5], [1.0, 1.0, 2.0, 2.0]
    log = [
        {"id": i, "model": "a", "t_in": 100 + t, "t_fwd": 100 + t, "t_send": 100 + t + w, "t_out": 100 + t + w}
        for i, (t, w) in enumerate(zip(arrivals, works, strict=True))
    ]
    router = [
        {"request_id": i, "model": "a", "t_arrival": 100 + t, "t_finish": 100 + t + w}
        for i, (t, w) in enumerate(zip(arrivals, works, strict=True))
    ]
    m = measured_samples([log], router, ["a"], t0=100.0, window_s=3.0)
    assert np.allclose(m.speed, [2 / 3, 2 / 3, 4 / 3, 4 / 3]) and np.allclose(m.idle.work[0][0], 1.5)
    g = SimGroup(1, {0: [(1.5,)]}, measured=m)
    r = simulate([g], {0: [0]}, Trace(np.array([0.0, 10.0]), np.zeros(2, dtype=np.int64), 20.0), np.array([9.0]))
    assert np.allclose(r.latency_s, [1.0, 2.0])


def _problem(rate: float, cv: float) -> Problem:
    sizes = ["gpt3-1.3b"] * 3 + ["gpt3-2.7b"] * 3 + ["gpt3-6.7b"] * 2
    models = tuple(
        ServedModel(name=f"m{i}", preset=p, seq=512, rate=rate / len(sizes), cv=cv, slo_scale=5)
        for i, p in enumerate(sizes)
    )
    w = Workload(models=models, duration_s=30, seed=1)
    cost = ServeCost(V100, "fp16")
    return Problem(w, cost, make_trace(w), resolve_slos(w, cost))


def test_model_parallel_placement_beats_selective_replication_on_bursty_traffic() -> None:
    p = _problem(rate=20, cv=4)  # 16 GB devices: memory limits how far replication can spread
    ours, sr = search(p), selective_replication(p)
    assert all(g.pp == 1 for g in sr.groups)
    assert ours.attainment > sr.attainment + 0.02
    served = {m for g in ours.groups for m in g.models}
    assert served == {m.name for m in p.models}


def test_forward_time_splits_over_stages_and_tp() -> None:
    cost = ServeCost(V100, "fp16")
    m = ServedModel(name="a", preset="gpt3-6.7b", seq=512, slo_s=1)
    kind = V100.nodes[0].device_kind
    one = sum(cost.stage_times("a", m.spec, Config(kind, 1, 1), 1, 512))
    two = cost.stage_times("a", m.spec, Config(kind, 2, 1), 1, 512)
    assert len(two) == 2 and 0.45 * one < max(two) < 0.6 * one
    assert cost.weight_bytes(m.spec, Config(kind, 1, 2)) < 0.51 * cost.weight_bytes(m.spec, Config(kind, 1, 1))


def test_a_model_too_large_and_an_overfull_placement_are_one_line() -> None:
    big = ServedModel(name="big", preset="gpt3-175b", seq=512, rate=1, slo_s=10)
    w = Workload(models=(big,), duration_s=5)
    cost = ServeCost(V100, "fp16")
    with pytest.raises(MeshplanError, match=r"models.big='gpt3-175b': fits no group"):
        search(Problem(w, cost, make_trace(w), resolve_slos(w, cost)))
    m = ServedModel(name="m", preset="gpt3-6.7b", seq=512, slo_s=1)
    models = tuple(m.model_copy(update={"name": f"m{i}"}) for i in range(3))
    pl = Placement(
        method="manual",
        cluster="v100x8",
        models=models,
        groups=(GroupPlacement(devices=(0,), kind=V100.nodes[0].device_kind, pp=1, tp=1, models=("m0", "m1", "m2")),),
    )
    with pytest.raises(MeshplanError, match=r"groups\[0\].models=.*weights need .* GiB per device.*host fewer models"):
        check_placement(pl, cost)


def _tight(rates: tuple[float, ...], cv: float = 3) -> Problem:
    """Four 16 GB V100s, three 1.3B models and a 2.7B (seq 512): little memory, traffic above capacity."""
    sizes = ["gpt3-1.3b"] * 3 + ["gpt3-2.7b"]
    models = tuple(
        ServedModel(name=f"m{i}", preset=s, seq=512, rate=r, cv=cv, slo_scale=3)
        for i, (s, r) in enumerate(zip(sizes, rates, strict=True))
    )
    four = V100.model_copy(update={"nodes": (V100.nodes[0].model_copy(update={"num_devices": 4}),)})
    w = Workload(models=models, duration_s=20, seed=3)
    cost = ServeCost(four, "fp16", serving={V100.nodes[0].device_kind: KindServing(0.002, 0.001, 0.001, 0.1)})
    return Problem(w, cost, make_trace(w), resolve_slos(w, cost))


def _free_rooms(p: Problem, pl: Placement) -> list[tuple[str, int]]:
    """(model, group) pairs where the model is not hosted, fits the group's free memory and misses its
    SLO on some request of the planning trace."""
    plan = planning_problem(p, 1500)
    idx = {m.name: i for i, m in enumerate(p.models)}
    slots = [Slot(g.devices, pl.config(g)) for g in pl.groups]
    hosts = [[idx[n] for n in g.models] for g in pl.groups]
    good, _ = Evaluator(plan, slots)(hosts)
    short = good < np.bincount(plan.trace.model, minlength=len(p.models))
    rooms = []
    for gi, (s, h) in enumerate(zip(slots, hosts, strict=True)):
        used = sum(p.cost.weight_bytes(p.models[m].spec, s.cfg) for m in h)
        for m in range(len(p.models)):
            if short[m] and m not in h and p.fits(m, s.cfg):
                if used + p.cost.weight_bytes(p.models[m].spec, s.cfg) <= p.cost.capacity_bytes(s.cfg.kind):
                    rooms.append((p.models[m].name, gi))
    return rooms


def test_a_placement_leaves_no_memory_unused_while_a_model_misses_its_slo() -> None:
    p = _tight((30.0, 30.0, 30.0, 20.0))
    pl = search(p, plan_requests=1500)
    assert pl.attainment < 0.99  # overloaded: every model loses requests somewhere
    assert _free_rooms(p, pl) == []
    assert sum(len(g.models) for g in pl.groups) > len(p.models)  # replicas beyond one each


def test_no_model_is_left_without_a_replica_when_one_fits() -> None:
    # m3 (2.7B) gets no request in the planning trace: no greedy gain ever points at it
    p = _tight((40.0, 40.0, 40.0, 0.0))
    pl = search(p, plan_requests=1500)
    served = {m for g in pl.groups for m in g.models}
    assert served == {"m0", "m1", "m2", "m3"} and pl.unserved == ()
    # serve_everyone: memory full of replicas, m3 left out → it takes the place of a replicated model
    slots = [Slot((0,), Config(V100.nodes[0].device_kind, 1, 1))]
    hosts, left = serve_everyone(p, slots, [[0, 1, 2]])
    assert left == [] and 3 in hosts[0]


def test_cost_pays_front_end_hand_off_and_tp_short_of_ideal() -> None:
    kind = V100.nodes[0].device_kind
    m = ServedModel(name="a", preset="gpt3-6.7b", seq=512, slo_s=1)
    ideal = ServeCost(V100, "fp16")
    real = ServeCost(
        V100, "fp16", serving={kind: KindServing(front_s=0.01, reply_s=0.002, handoff_s=0.003, tp_serial=0.1)}
    )
    one_i, one_r = (
        ideal.stage_times("a", m.spec, Config(kind, 1, 1), 1, 512),
        real.stage_times("a", m.spec, Config(kind, 1, 1), 1, 512),
    )
    assert one_r[0] == pytest.approx(one_i[0] + 0.01)  # the front end holds the first stage
    two_i, two_r = (
        ideal.stage_times("a", m.spec, Config(kind, 2, 1), 1, 512),
        real.stage_times("a", m.spec, Config(kind, 2, 1), 1, 512),
    )
    assert two_r[0] == pytest.approx(two_i[0] + 0.01 + 0.003) and two_r[1] == pytest.approx(two_i[1])
    tp8_i, tp8_r = (
        sum(ideal.stage_times("a", m.spec, Config(kind, 1, 8), 1, 512)),
        sum(real.stage_times("a", m.spec, Config(kind, 1, 8), 1, 512)),
    )
    assert tp8_r > tp8_i + 0.15 * (sum(one_i) / 8)  # 10 % serial: ≈ 1.6× the ideal compute share
    assert KindServing(tp_serial=0.0).tp_factor(8) == 1.0 and KindServing(tp_serial=1.0).tp_factor(8) == 8.0


def test_calibration_and_serving_figures_are_per_device_kind() -> None:
    kind = V100.nodes[0].device_kind
    m = ServedModel(name="a", preset="gpt3-1.3b", seq=512, slo_s=1)
    cost = ServeCost(V100, "fp16", calibration={("cpu", "a", 1, 1, 1): (9.0,), (kind, "a", 1, 2, 1): (0.5,)})
    assert cost.stage_times("a", m.spec, Config(kind, 1, 2), 1, 512) == (0.5,)
    assert cost.stage_times("a", m.spec, Config(kind, 1, 1), 1, 512) != (9.0,)  # another kind's figure: not used

    def meas(front: float, back: float, hop: float) -> Measured:
        s = Service(
            np.array([front]),
            {0: [np.array([1.0]), np.array([1.0])]},
            [np.array([hop])],
            np.array([back]),
            np.array([0.0]),
        )
        return Measured(s, s)

    calib = {
        ("cpu", "a", 1, 1, 1): (1.0,),
        ("cpu", "a", 1, 2, 1): (0.75,),
        (kind, "a", 1, 1, 1): (1.0,),
        (kind, "a", 1, 4, 1): (0.25,),
    }
    fit = fit_serving(
        [("cpu", meas(0.01, 0.002, 0.004)), ("cpu", meas(0.03, 0.004, 0.006)), (kind, meas(0.001, 0.0, 0.0))], calib
    )
    assert fit["cpu"] == KindServing(
        front_s=pytest.approx(0.02),
        reply_s=pytest.approx(0.003),
        handoff_s=pytest.approx(0.005),
        tp_serial=pytest.approx(0.5),
    )
    assert fit[kind] == KindServing(front_s=pytest.approx(0.001), tp_serial=pytest.approx(0.0))


def test_a_budgeted_evaluation_agrees_and_stops_a_loser_early() -> None:
    """Evaluator.at_least: the full count when the target is reached; None (and nothing cached) when not."""
    p = _tight((30.0, 10.0, 10.0, 10.0))
    slots = [Slot((d,), Config(V100.nodes[0].device_kind, 1, 1)) for d in range(4)]
    hosts = [[0, 1], [0, 2], [3], [1]]
    full = int(Evaluator(p, slots)(hosts)[0].sum())
    assert 0 < full < len(p.trace)  # some requests are lost: a budget can run out
    assert Evaluator(p, slots).at_least(hosts, full) == full
    ev = Evaluator(p, slots)
    assert ev.at_least(hosts, full + 1) is None
    assert ev.sims == len(ev.components(hosts)) == 2 and len(ev.cache) == 1  # a stopped run is not a result
    r = p.run_within([s.cfg for s in slots], hosts, max_dropped=len(p.trace) - full - 1)
    assert r is None
    r = p.run_within([s.cfg for s in slots], hosts, max_dropped=len(p.trace) - full)
    assert r is not None and int(r.good().sum()) == full
