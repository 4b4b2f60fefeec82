#!/bin/sh
# One-shot provisioning for docker compose (the engram-init container), safe to run again:
#   1. the deployment's Ed25519 signing key + the operator's admin token, kept in
#      $ENGRAM_SIGNING_HOME, which no service mounts (services can check tokens, never mint them);
#   2. per service, a directory $ENGRAM_AUTH_ROOT/<svc> with the public key, plus a service token
#      for the services that call another one (shard -> governance, embedder; artifacts and the
#      embedder -> governance; compactor -> shard, artifacts, governance), naming only those in
#      its audience, valid 30 days (the embedder's too, though it runs only with the compose
#      profile "embedder": docs/embedder.md);
#   3. the S3 buckets the artifacts and compactor blob stores use.
set -eu

SIGNING_HOME="${ENGRAM_SIGNING_HOME:-/var/lib/engram-signing}"
AUTH_ROOT="${ENGRAM_AUTH_ROOT:-/run/engram}"
SERVICE_UID="${ENGRAM_SERVICE_UID:-10001}"
S3_ENDPOINT="${ENGRAM_S3_ENDPOINT_URL:-}"
S3_BUCKETS="${ENGRAM_S3_BUCKETS:-}"
umask 077

python -c 'import sys; from pathlib import Path; from services.common.tokens import ensure_keypair; ensure_keypair(Path(sys.argv[1]))' "$SIGNING_HOME"
KEY="$SIGNING_HOME/auth/signing.key"

fresh() {  # fresh <file>: the token there verifies with the current key and has a third of its life left
  python -c 'import sys; from pathlib import Path
from services.common.tokens import TokenVerifier, needs_renewal
token = Path(sys.argv[1]).read_text().strip()
sys.exit(needs_renewal(token, TokenVerifier.load(Path(sys.argv[2]))))' "$1" "$SIGNING_HOME/auth/signing.pub"
}

mint() {  # mint <file> <agent> <fleet> <audiences> <role>...: write a token, renewed when near expiry
  file="$1" agent="$2" fleet="$3" audiences="$4"
  shift 4
  [ -s "$file" ] && fresh "$file" && return 0
  flags=""
  for role in "$@"; do flags="$flags --role $role"; done
  for audience in $audiences; do flags="$flags --audience $audience"; done
  # shellcheck disable=SC2086 # flags is a list of words by design
  engram token create --key "$KEY" --agent "$agent" --fleet "$fleet" --ttl 30d $flags > "$file.tmp"
  mv "$file.tmp" "$file"
}

mint "$SIGNING_HOME/auth/admin.token" admin default "shard governance artifacts compactor" admin governor

for svc in governance artifacts shard compactor embedder; do
  mkdir -p "$AUTH_ROOT/$svc"
  cp "$SIGNING_HOME/auth/signing.pub" "$AUTH_ROOT/$svc/signing.pub"
done
mint "$AUTH_ROOT/shard/shard.token" svc-shard system "governance embedder" service
mint "$AUTH_ROOT/artifacts/artifacts.token" svc-artifacts system governance service
mint "$AUTH_ROOT/compactor/compactor.token" svc-compactor system "shard artifacts governance" service
mint "$AUTH_ROOT/embedder/embedder.token" svc-embedder system governance service

# The services run as $SERVICE_UID; only root can hand the files over (compose volumes start root-owned).
if [ "$(id -u)" = "0" ]; then
  for svc in governance artifacts shard compactor embedder; do
    chown -R "$SERVICE_UID:$SERVICE_UID" "$AUTH_ROOT/$svc"
    chmod 0500 "$AUTH_ROOT/$svc"
    chmod 0400 "$AUTH_ROOT/$svc"/*
  done
fi

if [ -n "$S3_ENDPOINT" ] && [ -n "$S3_BUCKETS" ]; then
  # shellcheck disable=SC2086 # one argument per bucket
  python - "$S3_ENDPOINT" $S3_BUCKETS <<'PY'
import sys
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError

endpoint, *buckets = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=endpoint)
for _attempt in range(60):
    try:
        existing = {bucket["Name"] for bucket in s3.list_buckets()["Buckets"]}
        break
    except (BotoCoreError, ClientError):
        time.sleep(1)
else:
    sys.exit(f"S3 endpoint {endpoint} did not answer in 60 s")
for bucket in buckets:
    if bucket not in existing:
        s3.create_bucket(Bucket=bucket)
print(f"buckets ready at {endpoint}: {', '.join(buckets)}")
PY
fi
echo "engram-init: signing key in $SIGNING_HOME/auth, service credentials under $AUTH_ROOT"
