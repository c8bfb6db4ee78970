# shellcheck shell=bash
# What every example's run.sh does the same way, sourced after it set
# `here` (its own folder):
#
#   here="$(cd "$(dirname "$0")" && pwd)"
#   . "$here/../lib.sh"
#
# Sets `root` (the checkout) and `weir` (its debug binary), moves to the
# checkout, and installs what every example needs when it is missing: the
# wasm32-wasip2 target and nats-server (.ci/need.sh). An example that needs
# more asks for it (`need_postgresql`); the tests' tools are .ci/setup's.
root="$(cd "$here/../.." && pwd)"
cd "$root"
. .ci/need.sh
need_wasm_targets
need_nats_server
# Seconds spent installing, then building (`took` prints the split).
weir_installed_at=$SECONDS
weir_built_at=$SECONDS
weir="$root/target/debug/weir"

# build_example PLUGIN…: builds weir and the named plugins only (package
# `weir-PLUGIN`, file `weir_PLUGIN.wasm`), and copies each into the
# example's plugins/.
build_example() {
  echo "== building weir and the plugins ($*)"
  local plugin packages=()
  for plugin in "$@"; do packages+=(-p "weir-${plugin//_/-}"); done
  # Side by side: the plugins fill the cores while weir's build runs on one.
  cargo build --locked --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml "${packages[@]}" &
  local plugins_build=$!
  cargo build --locked -p weir --bin weir || { wait "$plugins_build"; return 1; }
  wait "$plugins_build" || { echo "the plugins did not build" >&2; return 1; }
  weir_built_at=$SECONDS
  mkdir -p "$here/plugins"
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

# took: how long the example took, and where the time went.
took() {
  echo "took $SECONDS s: installs $weir_installed_at s, build $((weir_built_at - weir_installed_at)) s, run $((SECONDS - weir_built_at)) s"
}
