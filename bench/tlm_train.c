/* tlm_train — CPU training throughput of the TLM trainer (compiler/tlm/train.c).
 *
 * The model of issue 12's first runs: L=4, C=128, NH=4, T=256, V = the tensor language's
 * vocabulary (lang_vocab_size()); batches of 16 random sentences of 130 to 170 tokens (about
 * 150), a 40-token prompt without loss, the rest trained. Reported per thread count (1, then
 * all): ms per optimizer step, tokens/s through the model (all
 * rows) and trained tokens/s, and the process CPU time per token, for OpenMP and OpenBLAS
 * thread counts of 1 and all, each combination. Medians of the timed steps
 * after 2 warm-up steps. A busy machine shows in the wall times; the CPU time per token is the
 * figure that transfers.
 *
 * Run: build/bench/tlm_train [steps] [results.md]
 * Writes bench/results/tlm_train.md unless another path is given.
 */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/lang/lang.h"
#include "compiler/tlm/train.h"

#define BATCH 16
#define PROMPT 40

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 6;
    const char *out_path = argc > 2 ? argv[2] : "bench/results/tlm_train.md";
    if (steps < 1) steps = 1;
    tlm_config cfg = {
        .n_layer = 4, .n_head = 4, .n_embd = 128, .n_ctx = 256, .vocab_size = lang_vocab_size()};
    tlm_model *m;
    tlm_error err = {0};
    if (tlm_model_init_random(&cfg, NULL, 1, &m, &err)) {
        fprintf(stderr, "tlm_train: %s\n", err.msg);
        return 1;
    }
    uint64_t s = 12345;
    int32_t *tok = malloc(sizeof(int32_t) * BATCH * cfg.n_ctx);
    tlm_train_example ex[BATCH];
    long rows = 0;
    for (int i = 0; i < BATCH; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int n = 130 + (int)((s >> 33) % 41);
        for (int t = 0; t < n; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[i * cfg.n_ctx + t] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab_size);
        }
        ex[i] = (tlm_train_example){
            .tokens = tok + i * cfg.n_ctx, .n = n, .n_prompt = PROMPT, .weight = 1.0f};
        rows += n;
    }
    FILE *out = fopen(out_path, "w");
    if (!out) {
        perror(out_path);
        return 1;
    }
    char load[128] = "?";
    FILE *la = fopen("/proc/loadavg", "r");
    if (la && fgets(load, sizeof load, la)) load[strcspn(load, "\n")] = 0;
    if (la) fclose(la);
    fprintf(out, "# TLM trainer throughput (bench/tlm_train.c)\n\n");
    fprintf(out,
            "Model L=%d C=%d NH=%d T=%d V=%d (%zu parameters); batch %d sentences, %ld tokens "
            "(130-170 each, %d-token prompt without loss); medians of %d steps after 2 warm-up "
            "steps. Load average at start: %s.\n\n",
            cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_ctx, cfg.vocab_size, m->n_params, BATCH,
            rows, PROMPT, steps, load);
    fprintf(out, "| OpenMP threads | OpenBLAS threads | ms/step | tokens/s | trained tokens/s | "
                 "CPU ms per 1k tokens |\n");
    fprintf(out, "|---|---|---|---|---|---|\n");
    printf("omp blas  ms/step  tokens/s  trained/s  cpu-ms/1k-tok\n");
    int nmax = omp_get_max_threads();
    int omp_n[4] = {1, nmax, 1, nmax}, blas_n[4] = {1, 1, nmax, nmax};
    for (int ti = 0; ti < (nmax > 1 ? 4 : 1); ti++) {
        omp_set_num_threads(omp_n[ti]);
        openblas_set_num_threads(blas_n[ti]);
        tlm_train_opts o;
        tlm_train_opts_default(&o);
        tlm_trainer *tr;
        if (tlm_trainer_new(m, &o, &tr, &err)) {
            fprintf(stderr, "tlm_train: %s\n", err.msg);
            return 1;
        }
        double *wall = malloc(sizeof(double) * steps), *cpu = malloc(sizeof(double) * steps);
        tlm_train_stats st = {0};
        for (int i = 0; i < steps + 2; i++) {
            double t0 = now(), c0 = cpu_now();
            if (tlm_trainer_step(tr, ex, BATCH, &st, &err)) {
                fprintf(stderr, "tlm_train: %s\n", err.msg);
                return 1;
            }
            if (i >= 2) {
                wall[i - 2] = now() - t0;
                cpu[i - 2] = cpu_now() - c0;
            }
        }
        qsort(wall, (size_t)steps, sizeof(double), cmp_double);
        qsort(cpu, (size_t)steps, sizeof(double), cmp_double);
        double w = wall[steps / 2], c = cpu[steps / 2];
        printf("%3d %4d  %7.1f  %8.0f  %9.0f  %13.2f   (loss %.3f)\n", omp_n[ti], blas_n[ti],
               1e3 * w, (double)st.rows / w, (double)st.tokens / w, 1e6 * c / (double)st.rows,
               st.loss);
        fprintf(out, "| %d | %d | %.1f | %.0f | %.0f | %.2f |\n", omp_n[ti], blas_n[ti], 1e3 * w,
                (double)st.rows / w, (double)st.tokens / w, 1e6 * c / (double)st.rows);
        free(wall);
        free(cpu);
        tlm_trainer_free(tr);
    }
    fclose(out);
    printf("table in %s\n", out_path);
    free(tok);
    tlm_model_free(m);
    return 0;
}
