"""docs/security.md shows each service's access table as the code has it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.artifacts.servicer import KINDS as ARTIFACTS_KINDS
from services.artifacts.servicer import POLICY as ARTIFACTS_POLICY
from services.common.admission import MethodKinds
from services.common.auth import MethodPolicy
from services.compactor.servicer import KINDS as COMPACTOR_KINDS
from services.compactor.servicer import POLICY as COMPACTOR_POLICY
from services.embedder.servicer import KINDS as EMBEDDER_KINDS
from services.embedder.servicer import POLICY as EMBEDDER_POLICY
from services.governance.servicer import KINDS as GOVERNANCE_KINDS
from services.governance.servicer import POLICY as GOVERNANCE_POLICY
from services.shard.servicer import KINDS as SHARD_KINDS
from services.shard.servicer import POLICY as SHARD_POLICY

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"
TABLES: dict[str, tuple[MethodPolicy, MethodKinds]] = {
    "shard": (SHARD_POLICY, SHARD_KINDS),
    "governance": (GOVERNANCE_POLICY, GOVERNANCE_KINDS),
    "artifacts": (ARTIFACTS_POLICY, ARTIFACTS_KINDS),
    "compactor": (COMPACTOR_POLICY, COMPACTOR_KINDS),
    "embedder": (EMBEDDER_POLICY, EMBEDDER_KINDS),
}


def _documented(service: str) -> dict[str, tuple[frozenset[str], str]]:
    text = DOC.read_text()
    section = text.split(f"#### {service}\n", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    rows: dict[str, tuple[frozenset[str], str]] = {}
    for line in section.splitlines()[2:]:
        methods, callers, kind = (cell.strip() for cell in line.strip("|").split("|"))
        callers = re.sub(r"\([^)]*\)", "", callers)
        for method in methods.split(","):
            rows[method.strip()] = (frozenset(c.strip() for c in callers.split(",")), kind)
    return rows


@pytest.mark.parametrize("service", sorted(TABLES))
def test_the_documented_access_table_is_the_codes(service: str) -> None:
    policy, kinds = TABLES[service]
    in_code = {path.rsplit("/", 1)[1]: (allowed, kinds[path].value)
               for path, allowed in policy.items()}
    assert _documented(service) == in_code
