/* features.c — what the cost model sees of a schedule (see tune.h). */
#include <math.h>
#include <string.h>

#include "compiler/tune/tune.h"

static float lg(double v)
{
    return v > 0 ? (float)log2(v) : -1.0f;
}

int tune_features(const space *sp, const space_sched *s, float *f)
{
    int n = 0;
#define PUT(v)                                                                                     \
    do {                                                                                           \
        if (n < TUNE_MAX_FEATURES) f[n] = (v);                                                     \
        n++;                                                                                       \
    } while (0)
    /* the decisions themselves */
    for (int i = 0; i < sp->n_slot; i++) PUT(lg(1.0 + (double)(i < s->n ? s->v[i] : 0)));
    const ir_stage *a = &sp->g->stage[sp->g->anchor];
    bool tiles = sp->sketch == SKETCH_CPU_TILE || sp->sketch == SKETCH_GPU_TILE;
    if (tiles) {
        /* every tile factor, the quotient level included */
        int naxes = sp->n_spatial + sp->n_reduce;
        for (int x = 0; x < naxes; x++) {
            int levels = x < sp->n_spatial ? sp->s_levels : sp->r_levels;
            for (int l = 0; l < levels; l++) PUT(lg((double)space_tile(sp, s, x, l)));
        }
        /* products over the spatial axes per level (level 0: outer tasks; last: the register
         * tile or the thread's inner tile), reduction chunks, padding waste */
        for (int l = 0; l < sp->s_levels; l++) {
            double p = 1;
            for (int x = 0; x < sp->n_spatial; x++) p *= (double)space_tile(sp, s, x, l);
            PUT(lg(p));
        }
        for (int l = 0; l < sp->r_levels; l++) {
            double p = 1;
            for (int x = sp->n_spatial; x < naxes; x++) p *= (double)space_tile(sp, s, x, l);
            PUT(lg(p));
        }
        double padded = 1, real = 1;
        for (int x = 0; x < sp->n_spatial; x++) {
            padded *= (double)space_padded_extent(sp, s, x);
            real *= (double)a->extent[x];
        }
        PUT((float)(padded / (real > 0 ? real : 1)));
    }
    if (sp->sketch == SKETCH_CPU_TILE) {
        int64_t par = space_get(sp, s, SLOT_PARALLEL, 0);
        double tasks = 1, acc = 1, reg = 1;
        for (int x = 0; x < sp->n_spatial; x++) {
            tasks *= (double)space_tile(sp, s, x, 0) * (par >= 2 ? space_tile(sp, s, x, 1) : 1);
            acc *= (double)(space_tile(sp, s, x, 2) * space_tile(sp, s, x, 3));
            reg *= (double)space_tile(sp, s, x, 3);
        }
        int vaxis = space_cpu_vec_axis(sp, s, sp->n_slot);
        bool vec = space_get(sp, s, SLOT_VECTORIZE, 0) != 0;
        int64_t vlen = space_tile(sp, s, vaxis, 3);
        int lanes = space_cpu_tile_lanes(sp, vlen, vec);
        double regs = reg / (lanes > 0 ? lanes : 1);
        double kin = 1;
        for (int x = sp->n_spatial; x < sp->n_spatial + sp->n_reduce; x++)
            kin *= (double)space_tile(sp, s, x, 1);
        PUT(par ? lg(tasks) : -1.0f);                      /* parallel tasks */
        PUT(lg(regs));                                     /* vector registers of the tile */
        PUT((float)lanes);                                 /* lanes of the vector axis */
        PUT(lg(acc * 4));                                  /* accumulator block bytes */
        PUT(lg(acc * kin * 4));                            /* block x chunk footprint */
        PUT(lg(1.0 + (double)space_cpu_pack_floats(sp, s, sp->n_slot) * 4));
        PUT((float)(vaxis == sp->n_spatial - 1));          /* vectorised along the last axis */
    } else if (sp->sketch == SKETCH_GPU_TILE) {
        double threads = 1, regs = 1, blocks = 1;
        for (int x = 0; x < sp->n_spatial; x++) {
            threads *= (double)space_tile(sp, s, x, 2);
            regs *= (double)(space_tile(sp, s, x, 1) * space_tile(sp, s, x, 3) *
                             space_tile(sp, s, x, 4));
            blocks *= (double)space_tile(sp, s, x, 0);
        }
        PUT(lg(threads));
        PUT(lg(regs));
        PUT(lg(blocks));
        PUT(lg(1.0 + (double)space_gpu_smem_bytes(sp, s)));
    } else {
        int64_t rows = space_get(sp, s, SLOT_ROWS, 1);
        PUT(lg((double)(sp->rows / (rows > 0 ? rows : 1)))); /* tasks */
    }
#undef PUT
    return n < TUNE_MAX_FEATURES ? n : TUNE_MAX_FEATURES;
}
