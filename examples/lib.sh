# shellcheck shell=bash
# What every example's run.sh does the same way, sourced after it set
# `here` (its own folder):
#
#   here="$(cd "$(dirname "$0")" && pwd)"
#   . "$here/../lib.sh"
#
# Sets `root` (the checkout) and `weir` (its debug binary), moves to the
# checkout and puts nats-server and friends on PATH (.ci/setup).
root="$(cd "$here/../.." && pwd)"
cd "$root"
. .ci/setup
weir="$root/target/debug/weir"

# build_example PLUGIN…: builds weir and the plugins, and copies each
# named plugin (`weir_PLUGIN.wasm`) into the example's plugins/.
build_example() {
  echo "== building weir and the plugins"
  cargo build --locked -p weir
  cargo build --locked --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
  mkdir -p "$here/plugins"
  local plugin
  for plugin in "$@"; do
    cp "plugins/target/wasm32-wasip2/release/weir_$plugin.wasm" "$here/plugins/"
  done
}

# wait_ready URL [PID] [TRIES]: until a weir answers `weir status` at URL,
# every 0.1 s (300 tries by default); fails at once if PID has exited.
wait_ready() {
  local url=$1 pid=${2:-} tries=${3:-300}
  for _ in $(seq 1 "$tries"); do
    "$weir" status --url "$url" >/dev/null 2>&1 && return 0
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      echo "weir exited early" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "weir did not answer at $url" >&2
  exit 1
}

# start_weir CONFIG URL: `weir run` on CONFIG in the background (its pid
# in `weir_pid`), on its embedded nats-server, ready when this returns.
start_weir() {
  echo "== starting weir (embedded nats-server)"
  WEIR_LOG=${WEIR_LOG:-info} "$weir" run --config "$1" &
  weir_pid=$!
  wait_ready "$2" "$weir_pid"
}

# stop_weir: SIGTERM to the weir start_weir started, and waits for it
# (nothing if none was started).
stop_weir() {
  [ -n "${weir_pid:-}" ] || return 0
  kill -TERM "$weir_pid" 2>/dev/null || true
  wait "$weir_pid" 2>/dev/null || true
}
