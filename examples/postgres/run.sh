#!/usr/bin/env bash
# weir into PostgreSQL: builds weir and its plugins, starts a PostgreSQL of
# its own (Debian's initdb/pg_ctl, port 55432, a temp dir) with schema.sql,
# runs weir on its embedded nats-server, sends orders.ndjson and shows the
# table, the dead letter and weir's ledger. Stops everything at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib.sh"

need_postgresql
build_example validator postgres_sink
rm -rf "$here/data"

pg_bin="${WEIR_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
[ -x "$pg_bin/initdb" ] || { echo "no PostgreSQL (initdb) found: install Debian's postgresql or set WEIR_PG_BIN" >&2; exit 1; }
pg_dir="$(mktemp -d /tmp/weir-example-pg.XXXXXX)"
# PostgreSQL refuses to run as root: as root, run it as the `postgres` account.
as_pg=()
if [ "$(id -u)" = 0 ]; then chown postgres "$pg_dir"; as_pg=(runuser -u postgres --); fi
echo "== starting PostgreSQL in $pg_dir (port 55432)"
"${as_pg[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -A trust -U weir -E UTF8 --no-sync >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" start -w -D "$pg_dir/data" -l "$pg_dir/log" \
  -o "-p 55432 -k $pg_dir -c listen_addresses=127.0.0.1" >/dev/null
psql=(psql -h 127.0.0.1 -p 55432 -U weir -X -q)
"${psql[@]}" -d postgres -c "CREATE DATABASE weir" >/dev/null
"${psql[@]}" -d weir -f "$here/schema.sql" >/dev/null

url="http://127.0.0.1:8090"
cleanup() {
  stop_weir
  "${as_pg[@]}" "$pg_bin/pg_ctl" stop -w -m fast -D "$pg_dir/data" >/dev/null 2>&1 || true
  rm -rf "$pg_dir"
}
trap cleanup EXIT
start_weir "$here/weir.toml" "$url"

echo "== sending examples/postgres/orders.ndjson (6 lines: one a repeat, one with a negative amount)"
"$weir" send --url "$url" --table orders --key acme-postgres-key "$here/orders.ndjson"
"$weir" status --url "$url" --wait-drained 60 >/dev/null

echo
echo "== table orders (email masked by the validator; the repeat stored once)"
"${psql[@]}" -d weir -c "SELECT tenant, order_id, customer, email, amount FROM orders ORDER BY order_id"
echo "== the dead letter (the database's CHECK refused it)"
"$weir" dlq list --config "$here/weir.toml" | head -n 5
echo
echo "== weir's ledger: what each commit applied, under which claim"
"${psql[@]}" -d weir -c "SELECT sink, unit, claim, array_length(seqs, 1) AS rows FROM weir_applied"

echo "== stopping weir and PostgreSQL"
cleanup
trap - EXIT
echo "done"
