"""Database plumbing shared by the services' repositories.

``Database(url)`` owns the engine; :meth:`Database.session` is the one managed
session: it commits, rolls back, and translates driver errors into Engram
errors (an unreachable database is UNAVAILABLE, never a stack trace).
SQLite gets WAL and ``synchronous=FULL`` per connection: an acknowledged
write survives a crash or power loss. Migrations are alembic scripts shipped
inside each service package and applied with :meth:`Database.upgrade`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, MetaData, create_engine, event
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from services.common.errors import ResourceExhausted, Unavailable
from services.common.schema import recorded_revisions, schema_head
from services.common.startup import StartupError

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger("engram.db")


# A single-record commit writes ~41 KB of WAL (the record, its tags, its full-text rows and
# their indexes). SQLite's default checkpoints at 1,000 pages (4 MB) and then keeps the file at
# that size: on a small volume that fills, no later commit succeeds, so no checkpoint ever
# runs, and the space never comes back. Checkpoint at 1 MB and truncate the file to 1 MB after.
WAL_AUTOCHECKPOINT_PAGES = 256
WAL_SIZE_LIMIT_BYTES = 1 << 20

# A TRUNCATE checkpoint waits (busy_timeout) for readers, but another connection's checkpoint
# (an auto-checkpoint after a commit, or a second erasure's purge) holds SQLite's checkpointer
# lock and makes it answer busy at once. A busy answer that came back this fast is retried, for
# at most this long; one that waited out the busy timeout is a reader holding the WAL.
CHECKPOINT_RETRY_S = 2.0
_FAST_BUSY_S = 0.5

# Each pooled connection keeps its own page cache (SQLite's default: 2 MB), up to 18 of them in
# a burst. The file's pages are in the OS page cache anyway, so a miss costs a read() from
# memory: a shard at 10k records held 11 MB less at 512 KB, at the same CPU a write
# (docs/retrieval.md, "Memory (2026-11-29)").
SQLITE_CACHE_KIB = 512


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")  # negative: KiB, not pages
    cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
    # Deleted content is overwritten with zeros, not left in free pages or cells (erasure,
    # docs/erasure.md); the WAL copies go with the next TRUNCATE checkpoint.
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.close()


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and pick the psycopg 3 driver for it."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class Database:
    def __init__(self, url: str, *, pool_size: int = 8, pool_timeout: float = 30.0) -> None:
        """``pool_size``: connections kept open (as many again may be opened beside them on
        Postgres, ten on SQLite); ``pool_timeout``: how long a call waits for one when all are
        in use before it is refused RESOURCE_EXHAUSTED DATABASE_BUSY."""
        self.url = normalize_url(url)
        self.pool_timeout = pool_timeout
        parsed = make_url(self.url)
        self.dialect = parsed.get_backend_name()
        kwargs: dict[str, Any] = {"future": True}
        if self.dialect == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 10}
            if parsed.database in (None, "", ":memory:"):
                kwargs["poolclass"] = NullPool
            else:
                kwargs.update(pool_size=pool_size, pool_timeout=pool_timeout)
        else:
            # A server that stops answering must not hang a probe or a call for minutes.
            kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True,
                          pool_timeout=pool_timeout, connect_args={"connect_timeout": 5})
        self.engine: Engine = create_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        # Each connection is marked with the pool generation it was opened in; one that comes
        # back after a dispose (a newer generation) is closed (see dispose).
        self._generation = 0
        event.listen(self.engine, "connect", self._mark_generation)
        event.listen(self.engine, "checkin", self._close_if_disposed)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._checkpointing = threading.Lock()  # one explicit TRUNCATE checkpoint at a time

    @contextmanager
    def session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            if _is_connection_error(exc):
                raise _unavailable(exc) from exc
            if self.dialect == "sqlite" and "disk is full" in str(exc.orig).lower():
                self.checkpoint()  # fold the WAL back into the file: the space it held returns
            raise
        except PoolTimeout as exc:
            session.rollback()
            raise self._busy() from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A Core connection for reads alone, without an ORM session's begin, commit and close
        around it (a search's catch-up read, asked on every query: 0.18 -> 0.09 ms in process);
        rolled back as it goes back to the pool. Errors are translated as :meth:`session`'s."""
        try:
            with self.engine.connect() as connection:
                yield connection
        except DBAPIError as exc:  # OperationalError, or an InterfaceError on a dropped link
            if _is_connection_error(exc):
                raise _unavailable(exc) from exc
            raise
        except PoolTimeout as exc:
            raise self._busy() from exc

    def _busy(self) -> ResourceExhausted:
        """Every pooled connection stayed in use for ``pool_timeout``: the replica is past what
        its database connections carry. RESOURCE_EXHAUSTED with a delay, which the SDK waits
        out and retries (it was INTERNAL: SQLAlchemy's TimeoutError)."""
        return ResourceExhausted(
            f"every database connection of this replica's pool stayed in use for "
            f"{self.pool_timeout:g} s; retry later (an operator may raise the pool size or add "
            "replicas)", reason="DATABASE_BUSY", retry_delay=1.0)

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A session that holds SQLite's write lock from its first statement (``BEGIN
        IMMEDIATE``): what it reads stays current until it commits, and another writer waits
        (busy_timeout). On Postgres a plain session: lock the rows that matter FOR UPDATE."""
        with self.session() as session:
            if self.dialect == "sqlite":
                session.connection().exec_driver_sql("BEGIN IMMEDIATE")
            yield session

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A session whose reads all see one moment, whatever commits meanwhile (a check that
        compares one table with another must not see a change land between its reads).
        Postgres: a REPEATABLE READ, read-only transaction. SQLite: an explicit ``BEGIN`` (the
        driver opens none before a SELECT, so each read would otherwise see its own moment);
        in WAL mode writers go on beside it."""
        with self.session() as session:
            if self.dialect == "sqlite":
                session.connection().exec_driver_sql("BEGIN")
            else:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ",
                                                      "postgresql_readonly": True})
            yield session

    def upgrade(self, migrations_dir: Path) -> None:
        """Bring the schema to the newest revision shipped with the service."""
        from alembic import command  # only when a migration runs: services/common/schema.py

        config = _alembic_config(migrations_dir)
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def prepare_schema(self, migrations_dir: Path, service: str, *, migrate: bool) -> None:
        """At start: bring ``service``'s schema to the newest revision (``migrate``), or check
        it is there already. A schema that is not (an empty database, or one an older build
        left) is a :class:`StartupError` naming both revisions and ENGRAM_<SERVICE>_MIGRATE,
        instead of the first query failing on a missing table. Each service's migrations
        record their revision in :func:`version_table` (its migrations/env.py).

        A schema found current (every start but the first after an upgrade) is checked
        without importing alembic (:mod:`services.common.schema`)."""
        head = schema_head(migrations_dir)
        with self.reading() as connection:
            recorded = recorded_revisions(connection, version_table(service))
        if head is not None and recorded == {head}:
            return
        if migrate:
            self.upgrade(migrations_dir)
            return
        from alembic.script import ScriptDirectory

        setting = f"ENGRAM_{service.upper()}_MIGRATE"
        head = ScriptDirectory.from_config(_alembic_config(migrations_dir)).get_current_head()
        current = ", ".join(sorted(recorded))
        if recorded != {head}:
            where = make_url(self.url).render_as_string(hide_password=True)
            raise StartupError(
                f"the database at {where} has schema revision "
                f"{current or 'none (empty)'}, this build needs {head}, and {setting}=false "
                f"keeps it from migrating: run once with {setting}=true (or `alembic upgrade "
                f"head` with {migrations_dir}), then start again")

    def ping(self) -> bool:
        """Whether the database answers a query now (readiness; never raises)."""
        probe = "SELECT count(*) FROM sqlite_master" if self.dialect == "sqlite" else "SELECT 1"
        try:
            with self.engine.connect() as connection:
                connection.exec_driver_sql(probe).one()
            return True
        except Exception as exc:  # unreachable, refused, unreadable: not ready
            log.warning("database probe failed: %s", str(exc).splitlines()[0][:200])
            return False

    def checkpoint(self) -> bool:
        """SQLite: move the WAL's pages into the database file and truncate the WAL (best
        effort; False if it could not, e.g. the file cannot grow either). Other databases:
        nothing to do."""
        if self.dialect != "sqlite":
            return True
        try:
            with self.engine.connect() as connection:
                return self._truncate_wal(connection)
        except DBAPIError as exc:
            log.warning("WAL checkpoint failed: %s", _short(exc))
            return False
        except PoolTimeout:
            log.warning("WAL checkpoint skipped: every pooled connection is in use")
            return False

    def vacuum(self, tables: Sequence[str]) -> None:
        """After an erasure: Postgres VACUUMs ``tables`` (dead tuples become free space);
        SQLite truncates the WAL (its pages hold the rows before they were deleted). Raises
        what the database raises: an erasure must not report success it did not reach."""
        try:
            connection = self.engine.connect()
        except PoolTimeout as exc:
            raise self._busy() from exc
        with connection.execution_options(isolation_level="AUTOCOMMIT") as conn:
            if self.dialect == "sqlite":
                if not self._truncate_wal(conn):
                    raise Unavailable("the WAL could not be emptied after the erasure (a reader "
                                      "held it); run the erasure again to finish it",
                                      reason="WAL_BUSY")
                return
            for name in tables:
                conn.exec_driver_sql(f'VACUUM "{name}"')

    def _truncate_wal(self, connection: Any) -> bool:
        """``PRAGMA wal_checkpoint(TRUNCATE)``, one at a time in this process, retried while
        another connection's checkpoint is what made it busy (True when the WAL was emptied)."""
        with self._checkpointing:
            deadline = time.monotonic() + CHECKPOINT_RETRY_S
            pause = 0.01
            while True:
                began = time.monotonic()
                busy, _, _ = connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
                now = time.monotonic()
                if not busy or now - began >= _FAST_BUSY_S or now >= deadline:
                    return not busy
                time.sleep(pause)
                pause = min(pause * 2, 0.2)

    def dispose(self, wait_seconds: float = 2.0) -> None:
        """Close the pool's connections. One still checked out (a handler thread that a
        ``stop(0)`` did not wait for, a worker ending) is waited for up to ``wait_seconds``, and
        closed when it comes back even later: the engine's dispose leaves such a connection in
        the abandoned pool, open until the garbage collector finds it (psycopg then warns).
        The Database stays usable: later sessions open connections in a new pool."""
        pool = self.engine.pool
        checked_out = getattr(pool, "checkedout", None)  # QueuePool's count; NullPool has none
        deadline = time.monotonic() + wait_seconds
        while checked_out is not None and checked_out() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        self._generation += 1
        self.engine.dispose()

    def _mark_generation(self, _dbapi_connection: Any, record: Any) -> None:
        record.info["engram_generation"] = self._generation

    def _close_if_disposed(self, dbapi_connection: Any, record: Any) -> None:
        if dbapi_connection is not None and record.info.get(
                "engram_generation", self._generation) != self._generation:
            dbapi_connection.close()

    def insert_once(self, session: Session, table: Any, values: dict[str, Any]) -> bool:
        """Insert ``values`` unless a row with its key is there already (committed by another
        transaction meanwhile, too): True when this call inserted it."""
        dialect_insert = pg_insert if self.dialect == "postgresql" else sqlite_insert
        key = list(getattr(table, "__table__", table).primary_key.columns)
        statement = dialect_insert(table).values(**values).on_conflict_do_nothing()
        return session.execute(statement.returning(*key)).first() is not None


def _alembic_config(migrations_dir: Path) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    return config


def version_table(service: str) -> str:
    """Where ``service``'s migrations record the schema revision (one table per service, so
    services may share a database)."""
    return f"alembic_version_{service}"


def run_migrations(target_metadata: MetaData, service: str) -> None:
    """The body of every service's migrations/env.py (connection from Database.upgrade)."""
    from alembic import context

    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(f"run the {service} migrations through "
                           "services.common.db.Database.upgrade")
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=True, version_table=version_table(service))
    with context.begin_transaction():
        context.run_migrations()


def _is_connection_error(exc: DBAPIError) -> bool:
    text = str(exc.orig).lower()
    return exc.connection_invalidated or any(
        marker in text
        for marker in ("could not connect", "connection refused", "server closed", "terminating",
                       "connection failed", "not currently accepting connections",
                       "connection is closed", "consuming input failed")
    )


def _unavailable(exc: DBAPIError) -> Unavailable:
    return Unavailable(f"database unavailable: {_short(exc)}", reason="DATABASE_UNAVAILABLE")


def _short(exc: DBAPIError) -> str:
    return str(exc.orig).strip().splitlines()[0][:200]
