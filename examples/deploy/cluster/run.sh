#!/usr/bin/env bash
# weir in containers on a 3-node NATS cluster, one of each killed under load.
#
#   examples/deploy/cluster/run.sh [SECONDS]     # how long the load runs (default 60)
#
# Builds the image (examples/deploy/image.sh), starts compose.yaml's three
# NATS containers (JetStream cluster, R3 streams) and three weir
# containers, posts examples/cluster's load (three tenants × two tables,
# ids and per-table sequences, a refused request sent again to the next
# door) to the three front doors, SIGKILLs the weir container that
# delivered the most rows at a third of the load and the NATS container
# leading stream weir_in_0 at two thirds, starting each again (`compose
# start`) once the others took over, then waits until every row is settled
# and checks that the sinks wrote every accepted row exactly once. Always
# takes the project down at the end (container logs stay in run/).
#
#   WEIR_DEPLOY_BIN=/path/to/weir  put that weir in the image (default: a release build)
#   WEIR_COMPOSE="docker compose"  the compose command (default: `docker compose`
#                                  with docker, else podman-compose, from PyPI when missing)
# Exits 77, saying why, when no container engine works here.
set -euo pipefail
seconds="${1:-60}"
case "$seconds" in '' | *[!0-9]*) echo "SECONDS must be a number, not '$seconds'" >&2; exit 2 ;; esac
[ "$seconds" -ge 30 ] || { echo "SECONDS must be at least 30 (two faults and their recoveries)" >&2; exit 2; }
cluster="$(cd "$(dirname "$0")" && pwd)"
# lib.sh finds the checkout from an example's folder (examples/deploy).
here="$(cd "$cluster/.." && pwd)"
. "$here/../lib.sh"
. "$here/image.sh"
here=$cluster
. "$root/examples/cluster/load.sh"

container_engine || exit 77
echo "== container engine: $engine_name (${engine[*]})"
tag=${WEIR_IMAGE:-$weir_image_default}
export WEIR_IMAGE=$tag
# The open-files limit every container gets: the engine may not grant more
# than this shell's hard limit.
nofile=$(ulimit -Hn)
if [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; then nofile=65536; fi
export WEIR_NOFILE=$nofile

# The compose command, for this engine.
if [ -n "${WEIR_COMPOSE:-}" ]; then
  read -ra compose <<<"$WEIR_COMPOSE"
elif [ "$engine_name" = docker ]; then
  docker compose version >/dev/null 2>&1 || {
    echo "docker answers but has no \`docker compose\` (install the compose plugin, or set WEIR_COMPOSE)" >&2
    exit 77
  }
  compose=(docker compose --ansi never)
else
  if ! command -v podman-compose >/dev/null 2>&1; then
    echo "== installing podman-compose (pip install podman-compose)"
    python3 -m pip install --quiet --disable-pip-version-check podman-compose >&2
    command -v pyenv >/dev/null 2>&1 && pyenv rehash 2>/dev/null
    PATH="$(weir_python_scripts):$PATH"
  fi
  # The engine's own flags (runtime, cgroup manager) on every podman call;
  # no pod: the containers share only the project's network.
  compose=(podman-compose --no-ansi --in-pod false)
  [ "${#engine[@]}" -le 1 ] || compose+=(--podman-args "${engine[*]:1}")
fi
compose+=(-p weir-cluster -f "$here/compose.yaml")
echo "== compose: ${compose[*]}"

build_image "$tag"
user=$("${engine[@]}" image inspect --format '{{.Config.User}}' "$tag")
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || {
  echo "the image runs as '${user:-root}', not as a non-root user" >&2
  exit 1
}

cd "$here"
# Rootless podman maps the image's uid into its own user namespace.
as_engine_root=()
if [ "$engine_name" = podman ] && [ "$(id -u)" != 0 ]; then as_engine_root=(podman unshare); fi
# Whatever a previous run left (its project, then its files).
"${compose[@]}" down -v >/dev/null 2>&1 || true
[ ! -e run ] || "${as_engine_root[@]}" rm -rf run
# The bind mounts: NATS stores, weir data dirs, the sinks' shared folder.
mkdir -p run/n1 run/n2 run/n3 run/h1 run/h2 run/h3 run/out run/load
"${as_engine_root[@]}" chown -R "$user" run/n1 run/n2 run/n3 run/h1 run/h2 run/h3 run/out

doors=(http://127.0.0.1:18091 http://127.0.0.1:18092 http://127.0.0.1:18093)
load_dir=run/load
sink_files() { printf '%s\n' run/out/"${1%.*}"/"${1#*.}".ndjson; }

# A service's container log (both compose tools label the containers so).
service_log() {
  local id
  id=$("${engine[@]}" ps -aq --filter label=com.docker.compose.project=weir-cluster \
    --filter "label=com.docker.compose.service=$1" | head -n 1)
  [ -z "$id" ] || "${engine[@]}" logs "$id" 2>&1
}
cleanup() {
  local code=$? s
  trap - EXIT
  touch "$load_dir/stop"
  for pid in "${load_pids[@]:-}"; do [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; done
  echo "== taking the project down (logs in ${here#"$root"/}/run/<service>.log)"
  for s in n1 n2 n3 h1 h2 h3; do service_log "$s" >"run/$s.log" 2>&1 || true; done
  "${compose[@]}" down -v -t 10 >run/down.log 2>&1 || { cat run/down.log >&2; code=1; }
  exit "$code"
}
trap cleanup EXIT
trap "exit 130" INT TERM

# Healthy: JetStream current on the node (and a meta leader), from its
# monitor port, published on 127.0.0.1:1822N.
wait_node() {
  node_healthy "http://127.0.0.1:1822$1" && return 0
  echo "NATS node n$1 not healthy; its log:" >&2
  service_log "n$1" | tail -n 20 >&2
  exit 1
}
# A host is up once `weir status` answers at its front door.
wait_host() {
  for _ in $(seq 1 600); do
    "${compose[@]}" exec -T "h$1" weir status --url http://127.0.0.1:8080 --brief >/dev/null 2>&1 \
      && return 0
    sleep 0.2
  done
  echo "weir h$1 does not answer; its log:" >&2
  service_log "h$1" | tail -n 20 >&2
  exit 1
}
# The node leading stream weir_in_0 (n1, n2 or n3), from node $1's monitor.
leader() { stream_leader "http://127.0.0.1:1822$1"; }
# The host that delivered the most rows so far: it owns units with tables
# (a host whose units carry none would show no takeover).
busiest() {
  local n best=1 most=-1 rows
  for n in 1 2 3; do
    rows=$(curl -s "${doors[$((n - 1))]}/v1/status" \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["rows"]["delivered"])' 2>/dev/null) || rows=-1
    if [ "$rows" -gt "$most" ]; then most=$rows best=$n; fi
  done
  echo "$best"
}
up() { "${compose[@]}" up -d --no-deps "$@" >>run/up.log 2>&1 || { cat run/up.log >&2; exit 1; }; }

echo "== starting NATS n1 n2 n3 (monitors on 127.0.0.1:18221-18223)"
up n1 n2 n3
for n in 1 2 3; do wait_node $n; done
echo "== starting weir h1 (creates the replicated topology), then h2 h3 (front doors on 127.0.0.1:18091-18093)"
up h1
wait_host 1
up h2 h3
wait_host 2
wait_host 3
echo "== inside h1: $("${compose[@]}" exec -T h1 id), root filesystem read-only: $("${compose[@]}" exec -T h1 sh -c 'touch /x 2>/dev/null && echo no || echo yes')"

echo "== load for ${seconds}s: ${tables[*]}; SIGKILL a weir host at $((seconds / 3))s, the weir_in_0 leader's NATS at $((2 * seconds / 3))s"
start_load

sleep $((seconds / 3))
fault_ns=$(now)
h=$(busiest)
"${compose[@]}" kill -s KILL "h$h" >/dev/null
echo "== killed weir h$h (SIGKILL), the host that had delivered the most rows"
recovery="h$h killed: takeover $(healed "$fault_ns")"
"${compose[@]}" start "h$h" >/dev/null
wait_host "$h"
echo "== h$h started again: $recovery"

while [ $((($(now) - load_start) / 1000000000)) -lt $((2 * seconds / 3)) ]; do sleep 0.5; done
n=$(leader 1)
n=${n#n}
[ -n "$n" ] || n=$(leader 3)
n=${n#n}
case "$n" in 1 | 2 | 3) ;; *) echo "no leader of weir_in_0 found" >&2; exit 1 ;; esac
fault_ns=$(now)
"${compose[@]}" kill -s KILL "n$n" >/dev/null
echo "== killed NATS n$n (SIGKILL), the leader of weir_in_0"
healed_node=$(healed "$fault_ns")
recovery+=", n$n killed: $healed_node"
"${compose[@]}" start "n$n" >/dev/null
wait_node "$n"
echo "== n$n started again: every table delivering $healed_node after its kill"

while [ $((($(now) - load_start) / 1000000000)) -lt "$seconds" ]; do sleep 0.5; done
stop_load
echo "== load done; waiting until every row is settled"
"${compose[@]}" exec -T h1 weir status --url http://127.0.0.1:8080 --wait-drained 120 >/dev/null
summary=$("${compose[@]}" exec -T h1 weir status --url http://127.0.0.1:8080 --brief)
# The replays the sinks dropped (rows delivered again after the kills).
replays=0
for door in "${doors[@]}"; do
  r=$(curl -sf "$door/metrics" | awk '/^weir_/ { up = 1 } /^weir_plugin_counter_total\{/ && /name="rows_skipped_replayed"/ { n += $NF } END { if (up) print n + 0 }') || true
  if [ -z "$r" ]; then replays="?"; break; fi
  replays=$((replays + r))
done

check_rows "R3 containers" "$recovery"
echo "weir: $summary"
echo "sink: $distinct distinct rows in run/out; $replays redelivered rows dropped as replays (since each host's last start)"
[ "$lost" -eq 0 ] || { echo "LOST ROWS: see run/load/*.delivered against run/load/<table>" >&2; exit 1; }
[ "$duplicated" -eq 0 ] || { echo "ROWS WRITTEN TWICE: see run/load/*.delivered" >&2; exit 1; }
echo "every accepted row written exactly once ($accepted rows, $engine_name)"
