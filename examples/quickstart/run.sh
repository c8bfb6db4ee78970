#!/usr/bin/env bash
# README's first command: builds weir and its plugins, runs weir on its
# embedded default (a local nats-server it starts and stops itself), sends
# the sample rows and shows where they went.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
. .ci/setup

echo "== building weir and the plugins"
cargo build --locked -p weir
cargo build --locked --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
mkdir -p "$here/plugins"
cp plugins/target/wasm32-wasip2/release/weir_validator.wasm \
   plugins/target/wasm32-wasip2/release/weir_ndjson_sink.wasm "$here/plugins/"
rm -rf "$here/data" "$here/out"

weir="$root/target/debug/weir"
url="http://127.0.0.1:8089"
echo "== starting weir (embedded nats-server)"
WEIR_LOG=${WEIR_LOG:-info} "$weir" run --config "$here/weir.toml" &
weir_pid=$!
trap 'kill -TERM $weir_pid 2>/dev/null || true; wait $weir_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  "$weir" status --url "$url" >/dev/null 2>&1 && break
  kill -0 $weir_pid 2>/dev/null || { echo "weir exited early" >&2; exit 1; }
  sleep 0.1
done

echo "== sending examples/quickstart/orders.ndjson"
"$weir" send --url "$url" --table orders --key acme-quickstart-key "$here/orders.ndjson"
"$weir" status --url "$url" --wait-drained 60 >/dev/null

out="$here/out/acme/orders.ndjson"
echo
echo "== the sink wrote $(wc -l <"$out") rows to ${out#"$root"/} (email and card masked); first three:"
head -n 3 "$out"
echo
echo "== summary"
"$weir" status --url "$url" --brief
echo
echo "== status (as the admin sees it)"
"$weir" status --url "$url" --key quickstart-admin-key-change-me
echo
echo "== stopping weir"
kill -TERM $weir_pid
wait $weir_pid
trap - EXIT
echo "done: weir and its nats-server stopped cleanly"
