#!/bin/sh
# Compile a zoo model (GET /v1/models lists them) and save every kernel into DIR:
# NNN_<op>.so|.cubin, NNN_<op>.c|.cu, NNN_<op>.json (meta) and answer.json (the compile
# answer: occurrences, node, launch of each kernel). Needs only curl, grep and sed.
# usage: compile-model.sh MODEL TARGET DIR ['"batch":1,"image_size":224']
set -eu
[ $# -ge 3 ] || { echo "usage: $0 MODEL TARGET DIR [EXTRA-MODEL-FIELDS]" >&2; exit 2; }
S=${TLMC_SERVER:-http://127.0.0.1:8470}
M=$1 T=$2 D=$3 X=${4:+,$4}
mkdir -p "$D"
curl -sS --fail-with-body ${TLMC_TOKEN:+-H "Authorization: Bearer $TLMC_TOKEN"} \
    -H 'Content-Type: application/json' \
    -d "{\"target\":\"$T\",\"model\":{\"name\":\"$M\"$X}}" "$S/v1/compile" > "$D/answer.json" ||
    { cat "$D/answer.json" >&2; echo >&2; exit 1; }
# kernels come in answer order; keys are 64 hex digits, so grep finds them safely
i=0
for key in $(grep -o '"key":"[0-9a-f]\{64\}"' "$D/answer.json" | cut -d'"' -f4); do
    curl -sS --fail -o "$D/meta.tmp" "$S/v1/kernels/$key/meta"
    op=$(grep -o '"op":"[a-z0-9_]*"' "$D/meta.tmp" | head -1 | cut -d'"' -f4)
    stem=$(printf '%03d_%s' "$i" "$op")
    if grep -q '"format":"cubin"' "$D/meta.tmp"; then bin=cubin src=cu; else bin=so src=c; fi
    mv "$D/meta.tmp" "$D/$stem.json"
    curl -sS --fail -o "$D/$stem.$bin" "$S/v1/kernels/$key"
    curl -sS --fail -o "$D/$stem.$src" "$S/v1/kernels/$key/source"
    i=$((i + 1))
done
echo "$M for $T: $i kernels in $D (answer.json lists occurrences and launch configs)"
