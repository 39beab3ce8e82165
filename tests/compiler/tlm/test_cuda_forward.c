/* Tests for compiler/tlm/cuda.c: every GPU kernel compiles with NVRTC for sm_80 and sm_90
 * within the launch limits (no GPU needed); device selection (auto falls back to the CPU,
 * "cuda" without a GPU is a clean error, bad specs are refused); the CPU device is bitwise the
 * CPU forward and the CPU decoder; and, on a machine with a GPU only, GPU logits against CPU
 * logits and batched GPU decoding against one-at-a-time GPU decoding. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tlm/tlm_cuda.h"
#include "compiler/toolchain/cuda_dl.h"
#include "compiler/toolchain/toolchain.h"

/* The CUDA driver maps memory where ASan's default shadow-gap protection sits: cuInit fails
 * with CUDA_ERROR_OUT_OF_MEMORY under it, which would turn the GPU tests into skips on a GPU
 * machine. ASAN_OPTIONS from the environment still override this. */
__attribute__((used)) const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "protect_shadow_gap=0";
}

/* The driver and cuBLAS keep process-lifetime allocations LeakSanitizer cannot see into. */
__attribute__((used)) const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libcuda.so\nleak:libcublas.so\nleak:libcublasLt.so\n";
}

static const tlm_config CFG = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .n_ctx = 96, .vocab_size = 300};
/* Sizes that are no multiple of a warp or a tile: head size 16, C 48, odd vocabulary. */
static const tlm_config CFG_ODD = {
    .n_layer = 1, .n_head = 3, .n_embd = 48, .n_ctx = 80, .vocab_size = 77};

static tlm_model *make_model(const tlm_config *cfg, uint64_t seed, float scale)
{
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_init_random(cfg, NULL, seed, &m, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] *= scale; /* larger weights: peaked logits, fewer near-ties */
    return m;
}

static void fill_tokens(int32_t *t, int n, int V, uint32_t seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    }
}

static int have_gpu(void)
{
    const tc_cuda *cu;
    return tc_cuda_get(&cu, NULL) == 0;
}

/* ---- kernels, without a GPU ---- */

Test(cuda_kernels, table_is_consistent)
{
    int n = tlm_cuda_kernel_count();
    cr_assert_geq(n, 6);
    cr_assert_null(tlm_cuda_kernel_get(-1));
    cr_assert_null(tlm_cuda_kernel_get(n));
    for (int i = 0; i < n; i++) {
        const tlm_cuda_kernel *k = tlm_cuda_kernel_get(i);
        cr_assert_not_null(k);
        cr_assert(strstr(k->source, k->name), "%s: its source does not define it", k->name);
        /* the block reductions need whole warps */
        cr_assert(k->block_threads >= 32 && k->block_threads <= 1024 && k->block_threads % 32 == 0,
                  "%s: %d threads", k->name, k->block_threads);
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(k->name, tlm_cuda_kernel_get(j)->name);
    }
}

Test(cuda_kernels, every_kernel_compiles_for_sm80_and_sm90, .timeout = 300)
{
    tlm_error err = {0};
    if (tc_nvrtc_available(&err) != 0) cr_skip_test("no NVRTC: %s", err.msg);
    const int sms[] = {80, 90};
    for (int i = 0; i < tlm_cuda_kernel_count(); i++) {
        const tlm_cuda_kernel *k = tlm_cuda_kernel_get(i);
        for (int s = 0; s < 2; s++) {
            tc_cubin cb;
            int rc = tc_nvrtc_compile(k->source, k->name, sms[s], &cb, &err);
            cr_assert_eq(rc, 0, "%s sm_%d: %s", k->name, sms[s], err.msg);
            cr_assert_gt(cb.size, 0);
            cr_assert_str_eq(cb.entry, k->name, "extern \"C\" keeps the plain name");
            cr_assert_gt(cb.regs, 0, "%s: ptxas reported no registers", k->name);
            rc = tc_cubin_check_limits(&cb, 255, k->block_threads, 65536, 48 * 1024, &err);
            cr_assert_eq(rc, 0, "%s sm_%d: %s", k->name, sms[s], err.msg);
            cr_assert_eq(cb.spill_stores, 0, "%s sm_%d spills", k->name, sms[s]);
            cr_assert_eq(cb.spill_loads, 0, "%s sm_%d spills", k->name, sms[s]);
            tc_cubin_free(&cb);
        }
    }
}

Test(cuda_kernels, cublas_loads_without_a_gpu)
{
    tlm_error err = {0};
    if (tc_nvrtc_available(&err) != 0) cr_skip_test("no CUDA toolkit here: %s", err.msg);
    char which[512] = "";
    int rc = tlm_cuda_cublas_available(which, sizeof which, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert(strstr(which, "libcublas"), "%s", which);
}

/* ---- device selection ---- */

Test(cuda_device, bad_specs_are_refused)
{
    const char *bad[] = {"gpu", "", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CPU", "cuda:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tlm_device *d = (tlm_device *)1;
        tlm_error err = {0};
        cr_assert_eq(tlm_device_open(bad[i], &d, &err), TLM_EINVAL, "'%s'", bad[i]);
        cr_assert_null(d);
        cr_assert_str_eq(err.field, "device");
        cr_assert_gt(strlen(err.msg), 0);
    }
}

Test(cuda_device, cpu_and_auto)
{
    tlm_device *d;
    tlm_error err = {0};
    cr_assert_eq(tlm_device_open("cpu", &d, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_device_kind(d), TLM_DEVICE_CPU);
    cr_assert_str_eq(tlm_device_name(d), "cpu");
    cr_assert_str_eq(tlm_device_fallback_reason(d), "");
    tlm_device_close(d);

    cr_assert_eq(tlm_device_open("auto", &d, &err), 0, "%s", err.msg);
    if (have_gpu()) {
        cr_assert_eq(tlm_device_kind(d), TLM_DEVICE_CUDA, "fallback: %s",
                     tlm_device_fallback_reason(d));
        cr_assert(!strncmp(tlm_device_name(d), "cuda:0 (", 8), "%s", tlm_device_name(d));
    } else {
        cr_assert_eq(tlm_device_kind(d), TLM_DEVICE_CPU);
        cr_assert_gt(strlen(tlm_device_fallback_reason(d)), 0, "auto must say why it fell back");
    }
    tlm_device_close(d);
    cr_assert_eq(tlm_device_open(NULL, &d, &err), 0, "%s", err.msg); /* NULL = auto */
    tlm_device_close(d);
    cr_assert_eq(tlm_device_kind(NULL), TLM_DEVICE_CPU);
}

Test(cuda_device, cuda_without_gpu_is_a_clean_error)
{
    if (have_gpu()) cr_skip_test("this machine has a GPU");
    const char *specs[] = {"cuda", "cuda:0", "cuda:3"};
    for (int i = 0; i < 3; i++) {
        tlm_device *d = (tlm_device *)1;
        tlm_error err = {0};
        int rc = tlm_device_open(specs[i], &d, &err);
        cr_assert_eq(rc, TLM_EUNSUPPORTED, "%s: %d %s", specs[i], rc, err.msg);
        cr_assert_null(d);
        cr_assert(strstr(err.msg, "no CUDA driver") || strstr(err.msg, "no GPU"), "%s", err.msg);
    }
}

/* ---- the CPU device is the CPU path ---- */

Test(cuda_device, cpu_device_forward_is_bitwise_cpu_forward)
{
    tlm_model *m = make_model(&CFG, 7, 1.0f);
    tlm_device *d;
    tlm_error err = {0};
    cr_assert_eq(tlm_device_open("cpu", &d, &err), 0, "%s", err.msg);
    const int V = CFG.vocab_size, lens[3] = {1, 9, 30};
    tlm_kv *a[3], *b[3];
    int32_t tok[3][30];
    float *la = malloc(sizeof(float) * 30 * V * 3), *lb = malloc(sizeof(float) * 30 * V * 3);
    tlm_seq sa[3], sb[3];
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(tlm_kv_new(m, 0, &a[s], &err), 0);
        cr_assert_eq(tlm_kv_new_dev(d, m, 0, &b[s], &err), 0);
        cr_assert_not_null(b[s]->k, "a CPU device makes host caches");
        fill_tokens(tok[s], lens[s], V, 100 + s);
        sa[s] = (tlm_seq){a[s], tok[s], lens[s], la + (size_t)s * 30 * V, s == 1};
        sb[s] = (tlm_seq){b[s], tok[s], lens[s], lb + (size_t)s * 30 * V, s == 1};
    }
    tlm_workspace *ws = tlm_workspace_new();
    cr_assert_eq(tlm_forward_batch(m, ws, sa, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_forward_batch_dev(d, m, sb, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(la, lb, sizeof(float) * 30 * V * 3), 0, "logits differ in bits");
    for (int s = 0; s < 3; s++)
        cr_assert_eq(b[s]->len, lens[s]);
    /* one more token each, through dev NULL (the CPU as well) */
    for (int s = 0; s < 3; s++) {
        sa[s].n_tokens = sb[s].n_tokens = 1;
        sa[s].all_logits = sb[s].all_logits = 0;
    }
    cr_assert_eq(tlm_forward_batch(m, ws, sa, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_forward_batch_dev(NULL, m, sb, 3, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(la, lb, sizeof(float) * 30 * V * 3), 0);

    /* validation as tlm_forward_batch: a cache twice, nothing changes */
    tlm_seq dup[2] = {sb[0], sb[0]};
    int len0 = b[0]->len;
    cr_assert_eq(tlm_forward_batch_dev(d, m, dup, 2, &err), TLM_EINVAL);
    cr_assert_eq(b[0]->len, len0);
    /* copies of either kind */
    tlm_kv *c;
    cr_assert_eq(tlm_kv_new_dev(d, m, 40, &c, &err), 0);
    cr_assert_eq(tlm_kv_copy_dev(c, b[2], &err), 0, "%s", err.msg);
    cr_assert_eq(c->len, b[2]->len);
    tlm_kv_free_dev(c);
    for (int s = 0; s < 3; s++) {
        tlm_kv_free(a[s]);
        tlm_kv_free_dev(b[s]);
    }
    tlm_workspace_free(ws);
    free(la);
    free(lb);
    tlm_device_close(d);
    tlm_model_free(m);
}

/* ---- decoding helpers ---- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* About a quarter of the vocabulary, depending on the position and the last token; every
 * third generated position forced. */
static int mask_fn(void *user, const int32_t *tok, int n, int n_prompt, uint64_t *allowed,
                   int32_t *forced, tlm_error *err)
{
    int V = *(const int *)user;
    uint32_t h = mix((uint32_t)n * 2654435761u ^ (uint32_t)tok[n - 1]);
    if ((n - n_prompt) % 3 == 2) {
        *forced = (int32_t)(h % (uint32_t)V);
        return TLM_MASK_NEXT;
    }
    int any = 0;
    for (int t = 0; t < V; t++)
        if (mix(h + (uint32_t)t) % 4 == 0) {
            tlm_bitset_set(allowed, t);
            any = 1;
        }
    if (!any) tlm_bitset_set(allowed, (int32_t)(h % (uint32_t)V));
    return TLM_MASK_NEXT;
}

#define NREQ 6
#define MAXNEW 12

typedef struct run_out {
    int32_t tok[NREQ][4][MAXNEW];
    int n[NREQ][4];
    int n_results[NREQ];
} run_out;

/* Decodes NREQ requests (prompt lengths 1..~30, beam width `beam`) on dev: all at once with
 * some joining two steps late, or (one_at_a_time) each alone. */
static void decode(const tlm_model *m, tlm_device *dev, int beam, int one_at_a_time, run_out *o)
{
    static int V;
    V = m->cfg.vocab_size;
    tlm_error err = {0};
    tlm_decoder *dec;
    cr_assert_eq(tlm_decoder_new(m, NREQ, &dec, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_decoder_set_device(dec, dev, &err), 0, "%s", err.msg);
    int32_t prompts[NREQ][32];
    tlm_request rq[NREQ];
    for (int i = 0; i < NREQ; i++) {
        int len = 1 + (i * 7) % 30;
        fill_tokens(prompts[i], len, V, 1000 + (uint32_t)i);
        rq[i] = (tlm_request){.prompt = prompts[i], .n_prompt = len, .mask = mask_fn, .user = &V,
                              .max_new_tokens = MAXNEW, .beam_width = beam};
    }
    int slot[NREQ];
    if (one_at_a_time) {
        for (int i = 0; i < NREQ; i++) {
            slot[i] = tlm_decoder_add(dec, &rq[i], &err);
            cr_assert_geq(slot[i], 0, "%s", err.msg);
            cr_assert_eq(tlm_decoder_run(dec, &err), 0, "%s", err.msg);
        }
    } else {
        for (int i = 0; i < NREQ - 2; i++)
            cr_assert_geq(slot[i] = tlm_decoder_add(dec, &rq[i], &err), 0, "%s", err.msg);
        cr_assert_geq(tlm_decoder_step(dec, &err), 0, "%s", err.msg);
        /* no device change while requests are active */
        if (tlm_decoder_active(dec) > 0)
            cr_assert_eq(tlm_decoder_set_device(dec, NULL, &err), TLM_EINVAL);
        cr_assert_geq(tlm_decoder_step(dec, &err), 0, "%s", err.msg);
        for (int i = NREQ - 2; i < NREQ; i++)
            cr_assert_geq(slot[i] = tlm_decoder_add(dec, &rq[i], &err), 0, "%s", err.msg);
        cr_assert_eq(tlm_decoder_run(dec, &err), 0, "%s", err.msg);
    }
    memset(o, 0, sizeof *o);
    for (int i = 0; i < NREQ; i++) {
        cr_assert_eq(tlm_decoder_state(dec, slot[i]), TLM_SLOT_DONE);
        o->n_results[i] = tlm_decoder_n_results(dec, slot[i]);
        for (int k = 0; k < o->n_results[i] && k < 4; k++) {
            const int32_t *t;
            cr_assert_eq(tlm_decoder_result(dec, slot[i], k, &t, &o->n[i][k], NULL, &err), 0);
            memcpy(o->tok[i][k], t, (size_t)o->n[i][k] * sizeof(int32_t));
        }
    }
    tlm_decoder_free(dec);
}

Test(cuda_device, decoder_on_cpu_device_equals_plain_decoder)
{
    tlm_model *m = make_model(&CFG, 11, 3.0f);
    tlm_device *d;
    tlm_error err = {0};
    cr_assert_eq(tlm_device_open("cpu", &d, &err), 0, "%s", err.msg);
    run_out *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    decode(m, NULL, 1, 0, a);
    decode(m, d, 1, 0, b);
    cr_assert_eq(memcmp(a, b, sizeof *a), 0);
    cr_assert_gt(a->n[0][0], 0);
    free(a);
    free(b);
    tlm_device_close(d);
    tlm_model_free(m);
}

/* ---- on a GPU only ---- */

static tlm_device *gpu_or_skip(void)
{
    tlm_device *d = NULL;
    tlm_error err = {0};
    if (!have_gpu()) cr_skip_test("no GPU on this machine");
    cr_assert_eq(tlm_device_open("cuda", &d, &err), 0, "a GPU is present but: %s", err.msg);
    return d;
}

/* max |g - c| / max(1, max |c|): logits are O(1..10) here, so this is a relative error. */
static double rel_err(const float *g, const float *c, size_t n)
{
    double md = 0, mc = 1;
    for (size_t i = 0; i < n; i++) {
        double dd = fabs((double)g[i] - (double)c[i]);
        if (!(dd <= md)) md = dd; /* NaN counts as the worst */
        if (fabs((double)c[i]) > mc) mc = fabs((double)c[i]);
    }
    return md / mc;
}

static void gpu_vs_cpu(const tlm_config *cfg, uint64_t seed)
{
    tlm_device *d = gpu_or_skip();
    tlm_model *m = make_model(cfg, seed, 1.0f);
    tlm_error err = {0};
    const int V = cfg->vocab_size;
    const int lens[] = {1, 2, 7, 33, 64};
    enum { NS = 5 };
    tlm_kv *kc[NS], *kg[NS];
    int32_t tok[NS][80];
    tlm_seq sc[NS], sg[NS];
    size_t per = (size_t)64 * V;
    float *lc = malloc(sizeof(float) * per * NS), *lg = malloc(sizeof(float) * per * NS);
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(tlm_kv_new(m, 0, &kc[s], &err), 0);
        cr_assert_eq(tlm_kv_new_dev(d, m, 0, &kg[s], &err), 0, "%s", err.msg);
        cr_assert_null(kg[s]->k, "a GPU cache has no host arrays");
        fill_tokens(tok[s], 80, V, 77 + (uint32_t)s);
        sc[s] = (tlm_seq){kc[s], tok[s], lens[s], lc + s * per, s % 2};
        sg[s] = (tlm_seq){kg[s], tok[s], lens[s], lg + s * per, s % 2};
    }
    tlm_workspace *ws = tlm_workspace_new();
    /* prefill of every length in one batch, then three single-token steps */
    for (int step = 0; step < 4; step++) {
        cr_assert_eq(tlm_forward_batch(m, ws, sc, NS, &err), 0, "%s", err.msg);
        cr_assert_eq(tlm_forward_batch_dev(d, m, sg, NS, &err), 0, "%s", err.msg);
        for (int s = 0; s < NS; s++) {
            size_t n = (size_t)(sc[s].all_logits ? sc[s].n_tokens : 1) * V;
            double e = rel_err(lg + s * per, lc + s * per, n);
            cr_assert_leq(e, 1e-3, "step %d seq %d (length %d): relative error %g", step, s,
                          kc[s]->len, e);
            cr_assert_eq(kg[s]->len, kc[s]->len);
        }
        for (int s = 0; s < NS; s++) {
            sc[s].tokens += sc[s].n_tokens;
            sg[s].tokens += sg[s].n_tokens;
            sc[s].n_tokens = sg[s].n_tokens = 1;
        }
    }
    /* a device copy continues like the original */
    tlm_kv *cp;
    cr_assert_eq(tlm_kv_new_dev(d, m, 0, &cp, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_kv_copy_dev(cp, kg[3], &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_kv_copy_dev(cp, kc[3], &err), TLM_EINVAL, "mixed kinds are refused");
    int32_t next = 5;
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    tlm_seq a = {kg[3], &next, 1, l1, 0}, b = {cp, &next, 1, l2, 0};
    cr_assert_eq(tlm_forward_batch_dev(d, m, &a, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_forward_batch_dev(d, m, &b, 1, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(l1, l2, sizeof(float) * V), 0, "copied cache gives other logits");
    /* a host cache is refused by the GPU forward, a GPU cache by the CPU one */
    tlm_seq hc = {kc[0], &next, 1, l1, 0};
    cr_assert_eq(tlm_forward_batch_dev(d, m, &hc, 1, &err), TLM_EINVAL);
    cr_assert_eq(tlm_forward_batch_dev(NULL, m, &b, 1, &err), TLM_EINVAL);
    tlm_kv_free_dev(cp);
    for (int s = 0; s < NS; s++) {
        tlm_kv_free(kc[s]);
        tlm_kv_free_dev(kg[s]);
    }
    free(l1);
    free(l2);
    free(lc);
    free(lg);
    tlm_workspace_free(ws);
    tlm_device_forget_model(d, m);
    tlm_model_free(m);
    tlm_device_close(d);
}

Test(cuda_gpu, logits_match_cpu, .timeout = 300)
{
    gpu_vs_cpu(&CFG, 21);
}

Test(cuda_gpu, logits_match_cpu_odd_sizes, .timeout = 300)
{
    gpu_vs_cpu(&CFG_ODD, 22);
}

Test(cuda_gpu, batched_decoding_equals_one_at_a_time, .timeout = 300)
{
    tlm_device *d = gpu_or_skip();
    tlm_model *m = make_model(&CFG, 31, 3.0f);
    run_out *a = malloc(sizeof *a), *b = malloc(sizeof *b), *c = malloc(sizeof *c);
    decode(m, d, 1, 0, a);
    decode(m, d, 1, 1, b);
    cr_assert_eq(memcmp(a, b, sizeof *a), 0, "greedy: batched differs from one at a time");
    decode(m, NULL, 1, 0, c); /* CPU: the same tokens unless a near-tie flips */
    int same = !memcmp(a, c, sizeof *a);
    cr_log_info("greedy GPU tokens %s the CPU's", same ? "equal" : "differ from");
    decode(m, d, 3, 0, a); /* beam search: device cache copies */
    decode(m, d, 3, 1, b);
    cr_assert_eq(memcmp(a, b, sizeof *a), 0, "beam: batched differs from one at a time");
    for (int i = 0; i < NREQ; i++)
        cr_assert_geq(a->n_results[i], 1);
    free(a);
    free(b);
    free(c);
    tlm_device_forget_model(d, m);
    tlm_model_free(m);
    tlm_device_close(d);
}
