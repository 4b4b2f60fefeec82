-- Runs once, when the compose Postgres starts on an empty volume (docker-entrypoint-initdb.d).
-- One database and one login role per service. CONNECT is revoked from PUBLIC, so a service
-- holding its own credentials still cannot open another service's database.
-- The passwords are for the local compose stack only; production takes its DB URLs from secrets.

CREATE ROLE engram_shard LOGIN PASSWORD 'engram-shard-dev';
CREATE DATABASE engram_shard OWNER engram_shard;
REVOKE ALL ON DATABASE engram_shard FROM PUBLIC;

CREATE ROLE engram_governance LOGIN PASSWORD 'engram-governance-dev';
CREATE DATABASE engram_governance OWNER engram_governance;
REVOKE ALL ON DATABASE engram_governance FROM PUBLIC;

CREATE ROLE engram_artifacts LOGIN PASSWORD 'engram-artifacts-dev';
CREATE DATABASE engram_artifacts OWNER engram_artifacts;
REVOKE ALL ON DATABASE engram_artifacts FROM PUBLIC;

CREATE ROLE engram_compactor LOGIN PASSWORD 'engram-compactor-dev';
CREATE DATABASE engram_compactor OWNER engram_compactor;
REVOKE ALL ON DATABASE engram_compactor FROM PUBLIC;
