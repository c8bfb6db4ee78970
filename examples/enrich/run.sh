#!/usr/bin/env bash
# weir enrichment: builds weir and its plugins, starts the lookup service
# (lookup.py, port 8091), runs weir on its embedded nats-server, sends
# orders.ndjson and shows the enriched rows and the dead letter (a lookup
# that timed out). Stops everything at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
. .ci/setup

echo "== building weir and the plugins"
cargo build --locked -p weir
cargo build --locked --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
mkdir -p "$here/plugins"
cp plugins/target/wasm32-wasip2/release/weir_enrich.wasm \
   plugins/target/wasm32-wasip2/release/weir_ndjson_sink.wasm "$here/plugins/"
rm -rf "$here/data" "$here/out"

echo "== starting the lookup service (lookup.py, 127.0.0.1:8091)"
python3 "$here/lookup.py" 8091 &
lookup_pid=$!
weir="$root/target/debug/weir"
url="http://127.0.0.1:8092"
echo "== starting weir (embedded nats-server)"
WEIR_LOG=${WEIR_LOG:-info} "$weir" run --config "$here/weir.toml" &
weir_pid=$!
cleanup() {
  kill -TERM $weir_pid 2>/dev/null || true
  wait $weir_pid 2>/dev/null || true
  kill $lookup_pid 2>/dev/null || true
  wait $lookup_pid 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1 300); do
  "$weir" status --url "$url" >/dev/null 2>&1 && break
  kill -0 $weir_pid 2>/dev/null || { echo "weir exited early" >&2; exit 1; }
  sleep 0.1
done

echo "== sending examples/enrich/orders.ndjson (7 orders: one unknown customer, one whose lookup times out, one without a customer)"
"$weir" send --url "$url" --table orders --key acme-enrich-key "$here/orders.ndjson"
"$weir" status --url "$url" --wait-drained 60 >/dev/null

echo
echo "== the enriched rows (customer_info added; null for an unknown customer; a row without one unchanged)"
cat "$here/out/acme/orders.ndjson"
echo
echo "== the dead letter (its lookup timed out after 500 ms)"
"$weir" dlq list --config "$here/weir.toml" | head -n 5

echo "== stopping weir and the lookup service"
cleanup
trap - EXIT
echo "done"
