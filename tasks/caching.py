"""Cache keys that survive a new process.

Prefect's INPUTS policy hashes inputs as JSON when it can and otherwise cloudpickles them; a
pickled pydantic model embeds a set whose order follows the process's string-hash seed, so keys of
tasks taking specs change from one `meshplan` process to the next and the cache never hits. These
keys hash a stable JSON form instead: pydantic models by their JSON dump, dataclasses field by
field, objects with a `fingerprint()` (a ProfileTable) by it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from prefect.cache_policies import TASK_SOURCE, CacheKeyFnPolicy, CachePolicy


def _stable(v: Any) -> Any:
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json")
    if dataclasses.is_dataclass(v) and not isinstance(v, type):  # field by field: a field may be a spec
        return [type(v).__name__, [_stable(getattr(v, f.name)) for f in dataclasses.fields(v)]]
    if hasattr(v, "fingerprint"):
        return v.fingerprint()
    if isinstance(v, list | tuple):
        return [_stable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _stable(x) for k, x in v.items()}
    return v


def stable_inputs(*exclude: str) -> CachePolicy:
    """TASK_SOURCE + the task's inputs (less `exclude`) as stable JSON."""

    def key(_ctx: Any, params: dict[str, Any]) -> str:
        data = {k: _stable(v) for k, v in params.items() if k not in exclude}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()

    return TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=key)
