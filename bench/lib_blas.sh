# bench/lib_blas.sh — sourced by the benchmark scripts: the environment under which a
# benchmark measures OpenBLAS as a peer, directly or inside PyTorch (whose Debian build runs
# its matmuls on it).
#
# Some hosts set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE to hold OpenBLAS to older kernels: the
# peer runs with both unset. OpenBLAS then picks its kernels by CPU model, and a model newer
# than its version knows falls back to an old core (an Intel Xeon of family 6 model 207 with
# AVX-512 under Debian's 0.3.21: Prescott, SSE3 kernels, a tenth of its sgemm), which would
# make it a straw peer. There the peer is pinned up to OpenBLAS's newest core that this CPU's
# ISA runs, and TLM_BENCH_BLAS_AUTODETECTED names what autodetection picked, for the reports.
#
#   blas_peer_env PROBE   sets the array BLAS_ENV to an `env ...` prefix; PROBE is a binary
#                         linked with OpenBLAS that prints the core it picks for --blas-core
#                         (build/bench/real_shapes). Without one: both pins unset, no more.
blas_peer_env() {
    local probe=${1:-} core=unknown want=
    BLAS_ENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
    [ -n "$probe" ] && [ -x "$probe" ] || return 0
    core=$("${BLAS_ENV[@]}" "$probe" --blas-core 2>/dev/null) || core=unknown
    if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
        case "$core" in
        SkylakeX | Cooperlake | SapphireRapids) ;;
        *) want=SkylakeX; if grep -qw avx512_bf16 /proc/cpuinfo; then want=Cooperlake; fi ;;
        esac
    elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
        case "$core" in
        Prescott | Core2 | Penryn | Dunnington | Nehalem | Sandybridge | Atom | Katmai | \
            Coppermine | Northwood | Banias | unknown | Unknown) want=Haswell ;;
        esac
    fi
    if [ -n "$want" ]; then
        BLAS_ENV+=(OPENBLAS_CORETYPE="$want" TLM_BENCH_BLAS_AUTODETECTED="$core")
        echo "OpenBLAS peer pinned up to $want (its autodetection picks $core on this CPU)" >&2
    fi
    return 0
}
