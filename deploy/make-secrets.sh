#!/usr/bin/env bash
# Make the secrets of a gradwire cluster:
#   deploy/cluster.env   GRADWIRE_TOKEN=<fresh random token> plus the example's other settings
#   deploy/certs/        (with --tls) a CA and one certificate per worker name, for mutual TLS
#
# usage: deploy/make-secrets.sh [--tls NAME...]     e.g. --tls ps trainer0 trainer1 worker3
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
umask 077

token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
sed "s/^GRADWIRE_TOKEN=.*/GRADWIRE_TOKEN=${token}/" "$here/cluster.env.example" >"$here/cluster.env"
echo "wrote $here/cluster.env (fresh GRADWIRE_TOKEN)"

if [ "${1:-}" = "--tls" ]; then
  shift
  [ "$#" -gt 0 ] || { echo "--tls needs worker names" >&2; exit 2; }
  command -v openssl >/dev/null || { echo "openssl is needed for --tls" >&2; exit 2; }
  certs="$here/certs"
  mkdir -p "$certs"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
    -subj "/CN=gradwire-ca" -keyout "$certs/ca.key" -out "$certs/ca.pem" 2>/dev/null
  for name in "$@"; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
      -keyout "$certs/$name.key" -out "$certs/$name.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' \
      "$name" >"$certs/$name.ext"
    openssl x509 -req -in "$certs/$name.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" \
      -CAcreateserial -days 365 -extfile "$certs/$name.ext" -out "$certs/$name.pem" 2>/dev/null
    rm -f "$certs/$name.csr" "$certs/$name.ext"
    echo "wrote $certs/$name.pem and $name.key"
  done
  echo "set GRADWIRE_TLS_CERT, GRADWIRE_TLS_KEY, GRADWIRE_TLS_CA (and GRADWIRE_TLS_REQUIRE_CLIENT_AUTH=1) per worker"
fi
