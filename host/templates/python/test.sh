#!/bin/sh
# Runs app.py in plain CPython on rows.ndjson and compares each row's outcome
# with expected.ndjson (no wasm, no weir).
set -e
cd "$(dirname "$0")"
python3 -m weir_plugin.testing app rows.ndjson expected.ndjson "$@"
