#!/usr/bin/env bash
# weir on a 3-node NATS cluster, with a fault injected while rows flow.
#
#   examples/cluster/run.sh [FAULT] [SECONDS]
#
# FAULT: none | kill-host | term-host | freeze-host | kill-leader | rolling (default kill-host)
# SECONDS: how long the load runs (default 60); the fault comes at a third.
#
# Builds weir and its plugins, starts three nats-servers (n1.conf … n3.conf)
# and three hosts (h1.toml … h3.toml, replicas = 3), posts a steady load of
# three tenants × two tables (5 rows every 100 ms per table) to every front
# door, injects the fault, then checks every accepted row against what the
# hosts' sinks wrote and prints one line like tests/it/cluster.rs does.
set -euo pipefail
fault="${1:-kill-host}"
seconds="${2:-60}"
case "$fault" in none | kill-host | term-host | freeze-host | kill-leader | rolling) ;;
*) echo "unknown fault $fault (none, kill-host, term-host, freeze-host, kill-leader, rolling)" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib.sh"

build_example validator ndjson_sink
# The load, its records in run/load, and the check of the hosts' sinks.
. "$here/load.sh"
doors=(http://127.0.0.1:8091 http://127.0.0.1:8092 http://127.0.0.1:8093)
load_dir=run/load
sink_files() { printf '%s\n' run/h*/out/"${1%.*}"/"${1#*.}".ndjson; }
nats_server="${WEIR_NATS_SERVER:-nats-server}"

cd "$here"
rm -rf run
mkdir -p run/load
declare -A node_pid host_pid
start_node() {
  "$nats_server" -c "n$1.conf" >>"run/n$1.log" 2>&1 &
  node_pid[$1]=$!
}
start_host() {
  WEIR_LOG=${WEIR_LOG:-info} "$weir" run --config "h$1.toml" >>"run/h$1.log" 2>&1 &
  host_pid[$1]=$!
}
cleanup() {
  touch "$load_dir/stop"
  for pid in "${host_pid[@]}" "${node_pid[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Healthy: JetStream current on the node (and, in a cluster, a meta leader).
wait_node() {
  node_healthy "http://127.0.0.1:823$1" && return 0
  echo "node n$1 not healthy" >&2
  exit 1
}
# A host is up once it answers `weir status` (its log: run/h<n>.log).
wait_host() { wait_ready "http://127.0.0.1:809$1" "${host_pid[$1]}" 600; }
# The node leading stream weir_in_0, from any node's monitor.
leader() { stream_leader "http://127.0.0.1:823$1"; }

echo "== starting nats-server n1 n2 n3"
for n in 1 2 3; do start_node $n; done
for n in 1 2 3; do wait_node $n; done
echo "== starting weir h1 (creates the replicated topology), then h2 h3"
start_host 1
wait_host 1
start_host 2
start_host 3
wait_host 2
wait_host 3

echo "== load for ${seconds}s: ${tables[*]}; fault '$fault' at $((seconds / 3))s"
start_load

sleep $((seconds / 3))
fault_ns=$(now)
case "$fault" in
none) recovery="-" ;;
kill-host)
  kill -KILL "${host_pid[2]}"
  recovery="takeover $(healed "$fault_ns")"
  start_host 2
  wait_host 2
  ;;
term-host)
  kill -TERM "${host_pid[2]}"
  recovery="handover $(healed "$fault_ns")"
  wait "${host_pid[2]}" || true
  start_host 2
  wait_host 2
  ;;
freeze-host)
  # A VM stall or a stopped process, past the member TTL (5 s): the others
  # take its units over; woken, it delivers nothing of what it held.
  kill -STOP "${host_pid[2]}"
  (sleep 8 && kill -CONT "${host_pid[2]}") &
  recovery="takeover $(healed "$fault_ns") (h2 frozen 8s)"
  ;;
kill-leader)
  n=$(leader 1)
  n=${n#n}
  kill -KILL "${node_pid[$n]}"
  recovery="$(healed "$fault_ns") (weir_in_0 leader n$n killed)"
  start_node "$n"
  wait_node "$n"
  ;;
rolling)
  recovery=""
  for n in 1 2 3; do
    step_ns=$(now)
    kill -TERM "${node_pid[$n]}"
    wait "${node_pid[$n]}" || true
    start_node "$n"
    wait_node "$n"
    recovery+="n$n $(healed "$step_ns") "
  done
  ;;
esac
echo "== fault '$fault' healed: $recovery"
while [ $(((($(now) - load_start) / 1000000000))) -lt "$seconds" ]; do sleep 0.5; done
stop_load
"$weir" status --url http://127.0.0.1:8091 --wait-drained 120 >/dev/null
check_rows "R3 $fault" "$recovery"
echo "logs and sink files: ${here#"$root"/}/run/"
[ "$lost" -eq 0 ] || { echo "LOST ROWS: see run/load/*.delivered against run/load/<table>" >&2; exit 1; }
