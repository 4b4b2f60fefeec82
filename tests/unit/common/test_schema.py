"""The schema check without alembic (services/common/schema.py).

Every service reads its head revision from its scripts' source; it must be alembic's head,
or a start would migrate again (or refuse) a database that is current. A start on a current
database must not import alembic at all: that is the 11.5 MB the check exists to save."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from services.artifacts.server import MIGRATIONS as ARTIFACTS
from services.common.db import Database
from services.common.schema import recorded_revisions, schema_head
from services.compactor.server import MIGRATIONS as COMPACTOR
from services.governance.server import MIGRATIONS as GOVERNANCE
from services.shard.server import MIGRATIONS as SHARD


@pytest.mark.parametrize("migrations", [SHARD, GOVERNANCE, ARTIFACTS, COMPACTOR],
                         ids=["shard", "governance", "artifacts", "compactor"])
def test_each_services_head_read_from_its_scripts_is_alembics(migrations: Path) -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations))
    assert schema_head(migrations) == ScriptDirectory.from_config(config).get_current_head()


def _scripts(tmp_path: Path, *bodies: str) -> Path:
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "__init__.py").write_text("")
    for number, body in enumerate(bodies):
        (versions / f"{number:04d}_step.py").write_text(textwrap.dedent(body))
    return tmp_path


def test_a_chain_a_merge_and_annotated_fields_give_the_one_head(tmp_path: Path) -> None:
    migrations = _scripts(
        tmp_path,
        'revision = "a"\ndown_revision = None\n',
        'revision: str = "b"\ndown_revision: str | None = "a"\n',
        'revision = "c"\ndown_revision = "a"\n',
        'revision = "d"\ndown_revision = ("b", "c")\n',
        'revision = rev_id = "e"\ndown_revision = "d"\n')
    (migrations / "versions" / ".#0004_step.py").write_text("an editor's lock file")
    assert schema_head(migrations) == "e"


@pytest.mark.parametrize("second", [
    'revision = "c"\ndown_revision = "a"\n',  # two heads: b and c
    'revision = "b" + ""\ndown_revision = "a"\n',  # not a literal
    'revision = "b"\ndown_revision = 7\n',  # not a revision
    'if True:\n    revision = "c"\n    down_revision = "b"\n',  # not at module level
], ids=["two heads", "computed", "bad down_revision", "hidden revision"])
def test_scripts_that_do_not_name_one_head_leave_it_to_alembic(tmp_path: Path,
                                                              second: str) -> None:
    migrations = _scripts(tmp_path, 'revision = "a"\ndown_revision = None\n',
                          'revision = "b"\ndown_revision = "a"\n', second)
    assert schema_head(migrations) is None


def test_the_recorded_revision_of_an_empty_and_of_a_migrated_database(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'shard.db'}")
    try:
        with database.reading() as connection:
            assert recorded_revisions(connection, "alembic_version_shard") == set()
        database.prepare_schema(SHARD, "shard", migrate=True)
        with database.reading() as connection:
            assert recorded_revisions(connection, "alembic_version_shard") == {
                schema_head(SHARD)}
    finally:
        database.dispose()


def test_a_start_on_a_current_schema_does_not_import_alembic(tmp_path: Path) -> None:
    """The shard's server module and its start-up check, in a fresh interpreter, on a
    database migrated before; and a start that migrates does import it (the check is real)."""
    url = f"sqlite:///{tmp_path / 'shard.db'}"
    probe = textwrap.dedent(f"""
        import sys
        from services.common.db import Database
        from services.shard.server import MIGRATIONS, build_shard_server
        database = Database({url!r})
        database.prepare_schema(MIGRATIONS, "shard", migrate=True)
        print("alembic" in sys.modules)
    """)

    def imports_alembic() -> bool:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=120, check=True)
        return done.stdout.strip().splitlines()[-1] == "True"

    assert imports_alembic(), "the first start migrates, through alembic"
    assert not imports_alembic(), "a start on a current schema imported alembic"
