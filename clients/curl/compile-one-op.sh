#!/bin/sh
# Compile one operator and print the answer (kernel key, entry, launch, cache hit or miss).
# usage: compile-one-op.sh [TARGET] [WORKLOAD-JSON]     server: $TLMC_SERVER (127.0.0.1:8470)
set -eu
S=${TLMC_SERVER:-http://127.0.0.1:8470}
T=${1:-cpu}
W=${2:-'{"op":"dense","shape":{"M":1024,"N":1024,"K":1024},"epilogue":["bias_add","gelu"]}'}
exec curl -sS --fail-with-body ${TLMC_TOKEN:+-H "Authorization: Bearer $TLMC_TOKEN"} \
    -H 'Content-Type: application/json' \
    -d "{\"target\":\"$T\",\"workloads\":[$W]}" "$S/v1/compile"
