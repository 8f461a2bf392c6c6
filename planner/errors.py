"""Errors a user can cause. Each names the field, the value and the fix in one line."""

from __future__ import annotations


class MeshplanError(ValueError):
    """A mistake in what the user gave meshplan; the CLI prints it as one line and exits 1."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"{field}={value!r}: {fix}")


class UnknownNameError(MeshplanError):
    """A name (GPU, model preset, link kind) that is not in a catalog."""


def closest(name: str, known: list[str], n: int = 3) -> list[str]:
    """Known names closest to `name` (case-insensitive), for 'did you mean' suggestions."""
    import difflib

    lowered = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.3)
    if not hits:
        hits = [k for k in lowered if name.lower() in k or k in name.lower()][:n]
    return [lowered[h] for h in hits]
