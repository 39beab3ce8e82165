#!/bin/bash
# bench/htam.sh — HTAM refinement against its ablations and the evolutionary search, from the
# default kernel, on a slice of the real-shapes suite, with a cold memory and with one warmed
# on a disjoint training slice (transfer); then bench/results/htam.md.
#
#   bench/htam.sh [--budgets 8,32] [--test NAMES] [--train NAMES] [--target T] [--fresh]
#                 [--confirm K] [--note TEXT] [--start default|tlm] [--variants LIST]
#                 [--memories cold,warm] [--reference on|off]
#
# --start tlm: every run (HTAM and the evolutionary search alike) starts from the model's one
# pass (model_weights/tlm.bin, or $WEIGHTS), the first attempt of the issue's protocol, and
# the model regenerates HTAM's slots; results in htam_tlm.{jsonl,md,png}. --variants: a
# subset of full,flat,no-transitions,no-local; --memories: cold, warm or both; --reference off
# leaves out the evolutionary search at 4 x the largest budget.
#
# Every run is `tlm tune` (JSON lines into bench/results/htam.jsonl, one per workload,
# variant, budget and memory state); resumable: without --fresh what the file holds is skipped.
# Variants: htam full | flat | no-transitions | no-local, and evolutionary at the same budget
# (and at the largest budget x 4, the issue's reference point). Cold: an empty memory per
# variant; warm: the memory after running full HTAM on the training slice (32 steps each).
# Each run ends with a second look (--confirm K, default 1: the search's K fastest and the
# starting point measured again, alternately, three rounds each); the report's figures are
# from it, the in-search ratios beside them.
# The plot needs matplotlib (Debian python3-matplotlib; bench/setup.sh installs it).
# OPENBLAS pins are not touched: no OpenBLAS peer here (the reference check's BLAS only).
set -eu
cd "$(dirname "$0")/.."
R=bench/results
TLM=${BUILD:-build}/tlm
budgets=8,32 target=cpu fresh=0 confirm=1 note="" start=default
variants=full,flat,no-transitions,no-local memories=cold,warm reference=on
test_set=vit_b16_fc1_gelu,vit_b16_attn_scores,vit_b16_attn_softmax,vit_b16_layer_norm,\
sd15_text_fc1_gelu,tinyllama_kv_proj_prefill512,llama2_7b_q_proj_decode,yolov5s_c3_80,\
yolov5s_1x1_20,convnext_t_dw7x7_14,mobilenetv3_dw5x5_s2,kb_conv_dilated,whisper_tiny_conv1,\
deit_s_384_qkv,kb_reduce_sum,sd15_skip_1x1_640
train_set=vit_b16_qkv,clip_vitl14_attn_values,kb_bmm,convnext_t_pwconv1_gelu,yolov5s_down_80_40,\
gpt2_vocab_softmax_b128
while [ $# -gt 0 ]; do
    case "$1" in
    --budgets) budgets=$2; shift ;;
    --test) test_set=$2; shift ;;
    --train) train_set=$2; shift ;;
    --target) target=$2; shift ;;
    --fresh) fresh=1 ;;
    --confirm) confirm=$2; shift ;;
    --note) note=$2; shift ;;
    --start) start=$2; shift ;;
    --variants) variants=$2; shift ;;
    --memories) memories=$2; shift ;;
    --reference) reference=$2; shift ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "htam.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$R"
make -s "$TLM"
case "$start" in
default) base=htam from=() ;;
tlm) base=htam_tlm from=(--start tlm --weights "${WEIGHTS:-model_weights/tlm.bin}") ;;
*) echo "htam.sh: --start must be default or tlm" >&2; exit 2 ;;
esac
out=$R/$base.jsonl
work=$(mktemp -d /tmp/tlm-htam-XXXXXX)
trap 'rm -rf "$work"' EXIT
[ $fresh = 1 ] && rm -f "$out"
touch "$out"
wl() { /usr/bin/python3 -c "import json,sys; s=json.load(open('bench/suites/real_shapes.json'))
print(json.dumps(next(w['workload'] for w in s['workloads'] if w['name']==sys.argv[1])))" "$1"; }
done_already() { grep -q "\"key\": \"$1\"" "$out"; }
run() { # key name args...
    local key=$1 name=$2
    shift 2
    done_already "$key" && return 0
    local j
    if j=$("$TLM" tune --workload "$(wl "$name")" --target "$target" --quiet \
        --confirm "$confirm" --confirm-rounds 3 "${from[@]}" "$@"); then
        /usr/bin/python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['key']=sys.argv[2]; d['name']=sys.argv[3]
print(json.dumps(d))" "$j" "$key" "$name" >>"$out"
        echo "$key ok" >&2
    else
        echo "{\"key\": \"$key\", \"name\": \"$name\", \"status\": \"failed\"}" >>"$out"
        echo "$key FAILED" >&2
    fi
}
IFS=, read -r -a B <<<"$budgets"
IFS=, read -r -a TEST <<<"$test_set"
IFS=, read -r -a TRAIN <<<"$train_set"
IFS=, read -r -a VARIANTS <<<"$variants"
IFS=, read -r -a MEMS <<<"$memories"
maxb=${B[${#B[@]}-1]}
# the warm memory: full HTAM over the training slice
warm=$work/warm.db
for n in "${TRAIN[@]}"; do
    [[ " ${MEMS[*]} " == *" warm "* ]] || break
    "$TLM" tune --workload "$(wl "$n")" --target "$target" --strategy htam --trials 32 --confirm 0 \
        --store "$warm" --quiet "${from[@]}" >/dev/null || true
done
[ -f "$warm" ] && "$TLM" htam export --store "$warm" -o "$work/warm.json"
for n in "${TEST[@]}"; do
    for b in "${B[@]}"; do
        for mem in "${VARIANTS[@]}"; do
            for state in "${MEMS[@]}"; do
                if [ "$state" = cold ]; then
                    run "$n/htam-$mem/$b/cold" "$n" --strategy htam --memory "$mem" --trials "$b" \
                        --store "$work/cold-$mem-$n-$b.db"
                else
                    cp "$warm" "$work/w.db"
                    run "$n/htam-$mem/$b/warm" "$n" --strategy htam --memory "$mem" --trials "$b" \
                        --store "$work/w.db"
                fi
            done
        done
        run "$n/evolutionary/$b" "$n" --strategy evolutionary --trials "$b"
    done
    [ "$reference" = off ] ||
        run "$n/evolutionary/$((maxb * 4))" "$n" --strategy evolutionary --trials $((maxb * 4))
done
/usr/bin/python3 bench/report_htam.py --results "$out" --md "$R/$base.md" --png "$R/$base.png" \
    --note "$note" --start "$start"
