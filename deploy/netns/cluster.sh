#!/usr/bin/env bash
# A gradwire cluster across Linux network namespaces on one machine: one namespace per worker,
# each with its own address on a private bridge (which lives in a namespace of its own, so the
# host's network is never touched).
#
#   1. job:  start gradwire-worker in namespaces 1..N, run JOB with `gradwire run` from namespace
#            0 (the driver, rank 0); expect every process to exit 0.
#   2. cut:  start the workers again, run a job that calls every worker in a loop, take the last
#            worker's link down (ip link set eth0 down) and expect the driver to report that
#            worker's failure within the rpc timeout (plus a small margin).
#   Everything made here is removed on exit, also on failure or Ctrl-C.
#
# usage: sudo deploy/netns/cluster.sh [--workers N] [--job TARGET] [--no-cut]
#                                     [--names N0,N1,...] [--rpc-timeout S] [--python PATH]
#   TARGET: what `gradwire run` runs (default deploy/jobs/ping_all.py)
#   --names: worker names by rank, the driver's first (default driver,w1,...,wN); the demo:
#            --workers 2 --names trainer0,ps,trainer1 --job gradwire.demo:job
# exit: 0 all checks passed, 1 a check failed, 77 namespaces cannot be made here (not root, ...)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
workers=3
job="$repo/deploy/jobs/ping_all.py"
cut=1
rpc_timeout=3
python="${GRADWIRE_PYTHON:-$(command -v python3)}"
names_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --job) job="$2"; shift 2 ;;
    --no-cut) cut=0; shift ;;
    --rpc-timeout) rpc_timeout="$2"; shift 2 ;;
    --names) names_arg="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

if [ -n "$names_arg" ]; then
  IFS=, read -r -a names <<<"$names_arg"
  [ "${#names[@]}" -eq $((workers + 1)) ] || { echo "--names needs $((workers + 1)) names" >&2; exit 2; }
else
  names=(driver)
  for i in $(seq 1 "$workers"); do names+=("w$i"); done
fi

id="$(printf '%04x' $(($$ % 65536)))"
prefix="gw${id}"
subnet="10.$((200 + $$ % 50)).$(((($$ / 50) % 250) + 1))"
port=29500
token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
work="$(mktemp -d "/tmp/${prefix}.XXXX")"
namespaces=()
pids=()

say() { printf '[netns %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
fail() { say "FAIL: $*"; exit 1; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for ns in "${namespaces[@]}"; do
    # Anything still running inside (started by us) goes with its namespace.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }; done
  fi
  rm -rf "$work"
  say "removed namespaces ${namespaces[*]:-none} and $work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- can we? ---------------------------------------------------------------------------------------
if [ "$(id -u)" -ne 0 ]; then say "SKIP: network namespaces need root"; exit 77; fi
command -v ip >/dev/null || { say "SKIP: iproute2 (ip) is not installed"; exit 77; }
if ! err="$(ip netns add "${prefix}-br" 2>&1)"; then say "SKIP: cannot make a namespace: $err"; exit 77; fi
namespaces+=("${prefix}-br")
if ! err="$(ip -n "${prefix}-br" link add br0 type bridge 2>&1)"; then
  say "SKIP: cannot make a bridge: $err"; exit 77
fi
"$python" -c "import gradwire.server.cli" || fail "$python cannot import gradwire"

# -- the network ------------------------------------------------------------------------------------
br="${prefix}-br"
ip -n "$br" link set lo up
ip -n "$br" link set br0 up
addr() { echo "${subnet}.$((10 + $1))"; }
for i in $(seq 0 "$workers"); do
  ns="${prefix}-$i"
  ip netns add "$ns"
  namespaces+=("$ns")
  # Made inside the bridge's namespace with the peer end straight in the worker's: nothing is
  # ever created in the host's namespace.
  ip -n "$br" link add "h$i" type veth peer name eth0 netns "$ns"
  ip -n "$br" link set "h$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
done
say "bridge in $br; namespaces ${prefix}-0..$workers on ${subnet}.0/24 (driver $(addr 0))"

# No Unix socket and a host id per namespace: same-host shortcuts (Unix socket, shared memory)
# would bypass the network under test.
gw_env() {  # gw_env RANK NAME: the environment of one process
  echo "GRADWIRE_NAME=$2 GRADWIRE_RANK=$1 GRADWIRE_WORLD_SIZE=$((workers + 1))" \
    "GRADWIRE_MASTER_ADDR=$(addr 0) GRADWIRE_MASTER_PORT=$port" \
    "GRADWIRE_LISTEN=$(addr "$1"):$port GRADWIRE_TOKEN=$token GRADWIRE_UNIX_SOCKET=0" \
    "GRADWIRE_HOST_ID=${prefix}-$1" \
    "GRADWIRE_RPC_TIMEOUT=$rpc_timeout GRADWIRE_INIT_TIMEOUT=60 GRADWIRE_SHUTDOWN_TIMEOUT=5" \
    "GRADWIRE_LOG_LEVEL=INFO PYTHONUNBUFFERED=1 GRADWIRE_ALLOW=${GRADWIRE_ALLOW:-gradwire.demo.*}"
}
in_ns() {  # in_ns RANK NAME COMMAND...
  local rank="$1" name="$2"; shift 2
  # shellcheck disable=SC2046
  ip netns exec "${prefix}-$rank" env $(gw_env "$rank" "$name") "$@"
}

start_workers() {  # start_workers PHASE
  worker_pids=()
  for i in $(seq 1 "$workers"); do
    in_ns "$i" "${names[$i]}" "$python" -m gradwire.server >"$work/$1-${names[$i]}.log" 2>&1 &
    pids+=($!)
    worker_pids+=($!)
  done
  for i in $(seq 1 "$workers"); do
    local deadline=$((SECONDS + 30))
    until in_ns "$i" "${names[$i]}" "$python" -m gradwire.cli health --live --timeout 2 \
      "$(addr "$i"):$port" >/dev/null 2>&1; do
      [ $SECONDS -lt $deadline ] || fail "worker ${names[$i]} never answered its health check"
      sleep 0.3
    done
  done
  say "$1: workers ${names[*]:1} are up (gradwire health --live answered in every namespace)"
}

wait_pid() {  # wait_pid PID SECONDS: sets waited_rc, or fails when PID outlives the deadline
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "process $1 still running after $2 s"
    sleep 0.2
  done
  waited_rc=0
  wait "$1" || waited_rc=$?
}

# -- 1. the job -------------------------------------------------------------------------------------
start_workers job
say "job: gradwire run $job (driver in ${prefix}-0)"
rc=0
in_ns 0 "${names[0]}" "$python" -m gradwire.cli run "$job" >"$work/job-driver.log" 2>&1 || rc=$?
grep -v ' INFO ' "$work/job-driver.log" | sed 's/^/    /' || true
[ "$rc" -eq 0 ] || fail "the job exited with $rc"
for i in $(seq 1 "$workers"); do
  wait_pid "${worker_pids[$((i - 1))]}" 30
  [ "$waited_rc" -eq 0 ] || fail "worker ${names[$i]} exited with $waited_rc after the job"
done
say "job: PASS (driver and every worker exited 0)"

[ "$cut" -eq 1 ] || { say "PASS"; exit 0; }

# -- 2. cut a link ------------------------------------------------------------------------------------
victim="${names[$workers]}"
start_workers cut
in_ns 0 "${names[0]}" "$python" -m gradwire.cli run "$repo/deploy/jobs/ping_all.py" --until-failure \
  --max-seconds 60 >"$work/cut-driver.log" 2>&1 &
driver_pid=$!
pids+=("$driver_pid")
deadline=$((SECONDS + 60))
until grep -q 'round 3 ok' "$work/cut-driver.log"; do
  kill -0 "$driver_pid" 2>/dev/null || fail "the ping job ended before the cut"
  [ $SECONDS -lt $deadline ] || fail "the ping job never completed 3 rounds"
  sleep 0.2
done
in_ns 0 "${names[0]}" "$python" -m gradwire.cli inspect --all --timeout 3 "$(addr 0):$port" \
  | sed 's/^/    /' || true
ip -n "${prefix}-$workers" link set eth0 down
cut_at="$(date +%s.%N)"
say "cut: link of $victim ($(addr "$workers")) is down"
wait_pid "$driver_pid" $((rpc_timeout * 4 + 30))
rc=$waited_rc
line="$(grep -m1 'ping_all: FAILED' "$work/cut-driver.log" || true)"
[ -n "$line" ] || fail "the driver did not report a failure (exit $rc)"
echo "    $line"
[ "$rc" -ne 0 ] || fail "the driver exited 0 after the cut"
echo "$line" | grep -q "worker '$victim'" || fail "the failure does not name $victim"
failed_at="$(echo "$line" | sed -E 's/.*FAILED at ([0-9.]+).*/\1/')"
latency="$(awk -v a="$failed_at" -v b="$cut_at" 'BEGIN { printf "%.2f", a - b }')"
limit=$((rpc_timeout + 5))
awk -v l="$latency" -v m="$limit" 'BEGIN { exit !(l <= m) }' \
  || fail "the failure was reported $latency s after the cut (limit $limit s)"
say "cut: PASS ($victim's failure reported ${latency} s after the cut; rpc timeout ${rpc_timeout} s)"
say "PASS"
