#!/usr/bin/env bash
# weir into a lake: builds weir and its plugins, starts a SeaweedFS of its
# own (S3 on 127.0.0.1:18333, a temp dir), runs weir on its embedded
# nats-server with the validator and the lake sink writing Parquet, sends
# the quickstart's orders, and reads them back with DuckDB: count and
# count of distinct order ids equal the rows accepted less the dead
# letters. Stops everything at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib.sh"

need_seaweedfs
need_duckdb
build_example validator lake_sink
rm -rf "$here/data"

weed="${WEIR_WEED:-weed}"
s3_dir="$(mktemp -d /tmp/weir-example-s3.XXXXXX)"
mkdir "$s3_dir/data"
key=$(sed -n 's/^access_key_id = "\(.*\)"/\1/p' "$here/lake-keys.toml")
secret=$(sed -n 's/^secret_access_key = "\(.*\)"/\1/p' "$here/lake-keys.toml")
cat > "$s3_dir/identities.json" <<JSON
{"identities":[{"name":"admin","credentials":[{"accessKey":"$key","secretKey":"$secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
echo "== starting SeaweedFS in $s3_dir (S3 on 127.0.0.1:18333, bucket lake)"
# Every port of `weed mini` on loopback, in 183xx: none clashes with weir's.
"$weed" mini -dir="$s3_dir/data" -s3.config="$s3_dir/identities.json" \
  -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false -admin.ui=false -webdav=false \
  -s3.port.lance=0 -s3.autoCreateBucket=false -bucket=lake \
  -master.port=18320 -master.port.grpc=18321 -volume.port=18322 -volume.port.grpc=18323 \
  -filer.port=18324 -filer.port.grpc=18325 -s3.port=18333 -s3.port.grpc=18334 \
  -s3.port.iceberg=18335 -admin.port=18336 -admin.port.grpc=18337 -debug.port=18338 \
  -metricsPort=18339 >"$s3_dir/weed.log" 2>&1 &
weed_pid=$!

url="http://127.0.0.1:8091"
cleanup() {
  stop_weir
  kill "$weed_pid" 2>/dev/null || true
  wait "$weed_pid" 2>/dev/null || true
  rm -rf "$s3_dir"
}
trap cleanup EXIT
# `weir check` lists the bucket once: ready when the store answers.
for try in $(seq 1 120); do
  "$weir" check --config "$here/weir.toml" >/dev/null 2>&1 && break
  [ "$try" = 120 ] && { "$weir" check --config "$here/weir.toml"; tail -n 20 "$s3_dir/weed.log"; exit 1; }
  sleep 0.5
done
start_weir "$here/weir.toml" "$url"

rows="examples/quickstart/orders.ndjson"
echo "== sending $rows ($(wc -l <"$rows") lines)"
"$weir" send --url "$url" --table orders --key acme-lake-key "$rows"
"$weir" status --url "$url" --wait-drained 60 >/dev/null

echo
echo "== the objects (one per tenant, table and day; the log under _weir/)"
query() { python3 "$here/read.py" 127.0.0.1:18333 "$key" "$secret" "$1"; }
query "SELECT string_agg(file, chr(10)) FROM glob('s3://lake/rows/**/*.parquet')" | tr '\t' '\n'
echo
echo "== read back by DuckDB (read_parquet, hive partitions)"
read -r count distinct tenant table <<<"$(query "SELECT count(*), count(DISTINCT order_id), min(tenant), min(\"table\") FROM read_parquet('s3://lake/rows/**/*.parquet', hive_partitioning = true)")"
sent=$(wc -l <"$rows")
dead=$("$weir" dlq list --config "$here/weir.toml" | grep -c '^' || true)
echo "rows sent and accepted: $sent; dead letters: $dead (weir dlq list says why)"
echo "DuckDB: count = $count, count of distinct order ids = $distinct (tenant $tenant, table $table)"
expected=$((sent - dead))
if [ "$count" != "$expected" ] || [ "$distinct" != "$expected" ]; then
  echo "FAILED: expected $expected rows, each once" >&2
  exit 1
fi
echo "every accepted row is in the lake exactly once ($expected = $sent - $dead)"
echo

echo "== stopping weir and SeaweedFS"
cleanup
trap - EXIT
echo "done"
