/* evolve.c — mutation and crossover of schedules through space_legal_values (see tune.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tune/tune.h"

static uint64_t next(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static int below(uint64_t *rng, int n)
{
    return n > 0 ? (int)(next(rng) % (uint64_t)n) : 0;
}

/* The legal value nearest to want (log distance; ties to the smaller). */
static int64_t nearest(const int64_t *vals, int n, int64_t want)
{
    int64_t best = vals[0];
    double bd = INFINITY;
    double lw = log2(1.0 + (double)(want > 0 ? want : 0));
    for (int i = 0; i < n; i++) {
        if (vals[i] == want) return want;
        double d = fabs(log2(1.0 + (double)(vals[i] > 0 ? vals[i] : 0)) - lw);
        if (d < bd) {
            bd = d;
            best = vals[i];
        }
    }
    return best;
}

/* Completes out from slot `from` on: slot i takes pick[i] (when pick is not NULL and the
 * value is legal), else alt[i] (when legal), else the legal value nearest pick[i]. */
static void legalise(const space *sp, space_sched *out, int from, const space_sched *pick,
                     const space_sched *alt, int64_t *vals);

void tune_legalise(const space *sp, space_sched *s, int from)
{
    int64_t *vals = malloc(SPACE_MAX_VALUES * sizeof *vals);
    if (!vals) return;
    space_sched pick = *s;
    legalise(sp, s, from, &pick, NULL, vals);
    free(vals);
}

static void legalise(const space *sp, space_sched *out, int from, const space_sched *pick,
                     const space_sched *alt, int64_t *vals)
{
    out->n = sp->n_slot;
    for (int i = from; i < sp->n_slot; i++) {
        int nv = space_legal_values(sp, i, out, vals);
        if (nv <= 0) {
            out->v[i] = 1;
            continue;
        }
        int64_t want = pick->v[i];
        bool ok = false, ok_alt = false;
        for (int k = 0; k < nv; k++) {
            if (vals[k] == want) ok = true;
            if (alt && vals[k] == alt->v[i]) ok_alt = true;
        }
        out->v[i] = ok ? want : ok_alt ? alt->v[i] : nearest(vals, nv, want);
    }
}

void tune_mutate(const space *sp, const space_sched *in, uint64_t *rng, space_sched *out)
{
    int64_t *vals = malloc(SPACE_MAX_VALUES * sizeof *vals);
    *out = *in;
    out->n = sp->n_slot;
    if (!vals || sp->n_slot == 0) {
        free(vals);
        return;
    }
    /* a slot with a choice: try a few, then give up (a space of one schedule) */
    for (int tries = 0; tries < 16; tries++) {
        int i = below(rng, sp->n_slot);
        int nv = space_legal_values(sp, i, out, vals);
        if (nv <= 1) continue;
        /* another value: half the time a neighbour of the current one (local steps), else
         * any legal one */
        int cur = -1;
        for (int k = 0; k < nv; k++)
            if (vals[k] == in->v[i]) cur = k;
        int pick;
        if (cur >= 0 && (next(rng) & 1)) {
            pick = cur + ((next(rng) & 1) ? 1 : -1);
            if (pick < 0) pick = 1;
            if (pick >= nv) pick = nv - 2;
        } else {
            do pick = below(rng, nv);
            while (pick == cur);
        }
        out->v[i] = vals[pick];
        legalise(sp, out, i + 1, in, NULL, vals);
        break;
    }
    free(vals);
}

void tune_crossover(const space *sp, const space_sched *a, const space_sched *b, uint64_t *rng,
                    space_sched *out)
{
    int64_t *vals = malloc(SPACE_MAX_VALUES * sizeof *vals);
    if (!vals) {
        *out = *a;
        return;
    }
    space_sched pick, alt;
    pick.n = alt.n = sp->n_slot;
    for (int i = 0; i < sp->n_slot; i++) {
        bool from_a = next(rng) & 1;
        pick.v[i] = from_a ? a->v[i] : b->v[i];
        alt.v[i] = from_a ? b->v[i] : a->v[i];
    }
    memset(out, 0, sizeof *out);
    legalise(sp, out, 0, &pick, &alt, vals);
    free(vals);
}

uint64_t tune_sched_hash(const space_sched *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < s->n; i++) {
        uint64_t v = (uint64_t)s->v[i];
        for (int b = 0; b < 8; b++) {
            h ^= (v >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h ^ (uint64_t)s->n;
}
