#!/usr/bin/env bash
# The memory soak for an hour: two `weir run` hosts at a steady load, each
# host's resident memory, open descriptors and threads read from /proc every
# 2 s, and every row checked at the sinks (0 lost). The same test CI runs
# for 135 s (`tests/it/soak.rs`), given the hour.
#
#   examples/soak/run.sh [SECONDS] [ROWS_PER_SEC]
#
# SECONDS: how long the load runs (default 3600). ROWS_PER_SEC: offered to
# the pair (default 50000, half of what one host takes in the front door
# bench on a quiet machine; lower it on a shared one). Writes the samples
# to examples/soak/soak.csv (host,seconds,rss_kib,fds,threads) and prints
# each host's RSS, descriptors and threads, second third against last.
set -euo pipefail
seconds="${1:-3600}"
rate="${2:-50000}"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib.sh"

echo "== the soak: $seconds s at $rate rows/s over two hosts"
WEIR_SOAK_SECS="$seconds" WEIR_SOAK_RATE="$rate" WEIR_SOAK_CSV="$here/soak.csv" \
  cargo test --locked --release --test it -- soak:: --nocapture --test-threads 1
echo "== samples in $here/soak.csv; RSS by minute (MiB), per host:"
awk -F, 'NR > 1 { m = int($2 / 60); key = $1 " " m; if (!(key in rss) || $3 > rss[key]) rss[key] = $3 }
  END { for (k in rss) printf "%s %.1f\n", k, rss[k] / 1024 }' "$here/soak.csv" | sort -k1,1 -k2,2n
