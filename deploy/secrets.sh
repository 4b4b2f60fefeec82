#!/bin/sh
# Print the Secrets an Engram overlay expects, as YAML for `kubectl apply -f -` (nothing is applied
# here, and nothing secret is written to disk outside $ENGRAM_SIGNING_HOME):
#
#   ENGRAM_NAMESPACE=engram ENGRAM_SIGNING_HOME=/secure/engram-signing \
#   ENGRAM_SHARD_DB_URL=postgresql+psycopg://engram_shard:...@db:5432/engram_shard \
#   ENGRAM_GOVERNANCE_DB_URL=... ENGRAM_ARTIFACTS_DB_URL=... ENGRAM_COMPACTOR_DB_URL=... \
#   [ENGRAM_S3_ACCESS_KEY_ID=... ENGRAM_S3_SECRET_ACCESS_KEY=...] \
#   [ENGRAM_TLS_DIR=/secure/engram-tls] [ENGRAM_WITH_EMBEDDER=1] \
#   sh deploy/secrets.sh | kubectl apply -f -
#
# ENGRAM_TLS_DIR (for overlays with components/tls, e.g. prod-tls) holds ca.crt and, per service,
# <service>.crt and <service>.key (and gateway.crt, gateway.key); each gets them as
# engram-<service>-tls.
# ENGRAM_WITH_EMBEDDER=1 (for overlays with components/embedder, e.g. prod-embedder) adds the
# shared embedding service's Secrets: its service token (svc-embedder, audience governance: it
# polls governance for revoked tokens) and, with ENGRAM_TLS_DIR, engram-embedder-tls from
# embedder.crt / embedder.key.
# The signing key is created in $ENGRAM_SIGNING_HOME/auth on first use and stays there: the
# cluster only ever gets the public key and the service tokens (shard, artifacts, compactor, and
# the embedder with ENGRAM_WITH_EMBEDDER; 30 days, each naming only the services it calls: run
# this again to renew them, then `kubectl rollout restart deployment -n "$ENGRAM_NAMESPACE"`:
# a service reads its token file once, at start).
# Needs the engram package (for the key and `engram token create`) and kubectl on PATH.
set -eu

: "${ENGRAM_NAMESPACE:?set ENGRAM_NAMESPACE (engram-dev or engram)}"
: "${ENGRAM_SIGNING_HOME:?set ENGRAM_SIGNING_HOME to the directory that keeps the signing key}"
for svc in SHARD GOVERNANCE ARTIFACTS COMPACTOR; do
  eval "url=\${ENGRAM_${svc}_DB_URL:-}"
  [ -n "$url" ] || { echo "set ENGRAM_${svc}_DB_URL (each service has its own database)" >&2; exit 2; }
done
# Everything is checked before anything is printed: `| kubectl apply` never gets half a set.
if [ -n "${ENGRAM_S3_ACCESS_KEY_ID:-}" ]; then
  : "${ENGRAM_S3_SECRET_ACCESS_KEY:?set ENGRAM_S3_SECRET_ACCESS_KEY too}"
fi
SERVICES="shard governance artifacts compactor"
# The gateway is a TLS client of all four, with its own certificate.
TLS_HOLDERS="$SERVICES gateway"
# Services that present a service token: those that call another one (all poll governance).
TOKEN_HOLDERS="shard artifacts compactor"
case "${ENGRAM_WITH_EMBEDDER:-}" in
  1|true) TLS_HOLDERS="$TLS_HOLDERS embedder" TOKEN_HOLDERS="$TOKEN_HOLDERS embedder" ;;
  ""|0|false) ;;
  *) echo "ENGRAM_WITH_EMBEDDER must be 1, true, 0 or false" >&2; exit 2 ;;
esac
if [ -n "${ENGRAM_TLS_DIR:-}" ]; then
  for file in ca.crt $(for svc in $TLS_HOLDERS; do echo "$svc.crt $svc.key"; done); do
    [ -r "$ENGRAM_TLS_DIR/$file" ] || { echo "ENGRAM_TLS_DIR has no readable $file" >&2; exit 2; }
  done
fi

umask 077
python -c 'import sys; from pathlib import Path; from services.common.tokens import ensure_keypair; ensure_keypair(Path(sys.argv[1]))' "$ENGRAM_SIGNING_HOME"
KEY="$ENGRAM_SIGNING_HOME/auth/signing.key"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

secret() {  # secret <name> <kubectl create secret generic arguments>...
  name="$1"
  shift
  echo "---"
  kubectl create secret generic "$name" --namespace "$ENGRAM_NAMESPACE" "$@" \
    --dry-run=client -o yaml
}

# The current public key and every retired one still in $ENGRAM_SIGNING_HOME/auth/keys (a key
# rotation: tokens of the old key keep working until it is deleted there; docs/security.md).
set -- --from-file=signing.pub="$ENGRAM_SIGNING_HOME/auth/signing.pub"
for retired in "$ENGRAM_SIGNING_HOME"/auth/keys/*.pub; do
  [ -f "$retired" ] && set -- "$@" --from-file="$(basename "$retired")=$retired"
done
secret engram-auth-public-key "$@"
for svc in $TOKEN_HOLDERS; do
  case "$svc" in
    compactor) audiences="--audience shard --audience artifacts --audience governance" ;;
    shard) audiences="--audience governance --audience embedder" ;;  # embedder: docs/embedder.md
    *) audiences="--audience governance" ;;
  esac
  # shellcheck disable=SC2086 # audiences is a list of words by design
  engram token create --key "$KEY" --agent "svc-$svc" --fleet system --role service --ttl 30d \
    $audiences > "$WORK/$svc.token"
  secret "engram-$svc-service-token" --from-file=token="$WORK/$svc.token"
done
# One page-token secret per service, shared by its replicas (a token from one works on all).
for svc in $SERVICES; do
  python -c 'import secrets; print(secrets.token_hex(32))' > "$WORK/$svc.page-token"
  secret "engram-$svc-page-token" --from-file=key="$WORK/$svc.page-token"
done
secret engram-shard-db --from-literal=url="$ENGRAM_SHARD_DB_URL"
secret engram-governance-db --from-literal=url="$ENGRAM_GOVERNANCE_DB_URL"
secret engram-artifacts-db --from-literal=url="$ENGRAM_ARTIFACTS_DB_URL"
secret engram-compactor-db --from-literal=url="$ENGRAM_COMPACTOR_DB_URL"
if [ -n "${ENGRAM_S3_ACCESS_KEY_ID:-}" ]; then
  for svc in artifacts compactor; do
    secret "engram-$svc-s3" --from-literal=access_key_id="$ENGRAM_S3_ACCESS_KEY_ID" \
      --from-literal=secret_access_key="$ENGRAM_S3_SECRET_ACCESS_KEY"
  done
fi
if [ -n "${ENGRAM_TLS_DIR:-}" ]; then
  for svc in $TLS_HOLDERS; do
    secret "engram-$svc-tls" --type=kubernetes.io/tls --from-file=tls.crt="$ENGRAM_TLS_DIR/$svc.crt" \
      --from-file=tls.key="$ENGRAM_TLS_DIR/$svc.key" --from-file=ca.crt="$ENGRAM_TLS_DIR/ca.crt"
  done
fi
