#!/usr/bin/env bash
# Runs `outbox bench --store postgres` and River (the benchmark harness's
# river-tuned: FetchCooldown 1 ms, FetchPollInterval 100 ms) alternately on
# one PostgreSQL, ROUNDS times each, and prints the harness's median
# (min..max) table. Compare only figures of one run.
#
#   HARNESS=../shared/bench  the project's benchmark harness (River's adapter, pg.sh)
#   DSN=...                  a server to use (default: the harness's pg.sh starts one)
#   ROUNDS=3  N=5000  E2E_N=500  E2E_RATE=500
#   OUT=results dir (default a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
HARNESS=$(cd "${HARNESS:-../shared/bench}" && pwd)
ROUNDS=${ROUNDS:-3}
N=${N:-5000}
E2E_N=${E2E_N:-500}
E2E_RATE=${E2E_RATE:-500}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

go build -o "$OUT/outbox" ./cmd/outbox
(cd "$HARNESS" && go build -o "$OUT/obench" ./cmd/obench)
DSN=${DSN:-$("$HARNESS/pg.sh")}

for ((r = 1; r <= ROUNDS; r++)); do
	echo "round $r/$ROUNDS: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
	# One JSON object per line, as the harness's summarize reads them.
	OUTBOX_DATABASE_URL=$DSN "$OUT/outbox" bench --store postgres --json \
		-n "$N" -e2e-n "$E2E_N" -e2e-rate "$E2E_RATE" | tr -d '\n' >>"$OUT/outbox.jsonl"
	echo >>"$OUT/outbox.jsonl"
	"$OUT/obench" river -dsn "$DSN" -fetch-cooldown 1ms -fetch-poll 100ms \
		-n "$N" -e2e-n "$E2E_N" -e2e-rate "$E2E_RATE" -phase-max 2s >>"$OUT/river-tuned.jsonl"
done
"$OUT/obench" summarize "$OUT/outbox.jsonl" "$OUT/river-tuned.jsonl"
echo "raw: $OUT/*.jsonl" >&2
