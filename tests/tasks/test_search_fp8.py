"""`search.fp8` (RunConfig) reaches the search: fp8 linears are searched only when asked (engine-free .fn)."""

import dataclasses

from planner.specs.cluster import parse_cluster
from planner.specs.config import load_config
from planner.specs.model import ModelSpec
from tasks.plan import search_plans
from tasks.searching import SearchJob

H100 = parse_cluster(
    {
        "name": "h",
        "nodes": [
            {"name": "a", "device": "H100-SXM5-80GB", "num_devices": 2, "intra_link": "nvlink4", "inter_link": "ib-ndr"}
        ],
    }
)
MODEL = ModelSpec(name="m", num_layers=4, hidden=4096, num_heads=32, vocab_size=512, seq_len=2048)


def test_fp8_plans_only_when_the_config_asks():
    assert load_config("[search]\nfp8 = true\n", []).search.fp8 and not load_config("", []).search.fp8
    job = SearchJob(MODEL, H100, None, global_batch=4, seq=2048, top_k=5, time_budget_s=5.0)
    off = search_plans.fn(job)
    on = search_plans.fn(dataclasses.replace(job, fp8=True))
    assert not any(p.fp8 for p in off.plans)
    fastest = min(on.plans, key=lambda p: p.predicted.step_time_s)
    assert fastest.fp8 and fastest.predicted.step_time_s < off.best.predicted.step_time_s
    # the runtime cannot launch fp8 (planner/runtime.py): such plans carry the reason in their notes
    assert any(n.startswith("runtime: fp8") for n in fastest.predicted.notes)
