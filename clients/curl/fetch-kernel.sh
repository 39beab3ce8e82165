#!/bin/sh
# Fetch one kernel by key: the binary to FILE, its entry point and launch config (from the
# X-TLM-* headers) to stderr.  usage: fetch-kernel.sh KEY FILE
set -eu
[ $# -eq 2 ] || { echo "usage: $0 KEY FILE" >&2; exit 2; }
S=${TLMC_SERVER:-http://127.0.0.1:8470}
curl -sS --fail -D /dev/stderr -o "$2" "$S/v1/kernels/$1" 2>&1 >/dev/null | grep -i '^x-tlm-' >&2
