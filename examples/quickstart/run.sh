#!/usr/bin/env bash
# README's first command: builds weir and its plugins, runs weir on its
# embedded default (a local nats-server it starts and stops itself), sends
# the sample rows and shows where they went.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib.sh"

build_example validator ndjson_sink
rm -rf "$here/data" "$here/out"

url="http://127.0.0.1:8089"
trap stop_weir EXIT
start_weir "$here/weir.toml" "$url"

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
took
