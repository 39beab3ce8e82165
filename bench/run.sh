#!/bin/bash
# make bench: every benchmark, tables into bench/results/.
# TUNE=skip (default) | quick | full: the measured search beside the peers (bench/tune.sh:
# quick = 64 trials on 6 workloads, ~15 min; full = 256 trials on 12, ~1.5 h).
# REAL_SHAPES=full (default) | quick | skip chooses how the real-shapes suite runs
# (bench/real_shapes.sh: ~25 min full, ~10 min quick on 2 cores; it resumes when run by hand
# without --fresh).
# OpenBLAS is a peer here: this machine's environment pins it to AVX2 kernels through
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE; the benchmarks run with both unset so OpenBLAS uses
# its real kernels (the kernels table prints which one it chose), pinned up where its
# autodetection falls back to an old core (bench/lib_blas.sh).
set -eu
cd "$(dirname "$0")/.."
mkdir -p bench/results
B=${BUILD:-build}/bench
case "${REAL_SHAPES:-full}" in
full | quick | skip) ;;
*) echo "run.sh: REAL_SHAPES must be full, quick or skip" >&2; exit 2 ;;
esac
make -s "$B/real_shapes" || true # the probe of bench/lib_blas.sh
. bench/lib_blas.sh
blas_peer_env "$B/real_shapes"
run() { echo "== $*"; "${BLAS_ENV[@]}" "$@"; }
run "$B/kernels" --out bench/results/kernels.md
[ -x "$B/tlm_decode" ] && run "$B/tlm_decode"
# the trainer: tokens/s of an optimizer step (bench/tlm_train.c)
[ -x "$B/tlm_train" ] && run "$B/tlm_train"
# tlmd on loopback: cache hits, cold compiles, decoder batch sizes (bench/server.sh)
[ -x "$B/server_load" ] && run bench/server.sh bench/results/server.md
# the real-shapes suite, both CPU targets, beside PyTorch / ORT / OpenBLAS / oneDNN. Not
# through run(): it unsets the OpenBLAS pins itself, only where OpenBLAS is the peer.
case "${REAL_SHAPES:-full}" in
full) echo "== bench/real_shapes.sh --fresh"; bench/real_shapes.sh --fresh ;;
quick) echo "== bench/real_shapes.sh --fresh --quick"; bench/real_shapes.sh --fresh --quick ;;
skip) ;;
esac
case "${TUNE:-skip}" in
quick) echo "== bench/tune.sh --fresh --trials 64 (6 workloads)"
    bench/tune.sh --fresh --trials 64 --no-setup \
        --only vit_b16_fc1_gelu,vit_b16_attn_softmax,tinyllama_kv_proj_prefill512,yolov5s_c3_80,convnext_t_dw7x7_14,llama2_7b_q_proj_decode ;;
full) echo "== bench/tune.sh --fresh"; bench/tune.sh --fresh --no-setup ;;
skip) ;;
*) echo "run.sh: TUNE must be skip, quick or full" >&2; exit 2 ;;
esac
echo "tables in bench/results/"
