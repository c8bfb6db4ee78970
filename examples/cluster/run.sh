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
nats_server="${WEIR_NATS_SERVER:-nats-server}"

cd "$here"
rm -rf run
mkdir -p run/load
now() { date +%s%N; }
# Seconds since $1 (nanoseconds), two decimals.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2fs", (b - a) / 1e9 }'; }

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
  touch run/load/stop
  for pid in "${host_pid[@]}" "${node_pid[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Healthy: JetStream current on the node (and, in a cluster, a meta leader).
wait_node() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:823$1/healthz" >/dev/null && return 0
    sleep 0.1
  done
  echo "node n$1 not healthy" >&2
  exit 1
}
# A host is up once it answers `weir status` (its log: run/h<n>.log).
wait_host() { wait_ready "http://127.0.0.1:809$1" "${host_pid[$1]}" 600; }
# The node leading stream weir_in_0, from any node's monitor.
leader() {
  curl -s "http://127.0.0.1:823$1/jsz?streams=true" | python3 -c '
import json, sys
for account in json.load(sys.stdin).get("account_details", []):
    for stream in account.get("stream_detail", []):
        if stream["name"] == "weir_in_0":
            print(stream["cluster"]["leader"])'
}

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

# One producer per tenant/table: 5 rows every 100 ms, one request at a time,
# a refused request sent again (same ids) to the next front door.
# Writes "seq sent_ns" per accepted row to run/load/<tenant>.<table>.
produce() {
  local tenant=$1 table=$2 door=$3 seq=0 code sent body
  local log="run/load/$tenant.$table"
  : >"$log"
  while [ ! -e run/load/stop ]; do
    body="" sent=$(now)
    for s in $(seq $seq $((seq + 4))); do
      body+="{\"id\":$s,\"seq\":$s,\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}"$'\n'
    done
    while [ ! -e run/load/stop ]; do
      door=$((door % 3 + 1))
      # A front door silent for 2 s (a frozen host) is given up on, as a
      # load balancer would; the same ids sent elsewhere store nothing twice.
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
        -H "Authorization: Bearer $tenant-key" --data-binary "$body" \
        "http://127.0.0.1:809$door/v1/ingest/$table" || true)
      if [ "$code" = 202 ]; then
        for s in $(seq $seq $((seq + 4))); do echo "$s $sent"; done >>"$log"
        break
      fi
      echo "$code" >>run/load/refusals
      sleep 0.1
    done
    seq=$((seq + 5))
    sleep 0.1
  done
}
tables=(acme.orders acme.events globex.orders globex.events initech.orders initech.events)
echo "== load for ${seconds}s: ${tables[*]}; fault '$fault' at $((seconds / 3))s"
load_start=$(now)
door=0
for t in "${tables[@]}"; do
  produce "${t%.*}" "${t#*.}" $door &
  door=$((door + 1))
done

# Every sequence the hosts' sinks wrote for tenant.table, one per line, in
# each host's order (hosts one after another).
delivered() { cat run/h*/out/"${1%.*}"/"${1#*.}".ndjson 2>/dev/null | grep -o '"seq":[0-9]*' | cut -d: -f2; }
# Waits until every table delivered a row sent at or after $1 (ns); prints
# how long after $1 that was.
healed() {
  local fault_ns=$1 t first
  for t in "${tables[@]}"; do
    while :; do
      first=$(awk -v f="$fault_ns" '$2 >= f { print $1; exit }' "run/load/$t")
      if [ -n "$first" ] && delivered "$t" | awk -v s="$first" '$1 >= s { found = 1 } END { exit !found }'; then
        break
      fi
      sleep 0.1
    done
  done
  since "$fault_ns"
}

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
touch run/load/stop
wait_ns=$(now)
for pid in $(jobs -p); do
  case " ${host_pid[*]} ${node_pid[*]} " in *" $pid "*) ;; *) wait "$pid" || true ;; esac
done
ran=$(awk -v a="$load_start" -v b="$wait_ns" 'BEGIN { print (b - a) / 1e9 }')
"$weir" status --url http://127.0.0.1:8091 --wait-drained 120 >/dev/null

accepted=0 lost=0 duplicated=0 disorder=0
for t in "${tables[@]}"; do
  delivered "$t" >"run/load/$t.delivered"
  a=$(wc -l <"run/load/$t")
  l=$(awk 'NR == FNR { seen[$1] = 1; next } !($1 in seen)' "run/load/$t.delivered" "run/load/$t" | wc -l)
  d=$(awk 'seen[$1]++' "run/load/$t.delivered" | wc -l)
  # Out of order within one host's file: a first delivery below one before it.
  o=0
  for f in run/h*/out/"${t%.*}"/"${t#*.}".ndjson; do
    [ -e "$f" ] || continue
    o=$((o + $(grep -o '"seq":[0-9]*' "$f" | cut -d: -f2 | awk 'seen[$1]++ { next } $1 < max { n++ } $1 > max { max = $1 } END { print n + 0 }')))
  done
  accepted=$((accepted + a)) lost=$((lost + l)) duplicated=$((duplicated + d)) disorder=$((disorder + o))
done
refusals=$(sort run/load/refusals 2>/dev/null | uniq -c | awk '{ printf "%s×%s ", $2, $1 }')
echo
printf '%-24s | %8s | %4s | %10s | %16s | %7s | %s\n' scenario accepted lost duplicated "order violations" rows/s recovery
printf '%-24s | %8d | %4d | %10d | %16d | %7.0f | %s\n' "R3 $fault" "$accepted" "$lost" "$duplicated" "$disorder" \
  "$(awk -v a="$accepted" -v r="$ran" 'BEGIN { print a / r }')" "$recovery"
echo "refused requests (status×count, 000: no answer): ${refusals:-none}"
echo "logs and sink files: ${here#"$root"/}/run/"
[ "$lost" -eq 0 ] || { echo "LOST ROWS: see run/load/*.delivered against run/load/<table>" >&2; exit 1; }
