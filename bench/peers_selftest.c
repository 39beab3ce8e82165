/* peers_selftest — prints every figure of bench/peers.h once, so the peers can be checked by
 * eye on a new machine. Run with OpenBLAS unpinned (see peers.h):
 *   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/bench/peers_selftest
 * A negative figure means the peer failed; the reason is on stderr. Exit status 1 then.
 */
#include "bench/peers.h"

static int failures;

/* impl: oneDNN's implementation name, or NULL for non-oneDNN peers. */
static void row_impl(const char *what, double seconds, double flops, const char *impl)
{
    if (seconds < 0) {
        printf("%-56s FAILED\n", what);
        failures++;
    } else if (flops > 0) {
        printf("%-56s %10.1f us %8.1f GFLOP/s", what, seconds * 1e6, flops / seconds * 1e-9);
    } else {
        printf("%-56s %10.1f us %17s", what, seconds * 1e6, "");
    }
    if (seconds >= 0 && impl) printf("  [%s]", impl);
    printf("\n");
    fflush(stdout);
}

static void row(const char *what, double seconds, double flops)
{
    row_impl(what, seconds, flops, NULL);
}

static void drow(const char *what, double seconds, double flops)
{
    row_impl(what, seconds, flops, peer_dnnl_last_impl());
}

/* The fields a peer reads; ir_workload_init lives in libtlm, which this file does not need. */
static ir_workload conv(ir_op op, ir_layout layout, const int64_t *shape, int nkeys, int64_t pad,
                        int64_t stride)
{
    ir_workload w;
    memset(&w, 0, sizeof w);
    w.op = op;
    w.dtype = IR_FLOAT32;
    memcpy(w.shape, shape, (size_t)nkeys * sizeof shape[0]);
    w.stride[0] = w.stride[1] = stride;
    w.pad[0] = w.pad[1] = pad;
    w.dilation[0] = w.dilation[1] = 1;
    w.groups = 1;
    w.layout = layout;
    w.eps = 1e-5;
    return w;
}

static void conv_rows(const char *name, ir_workload w, double flops)
{
    char buf[96];
    const char *lay = w.layout == IR_NHWC ? "NHWC" : "NCHW";
    snprintf(buf, sizeof buf, "dnnl %s %s plain", name, lay);
    drow(buf, peer_dnnl_conv_s(&w, false), flops);
    snprintf(buf, sizeof buf, "dnnl %s %s blocked", name, lay);
    drow(buf, peer_dnnl_conv_s(&w, true), flops);
}

int main(void)
{
    const char *ct = getenv("OPENBLAS_CORETYPE"), *l2 = getenv("OPENBLAS_L2_SIZE");
    printf("openblas core %s, %d threads; OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s\n",
           peer_openblas_corename(), peer_openblas_threads(), ct ? ct : "(unset)",
           l2 ? l2 : "(unset)");
    if (peer_openblas_pinned())
        printf("WARNING: OpenBLAS is pinned by the environment; rerun with\n"
               "  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE %s\n",
               "build/bench/peers_selftest");
    printf("omp procs %d, fma kernel %s\n\n", omp_get_num_procs(), peer_fma_isa());

    double f = 2.0 * 1024 * 1024 * 1024;
    row("openblas sgemm 1024^3", peer_sgemm_s(1024, 1024, 1024, false, false), f);
    row("openblas sgemm 1024^3 ta tb", peer_sgemm_s(1024, 1024, 1024, true, true), f);
    drow("dnnl matmul 1024^3", peer_dnnl_matmul_s(1024, 1024, 1024), f);
    row("openblas sgemm+bias+gelu 128x3072x768 (BERT)", peer_sgemm_bias_gelu_s(128, 3072, 768),
        2.0 * 128 * 3072 * 768);
    row("openblas sgemm 128x3072x768", peer_sgemm_s(128, 3072, 768, false, false),
        2.0 * 128 * 3072 * 768);

    /* ResNet-50 stage 1 3x3: 1x64x56x56, F=64, pad 1, epilogue [bias_add, relu] */
    int64_t rs[7] = {1, 64, 56, 56, 64, 3, 3};
    double rf = 2.0 * 64 * 56 * 56 * 64 * 9;
    for (int l = 0; l < 2; l++) {
        ir_workload w = conv(IR_OP_CONV2D, l ? IR_NHWC : IR_NCHW, rs, 7, 1, 1);
        w.n_epilogue = 2, w.epilogue[0] = IR_EPI_BIAS_ADD, w.epilogue[1] = IR_EPI_RELU;
        conv_rows("conv 1x64x56x56 F64 3x3 p1 +bias+relu", w, rf);
    }
    /* grouped, strided, dilated, with a residual add: exercises hwigo / goihw and binary ops */
    int64_t gs[7] = {1, 64, 56, 56, 128, 3, 3};
    for (int l = 0; l < 2; l++) {
        ir_workload w = conv(IR_OP_CONV2D, l ? IR_NHWC : IR_NCHW, gs, 7, 2, 2);
        w.groups = 4, w.dilation[0] = w.dilation[1] = 2;
        w.n_epilogue = 3, w.epilogue[0] = IR_EPI_BIAS_ADD, w.epilogue[1] = IR_EPI_ADD,
        w.epilogue[2] = IR_EPI_RELU6;
        conv_rows("conv g4 s2 d2 F128 +bias+add+relu6", w, 2.0 * 128 * 28 * 28 * 16 * 9);
    }
    /* MobileNet depthwise 1x32x112x112 3x3 pad 1 */
    int64_t ds[6] = {1, 32, 112, 112, 3, 3};
    for (int l = 0; l < 2; l++) {
        ir_workload w = conv(IR_OP_DEPTHWISE_CONV2D, l ? IR_NHWC : IR_NCHW, ds, 6, 1, 1);
        w.n_epilogue = 2, w.epilogue[0] = IR_EPI_BIAS_ADD, w.epilogue[1] = IR_EPI_RELU6;
        conv_rows("depthwise 1x32x112x112 3x3 p1 +bias+relu6", w, 2.0 * 32 * 112 * 112 * 9);
    }
    int64_t ps[6] = {1, 64, 112, 112, 3, 3};
    for (int l = 0; l < 2; l++) {
        ir_workload w = conv(IR_OP_MAX_POOL2D, l ? IR_NHWC : IR_NCHW, ps, 6, 1, 2);
        drow(l ? "dnnl max_pool 1x64x112x112 3x3 s2 p1 NHWC"
               : "dnnl max_pool 1x64x112x112 3x3 s2 p1 NCHW",
             peer_dnnl_pool_s(&w), 0);
        w.op = IR_OP_AVG_POOL2D;
        drow(l ? "dnnl avg_pool 1x64x112x112 3x3 s2 p1 NHWC"
               : "dnnl avg_pool 1x64x112x112 3x3 s2 p1 NCHW",
             peer_dnnl_pool_s(&w), 0);
    }

    drow("dnnl softmax 128x768", peer_dnnl_softmax_s(128, 768), 0);
    drow("dnnl softmax 128x3072", peer_dnnl_softmax_s(128, 3072), 0);
    drow("dnnl layer_norm 128x768", peer_dnnl_layer_norm_s(128, 768), 0);
    drow("dnnl layer_norm 128x3072", peer_dnnl_layer_norm_s(128, 3072), 0);

    double p1 = peer_fma_peak_gflops(1), pn = peer_fma_peak_gflops(0);
    double bw = peer_mem_bandwidth_gbs(), cp = peer_mem_copy_gbs();
    printf("\n%-56s %10.1f GFLOP/s\n", "fma peak, 1 thread", p1);
    printf("%-56s %10.1f GFLOP/s (%d threads)\n", "fma peak, all threads", pn, omp_get_num_procs());
    printf("%-56s %10.1f GB/s\n", "memory read (sum of 512 MiB)", bw);
    printf("%-56s %10.1f GB/s\n", "memory copy (256 MiB, read+write)", cp);
    if (p1 < 0 || pn < 0 || bw < 0 || cp < 0) failures++;
    return failures ? 1 : 0;
}
