#!/usr/bin/env bash
# Runs every weir benchmark and writes a report (Markdown + SVG charts) to
# DIR: `bash host/benches/report.sh target/bench-report`, then open
# DIR/report.md (or any DIR/*.svg in a browser). Sized to finish in under
# 10 minutes on 2 cores once built; WEIR_BENCH_* variables change the sizes
# (see each bench's header). A benchmark that fails stops the run with a
# non-zero exit: no report is written from half the figures.
#
# Each figure is shown against host/benches/baseline.json (the last accepted
# figures) with its change; a change the wrong way past 10 % is flagged.
# To accept a run's figures as the new baseline, after reading the report:
#   cp DIR/figures.json host/benches/baseline.json   (and commit it)
set -euo pipefail
dir=${1:?usage: bash host/benches/report.sh DIR}
cd "$(dirname "$0")/../.."
WEIR_SETUP_BENCH=1 . .ci/setup
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir"/*.txt "$dir"/*.svg "$dir"/report.md "$dir"/figures.json

# The fleet of 64 members only (256 members take minutes to settle).
export WEIR_BENCH_MEMBERS=${WEIR_BENCH_MEMBERS:-64}
# State at the default 100 keys per window and at 5,000 (#35's figure).
export WEIR_BENCH_KEYS=${WEIR_BENCH_KEYS:-100,5000}
export WEIR_BENCH_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || true)

# weir's benches and the peer bench's own crate (host/benches/peer, outside
# the workspace's default members so weir's tests never build Extism), always
# named together: one feature resolution for every run, so nothing is rebuilt
# between benches, and the same build as when the peer bench was weir's.
packages=(-p weir -p weir-peer-bench)

# CI's clippy leaves the peer bench's crate out with the rest of Extism.
echo "== linting the peer bench"
cargo clippy -p weir-peer-bench --all-targets --locked -- -D warnings

echo "== building the benchmarks (release)"
cargo bench "${packages[@]}" --locked --no-run
started=$(date +%s)
for bench in delivery front_door boundary peer policy kv_watch_cost coordination_cost latency whole_path replication state postgres rollout memory nats_sink; do
  echo "== $bench"
  bench_started=$(date +%s)
  cargo bench "${packages[@]}" --locked --bench "$bench" 2>"$dir/$bench.log" | tee "$dir/$bench.txt"
  echo "== $bench took $(( $(date +%s) - bench_started )) s"
done
cargo bench "${packages[@]}" --locked --bench report -- "$dir"
echo "== all benchmarks took $(( $(date +%s) - started )) s; report: $dir/report.md"
