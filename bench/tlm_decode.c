/* tlm_decode — CPU decoding throughput of the GPT-2 runtime (compiler/tlm) against batch size.
 *
 * For two model sizes (about 2M and 10M parameters, vocabulary 1500) and batch sizes 1, 4,
 * 16, 32, 64 (decoder slots kept full: continuous batching), every sequence has a 40-token
 * prompt and decodes 30 tokens greedily under a random mask allowing ~10% of the
 * vocabulary. Reported: decoded tokens/s, sequences/s, mean latency of a sequence (admission
 * to completion), the ms per decoder step and the process CPU time per decoded token, once
 * on one thread and once on all (OpenMP). Per model, one sequence whose every other token
 * is forced (the tensor language's slot tokens: no forward pass of their own) against one
 * without. Medians of 3 runs. The matrix products are compiler/tlm/gemm.c's; the table
 * names the path (TLM_GEMM_ISA=scalar | avx2 | avx512 forces one).
 *
 * Run: build/bench/tlm_decode [results.md]
 * Writes bench/results/tlm_decode.md unless another path is given.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compiler/tlm/internal.h"
#include "compiler/tlm/tlm.h"

#define VOCAB 1500
#define PROMPT 40
#define DECODE 30

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads): on a shared machine wall time mostly
 * measures the other jobs; CPU time per token is the figure that transfers. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void loadavg(char *out, size_t n)
{
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f || !fgets(out, (int)n, f)) snprintf(out, n, "?");
    if (f) fclose(f);
    out[strcspn(out, " ")] = 0; /* 1-minute figure */
}

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

typedef struct seq_user {
    uint32_t salt;
    int force_alternate;
} seq_user;

/* ~10% of the vocabulary, a different subset per sequence and position (at least one). */
static int bench_mask(void *user, const int32_t *tok, int n, int n_prompt, uint64_t *allowed,
                      int32_t *forced, tlm_error *err)
{
    const seq_user *u = user;
    uint32_t h = mix(u->salt * 2654435761u + (uint32_t)n);
    if (u->force_alternate && (n - n_prompt) % 2 == 1) {
        *forced = (int32_t)(h % VOCAB);
        return TLM_MASK_NEXT;
    }
    for (int t = 0; t < VOCAB; t++)
        if (mix(h ^ (uint32_t)t * 0x9E3779B9u) % 10 == 0) tlm_bitset_set(allowed, t);
    tlm_bitset_set(allowed, (int32_t)(h % VOCAB));
    (void)tok;
    return TLM_MASK_NEXT;
}

typedef struct result {
    double tok_s, seq_s, latency_ms, step_ms, cpu_ms_tok;
} result;

/* Decodes n_seq sequences through a decoder with `slots` slots kept full. */
static int run_batch(const tlm_model *m, int slots, int n_seq, result *res)
{
    tlm_decoder *d;
    tlm_error err = {0};
    if (tlm_decoder_new(m, slots, &d, &err)) {
        fprintf(stderr, "decoder: %s\n", err.msg);
        return -1;
    }
    int32_t(*prompts)[PROMPT] = malloc(sizeof *prompts * (size_t)n_seq);
    seq_user *users = malloc(sizeof *users * (size_t)n_seq);
    double *t_add = malloc(sizeof(double) * (size_t)n_seq);
    int *slot_seq = malloc(sizeof(int) * (size_t)slots);
    for (int s = 0; s < slots; s++)
        slot_seq[s] = -1;
    for (int i = 0; i < n_seq; i++) {
        users[i] = (seq_user){.salt = (uint32_t)i + 1, .force_alternate = 0};
        for (int k = 0; k < PROMPT; k++)
            prompts[i][k] = (int32_t)(mix((uint32_t)(i * 131 + k)) % VOCAB);
    }
    int next = 0, done = 0, steps = 0;
    long tokens = 0;
    double lat_sum = 0, t0 = now(), c0 = cpu_now();
    while (done < n_seq) {
        while (next < n_seq) {
            tlm_request r = {.prompt = prompts[next],
                             .n_prompt = PROMPT,
                             .mask = bench_mask,
                             .user = &users[next],
                             .max_new_tokens = DECODE,
                             .beam_width = 1};
            int slot = tlm_decoder_add(d, &r, &err);
            if (slot == TLM_ELIMIT) break;
            if (slot < 0) {
                fprintf(stderr, "add: %s\n", err.msg);
                return -1;
            }
            slot_seq[slot] = next;
            t_add[next++] = now();
        }
        if (tlm_decoder_step(d, &err) < 0) {
            fprintf(stderr, "step: %s\n", err.msg);
            return -1;
        }
        steps++;
        for (int s = 0; s < slots; s++) {
            if (slot_seq[s] < 0 || tlm_decoder_state(d, s) == TLM_SLOT_ACTIVE) continue;
            int n = 0;
            if (tlm_decoder_result(d, s, 0, NULL, &n, NULL, &err)) {
                fprintf(stderr, "result: %s\n", err.msg);
                return -1;
            }
            tokens += n;
            lat_sum += now() - t_add[slot_seq[s]];
            tlm_decoder_release(d, s);
            slot_seq[s] = -1;
            done++;
        }
    }
    double dt = now() - t0;
    res->cpu_ms_tok = 1e3 * (cpu_now() - c0) / (double)tokens;
    res->tok_s = (double)tokens / dt;
    res->seq_s = n_seq / dt;
    res->latency_ms = 1e3 * lat_sum / n_seq;
    res->step_ms = 1e3 * dt / steps;
    free(prompts);
    free(users);
    free(t_add);
    free(slot_seq);
    tlm_decoder_free(d);
    return 0;
}

/* One sequence alone (every other decoded token forced, or none): CPU seconds. */
static double run_one(const tlm_model *m, int force_alternate)
{
    tlm_decoder *d;
    if (tlm_decoder_new(m, 1, &d, NULL)) return -1;
    int32_t prompt[PROMPT];
    for (int k = 0; k < PROMPT; k++)
        prompt[k] = (int32_t)(mix((uint32_t)k + 7) % VOCAB);
    seq_user u = {.salt = 99, .force_alternate = force_alternate};
    tlm_request r = {.prompt = prompt,
                     .n_prompt = PROMPT,
                     .mask = bench_mask,
                     .user = &u,
                     .max_new_tokens = DECODE,
                     .beam_width = 1};
    double c0 = cpu_now();
    if (tlm_decoder_add(d, &r, NULL) < 0 || tlm_decoder_run(d, NULL)) return -1;
    double dt = cpu_now() - c0;
    tlm_decoder_free(d);
    return dt;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *out_path = argc > 1 ? argv[1] : "bench/results/tlm_decode.md";
    struct {
        const char *name;
        tlm_config cfg;
    } models[2] = {
        {"2M", {.n_layer = 8, .n_head = 4, .n_embd = 128, .n_ctx = 128, .vocab_size = VOCAB}},
        {"10M", {.n_layer = 12, .n_head = 8, .n_embd = 256, .n_ctx = 128, .vocab_size = VOCAB}},
    };
    enum { NB = 5 };
    const int batches[NB] = {1, 4, 16, 32, 64};
    const int max_thr = omp_get_max_threads();
    const int threads[2] = {1, max_thr};
    const int n_thr = max_thr > 1 ? 2 : 1;
    char load0[64], load1[64];
    loadavg(load0, sizeof load0);
    static char table[16384], forced_lines[2048];
    int tl = 0, fl = 0;
    tl += snprintf(table + tl, sizeof table - tl,
                   "| model | params | threads | batch | tokens/s | sequences/s | latency/seq ms "
                   "| ms/step | CPU ms/token |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int mi = 0; mi < 2; mi++) {
        tlm_model *m;
        tlm_error err = {0};
        if (tlm_model_init_random(&models[mi].cfg, NULL, 1, &m, &err)) {
            fprintf(stderr, "model: %s\n", err.msg);
            return 1;
        }
        for (int ti = 0; ti < n_thr; ti++) {
            /* the bench owns its process (tlm itself never sets the pool) */
            omp_set_num_threads(threads[ti]);
            result warm;
            run_batch(m, 4, 4, &warm);
            for (int bi = 0; bi < NB; bi++) {
                int B = batches[bi], n_seq = B < 4 ? 4 : 2 * B;
                double v[5][3];
                for (int rep = 0; rep < 3; rep++) {
                    result r;
                    if (run_batch(m, B, n_seq, &r)) return 1;
                    v[0][rep] = r.tok_s;
                    v[1][rep] = r.seq_s;
                    v[2][rep] = r.latency_ms;
                    v[3][rep] = r.step_ms;
                    v[4][rep] = r.cpu_ms_tok;
                }
                for (int k = 0; k < 5; k++)
                    qsort(v[k], 3, sizeof(double), cmp_d);
                tl += snprintf(table + tl, sizeof table - tl,
                               "| %s | %.2fM | %d | %d | %.0f | %.1f | %.1f | %.2f | %.3f |\n",
                               models[mi].name, m->n_params / 1e6, threads[ti], B, v[0][1], v[1][1],
                               v[2][1], v[3][1], v[4][1]);
                printf("%-4s thr=%d B=%-3d %8.0f tok/s %7.1f seq/s  latency %8.1f ms  "
                       "step %7.2f ms  cpu %.3f ms/tok\n",
                       models[mi].name, threads[ti], B, v[0][1], v[1][1], v[2][1], v[3][1],
                       v[4][1]);
                fflush(stdout);
            }
            double f[3], u[3];
            for (int rep = 0; rep < 3; rep++) {
                f[rep] = run_one(m, 1);
                u[rep] = run_one(m, 0);
            }
            qsort(f, 3, sizeof(double), cmp_d);
            qsort(u, 3, sizeof(double), cmp_d);
            fl += snprintf(forced_lines + fl, sizeof forced_lines - fl,
                           "- %s, %d thread(s), one sequence alone, CPU time: %.1f ms with "
                           "every other token forced (15 forward steps), %.1f ms without "
                           "(30 steps)\n",
                           models[mi].name, threads[ti], 1e3 * f[1], 1e3 * u[1]);
        }
        tlm_model_free(m);
    }
    loadavg(load1, sizeof load1);
    char env[320];
    snprintf(env, sizeof env,
             "Matrix products: tlm_gemm, %s path; 1-minute load average %s at start, %s at end "
             "(%ld CPUs)",
             tlm_gemm_isa_name(tlm_gemm_get_isa()), load0, load1, sysconf(_SC_NPROCESSORS_ONLN));
    printf("%s\n%s", env, forced_lines);

    FILE *f = fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    fprintf(f,
            "# tlm_decode: GPT-2 runtime decoding on the CPU\n\n"
            "Vocabulary %d, prompt %d tokens, %d decoded tokens per sequence, greedy under a "
            "random mask allowing ~10%% of the vocabulary; decoder slots (batch) kept full by "
            "continuous batching; medians of 3 runs. Latency/seq: admission to completion "
            "(prefill included). ms/step: wall time per decoder step. CPU ms/token: process "
            "CPU time (all threads) per decoded token, the figure least disturbed by other "
            "jobs on the machine. %s.\n\n%s\n%s",
            VOCAB, PROMPT, DECODE, env, table, forced_lines);
    fclose(f);
    printf("wrote %s\n", out_path);
    return 0;
}
