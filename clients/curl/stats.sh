#!/bin/sh
# Cache statistics (kernels, bytes, hits, misses, compiles) and the Prometheus counters.
set -eu
S=${TLMC_SERVER:-http://127.0.0.1:8470}
curl -sS --fail "$S/v1/cache/stats"; echo
curl -sS --fail "$S/metrics" | grep -E '^tlmd_(cache|compiles|jobs)_[a-z_]* '
