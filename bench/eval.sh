#!/bin/bash
# bench/eval.sh — the TLM's evaluation (issue 12): on a validation slice of
# bench/suites/real_shapes.json (models outside the training zoo; `tlm datagen --exclude` keeps
# them out of the data), `tlm eval` measures the default, the model's one pass (also under a
# prior of 4 and 8 logits on the default's tokens: tlm@4, tlm@8), its top-8 and the measured
# search, then PyTorch eager measures the same workloads in the same run;
# bench/report_eval.py writes bench/results/eval.md and eval.png.
#
#   bench/eval.sh [--fresh] [--weights F] [--search N] [--targets T1,T2] [--only NAMES]
#
# Resumes by default (tlm eval and the peer skip workloads already in their JSONL).
set -eu
cd "$(dirname "$0")/.."
R=bench/results
TLM=${TLM:-build/tlm}
weights=model_weights/tlm.bin search=64 targets=cpu fresh=0
only=vit_b16_fc1_gelu,vit_b16_attn_scores,vit_b16_attn_softmax,vit_b16_layer_norm,deit_s_384_qkv,whisper_tiny_conv1,sd15_conv_in,sd15_skip_1x1_640,sd15_cross_attn_scores,sd15_text_fc1_gelu,tinyllama_kv_proj_prefill512,llama2_7b_q_proj_decode,yolov5s_c3_80,yolov5s_1x1_20,convnext_t_dw7x7_14,mobilenetv3_dw5x5_s2,kb_bmm,kb_reduce_sum,convnext_t_pwconv1_gelu,kb_avg_pool
while [ $# -gt 0 ]; do
    case "$1" in
    --fresh) fresh=1 ;;
    --weights) weights=$2; shift ;;
    --search) search=$2; shift ;;
    --targets) targets=$2; shift ;;
    --only) only=$2; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "eval.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$R"
[ $fresh = 0 ] || rm -f "$R/eval.jsonl" "$R/eval.torch.jsonl"
suite=bench/suites/real_shapes.json
"$TLM" model info "$weights" > "$R/eval.model.json"
for t in ${targets//,/ }; do
    "$TLM" eval --suite "$suite" --target "$t" --weights "$weights" \
        --schedules "default,tlm,tlm@4,tlm@8,topk:8,search:$search" --only "$only" --jsonl "$R/eval.jsonl" \
        > "$R/eval.summary.$t.json"
done
# the peer, right after ours on the same machine; OpenBLAS unheld only here
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    . bench/lib_blas.sh
    blas_peer_env "${BUILD:-build}/bench/real_shapes"
    "${BLAS_ENV[@]}" /usr/bin/python3 bench/peers_torch.py \
        --suite "$suite" --only "$only" --out "$R/eval.torch.jsonl" || true
else
    echo "eval.sh: no PyTorch for /usr/bin/python3 (bench/setup.sh installs it); no peer column" >&2
fi
/usr/bin/python3 bench/report_eval.py
