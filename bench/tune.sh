#!/bin/bash
# bench/tune.sh — the measured search (tlm tune's engine, compiler/tune) on a slice of the
# real-shapes suite, beside the default, OpenBLAS/oneDNN, PyTorch eager and ONNX Runtime
# measured in the same run, with the random strategy at equal trials as the cost model's
# baseline; then bench/results/tune.md and tune.png (best so far vs trials).
#
#   bench/tune.sh [--trials N] [--only NAMES] [--targets T1,T2] [--no-random] [--fresh]
#                 [--no-ort] [--no-setup]
#
# Default: N = 256, target cpu, the 12 workloads of SLICE below (dense with prime and odd M,
# attention, softmax, norms, 3x3 / 1x1 / dilated / depthwise convs, a decode GEMV). Each pair
# costs about 2 x N builds and measurements (~1 s each on 2 cores): ~1.5 h at N = 256.
# Resumable: without --fresh, what bench/results/tune.jsonl holds is skipped (the sweep
# appends one line per workload as it goes). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset
# only in the one command that measures OpenBLAS as a peer (the sweep itself).
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}/bench
R=bench/results
SLICE=vit_b16_fc1_gelu,vit_b16_attn_scores,vit_b16_attn_softmax,vit_b16_layer_norm,\
sd15_text_fc1_gelu,tinyllama_kv_proj_prefill512,llama2_7b_q_proj_decode,yolov5s_c3_80,\
yolov5s_1x1_20,convnext_t_dw7x7_14,mobilenetv3_dw5x5_s2,kb_conv_dilated
trials=256 only=$SLICE targets=cpu random=(--tune-random) fresh=() ort=() setup=1
while [ $# -gt 0 ]; do
    case "$1" in
    --trials) trials=$2; shift ;;
    --only) only=$2; shift ;;
    --targets) targets=$2; shift ;;
    --no-random) random=() ;;
    --fresh) fresh=(--fresh) ;;
    --no-ort) ort=(--no-ort) ;;
    --no-setup) setup=0 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "tune.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$R"
if [ $setup = 1 ]; then
    bench/setup.sh ${ort[@]+"${ort[@]}"} || echo "tune.sh: setup incomplete; going on" >&2
fi
make -s "$B/real_shapes" || [ -x "$B/real_shapes" ]
echo "== real_shapes --tune $trials ${random[*]} --only $only --targets $targets" >&2
. bench/lib_blas.sh
blas_peer_env "$B/real_shapes"
"${BLAS_ENV[@]}" "$B/real_shapes" --out "$R/tune.jsonl" \
    --only "$only" --targets "$targets" --random 0 --tune "$trials" ${random[@]+"${random[@]}"} \
    ${fresh[@]+"${fresh[@]}"} ${ort[@]+"${ort[@]}"}
/usr/bin/python3 bench/report_tune.py --results "$R/tune.jsonl" --md "$R/tune.md" --png "$R/tune.png"
