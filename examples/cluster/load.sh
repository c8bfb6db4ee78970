# shellcheck shell=bash
# The load and the check that examples/cluster/run.sh and
# examples/deploy/cluster/run.sh share. Sourced; the caller sets first:
#
#   doors          the front doors' base URLs (an array), e.g.
#                  (http://127.0.0.1:8091 http://127.0.0.1:8092 …)
#   load_dir       where the load keeps its records (e.g. run/load; emptied
#                  by the caller)
#   sink_files T   a function printing the sink files that may hold the rows
#                  of table T (`tenant.table`), one per line
#
# and then calls:
#
#   start_load     one producer per table (`tables`) in the background,
#                  each table starting at the next door; sets `load_start`
#   stop_load      stops the producers, waits for them; sets `ran` (seconds)
#   healed NS      waits until every table delivered a row sent at or after
#                  NS (nanoseconds); prints how long after NS that was
#   check_rows LABEL RECOVERY
#                  compares every accepted row with the sinks' files and
#                  prints the summary line; sets `accepted`, `lost`,
#                  `duplicated`, `disorder` and `distinct`
#   node_healthy MONITOR
#                  waits up to 60 s for the nats-server monitor at MONITOR
#                  to answer /healthz (JetStream current, a meta leader)
#   stream_leader MONITOR
#                  prints the node leading stream weir_in_0, from the
#                  nats-server monitor at MONITOR (`/jsz`)
#
# Every row carries an id (its message id with `idempotency_field = "id"`)
# and a per-table sequence. A refused request is sent again with the same
# rows to the next front door, so a retry stores nothing twice.

tables=(acme.orders acme.events globex.orders globex.events initech.orders initech.events)

now() { date +%s%N; }
# Seconds since $1 (nanoseconds), two decimals.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2fs", (b - a) / 1e9 }'; }

# One producer per tenant/table: 5 rows every 100 ms, one request at a time,
# a refused request sent again (same ids) to the next front door.
# Writes "seq sent_ns" per accepted row to $load_dir/<tenant>.<table>.
produce() {
  local tenant=$1 table=$2 door=$3 seq=0 code sent body
  local log="$load_dir/$tenant.$table"
  : >"$log"
  while [ ! -e "$load_dir/stop" ]; do
    body="" sent=$(now)
    for s in $(seq $seq $((seq + 4))); do
      body+="{\"id\":$s,\"seq\":$s,\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}"$'\n'
    done
    while [ ! -e "$load_dir/stop" ]; do
      door=$((door % ${#doors[@]} + 1))
      # A front door silent for 2 s (a frozen host) is given up on, as a
      # load balancer would; the same ids sent elsewhere store nothing twice.
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
        -H "Authorization: Bearer $tenant-key" --data-binary "$body" \
        "${doors[$((door - 1))]}/v1/ingest/$table" || true)
      if [ "$code" = 202 ]; then
        for s in $(seq $seq $((seq + 4))); do echo "$s $sent"; done >>"$log"
        break
      fi
      echo "$code" >>"$load_dir/refusals"
      sleep 0.1
    done
    seq=$((seq + 5))
    sleep 0.1
  done
}

start_load() {
  local t door=0
  load_pids=()
  load_start=$(now)
  for t in "${tables[@]}"; do
    produce "${t%.*}" "${t#*.}" $door &
    load_pids+=($!)
    door=$((door + 1))
  done
}

stop_load() {
  local wait_ns pid
  touch "$load_dir/stop"
  wait_ns=$(now)
  for pid in "${load_pids[@]}"; do wait "$pid" || true; done
  ran=$(awk -v a="$load_start" -v b="$wait_ns" 'BEGIN { print (b - a) / 1e9 }')
}

# Every sequence the sinks wrote for tenant.table, one per line, in each
# file's order (files one after another).
delivered() {
  local f
  sink_files "$1" | while read -r f; do
    if [ -e "$f" ]; then cat "$f"; fi
  done | grep -o '"seq":[0-9]*' | cut -d: -f2
}

healed() {
  local fault_ns=$1 t first
  for t in "${tables[@]}"; do
    while :; do
      first=$(awk -v f="$fault_ns" '$2 >= f { print $1; exit }' "$load_dir/$t")
      if [ -n "$first" ] && delivered "$t" | awk -v s="$first" '$1 >= s { found = 1 } END { exit !found }'; then
        break
      fi
      sleep 0.1
    done
  done
  since "$fault_ns"
}

# lost: accepted rows no sink wrote; duplicated: rows written more than
# once; order violations: within one file, a row first written after a
# later row of its table (the files carry no time, so files are not
# compared with each other); distinct: rows written at least once.
check_rows() {
  local label=$1 recovery=$2 t a l d o u f refusals
  accepted=0 lost=0 duplicated=0 disorder=0 distinct=0
  for t in "${tables[@]}"; do
    delivered "$t" >"$load_dir/$t.delivered" || true
    a=$(wc -l <"$load_dir/$t")
    l=$(awk 'NR == FNR { seen[$1] = 1; next } !($1 in seen)' "$load_dir/$t.delivered" "$load_dir/$t" | wc -l)
    d=$(awk 'seen[$1]++' "$load_dir/$t.delivered" | wc -l)
    u=$(sort -u "$load_dir/$t.delivered" | wc -l)
    # Out of order within one file: a first delivery below one before it.
    o=0
    while read -r f; do
      [ -e "$f" ] || continue
      o=$((o + $(grep -o '"seq":[0-9]*' "$f" | cut -d: -f2 | awk 'seen[$1]++ { next } $1 < max { n++ } $1 > max { max = $1 } END { print n + 0 }')))
    done < <(sink_files "$t")
    accepted=$((accepted + a)) lost=$((lost + l)) duplicated=$((duplicated + d)) disorder=$((disorder + o)) distinct=$((distinct + u))
  done
  refusals=$(sort "$load_dir/refusals" 2>/dev/null | uniq -c | awk '{ printf "%s×%s ", $2, $1 }')
  echo
  printf '%-24s | %8s | %4s | %10s | %16s | %7s | %s\n' scenario accepted lost duplicated "order violations" rows/s recovery
  printf '%-24s | %8d | %4d | %10d | %16d | %7.0f | %s\n' "$label" "$accepted" "$lost" "$duplicated" "$disorder" \
    "$(awk -v a="$accepted" -v r="$ran" 'BEGIN { print a / r }')" "$recovery"
  echo "refused requests (status×count, 000: no answer): ${refusals:-none}"
}

node_healthy() {
  local _
  for _ in $(seq 1 600); do
    curl -sf "$1/healthz" >/dev/null && return 0
    sleep 0.1
  done
  return 1
}

stream_leader() {
  curl -s "$1/jsz?streams=true" | python3 -c '
import json, sys
for account in json.load(sys.stdin).get("account_details", []):
    for stream in account.get("stream_detail", []):
        if stream["name"] == "weir_in_0":
            print(stream["cluster"]["leader"])'
}
