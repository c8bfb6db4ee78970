#!/usr/bin/env bash
# The container image, built and run: builds examples/deploy/Containerfile
# with podman or docker (image.sh), runs it as its non-root user on a
# read-only root filesystem with this folder's weir.toml mounted read-only,
# sends the quickstart's rows from outside the container, shows what the
# sink wrote, and stops it with SIGTERM within its drain timeout.
#   WEIR_DEPLOY_BIN=/path/to/weir   put that weir in the image (default: a release build)
#   WEIR_DEPLOY_PORT=8088           the host's loopback port
# Exits 77, saying why, when no container engine works here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/image.sh"
container_engine || exit 77
. "$here/../lib.sh"
echo "== container engine: $engine_name (${engine[*]})"

tag=${WEIR_DEPLOY_TAG:-$weir_image_default}
port=${WEIR_DEPLOY_PORT:-8088}
url="http://127.0.0.1:$port"
rows_sent=$(grep -c . examples/quickstart/orders.ndjson)
rows_expected=36 # 4 of the 40 lack a required field: dead-lettered
drain=$(sed -nE 's/^drain_timeout = "([0-9]+)s".*/\1/p' "$here/weir.toml")
stop_time=$((drain + 15))

build_image "$tag"
# `send` and `status` from outside with the weir the image holds.
weir=$image_weir

user=$("${engine[@]}" image inspect --format '{{.Config.User}}' "$tag")
uid=${user%%:*}
[ -n "$uid" ] && [ "$uid" != 0 ] && [ "$uid" != root ] || {
  echo "the image runs as '${user:-root}', not as a non-root user" >&2
  exit 1
}

name="weir-deploy-$$"
work=$(mktemp -d)
# The container's writable places, owned by its uid (as the engine maps it).
mkdir -p "$work/data" "$work/out"
as_engine_root=()
if [ "$engine_name" = podman ] && [ "$(id -u)" != 0 ]; then as_engine_root=(podman unshare); fi
"${as_engine_root[@]}" chown -R "$user" "$work/data" "$work/out"
cleanup() {
  "${engine[@]}" kill "$name" >/dev/null 2>&1 || true
  "${engine[@]}" rm -f "$name" >/dev/null 2>&1 || true
  "${as_engine_root[@]}" rm -rf "$work" || true
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# The whole root filesystem read-only: podman would mount a writable /tmp,
# /run and /var/tmp without the second flag; weir needs none of them.
read_only=(--read-only)
if [ "$engine_name" = podman ]; then read_only+=(--read-only-tmpfs=false); fi
run_container() {
  "${engine[@]}" run -d --name "$name" \
    "${read_only[@]}" --user "$user" "${run_limits[@]}" \
    -e WEIR_LOG=info \
    -v "$here/weir.toml:/etc/weir/weir.toml:ro" \
    -v "$work/data:/var/lib/weir" \
    -v "$work/out:/srv/weir/out" \
    "$@"
}

# ready: until weir answers at $url, or the container has exited.
ready() {
  local _
  for _ in $(seq 1 600); do
    "$weir" status --url "$url" >/dev/null 2>&1 && return 0
    [ "$("${engine[@]}" inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" = true ] || return 1
    sleep 0.2
  done
  return 1
}

echo "== running $tag as $name: --read-only, --user $user, config mounted read-only, port 127.0.0.1:$port"
network="published 127.0.0.1:$port -> 8080"
started=$SECONDS
if ! { run_container -p "127.0.0.1:$port:8080" "$tag" >/dev/null && ready; }; then
  echo "== the container's own network did not answer on $url; its log:" >&2
  "${engine[@]}" logs "$name" 2>&1 | tail -n 20 >&2 || true
  echo "== trying host networking instead (weir listening on 127.0.0.1:$port)" >&2
  "${engine[@]}" kill "$name" >/dev/null 2>&1 || true
  "${engine[@]}" rm -f "$name" >/dev/null 2>&1 || true
  network="host networking, 127.0.0.1:$port"
  run_container --network host "$tag" run --config /etc/weir/weir.toml --listen "127.0.0.1:$port" >/dev/null
  ready || {
    "${engine[@]}" logs "$name" 2>&1 | tail -n 30 >&2
    echo "weir in the container did not answer at $url" >&2
    exit 1
  }
fi
echo "== weir answers at $url ($network), $((SECONDS - started)) s after the start"

echo "== inside the container"
echo "id: $("${engine[@]}" exec "$name" id)"
proc_uid=$("${engine[@]}" exec "$name" sh -c 'awk "/^Uid:/ {print \$2}" /proc/1/status')
echo "pid 1: $("${engine[@]}" exec "$name" cat /proc/1/cmdline | tr '\0' ' ')(uid $proc_uid)"
[ "$proc_uid" != 0 ] || {
  echo "weir runs as root in the container" >&2
  exit 1
}
if err=$("${engine[@]}" exec "$name" touch /x 2>&1); then
  echo "the root filesystem is writable: touch /x succeeded" >&2
  exit 1
fi
echo "touch /x: ${err##*touch: }"

echo "== sending examples/quickstart/orders.ndjson ($rows_sent rows) from the host"
"$weir" send --url "$url" --table orders --key acme-deploy-key examples/quickstart/orders.ndjson
"$weir" status --url "$url" --wait-drained 60 >/dev/null

out="$work/out/acme/orders.ndjson"
rows=$(wc -l <"$out" 2>/dev/null || echo 0)
echo
echo "== the sink in the container wrote $rows rows to its out mount (email and card masked):"
cat "$out" 2>/dev/null || true
summary=$("$weir" status --url "$url" --brief)
echo "== summary: $summary"
[ "$rows" -eq "$rows_expected" ] || {
  echo "expected $rows_expected rows in $out, found $rows" >&2
  exit 1
}
case "$summary" in
  "accepted $rows_sent, delivered $rows_expected, dead-lettered $((rows_sent - rows_expected)), backlog 0;"*) ;;
  *)
    echo "unexpected summary: $summary" >&2
    exit 1
    ;;
esac

echo
echo "== stopping it: SIGTERM, killed after ${stop_time} s (drain_timeout ${drain} s + 15)"
start=$(date +%s%N)
"${engine[@]}" stop --time "$stop_time" "$name" >/dev/null
stopped_ms=$((($(date +%s%N) - start) / 1000000))
code=$("${engine[@]}" inspect --format '{{.State.ExitCode}}' "$name")
log=$("${engine[@]}" logs "$name" 2>&1)
echo "$log" | grep -E "shutting down|stopped" || true
[ "$code" = 0 ] || {
  echo "$log" | tail -n 30 >&2
  echo "the container exited with $code, not 0" >&2
  exit 1
}
[ "$stopped_ms" -lt $((drain * 1000)) ] || {
  echo "the stop took ${stopped_ms} ms, longer than drain_timeout (${drain} s)" >&2
  exit 1
}
grep -q "weir stopped" <<<"$log" || {
  echo "$log" | tail -n 30 >&2
  echo "the log does not say weir stopped" >&2
  exit 1
}
echo
echo "done: $engine_name ran $tag (uid $proc_uid, read-only root) and delivered $rows of $rows_sent rows ($((rows_sent - rows)) dead-lettered); SIGTERM stopped it cleanly in $((stopped_ms / 1000)).$(printf %03d $((stopped_ms % 1000))) s (exit 0, limit ${stop_time} s); image $(human "$image_size")"
