#!/bin/sh
# Runs plugin.js in Node on rows.ndjson and compares each row's outcome with
# expected.ndjson (no wasm, no weir).
set -e
cd "$(dirname "$0")"
node weir/test.mjs plugin.js rows.ndjson expected.ndjson "$@"
