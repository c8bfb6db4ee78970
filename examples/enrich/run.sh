#!/usr/bin/env bash
# weir enrichment: builds weir and its plugins, starts the lookup service
# (lookup.py, port 8091), runs weir on its embedded nats-server, sends
# orders.ndjson and shows the enriched rows and the dead letter (a lookup
# that timed out). Stops everything at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib.sh"

build_example enrich ndjson_sink
rm -rf "$here/data" "$here/out"

echo "== starting the lookup service (lookup.py, 127.0.0.1:8091)"
python3 "$here/lookup.py" 8091 &
lookup_pid=$!
url="http://127.0.0.1:8092"
cleanup() {
  stop_weir
  kill $lookup_pid 2>/dev/null || true
  wait $lookup_pid 2>/dev/null || true
}
trap cleanup EXIT
start_weir "$here/weir.toml" "$url"

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
