#!/bin/sh
# Runs the plugin natively on rows.ndjson and compares with expected.ndjson.
set -e
cd "$(dirname "$0")"
cargo test "$@"
