"""Deterministic iterations shared by the compactor tests."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from services.common.erasure_source import ErasureOrder
from services.common.errors import NotFound
from services.compactor.domain.warm_chain import IterationInput
from services.compactor.service import IterationLog

LogFactory = Callable[..., IterationLog]


def make_iteration(n: int, *, size: int = 40, status: str = "success") -> IterationInput:
    """A deterministic iteration whose detail carries ``size`` bytes of varied text."""
    seed = hashlib.sha256(str(n).encode()).hexdigest()
    body = "".join(hashlib.sha256(f"{seed}{i}".encode()).hexdigest()
                   for i in range(size // 64 + 1))[:size]
    return IterationInput(
        iteration=n, plan_digest=f"plan-{n:05d}", parent_digest=f"plan-{n - 1:05d}",
        start_ts=f"2025-08-14T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
        end_ts=f"2025-08-14T12:{n // 60 % 60:02d}:{n % 60:02d}.5Z",
        files_touched=n % 7, net_add=n * 3, net_del=n % 5, risk_score=(n % 10) / 10,
        status=status,
        detail_json=json.dumps({"context": body, "metrics": {"n": n}}),
        guardrails_json=json.dumps([{"stage": "lint", "ok": n % 3 != 0}]),
    )


class RecordedErasures:
    """An ErasureSource standing in for governance: the erasures ``add`` recorded, all of
    ``fleet_id``, requested by ``op``."""

    def __init__(self, fleet_id: str) -> None:
        self.fleet_id = fleet_id
        self.orders: dict[str, ErasureOrder] = {}

    def erasure(self, erasure_id: str) -> ErasureOrder:
        if erasure_id not in self.orders:
            raise NotFound("no such erasure", reason="ERASURE_NOT_FOUND")
        return self.orders[erasure_id]

    def add(self, items: list[tuple[str, str, str]]) -> str:
        erasure_id = f"era_{len(self.orders) + 1:028x}"
        self.orders[erasure_id] = ErasureOrder(erasure_id, self.fleet_id, "op", tuple(items))
        return erasure_id
