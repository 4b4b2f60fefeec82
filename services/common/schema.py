"""Whether a database's schema is at the revision this build needs, without alembic.

A service checks its schema at every start (``Database.prepare_schema``), and nearly always
finds it current. alembic (with mako and pygments, which it imports) is 11.5 MB of a serving
process that it would hold for its lifetime, for a check two reads answer: the newest revision
among the service's migration scripts, read from their source (``revision = "0004"``,
``down_revision = "0003"``) without importing them, and the revision the database records in
the service's version table. alembic is imported only when a migration must run.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sqlalchemy import Connection, column, inspect, select, table

_FIELDS = ("revision", "down_revision")


def schema_head(migrations_dir: Path) -> str | None:
    """The one head revision of ``migrations_dir/versions``, or None when the scripts do not
    name exactly one (several heads, or a script whose fields are not plain literals): the
    caller then asks alembic."""
    revisions: set[str] = set()
    replaced: set[str] = set()
    for path in sorted((migrations_dir / "versions").glob("*.py")):
        if path.name == "__init__.py" or path.name.startswith("."):  # as alembic skips them
            continue
        fields = _fields(path)
        if fields is None:
            return None
        revision, down = fields.get("revision"), fields.get("down_revision")
        if not isinstance(revision, str):
            return None  # a script that names its revision some other way: alembic reads it
        revisions.add(revision)
        if isinstance(down, str):
            replaced.add(down)
        elif isinstance(down, tuple | list):
            replaced.update(d for d in down if isinstance(d, str))
        elif down is not None:
            return None
    heads = revisions - replaced
    return heads.pop() if len(heads) == 1 else None


def _fields(path: Path) -> dict[str, object] | None:
    """``revision`` and ``down_revision`` as the script assigns them at module level."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign):  # also chained: revision = rev_id = "0005"
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in _FIELDS:
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    return None
    return found


def recorded_revisions(connection: Connection, version_table: str) -> set[str]:
    """The revisions ``version_table`` records (none: an empty database, or one this service
    never migrated)."""
    if not inspect(connection).has_table(version_table):
        return set()
    versions = table(version_table, column("version_num"))
    return {str(value) for value in connection.execute(select(versions.c.version_num)).scalars()}
