#!/usr/bin/env bash
# rpc_bench's TCP measures between two Linux network namespaces (a veth pair, its own addresses),
# so that the loopback device is out of the picture: what two hosts or containers see, on one
# machine. gradwire (TCP only) and PyTorch (TensorPipe uv + basic) pairs take turns, in rounds;
# the table gives medians and the per-round range, and the ratio gradwire/torch.
#
# usage: sudo benchmarks/netns_bench.sh [--rounds N] [--sizes 1,16] [--python PY] [--torch-python PY]
#   PY defaults to .venv/bin/python; the torch side runs in $GRADWIRE_TORCH_PYTHON (an interpreter
#   with torch==2.13.0 and gradwire) and is left out without one.
# Everything made here (two namespaces) is removed on exit. exit 77: no namespaces here (not root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
rounds=3
sizes=1,16
python="$repo/.venv/bin/python"
torch_python="${GRADWIRE_TORCH_PYTHON:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --torch-python) torch_python="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

prefix="gwb$(printf '%04x' $(($$ % 65536)))"
a="${prefix}-a" b="${prefix}-b"
net="10.$((200 + $$ % 50)).$(((($$ / 50) % 250) + 1))"
work="$(mktemp -d "/tmp/${prefix}.XXXX")"
cleanup() {
  for ns in "$a" "$b"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
command -v ip >/dev/null || { echo "SKIP: iproute2 (ip) is not installed"; exit 77; }
ip netns add "$a" 2>/dev/null || { echo "SKIP: cannot make a network namespace (root?)"; exit 77; }
ip netns add "$b"
ip -n "$a" link add eth0 type veth peer name eth0 netns "$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" addr add "$net.1/24" dev eth0 && ip -n "$a" link set eth0 up
ip -n "$b" addr add "$net.2/24" dev eth0 && ip -n "$b" link set eth0 up

frameworks=(gradwire)
[ -n "$torch_python" ] && frameworks+=(torch)
export GRADWIRE_TOKEN="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# TensorPipe and Gloo pick their interface by name (the namespace has only lo and eth0).
export TP_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0
port=29700
for round in $(seq 1 "$rounds"); do
  for fw in "${frameworks[@]}"; do
    py="$python"; [ "$fw" = torch ] && py="$torch_python"
    port=$((port + 1)); done_file="$work/done-$fw-$round"
    ip netns exec "$b" "$py" "$here/pair_bench.py" "$fw" 1 "$net.1" "$port" "$done_file" \
      --sizes "$sizes" >"$work/peer-$fw-$round.log" 2>&1 &
    peer=$!
    ip netns exec "$a" timeout 900 "$py" "$here/pair_bench.py" "$fw" 0 "$net.1" "$port" \
      "$done_file" --sizes "$sizes" 2>"$work/driver-$fw-$round.log" | tail -n 1 >>"$work/results.jsonl"
    wait "$peer" || { echo "the $fw peer failed:"; tail -n 20 "$work/peer-$fw-$round.log"; exit 1; }
  done
  echo "round $round/$rounds done" >&2
done
"$python" - "$work/results.jsonl" "$rounds" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {}
for run in runs:
    for label, value in run["figures"].items():
        by.setdefault(label, {}).setdefault(run["framework"], []).append(value)
names = [n for n in ("gradwire", "torch") if any(n in v for v in by.values())]
fmt = lambda v, rate: f"{v:,.0f}/s" if rate else (f"{v * 1e6:.0f} us" if v < 1e-3 else f"{v * 1e3:.2f} ms")
print(f"netns_bench: {sys.argv[2]} rounds, two network namespaces over a veth pair, TCP only; "
      "median (per-round range)")
print("| measure | " + " | ".join(names) + (" | gradwire/torch |" if len(names) == 2 else " |"))
print("|---" * (len(names) + 1 + (len(names) == 2)) + "|")
for label, per in by.items():
    rate = "/s" in label or "in flight" in label
    cells, med = [], {}
    for n in names:
        vals = [v for v in per.get(n, []) if isinstance(v, (int, float))]
        if not vals:
            cells.append("error" if per.get(n) else ""); continue
        med[n] = statistics.median(vals)
        cells.append(f"{fmt(med[n], rate)} ({fmt(min(vals), rate)}-{fmt(max(vals), rate)})")
    if len(names) == 2:
        cells.append(f"{med['gradwire'] / med['torch']:.2f}" if len(med) == 2 else "")
    print(f"| {label} | " + " | ".join(cells) + " |")
PY
