/* cpu.c — C code generation for CPU targets (CPU_TILE and CPU_ROWS sketches) and the naive
 * baseline; cg_generate dispatches here or to cuda.c.
 *
 * CPU_TILE emits, per outer task (fused s0 [and s1] tiles, OpenMP parallel):
 *     acc[s2*s3 block] = init
 *     for r0: for s2: { load register tile from acc; for r1: tile += body; store back }
 *     for s2, s3: out = epilogue(acc * post_scale)
 * The register tile (s3 of every spatial axis) is spelled out statement by statement in GCC
 * vector-extension types along the last spatial axis, so the accumulators live in registers
 * and every load is classified once at generation time as broadcast, contiguous vector, or
 * strided gather. Selects whose condition moves with the vector lanes (padding on the
 * innermost axis) get a run-time "all lanes inside" test with a lane-wise fallback; a padded
 * input the register tile reads unpacked is copied once per call with its padding written in
 * (plan_padcopies) when the work outweighs the copy, and its selects become plain loads.
 */
#include "compiler/codegen/codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Vectorisable exp and erf (branch-free, exponent bits through memcpy) so that GCC's
 * vectoriser handles softmax, norms and gelu/silu epilogues without -ffast-math, which we
 * refuse because it changes NaN and infinity semantics. Max relative error ~2e-7 (exp) and
 * ~5e-7 absolute (erf), far inside the 1e-4 check.
 *
 * erf is a rational function of x^2 on |x| <= 3.92 (beyond it erf is +-1 in float): x P(x^2)
 * / Q(x^2), P of degree 6 and Q of degree 4, fitted here (weighted least squares iterated
 * toward minimax on the absolute error; 4e-7 in float arithmetic, 8.6e-7 on gelu over
 * [-8, 8]). Eleven FMAs and one division and no exp: gelu over 64K floats on one core went
 * from 1.34 to 0.90 ns a value (AVX2; AVX-512 0.72 -> 0.49) against Abramowitz & Stegun
 * 7.1.26, whose division and exp cost half as much again. Outside the interval erf is
 * exactly +-1 (the quotient there is one ulp short of 1, and gelu(-1e10) = -1e10 * (1 + erf) / 2
 * must be 0, gelu(-inf) NaN, as in the reference); a NaN passes through as NaN. */
static const char *c_prelude =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "\n"
    "static inline float tlm_expf(float x)\n"
    "{\n"
    "    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);\n"
    "    /* round to nearest by the 1.5*2^23 trick: vectorises, unlike roundf */\n"
    "    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;\n"
    "    float r = x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;\n"
    "    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666716f\n"
    "              + r * (0.00833333377f + r * 0.00138888892f)))));\n"
    "    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n; memcpy keeps it vectorisable */\n"
    "    float scale;\n"
    "    memcpy(&scale, &bits, sizeof scale);\n"
    "    return p * scale;\n"
    "}\n"
    "/* 1 / d for d >= 1 without a division, for silu: written x / (1 + exp(-x)) (or with\n"
    " * 1 / that), silu measured 10x slower than sigmoid's 1 / (1 + exp(-x)) in the same\n"
    " * vectorised loop (a 256K-point silu: 0.37 ms against 0.04 ms this way; a yolov5s conv\n"
    " * with a silu epilogue 2.5 -> 1.9 ms). The exponent-flipping guess (within 12 %) and three\n"
    " * Newton steps, ~1 ulp. Above 1e37 the quotient is 0 (exactly below 1e-37, where the\n"
    " * reference's x / (1 + exp(-x)) underflows or meets an infinity: silu(-inf) is NaN, as\n"
    " * there); a NaN d gives NaN. */\n"
    "static inline float tlm_rcp1(float d)\n"
    "{\n"
    "    float c = d > 1e37f ? 1e37f : d;\n"
    "    int32_t i;\n"
    "    memcpy(&i, &c, sizeof i);\n"
    "    i = 0x7EF311C3 - i;\n"
    "    float r;\n"
    "    memcpy(&r, &i, sizeof r);\n"
    "    r = r * (2.0f - c * r);\n"
    "    r = r * (2.0f - c * r);\n"
    "    r = r * (2.0f - c * r);\n"
    "    return d > 1e37f ? 0.0f : r;\n"
    "}\n"
    "static inline float tlm_erff(float x)\n"
    "{\n"
    "    const float z = x * x;\n"
    "    float p = 1.99215702e-08f;\n"
    "    p = p * z - 1.99430701e-06f;\n"
    "    p = p * z + 1.48986626e-04f;\n"
    "    p = p * z + 3.97286843e-03f;\n"
    "    p = p * z + 5.13971820e-02f;\n"
    "    p = p * z + 2.06113547e-01f;\n"
    "    p = p * z + 1.12837875f;\n"
    "    float q = 1.02411979e-03f;\n"
    "    q = q * z + 1.48891611e-02f;\n"
    "    q = q * z + 1.17564276e-01f;\n"
    "    q = q * z + 5.15992165e-01f;\n"
    "    q = q * z + 1.0f;\n"
    "    /* outside the interval the quotient (NaN at infinities) is not taken */\n"
    "    return x < -3.92f ? -1.0f : (x > 3.92f ? 1.0f : x * p / q);\n"
    "}\n"
    "/* max/min as compares, not fmaxf (a libm call without -ffinite-math-only); a NaN\n"
    " * in the second operand propagates, as in the reference interpreter */\n"
    "/* a max reduction's step, acc = tlm_max(acc, v): a NaN, once seen, stays (the reference's\n"
    " * v > acc || isnan(v)) */\n"
    "static inline float tlm_max(float a, float b) { return a > b || a != a ? a : b; }\n"
    "static inline float tlm_min(float a, float b) { return a < b ? a : b; }\n"
    "static inline float tlm_relu(float x) { return x > 0.0f ? x : 0.0f; }\n"
    "static inline float tlm_relu6(float x) { return x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x); }\n"
    "static inline float tlm_gelu(float x) { return 0.5f * x * (1.0f + tlm_erff(x * 0.70710678118654752f)); }\n"
    "static inline float tlm_sigmoid(float x) { return 1.0f / (1.0f + tlm_expf(-x)); }\n"
    "static inline float tlm_silu(float x) { return x * tlm_rcp1(1.0f + tlm_expf(-x)); }\n"
    "static inline float tlm_tanh(float x) { float e = tlm_expf(-2.0f * (x < 0.0f ? -x : x)); float t = (1.0f - e) / (1.0f + e); return x < 0.0f ? -t : t; }\n"
    "static inline float tlm_rsqrt(float x) { return 1.0f / sqrtf(x); }\n"
    "static inline float tlm_recip(float x) { return 1.0f / x; }\n"
    "/* clamps an index of a padded tile into its axis (edge register tiles) */\n"
    "static inline int64_t tlm_imin(int64_t a, int64_t b) { return a < b ? a : b; }\n"
    "static inline int64_t tlm_imax(int64_t a, int64_t b) { return a > b ? a : b; }\n"
    "#define expf tlm_expf\n"
    "#define tanhf tlm_tanh\n"
    "\n";

typedef struct {
    const space *sp;
    const space_sched *s;
    const ir_subgraph *g;
    const ir_stage *a;
    int ns, nr, x;             /* spatial count, reduction count, vectorised axis */
    int64_t T[IR_MAX_AXES][5]; /* tile factors per axis and level */
    int W;                     /* vector lanes of the register tile (1 = scalar) */
    int64_t E[IR_MAX_AXES];    /* extents */
    bool pad[IR_MAX_AXES];     /* the axis' tiles overshoot its extent (padded tiles) */
    bool rtail[IR_MAX_AXES];   /* a reduction axis whose last chunk is shorter (r1 < r1_n) */
    bool any_pad;
    bool edge;  /* emitting the edge register tile: spatial indices are clamped */
    bool raw_x; /* ... except the vector axis' (a masked load bounds its lanes itself) */
    bool interior; /* emitting the interior register tile: padding selects always hold */
    int64_t t3_full[IR_MAX_AXES]; /* register tile sizes while the last tile of an axis is
                                   * emitted shorter (T[][3] then holds its size) */
    bool lbase[IR_MAX_EXPR]; /* broadcast loads read through a base pointer Lb<id> per step */
    bool short_tile; /* emitting the last register tile of an axis at its true size */
    /* a step's vector operands as pinned variables v<k> (emit_regtile_steps): while hoist is
     * set, emit_vec prints each distinct vector load once into vl[] and names it */
    bool hoist;
    int nvl;
    char *vl[16];
    bool masked; /* the kernel uses tlm_vload_range (emit_vec_helpers defines it) */
    bool direct; /* one reduction chunk: each register tile starts from zero and is stored
                  * to the output (with the epilogue) as soon as it is done */
    bool fresh;  /* one reduction chunk: each register tile starts from zero (direct, or
                  * stored to the block, which is then not cleared first) */
    bool stream; /* ... and its rows go out with non-temporal stores (tile_stream) */
    bool tstream; /* the transposed copy-out's whole lines go out non-temporally */
    cg_buf b;
    cg_names nm;
    char axbuf[IR_MAX_AXES][48];
    /* packed operands (SLOT_PACK): buffer per node, indexed [r1 of its reduction axes]
     * [s2*s3 block of its spatial axes], both in axis order */
    int npack;
    int pack_id[IR_MAX_EXPR];
    unsigned pack_mask[IR_MAX_EXPR];
    int64_t pack_str[IR_MAX_EXPR][IR_MAX_AXES];
    int64_t pack_size[IR_MAX_EXPR];
    /* a packed operand that 4 or more tasks read is packed once per call, before the task
     * loop, into G<i> (pack_blocks panels of pack_stride floats, one per (s0, s1) block of
     * its spatial axes and r0 chunk of its reduction axes) when it fits half an L2 or each
     * task would spend a large share of its time packing it (a conv's weights under every
     * output row). Others are packed by each task, where the panel is hot when used (a
     * GEMM's B, packed once, would be read back from L3: measured slower). See plan_packs. */
    bool pack_glob[IR_MAX_EXPR];
    int64_t pack_blocks[IR_MAX_EXPR];
    int64_t pack_stride[IR_MAX_EXPR];
    /* the task-packed operand whose panel each thread keeps across its tasks (plan_keep; -1:
     * none): K<i>, keep_chunks r0 chunks of pack_size floats, repacked only when a task's
     * panel differs from the last one this thread packed; the tasks then run with the axes
     * that do not index the panel fastest, so consecutive tasks share it */
    int keep_pi;
    int64_t keep_chunks;
    /* packs a caller may hand in already packed (plan_prepacks): pack pi is prepack
     * pre_k[pi] (-1: none), a copy of input argument pre_arg[k] in the global layout above
     * (pack_blocks x pack_stride floats), passed as tlm_pre[k] to <entry>_prepacked */
    int npre;
    int pre_k[IR_MAX_EXPR], pre_pi[IR_MAX_EXPR], pre_arg[IR_MAX_EXPR];
    /* padded copies (plan_padcopies): tensor pad_src[i] copied once per call, before the
     * task loop, into tensor pad_dst[i] of gpad with the padding written in (pad_lo[i][d]
     * leading points on dim d, filled with pad_fill[i]); c->g and c->a then point into gpad,
     * where the padding selects that read it are plain loads */
    ir_subgraph *gpad;
    int npad;
    int pad_src[IR_MAX_TENSORS], pad_dst[IR_MAX_TENSORS];
    int64_t pad_lo[IR_MAX_TENSORS][IR_MAX_DIMS];
    double pad_fill[IR_MAX_TENSORS];
    /* the operand whose next task's block each task requests ahead (next_task_load; -1:
     * none), and how many tile levels the task loop fuses */
    int nt_load, fused_levels;
} cgc;

/* Floats a call may pack ahead of its task loop (all global panels together): 64 MiB. */
#define CPU_PACK_GLOBAL_MAX (16ll << 20)

static bool affine_eq(const ir_affine *p, const ir_affine *q, int n)
{
    if (p->off != q->off) return false;
    for (int x = 0; x < n; x++)
        if (p->coef[x] != q->coef[x]) return false;
    return true;
}

static int pack_index(const cgc *c, int id)
{
    for (int i = 0; i < c->npack; i++)
        if (c->pack_id[i] == id) return i;
    return -1;
}

static void params_and_packed(cgc *c, const char *entry, int body_indent)
{
    (void)body_indent;
    cg_printf(&c->b, "void %s(", entry);
    cg_emit_params(&c->b, c->g, &c->nm, false);
    cg_printf(&c->b, ")\n");
}

/* "(const float *)args[0], ..., (float *)args[n]": the kernel's arguments from an array */
static void emit_args_from_array(cg_buf *b, const ir_subgraph *g)
{
    int in[IR_MAX_TENSORS];
    int n = ir_subgraph_inputs(g, in);
    for (int i = 0; i < n; i++) cg_printf(b, "(const float *)args[%d], ", i);
    cg_printf(b, "(float *)args[%d]", n);
}

static void emit_packed(cg_buf *b, const ir_subgraph *g, const char *entry)
{
    cg_printf(b, "\n");
    cg_line(b, 0, "void %s_packed(void *const *args)", entry);
    cg_line(b, 0, "{");
    cg_printf(b, "    %s(", entry);
    emit_args_from_array(b, g);
    cg_printf(b, ");\n");
    cg_line(b, 0, "}");
}

/* Applies the epilogue stages to variable `v` (declared by the caller) and stores it, at the
 * output's identity index or at `dest` when given. The anchor's axis expressions are in
 * c->nm.axis. */
static void emit_store(cg_buf *b, const ir_subgraph *g, int ind, cg_names *nm);
static void emit_output_ref(cg_buf *b, const ir_subgraph *g, cg_names *nm);

static void emit_epilogue_store(cg_buf *b, const ir_subgraph *g, int ind, cg_names *nm,
                                const char *dest)
{
    const ir_stage *anc = &g->stage[g->anchor];
    int prev = anc->out;
    for (int i = g->anchor + 1; i < g->n_stage; i++) {
        const ir_stage *st = &g->stage[i];
        cg_names en = *nm;
        en.expr_var = NULL; /* indexed by the anchor's expressions, not this stage's */
        en.recip_var = NULL;
        en.subst_tensor = prev;
        en.subst_var = "v";
        cg_printf(b, "%*sv = ", ind * 4, "");
        cg_emit_scalar(b, g, st, st->body, &en);
        cg_printf(b, ";\n");
        prev = st->out;
    }
    if (dest) {
        cg_line(b, ind, "%s = v;", dest);
        return;
    }
    emit_store(b, g, ind, nm);
}

/* Stores `v` at the identity index of the output (the anchor's spatial axes). */
static void emit_store(cg_buf *b, const ir_subgraph *g, int ind, cg_names *nm)
{
    cg_printf(b, "%*s", ind * 4, "");
    emit_output_ref(b, g, nm);
    cg_printf(b, " = v;\n");
}

/* tensor[point]: at the identity index of the anchor's spatial axes (names in nm), for the
 * output or a tensor of its shape indexed as it is (twin_inputs) */
static void emit_point_ref(cg_buf *b, const ir_subgraph *g, int tensor, cg_names *nm)
{
    ir_expr st;
    memset(&st, 0, sizeof st);
    st.kind = IR_E_LOAD;
    st.tensor = tensor;
    for (int d = 0; d < g->tensor[tensor].ndim; d++) st.idx[d].coef[d] = 1;
    cg_printf(b, "%s[", g->tensor[tensor].name);
    cg_emit_offset(b, g, &g->stage[g->anchor], &st, nm);
    cg_printf(b, "]");
}

/* `out[i]`: the output at that point */
static void emit_output_ref(cg_buf *b, const ir_subgraph *g, cg_names *nm)
{
    emit_point_ref(b, g, g->output, nm);
}

/* The inputs the epilogue reads at the output's own points (a residual add's, a mul's: the
 * output's shape, dim d indexed by axis d alone), at most max, each once: their tensors */
static int twin_inputs(const ir_subgraph *g, int *ids, int max)
{
    const ir_tensor *o = &g->tensor[g->output];
    int n = 0;
    for (int i = g->anchor + 1; i < g->n_stage; i++) {
        const ir_stage *st = &g->stage[i];
        for (int e = 0; e < st->n_expr; e++) {
            const ir_expr *x = &st->expr[e];
            if (x->kind != IR_E_LOAD || g->tensor[x->tensor].kind != IR_T_INPUT) continue;
            const ir_tensor *t = &g->tensor[x->tensor];
            bool twin = t->ndim == o->ndim;
            for (int d = 0; twin && d < t->ndim; d++) {
                twin = t->shape[d] == o->shape[d] && x->idx[d].off == 0;
                for (int ax = 0; twin && ax < IR_MAX_AXES; ax++)
                    twin = x->idx[d].coef[ax] == (ax == d);
            }
            for (int k = 0; twin && k < n; k++)
                twin = ids[k] != x->tensor;
            if (twin && n < max) ids[n++] = x->tensor;
        }
    }
    return n;
}

/* ---- CPU_TILE ---- */

static const char *full_index(cgc *c, int a, char *buf, size_t cap)
{
    const char *n = c->a->axis[a];
    bool sp = a < c->ns;
    int L = sp ? 4 : 2;
    /* ((a0 * T1 + a1) * T2 + a2) * T3 + a3 */
    size_t len = 0;
    for (int l = 1; l < L; l++) len += (size_t)snprintf(buf + len, cap - len, "(");
    len += (size_t)snprintf(buf + len, cap - len, "%s0", n);
    for (int l = 1; l < L; l++)
        len += (size_t)snprintf(buf + len, cap - len, " * %lld + %s%d)", (long long)c->T[a][l], n, l);
    return buf;
}

/* Flat coefficient of axis x in the offset of a load. */
static int64_t flat_coef(const ir_subgraph *g, const ir_expr *e, int x)
{
    int64_t st[IR_MAX_DIMS];
    cg_strides(&g->tensor[e->tensor], st);
    int64_t r = 0;
    for (int d = 0; d < g->tensor[e->tensor].ndim; d++) r += e->idx[d].coef[x] * st[d];
    return r;
}

/* Axis names for the register tile point (o[a] = offset inside s3; lane added for x). */
static void point_names(cgc *c, const int64_t *o, int lane, cg_names *nm)
{
    *nm = c->nm;
    for (int a = 0; a < c->ns; a++) {
        int64_t off = o[a] + (a == c->x ? lane : 0);
        if (c->edge && c->pad[a] && !(c->raw_x && a == c->x))
            snprintf(c->axbuf[a], sizeof c->axbuf[a], "tlm_imin(%s_b + %lld, %lld)", c->a->axis[a],
                     (long long)off, (long long)(c->E[a] - 1));
        else
            snprintf(c->axbuf[a], sizeof c->axbuf[a], "(%s_b + %lld)", c->a->axis[a],
                     (long long)off);
        nm->axis[a] = c->axbuf[a];
    }
    for (int a = c->ns; a < c->ns + c->nr; a++) nm->axis[a] = c->a->axis[a];
}

/* A padding select whose lanes form one contiguous run: the load is contiguous along the
 * vector axis, the value outside is a constant (0 for a conv's zero padding, -inf for a max
 * pool's), and every bound check moves with the lanes at stride 1 or not at all. */
static bool range_select(const cgc *c, const ir_expr *e)
{
    const ir_stage *s = c->a;
    const ir_expr *ld = &s->expr[e->a], *z = &s->expr[e->b];
    if (ld->kind != IR_E_LOAD || z->kind != IR_E_CONST) return false;
    if (flat_coef(c->g, ld, c->x) != 1) return false;
    for (int i = 0; i < e->ncond; i++)
        if (e->cond[i].coef[c->x] != 0 && e->cond[i].coef[c->x] != 1) return false;
    return true;
}

/* The range select as one masked load: lanes l with 0 <= A_i + l < hi_i for the moving checks
 * (A_i at lane 0), within the axis on an edge tile, when the fixed checks hold; masked-off
 * lanes take the fill value and their memory is never touched. */
static void emit_range_select(cgc *c, const ir_expr *e, const int64_t *o)
{
    cg_buf *b = &c->b;
    const ir_stage *s = c->a;
    cg_names nm;
    c->raw_x = true;
    point_names(c, o, 0, &nm);
    c->raw_x = false;
    /* lo = max_i -A_i, hi = min_i hi_i - A_i (the helpers clamp them to [0, W]) */
    cg_buf lb = {0}, hb = {0};
    for (int i = 0; i < e->ncond; i++)
        if (e->cond[i].coef[c->x] != 0) cg_printf(&lb, "tlm_imax(");
    cg_printf(&lb, "INT64_C(0)");
    for (int i = 0; i < e->ncond; i++) {
        if (e->cond[i].coef[c->x] == 0) continue;
        cg_printf(&lb, ", -(");
        cg_emit_affine(&lb, s, &e->cond[i], &nm);
        cg_printf(&lb, "))");
    }
    for (int i = 0; i < e->ncond; i++)
        if (e->cond[i].coef[c->x] != 0) cg_printf(&hb, "tlm_imin(");
    if (c->edge && c->pad[c->x]) /* and inside the axis on an edge tile */
        cg_printf(&hb, "%lld - (%s_b + %lld)", (long long)c->E[c->x], s->axis[c->x],
                  (long long)o[c->x]);
    else
        cg_printf(&hb, "INT64_C(%d)", c->W);
    for (int i = 0; i < e->ncond; i++) {
        if (e->cond[i].coef[c->x] == 0) continue;
        cg_printf(&hb, ", %lld - (", (long long)e->cond_hi[i]);
        cg_emit_affine(&hb, s, &e->cond[i], &nm);
        cg_printf(&hb, "))");
    }
    char *lo = cg_buf_take(&lb), *hi = cg_buf_take(&hb);
    double fill = s->expr[e->b].value;
    char fl[64];
    cg_float_literal(fill, fl, sizeof fl);
    cg_printf(b, "((");
    int fixed = 0;
    for (int i = 0; i < e->ncond; i++) {
        if (e->cond[i].coef[c->x] != 0) continue;
        cg_printf(b, "%s(uint64_t)", fixed++ ? " && " : "");
        cg_emit_affine(b, s, &e->cond[i], &nm);
        cg_printf(b, " < %lluu", (unsigned long long)e->cond_hi[i]);
    }
    cg_printf(b, "%s) ? ", fixed ? "" : "1");
    if (fill != 0.0) cg_printf(b, "tlm_vfill(");
    cg_printf(b, "tlm_vload_range(&%s[", c->nm.tensor[s->expr[e->a].tensor]);
    cg_emit_offset(b, c->g, s, &s->expr[e->a], &nm);
    cg_printf(b, "], %s, %s)", lo ? lo : "0", hi ? hi : "0");
    if (fill != 0.0) cg_printf(b, ", %s, %s, %s)", lo ? lo : "0", hi ? hi : "0", fl);
    cg_printf(b, " : (%s - (tlm_vf){}))", fl);
    free(lo);
    free(hi);
}

static void emit_vec(cgc *c, int id, const int64_t *o)
{
    cg_buf *b = &c->b;
    const ir_stage *s = c->a;
    const ir_expr *e = &s->expr[id];
    cg_names nm;
    point_names(c, o, 0, &nm);
    int pi = pack_index(c, id);
    if (c->hoist && (pi >= 0 || (e->kind == IR_E_LOAD && flat_coef(c->g, e, c->x) == 1 &&
                                 !(c->edge && c->pad[c->x])))) {
        /* a vector operand of the step: loaded once into a pinned variable (below) */
        cg_buf t = c->b;
        memset(&c->b, 0, sizeof c->b);
        c->hoist = false;
        emit_vec(c, id, o);
        c->hoist = true;
        char *text = cg_buf_take(&c->b);
        c->b = t;
        int k = 0;
        while (k < c->nvl && strcmp(c->vl[k], text ? text : "") != 0) k++;
        if (k == c->nvl && c->nvl < (int)(sizeof c->vl / sizeof c->vl[0]) && text) {
            c->vl[c->nvl++] = text;
        } else if (k == c->nvl) { /* no room: read in place */
            cg_printf(b, "%s", text ? text : "");
            free(text);
            return;
        } else {
            free(text);
        }
        cg_printf(b, "v%d", k);
        return;
    }
    if (pi >= 0) {
        cg_printf(b, "(*(const tlm_vfu *)&P%d[", pi);
        bool any = false;
        for (int x = 0; x < c->ns + c->nr; x++) {
            if (!(c->pack_mask[pi] & (1u << x))) continue;
            if (any) cg_printf(b, " + ");
            if (x < c->ns)
                cg_printf(b, "(%s2 * %lld + %lld) * %lld", s->axis[x], (long long)c->t3_full[x],
                          (long long)o[x], (long long)c->pack_str[pi][x]);
            else
                cg_printf(b, "%s1 * %lld", s->axis[x], (long long)c->pack_str[pi][x]);
            any = true;
        }
        cg_printf(b, "%s])", any ? "" : "0");
        return;
    }
    switch (e->kind) {
    /* A broadcast is written s - {0}: exact for every s (-0 - 0 = -0), so GCC drops the
     * subtraction and folds the broadcast into the FMA's memory operand ({1to16} on AVX-512);
     * {0} + s is not s for s = -0, and costs an add and a register per broadcast. */
    case IR_E_CONST:
        cg_printf(b, "((");
        cg_emit_scalar(b, c->g, s, id, &nm);
        cg_printf(b, ") - (tlm_vf){})");
        return;
    case IR_E_LOAD: {
        int64_t d = flat_coef(c->g, e, c->x);
        const char *t = c->nm.tensor[e->tensor];
        if (d == 0 && c->lbase[id]) {
            int64_t delta = 0;
            for (int x = 0; x < c->ns; x++) delta += flat_coef(c->g, e, x) * o[x];
            cg_printf(b, "(Lb%d[%lld] - (tlm_vf){})", id, (long long)delta);
        } else if (d == 0) {
            cg_printf(b, "(%s[", t);
            cg_emit_offset(b, c->g, s, e, &nm);
            cg_printf(b, "] - (tlm_vf){})");
        } else if (c->edge && c->pad[c->x] && d == 1) {
            /* edge tile along the vector axis: the lanes inside the axis, by a masked load
             * (the start is clamped too; a vector wholly past the end loads nothing) */
            cg_printf(b, "tlm_vload_part(&%s[", t);
            cg_emit_offset(b, c->g, s, e, &nm);
            cg_printf(b, "], %lld - (%s_b + %lld))", (long long)c->E[c->x], s->axis[c->x],
                      (long long)o[c->x]);
        } else if (c->edge && c->pad[c->x]) {
            /* edge tile along the vector axis, strided: each lane at its own clamped index */
            cg_printf(b, "((tlm_vf){");
            for (int l = 0; l < c->W; l++) {
                cg_names ln;
                point_names(c, o, l, &ln);
                cg_printf(b, "%s%s[", l ? ", " : "", t);
                cg_emit_offset(b, c->g, s, e, &ln);
                cg_printf(b, "]");
            }
            cg_printf(b, "})");
        } else if (d == 1) {
            cg_printf(b, "(*(const tlm_vfu *)&%s[", t);
            cg_emit_offset(b, c->g, s, e, &nm);
            cg_printf(b, "])");
        } else {
            cg_printf(b, "((tlm_vf){");
            for (int l = 0; l < c->W; l++) {
                cg_printf(b, "%s%s[", l ? ", " : "", t);
                cg_emit_offset(b, c->g, s, e, &nm);
                cg_printf(b, " + %lld]", (long long)(d * l));
            }
            cg_printf(b, "})");
        }
        return;
    }
    case IR_E_UNARY:
        cg_printf(b, "tlm_v_%s(", ir_unop_name((ir_unop)e->op));
        emit_vec(c, e->a, o);
        cg_printf(b, ")");
        return;
    case IR_E_BINARY:
        if (e->op <= IR_B_DIV) {
            static const char *sym[] = {"+", "-", "*", "/"};
            cg_printf(b, "(");
            emit_vec(c, e->a, o);
            cg_printf(b, " %s ", sym[e->op]);
            emit_vec(c, e->b, o);
            cg_printf(b, ")");
        } else {
            cg_printf(b, "tlm_v_%s(", ir_binop_name((ir_binop)e->op));
            emit_vec(c, e->a, o);
            cg_printf(b, ", ");
            emit_vec(c, e->b, o);
            cg_printf(b, ")");
        }
        return;
    case IR_E_SELECT: {
        if (c->interior) { /* every bound check holds inside (emit_interior_test) */
            emit_vec(c, e->a, o);
            return;
        }
        bool lanes_move = false;
        for (int i = 0; i < e->ncond; i++) lanes_move |= e->cond[i].coef[c->x] != 0;
        if (lanes_move && c->masked && range_select(c, e)) {
            emit_range_select(c, e, o);
            return;
        }
        /* all lanes inside: check the first and the last lane (conditions are affine) */
        cg_printf(b, "((");
        for (int lane = 0; lane < (lanes_move ? 2 : 1); lane++) {
            cg_names ln;
            point_names(c, o, lane ? c->W - 1 : 0, &ln);
            for (int i = 0; i < e->ncond; i++) {
                if (lane && e->cond[i].coef[c->x] == 0) continue;
                if (lane || i) cg_printf(b, " && ");
                cg_printf(b, "(uint64_t)");
                cg_emit_affine(b, s, &e->cond[i], &ln);
                cg_printf(b, " < %lluu", (unsigned long long)e->cond_hi[i]);
            }
        }
        cg_printf(b, ") ? ");
        emit_vec(c, e->a, o);
        cg_printf(b, " : ");
        if (!lanes_move) {
            emit_vec(c, e->b, o);
        } else {
            cg_printf(b, "((tlm_vf){");
            for (int l = 0; l < c->W; l++) {
                cg_names ln;
                point_names(c, o, l, &ln);
                if (l) cg_printf(b, ", ");
                cg_emit_scalar(b, c->g, s, id, &ln);
            }
            cg_printf(b, "})");
        }
        cg_printf(b, ")");
        return;
    }
    }
}

static void emit_vec_helpers(cgc *c)
{
    cg_buf *b = &c->b;
    cg_line(b, 0, "typedef float tlm_vf __attribute__((vector_size(%d)));", 4 * c->W);
    cg_line(b, 0, "typedef float tlm_vfu __attribute__((vector_size(%d), aligned(4)));", 4 * c->W);
    /* TLM_PIN: a vector held in a register (an empty asm), where one register holds it:
     * compiled without the target's flags, a 64-byte vector has none */
    cg_line(b, 0, "#if defined(__x86_64__) && %s", c->W >= 16 ? "defined(__AVX512F__)"
                                                    : c->W == 8 ? "defined(__AVX__)" : "1");
    cg_line(b, 0, "#define TLM_PIN(x) __asm__(\"\" : \"+v\"(x))");
    cg_line(b, 0, "#else");
    cg_line(b, 0, "#define TLM_PIN(x) ((void)0)");
    cg_line(b, 0, "#endif");
    if (c->masked) {
        /* lanes [lo, hi) from p (clamped to [0, W)), the rest 0, without touching memory
         * outside them: masked loads fault on no masked-off lane (edge tiles of a padded
         * vector axis, zero padding along the vector axis) */
        cg_line(b, 0, "#include <immintrin.h>");
        cg_line(b, 0, "static inline tlm_vf tlm_vload_range(const float *p, int64_t lo, int64_t hi)");
        cg_line(b, 0, "{");
        cg_line(b, 1, "if (lo <= 0 && hi >= %d) return *(const tlm_vfu *)p;", c->W);
        cg_line(b, 1, "lo = lo < 0 ? 0 : lo;");
        cg_line(b, 1, "hi = hi > %d ? %d : hi;", c->W, c->W);
        cg_line(b, 1, "if (hi <= lo) return (tlm_vf){};");
        if (c->W == 16) {
            cg_line(b, 1, "#if defined(__AVX512F__)");
            cg_line(b, 1, "__mmask16 m = (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));");
            cg_line(b, 1, "return (tlm_vf)_mm512_maskz_loadu_ps(m, p);");
            cg_line(b, 1, "#else");
        } else if (c->W == 8) {
            cg_line(b, 1, "#if defined(__AVX2__)");
            cg_line(b, 1, "const __m256i l = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);");
            cg_line(b, 1, "__m256i m = _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), l), "
                          "_mm256_cmpgt_epi32(l, _mm256_set1_epi32((int)lo - 1)));");
            cg_line(b, 1, "return (tlm_vf)_mm256_maskload_ps(p, m);");
            cg_line(b, 1, "#else");
        } else if (c->W == 4) {
            cg_line(b, 1, "#if defined(__AVX__)");
            cg_line(b, 1, "const __m128i l = _mm_setr_epi32(0, 1, 2, 3);");
            cg_line(b, 1, "__m128i m = _mm_and_si128(_mm_cmpgt_epi32(_mm_set1_epi32((int)hi), l), "
                          "_mm_cmpgt_epi32(l, _mm_set1_epi32((int)lo - 1)));");
            cg_line(b, 1, "return (tlm_vf)_mm_maskload_ps(p, m);");
            cg_line(b, 1, "#else");
        } else {
            cg_line(b, 1, "#if 1");
        }
        cg_line(b, 1, "tlm_vf r = {};");
        cg_line(b, 1, "for (int64_t l = lo; l < hi; l++) r[l] = p[l];");
        cg_line(b, 1, "return r;");
        cg_line(b, 1, "#endif");
        cg_line(b, 0, "}");
        cg_line(b, 0, "static inline tlm_vf tlm_vload_part(const float *p, int64_t n) "
                      "{ return tlm_vload_range(p, 0, n); }");
        /* lanes outside [lo, hi) set to f (a max pool's -inf padding) */
        cg_line(b, 0, "static inline tlm_vf tlm_vfill(tlm_vf v, int64_t lo, int64_t hi, float f)");
        cg_line(b, 0, "{");
        cg_line(b, 1, "for (int l = 0; l < %d; l++) v[l] = l >= lo && l < hi ? v[l] : f;", c->W);
        cg_line(b, 1, "return v;");
        cg_line(b, 0, "}");
    }
    for (int u = 0; u < IR_U_COUNT; u++) {
        const char *nm = ir_unop_name((ir_unop)u);
        cg_line(b, 0, "static inline tlm_vf tlm_v_%s(tlm_vf x) { tlm_vf r; for (int l = 0; l < %d; l++) r[l] = %s; return r; }",
                nm, c->W,
                u == IR_U_NEG      ? "-x[l]"
                : u == IR_U_EXP    ? "tlm_expf(x[l])"
                : u == IR_U_SQRT   ? "sqrtf(x[l])"
                : u == IR_U_RSQRT  ? "tlm_rsqrt(x[l])"
                : u == IR_U_RECIP  ? "tlm_recip(x[l])"
                : u == IR_U_RELU   ? "tlm_relu(x[l])"
                : u == IR_U_RELU6  ? "tlm_relu6(x[l])"
                : u == IR_U_GELU   ? "tlm_gelu(x[l])"
                : u == IR_U_SILU   ? "tlm_silu(x[l])"
                : u == IR_U_SIGMOID ? "tlm_sigmoid(x[l])"
                                   : "tlm_tanh(x[l])");
    }
    /* tlm_max lane-wise (a NaN in either operand gives NaN). The ISA's max returns its second
     * operand when either is NaN, which is right unless the accumulator a is the NaN: AVX-512
     * takes a masked max (lanes where a is NaN keep it: two operations, as many as the plain
     * compare and blend), AVX2 a max and a blend on a's NaN lanes (three). The generic
     * compares and blend take four (5x5 max pool, AVX-512: 0.050 -> 0.066 ms that way). */
    cg_line(b, 0, "typedef int32_t tlm_wi __attribute__((vector_size(%d)));", 4 * c->W);
    if (c->W == 16 || c->W == 8) {
        cg_line(b, 0, "#if defined(__x86_64__)");
        cg_line(b, 0, "#include <immintrin.h>");
        cg_line(b, 0, "#endif");
    }
    cg_line(b, 0, "static inline tlm_vf tlm_v_max(tlm_vf a, tlm_vf b)");
    cg_line(b, 0, "{");
    if (c->W == 16 || c->W == 8) {
        cg_line(b, 0, "#if defined(__x86_64__) && defined(%s)",
                c->W == 16 ? "__AVX512F__" : "__AVX__");
        if (c->W == 16)
            cg_line(b, 1, "return (tlm_vf)_mm512_mask_max_ps((__m512)a, "
                          "_mm512_cmp_ps_mask((__m512)a, (__m512)a, _CMP_ORD_Q), (__m512)a, "
                          "(__m512)b);");
        else
            cg_line(b, 1, "return (tlm_vf)_mm256_blendv_ps(_mm256_max_ps((__m256)a, (__m256)b), "
                          "(__m256)a, _mm256_cmp_ps((__m256)a, (__m256)a, _CMP_UNORD_Q));");
        cg_line(b, 0, "#else");
    }
    cg_line(b, 1, "const tlm_wi m = (a > b) | (a != a);");
    cg_line(b, 1, "return (tlm_vf)(((tlm_wi)a & m) | ((tlm_wi)b & ~m));");
    if (c->W == 16 || c->W == 8) cg_line(b, 0, "#endif");
    cg_line(b, 0, "}");
    cg_line(b, 0, "static inline tlm_vf tlm_v_min(tlm_vf a, tlm_vf b) { tlm_vf r; for (int l = 0; l < %d; l++) r[l] = a[l] < b[l] ? a[l] : b[l]; return r; }", c->W);
    cg_printf(b, "\n");
}

static void loop(cg_buf *b, int ind, const char *var, int64_t n)
{
    cg_line(b, ind, "for (int64_t %s = 0; %s < %lld; %s++) {", var, var, (long long)n, var);
}

/* `r1_n`, the length of the current chunk of reduction axis i (r0 declared), where its last
 * chunk is shorter. */
static void emit_chunk_len(cgc *c, int ind, int i)
{
    if (!c->rtail[i]) return;
    const char *n = c->a->axis[i];
    cg_line(&c->b, ind, "const int64_t %s1_n = tlm_imin(%lld, %lld - %s0 * %lld);", n,
            (long long)c->T[i][1], (long long)c->E[i], n, (long long)c->T[i][1]);
}

/* The r1 loop of reduction axis i: up to its chunk, or to r1_n (declared after the r0 loop)
 * when the last chunk is shorter. */
static void loop_chunk(cgc *c, int ind, int i)
{
    const char *n = c->a->axis[i];
    if (c->rtail[i])
        cg_line(&c->b, ind, "for (int64_t %s1 = 0; %s1 < %s1_n; %s1++) {", n, n, n, n);
    else
        cg_line(&c->b, ind, "for (int64_t %s1 = 0; %s1 < %lld; %s1++) {", n, n,
                (long long)c->T[i][1], n);
}

/* The loop over level l (1 or 2) of padded spatial axis i, stopping at the first tile that
 * starts beyond the extent (tiles past it are pure padding). */
static void loop_inside(cgc *c, int ind, int i, int l)
{
    const char *n = c->a->axis[i];
    int64_t inner = 1;
    for (int k = l + 1; k <= 3; k++) inner *= c->T[i][k];
    char start[128];
    if (l == 1)
        snprintf(start, sizeof start, "(%s0 * %lld + %s1) * %lld", n, (long long)c->T[i][1], n,
                 (long long)inner);
    else
        snprintf(start, sizeof start, "((%s0 * %lld + %s1) * %lld + %s2) * %lld", n,
                 (long long)c->T[i][1], n, (long long)c->T[i][2], n, (long long)inner);
    cg_line(&c->b, ind, "for (int64_t %s%d = 0; %s%d < %lld && %s < %lld; %s%d++) {", n, l, n, l,
            (long long)c->T[i][l], start, (long long)c->E[i], n, l);
}

/* The s2 and s3 loops over every spatial axis (the last one vectorised) down to one output
 * point, with each axis' full index declared; returns the new indent and fills nm. */
/* The s2 and s3 loops of spatial axis i over the block's points inside the extent (the last
 * tile of a padded axis stops at it); returns the new indent. */
/* The s2 loop of axis i over a block (a padded axis' last tiles stopping at its extent). */
static int block_s2_loop(cgc *c, int ind, int i)
{
    char v[16];
    snprintf(v, sizeof v, "%s2", c->a->axis[i]);
    if (c->pad[i])
        loop_inside(c, ind++, i, 2);
    else
        loop(&c->b, ind++, v, c->T[i][2]);
    return ind;
}

/* ... and its s3 loop, the lanes' loop when simd. */
static int block_s3_loop(cgc *c, int ind, int i, bool simd)
{
    char v[16];
    const char *n = c->a->axis[i];
    snprintf(v, sizeof v, "%s3", n);
    if (c->pad[i])
        cg_line(&c->b, ind, "const int64_t %s3_n = tlm_imin(%lld, %lld - ((%s0 * %lld + %s1) * "
                "%lld + %s2) * %lld);", n, (long long)c->T[i][3], (long long)c->E[i], n,
                (long long)c->T[i][1], n, (long long)c->T[i][2], n, (long long)c->T[i][3]);
    if (simd) cg_line(&c->b, ind, "#pragma omp simd");
    if (c->pad[i])
        cg_line(&c->b, ind++, "for (int64_t %s = 0; %s < %s3_n; %s++) {", v, v, n, v);
    else
        loop(&c->b, ind++, v, c->T[i][3]);
    return ind;
}

static int block_axis_loops(cgc *c, int ind, int i, bool simd)
{
    return block_s3_loop(c, block_s2_loop(c, ind, i), i, simd);
}

static int output_loops(cgc *c, int ind, bool vec, char fb[][96], cg_names *nm, int inner,
                        bool ahead);

/* The s1 loops of a task over one s0 block (fused_levels 1), a padded axis' last tiles
 * stopping at its extent; returns the new indent. */
static int task_loops(cgc *c, int ind)
{
    for (int i = 0; i < c->ns; i++) {
        char v[16];
        snprintf(v, sizeof v, "%s1", c->a->axis[i]);
        if (c->pad[i])
            loop_inside(c, ind++, i, 1);
        else
            loop(&c->b, ind++, v, c->T[i][1]);
    }
    return ind;
}

/* Each spatial axis' full index (fb) declared under the axis' name, and nm naming them. */
static void declare_axes(cgc *c, int ind, char fb[][96], cg_names *nm)
{
    *nm = c->nm;
    for (int i = 0; i < c->ns; i++) {
        cg_line(&c->b, ind, "const int64_t %s = %s;", c->a->axis[i], fb[i]);
        nm->axis[i] = c->a->axis[i];
    }
}

/* A transpose (space_cpu_gathered_axis) whose body is its one load, vectorised (c->W lanes,
 * space_cpu_tile_lanes) along the output's last axis: the axis its input runs along, or -1. */
static int transpose_axis(const cgc *c)
{
    const ir_stage *a = c->a;
    if (c->nr > 0 || c->W < 4 || c->x != c->ns - 1 || a->expr[a->body].kind != IR_E_LOAD) return -1;
    return space_cpu_gathered_axis(c->sp);
}

/* A transpose's full register tiles (T[g][3] x T[L][3], both multiples of W) as W x W blocks:
 * W vectors loaded along g (W input rows), transposed in registers (tlm_transpose) and stored
 * as W vectors along L, through the epilogue when there is one. GCC's own loop over the
 * points gathers along L (a lane per input row): 4093 x 1027, 2 threads, at 3.3 times the
 * copy floor. */
static void emit_transpose_tiles(cgc *c, int ind, int gx, char fb[][96])
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const int ns = c->ns, L = ns - 1, W = c->W, oind = ind;
    for (int i = 0; i < ns; i++) /* the block's tiles, the other axes' points */
        if (i == gx || i == L) {
            char v[16];
            snprintf(v, sizeof v, "%s2", a->axis[i]);
            loop(b, ind++, v, c->T[i][2]);
        } else {
            ind = block_axis_loops(c, ind, i, false);
        }
    for (int k = 0; k < 2; k++) { /* the tile's W x W blocks */
        const char *n = a->axis[k ? L : gx];
        cg_line(b, ind++, "for (int64_t %s3 = 0; %s3 < %lld; %s3 += %d) {", n, n,
                (long long)c->T[k ? L : gx][3], n, W);
    }
    cg_names nm;
    declare_axes(c, ind, fb, &nm);
    char gt[24], lt[24];
    snprintf(gt, sizeof gt, "%s_t", a->axis[gx]);
    snprintf(lt, sizeof lt, "%s_t", a->axis[L]);
    cg_line(b, ind, "tlm_vf tt[%d];", W);
    cg_line(b, ind++, "for (int tq = 0; tq < %d; tq++) {", W);
    cg_line(b, ind, "const int64_t %s = %s + tq;", lt, a->axis[L]);
    nm.axis[L] = lt;
    cg_printf(b, "%*stt[tq] = *(const tlm_vfu *)&", ind * 4, "");
    cg_emit_scalar(b, c->g, a, a->body, &nm);
    cg_printf(b, ";\n");
    cg_line(b, --ind, "}");
    cg_line(b, ind, "tlm_transpose(tt);");
    nm.axis[L] = a->axis[L];
    nm.axis[gx] = gt;
    cg_line(b, ind++, "for (int tq = 0; tq < %d; tq++) {", W);
    cg_line(b, ind, "const int64_t %s = %s + tq;", gt, a->axis[gx]);
    if (c->g->n_stage == c->g->anchor + 1) {
        cg_printf(b, "%*s*(tlm_vfu *)&", ind * 4, "");
        emit_output_ref(b, c->g, &nm);
        cg_printf(b, " = tt[tq];\n");
    } else { /* the epilogue point by point over the row's W points */
        cg_line(b, ind, "#pragma omp simd");
        cg_line(b, ind++, "for (int tp = 0; tp < %d; tp++) {", W);
        cg_line(b, ind, "const int64_t %s = %s + tp;", lt, a->axis[L]);
        nm.axis[L] = lt;
        cg_line(b, ind, "float v = tt[tq][tp];");
        emit_epilogue_store(b, c->g, ind, &nm, NULL);
        cg_line(b, --ind, "}");
    }
    while (ind > oind)
        cg_line(b, --ind, "}");
}

/* A task's output points computed directly (no reduction), its loops closed again; a
 * transpose's full tiles in registers (emit_transpose_tiles). */
static void emit_points(cgc *c, int ind, int fused_levels, bool vec, char fb[][96])
{
    int oind = ind;
    if (fused_levels == 1) ind = task_loops(c, ind);
    const int gx = transpose_axis(c);
    bool full = gx >= 0 && c->T[gx][3] % c->W == 0 && c->T[c->ns - 1][3] % c->W == 0;
    for (int i = 0; i < c->ns; i++)
        full &= !c->pad[i];
    if (full) {
        emit_transpose_tiles(c, ind, gx, fb);
        while (ind > oind)
            cg_line(&c->b, --ind, "}");
        return;
    }
    cg_names nm;
    ind = output_loops(c, ind, vec, fb, &nm, c->ns - 1, true);
    cg_printf(&c->b, "%*sfloat v = ", ind * 4, "");
    cg_emit_scalar(&c->b, c->g, c->a, c->a->body, &nm);
    cg_printf(&c->b, ";\n");
    emit_epilogue_store(&c->b, c->g, ind, &nm, NULL);
    while (ind > oind) cg_line(&c->b, --ind, "}");
}

/* Software prefetch ahead of a kernel without a reduction that streams its inputs from
 * memory (an activation or a residual add over a DRAM-sized tensor): before each run of the
 * lanes' loop, the lines STREAM_AHEAD floats further along every input it reads contiguously
 * along that loop are requested. The hardware prefetcher alone leaves a heavy body waiting on
 * its loads (gelu's erf, eleven FMAs and a division a value): GELU over 16777213 floats, 2
 * threads, each kernel timed alone in its own process, 3 rounds, its 64 MiB in the L3 (the
 * same buffers each call): 5.3 -> 3.2 ms on AVX-512, 7.9 -> 4.3 on AVX2, add + silu 7.8 ->
 * 6.5, relu 3.6 -> 3.3; from DRAM (1 GiB of copies rotated) 5.4 -> 4.9-5.2, bound by the
 * bandwidth. 8 KiB ahead: 4 KiB and 16-64 KiB were as fast or slower. Only where those inputs
 * are larger than the cores' L2s together (cached operands need no help) and on full tiles. */
enum { STREAM_AHEAD = 2048 };

/* The target's L2 a core (1 MiB where it says none). */
static int64_t target_l2(const cgc *c)
{
    return c->sp->tgt.cpu.l2_bytes > 0 ? c->sp->tgt.cpu.l2_bytes : (1 << 20);
}

/* The target's last-level cache (8 MiB where it says none). */
static int64_t target_l3(const cgc *c)
{
    return c->sp->tgt.cpu.l3_bytes > 0 ? c->sp->tgt.cpu.l3_bytes : 8 << 20;
}

/* The target's cores (1 where it says none). */
static int64_t target_cores(const cgc *c)
{
    return c->sp->tgt.cpu.cores > 0 ? c->sp->tgt.cpu.cores : 1;
}

static bool load_listed(const ir_expr *ld, int n, int tensor)
{
    for (int k = 0; k < n; k++)
        if (ld[k].tensor == tensor) return true;
    return false;
}

static int stream_ahead_loads(const cgc *c, bool vec, int inner, ir_expr *ld, int max)
{
    const ir_subgraph *g = c->g;
    const ir_stage *a = c->a;
    if (!vec || c->nr > 0 || inner != c->ns - 1 || c->x != inner || c->pad[inner]) return 0;
    int n = 0;
    int64_t bytes = 0;
    for (int e = 0; e < a->n_expr && n < max; e++) {
        const ir_expr *x = &a->expr[e];
        if (x->kind != IR_E_LOAD || g->tensor[x->tensor].kind != IR_T_INPUT) continue;
        if (flat_coef(g, x, inner) != 1 || load_listed(ld, n, x->tensor)) continue;
        ld[n++] = *x;
        bytes += 4 * ir_tensor_numel(&g->tensor[x->tensor]);
    }
    int twins[4];
    const int nt = twin_inputs(g, twins, 4);
    for (int t = 0; t < nt && n < max; t++) {
        if (load_listed(ld, n, twins[t])) continue;
        /* the output's point in the tensor of the same shape (emit_point_ref's load) */
        memset(&ld[n], 0, sizeof ld[n]);
        ld[n].kind = IR_E_LOAD;
        ld[n].tensor = twins[t];
        for (int d = 0; d < g->tensor[twins[t]].ndim; d++)
            ld[n].idx[d].coef[d] = 1;
        n++;
        bytes += 4 * ir_tensor_numel(&g->tensor[twins[t]]);
    }
    return bytes > target_cores(c) * target_l2(c) ? n : 0;
}

/* The prefetches of stream_ahead_loads before a run of the lanes' loop (axis `inner`, whose
 * s3 index is 0 at the run's start). */
static void emit_stream_ahead(cgc *c, int ind, char fb[][96], int inner, const ir_expr *ld, int n)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    cg_line(b, ind, "{ /* the inputs' lines %d floats on */", STREAM_AHEAD);
    cg_line(b, ind + 1, "const int64_t %s3 = 0;", a->axis[inner]);
    cg_names nm;
    declare_axes(c, ind + 1, fb, &nm);
    const int64_t lines = (c->T[inner][3] + 15) / 16;
    for (int k = 0; k < n; k++)
        for (int64_t l = 0; l < lines; l++) {
            cg_printf(b, "%*s__builtin_prefetch(&%s[", (ind + 1) * 4, "",
                      c->g->tensor[ld[k].tensor].name);
            cg_emit_offset(b, c->g, a, &ld[k], &nm);
            cg_printf(b, " + %lld], 0, 3);\n", (long long)(STREAM_AHEAD + 16 * l));
        }
    cg_line(b, ind, "}");
}

static int output_loops(cgc *c, int ind, bool vec, char fb[][96], cg_names *nm, int inner,
                        bool ahead)
{
    int ns = c->ns;
    ir_expr ld[8];
    const int npf = ahead ? stream_ahead_loads(c, vec, inner, ld, 8) : 0;
    for (int k = 0; k < ns; k++) {
        int i = k < ns - 1 ? (k < inner ? k : k + 1) : inner; /* `inner` innermost */
        if (k == ns - 1 && npf > 0) {
            ind = block_s2_loop(c, ind, i);
            emit_stream_ahead(c, ind, fb, i, ld, npf);
            ind = block_s3_loop(c, ind, i, vec);
        } else {
            ind = block_axis_loops(c, ind, i, vec && k == ns - 1);
        }
    }
    declare_axes(c, ind, fb, nm);
    return ind;
}

/* Register-tile point q: its offsets o[] inside s3 (the vector axis in steps of W) and its
 * accumulator offset in the block (accst: the block's strides). */
static int64_t tile_point(const cgc *c, int64_t q, const int64_t *accst, int64_t *o)
{
    int64_t r = q, off = 0;
    for (int i = c->ns - 1; i >= 0; i--) {
        int64_t n = i == c->x ? c->T[i][3] / c->W : c->T[i][3];
        o[i] = (r % n) * (i == c->x ? c->W : 1);
        r /= n;
        off += o[i] * accst[i];
    }
    return off;
}

/* The k-th register point in the order its statement is written: the vector axis fastest,
 * so each broadcast operand is used by all the tile's vectors at once and dies (live: the
 * accumulators, one vector per step of the vector axis and one broadcast). tile_point counts
 * the output's last axis fastest; where that is the vector axis the orders agree. Written in
 * that order, a conv vectorised along F on AVX2 (2 vectors x 5 points) needs 13 registers,
 * against 17 with its 5 broadcasts live across both vectors (a spilled accumulator). */
static int64_t regtile_order(const cgc *c, int64_t k)
{
    if (c->W <= 1 || c->x == c->ns - 1) return k;
    int64_t nx = c->T[c->x][3] / c->W;
    int64_t vx = k % nx, r = k / nx, q = 0, mul = 1;
    for (int i = c->ns - 1; i >= 0; i--) {
        int64_t n = i == c->x ? nx : c->T[i][3];
        int64_t d = i == c->x ? vx : r % n;
        if (i != c->x) r /= n;
        q += d * mul;
        mul *= n;
    }
    return q;
}

/* `float v = SRC;`, scaled by the anchor's post_scale (an average's 1/n) when it has one. */
static void emit_acc_value(cgc *c, int ind, const char *src)
{
    cg_printf(&c->b, "%*sfloat v = %s", ind * 4, "", src);
    if (c->a->post_scale != 1.0) cg_printf(&c->b, " * (float)%.17g", c->a->post_scale);
    cg_printf(&c->b, ";\n");
}

/* The write-back of one finished register tile (c->direct): its points, read back from the
 * block while hot, through the epilogue to the output; the last tile of a padded axis stops
 * at the extent. A streamed output (c->stream, a full tile) takes the epilogue in place in
 * the block, and each row then goes out with non-temporal stores (tlm_stream_row), its lines
 * written without being read first. */
static void emit_tile_store(cgc *c, int ind, const int64_t *accst)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, oind = ind;
    bool vec = c->W > 1, stream = c->stream && !c->edge;
    for (int i = 0; i < ns; i++) {
        const char *n = a->axis[i];
        bool bound = c->pad[i] && c->edge; /* only the edge version's tiles overshoot */
        if (bound)
            cg_line(b, ind, "const int64_t %s3_n = tlm_imin(%lld, %lld - %s_b);", n,
                    (long long)c->T[i][3], (long long)c->E[i], n);
        if (vec && i == ns - 1) cg_line(b, ind, "#pragma omp simd");
        if (bound)
            cg_line(b, ind, "for (int64_t %s3 = 0; %s3 < %s3_n; %s3++) {", n, n, n, n);
        else
            cg_line(b, ind, "for (int64_t %s3 = 0; %s3 < %lld; %s3++) {", n, n,
                    (long long)c->T[i][3], n);
        ind++;
    }
    cg_names nm = c->nm;
    for (int i = 0; i < ns; i++) {
        cg_line(b, ind, "const int64_t %s = %s_b + %s3;", a->axis[i], a->axis[i], a->axis[i]);
        nm.axis[i] = a->axis[i];
    }
    char src[320], row[320];
    size_t sl = (size_t)snprintf(src, sizeof src, "blk["), rl = (size_t)snprintf(row, sizeof row, "blk");
    for (int i = 0; i < ns; i++) {
        sl += (size_t)snprintf(src + sl, sizeof src - sl, "%s%s3 * %lld", i ? " + " : "",
                               a->axis[i], (long long)accst[i]);
        if (i < ns - 1) /* the row's start: its outer axes only */
            rl += (size_t)snprintf(row + rl, sizeof row - rl, " + %s3 * %lld", a->axis[i],
                                   (long long)accst[i]);
    }
    snprintf(src + sl, sizeof src - sl, "]");
    emit_acc_value(c, ind, src);
    emit_epilogue_store(b, c->g, ind, &nm, stream ? src : NULL);
    if (stream) { /* the row out from its first point, the last axis at its block start */
        const char *n = a->axis[ns - 1];
        cg_line(b, --ind, "}");
        cg_line(b, ind++, "{");
        for (int i = 0; i < ns - 1; i++)
            cg_line(b, ind, "const int64_t %s = %s_b + %s3;", a->axis[i], a->axis[i], a->axis[i]);
        cg_line(b, ind, "const int64_t %s = %s_b;", n, n);
        cg_printf(b, "%*stlm_stream_row(&", ind * 4, "");
        emit_output_ref(b, c->g, &nm);
        cg_printf(b, ", %s, %lld);\n", row, (long long)c->T[ns - 1][3]);
        cg_line(b, --ind, "}");
    }
    while (ind > oind) cg_line(b, --ind, "}");
}

/* Software prefetch for the broadcast operands of a register tile whose reduction has two or
 * more loops (a direct conv: c, kh, kw): each iteration of the second-innermost loop starts a
 * new input row (c, kh), whose first broadcast waits for its line (perf: 20 % of the samples
 * on the row-start broadcasts of a 3x3 conv along F), and no hardware prefetcher follows the
 * jump to the next channel's plane. At the top of that loop the rows of the outermost axis
 * some iterations on (prefetch_ahead) are requested: one prefetch per 16 floats of the span
 * the tile's points and the innermost loop cover. Measured on sd15_downsample_320 (one
 * thread): 30.0 -> 27.0 ms one channel ahead, 25.8 ms two. A 1x1 conv's vector-loaded rows
 * are requested the same way (emit_broadcast_prefetch); packed operands (sequential), other
 * vector loads and broadcasts whose next rows are near are left to the hardware. */

/* How many iterations of the outer reduction axis ahead the rows are requested: enough that
 * PF_WORK vector FMAs separate a request from its use, at least 2, at most 16 and half the
 * axis (a stem's 3 channels keep 2, which already reach past them). A 3x3 conv's
 * channel is 9 x the tile's vectors (e.g. 216 FMAs: 2 iterations, as measured above); a 1x1
 * conv's is the tile alone (28 FMAs for 7 x 4 vectors), and 2 channels ahead was less than an
 * L3 access: ResNet-50's stride-2 1x1 downsamples at batch 8, alternated in one process on an
 * Intel Xeon (AVX-512, 2 threads): 256 -> 512 channels at 56 x 56 9.4-9.9 -> 7.8-8.4 ms (8
 * iterations ahead; 4 in between, 16 as 8), 512 -> 1024 at 28 x 28 6.3 -> 5.8 ms, the 1x1
 * 1024 -> 512 at 14 x 14 1.07-1.12x; 3x3 convs (SD's 320 stride 2, ResNet's 512 at 7 x 7)
 * tied from 2 to 16 ahead. */
#define PF_WORK 256

/* The steps of the reduction loops inside the outer one (a 3x3 conv's 9 taps per channel). */
static int64_t channel_taps(const cgc *c)
{
    int64_t taps = 1;
    for (int i = c->ns + 1; i < c->ns + c->nr; i++) taps *= c->T[i][1];
    return taps;
}

static int prefetch_ahead(const cgc *c, int64_t nv)
{
    int64_t step = (nv > 0 ? nv : 1) * channel_taps(c);
    int64_t ahead = (PF_WORK + step - 1) / step, most = c->E[c->ns] / 2; /* a stem's 3 */
    if (ahead > 16) ahead = 16;
    if (ahead > most) ahead = most;
    return ahead < 2 ? 2 : (int)ahead;
}

/* Whether expression `id` is read by the body (a padding copy leaves its select's load
 * behind, unread). */
static bool expr_used(const ir_stage *a, int at, int id)
{
    if (at == id) return true;
    const ir_expr *e = &a->expr[at];
    switch (e->kind) {
    case IR_E_UNARY:
        return expr_used(a, e->a, id);
    case IR_E_BINARY:
    case IR_E_SELECT:
        return expr_used(a, e->a, id) || expr_used(a, e->b, id);
    default:
        return false;
    }
}

static void emit_broadcast_prefetch(cgc *c, int ind)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr, in = ns + nr - 1;
    const int64_t taps = channel_taps(c);
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD || pack_index(c, id) >= 0 || !expr_used(a, a->body, id)) continue;
        /* a broadcast whose rows lie far apart along the outer axis (an input plane per
         * channel), in a tensor larger than L1: a conv's weights along OW (9 floats apart,
         * L1-resident) only pay the requests (a grouped 3x3: 1.49 -> 1.76 ms); and, where a
         * channel's work is the register tile alone (a 1x1 conv), a vector load whose rows lie
         * further apart than a hardware stride prefetcher follows (2 KiB): ResNet-50's 512 ->
         * 256 at 28 x 28 along OW, batch 8, 6 filters x 4 vectors: 8.0-8.3 -> 7.3-7.5 ms
         * alternated on an Intel Xeon, AVX-512, MobileNetV2's and EfficientNet's projections
         * (96-240 channels) 1.08-1.15x; with taps (a grouped 3x3 along OW, Whisper's 1-D
         * conv1) the requests cost 4-10 % on AVX2, and over rows that stay in L1 (16-32
         * channels) 0.96-1.0x */
        int64_t jump = flat_coef(c->g, e, ns), along = flat_coef(c->g, e, c->x);
        bool vec = along == 1 && taps == 1 && 4 * llabs((long long)jump) >= 2048;
        if ((along != 0 && !vec) || llabs((long long)jump) < 64 ||
            4 * ir_tensor_numel(&c->g->tensor[e->tensor]) <= (32 << 10))
            continue;
        /* the offsets of the tile's points from its first, and the innermost loop's reach */
        int64_t lo = 0, hi = 0, nv = 1, o[IR_MAX_AXES], acc1[IR_MAX_AXES];
        for (int i = 0; i < ns; i++) nv *= i == c->x ? c->T[i][3] / c->W : c->T[i][3];
        for (int i = 0; i < ns; i++) acc1[i] = 0;
        int64_t *d = malloc(sizeof(int64_t) * (size_t)nv);
        if (!d) return;
        int64_t reach = flat_coef(c->g, e, in) * (c->T[in][1] - 1) + (vec ? c->W - 1 : 0);
        for (int64_t q = 0; q < nv; q++) {
            tile_point(c, q, acc1, o);
            int64_t off = 0;
            for (int i = 0; i < ns; i++) off += flat_coef(c->g, e, i) * o[i];
            d[q] = off;
            if (off < lo) lo = off;
            if (off + reach > hi) hi = off + reach;
        }
        /* rows a chunk's tiles share from L1 (an expand's few channels, 6 KiB) need none */
        if (vec && 4 * c->T[ns][1] * (hi - lo + 1) < c->sp->tgt.cpu.l1d_bytes / 2) {
            free(d);
            continue;
        }
        const int ahead = prefetch_ahead(c, nv);
        cg_line(b, ind, "{ /* the rows %d iterations of %s on */", ahead, a->axis[ns]);
        for (int i = ns; i < ns + nr; i++)
            if (i == ns)
                cg_line(b, ind + 1, "const int64_t %s = %s0 * %lld + %s1 + %d;", a->axis[i],
                        a->axis[i], (long long)c->T[i][1], a->axis[i], ahead);
            else if (i < in)
                cg_line(b, ind + 1, "const int64_t %s = %s0 * %lld + %s1;", a->axis[i], a->axis[i],
                        (long long)c->T[i][1], a->axis[i]);
            else
                cg_line(b, ind + 1, "const int64_t %s = %s0 * %lld;", a->axis[i], a->axis[i],
                        (long long)c->T[i][1]);
        cg_names nm;
        for (int i = 0; i < ns; i++) o[i] = 0;
        point_names(c, o, 0, &nm);
        /* over each run of the points' offsets (points less than a line apart: one run), its
         * start, every 16 floats and its end: two requests at most 16 floats apart cover the
         * lines of every point between them, and a run shorter than a line can still straddle
         * two. A stride-2 conv's 7 points over 13 floats take 2 requests, not one a point
         * (ResNet-50's stride-2 1x1 at batch 8, 256 -> 512 channels, alone: from DRAM 8.0-8.3
         * -> 7.4-7.8 ms, warm within noise) */
        int64_t start = INT64_MIN, prev = INT64_MIN;
        for (int64_t v = lo; v <= hi + 16; v++) {
            bool hit = false;
            for (int64_t q = 0; q < nv && v <= hi; q++)
                hit |= v >= d[q] && v <= d[q] + reach;
            if (hit && start == INT64_MIN) start = v;
            if (hit) prev = v;
            if (start == INT64_MIN || (v < prev + 16 && v <= hi)) continue;
            /* the run [start, prev] ends: no point within a line after prev */
            for (int64_t at = start;; at += 16) {
                if (at > prev) at = prev;
                cg_printf(b, "%*s__builtin_prefetch(&%s[", (ind + 1) * 4, "",
                          c->nm.tensor[e->tensor]);
                cg_emit_offset(b, c->g, a, e, &nm);
                cg_printf(b, " + %lld], 0, 3);\n", (long long)at);
                if (at == prev) break;
            }
            start = INT64_MIN;
        }
        cg_line(b, ind, "}");
        free(d);
    }
}

/* Software prefetch of the next register tile's broadcast rows: a conv's weights along F
 * (6 filters x C x KH x KW, each filter's row contiguous over the reduction) are read once
 * per tile from wherever they are, and in a plan that is DRAM (ResNet-50's 81 MB of weights
 * pass through every call). Each filter row is a short sequential stream (1 KiB for a 1x1
 * conv over 256 channels) that the hardware prefetcher only picks up after a few misses, so
 * a tile's first pass over them stalls. Where the tile's rows along its one spatial axis are
 * contiguous over the whole reduction, in one chunk, the next tile's rows (R rows on, the
 * next f block: one run) are requested into L2 while this one computes, R x taps floats an
 * iteration of the outer reduction loop. ResNet-50's 1x1 256 -> 1024 at 14 x 14 (AVX-512, 2
 * threads, weights from DRAM, the rest warm): 0.394 -> 0.326 ms, all cold 0.46 -> 0.40, warm
 * unchanged. */
static void emit_next_rows_prefetch(cgc *c, int ind)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const int ns = c->ns, nr = c->nr;
    int64_t taps = 1;
    for (int i = ns + 1; i < ns + nr; i++) {
        if (c->T[i][1] != c->E[i]) return; /* the inner reduction axes whole in one chunk */
        taps *= c->E[i];
    }
    /* a 3x3's rows at most: ViT's 16 x 16 patches (8 rows of 768 floats, 96 requests a
     * channel) gained nothing, weights warm or cold (0.82 / 0.97 ms both ways) */
    if (taps > 9) return;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD || pack_index(c, id) >= 0 || !expr_used(a, a->body, id) ||
            flat_coef(c->g, e, c->x) != 0 || flat_coef(c->g, e, ns) != taps ||
            4 * ir_tensor_numel(&c->g->tensor[e->tensor]) <= (64 << 10))
            continue;
        int s = -1; /* the one spatial axis the rows vary along */
        for (int i = 0; i < ns; i++)
            if (flat_coef(c->g, e, i) != 0) s = s < 0 ? i : -2;
        if (s < 0) continue;
        /* a tap's offsets cover [0, taps) once: a row is contiguous over the reduction */
        bool seen[9] = {false}, dense = true;
        for (int64_t t = 0; t < taps && dense; t++) {
            int64_t off = 0, r = t;
            for (int i = ns + nr - 1; i > ns; i--) {
                off += flat_coef(c->g, e, i) * (r % c->E[i]);
                r /= c->E[i];
            }
            dense = off >= 0 && off < taps && !seen[off];
            if (dense) seen[off] = true;
        }
        /* ... and the chunk covers it whole, so the next tile's rows are one run (over a
         * chunk of a row, 512 channels in two, the requests cost 3-5 % with the weights warm
         * or cold: ResNet-50's 512 -> 128 and 512 -> 256 at 28 x 28) */
        const int64_t fs = flat_coef(c->g, e, s), rows = c->T[s][3];
        if (!dense || fs != c->E[ns] * taps || c->T[ns][1] != c->E[ns]) continue;
        const int64_t step = rows * taps, npf = (step + 15) / 16;
        cg_line(b, ind, "{ /* the next tile's rows along %s (%lld on) */", a->axis[s],
                (long long)rows);
        for (int i = ns; i < ns + nr; i++)
            cg_line(b, ind + 1, "const int64_t %s = %s0 * %lld;", a->axis[i], a->axis[i],
                    (long long)c->T[i][1]);
        int64_t o[IR_MAX_AXES] = {0};
        cg_names nm;
        point_names(c, o, 0, &nm);
        for (int64_t j = 0; j < npf; j++) {
            cg_line(b, ind + 1, "const int64_t p%lld = %s1 * %lld + %lld;", (long long)j,
                    a->axis[ns], (long long)step, (long long)(16 * j));
            cg_printf(b, "%*s__builtin_prefetch(&%s[", (ind + 1) * 4, "", c->nm.tensor[e->tensor]);
            cg_emit_offset(b, c->g, a, e, &nm);
            cg_printf(b, " + %lld + p%lld], 0, 2);\n", (long long)(rows * fs), (long long)j);
        }
        cg_line(b, ind, "}");
    }
}

static bool tasks_interleaved(const cgc *c, int fused_levels, int64_t ntask);
static void task_order(const cgc *c, int *ord);

/* A task's index `task` decoded into its blocks' indices (<axis><level> for the fused levels,
 * the task order's first axis fastest), as the task loop and the next task's request do */
static void emit_task_decode(cgc *c, int ind, const char *task, int fused_levels, const int *ord)
{
    cg_buf *b = &c->b;
    cg_line(b, ind, "int64_t rem = %s;", task);
    for (int l = fused_levels - 1; l >= 0; l--)
        for (int q = 0; q < c->ns; q++) {
            const int i = ord[q];
            cg_line(b, ind, "const int64_t %s%d = rem %% %lld;", c->a->axis[i], l,
                    (long long)c->T[i][l]);
            cg_line(b, ind, "rem /= %lld;", (long long)c->T[i][l]);
        }
    cg_line(b, ind, "(void)rem;");
}

/* Software prefetch of the next task's block of a vector-loaded operand read unpacked (a 1x1
 * conv's input along OW: 256 channel rows of 128 columns a task, 128 KiB). Every register
 * tile of a task reads the same block, the first from wherever it lies: in a plan, where the
 * layer before wrote it, the L3 or DRAM, in short rows one plane apart that no hardware
 * prefetcher follows, so each task's first tile waits on memory while its others run from
 * L2. The block the next task (task + 1: a thread's tasks are consecutive) reads is requested
 * into L2 over this task's tiles after its first, k lines a step of the outer reduction loop.
 * ResNet-50's 256 -> 64 1x1 convs at 56 x 56, batch 8, in the plan (AVX-512, 2 threads,
 * alternated): 2.94-3.00 -> 2.80-2.81 ms (1.05-1.07x); alone 1.03x warm, 1.07x from DRAM.
 * Not where the operand fits an L2, and may still be there from the layer before: MobileNetV2's
 * 64 -> 384 and 96 -> 576 expands at 14 x 14, batch 8 (400-600 KiB inputs) ran 3-6 % slower
 * requesting (its projections of 9.6-14 MiB inputs 1.08-1.30x faster).
 * The operand: read in the reduction's body, contiguous along the vector axis, not packed,
 * larger than an L2, indexed by the outer reduction axis and by no inner one
 * of more than one point (a 1x1 conv, not a 3x3's overlapping windows), moving with the
 * fastest task axis (consecutive tasks read different blocks) and read by two tiles of a
 * task or more; tasks not interleaved. */
static int next_task_load(const cgc *c, int fused_levels, int64_t ntask)
{
    const ir_stage *a = c->a;
    const int ns = c->ns, nr = c->nr;
    if (c->W <= 1 || nr == 0 || ntask < 2 || tasks_interleaved(c, fused_levels, ntask)) return -1;
    int ord[IR_MAX_AXES], fast = -1;
    task_order(c, ord);
    for (int q = 0; q < ns && fast < 0; q++)
        if (c->T[ord[q]][fused_levels - 1] > 1) fast = ord[q];
    if (fast < 0) return -1;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD || pack_index(c, id) >= 0 || !expr_used(a, a->body, id) ||
            flat_coef(c->g, e, c->x) != 1 || flat_coef(c->g, e, ns) == 0 ||
            flat_coef(c->g, e, fast) == 0 ||
            4 * ir_tensor_numel(&c->g->tensor[e->tensor]) <= target_l2(c))
            continue;
        bool ok = true;
        for (int i = ns + 1; i < ns + nr; i++)
            ok &= c->E[i] == 1 || flat_coef(c->g, e, i) == 0;
        /* read again by other tiles of the task (a GEMV's row of tiles reads each block once:
         * there the requests only compete with the stream, 0.97-1.02x) */
        int64_t reuse = 1;
        for (int i = 0; i < ns; i++)
            if (flat_coef(c->g, e, i) == 0)
                reuse *= c->T[i][2] * (fused_levels == 1 ? c->T[i][1] : 1);
        if (ok && reuse >= 2) return id;
    }
    return -1;
}

/* The points a task's block holds along spatial axis i: one task's step along it */
static int64_t task_step(const cgc *c, int i)
{
    int64_t step = 1;
    for (int l = c->fused_levels; l < c->sp->s_levels; l++)
        step *= c->T[i][l];
    return step;
}

/* ... of which a task covers at most the extent (the last task's may be fewer) */
static int64_t task_span(const cgc *c, int i)
{
    const int64_t step = task_step(c, i);
    return step < c->E[i] ? step : c->E[i];
}

/* The rows of the next task's block (emit_next_task_prefetch): the outer reduction axis
 * over its extent, then each other spatial axis the operand moves with over the task's span
 * (each row the task's span along the vector axis). */
static int64_t next_task_rows(const cgc *c, const ir_expr *e, int *ax, int64_t *ext, int *nax)
{
    int n = 0;
    ax[n] = c->ns, ext[n++] = c->E[c->ns];
    for (int i = 0; i < c->ns; i++)
        if (i != c->x && flat_coef(c->g, e, i) != 0 && task_span(c, i) > 1)
            ax[n] = i, ext[n++] = task_span(c, i);
    *nax = n;
    int64_t rows = 1;
    for (int k = 0; k < n; k++)
        rows *= ext[k];
    return rows;
}

/* At a task's start: tlm_nx, the flat offset of the next task's first point in the operand
 * (-1 for the last task), decoded from task + 1 as the task loop decodes task. */
static void emit_next_task_base(cgc *c, int ind, int64_t ntask, const int *ord)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const int ns = c->ns, fl = c->fused_levels;
    const ir_expr *e = &a->expr[c->nt_load];
    cg_line(b, ind, "int64_t tlm_nx = -1; /* the next task's first point of %s (-1: none) */",
            c->nm.tensor[e->tensor]);
    cg_line(b, ind++, "if (task + 1 < %lld) {", (long long)ntask);
    emit_task_decode(c, ind, "task + 1", fl, ord);
    cg_names nm = c->nm;
    for (int i = 0; i < ns + c->nr; i++) {
        nm.axis[i] = a->axis[i];
        if (i >= ns) {
            cg_line(b, ind, "const int64_t %s = 0;", a->axis[i]);
            continue;
        }
        if (fl == 1)
            cg_line(b, ind, "const int64_t %s = %s0 * %lld;", a->axis[i], a->axis[i],
                    (long long)task_step(c, i));
        else
            cg_line(b, ind, "const int64_t %s = (%s0 * %lld + %s1) * %lld;", a->axis[i], a->axis[i],
                    (long long)c->T[i][1], a->axis[i], (long long)task_step(c, i));
    }
    cg_printf(b, "%*stlm_nx = ", ind * 4, "");
    cg_emit_offset(b, c->g, a, e, &nm);
    cg_printf(b, ";\n");
    cg_line(b, --ind, "}");
}

/* In a full tile's outer reduction loop: the next task's block, k lines a step, the steps
 * counted over this task's tiles after its first (all of them where a task has one). */
static void emit_next_task_prefetch(cgc *c, int ind)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const int ns = c->ns, fl = c->fused_levels;
    const ir_expr *e = &a->expr[c->nt_load];
    int ax[IR_MAX_AXES], nax;
    int64_t ext[IR_MAX_AXES];
    const int64_t rows = next_task_rows(c, e, ax, ext, &nax);
    /* a row's lines: one request every 16 floats, and one at its end where rows or tasks
     * start off a line (the rows' strides or the task's step along the vector axis not whole
     * lines) */
    const int64_t spx = task_span(c, c->x);
    bool lined = spx % 16 == 0;
    for (int q = 0; q < nax; q++)
        lined &= flat_coef(c->g, e, ax[q]) % 16 == 0;
    const int64_t segs = (spx + 15) / 16 + (lined ? 0 : 1), lines = rows * segs;
    /* the steps of a task: its level-1 blocks (when the task loop fuses one level), chunks
     * of the outer reduction axis, level-2 tiles, and the chunk's steps */
    int64_t steps = c->T[ns][0] * c->T[ns][1];
    for (int i = 0; i < ns; i++)
        steps *= c->T[i][2] * (fl == 1 ? c->T[i][1] : 1);
    const int64_t skip = steps > c->T[ns][1] ? c->T[ns][1] : 0;
    const int64_t k = (lines + (steps - skip) - 1) / (steps - skip);
    cg_line(b, ind++, "if (tlm_nx >= 0) { /* the next task's %s, %lld lines */",
            c->nm.tensor[e->tensor], (long long)lines);
    /* the step's number, Horner over the task's level-1 blocks (when the task loop fuses one
     * level), the outer reduction chunk, the level-2 tiles and the chunk's step */
    const int nest = (fl == 1 ? ns : 0) + 1 + ns;
    cg_printf(b, "%*sconst int64_t tlm_s = ", ind * 4, "");
    for (int q = 0; q < nest; q++)
        cg_printf(b, "(");
    cg_printf(b, "0");
    for (int i = 0; i < ns && fl == 1; i++)
        cg_printf(b, " * %lld + %s1)", (long long)c->T[i][1], a->axis[i]);
    cg_printf(b, " * %lld + %s0)", (long long)c->T[ns][0], a->axis[ns]);
    for (int i = 0; i < ns; i++)
        cg_printf(b, " * %lld + %s2)", (long long)c->T[i][2], a->axis[i]);
    cg_printf(b, " * %lld + %s1 - %lld;\n", (long long)c->T[ns][1], a->axis[ns], (long long)skip);
    if (k > 1) {
        cg_line(b, ind++, "for (int64_t tlm_q = 0; tlm_q < %lld; tlm_q++) {", (long long)k);
        cg_line(b, ind, "const int64_t tlm_l = tlm_s * %lld + tlm_q;", (long long)k);
        cg_line(b, ind, "if ((uint64_t)tlm_l >= %lld) break;", (long long)lines);
    } else {
        cg_line(b, ind, "const int64_t tlm_l = tlm_s;");
        cg_line(b, ind++, "if ((uint64_t)tlm_l < %lld) {", (long long)lines);
    }
    cg_line(b, ind, "const int64_t tlm_r = tlm_l / %lld, tlm_g = tlm_l %% %lld * 16;",
            (long long)segs, (long long)segs);
    cg_printf(b, "%*s__builtin_prefetch(&%s[tlm_nx", ind * 4, "", c->nm.tensor[e->tensor]);
    int64_t div = 1;
    for (int q = 0; q < nax; q++) {
        cg_printf(b, " + tlm_r / %lld %% %lld * %lld", (long long)div, (long long)ext[q],
                  (long long)flat_coef(c->g, e, ax[q]));
        div *= ext[q];
    }
    if (lined)
        cg_printf(b, " + tlm_g], 0, 2);\n");
    else
        cg_printf(b, " + (tlm_g < %lld ? tlm_g : %lld)], 0, 2);\n", (long long)spx,
                  (long long)(spx - 1));
    cg_line(b, --ind, "}");
    cg_line(b, --ind, "}");
}

/* c's names with the first n axes named as the anchor names them (its loop variables) */
static cg_names anchor_names(const cgc *c, int n)
{
    cg_names nm = c->nm;
    for (int i = 0; i < n; i++)
        nm.axis[i] = c->a->axis[i];
    return nm;
}

/* How many register tiles a block holds (the s2 loops' trips). */
static int64_t block_tiles(const cgc *c)
{
    int64_t tiles = 1;
    for (int i = 0; i < c->ns; i++)
        tiles *= c->T[i][2];
    return tiles;
}

/* `q2` emitted: the register tile's index among its block's tiles, in axis order */
static void emit_tile_index(cgc *c, int ind)
{
    cg_printf(&c->b, "%*sconst int64_t q2 = ", ind * 4, "");
    for (int i = 0; i < c->ns; i++)
        cg_printf(&c->b, "(");
    cg_printf(&c->b, "0");
    for (int i = 0; i < c->ns; i++)
        cg_printf(&c->b, " * %lld + %s2)", (long long)c->T[i][2], c->a->axis[i]);
    cg_printf(&c->b, ";\n");
}

/* Software prefetch of a packed operand's next panel: a panel (a conv's 64 filters x 256
 * channels of prepacked weights, 64 KiB) is read by every register tile of its block, the
 * first from wherever it lies (in a plan, DRAM: 4 MiB of weights for one of ResNet-50's
 * layer4 1x1 convs), each tile's step wanting 4 lines for 28 FMAs, more than DRAM gives one
 * core, so the first tile of each chunk ran at memory speed. The next panel (the next
 * reduction chunk or block, one stride on) is requested into L2 over the first tiles of this
 * one, a line or a few each step of the outer reduction loop (lines / (tiles x steps),
 * rounded up), only while it lasts. Packs handed in (tlm_pre) or packed before the task
 * loop, larger than an eighth of an L2 together. ResNet-50's 2048 -> 512 at 7 x 7 (AVX-512,
 * 2 threads): weights from DRAM 0.437 -> 0.325 ms, from L3 0.320 -> 0.282; its batch-1 plan
 * 28.45 -> 25.88 ms (layer3/4 3x3s 0.66 -> 0.60, 0.85-1.0 -> 0.67-0.72), AVX2 47.9 -> 45.6;
 * SD's 3x3 1280 at 8 x 8 alone 1.37x (AVX2 1.27x); a pack the task made itself: none (a
 * request per step on a hot panel cost ResNet's 64 -> 64 1x1 at batch 8 4 %). A GEMM's B
 * the same, from its one reduction loop's steps: BERT-base's plan 78.1 -> 72.3 ms, GPT-2's
 * 113.1 -> 106.0; LLaMA-2's q_proj at 77 tokens alone 1.19x (AVX2 1.25x), attention-score
 * batch GEMMs (B packed per call) 0.97-1.01x. */
static void emit_next_panel_prefetch(cgc *c, int ind)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const int ns = c->ns;
    const int64_t tiles = block_tiles(c);
    const int64_t steps = c->T[ns][1];
    for (int pi = 0; pi < c->npack; pi++) {
        if (pi == c->keep_pi || (!c->pack_glob[pi] && c->pre_k[pi] < 0)) continue;
        const int64_t stride = c->pack_stride[pi], lines = stride / 16;
        if (4 * stride * c->pack_blocks[pi] <= target_l2(c) / 8 || lines < 1) continue;
        const int64_t k = (lines + tiles * steps - 1) / (tiles * steps);
        const int64_t first = (lines + steps * k - 1) / (steps * k); /* tiles that request */
        cg_printf(b, "%*s{ /* the next panel of P%d, over the first %lld tiles */\n", ind * 4, "",
                  pi, (long long)first);
        emit_tile_index(c, ind + 1);
        /* a pack this task makes when none is handed in is its own, hot panel: none */
        char pre[32] = "";
        if (!c->pack_glob[pi]) snprintf(pre, sizeof pre, "tlm_pre%d", c->pre_k[pi]);
        if (first < tiles)
            cg_line(b, ind + 1, "if (%s%sq2 < %lld)", pre, *pre ? " && " : "", (long long)first);
        else if (*pre)
            cg_line(b, ind + 1, "if (%s)", pre);
        cg_line(b, ind + 1, "{");
        cg_line(b, ind + 2, "const float *const nx = P%d + %lld;", pi, (long long)stride);
        for (int64_t j = 0; j < k; j++)
            cg_line(b, ind + 2, "__builtin_prefetch(nx + (q2 * %lld + %s1) * %lld + %lld, 0, 2);",
                    (long long)steps, a->axis[ns], (long long)(16 * k), (long long)(16 * j));
        cg_line(b, ind + 1, "}");
        cg_line(b, ind, "}");
    }
}

/* A GEMM's B packed by each task a reduction chunk at a time from a source larger than the
 * last-level cache (a weight matrix a plan would pack once, packed per call when a kernel is
 * called alone): the chunk's pack waits on DRAM row by row (rows a matrix row apart, a page
 * each), then the tiles compute from L2. The source rows of the next chunk are requested into
 * L2 while this one's tiles run, a share per register tile (rows / tiles, rounded up, a run of
 * lines each). Old / new alternated (Zen 4, 2 threads, packing per call): LLaMA-2's q_proj at
 * 77 tokens (77 x 4096 x 4096, 64 MB of B) 1.30-1.37x on AVX2, 1.06-1.11x on AVX-512, GPT-2's
 * LM head (128 x 50257 x 768) 1.045x; with the weights handed in, a tie (1.016x). From
 * the L3 it gained less and lost more (128 x 128 x 32768, 16 MB: 1.01-1.05x; ViT-B's fc1, 9.4
 * MB: 0.88-1.04x, the AVX2 tile's runs of 2 lines): not there. Only for one reduction axis,
 * a pack over it and the vector axis alone, contiguous along the vector axis, and not where
 * the pack is handed in (tlm_pre) or kept across tasks. */
static void emit_next_chunk_source(cgc *c, int ind)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const int ns = c->ns, x = c->x, k = ns;
    if (c->nr != 1 || c->T[k][0] < 2 || c->W <= 1) return;
    const int64_t tiles = block_tiles(c);
    for (int pi = 0; pi < c->npack; pi++) {
        const ir_expr *e = &a->expr[c->pack_id[pi]];
        if (pi == c->keep_pi || c->pack_glob[pi] || e->kind != IR_E_LOAD ||
            c->pack_mask[pi] != ((1u << x) | (1u << k)) || flat_coef(c->g, e, x) != 1 ||
            flat_coef(c->g, e, k) == 0)
            continue;
        if (4 * ir_tensor_numel(&c->g->tensor[e->tensor]) <= target_l3(c)) continue;
        const int64_t rows = c->T[k][1], run = c->T[x][2] * c->T[x][3];
        const int64_t share = (rows + tiles - 1) / tiles, lines = run / 16 + 1;
        char pre[32] = "";
        if (c->pre_k[pi] >= 0) snprintf(pre, sizeof pre, " && !tlm_pre%d", c->pre_k[pi]);
        cg_line(b, ind, "if (%s0 + 1 < %lld%s) { /* the next chunk's source rows, into L2 */",
                a->axis[k], (long long)c->T[k][0], pre);
        emit_tile_index(c, ind + 1);
        /* within the chunk, and within the axis where the next chunk is its short last one */
        cg_line(b, ind + 1,
                "for (int64_t tlm_r = q2 * %lld; tlm_r < q2 * %lld + %lld && tlm_r < %lld && "
                "(%s0 + 1) * %lld + tlm_r < %lld; tlm_r++) {",
                (long long)share, (long long)share, (long long)share, (long long)rows, a->axis[k],
                (long long)rows, (long long)c->E[k]);
        cg_line(b, ind + 2, "const int64_t %s = (%s0 * %lld + %s1) * %lld;", a->axis[x], a->axis[x],
                (long long)c->T[x][1], a->axis[x], (long long)run);
        cg_line(b, ind + 2, "const int64_t %s = (%s0 + 1) * %lld + tlm_r;", a->axis[k], a->axis[k],
                (long long)rows);
        cg_names pn = anchor_names(c, ns + c->nr);
        cg_printf(b, "%*sconst float *const tlm_src = &", (ind + 2) * 4, "");
        cg_emit_scalar(b, c->g, a, c->pack_id[pi], &pn);
        cg_printf(b, ";\n");
        cg_line(b, ind + 2,
                "for (int tlm_l = 0; tlm_l < %lld; tlm_l++) __builtin_prefetch(tlm_src + 16 * "
                "tlm_l, 0, 2);",
                (long long)lines);
        cg_line(b, ind + 1, "}");
        cg_line(b, ind, "}");
    }
}

/* The accumulator statements of one reduction step (emit_regtile_steps). */
static void emit_step_stmts(cgc *c, int ind, int64_t nv, const int64_t *accst)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const bool maxr = a->reduce == IR_RED_MAX;
    int64_t o[IR_MAX_AXES];
    for (int64_t k = 0; k < nv; k++) {
        int64_t q = regtile_order(c, k);
        tile_point(c, q, accst, o);
        if (maxr)
            cg_printf(b, "%*sr%lld = %s(r%lld, ", ind * 4, "", (long long)q,
                      c->W > 1 ? "tlm_v_max" : "tlm_max", (long long)q);
        else
            cg_printf(b, "%*sr%lld += ", ind * 4, "", (long long)q);
        if (c->W > 1) {
            emit_vec(c, a->body, o);
        } else {
            cg_names nm;
            point_names(c, o, 0, &nm);
            cg_emit_scalar(b, c->g, a, a->body, &nm);
        }
        cg_printf(b, maxr ? ");\n" : ";\n");
    }
}

/* Whether a broadcast operand's step reads an address again only taps later, never at the
 * next tap: a tap m steps on along an unrolled reduction axis reads where the register point
 * j steps on along a tile axis read (a conv's input along its columns: at stride 1 the next
 * tap, m = 1; at stride 2 the tap after it, m = 2; dilation 2 at stride 1, m = 1 against j =
 * 2), and the fewest such m is 2 or more. Through a base pointer GCC sees those addresses
 * equal and keeps the values of the first tap in registers over the taps between, where
 * they are not used. The innermost reduction axis is unrolled (GCC's pragma); the one around
 * it too where the window is in straight code. */
static bool taps_reread(const cgc *c, const ir_expr *e, bool window)
{
    const int inn = c->ns + c->nr - 1;
    int64_t first = 0; /* the fewest taps between two reads of one address */
    for (int r = inn; r >= c->ns && r >= inn - (window ? 1 : 0); r--) {
        const int64_t cr = llabs(flat_coef(c->g, e, r));
        for (int i = 0; i < c->ns && cr > 0; i++) {
            const int64_t ci = llabs(flat_coef(c->g, e, i));
            for (int64_t m = 1; m < c->T[r][1] && ci > 0; m++)
                for (int64_t j = 1; j < c->T[i][3]; j++)
                    if (m * cr == j * ci && (!first || m < first)) first = m;
        }
    }
    return first >= 2;
}

/* One step of the register tile's reduction loops: each accumulator's update (the reduction
 * axes' indices from their chunk's r0 and r1). */
static void emit_regtile_steps(cgc *c, int ind, int64_t nv, const int64_t *accst, bool window)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr;
    for (int i = ns; i < ns + nr; i++)
        cg_line(b, ind, "const int64_t %s = %s0 * %lld + %s1;", a->axis[i], a->axis[i],
                (long long)c->T[i][1], a->axis[i]);
    /* a GEMM's one reduction loop is this one: its next panel is requested step by step */
    if (nr == 1 && c->W > 1 && !c->edge) emit_next_panel_prefetch(c, ind);
    /* each broadcast operand's address at the tile's first point: its points are constant
     * offsets from it. Written per point, GCC keeps one pointer per register row (a conv's 6
     * input columns, a GEMM's 6 rows of A: 6 to 9 pointer increments per step beside 24
     * FMAs); with 32 registers one base pointer measured 4-5 % faster on a 3x3 conv, but
     * with 16 GCC then schedules the broadcasts early and spills accumulators (the same conv
     * on AVX2 6 % slower; 2 x 6 tiles of 3x3 convs 6-10 % slower even with their window
     * unrolled), so there the per-point form stays, but for a tile of at most 10 accumulators
     * with its window in straight code (yolov5s 64 -> 64 at 80 x 80, 2 x 5: window alone
     * 1.09-1.15x, with one base 1.20-1.37x; at stride 2 a tie with the window alone) */
    const int regs = c->sp->tgt.cpu.vector_registers;
    const bool bases = regs > 16 || (window && nv + 6 <= regs);
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        c->lbase[id] = false;
        if (!bases || c->W <= 1 || c->edge || e->kind != IR_E_LOAD || pack_index(c, id) >= 0 ||
            flat_coef(c->g, e, c->x) != 0 || !expr_used(a, a->body, id))
            continue;
        bool guarded = false; /* read under a padding select that may fail here */
        for (int j = 0; j < a->n_expr && !c->interior; j++)
            guarded |= a->expr[j].kind == IR_E_SELECT && a->expr[j].a == id;
        if (guarded) continue;
        int64_t zero[IR_MAX_AXES] = {0};
        cg_names nm;
        point_names(c, zero, 0, &nm);
        /* ... opaque to GCC (an empty asm) where it would keep a tap's values over the taps
         * between on 16 registers: YOLOv5s' 3x3 stride-2 128 -> 256 at 80 x 80 on AVX2, a
         * 2 x 5 tile, spilled 3 of its 10 accumulators (store, reload, FMA each tap: a third
         * of the samples); opaque, alternated on a Zen 4 (2 threads, weights packed once),
         * 6.3-7.2 -> 4.7-6.2 ms (1.08-1.35x). The 2 x 6 tiles of SD 1.5's stride-2 320 -> 320 and
         * ResNet-50's stride-2 3x3s (in its plan), MobileNetV2's and EfficientNet's stems
         * tied (0.99-1.02x). At stride 1 (the next tap reuses them) it lost, 0.91-0.99x on
         * ResNet-50's 3x3s, and AVX-512 tied (0.98-1.02x): there the base stays plain. */
        const bool opaque = regs <= 16 && taps_reread(c, e, window);
        cg_printf(b, "%*sconst float *%sLb%d = &%s[", ind * 4, "", opaque ? "" : "const ", id,
                  c->nm.tensor[e->tensor]);
        cg_emit_offset(b, c->g, a, e, &nm);
        cg_printf(b, "];\n");
        if (opaque) cg_line(b, ind, "__asm__(\"\" : \"+r\"(Lb%d));", id);
        c->lbase[id] = true;
    }
    /* The step's vector operands (B of a GEMM, a conv's weights along F) are each loaded once
     * into a variable pinned in a register by an empty asm, ahead of the FMAs that read them,
     * where the tile presses on the registers: left to GCC, the loads are folded into the FMAs
     * or scheduled early and the accumulators shuffled between registers (the AVX-512 6 x 4
     * GEMM tile unrolled twice: 9 register moves per 48 FMAs; 1021 x 1031 x 1009 on 2 threads
     * 14.6-14.9 -> 13.5-13.6 ms; a dilated 3x3 conv along F 1.52 -> 1.41). A small tile
     * keeps GCC's folded loads (5 accumulators of an AVX-512 1x1 conv: pinned 0.558 -> 0.610
     * ms), and so do 16-register targets, where pins both won and lost (AVX2 3x3 convs along
     * F: 128 -> 128 at 40 x 40 3.50 -> 3.16 ms, but 128 -> 256 stride 2 at 80 x 80 with silu
     * 4.70 -> 6.43). */
    bool pinned = false;
    if (c->W > 1 && a->reduce != IR_RED_MAX && regs > 16 && 2 * (nv + 3) > regs) {
        cg_buf held = c->b;
        memset(&c->b, 0, sizeof c->b);
        c->hoist = true;
        c->nvl = 0;
        emit_step_stmts(c, ind, nv, accst);
        c->hoist = false;
        char *steps = cg_buf_take(&c->b);
        c->b = held;
        pinned = nv + c->nvl + 2 <= regs; /* else: the plain statements, below */
        for (int k = 0; k < c->nvl; k++) {
            if (pinned) cg_line(b, ind, "tlm_vf v%d = %s; TLM_PIN(v%d);", k, c->vl[k], k);
            free(c->vl[k]);
        }
        c->nvl = 0;
        if (pinned) cg_printf(b, "%s", steps ? steps : "");
        free(steps);
    }
    if (!pinned) emit_step_stmts(c, ind, nv, accst);
    memset(c->lbase, 0, sizeof c->lbase);
}

/* Whether the reduction steps pay unrolled in the source on this target. With 32 vector
 * registers they do (GCC's unroll pragma left 5 loop instructions beside a GEMM step's 12
 * FMAs: tinyllama 512x2048x2048, one thread, AVX-512 69 -> 65 ms on a Xeon; on a Zen 4 EPYC
 * a tie, alternating rounds). With 16 the unrolled statements cost registers: GCC spills an
 * accumulator of the 6 x 16 AVX2 tile and copies others about. Intel still gained (AVX2 109
 * -> 106 ms on the Xeon); AMD Zen, whose wider dispatch absorbs the loop instructions, loses
 * (Zen 4, 2 threads, 16 alternating rounds: a 1021x1031x1009 GEMM 14.4 -> 12.5 ms median,
 * rolled faster in 13 of 16; tinyllama 27.9 -> 26.4 ms; vit_b16_qkv a tie). So 16-register
 * targets keep them rolled unless the target names an Intel CPU: the generic cpu:avx2 too,
 * since AVX2-only servers are mostly Zen. */
static bool source_unroll_pays(const cgc *c)
{
    const target_cpu_info *t = &c->sp->tgt.cpu;
    return t->vector_registers > 16 || !strcmp(t->vendor, "GenuineIntel");
}

/* Steps of the innermost reduction loop written out per iteration: the unroll slot's budget
 * in statements over the tile's accumulators, at most 4 (8, with the edge tiles unrolled too,
 * bought nothing measurable and more than doubled a GEMM's compile time) and the trip count;
 * a divisor of the trip count from half that up, when there is one, so that no remainder
 * loop is needed. A trip count up to twice the steps is left to GCC, which unrolls it whole
 * (a 3x3 conv's kw: written out, the AVX2 conv ran 5 % slower), and so are the edge tiles
 * (one per axis): 1 = the loop as it is, under GCC's unroll pragma. */
static int64_t unroll_steps(const cgc *c, int unroll, int64_t nv)
{
    const int inn = c->ns + c->nr - 1;
    const int64_t trip = c->T[inn][1];
    if (unroll <= 0 || nv <= 0 || c->edge || c->short_tile || !source_unroll_pays(c)) return 1;
    int64_t u = unroll / nv;
    if (u > 4) u = 4;
    if (u <= 1 || trip <= 1) return 1;
    if (!c->rtail[inn] && trip <= 2 * u) return 1; /* GCC unrolls a short loop whole */
    if (u > trip) u = trip;
    for (int64_t d = u; d >= 2 && 2 * d >= u && !c->rtail[inn]; d--)
        if (trip % d == 0) return d;
    return u;
}

/* The trip of the reduction loop around the innermost one where GCC is to unroll it whole as
 * well, or 1: a conv's kernel rows around its unrolled columns, the window in straight code.
 * On 16-register targets, where a step's FMAs share the core's issue with its loop and
 * address instructions (on AVX2 a 3x3 conv's 2 x 5 tile: 3 row loops of 30 FMAs each with
 * 6 pointer increments and a branch; yolov5s 64 -> 64 at 80 x 80, alternating rounds on a
 * Xeon, 1.07-1.15x, 1.04-1.08x at stride 2, SD 1.5's 320 -> 320 1.00-1.04x; stems and
 * depthwise ties). With 32 registers the tiles are larger and the window is no gain (AVX-512,
 * the same convs: 0.98-1.03x), so it stays rolled there. Bounded by twice the schedule's
 * unroll budget in FMAs: a 7 x 7 stem's window stays a loop. */
static int64_t window_unroll(const cgc *c, int unroll, int64_t nv, int64_t u)
{
    const int inn = c->ns + c->nr - 1;
    if (c->sp->tgt.cpu.vector_registers > 16 || c->W <= 1 || c->nr < 2 || u != 1 ||
        c->rtail[inn] || c->rtail[inn - 1] || unroll <= 0 || nv <= 0)
        return 1;
    const int64_t trip = c->T[inn][1], outer = c->T[inn - 1][1];
    const int64_t p = unroll / nv < 1 ? 1 : unroll / nv; /* the innermost loop's unroll */
    if (p < trip || outer <= 1 || outer * trip * nv > 2 * (int64_t)unroll) return 1;
    return outer;
}

static int64_t reduction_points(const cgc *c);

/* A direct register tile's output lines (and its residual's) requested one vector an
 * iteration over the first nv iterations of its outer reduction loop instead of all before
 * it: 48 requests at once (a 1x1 conv's 6 x 64 tile and its residual) wait on the core's fill
 * buffers while the FMAs behind them cannot start, and spread, each has the rest of the
 * tile's FMAs to arrive in. ResNet-50's layer1 1x1 conv with its residual at batch 8 (64 -> 256
 * channels, 56 x 56), alone, 3 processes each: from DRAM 5.5 -> 4.5 ms, warm 3.1-3.3 -> 2.7-3.4;
 * in its plan (4 rounds alternated with the previous build's) the 1x1 convs of 64 and 128
 * channels 4-12 % faster each. Only for reductions of 128 points or fewer: over 256 channels
 * the burst is paid for by the longer tile (14 x 14, 256 -> 1024 with a residual: 2-3 %
 * slower spread; 56 x 56, 256 -> 64: 3-4 % faster), and a 3x3 conv's K = 576 and more hides it.
 * The table holds each tile vector's offset from the tile's first point in the output (and
 * in a residual, of the output's shape); emit_spread_prefetch reads it. */
static void emit_spread_table(cgc *c, int ind, int64_t nv, const int64_t *accst)
{
    const ir_tensor *o = &c->g->tensor[c->g->output];
    int64_t st[IR_MAX_DIMS], off[IR_MAX_AXES];
    cg_strides(o, st);
    cg_printf(&c->b, "%*sstatic const int64_t tlm_pfo[%lld] = {", ind * 4, "", (long long)nv);
    for (int64_t q = 0; q < nv; q++) {
        tile_point(c, q, accst, off);
        int64_t f = 0;
        for (int d = 0; d < o->ndim && d < c->ns; d++)
            f += off[d] * st[d];
        cg_printf(&c->b, "%s%lld", q ? ", " : "", (long long)f);
    }
    cg_printf(&c->b, "};\n");
}

/* ... the requests of tile vector (outer reduction index), at the top of that loop (twins:
 * the residuals, twin_inputs). */
static void emit_spread_prefetch(cgc *c, int ind, int64_t nv, const int64_t *accst,
                                 const int *twins, int nt)
{
    cg_buf *b = &c->b;
    const char *k = c->a->axis[c->ns];
    int64_t o[IR_MAX_AXES];
    tile_point(c, 0, accst, o);
    cg_names pn;
    point_names(c, o, 0, &pn);
    cg_line(b, ind, "if (%s1 < %lld) {", k, (long long)nv);
    if (!c->stream) {
        cg_printf(b, "%*s__builtin_prefetch(&", (ind + 1) * 4, "");
        emit_output_ref(b, c->g, &pn);
        cg_printf(b, " + tlm_pfo[%s1], 1, 3);\n", k);
    }
    for (int t = 0; t < nt; t++) {
        cg_printf(b, "%*s__builtin_prefetch(&", (ind + 1) * 4, "");
        emit_point_ref(b, c->g, twins[t], &pn);
        cg_printf(b, " + tlm_pfo[%s1], 0, 3);\n", k);
    }
    cg_line(b, ind, "}");
}

/* The register tile of one s2 block: accumulators loaded from the block, the r1 loops with
 * the body on every register point, stored back. c->edge: the edge version (clamped). */
static void emit_regtile(cgc *c, int ind, int64_t nv, const int64_t *accst, int unroll)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr;
    int64_t o[IR_MAX_AXES];
    const char *ty = c->W > 1 ? "tlm_vf" : "float";
    bool maxr = a->reduce == IR_RED_MAX;
    const char *zero = c->W > 1 ? (maxr ? "(tlm_vf){} - INFINITY" : "(tlm_vf){}")
                                : (maxr ? "-INFINITY" : "0.0f");
    for (int64_t q = 0; q < nv; q++) {
        int64_t off = tile_point(c, q, accst, o);
        if (c->fresh)
            cg_line(b, ind, "%s r%lld = %s;", ty, (long long)q, zero);
        else if (c->W > 1)
            cg_line(b, ind, "%s r%lld = *(tlm_vfu *)&blk[%lld];", ty, (long long)q, (long long)off);
        else
            cg_line(b, ind, "%s r%lld = blk[%lld];", ty, (long long)q, (long long)off);
    }
    /* the output lines this tile will store, requested for writing while it computes (a
     * store that misses waits for its line; prefetched, the FMAs hide it; a streamed output
     * is not read at all), and the lines of the inputs its epilogue reads at the same points
     * (a residual), requested for reading: spread over the outer reduction loop's first
     * iterations where it has one per vector (emit_spread_prefetch), else all here */
    int twins[4];
    const int nt = twin_inputs(c->g, twins, 4);
    const bool spread = c->direct && !c->edge && (!c->stream || nt > 0) && nr >= 2 &&
                        !c->rtail[ns] && c->T[ns][1] >= nv && reduction_points(c) <= 128;
    if (spread) {
        emit_spread_table(c, ind, nv, accst);
    } else if (c->direct && !c->edge) {
        for (int64_t q = 0; q < nv; q++) {
            tile_point(c, q, accst, o);
            cg_names pn;
            point_names(c, o, 0, &pn);
            if (!c->stream) {
                cg_printf(b, "%*s__builtin_prefetch(&", ind * 4, "");
                emit_output_ref(b, c->g, &pn);
                cg_printf(b, ", 1, 3);\n");
            }
            for (int k = 0; k < nt; k++) {
                cg_printf(b, "%*s__builtin_prefetch(&", ind * 4, "");
                emit_point_ref(b, c->g, twins[k], &pn);
                cg_printf(b, ", 0, 3);\n");
            }
        }
    }
    if (!c->edge) emit_next_chunk_source(c, ind);
    /* the innermost reduction loop, unrolled in the source: GCC's unroll pragma left the
     * GEMM loops rolled (one k step of 12 FMAs, 6 broadcasts and 2 loads beside 5 loop
     * instructions; 4 steps per iteration: tinyllama's GEMM on one thread, median of 10
     * rounds, AVX2 109 -> 106 ms, AVX-512 69 -> 65 ms) */
    const int inn = ns + nr - 1;
    const char *kn = a->axis[inn];
    const int64_t trip = c->T[inn][1];
    int64_t u = unroll_steps(c, unroll, nv);
    const int64_t whole = window_unroll(c, unroll, nv, u);
    int rind = ind;
    for (int i = ns; i < ns + nr - 1; i++) {
        if (i == ns + nr - 2 && whole > 1)
            cg_line(b, ind, "#pragma GCC unroll %lld", (long long)whole);
        loop_chunk(c, ind++, i);
        if (i == ns && spread) emit_spread_prefetch(c, ind, nv, accst, twins, nt);
        if (i == ns && c->W > 1 && !c->edge) {
            emit_next_rows_prefetch(c, ind);
            emit_next_panel_prefetch(c, ind);
            if (c->nt_load >= 0) emit_next_task_prefetch(c, ind);
        }
        if (i == ns + nr - 2 && c->W > 1 && !c->edge) emit_broadcast_prefetch(c, ind);
    }
    char bound[48];
    if (c->rtail[inn]) snprintf(bound, sizeof bound, "%s1_n", kn);
    else snprintf(bound, sizeof bound, "%lld", (long long)trip);
    bool tail = c->rtail[inn] || trip % u != 0;
    if (u > 1) {
        if (tail) cg_line(b, ind, "int64_t %s1u = 0;", kn);
        cg_line(b, ind++, "for (%s%s1u = 0; %s1u + %lld <= %s; %s1u += %lld) {",
                tail ? "" : "int64_t ", kn, kn, (long long)u, bound, kn, (long long)u);
        for (int64_t q = 0; q < u; q++) {
            cg_line(b, ind++, "{");
            cg_line(b, ind, "const int64_t %s1 = %s1u + %lld;", kn, kn, (long long)q);
            emit_regtile_steps(c, ind, nv, accst, whole > 1);
            cg_line(b, --ind, "}");
        }
        cg_line(b, --ind, "}");
    }
    if (u == 1 || tail) { /* the steps' remainder, or the whole loop as GCC has it */
        if (u > 1) {
            cg_line(b, ind++, "for (int64_t %s1 = %s1u; %s1 < %s; %s1++) {", kn, kn, kn, bound, kn);
        } else {
            if (unroll > 0 && nv > 0) { /* short loops: GCC unrolls them whole */
                int64_t p = unroll / nv < 1 ? 1 : unroll / nv;
                cg_line(b, ind, "#pragma GCC unroll %lld", (long long)(p < trip ? p : trip));
            }
            loop_chunk(c, ind++, inn);
        }
        emit_regtile_steps(c, ind, nv, accst, whole > 1);
        cg_line(b, --ind, "}");
    }
    while (ind > rind) cg_line(b, --ind, "}");
    for (int64_t q = 0; q < nv; q++) {
        int64_t off = tile_point(c, q, accst, o);
        if (c->W > 1) cg_line(b, ind, "*(tlm_vfu *)&blk[%lld] = r%lld;", (long long)off, (long long)q);
        else cg_line(b, ind, "blk[%lld] = r%lld;", (long long)off, (long long)q);
    }
    if (c->direct) emit_tile_store(c, ind, accst);
}

/* Whether the register tile reads a padding select that is not packed: the bound checks run
 * in its inner loop (a broadcast input of a conv vectorised along F, a depthwise input). */
static bool unpacked_selects(const cgc *c)
{
    for (int id = 0; id < c->a->n_expr; id++)
        if (c->a->expr[id].kind == IR_E_SELECT && pack_index(c, id) < 0) return true;
    return false;
}

/* The bounds of every unpacked select's checks hold over the whole register tile and r0
 * chunk: the checks are affine, so their extremes are at the box's corners. */
static void emit_interior_test(cgc *c)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    bool first = true;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_SELECT || pack_index(c, id) >= 0) continue;
        for (int i = 0; i < e->ncond; i++)
            for (int hi = 0; hi < 2; hi++) { /* the least value >= 0, the largest < bound */
                const ir_affine *f = &e->cond[i];
                cg_printf(b, "%s(%lld", first ? "" : " && ", (long long)f->off);
                first = false;
                for (int x = 0; x < c->ns + c->nr; x++) {
                    if (!f->coef[x]) continue;
                    bool top = (f->coef[x] > 0) == (hi == 1); /* the far corner on this axis */
                    if (x < c->ns)
                        cg_printf(b, " + %d * (%s_b + %lld)", f->coef[x], a->axis[x],
                                  (long long)(top ? c->T[x][3] - 1 : 0));
                    else
                        cg_printf(b, " + %d * (%s0 * %lld + %lld)", f->coef[x], a->axis[x],
                                  (long long)c->T[x][1], (long long)(top ? c->T[x][1] - 1 : 0));
                }
                if (hi) cg_printf(b, ") < %lld", (long long)e->cond_hi[i]);
                else cg_printf(b, ") >= 0");
            }
    }
    if (first) cg_printf(b, "1");
}

/* The register tile, and an interior copy without bound checks where they cannot fail (most
 * tiles of a padded convolution: only its border pays for the padding). */
static void emit_regtile_split(cgc *c, int ind, int64_t nv, const int64_t *accst, int unroll)
{
    if (c->W <= 1 || !unpacked_selects(c)) {
        emit_regtile(c, ind, nv, accst, unroll);
        return;
    }
    cg_printf(&c->b, "%*sif (", ind * 4, "");
    emit_interior_test(c);
    cg_printf(&c->b, ") {\n");
    c->interior = true;
    emit_regtile(c, ind + 1, nv, accst, unroll);
    c->interior = false;
    cg_line(&c->b, ind, "} else {");
    emit_regtile(c, ind + 1, nv, accst, unroll);
    cg_line(&c->b, ind, "}");
}

/* A packed spatial axis' index in a pack nest: a padded axis' points past its extent read a
 * clamped copy of its last, never used (where clamp). */
static void emit_pack_axis(cgc *c, int ind, int xx, char fb[][96], bool clamp)
{
    if (c->pad[xx] && clamp)
        cg_line(&c->b, ind, "const int64_t %s = tlm_imin(%s, %lld);", c->a->axis[xx], fb[xx],
                (long long)(c->E[xx] - 1));
    else
        cg_line(&c->b, ind, "const int64_t %s = %s;", c->a->axis[xx], fb[xx]);
}

/* The innermost loop of a pack nest (the vector axis' level 3, stride 1 in P) and its copy
 * statement; clamp_x: the vector axis' index clamped into its extent (its last, ragged run). */
static void emit_pack_copy(cgc *c, int pi, int ind, char fb[][96], bool clamp_x)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr, x = c->x;
    unsigned m = c->pack_mask[pi];
    char v[16];
    snprintf(v, sizeof v, "%s3", a->axis[x]);
    cg_line(b, ind, "#pragma omp simd");
    loop(b, ind++, v, c->T[x][3]);
    cg_names pn = c->nm;
    for (int xx = 0; xx < ns + nr; xx++) {
        pn.axis[xx] = a->axis[xx];
        if (!(m & (1u << xx))) continue;
        if (xx < ns) /* along x clamped only in the ragged run */
            emit_pack_axis(c, ind, xx, fb, xx != x || clamp_x);
        else
            cg_line(b, ind, "const int64_t %s = %s0 * %lld + %s1;", a->axis[xx],
                    a->axis[xx], (long long)c->T[xx][1], a->axis[xx]);
    }
    cg_printf(b, "%*sP%d[", ind * 4, "", pi);
    bool any = false;
    for (int xx = 0; xx < ns + nr; xx++) {
        if (!(m & (1u << xx))) continue;
        if (any) cg_printf(b, " + ");
        if (xx < ns)
            cg_printf(b, "(%s2 * %lld + %s3) * %lld", a->axis[xx], (long long)c->T[xx][3],
                      a->axis[xx], (long long)c->pack_str[pi][xx]);
        else
            cg_printf(b, "%s1 * %lld", a->axis[xx], (long long)c->pack_str[pi][xx]);
        any = true;
    }
    cg_printf(b, "%s] = ", any ? "" : "0");
    cg_emit_scalar(b, c->g, a, c->pack_id[pi], &pn);
    cg_printf(b, ";\n");
    cg_line(b, --ind, "}");
}

/* A pack that transposes (its source strided along the vector axis x: a conv's weights
 * along F, a GEMM's Bᵀ) whose reduction axes, flattened in nest order, are contiguous in the
 * source (each inner chunk a whole axis, the innermost of stride 1): W source rows of the
 * flattened run are loaded as vectors, transposed in registers (log2 W rounds of W two-source
 * shuffles) and stored as W packed rows. Per lane, GCC's copy was a gather of W floats from
 * W lines, 2.4 cycles a float: ResNet-50's 3x3 512 -> 512 conv at 7 x 7 (Zen 5, 2 threads)
 * spent 1.3 of its 2.0 ms transposing its 2.4 M weights each call. Returns false (nothing
 * emitted) where the form does not apply. */
static bool emit_pack_transposed(cgc *c, int pi, int ind, char fb[][96])
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr, x = c->x, W = c->W;
    unsigned m = c->pack_mask[pi];
    const ir_expr *e = &a->expr[c->pack_id[pi]];
    if ((W != 8 && W != 16) || e->kind != IR_E_LOAD || c->T[x][3] % W != 0 ||
        e->tensor == c->nm.subst_tensor || c->nm.scalar_tensor[e->tensor] || c->nm.load_hook)
        return false;
    const int64_t fx = flat_coef(c->g, e, x);
    if (fx == 0 || fx == 1) return false;
    /* the flattened run: innermost of stride 1, each outer stride the product of the inner
     * chunks, every inner chunk whole */
    int64_t run = 1;
    int inner = -1, prev = -1; /* inner: the run's innermost axis, its packed stride the run's */
    for (int xx = ns + nr - 1; xx >= ns; xx--) {
        if (!(m & (1u << xx))) continue;
        if (c->rtail[xx] || flat_coef(c->g, e, xx) != run) return false;
        if (prev >= 0 && c->T[prev][1] != c->E[prev]) return false;
        if (inner < 0) inner = xx;
        prev = xx;
        run *= c->T[xx][1];
    }
    if (inner < 0 || run < W) return false;
    const int64_t ps = c->pack_str[pi][inner];
    const char *xn = a->axis[x];
    const int base = ind;
    cg_line(b, ind, "/* pack operand %d: transposed, %d x %d blocks in registers */", pi, W, W);
    cg_line(b, ind, "{");
    ind++;
    cg_line(b, ind, "typedef int32_t tlm_ti __attribute__((vector_size(%d)));", 4 * W);
    char v[16];
    /* the other packed spatial axes (a batched Bᵀ's batch), each block of them a panel */
    for (int xx = 0; xx < ns; xx++) {
        if (xx == x || !(m & (1u << xx))) continue;
        snprintf(v, sizeof v, "%s2", a->axis[xx]);
        loop(b, ind++, v, c->T[xx][2]);
        snprintf(v, sizeof v, "%s3", a->axis[xx]);
        loop(b, ind++, v, c->T[xx][3]);
        emit_pack_axis(c, ind, xx, fb, true);
    }
    snprintf(v, sizeof v, "%s2", xn);
    loop(b, ind++, v, c->T[x][2]);
    cg_line(b, ind++, "for (int64_t %s3 = 0; %s3 < %lld; %s3 += %d) {", xn, xn,
            (long long)c->T[x][3], xn, W);
    emit_pack_axis(c, ind, x, fb, true);
    if (c->pad[x]) /* rows past the extent read the last */
        cg_line(b, ind, "const int64_t lim = %lld - %s;", (long long)(c->E[x] - 1), xn);
    cg_names pn = anchor_names(c, ns + nr);
    for (int xx = ns; xx < ns + nr; xx++)
        if (m & (1u << xx))
            cg_line(b, ind, "const int64_t %s = %s0 * %lld;", a->axis[xx], a->axis[xx],
                    (long long)c->T[xx][1]);
    cg_printf(b, "%*sconst float *const src = &%s[", ind * 4, "", pn.tensor[e->tensor]);
    cg_emit_offset(b, c->g, a, e, &pn);
    cg_printf(b, "];\n");
    cg_printf(b, "%*sfloat *const dst = P%d + %s2 * %lld + %s3", ind * 4, "", pi, xn,
              (long long)c->T[x][3], xn);
    for (int xx = 0; xx < ns; xx++)
        if (xx != x && (m & (1u << xx)))
            cg_printf(b, " + (%s2 * %lld + %s3) * %lld", a->axis[xx], (long long)c->T[xx][3],
                      a->axis[xx], (long long)c->pack_str[pi][xx]);
    cg_printf(b, ";\n");
    cg_line(b, ind, "int64_t r = 0;");
    cg_line(b, ind++, "for (; r + %d <= %lld; r += %d) {", W, (long long)run, W);
    for (int q = 0; q < W; q++)
        if (c->pad[x])
            cg_line(b, ind,
                    "tlm_vf t%d = *(const tlm_vfu *)(src + (%d < lim ? %d : lim) * %lld + r);", q,
                    q, q, (long long)fx);
        else
            cg_line(b, ind, "tlm_vf t%d = *(const tlm_vfu *)(src + %lld + r);", q,
                    (long long)(q * fx));
    for (int h = 1; h < W; h *= 2) {
        char lo[256], hi[256];
        int nlo = 0, nhi = 0;
        for (int l = 0; l < W; l++) {
            nlo += snprintf(lo + nlo, sizeof lo - (size_t)nlo, "%s%d", l ? ", " : "",
                            (l / h) % 2 == 0 ? l : W + l - h);
            nhi += snprintf(hi + nhi, sizeof hi - (size_t)nhi, "%s%d", l ? ", " : "",
                            (l / h) % 2 == 0 ? l + h : W + l);
        }
        cg_line(b, ind++, "{");
        cg_line(b, ind, "const tlm_ti lo = {%s}, hi = {%s};", lo, hi);
        for (int q = 0; q < W; q++)
            if (!(q & h))
                cg_line(b, ind, "{ const tlm_vf u = __builtin_shuffle(t%d, t%d, lo); "
                                "t%d = __builtin_shuffle(t%d, t%d, hi); t%d = u; }",
                        q, q + h, q + h, q, q + h, q);
        cg_line(b, --ind, "}");
    }
    for (int q = 0; q < W; q++)
        cg_line(b, ind, "*(tlm_vfu *)(dst + (r + %d) * %lld) = t%d;", q, (long long)ps, q);
    cg_line(b, --ind, "}");
    cg_line(b, ind, "for (; r < %lld; r++)", (long long)run);
    cg_line(b, ind + 1, "for (int q = 0; q < %d; q++) dst[r * %lld + q] = src[%s * %lld + r];", W,
            (long long)ps, c->pad[x] ? "(q < lim ? q : lim)" : "q", (long long)fx);
    while (ind > base) cg_line(b, --ind, "}");
    return true;
}

/* The loop nest that copies one r0 chunk of packed operand pi, in register-tile order, into
 * P<pi> (the task's buffer, or a panel of the operand's global pack). A padded vector axis
 * clamps its index only in the run that reaches past its extent: clamped throughout, GCC
 * copied every run by gathers, one 8-lane gather per 8 floats, which on a matrix wider than
 * the TLB's reach waited on DRAM for each (GPT-2's LM head, 128 x 50257 x 768, Zen 5, 2
 * threads: 68.7 ms packed, 23.9 read in place). */
static void emit_pack_nest(cgc *c, int pi, int ind, char fb[][96])
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr, x = c->x;
    int pind = ind;
    unsigned m = c->pack_mask[pi];
    if (emit_pack_transposed(c, pi, ind, fb)) return;
    cg_line(b, ind, "/* pack operand %d */", pi);
    for (int xx = ns; xx < ns + nr; xx++)
        if (m & (1u << xx)) loop_chunk(c, ind++, xx);
    /* the packed spatial axes but the vector axis' level 3 (emit_pack_copy) */
    for (int k = 0; k < ns; k++) {
        int xx = k < ns - 1 ? (k < x ? k : k + 1) : x;
        if (!(m & (1u << xx))) continue;
        char v[16];
        snprintf(v, sizeof v, "%s2", a->axis[xx]);
        loop(b, ind++, v, c->T[xx][2]);
        if (xx == x) continue;
        snprintf(v, sizeof v, "%s3", a->axis[xx]);
        loop(b, ind++, v, c->T[xx][3]);
    }
    if (c->pad[x]) {
        /* the run's last index, from the vector axis' index at its last point */
        cg_line(b, ind, "int64_t run_end;");
        cg_line(b, ind, "{");
        cg_line(b, ind + 1, "const int64_t %s3 = %lld;", a->axis[x], (long long)(c->T[x][3] - 1));
        cg_line(b, ind + 1, "run_end = %s;", fb[x]);
        cg_line(b, ind, "}");
        cg_line(b, ind, "if (run_end < %lld) {", (long long)c->E[x]);
        emit_pack_copy(c, pi, ind + 1, fb, false);
        cg_line(b, ind, "} else {");
        emit_pack_copy(c, pi, ind + 1, fb, true);
        cg_line(b, ind, "}");
    } else {
        emit_pack_copy(c, pi, ind, fb, false);
    }
    while (ind > pind) cg_line(b, --ind, "}");
}

/* The linear index of the blocks of the axes in mask within [lo, hi), in axis order (the
 * variables of the task and r0 loops): a spatial axis' s0 block, with its s1 block inside it
 * when with_s1, and a reduction axis' r0 chunk. A global pack's panel: all its axes, s1
 * included; a kept panel (plan_keep): its spatial axes (one s1 block each) or its chunks. */
static void emit_block_index(cgc *c, unsigned mask, int lo, int hi, bool with_s1)
{
    cg_buf *b = &c->b;
    for (int xx = lo; xx < hi; xx++)
        if (mask & (1u << xx)) cg_printf(b, "(");
    cg_printf(b, "(int64_t)0");
    for (int xx = lo; xx < hi; xx++) {
        if (!(mask & (1u << xx))) continue;
        const char *n = c->a->axis[xx];
        if (xx < c->ns && with_s1)
            cg_printf(b, " * %lld + %s0 * %lld + %s1)", (long long)(c->T[xx][0] * c->T[xx][1]),
                      n, (long long)c->T[xx][1], n);
        else
            cg_printf(b, " * %lld + %s0)", (long long)c->T[xx][0], n);
    }
}

/* Which operands are packed (SLOT_PACK: those along the vector axis), their buffers'
 * layout, and which are packed once per call (see pack_glob). */
static void plan_packs(cgc *c)
{
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr, x = c->x;
    if (nr == 0 || !space_get(c->sp, c->s, SLOT_PACK, 0) || c->W <= 1) return;
    int64_t total = 0;
    for (int id = 0; id < a->n_expr; id++) {
        if (!space_cpu_packable(c->sp, x, id)) continue;
        int pi = c->npack++;
        c->pack_id[pi] = id;
        c->pack_mask[pi] = space_expr_axes(c->sp, id);
        /* the vector axis innermost (a packable operand depends on it) */
        int64_t st = c->T[x][2] * c->T[x][3];
        c->pack_str[pi][x] = 1;
        for (int xx = ns - 1; xx >= 0; xx--)
            if (xx != x && (c->pack_mask[pi] & (1u << xx))) {
                c->pack_str[pi][xx] = st;
                st *= c->T[xx][2] * c->T[xx][3];
            }
        for (int xx = ns + nr - 1; xx >= ns; xx--)
            if (c->pack_mask[pi] & (1u << xx)) {
                c->pack_str[pi][xx] = st;
                st *= c->T[xx][1];
            }
        c->pack_size[pi] = st;
        /* how many blocks read each panel: packed by each of them, or once (packing once
         * costs a barrier, and a panel packed by another core is fetched from its cache:
         * worth it from 4 readers on, measured on 2 cores) */
        int64_t blocks = 1, readers = 1;
        for (int xx = 0; xx < ns + nr; xx++) {
            int64_t cnt = xx < ns ? c->T[xx][0] * c->T[xx][1] : c->T[xx][0];
            if (c->pack_mask[pi] & (1u << xx)) blocks *= cnt;
            else if (xx < ns) readers *= cnt;
        }
        bool shared = readers >= 4;
        c->pack_blocks[pi] = blocks;
        c->pack_stride[pi] = (st + 15) / 16 * 16; /* panels start on cache lines */
        c->pack_glob[pi] = shared;
        if (shared) total += blocks * c->pack_stride[pi];
    }
    /* worth it when the panels stay in L2, or when each task would spend a large share of
     * its time transposing: one float read across the vector axis (each lane from its own
     * line: a conv's weights along F) per 32 vector FMAs or more. A conv along F whose task is
     * an output row repacks all the weights for it; one whose task is 40 columns by 4 rows by
     * 64 filters spent a third of its time transposing its weights (10 vector FMAs per packed
     * float): 5.6 -> 3.6 ms packed once. Contiguous panels larger than that are packed per
     * task even when it costs a float per 3 FMAs: packed once, they were read back from L3
     * slower (a 577 x 1152 x 384 GEMM's B, 1.8 MB: 2.4 -> 2.2 ms per task; a 1x1 conv's
     * 1.3 MB input: 1.78 -> 1.50 ms). */
    int64_t l2 = target_l2(c);
    double fma = 1, packed = 0;
    for (int xx = 0; xx < ns; xx++) fma *= (double)(c->T[xx][1] * c->T[xx][2] * c->T[xx][3]);
    for (int xx = ns; xx < ns + nr; xx++) fma *= (double)c->E[xx];
    fma /= c->W;
    for (int pi = 0; pi < c->npack; pi++) {
        double per_task = (double)c->pack_size[pi];
        for (int xx = 0; xx < ns + nr; xx++)
            if (c->pack_mask[pi] & (1u << xx)) per_task *= (double)c->T[xx][xx < ns ? 1 : 0];
        const ir_expr *e = &a->expr[c->pack_id[pi]];
        if (e->kind == IR_E_SELECT) e = &a->expr[e->a];
        if (e->kind == IR_E_LOAD && flat_coef(c->g, e, x) != 1) packed += per_task;
    }
    bool costly = packed * 32 > fma;
    if (total > CPU_PACK_GLOBAL_MAX || (total * 4 > l2 / 2 && !costly))
        for (int pi = 0; pi < c->npack; pi++) c->pack_glob[pi] = false;
}

/* Floats of a panel kept across tasks (plan_keep): 512 KiB, on each thread's stack, half a
 * 1 MiB L2. From 256 KiB: a 1021 x 1031 x 1009 GEMM's 128-column B panel (4 chunks of 256)
 * kept on AVX-512, 15.9 -> 12.9 ms; CLIP-L's fc1 12.8 -> 11.0 ms (Zen 4, 2 threads). */
#define CPU_KEEP_MAX 131072

/* A panel packed per task is the same for every task that differs only along the axes it
 * does not depend on (a GEMM's B panel for every block of rows): instead of each task packing
 * it again, each thread keeps the last panel it packed (all its r0 chunks) and the tasks run
 * with those other axes fastest. A 577 x 1152 x 384 GEMM on AVX2 packed its 32-column B panel
 * in every one of its 504 tasks (20 % of its time, one thread); kept, 14 times fewer: 7.16 ->
 * 6.28 ms on one Zen 4 core, 3.59 -> 3.11 ms on two (OpenBLAS 6.19 and 2.94). Only one task
 * pack can be kept (one task order), its spatial axes one block per task (s1 = 1), and the
 * tasks must be a single fused level. Not under a streamed output (tile_stream): there the
 * stores bound the time and the tasks keep the order that writes each row's blocks in turn
 * (a 4096 x 4096 x 40 attention score matrix, its panel 1280 floats: 9.0 -> 10.6 ms kept). */
static void plan_keep(cgc *c, int fused_levels)
{
    c->keep_pi = -1;
    if (fused_levels != 1 || c->stream) return;
    int pk = -1;
    for (int pi = 0; pi < c->npack; pi++) {
        if (c->pack_glob[pi]) continue;
        if (pk >= 0) return;
        pk = pi;
    }
    if (pk < 0) return;
    unsigned m = c->pack_mask[pk];
    int64_t chunks = 1, readers = 1;
    for (int xx = 0; xx < c->ns + c->nr; xx++) {
        bool in = (m & (1u << xx)) != 0;
        if (xx < c->ns && in && c->T[xx][1] != 1) return;
        if (xx < c->ns && !in) readers *= c->T[xx][0];
        if (xx >= c->ns && in) chunks *= c->T[xx][0];
    }
    if (readers < 2 || c->pack_size[pk] * chunks > CPU_KEEP_MAX) return;
    c->keep_pi = pk;
    c->keep_chunks = chunks;
}

/* The operands a task reads, for order_traffic: per distinct loaded tensor, the task axes
 * its index moves with (dep, a mask) and the bytes one task's block of it spans (per dim:
 * the distinct indices; along the last, the contiguous range they span). */
typedef struct {
    int n;
    unsigned dep[IR_MAX_TENSORS];
    double bytes[IR_MAX_TENSORS];
    double whole;  /* the bytes of all the loaded tensors */
    bool overlap;  /* a tensor's blocks overlap between tasks (a window's halo) */
} task_operands;

static void task_operands_of(const cgc *c, task_operands *o)
{
    const ir_stage *a = c->a;
    int tensor[IR_MAX_TENSORS];
    o->n = 0;
    o->whole = 0;
    o->overlap = false;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD) continue;
        const ir_tensor *t = &c->g->tensor[e->tensor];
        unsigned dep = 0;
        double bytes = 4;
        for (int d = 0; d < t->ndim; d++) {
            int64_t range = 1, points = 1;
            bool moves = false, window = false;
            for (int x = 0; x < c->ns + c->nr; x++) {
                const int64_t k = e->idx[d].coef[x];
                if (!k) continue;
                int64_t span = x < c->ns ? c->T[x][1] * c->T[x][2] * c->T[x][3] : c->E[x];
                if (span > c->E[x]) span = c->E[x];
                if (x < c->ns && c->T[x][0] > 1) dep |= 1u << x, moves = true;
                if (x >= c->ns && c->E[x] > 1) window = true;
                range += (k < 0 ? -k : k) * (span - 1);
                points *= span;
            }
            o->overlap |= moves && window;
            int64_t v = d == t->ndim - 1 || points > range ? range : points;
            bytes *= (double)(v < t->shape[d] ? v : t->shape[d]);
        }
        int k = 0;
        while (k < o->n && tensor[k] != e->tensor) k++;
        if (k == o->n) {
            if (o->n == IR_MAX_TENSORS) continue;
            tensor[o->n++] = e->tensor;
            o->dep[k] = 0;
            o->bytes[k] = 0;
            double whole = 4;
            for (int d = 0; d < t->ndim; d++) whole *= (double)t->shape[d];
            o->whole += whole;
        }
        o->dep[k] |= dep;
        if (bytes > o->bytes[k]) o->bytes[k] = bytes;
    }
}

/* The bytes one thread brings into its L2 running its tasks in the order ord (fastest
 * axis first), the classic loop-nest reuse model: the thread's share of the task grid is
 * a nest, outermost axis split among the cores; an operand's block is fetched once per
 * iteration of the axes it depends on, and again on each iteration of an outer axis it
 * does not depend on when the blocks that iteration's body touches (of every operand)
 * outgrow the cache. */
static double order_traffic(const cgc *c, const task_operands *o, const int *ord, double cap)
{
    const int ns = c->ns;
    int ax[IR_MAX_AXES];
    double t[IR_MAX_AXES];
    int64_t P = c->sp->tgt.cpu.cores > 1 ? c->sp->tgt.cpu.cores : 1;
    for (int j = 0; j < ns; j++) { /* outermost first */
        ax[j] = ord[ns - 1 - j];
        int64_t trip = c->T[ax[j]][0];
        if (P > 1 && trip >= P) {
            trip = (trip + P - 1) / P;
            P = 1;
        } else if (P > 1) {
            P = (P + trip - 1) / trip;
            trip = 1;
        }
        t[j] = (double)trip;
    }
    double body[IR_MAX_AXES + 1]; /* body[j]: the blocks one iteration of level j touches */
    for (int j = 0; j <= ns; j++) {
        body[j] = 0;
        for (int k = 0; k < o->n; k++) {
            double f = o->bytes[k];
            for (int l = j + 1; l < ns; l++)
                if (o->dep[k] >> ax[l] & 1u) f *= t[l];
            body[j] += f;
        }
    }
    double total = 0;
    for (int k = 0; k < o->n; k++) {
        int inner = -1;
        for (int j = 0; j < ns; j++)
            if (o->dep[k] >> ax[j] & 1u && t[j] > 1) inner = j;
        double f = o->bytes[k];
        for (int j = 0; j <= inner; j++)
            if (o->dep[k] >> ax[j] & 1u || body[j] > cap) f *= t[j];
        total += f;
    }
    return total;
}

/* The order the task index is decoded in, fastest axis first: with a kept panel, the axes
 * it does not depend on first; otherwise the last spatial axis first, unless moving one
 * other task axis to the fastest place halves what each core brings into its L2
 * (order_traffic). The last-axis-first order walks a conv's output plane under one block of
 * filters: the weights panel stays in L2 and the input streams, right while the input is
 * the smaller operand. Where the input outgrows L2 beside smaller weights, it is read from
 * L3 once per block of filters; filters fastest read it once. Alternated, filters fastest
 * against the plane fastest: ResNet-50's 1x1 stride-2 downsample (256 to 512 channels at
 * 56 x 56) 1.08x at batch 1 and 1.10-1.23x at batch 8 on AVX-512; on AVX2 its 1x1s at
 * 56 x 56 1.13-1.39x, at 28 x 28 0.97-1.08x, MobileNetV2's and EfficientNet-B0's 144-to-24
 * projection 1.06-1.18x. The model is a coarse one, so it is kept to where it held:
 *  - no tensor's blocks overlap between tasks (a window's halo rows): over 3x3 convs its
 *    picks went both ways (sd15, YOLOv5 and ResNet-50's 3x3s 0.88-1.15x);
 *  - the tensors outgrow the cache together (below, nothing is read twice from L3: small
 *    projections 0.87-0.93x, the split being all that changed);
 *  - one axis moved, the others kept in their order (images moved inside output columns:
 *    ResNet-50's 1x1 at 14 x 14, batch 8, 0.86x);
 *  - half the bytes, not less (the 1.6-1.8x cases measured 0.97-1.03x on AVX-512).
 * Not with two fused task levels, nor under a streamed output (plan_keep's reason). */
static void task_order(const cgc *c, int *ord)
{
    int n = 0;
    unsigned m = c->keep_pi >= 0 ? c->pack_mask[c->keep_pi] : 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = c->ns - 1; i >= 0; i--)
            if (((m >> i) & 1u) == (unsigned)pass) ord[n++] = i;
    int par = (int)space_get(c->sp, c->s, SLOT_PARALLEL, 0);
    if (c->keep_pi >= 0 || par != 1 || c->stream || c->nr == 0) return;
    task_operands o;
    task_operands_of(c, &o);
    const double cap = 0.75 * (double)target_l2(c);
    if (o.overlap || o.whole <= cap) return;
    double best = 0.5 * order_traffic(c, &o, ord, cap);
    const size_t bytes = (size_t)c->ns * sizeof *ord;
    int cand[IR_MAX_AXES], pick[IR_MAX_AXES];
    memcpy(pick, ord, bytes);
    for (int q = 1; q < c->ns; q++) { /* ord[q] moved to the fastest place */
        if (c->T[ord[q]][0] < 2) continue;
        cand[0] = ord[q];
        for (int r = 0, m2 = 1; r < c->ns; r++)
            if (r != q) cand[m2++] = ord[r];
        double v = order_traffic(c, &o, cand, cap);
        if (v < best) best = v, memcpy(pick, cand, bytes);
    }
    memcpy(ord, pick, bytes);
}

/* The call buffers (global packs, padded copies) live in slots kept across calls: slot k of
 * tlm_scratch holds buffer k between calls. A call takes its buffer out of the slot (an atomic
 * exchange; a concurrent call finds the slot empty and allocates its own) and puts it back
 * when done (freeing whatever another call put there meanwhile), so a repeated call neither
 * allocates nor faults its pages in again: a fresh multi-megabyte aligned_alloc is an mmap
 * whose page faults the threads take together (a 3x3 stride-2 conv on AVX2, 4.6 MB of padded
 * input and packed weights: its padded copy 1.3-1.5 ms a call against 0.35-0.55 ms from a
 * reused buffer, of ~6.5 ms, 2 threads). Each buffer is written whole before it is read (pads
 * and packs), so reuse needs no clearing. The memory stays with the loaded kernel (freed when
 * it is unloaded); the slot's size is fixed per kernel. A failed allocation means the process
 * is out of memory, and a void kernel has no way to say so (kernels are measured in child
 * processes, where a trap is reported as a crash).
 * scratch_slot: the slot of global pack pi (pad copy k: pack = -1, pad = k);
 * scratch_slot(c, -1, c->npad) is the number of slots. */
static int scratch_slot(const cgc *c, int pack, int pad)
{
    int n = 0;
    for (int pi = 0; pi < c->npack; pi++)
        if (c->pack_glob[pi] && (pack < 0 || pi < pack)) n++;
    return pack >= 0 ? n : n + pad;
}

/* tlm_scratch_take(k, bytes) / tlm_scratch_give(k, p) over n slots; k outside [0, n) (a
 * thread past the per-thread slots) allocates and frees, and with n = 0 they are
 * aligned_alloc and free. */
static void emit_scratch_slots(cg_buf *b, int n)
{
    if (n == 0) {
        cg_line(b, 0, "static void *tlm_scratch_take(int k, size_t bytes) { (void)k; return "
                      "aligned_alloc(64, bytes); }");
        cg_line(b, 0, "static void tlm_scratch_give(int k, void *p) { (void)k; free(p); }");
        return;
    }
    cg_line(b, 0, "/* call buffers kept across calls (codegen/cpu.c scratch_slot) */");
    cg_line(b, 0, "static void *tlm_scratch[%d];", n);
    cg_line(b, 0, "static void *tlm_scratch_take(int k, size_t bytes)");
    cg_line(b, 0, "{");
    cg_line(b, 1, "void *p = k >= 0 && k < %d ? __atomic_exchange_n(&tlm_scratch[k], (void *)0, "
                  "__ATOMIC_ACQUIRE) : (void *)0;", n);
    cg_line(b, 1, "return p ? p : aligned_alloc(64, bytes);");
    cg_line(b, 0, "}");
    cg_line(b, 0, "static void tlm_scratch_give(int k, void *p)");
    cg_line(b, 0, "{");
    cg_line(b, 1, "free(k >= 0 && k < %d ? __atomic_exchange_n(&tlm_scratch[k], p, __ATOMIC_ACQ_REL) "
                  ": p);", n);
    cg_line(b, 0, "}");
    cg_line(b, 0, "__attribute__((destructor)) static void tlm_scratch_release(void)");
    cg_line(b, 0, "{");
    cg_line(b, 1, "for (int k = 0; k < %d; k++) free(tlm_scratch[k]);", n);
    cg_line(b, 0, "}");
}

static void emit_scratch_helpers(cgc *c)
{
    int n = scratch_slot(c, -1, c->npad);
    if (n) emit_scratch_slots(&c->b, n);
}

/* A rows kernel's scratch row(s), one buffer per thread, taken and given back by the thread's
 * number in the team: kept in per-thread slots once a buffer is past glibc's mmap threshold
 * (128 KiB), below which malloc reuses its heap anyway. */
enum { SCRATCH_THREADS = 64, SCRATCH_MIN_BYTES = 128 << 10 };

static void emit_row_scratch(cg_buf *b, int64_t bytes)
{
    cg_line(b, 0, "#include <omp.h>");
    emit_scratch_slots(b, bytes < SCRATCH_MIN_BYTES ? 0 : SCRATCH_THREADS);
}

static void emit_call_buffer(cgc *c, int ind, const char *name, int slot, int64_t bytes)
{
    cg_line(&c->b, ind, "float *const %s = (float *)tlm_scratch_take(%d, %lld);", name, slot,
            (long long)bytes);
    cg_line(&c->b, ind, "if (!%s) __builtin_trap();", name);
}

/* The global packs: G<i> allocated and filled panel by panel (in parallel when the kernel
 * is) before the task loop; given back to its slot after it (emit_global_frees). */
static void emit_global_fill(cgc *c, int pi, int ind, bool par, char fb[][96]);

static void emit_global_packs(cgc *c, int ind, bool par, char fb[][96])
{
    cg_buf *b = &c->b;
    for (int pi = 0; pi < c->npack; pi++) {
        if (!c->pack_glob[pi]) continue;
        int64_t n = c->pack_blocks[pi] * c->pack_stride[pi];
        cg_line(b, ind, "/* operand %d packed once: %lld panels of %lld floats */", pi,
                (long long)c->pack_blocks[pi], (long long)c->pack_stride[pi]);
        const int k = c->pre_k[pi];
        if (k < 0) {
            char gn[16];
            snprintf(gn, sizeof gn, "G%d", pi);
            emit_call_buffer(c, ind, gn, scratch_slot(c, pi, 0), n * 4);
            emit_global_fill(c, pi, ind, par, fb);
            continue;
        }
        /* handed in packed by the caller, or packed here */
        cg_line(b, ind, "float *G%d = (float *)tlm_pre%d;", pi, k);
        cg_line(b, ind, "const int G%d_own = !G%d;", pi, pi);
        cg_line(b, ind, "if (G%d_own) {", pi);
        cg_line(b, ind + 1, "G%d = (float *)tlm_scratch_take(%d, %lld);", pi,
                scratch_slot(c, pi, 0), (long long)(n * 4));
        cg_line(b, ind + 1, "if (!G%d) __builtin_trap();", pi);
        emit_global_fill(c, pi, ind + 1, par, fb);
        cg_line(b, ind, "}");
    }
}

/* Fills G<pi>, panel by panel (in parallel when the kernel is). */
static void emit_global_fill(cgc *c, int pi, int ind, bool par, char fb[][96])
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    if (par) cg_line(b, ind, "#pragma omp parallel for schedule(static)");
    cg_line(b, ind, "for (int64_t pb = 0; pb < %lld; pb++) {", (long long)c->pack_blocks[pi]);
    int pind = ind + 1;
    cg_line(b, pind, "int64_t prem = pb;");
    for (int xx = c->ns + c->nr - 1; xx >= 0; xx--) {
        if (!(c->pack_mask[pi] & (1u << xx))) continue;
        const char *nm = a->axis[xx];
        if (xx < c->ns) {
            cg_line(b, pind, "const int64_t %s1 = prem %% %lld;", nm, (long long)c->T[xx][1]);
            cg_line(b, pind, "prem /= %lld;", (long long)c->T[xx][1]);
        }
        cg_line(b, pind, "const int64_t %s0 = prem %% %lld;", nm, (long long)c->T[xx][0]);
        cg_line(b, pind, "prem /= %lld;", (long long)c->T[xx][0]);
        if (xx >= c->ns) emit_chunk_len(c, pind, xx);
    }
    cg_line(b, pind, "(void)prem;");
    cg_line(b, pind, "float *const P%d = G%d + pb * %lld;", pi, pi,
            (long long)c->pack_stride[pi]);
    emit_pack_nest(c, pi, pind, fb);
    cg_line(b, ind, "}");
}

/* Prepacks (kernel ABI in codegen.h): a packed operand that is an input tensor as it is (a
 * load, possibly under a padding select: a conv's or a GEMM's weights, an activation
 * alike) can be packed by the caller once, in the global layout, when the caller knows the
 * tensor does not change between calls (a plan's params). Every call repacked a conv's
 * weights, by far its largest operand at a network's deep layers (ResNet-50's layer 4:
 * 9.4 MB a 3x3 conv, read from DRAM, transposed and written on every call). */
static void plan_prepacks(cgc *c)
{
    int in[IR_MAX_TENSORS];
    int n = ir_subgraph_inputs(c->g, in);
    c->npre = 0;
    for (int pi = 0; pi < c->npack; pi++) {
        c->pre_k[pi] = -1;
        const ir_expr *e = &c->a->expr[c->pack_id[pi]];
        if (e->kind == IR_E_SELECT) e = &c->a->expr[e->a];
        if (e->kind != IR_E_LOAD) continue;
        for (int i = 0; i < n && c->npre < CG_MAX_PRE; i++)
            if (in[i] == e->tensor) {
                c->pre_k[pi] = c->npre;
                c->pre_pi[c->npre] = pi;
                c->pre_arg[c->npre++] = i;
            }
    }
}

/* The prepack entries (after the kernel's body, emitted as <entry>_run with tlm_pre):
 * <entry> (tlm_pre NULL), <entry>_prepacks, <entry>_prepack, <entry>_prepacked. */
static void emit_prepack_entries(cgc *c, const char *entry)
{
    cg_buf *b = &c->b;
    const bool par = space_get(c->sp, c->s, SLOT_PARALLEL, 0) != 0;
    char fb[IR_MAX_AXES][96];
    for (int i = 0; i < c->ns + c->nr; i++) full_index(c, i, fb[i], sizeof fb[i]);
    int in[IR_MAX_TENSORS];
    int n = ir_subgraph_inputs(c->g, in);
    cg_printf(b, "\nvoid %s(", entry);
    cg_emit_params(b, c->g, &c->nm, false);
    cg_printf(b, ")\n{\n    %s_run(", entry);
    for (int i = 0; i < n; i++) cg_printf(b, "%s, ", c->g->tensor[in[i]].name);
    cg_printf(b, "%s, (const float *const *)0);\n}\n\n", c->g->tensor[c->g->output].name);
    cg_line(b, 0, "int %s_prepacks(int k, int *arg, long long *floats)", entry);
    cg_line(b, 0, "{");
    for (int k = 0; k < c->npre; k++) {
        const int pi = c->pre_pi[k];
        cg_line(b, 1, "if (k == %d) *arg = %d, *floats = %lldLL;", k, c->pre_arg[k],
                (long long)(c->pack_blocks[pi] * c->pack_stride[pi]));
    }
    cg_line(b, 1, "return %d;", c->npre);
    cg_line(b, 0, "}");
    cg_printf(b, "\nstatic void %s_prepack_run(int k, ", entry);
    cg_emit_params(b, c->g, &c->nm, false);
    cg_printf(b, ", float *const dst)\n{\n");
    for (int i = 0; i < n; i++) cg_line(b, 1, "(void)%s;", c->g->tensor[in[i]].name);
    cg_line(b, 1, "(void)%s;", c->g->tensor[c->g->output].name);
    for (int k = 0; k < c->npre; k++) {
        const int pi = c->pre_pi[k];
        cg_line(b, 1, "if (k == %d) {", k);
        cg_line(b, 2, "float *const G%d = dst;", pi);
        emit_global_fill(c, pi, 2, par, fb);
        cg_line(b, 1, "}");
    }
    cg_line(b, 0, "}");
    cg_printf(b, "\nvoid %s_prepack(int k, void *const *args, float *dst)\n{\n", entry);
    cg_printf(b, "    %s_prepack_run(k, ", entry);
    emit_args_from_array(b, c->g);
    cg_printf(b, ", dst);\n}\n");
    cg_printf(b, "\nvoid %s_prepacked(void *const *args, const float *const *pre)\n{\n", entry);
    cg_printf(b, "    %s_run(", entry);
    emit_args_from_array(b, c->g);
    cg_printf(b, ", pre);\n}\n");
}

static void emit_global_frees(cgc *c)
{
    for (int pi = 0; pi < c->npack; pi++)
        if (c->pack_glob[pi] && c->pre_k[pi] >= 0)
            cg_line(&c->b, 1, "if (G%d_own) tlm_scratch_give(%d, G%d);", pi,
                    scratch_slot(c, pi, 0), pi);
        else if (c->pack_glob[pi])
            cg_line(&c->b, 1, "tlm_scratch_give(%d, G%d);", scratch_slot(c, pi, 0), pi);
    for (int k = 0; k < c->npad; k++)
        cg_line(&c->b, 1, "tlm_scratch_give(%d, %s);", scratch_slot(c, -1, k),
                c->g->tensor[c->pad_dst[k]].name);
}

/* ---- padded copies ---- */

/* The least and the largest value of affine f over the stage's iteration domain. */
static void affine_range(const cgc *c, const ir_affine *f, int64_t *lo, int64_t *hi)
{
    *lo = *hi = f->off;
    for (int x = 0; x < c->ns + c->nr; x++) {
        int64_t v = (int64_t)f->coef[x] * (c->E[x] - 1);
        if (v < 0) *lo += v;
        else *hi += v;
    }
}

/* A padding select that the register tile reads unpacked (a conv's input when the vectors
 * run along F) costs the border tiles a bound check per point, which also keeps GCC from
 * strength-reducing their addresses: the edge tiles of a 3x3 conv ran at about half speed,
 * 13 % of the whole on a 80x80 plane. When the work is large beside the copy (8 vector FMAs
 * per copied float or more: the copy costs about 2 %), the tensor is copied once per call
 * with its padding written in, and those selects become plain loads of the copy. A select
 * whose checks always hold becomes its load. Each check must bound one dim of the loaded
 * tensor by that dim's size (the padding selects the convolutions and pools build).
 * A packed select is copied too when the packs read the tensor 4 times over or more (its
 * pack is then a plain copy; with the checks GCC vectorised it on 64-bit indices: a 3x3
 * conv's im2col panels from 4 channels, 16 % of the kernel's time on AVX2, 1.21 -> 1.03 ms
 * on one core); read about once (a stride-2 1-D conv's panels), the copy is the dearer. */
static void plan_padcopies(cgc *c)
{
    const ir_subgraph *g = c->g;
    const ir_stage *a = c->a;
    int n = c->ns + c->nr;
    bool any_select = false;
    for (int id = 0; id < a->n_expr; id++) any_select |= a->expr[id].kind == IR_E_SELECT;
    if (c->W <= 1 || !any_select) return;
    int npad = 0, src[IR_MAX_TENSORS], copy_of[IR_MAX_EXPR];
    int64_t lo[IR_MAX_TENSORS][IR_MAX_DIMS], hi[IR_MAX_TENSORS][IR_MAX_DIMS];
    double fill[IR_MAX_TENSORS];
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        copy_of[id] = -2; /* untouched */
        if (e->kind != IR_E_SELECT) continue;
        const ir_expr *ld = &a->expr[e->a], *alt = &a->expr[e->b];
        if (ld->kind != IR_E_LOAD || alt->kind != IR_E_CONST) return;
        const ir_tensor *t = &g->tensor[ld->tensor];
        bool checked[IR_MAX_DIMS] = {false};
        for (int i = 0; i < e->ncond; i++) {
            int d = 0;
            while (d < t->ndim && !(affine_eq(&e->cond[i], &ld->idx[d], n) && e->cond_hi[i] == t->shape[d]))
                d++;
            if (d == t->ndim) return;
            checked[d] = true;
        }
        int64_t l[IR_MAX_DIMS] = {0}, h[IR_MAX_DIMS] = {0};
        bool any = false;
        for (int d = 0; d < t->ndim; d++) {
            int64_t mn, mx;
            affine_range(c, &ld->idx[d], &mn, &mx);
            l[d] = mn < 0 ? -mn : 0;
            h[d] = mx >= t->shape[d] ? mx - t->shape[d] + 1 : 0;
            if ((l[d] || h[d]) && !checked[d]) return; /* not a padding select */
            any |= l[d] || h[d];
        }
        copy_of[id] = -1; /* its checks always hold */
        if (!any) continue;
        int pi = pack_index(c, id);
        if (pi >= 0) { /* packed: copied only when the packs read it several times over */
            double packed = (double)c->pack_size[pi], copy = 1;
            for (int x = 0; x < c->ns; x++) packed *= (double)(c->T[x][0] * c->T[x][1]);
            for (int x = c->ns; x < n; x++) packed *= (double)c->T[x][0];
            for (int d = 0; d < t->ndim; d++) copy *= (double)(t->shape[d] + l[d] + h[d]);
            if (packed < 4 * copy) {
                copy_of[id] = -2;
                continue;
            }
        }
        int k = 0;
        while (k < npad && !(src[k] == ld->tensor && fill[k] == alt->value &&
                             !memcmp(lo[k], l, sizeof l) && !memcmp(hi[k], h, sizeof h)))
            k++;
        if (k == npad) {
            if (g->n_tensor + npad == IR_MAX_TENSORS) return;
            src[k] = ld->tensor;
            fill[k] = alt->value;
            memcpy(lo[k], l, sizeof l);
            memcpy(hi[k], h, sizeof h);
            npad++;
        }
        copy_of[id] = k;
    }
    double floats = 0, fma = 1;
    for (int k = 0; k < npad; k++) {
        double f = 1;
        for (int d = 0; d < g->tensor[src[k]].ndim; d++)
            f *= (double)(g->tensor[src[k]].shape[d] + lo[k][d] + hi[k][d]);
        floats += f;
    }
    for (int x = 0; x < n; x++) fma *= (double)c->E[x];
    fma /= c->W;
    if (floats > CPU_PACK_GLOBAL_MAX || fma < 8 * floats) return;

    ir_subgraph *gp = malloc(sizeof *gp);
    if (!gp) return; /* the kernel keeps its bound checks */
    *gp = *g;
    for (int k = 0; k < npad; k++) {
        int dst = gp->n_tensor++;
        ir_tensor *t = &gp->tensor[dst];
        *t = g->tensor[src[k]];
        snprintf(t->name, sizeof t->name, "Pad%d", k);
        t->kind = IR_T_TEMP;
        for (int d = 0; d < t->ndim; d++) t->shape[d] += lo[k][d] + hi[k][d];
        c->pad_src[k] = src[k];
        c->pad_dst[k] = dst;
        memcpy(c->pad_lo[k], lo[k], sizeof lo[k]);
        c->pad_fill[k] = fill[k];
    }
    c->npad = npad;
    ir_stage *pa = &gp->stage[gp->anchor];
    for (int id = 0; id < a->n_expr; id++) {
        if (copy_of[id] == -2) continue;
        pa->expr[id] = a->expr[a->expr[id].a]; /* the load, of the copy when padded */
        if (copy_of[id] < 0) continue;
        int k = copy_of[id];
        pa->expr[id].tensor = c->pad_dst[k];
        for (int d = 0; d < IR_MAX_DIMS; d++) pa->expr[id].idx[d].off += c->pad_lo[k][d];
    }
    c->gpad = gp;
    c->g = gp;
    c->a = pa;
}

/* The padded copies, row by row of their last dim (in parallel when the kernel is). */
static void emit_padcopies(cgc *c, int ind, bool par)
{
    cg_buf *b = &c->b;
    for (int k = 0; k < c->npad; k++) {
        const ir_tensor *t = &c->g->tensor[c->pad_dst[k]], *ts = &c->g->tensor[c->pad_src[k]];
        const char *sn = c->nm.tensor[c->pad_src[k]];
        c->nm.tensor[c->pad_dst[k]] = t->name;
        int nd = t->ndim;
        const int64_t *lo = c->pad_lo[k];
        int64_t rows = 1, st[IR_MAX_DIMS];
        for (int d = 0; d < nd - 1; d++) rows *= t->shape[d];
        cg_strides(ts, st);
        char fill[64];
        cg_float_literal(c->pad_fill[k], fill, sizeof fill);
        int64_t wd = t->shape[nd - 1], ws = ts->shape[nd - 1], ld = lo[nd - 1];
        cg_printf(b, "%*s/* %s with its padding written in (%s), once per call:", ind * 4, "", sn, fill);
        for (int d = 0; d < nd; d++) cg_printf(b, " [%lld]", (long long)t->shape[d]);
        cg_printf(b, " */\n");
        emit_call_buffer(c, ind, t->name, scratch_slot(c, -1, k), (rows * wd * 4 + 63) / 64 * 64);
        if (par) cg_line(b, ind, "#pragma omp parallel for schedule(static)");
        cg_line(b, ind, "for (int64_t prow = 0; prow < %lld; prow++) {", (long long)rows);
        cg_line(b, ind + 1, "float *const pd = %s + prow * %lld;", t->name, (long long)wd);
        cg_line(b, ind + 1, "int64_t prem = prow;");
        for (int d = nd - 2; d >= 0; d--) {
            cg_printf(b, "%*sconst int64_t p%d = prem %% %lld", (ind + 1) * 4, "", d,
                      (long long)t->shape[d]);
            cg_printf(b, lo[d] ? " - %lld;\n" : ";\n", (long long)lo[d]);
            cg_line(b, ind + 1, "prem /= %lld;", (long long)t->shape[d]);
        }
        cg_line(b, ind + 1, "(void)prem;");
        bool first = true;
        for (int d = 0; d < nd - 1; d++) {
            if (t->shape[d] == ts->shape[d]) continue;
            if (first) cg_printf(b, "%*sif (", (ind + 1) * 4, "");
            cg_printf(b, "%s(uint64_t)p%d >= %lluu", first ? "" : " || ", d,
                      (unsigned long long)ts->shape[d]);
            first = false;
        }
        if (!first) {
            cg_printf(b, ") {\n");
            cg_line(b, ind + 2, "for (int64_t j = 0; j < %lld; j++) pd[j] = %s;", (long long)wd, fill);
            cg_line(b, ind + 2, "continue;");
            cg_line(b, ind + 1, "}");
        }
        cg_printf(b, "%*sconst float *const ps = %s", (ind + 1) * 4, "", sn);
        for (int d = 0; d < nd - 1; d++) cg_printf(b, " + p%d * %lld", d, (long long)st[d]);
        cg_printf(b, ";\n");
        if (ld) cg_line(b, ind + 1, "for (int64_t j = 0; j < %lld; j++) pd[j] = %s;", (long long)ld, fill);
        cg_line(b, ind + 1, "memcpy(pd + %lld, ps, %lld);", (long long)ld, (long long)(ws * 4));
        if (ld + ws < wd)
            cg_line(b, ind + 1, "for (int64_t j = %lld; j < %lld; j++) pd[j] = %s;", (long long)(ld + ws),
                    (long long)wd, fill);
        cg_line(b, ind, "}");
    }
}

/* The output's bytes, and the multiply-adds of one output point (the reduction axes' extents
 * multiplied): what the streaming rules weigh. */
static int64_t output_bytes(const cgc *c)
{
    return 4 * ir_tensor_numel(&c->g->tensor[c->g->output]);
}

static int64_t reduction_points(const cgc *c)
{
    int64_t n = 1;
    for (int i = c->ns; i < c->ns + c->nr; i++)
        n *= c->E[i];
    return n;
}

/* Whether the output is large enough to go out with non-temporal stores
 * (space_cpu_output_streams), where a kernel's rows allow. Measured on a 2-core VM reporting
 * 480 MiB of L3: softmax outputs up to 36 MB ran faster with plain stores, 49 MB tied, 67 and
 * 72 MB ran 1.2-1.4x faster streamed. */
static bool output_streams(const cgc *c)
{
    return space_cpu_output_streams(&c->sp->tgt, output_bytes(c));
}

/* Whether a block is copied out transposed (emit_copyout_transposed): vectorised, with a
 * reduction, along another axis than the output's last, in 8 or 16 lanes. */
static bool copyout_transposes(const cgc *c, bool vec)
{
    return vec && c->nr > 0 && c->x != c->ns - 1 && (c->W == 8 || c->W == 16);
}

/* Whether the transposed copy-out streams its output: AVX-512 (its 16 x 16 tiles store whole
 * 64-byte lines), an output past the streaming bound (space_cpu_output_streams) and a window
 * of 256 FMAs an output or fewer. A stem's write-back, 16 output planes a tile, is bound by
 * the reads for ownership when its output goes to memory (ResNet-50's 7x7 stem at batch 8,
 * 25.7 MB out: 10.9 ms, 6.3 with those stores left out, 7.5 streamed, alone); from twice the
 * cores' L2 it streamed here before, 1.14-1.45x faster alone, but in a plan its reader wants
 * the output cached and its bytes are often still cached from earlier launches (MobileNetV2's
 * 3x3 stem at batch 8: 2.33 ms streamed in the plan, 0.87 plain). Deep windows are bound by
 * their FMAs (ResNet-50's 3x3 at batch 8, K = 576: 0.95x streamed; sd15's K = 2880: 1.01x),
 * and on AVX2 (twice the FMA time, half lines a tile) the stems ran 0.92-1.03x. */
static bool copyout_stream(const cgc *c, bool vec)
{
    if (!copyout_transposes(c, vec) || c->W != 16) return false;
    return output_streams(c) && reduction_points(c) <= 256;
}

/* tlm_transpose: W vectors of W lanes transposed in registers (r[i][j] <- r[j][i]), by
 * log2(W) rounds that each swap one bit of the row and the column index: the off-diagonal
 * s x s sub-blocks of every 2s x 2s block trade places (two 2-source shuffles per row pair). */
static void emit_transpose_helper(cgc *c)
{
    cg_buf *b = &c->b;
    int W = c->W;
    cg_line(b, 0, "typedef int tlm_vi __attribute__((vector_size(%d)));", 4 * W);
    cg_line(b, 0, "static inline void tlm_transpose(tlm_vf *r)");
    cg_line(b, 0, "{");
    for (int sh = 1; sh < W; sh *= 2)
        for (int i = 0; i < W; i++) {
            if (i & sh) continue;
            cg_line(b, 1, "{");
            cg_line(b, 2, "const tlm_vf lo = r[%d], hi = r[%d];", i, i | sh);
            for (int half = 0; half < 2; half++) {
                cg_printf(b, "        r[%d] = __builtin_shuffle(lo, hi, (tlm_vi){", half ? i | sh : i);
                for (int j = 0; j < W; j++) {
                    int idx = half == 0 ? ((j & sh) ? W + j - sh : j) : ((j & sh) ? W + j : j + sh);
                    cg_printf(b, "%s%d", j ? ", " : "", idx);
                }
                cg_printf(b, "});\n");
            }
            cg_line(b, 1, "}");
        }
    cg_line(b, 0, "}");
    cg_printf(b, "\n");
}

/* The loops of a block's copy-out over its axes other than the vector axis x and the last
 * axis L, each axis' index declared under its name (nm naming them), then the block's origin
 * along x and L (x_o, L_o); returns the new indent. */
static int emit_copyout_origin(cgc *c, int ind, char fb[][96], cg_names *nm)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, x = c->x, L = ns - 1;
    *nm = c->nm;
    for (int i = 0; i < ns; i++) {
        if (i == x || i == L) continue;
        ind = block_axis_loops(c, ind, i, false);
        cg_line(b, ind, "const int64_t %s = %s;", a->axis[i], fb[i]);
        nm->axis[i] = a->axis[i];
    }
    for (int k = 0; k < 2; k++) {
        const int i = k ? L : x;
        cg_line(b, ind, "const int64_t %s_o = ((%s0 * %lld + %s1) * %lld) * %lld;", a->axis[i],
                a->axis[i], (long long)c->T[i][1], a->axis[i], (long long)c->T[i][2],
                (long long)c->T[i][3]);
    }
    return ind;
}

/* The copy-out of a block vectorised along x (not the output's last axis L) once its
 * epilogue ran in place: W x W tiles (x by L) loaded as W vectors along x, transposed in
 * registers and stored as W vectors along L; the block's ragged edges and the points past a
 * padded axis' extent go point by point. The scalar copy-out (a stride-Bx gather per point)
 * took 9 % of a 3x3 conv along F. */
static void emit_copyout_transposed(cgc *c, int ind, char fb[][96], const int64_t *accst)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, x = c->x, L = ns - 1, W = c->W;
    int oind = ind;
    cg_names nm;
    ind = emit_copyout_origin(c, ind, fb, &nm);
    /* the other axes' offset in the block */
    char off[256];
    size_t ol = (size_t)snprintf(off, sizeof off, "0");
    for (int i = 0; i < ns; i++)
        if (i != x && i != L)
            ol += (size_t)snprintf(off + ol, sizeof off - ol, " + (%s2 * %lld + %s3) * %lld",
                                   a->axis[i], (long long)c->T[i][3], a->axis[i], (long long)accst[i]);
    int64_t Bx = c->T[x][2] * c->T[x][3], BL = c->T[L][2] * c->T[L][3];
    const char *xn = a->axis[x], *ln = a->axis[L];
    cg_line(b, ind++, "for (int64_t tx = 0; tx < %lld; tx += %d) {", (long long)Bx, W);
    cg_line(b, ind++, "for (int64_t tl = 0; tl < %lld; tl += %d) {", (long long)BL, W);
    cg_line(b, ind, "const float *const src = acc + (%s) + tl * %lld + tx;", off, (long long)accst[L]);
    cg_line(b, ind++, "if (tx + %d <= %lld && tl + %d <= %lld && %s_o + tx + %d <= %lld && "
            "%s_o + tl + %d <= %lld) {", W, (long long)Bx, W, (long long)BL, xn, W,
            (long long)c->E[x], ln, W, (long long)c->E[L]);
    cg_line(b, ind, "tlm_vf r[%d];", W);
    cg_line(b, ind, "for (int q = 0; q < %d; q++) r[q] = *(const tlm_vfu *)&src[q * %lld];", W,
            (long long)accst[L]);
    cg_line(b, ind, "tlm_transpose(r);");
    cg_line(b, ind++, "for (int q = 0; q < %d; q++) {", W);
    cg_line(b, ind, "const int64_t %s = %s_o + tx + q;", xn, xn);
    cg_line(b, ind, "const int64_t %s = %s_o + tl;", ln, ln);
    nm.axis[x] = xn;
    nm.axis[L] = ln;
    if (c->tstream) { /* a whole line where the row leaves it aligned */
        cg_printf(b, "%*sfloat *const d = &", ind * 4, "");
        emit_output_ref(b, c->g, &nm);
        cg_printf(b, ";\n");
        cg_line(b, ind, "if (((uintptr_t)d & 63) == 0) _mm512_stream_ps(d, (__m512)r[q]);");
        cg_line(b, ind, "else *(tlm_vfu *)d = r[q];");
    } else {
        cg_printf(b, "%*s*(tlm_vfu *)&", ind * 4, "");
        emit_output_ref(b, c->g, &nm);
        cg_printf(b, " = r[q];\n");
    }
    cg_line(b, --ind, "}");
    cg_line(b, --ind, "} else {");
    ind++;
    cg_line(b, ind++, "for (int64_t q = 0; q < %d && tx + q < %lld && %s_o + tx + q < %lld; q++) {",
            W, (long long)Bx, xn, (long long)c->E[x]);
    cg_line(b, ind++, "for (int64_t p = 0; p < %d && tl + p < %lld && %s_o + tl + p < %lld; p++) {",
            W, (long long)BL, ln, (long long)c->E[L]);
    cg_line(b, ind, "const int64_t %s = %s_o + tx + q;", xn, xn);
    cg_line(b, ind, "const int64_t %s = %s_o + tl + p;", ln, ln);
    cg_printf(b, "%*s", ind * 4, "");
    emit_output_ref(b, c->g, &nm);
    cg_printf(b, " = src[p * %lld + q];\n", (long long)accst[L]);
    while (ind > oind) cg_line(b, --ind, "}");
    if (c->tstream)
        cg_line(b, ind, "_mm_sfence(); /* the streamed lines, before the threads join */");
}

/* Whether a block requests the output lines of its transposed copy-out before its reduction
 * (emit_copyout_prefetch): the copy-out stores W rows of W floats to W output planes a tile,
 * and where a block's row in each plane is a few lines (8 or fewer, a run no prefetcher
 * follows) of an output larger than a core's L2, each store waited for its line's read:
 * ResNet-50's 7x7 stem (rows of 7 lines; alone on a Xeon, 2 threads, alternated) at batch 8,
 * 25.7 MB out, 35 % of the kernel's samples in the copy-out, with the requests 10.75 ->
 * 7.98 ms; at batch 1, 3.2 MB, 1.01 -> 0.92 ms on AVX-512 (AVX2 1.01x). The block's FMAs
 * hide the reads, and the lines stay cached for the layer after (unlike streamed stores,
 * copyout_stream). Where the output fits an L2 (ConvNeXt-T's 4x4 stem, 1.2 MB, 0.95x;
 * YOLOv5s' 3x3 at 80 x 80, 1.6 MB, 0.97-1.0x) or the rows run long (YOLOv5s' 6x6 stem, rows
 * of 20 lines, 0.96-1.02x) they cost what they save or more. */
static bool copyout_prefetches(const cgc *c, bool vec)
{
    if (!copyout_transposes(c, vec) || c->tstream) return false;
    const int L = c->ns - 1;
    return output_bytes(c) > target_l2(c) && c->T[L][2] * c->T[L][3] * 4 <= 8 * 64;
}

/* Requests for ownership of the output lines a block's transposed copy-out will write, made
 * before the block's reduction (copyout_prefetches says where) */
static void emit_copyout_prefetch(cgc *c, int ind, char fb[][96])
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, x = c->x, L = ns - 1;
    int oind = ind;
    cg_names nm;
    cg_line(b, ind++, "{ /* the lines the copy-out below writes, requested for ownership */");
    ind = emit_copyout_origin(c, ind, fb, &nm);
    int64_t Bx = c->T[x][2] * c->T[x][3], BL = c->T[L][2] * c->T[L][3];
    const char *xn = a->axis[x], *ln = a->axis[L];
    cg_line(b, ind, "const int64_t %s_e = tlm_imin(%s_o + %lld, %lld) - 1; /* the row's last */", ln,
            ln, (long long)BL, (long long)c->E[L]);
    cg_line(b, ind++, "for (int64_t tx = 0; tx < %lld && %s_o + tx < %lld; tx++) {", (long long)Bx,
            xn, (long long)c->E[x]);
    cg_line(b, ind, "const int64_t %s = %s_o + tx;", xn, xn);
    nm.axis[x] = xn;
    cg_line(b, ind, "int64_t %s = %s_o;", ln, ln);
    nm.axis[L] = ln;
    cg_printf(b, "%*sconst uintptr_t p0 = (uintptr_t)&", ind * 4, "");
    emit_output_ref(b, c->g, &nm);
    cg_printf(b, " & ~(uintptr_t)63;\n");
    cg_line(b, ind, "%s = %s_e;", ln, ln);
    cg_printf(b, "%*sconst uintptr_t p1 = (uintptr_t)&", ind * 4, "");
    emit_output_ref(b, c->g, &nm);
    cg_printf(b, ";\n");
    cg_line(b, ind, "for (uintptr_t p = p0; p <= p1; p += 64) __builtin_prefetch((const void *)p, 1, 3);");
    while (ind > oind) cg_line(b, --ind, "}");
}

static void emit_stream_helper(cg_buf *b);

/* A tile kernel whose register tiles store straight to the output (one reduction chunk,
 * vectors along the output's last axis) streams the output out when it outgrows the cache
 * (space_cpu_output_streams): an attention score matrix
 * of 54-64 MB from a K = 40-64 contraction is bound by its write traffic, and without the
 * read for ownership it is 1.5x faster (sd15 4096x4096x40, one thread: 27 -> 17.5 ms). The
 * rows must be whole lines. */
static bool tile_stream(const cgc *c)
{
    if (c->nr == 0 || c->W <= 1 || c->x != c->ns - 1) return false;
    /* rows of whole lines: the block's row and the output's (on a 64-byte aligned output);
     * 1500-float rows put every 16-float segment across two lines, all stored plainly (and
     * before the helper streamed whole lines only, half lines: 18 -> 190 ms on AVX2) */
    if (c->T[c->x][3] % 16 || c->E[c->x] % 16) return false;
    for (int i = c->ns; i < c->ns + c->nr; i++)
        if (c->T[i][0] != 1) return false;
    return output_streams(c);
}

/* How the fused task loop is split among threads. OpenMP's plain static schedule gives each
 * thread one contiguous run of tasks; when the tasks of one value of an outer axis are
 * short (the ragged last block of rows: 512 rows in blocks of 192 make 192 + 192 + 128) the
 * thread that gets them idles while the other finishes (tinyllama 512x2048x2048: 48 full
 * tasks against 16 + 32 two-thirds ones, 0.86 of the split's ideal). Dealt one at a time
 * (schedule(static, 1)) each thread gets every other task of every row block. The cost of a
 * task is its count of register tiles (edge tiles cost a whole one); the interleaved split
 * is chosen when, on the target's cores, its busiest thread has less than 92 % of the
 * contiguous split's busiest. Contiguous runs stay the rule otherwise: they keep a thread on
 * neighbouring blocks (shared input rows, one weight panel), and a predicted 4-5 % gain
 * measured nothing or a loss (sd15's 1x1 conv on AVX2: 3.7 -> 4.2 ms; the 11 % ones:
 * tinyllama 35.9 -> 33.1 ms, clip fc1 16.9 -> 15.6 ms, gpt2-xl's lm head 17.8 -> 17.1). */
static bool tasks_interleaved(const cgc *c, int fused_levels, int64_t ntask)
{
    const int64_t P = c->sp->tgt.cpu.cores;
    if (P < 2 || P > 64 || ntask <= P || ntask > 65536) return false;
    const int ns = c->ns, inner = c->sp->s_levels - 1;
    int ord[IR_MAX_AXES];
    task_order(c, ord);
    /* per axis: the points under one index of each fused level */
    int64_t span[IR_MAX_AXES][2];
    for (int i = 0; i < ns; i++)
        for (int l = 0; l < fused_levels; l++) {
            span[i][l] = 1;
            for (int m = l + 1; m <= inner; m++) span[i][l] *= c->T[i][m];
        }
    double load_c[64] = {0}, load_i[64] = {0};
    const int64_t q = ntask / P, r = ntask % P; /* q >= 1 */
    for (int64_t task = 0; task < ntask; task++) {
        /* the task's block start per axis, decoded as the emitted loop decodes it */
        int64_t rem = task, start[IR_MAX_AXES] = {0};
        for (int l = fused_levels - 1; l >= 0; l--)
            for (int u = 0; u < ns; u++) {
                const int i = ord[u];
                start[i] += rem % c->T[i][l] * span[i][l];
                rem /= c->T[i][l];
            }
        double work = 1; /* register tiles: an edge tile costs a whole one */
        for (int i = 0; i < ns; i++) {
            int64_t len = c->E[i] - start[i];
            if (len > span[i][fused_levels - 1]) len = span[i][fused_levels - 1];
            work *= len > 0 ? (double)((len + c->T[i][inner] - 1) / c->T[i][inner]) : 0;
        }
        /* libgomp's static split: the first r threads take q + 1 tasks, the rest q */
        const int64_t th = task < r * (q + 1) ? task / (q + 1) : r + (task - r * (q + 1)) / q;
        load_c[th] += work;
        load_i[task % P] += work;
    }
    double max_c = 0, max_i = 0;
    for (int t = 0; t < P; t++) {
        if (load_c[t] > max_c) max_c = load_c[t];
        if (load_i[t] > max_i) max_i = load_i[t];
    }
    return max_i < 0.92 * max_c;
}

/* The spatial axes whose last register tile reaches past the extent (rag[i]): padded, and not
 * in whole register tiles (an axis padded above its register tile only has whole ones);
 * returns how many, with the last of them in *axis. */
static int ragged_axes(const cgc *c, bool *rag, int *axis)
{
    int n = 0;
    for (int i = 0; i < c->ns; i++) {
        rag[i] = c->pad[i] && c->E[i] % c->T[i][3] != 0;
        if (rag[i]) n++, *axis = i;
    }
    return n;
}

static int gen_tile(cgc *c, const char *entry)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    int ns = c->ns, nr = c->nr, x = c->x;
    int par = (int)space_get(c->sp, c->s, SLOT_PARALLEL, 0);
    int unroll = (int)space_get(c->sp, c->s, SLOT_UNROLL, 0);
    bool vec = space_get(c->sp, c->s, SLOT_VECTORIZE, 0) != 0;
    int lanes = c->sp->tgt.cpu.vector_lanes > 0 ? c->sp->tgt.cpu.vector_lanes : 8;
    (void)lanes;
    c->W = space_cpu_tile_lanes(c->sp, c->T[x][3], vec);
    for (int i = 0; i < ns; i++) c->t3_full[i] = c->T[i][3];
    /* masked loads: edge tiles of a padded vector axis, padding selects along it */
    c->masked = c->W > 1 && c->pad[x];
    for (int id = 0; id < a->n_expr && c->W > 1; id++) {
        const ir_expr *e = &a->expr[id];
        bool moves = false;
        for (int i = 0; e->kind == IR_E_SELECT && i < e->ncond; i++) moves |= e->cond[i].coef[x] != 0;
        if (moves && range_select(c, e)) c->masked = true;
    }
    if (c->W > 1) emit_vec_helpers(c);
    if (copyout_transposes(c, vec) || transpose_axis(c) >= 0) emit_transpose_helper(c);

    /* register tile size */
    int64_t nv = 1;
    for (int i = 0; i < ns; i++) nv *= i == x ? c->T[i][3] / c->W : c->T[i][3];

    char fb[IR_MAX_AXES][96];
    for (int i = 0; i < ns + nr; i++) full_index(c, i, fb[i], sizeof fb[i]);
    plan_packs(c);
    plan_padcopies(c);
    a = c->a;

    c->stream = tile_stream(c);
    c->tstream = copyout_stream(c, vec);
    if (c->stream || c->tstream) emit_stream_helper(b);
    plan_keep(c, par == 2 ? 2 : 1);
    plan_prepacks(c);
    emit_scratch_helpers(c);
    if (c->npre) { /* the body, with the caller's prepacks (emit_prepack_entries) */
        cg_printf(b, "static void %s_run(", entry);
        cg_emit_params(b, c->g, &c->nm, false);
        cg_printf(b, ", const float *const *const tlm_pre)\n");
    } else {
        params_and_packed(c, entry, 0);
    }
    cg_line(b, 0, "{");
    for (int k = 0; k < c->npre; k++)
        cg_line(b, 1, "const float *const tlm_pre%d = tlm_pre ? tlm_pre[%d] : (const float *)0;",
                k, k);
    int ind = 1;
    emit_padcopies(c, ind, par != 0);
    emit_global_packs(c, ind, par != 0, fb);
    /* fused parallel task loop over s0 (and s1) */
    int fused_levels = par == 2 ? 2 : 1;
    int64_t ntask = 1;
    for (int l = 0; l < fused_levels; l++)
        for (int i = 0; i < ns; i++) ntask *= c->T[i][l];
    const int kp = c->keep_pi;
    if (kp >= 0) { /* each thread's kept panel, and which one it holds */
        if (par) cg_line(b, ind, "#pragma omp parallel");
        cg_line(b, ind++, "{");
        cg_line(b, ind, "float K%d[%lld] __attribute__((aligned(64)));", kp,
                (long long)(c->pack_size[kp] * c->keep_chunks));
        cg_line(b, ind, "int64_t K%d_key = -1;", kp);
    }
    const int base = ind; /* the task loop's indent */
    if (par)
        cg_line(b, ind, "#pragma omp %sfor schedule(static%s)", kp >= 0 ? "" : "parallel ",
                tasks_interleaved(c, fused_levels, ntask) ? ", 1" : "");
    loop(b, ind, "task", ntask);
    ind++;
    int ord[IR_MAX_AXES];
    task_order(c, ord);
    emit_task_decode(c, ind, "task", fused_levels, ord);
    c->fused_levels = fused_levels;
    c->nt_load = next_task_load(c, fused_levels, ntask);
    if (c->nt_load >= 0) emit_next_task_base(c, ind, ntask, ord);
    if (kp >= 0) { /* this task's panel: the s0 blocks of its spatial axes */
        cg_printf(b, "%*sconst int64_t key = ", ind * 4, "");
        emit_block_index(c, c->pack_mask[kp], 0, ns, false); /* one s1 block each */
        cg_printf(b, ";\n");
        cg_line(b, ind, "const int fresh = key != K%d_key;", kp);
        cg_line(b, ind, "K%d_key = key;", kp);
    }
    if (fused_levels == 2)
        for (int i = 0; i < ns; i++)
            if (c->pad[i]) /* a task of padding only */
                cg_line(b, ind, "if ((%s0 * %lld + %s1) * %lld >= %lld) continue;", a->axis[i],
                        (long long)c->T[i][1], a->axis[i], (long long)(c->T[i][2] * c->T[i][3]),
                        (long long)c->E[i]);
    if (nr == 0) {
        /* no reduction: compute each output point directly; a task inside the extents runs
         * loops of constant trip counts (padded axes' bounds only in the last tasks): a
         * GELU over 16777213 floats, AVX2, 2 threads, tasks of 2 vectors: 7.1-7.7 -> 6.3-6.5
         * ms (bounded loops of a variable trip count vectorise with remainder loops) */
        if (c->any_pad) {
            cg_printf(b, "%*sif (", ind * 4, "");
            const char *sep = "";
            for (int i = 0; i < ns; i++) {
                if (!c->pad[i]) continue;
                const char *n = a->axis[i];
                if (fused_levels == 1)
                    cg_printf(b, "%s(%s0 + 1) * %lld <= %lld", sep, n,
                              (long long)(c->T[i][1] * c->T[i][2] * c->T[i][3]), (long long)c->E[i]);
                else
                    cg_printf(b, "%s(%s0 * %lld + %s1 + 1) * %lld <= %lld", sep, n,
                              (long long)c->T[i][1], n, (long long)(c->T[i][2] * c->T[i][3]),
                              (long long)c->E[i]);
                sep = " && ";
            }
            cg_printf(b, ") {\n");
            bool pad[IR_MAX_AXES];
            memcpy(pad, c->pad, sizeof pad);
            memset(c->pad, 0, sizeof c->pad);
            emit_points(c, ind + 1, fused_levels, vec, fb);
            memcpy(c->pad, pad, sizeof pad);
            cg_line(b, ind, "} else {");
            emit_points(c, ind + 1, fused_levels, vec, fb);
            cg_line(b, ind, "}");
        } else {
            emit_points(c, ind, fused_levels, vec, fb);
        }
    } else {
        if (fused_levels == 1) ind = task_loops(c, ind);
        /* the accumulator block: the vector axis innermost, then the others, last first */
        int64_t accn = c->T[x][2] * c->T[x][3], accst[IR_MAX_AXES];
        accst[x] = 1;
        for (int i = ns - 1; i >= 0; i--) {
            if (i == x) continue;
            accst[i] = accn;
            accn *= c->T[i][2] * c->T[i][3];
        }
        const char *init = a->reduce == IR_RED_MAX ? "-INFINITY" : "0.0f";
        /* (when the vectors run along the output's last axis: along another, each lane of a
         * tile's vector would store to its own line; the block write-back stores rows) */
        /* With one reduction chunk each register tile holds its points' whole sums: it starts
         * from zero, and the block, whose every point a tile stores, needs no clearing (a 7x7
         * stem along F at batch 8, alone, 2 threads: 1.05x) */
        c->fresh = true;
        for (int i = ns; i < ns + nr; i++) c->fresh &= c->T[i][0] == 1;
        c->direct = c->fresh && x == ns - 1;
        cg_line(b, ind, "float acc[%lld] __attribute__((aligned(64)));", (long long)accn);
        if (!c->fresh)
            cg_line(b, ind, "for (int64_t q = 0; q < %lld; q++) acc[q] = %s;", (long long)accn, init);
        if (copyout_prefetches(c, vec)) emit_copyout_prefetch(c, ind, fb);
        for (int pi = 0; pi < c->npack; pi++)
            if (!c->pack_glob[pi] && pi != kp)
                cg_line(b, ind, "float P%d%s[%lld] __attribute__((aligned(64)));", pi,
                        c->pre_k[pi] >= 0 ? "_own" : "", (long long)c->pack_size[pi]);
        for (int i = ns; i < ns + nr; i++) {
            char v[16];
            snprintf(v, sizeof v, "%s0", a->axis[i]);
            loop(b, ind++, v, c->T[i][0]);
            emit_chunk_len(c, ind, i);
        }
        for (int pi = 0; pi < c->npack; pi++) {
            const int pk = c->pre_k[pi];
            if (pk >= 0 && !c->pack_glob[pi]) {
                /* handed in packed: this block's panel of the caller's global layout */
                cg_printf(b, "%*sfloat *const P%d = tlm_pre%d ? (float *)tlm_pre%d + ", ind * 4,
                          "", pi, pk, pk);
                emit_block_index(c, c->pack_mask[pi], 0, ns + nr, true);
                cg_printf(b, " * %lld : ", (long long)c->pack_stride[pi]);
                if (pi == kp) {
                    cg_printf(b, "K%d + ", pi);
                    emit_block_index(c, c->pack_mask[pi], ns, ns + nr, false);
                    cg_printf(b, " * %lld;\n", (long long)c->pack_size[pi]);
                } else {
                    cg_printf(b, "P%d_own;\n", pi);
                }
                cg_line(b, ind, "if (!tlm_pre%d%s) {", pk, pi == kp ? " && fresh" : "");
                emit_pack_nest(c, pi, ind + 1, fb);
                cg_line(b, ind, "}");
                continue;
            }
            if (pi == kp) { /* this r0 chunk of the kept panel, packed if it is not held */
                cg_printf(b, "%*sfloat *const P%d = K%d + ", ind * 4, "", pi, pi);
                emit_block_index(c, c->pack_mask[pi], ns, ns + nr, false);
                cg_printf(b, " * %lld;\n", (long long)c->pack_size[pi]);
                cg_line(b, ind, "if (fresh) {");
                emit_pack_nest(c, pi, ind + 1, fb);
                cg_line(b, ind, "}");
                continue;
            }
            if (!c->pack_glob[pi]) {
                emit_pack_nest(c, pi, ind, fb);
                continue;
            }
            /* packed before the task loop: this block's panel */
            cg_printf(b, "%*sconst float *const P%d = G%d + ", ind * 4, "", pi, pi);
            emit_block_index(c, c->pack_mask[pi], 0, ns + nr, true);
            cg_printf(b, " * %lld;\n", (long long)c->pack_stride[pi]);
        }
        for (int i = 0; i < ns; i++) {
            char v[16];
            snprintf(v, sizeof v, "%s2", a->axis[i]);
            if (c->pad[i])
                loop_inside(c, ind++, i, 2);
            else
                loop(b, ind++, v, c->T[i][2]);
        }
        for (int i = 0; i < ns; i++)
            cg_line(b, ind, "const int64_t %s_b = ((%s0 * %lld + %s1) * %lld + %s2) * %lld;",
                    a->axis[i], a->axis[i], (long long)c->T[i][1], a->axis[i],
                    (long long)c->T[i][2], a->axis[i], (long long)c->T[i][3]);
        /* accumulator base offset of this s2 block */
        cg_printf(b, "%*sfloat *const blk = acc", ind * 4, "");
        for (int i = 0; i < ns; i++)
            cg_printf(b, " + %s2 * %lld", a->axis[i], (long long)(c->T[i][3] * accst[i]));
        cg_printf(b, ";\n");
        bool rag[IR_MAX_AXES];
        int trim = -1, nrag = ragged_axes(c, rag, &trim);
        if (nrag == 1 && (trim != x || c->W <= 1)) {
            /* one ragged axis, not the vectors' (a ragged vector row stays masked): the one
             * tile that reaches past its extent is the last along it, and its size there is
             * known, so it is emitted that size (32 output columns in tiles of 6: 5 + one of
             * 2, not a sixth tile of 6 on clamped indices, 12 % of a 3x3 stride-2 conv's FMAs
             * spent on points never stored) */
            const int64_t t3 = c->T[trim][3], rest = c->E[trim] % t3;
            cg_line(b, ind, "if (%s_b + %lld <= %lld) {", a->axis[trim], (long long)t3,
                    (long long)c->E[trim]);
            emit_regtile_split(c, ind + 1, nv, accst, unroll);
            cg_line(b, ind, "} else { /* the last %lld of %s */", (long long)rest, a->axis[trim]);
            c->T[trim][3] = rest;
            c->short_tile = true;
            emit_regtile_split(c, ind + 1, nv / t3 * rest, accst, unroll);
            c->short_tile = false;
            c->T[trim][3] = t3;
            cg_line(b, ind, "}");
        } else if (nrag > 0) {
            /* a register tile that reaches past a ragged axis' extent takes the edge version:
             * the same tile on clamped indices (the padded points are never stored) */
            cg_printf(b, "%*sif (", ind * 4, "");
            bool first = true;
            for (int i = 0; i < ns; i++)
                if (rag[i]) {
                    cg_printf(b, "%s%s_b + %lld <= %lld", first ? "" : " && ", a->axis[i],
                              (long long)c->T[i][3], (long long)c->E[i]);
                    first = false;
                }
            cg_printf(b, ") {\n");
            emit_regtile_split(c, ind + 1, nv, accst, unroll);
            /* the vector row's last tile takes only the vectors its points need (197 columns in
             * tiles of two AVX-512 vectors: the last 5 in one; a ViT attention-score batch
             * GEMM, 12 x 197 x 197 x 64, 0.40-0.45 -> 0.38-0.39 ms on 2 threads); the packed
             * panels keep their layout (t3_full). Its branch once cost the full tiles' loop
             * 15 % through GCC's register allocation, before their step vectors were pinned
             * (emit_regtile_steps) */
            const int64_t tx = c->T[x][3], rest = (c->E[x] - 1) % tx + 1;
            const int64_t last = rag[x] && c->W > 1 ? (rest + c->W - 1) / c->W * c->W : tx;
            if (last < tx) {
                cg_line(b, ind, "} else if (%s_b + %lld > %lld) { /* the last %lld of %s */",
                        a->axis[x], (long long)tx, (long long)c->E[x], (long long)rest,
                        a->axis[x]);
                c->edge = true;
                c->T[x][3] = last;
                emit_regtile(c, ind + 1, nv / (tx / c->W) * (last / c->W), accst, unroll);
                c->T[x][3] = tx;
                c->edge = false;
            }
            cg_line(b, ind, "} else {");
            c->edge = true;
            emit_regtile(c, ind + 1, nv, accst, unroll);
            c->edge = false;
            cg_line(b, ind, "}");
        } else {
            emit_regtile_split(c, ind, nv, accst, unroll);
        }
        /* close s2 and r0 loops */
        for (int i = 0; i < ns + nr; i++) cg_line(b, --ind, "}");
        if (c->direct) { /* every register tile stored its own points */
            while (ind > base + 1) cg_line(b, --ind, "}");
            if (c->stream) /* this task's streamed lines, before the threads join */
                cg_line(b, ind, "_mm_sfence();");
            while (ind > 1) cg_line(b, --ind, "}");
            emit_global_frees(c);
            cg_line(b, 0, "}");
            return 0;
        }
        /* write-back with the fused epilogue */
        char accix[320];
        size_t al = (size_t)snprintf(accix, sizeof accix, "acc[");
        for (int i = 0; i < ns; i++)
            al += (size_t)snprintf(accix + al, sizeof accix - al, "%s(%s2 * %lld + %s3) * %lld",
                                   i ? " + " : "", a->axis[i], (long long)c->T[i][3],
                                   a->axis[i], (long long)accst[i]);
        snprintf(accix + al, sizeof accix - al, "]");
        cg_names nm;
        if (vec && x != ns - 1) {
            /* vectors along another axis than the output's last (a conv along F): the
             * epilogue runs in place along the vector axis, stride 1 in the block, then the
             * block is copied out row by row (along the vector axis, each lane would store
             * to its own line; along the rows, the math would not vectorise) */
            int oind = ind;
            ind = output_loops(c, ind, vec, fb, &nm, x, false);
            emit_acc_value(c, ind, accix);
            emit_epilogue_store(b, c->g, ind, &nm, accix);
            while (ind > oind) cg_line(b, --ind, "}");
            if (copyout_transposes(c, vec)) {
                emit_copyout_transposed(c, ind, fb, accst);
            } else {
                ind = output_loops(c, ind, vec, fb, &nm, ns - 1, false);
                cg_line(b, ind, "float v = %s;", accix);
                emit_store(b, c->g, ind, &nm);
            }
        } else {
            ind = output_loops(c, ind, vec, fb, &nm, ns - 1, false);
            emit_acc_value(c, ind, accix);
            emit_epilogue_store(b, c->g, ind, &nm, NULL);
        }
    }
    while (ind > 1) cg_line(b, --ind, "}");
    emit_global_frees(c);
    cg_line(b, 0, "}");
    return 0;
}

/* ---- CPU_WINDOW ---- */

/* Whether an epilogue stage reads a tensor (other than the value it transforms) along axis x,
 * or selects on it: then the epilogue cannot run on points past the axis' extent. */
static bool epilogue_reads_axis(const ir_subgraph *g, int x)
{
    int prev = g->stage[g->anchor].out;
    for (int i = g->anchor + 1; i < g->n_stage; i++) {
        const ir_stage *st = &g->stage[i];
        for (int id = 0; id < st->n_expr; id++) {
            const ir_expr *e = &st->expr[id];
            if (e->kind == IR_E_LOAD && e->tensor != prev)
                for (int d = 0; d < g->tensor[e->tensor].ndim; d++)
                    if (e->idx[d].coef[x]) return true;
            if (e->kind == IR_E_SELECT)
                for (int k = 0; k < e->ncond; k++)
                    if (e->cond[k].coef[x]) return true;
        }
        prev = st->out;
    }
    return false;
}

/* A CPU_WINDOW kernel's geometry: the input load and the weights' (-1: a pool), the padding's
 * fill, max or sum, the input's rows and columns with each axis' stride, dilation and padding,
 * the output's extents and the window's */
typedef struct {
    const ir_expr *X;
    int lw;
    double fill;
    bool maxr;
    int64_t H, Wd, SH, DH, PH, SW, DW, PW, N, C, OH, OW, KH, KW;
} win_geom;

/* Tile rows per task of CPU_WINDOW along channels (all OHB where blocks of channels alone
 * keep the cores busy): the band count whose busiest core does the least work, by a cost of
 * its tasks' FMA vectors plus 3 per packed input vector (the pack's transposes and stores:
 * a 5x5 stride-2 depthwise, 72 x 56 x 56 on AVX2, packed 15.8 us, its 2.5 M FMA vectors
 * 28 us); a band packs only the rows its windows read, the halo twice. MobileNetV3's 72
 * channels (9 blocks of 8 on 2 cores: 5 and 4) in two bands: 9 and 9 half-plane tasks. */
static int64_t window_band_tiles(const win_geom *gm, int64_t cores, int64_t CB, int64_t R,
                                 int64_t OHB, int64_t WP)
{
    const int64_t tasks = gm->N * CB;
    if (cores <= 1 || tasks % cores == 0 || tasks >= 8 * cores) return OHB;
    int64_t best = OHB;
    double best_cost = -1;
    for (int64_t nb = 1; nb <= 8 && nb <= OHB; nb++) {
        const int64_t tb = (OHB + nb - 1) / nb, bands = (OHB + tb - 1) / tb;
        const int64_t rows = tb * R < gm->OH ? tb * R : gm->OH;
        const int64_t in_rows = (rows - 1) * gm->SH + (gm->KH - 1) * gm->DH + 1;
        const int64_t busiest = (tasks * bands + cores - 1) / cores;
        const double cost = (double)busiest * ((double)rows * (double)(gm->OW * gm->KH * gm->KW) +
                                               3.0 * (double)(in_rows * WP));
        if (best_cost < 0 || cost < best_cost * 0.999) best = tb, best_cost = cost;
    }
    return best;
}

/* A loop over blocks of `step` points from `from` whose last block starts at `last`,
 * overlapping the one before it: `v`0 steps, `v` is the block's start; the block's body at
 * ind + 1, then emit_overlap_loop_end. */
static void emit_overlap_loop(cg_buf *b, int ind, const char *v, const char *from, int step,
                              const char *last)
{
    cg_line(b, ind, "for (int64_t %s0 = %s;; %s0 += %d) {", v, from, v, step);
    cg_line(b, ind + 1, "const int64_t %s = %s0 < %s ? %s0 : %s;", v, v, last, v, last);
}

static void emit_overlap_loop_end(cg_buf *b, int ind, const char *v, const char *last)
{
    cg_line(b, ind + 1, "if (%s == %s) break;", v, last);
    cg_line(b, ind, "}");
}

/* "%lld" of v into buf: a number as emit_overlap_loop takes it */
static const char *lld(char *buf, size_t n, int64_t v)
{
    snprintf(buf, n, "%lld", (long long)v);
    return buf;
}

/* Point qv of an output plane in memory order through the epilogue, at indent ind: its row and
 * column from qv (a plane of OW columns), v = value times the anchor's post scale, stored. */
static void emit_plane_point(cgc *c, int ind, const char *qv, int64_t OW, const char *value)
{
    const ir_stage *a = c->a;
    cg_line(&c->b, ind, "const int64_t %s = %s / %lld, %s = %s - %s * %lld;", a->axis[2], qv,
            (long long)OW, a->axis[3], qv, a->axis[2], (long long)OW);
    cg_printf(&c->b, "%*sfloat v = %s", ind * 4, "", value);
    if (a->post_scale != 1.0) cg_printf(&c->b, " * (float)%.17g", a->post_scale);
    cg_printf(&c->b, ";\n");
    cg_names nm = anchor_names(c, 4);
    emit_epilogue_store(&c->b, c->g, ind, &nm, NULL);
}

/* `c`, channel k of block cb (of L channels), declared for the epilogue; past the C
 * channels (a short last block) the loop over k ends */
static void emit_block_channel(cgc *c, int ind, int L, int64_t C)
{
    if (C % L) cg_line(&c->b, ind, "if (cb * %d + k >= %lld) break;", L, (long long)C);
    cg_line(&c->b, ind, "const int64_t %s = cb * %d + k;", c->a->axis[1], L);
}

/* gen_window_channels' pack of the plane into P[r][j][l] (channel l of the block at padded
 * row r, column j), rows ih_lo..ih_hi of the input: L columns of L channels per transpose,
 * the last block of a row overlapping the one before it. Rows narrower than L take L points
 * of the plane in memory order per transpose instead (a block spans rows; each point's
 * vector stored at its row and column, columns past jhi not at all; the last block
 * overlapping), a band of fewer than L points point by point: one by one, the 196 points of
 * a 14 x 14 plane took a third of ConvNeXt-T's 7x7 depthwise at 14 x 14 along 16 channels
 * (Zen 4, AVX-512 code). */
static void emit_window_plane_pack(cg_buf *b, const win_geom *gm, int L, const char *chan,
                                   const char *ih_lo, const char *ih_hi, bool band, int64_t ihi,
                                   int64_t jhi, int64_t WP)
{
    const long long Wd = gm->Wd, HW = gm->H * gm->Wd, Pn = ihi * gm->Wd;
    const bool flat = jhi > 0 && jhi < L && (band || Pn >= L);
    int ind = 3;
    if (flat) {
        char lo[16] = "0", last[32];
        snprintf(last, sizeof last, "%lld", Pn - L);
        if (band) {
            cg_line(b, 3, "const int64_t q_lo = ih_lo * %lld, q_hi = ih_hi * %lld;", Wd, Wd);
            cg_line(b, 3, "if (q_hi - q_lo >= %d) {", L);
            snprintf(lo, sizeof lo, "q_lo");
            snprintf(last, sizeof last, "q_hi - %d", L);
            ind = 4;
        }
        emit_overlap_loop(b, ind, "q", lo, L, last);
        cg_line(b, ind + 1, "tlm_vf r[%d];", L);
        cg_line(b, ind + 1, "for (int64_t k = 0; k < %d; k++)", L);
        cg_line(b, ind + 2, "r[k] = *(const tlm_vfu *)&xp[%s * %lld + q];", chan, HW);
        cg_line(b, ind + 1, "tlm_tr(r);");
        cg_line(b, ind + 1, "for (int64_t k = 0; k < %d; k++) {", L);
        cg_line(b, ind + 2, "const int64_t ih = (q + k) / %lld, j = q + k - ih * %lld;", Wd, Wd);
        if (jhi < Wd) cg_line(b, ind + 2, "if (j >= %lld) continue;", (long long)jhi);
        cg_line(b, ind + 2, "*(tlm_vf *)&P[((ih + %lld) * %lld + %lld + j) * %d] = r[k];",
                (long long)gm->PH, (long long)WP, (long long)gm->PW, L);
        cg_line(b, ind + 1, "}");
        emit_overlap_loop_end(b, ind, "q", last);
        if (!band) return;
        cg_line(b, 3, "} else {");
    }
    cg_line(b, ind, "for (int64_t ih = %s; ih < %s; ih++) {", ih_lo, ih_hi);
    cg_line(b, ind + 1, "float *const p = P + ((ih + %lld) * %lld + %lld) * %d;", (long long)gm->PH,
            (long long)WP, (long long)gm->PW, L);
    if (jhi >= L) {
        char jl[24];
        emit_overlap_loop(b, ind + 1, "j", "0", L, lld(jl, sizeof jl, jhi - L));
        cg_line(b, ind + 2, "tlm_vf r[%d];", L);
        cg_line(b, ind + 2, "for (int64_t k = 0; k < %d; k++)", L);
        cg_line(b, ind + 3, "r[k] = *(const tlm_vfu *)&xp[%s * %lld + ih * %lld + j];", chan, HW,
                Wd);
        cg_line(b, ind + 2, "tlm_tr(r);");
        cg_line(b, ind + 2, "for (int64_t k = 0; k < %d; k++) *(tlm_vf *)&p[(j + k) * %d] = r[k];",
                L, L);
        emit_overlap_loop_end(b, ind + 1, "j", jl);
    } else if (jhi > 0) {
        cg_line(b, ind + 1, "for (int64_t k = 0; k < %d; k++)", L);
        cg_line(b, ind + 2, "for (int64_t j = 0; j < %lld; j++)", (long long)jhi);
        cg_line(b, ind + 3, "p[j * %d + k] = xp[%s * %lld + ih * %lld + j];", L, chan, HW, Wd);
    }
    cg_line(b, ind, "}");
    if (flat) cg_line(b, 3, "}");
}

/* gen_window_channels' epilogue over a whole plane of rows narrower than L, its tiles'
 * vectors T[oh * OW + ow][l] kept: L points of the plane in memory order per L x L transpose
 * (the last block overlapping the one before it), each channel's L points through the
 * epilogue as one vector, stored contiguously (row by row, a 14-wide row in 16 lanes took a
 * vector, a half and two scalars per channel and row: 14 % of ConvNeXt-T's 7x7 depthwise at
 * 14 x 14 along 16 channels, Zen 4). C: the channels. */
static void emit_window_flat_epilogue(cgc *c, int L, int64_t PQ, int64_t OW, int64_t C)
{
    cg_buf *b = &c->b;
    char last[24];
    emit_overlap_loop(b, 3, "q", "0", L, lld(last, sizeof last, PQ - L));
    cg_line(b, 4, "tlm_vf r[%d];", L);
    cg_line(b, 4, "for (int64_t k = 0; k < %d; k++) r[k] = *(const tlm_vf *)&T[(q + k) * %d];", L,
            L);
    cg_line(b, 4, "tlm_tr(r);");
    cg_line(b, 4, "for (int64_t k = 0; k < %d; k++) *(tlm_vf *)&TT[k * %d] = r[k];", L, L);
    cg_line(b, 4, "for (int64_t k = 0; k < %d; k++) {", L);
    emit_block_channel(c, 5, L, C);
    cg_line(b, 5, "#pragma omp simd");
    cg_line(b, 5, "for (int64_t qq = q; qq < q + %d; qq++) {", L);
    char val[48];
    snprintf(val, sizeof val, "TT[k * %d + qq - q]", L);
    emit_plane_point(c, 6, "qq", OW, val);
    cg_line(b, 5, "}");
    cg_line(b, 4, "}");
    emit_overlap_loop_end(b, 3, "q", last);
}

/* gen_window_channels' epilogue a tile row at a time (R rows from oh0, T[row][ow][l]), each
 * row back to (channel, ow) by L x L transposes, the last block of a row overlapping the one
 * before it, each channel's L columns of a block through the epilogue as one vector (GCC's
 * vector body and scalar tail per channel and row for the whole row otherwise; ConvNeXt-T's
 * 7x7 at 14 x 14 ran the same, 0.072 ms, either way); rows narrower than L transposed whole,
 * then through the epilogue. Closes the rows' loop. */
static void emit_window_row_epilogue(cgc *c, int L, int64_t R, int64_t OW, int64_t C)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const char *ax_oh = a->axis[2], *ax_ow = a->axis[3];
    const int64_t OWp = (OW + L - 1) / L * L;
    cg_names nm = anchor_names(c, 4);
    const bool whole = OW < L;
    const int64_t jlast = whole ? 0 : OW - L, tw = whole ? OWp : L;
    char jl[24];
    cg_line(b, 4, "for (int64_t i = 0; i < %lld; i++) {", (long long)R);
    cg_line(b, 5, "const int64_t %s = oh0 + i;", ax_oh);
    if (whole) {
        cg_line(b, 5, "for (int64_t j = 0; j < %lld; j += %d) {", (long long)OWp, L);
    } else {
        emit_overlap_loop(b, 5, "j", "0", L, lld(jl, sizeof jl, jlast));
    }
    cg_line(b, 6, "tlm_vf r[%d];", L);
    cg_line(b, 6, "for (int64_t k = 0; k < %d; k++)", L);
    cg_line(b, 7, "r[k] = *(const tlm_vf *)&T[(i * %lld + j + k) * %d];", (long long)OWp, L);
    cg_line(b, 6, "tlm_tr(r);");
    cg_line(b, 6, "for (int64_t k = 0; k < %d; k++) *(tlm_vf *)&TT[k * %lld + %s] = r[k];", L,
            (long long)tw, whole ? "j" : "0");
    if (whole) cg_line(b, 5, "}");
    int ind = whole ? 5 : 6;
    cg_line(b, ind, "for (int64_t k = 0; k < %d; k++) {", L);
    emit_block_channel(c, ind + 1, L, C);
    cg_line(b, ind + 1, "#pragma omp simd");
    if (whole)
        cg_line(b, ind + 1, "for (int64_t %s = 0; %s < %lld; %s++) {", ax_ow, ax_ow, (long long)OW,
                ax_ow);
    else
        cg_line(b, ind + 1, "for (int64_t %s = j; %s < j + %d; %s++) {", ax_ow, ax_ow, L, ax_ow);
    cg_printf(b, "%*sfloat v = TT[k * %lld + %s%s]", (ind + 2) * 4, "", (long long)tw, ax_ow,
              whole ? "" : " - j");
    if (a->post_scale != 1.0) cg_printf(b, " * (float)%.17g", a->post_scale);
    cg_printf(b, ";\n");
    emit_epilogue_store(b, c->g, ind + 2, &nm, NULL);
    cg_line(b, ind + 1, "}");
    cg_line(b, ind, "}");
    if (!whole) emit_overlap_loop_end(b, 5, "j", jl);
    cg_line(b, 4, "}");
}

/* Channel k of block cb (of L channels) as generated code names it: the last channel where
 * the block runs past the C channels */
static void window_block_channel(char *buf, size_t n, int L, int64_t C)
{
    if (C % L)
        snprintf(buf, n, "tlm_imin(cb * %d + k, %lld)", L, (long long)(C - 1));
    else
        snprintf(buf, n, "(cb * %d + k)", L);
}

/* gen_window_channels' weights of block cb from (channel, tap) to (tap, channel) into dst:
 * L taps of the L channels per transpose, the last block overlapping the one before it (a
 * 7x7's 49 x 8 copies one by one took 5 % of ConvNeXt-T's 384-channel depthwise at 14 x 14
 * on AVX2; transposed, 1.04x, alternated in one process on a Xeon); fewer taps than lanes one
 * by one. chan: channel k of the block. */
static void emit_window_weight_pack(cg_buf *b, int ind, const char *wn, const char *chan,
                                    int64_t KK, int L, const char *dst)
{
    if (KK >= L) {
        char tl[24];
        emit_overlap_loop(b, ind, "t", "0", L, lld(tl, sizeof tl, KK - L));
        cg_line(b, ind + 1, "tlm_vf r[%d];", L);
        cg_line(b, ind + 1, "for (int64_t k = 0; k < %d; k++)", L);
        cg_line(b, ind + 2, "r[k] = *(const tlm_vfu *)&%s[%s * %lld + t];", wn, chan,
                (long long)KK);
        cg_line(b, ind + 1, "tlm_tr(r);");
        cg_line(b, ind + 1, "for (int64_t k = 0; k < %d; k++) *(tlm_vf *)&%s[(t + k) * %d] = r[k];",
                L, dst, L);
        emit_overlap_loop_end(b, ind, "t", tl);
    } else {
        cg_line(b, ind, "for (int64_t k = 0; k < %d; k++)", L);
        cg_line(b, ind + 1,
                "for (int64_t t = 0; t < %lld; t++) %s[t * %d + k] = %s[%s * %lld + t];",
                (long long)KK, dst, L, wn, chan, (long long)KK);
    }
}

/* gen_window_channels' prepack entries (kernel ABI in codegen.h): the depthwise weights,
 * every block's taps x lanes as the kernel packs them per task, packed once by a caller that
 * knows them constant (a plan's params). */
static void emit_window_prepack_entries(cgc *c, const char *entry, const win_geom *gm, int L,
                                        int64_t KK)
{
    cg_buf *b = &c->b;
    const ir_subgraph *g = c->g;
    const int wt = c->a->expr[gm->lw].tensor;
    const char *wn = c->nm.tensor[wt];
    const int64_t CB = (gm->C + L - 1) / L;
    int in[IR_MAX_TENSORS];
    int n = ir_subgraph_inputs(g, in), warg = 0;
    for (int i = 0; i < n; i++)
        if (in[i] == wt) warg = i;
    char chan[96];
    window_block_channel(chan, sizeof chan, L, gm->C);
    cg_printf(b, "\nvoid %s(", entry);
    cg_emit_params(b, g, &c->nm, false);
    cg_printf(b, ")\n{\n    %s_run(", entry);
    for (int i = 0; i < n; i++)
        cg_printf(b, "%s, ", c->nm.tensor[in[i]]);
    cg_printf(b, "%s, (const float *const *)0);\n}\n\n", c->nm.tensor[g->output]);
    cg_line(b, 0, "int %s_prepacks(int k, int *arg, long long *floats)", entry);
    cg_line(b, 0, "{");
    cg_line(b, 1, "if (k == 0) *arg = %d, *floats = %lldLL;", warg, (long long)(CB * KK * L));
    cg_line(b, 1, "return 1;");
    cg_line(b, 0, "}");
    cg_printf(b, "\nstatic void %s_prepack_run(int k, ", entry);
    cg_emit_params(b, g, &c->nm, false);
    cg_printf(b, ", float *const dst)\n{\n");
    for (int i = 0; i < n; i++)
        cg_line(b, 1, "(void)%s;", c->nm.tensor[in[i]]);
    cg_line(b, 1, "(void)%s;", c->nm.tensor[g->output]);
    cg_line(b, 1, "if (k != 0) return;");
    if (space_get(c->sp, c->s, SLOT_PARALLEL, 0) != 0)
        cg_line(b, 1, "#pragma omp parallel for schedule(static)");
    cg_line(b, 1, "for (int64_t cb = 0; cb < %lld; cb++) {", (long long)CB);
    cg_line(b, 2, "float *const Wp = dst + cb * %lld;", (long long)(KK * L));
    emit_window_weight_pack(b, 2, wn, chan, KK, L, "Wp");
    cg_line(b, 1, "}");
    cg_line(b, 0, "}");
    cg_printf(b, "\nvoid %s_prepack(int k, void *const *args, float *dst)\n{\n", entry);
    cg_printf(b, "    %s_prepack_run(k, ", entry);
    emit_args_from_array(b, g);
    cg_printf(b, ", dst);\n}\n");
    cg_printf(b, "\nvoid %s_prepacked(void *const *args, const float *const *pre)\n{\n", entry);
    cg_printf(b, "    %s_run(", entry);
    emit_args_from_array(b, g);
    cg_printf(b, ", pre);\n}\n");
}

/* CPU_WINDOW with its vectors along blocks of L channels (WINDOW_VEC_CHANNELS, space.h). Per
 * task (n, block of L channels):
 *   P[r][j][l] = the padded input of channel cb * L + l at row r, column j
 * packed by L x L transposes of L rows of L columns (one per channel), and Wp[kh][kw][l] the
 * taps' weights, so tap (kh, kw) of output (oh, ow) is P[oh * SH + kh * DH][ow * SW + kw * DW]
 * times Wp[kh][kw], one aligned vector each: no broadcasts, and no padded vector lanes along
 * OW (a 14-wide plane fills 8 or 16 lanes with its channels, not 14 of 16 columns). A
 * register tile (R rows x CO columns) runs the taps, a weight vector feeding its R x CO FMAs;
 * each output row then goes back to NCHW by the transpose, through the epilogue. The last
 * tile along each axis starts at the extent less its size (recomputing a few points). AVX2
 * code on a Xeon, ConvNeXt-T's 7x7 at 14 x 14, 384 channels, 2 threads, alternated: 0.085
 * ms along OW (5 rows x 2 vectors), 0.063 ms here (1 row x 14 columns); at 56 x 56, 96
 * channels 0.397 -> 0.320 ms. */
static int gen_window_channels(cgc *c, const char *entry, const win_geom *gm)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    const space *sp = c->sp;
    const int L = space_window_lanes(sp, c->s, sp->n_slot);
    const int64_t C = gm->C, H = gm->H, Wd = gm->Wd, OH = gm->OH, OW = gm->OW;
    const int64_t KH = gm->KH, KW = gm->KW, SH = gm->SH, SW = gm->SW, DH = gm->DH, DW = gm->DW;
    const int64_t CO = space_tile(sp, c->s, 3, 3), R = space_tile(sp, c->s, 2, 3);
    const int64_t CB = (C + L - 1) / L, OHB = (OH + R - 1) / R, OWB = (OW + CO - 1) / CO;
    const int64_t HP = (OH - 1) * SH + (KH - 1) * DH + 1, WP = (OW - 1) * SW + (KW - 1) * DW + 1;
    const int64_t OWp = (OW + L - 1) / L * L;
    /* the input's rows and columns inside the packed plane */
    const int64_t ihi = H < HP - gm->PH ? H : HP - gm->PH;
    const int64_t jhi = Wd < WP - gm->PW ? Wd : WP - gm->PW;
    const bool par = space_get(sp, c->s, SLOT_PARALLEL, 0) != 0;
    /* bands of tile rows per task where too few blocks leave a core idle */
    const int64_t TB = window_band_tiles(gm, par ? sp->tgt.cpu.cores : 1, CB, R, OHB, WP);
    const int64_t NB = (OHB + TB - 1) / TB;
    /* a whole plane of rows narrower than L, small enough to keep: its tiles' vectors kept
     * for one epilogue over the plane in memory order (emit_window_flat_epilogue) */
    const bool flat_out = OW < L && NB == 1 && OH * OW >= L && OH * OW * L <= 4096; /* 16 KiB */
    /* a task's input rows to pack and tile rows to compute: its band's (variables set at the
     * task's start), or the whole plane */
    char ih_lo[24] = "ih_lo", ih_hi[24] = "ih_hi", oh_lo[24] = "lo", oh_hi[24] = "hi";
    if (NB == 1) {
        snprintf(ih_lo, sizeof ih_lo, "0");
        snprintf(ih_hi, sizeof ih_hi, "%lld", (long long)ihi);
        snprintf(oh_lo, sizeof oh_lo, "0");
        snprintf(oh_hi, sizeof oh_hi, "%lld", (long long)OHB);
    }
    char fl[64];
    cg_float_literal(gm->fill, fl, sizeof fl);
    c->W = L;
    emit_vec_helpers(c);
    /* r[k] <- column k of the L x L block whose rows are r[0..L): on AVX2 three in-lane
     * stages (unpack, 64-bit shuffle, 128-bit permute: one instruction each), else log2(L)
     * interleaves of r[i] with r[i + L / 2] (two-source permutes on AVX-512) */
    cg_line(b, 0, "static inline void tlm_tr(tlm_vf *r)");
    cg_line(b, 0, "{");
    if (L == 8) {
        /* u[0..3] end up holding columns (0, 4), (2, 6), (1, 5), (3, 7) of rows 0-3; u[4..7]
         * those of rows 4-7 */
        static const char *const tr8[] = {
            "tlm_vf t[8], u[8];",
            "for (int i = 0; i < 8; i += 2) {",
            "    t[i] = __builtin_shuffle(r[i], r[i + 1], (tlm_wi){0, 8, 1, 9, 4, 12, 5, 13});",
            "    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], "
            "(tlm_wi){2, 10, 3, 11, 6, 14, 7, 15});",
            "}",
            "for (int i = 0; i < 8; i += 4)",
            "    for (int j = 0; j < 2; j++) {",
            "        u[i + j] = __builtin_shuffle(t[i + j], t[i + j + 2], "
            "(tlm_wi){0, 1, 8, 9, 4, 5, 12, 13});",
            "        u[i + j + 2] = __builtin_shuffle(t[i + j], t[i + j + 2], "
            "(tlm_wi){2, 3, 10, 11, 6, 7, 14, 15});",
            "    }",
            "static const int o[4] = {0, 2, 1, 3};",
            "for (int i = 0; i < 4; i++) {",
            "    r[i] = __builtin_shuffle(u[o[i]], u[o[i] + 4], "
            "(tlm_wi){0, 1, 2, 3, 8, 9, 10, 11});",
            "    r[i + 4] = __builtin_shuffle(u[o[i]], u[o[i] + 4], "
            "(tlm_wi){4, 5, 6, 7, 12, 13, 14, 15});",
            "}",
        };
        for (size_t i = 0; i < sizeof tr8 / sizeof tr8[0]; i++) cg_line(b, 1, "%s", tr8[i]);
    } else {
        char lo[256] = "", hi[256] = "";
        for (int k = 0, n1 = 0, n2 = 0; k < L / 2; k++) {
            n1 += snprintf(lo + n1, sizeof lo - (size_t)n1, "%s%d, %d", k ? ", " : "", k, k + L);
            n2 += snprintf(hi + n2, sizeof hi - (size_t)n2, "%s%d, %d", k ? ", " : "", k + L / 2,
                           k + L / 2 + L);
        }
        cg_line(b, 1, "tlm_vf t[%d];", L);
        cg_line(b, 1, "for (int s = 0; s < %d; s++) {", L == 16 ? 4 : 3);
        cg_line(b, 2, "for (int i = 0; i < %d; i++) {", L / 2);
        cg_line(b, 3, "t[2 * i] = __builtin_shuffle(r[i], r[i + %d], (tlm_wi){%s});", L / 2, lo);
        cg_line(b, 3, "t[2 * i + 1] = __builtin_shuffle(r[i], r[i + %d], (tlm_wi){%s});", L / 2,
                hi);
        cg_line(b, 2, "}");
        cg_line(b, 2, "for (int i = 0; i < %d; i++) r[i] = t[i];", L);
        cg_line(b, 1, "}");
    }
    cg_line(b, 0, "}");
    /* with weights, the body takes the caller's prepacked copy (emit_window_prepack_entries) */
    if (gm->lw >= 0) {
        cg_printf(b, "static void %s_run(", entry);
        cg_emit_params(b, c->g, &c->nm, false);
        cg_printf(b, ", const float *const *const tlm_pre)\n");
    } else {
        params_and_packed(c, entry, 0);
    }
    cg_line(b, 0, "{");
    /* the tensors' names, given by the parameter list */
    const char *xn = c->nm.tensor[gm->X->tensor];
    const char *wn = gm->lw >= 0 ? c->nm.tensor[a->expr[gm->lw].tensor] : NULL;
    if (wn) cg_line(b, 1, "const float *const tlm_pre0 = tlm_pre ? tlm_pre[0] : (const float *)0;");
    const char *ax_n = a->axis[0];
    /* per thread (the space bounds them: window_channels_ok): the packed plane, the block's
     * weights, the tiles' rows (ow, channel) and one row transposed (channel, ow) */
    if (par) cg_line(b, 1, "#pragma omp parallel");
    cg_line(b, 1, "{");
    cg_line(b, 2, "float P[%lld] __attribute__((aligned(64)));", (long long)(HP * WP * L));
    if (wn) cg_line(b, 2, "float Wp[%lld] __attribute__((aligned(64)));", (long long)(KH * KW * L));
    cg_line(b, 2, "float T[%lld] __attribute__((aligned(64)));",
            (long long)(flat_out ? OH * OW * L : R * OWp * L));
    cg_line(b, 2, "float TT[%lld] __attribute__((aligned(64)));",
            (long long)(L * (OW < L ? OWp : L)));
    /* the padding is the same in every block: written once, and only it (the rows outside
     * the input, the columns either side of it); under rows narrower than L, the columns of
     * T past OW (transposed, never stored) defined */
    cg_line(b, 2, "for (int64_t r = 0; r < %lld; r++) {", (long long)HP);
    cg_line(b, 3, "float *const p = P + r * %lld;", (long long)(WP * L));
    cg_line(b, 3, "const int64_t lo = r < %lld || r >= %lld ? %lld : %lld;", (long long)gm->PH,
            (long long)(gm->PH + ihi), (long long)(WP * L), (long long)(gm->PW * L));
    cg_line(b, 3, "for (int64_t j = 0; j < lo; j++) p[j] = %s;", fl);
    cg_line(b, 3, "for (int64_t j = %lld; j < %lld; j++) p[j] = %s;",
            (long long)((gm->PW + jhi) * L), (long long)(WP * L), fl);
    cg_line(b, 2, "}");
    if (OW < L && !flat_out)
        cg_line(b, 2, "for (int64_t j = 0; j < %lld; j++) T[j] = 0.0f;", (long long)(R * OWp * L));
    if (par) cg_line(b, 2, "#pragma omp for schedule(static)");
    cg_line(b, 2, "for (int64_t task = 0; task < %lld; task++) {", (long long)(gm->N * CB * NB));
    if (NB > 1) {
        /* a band: tile rows [lo, hi), and the padded rows their windows read */
        cg_line(b, 3, "const int64_t %s = task / %lld, cb = task / %lld %% %lld;", ax_n,
                (long long)(CB * NB), (long long)NB, (long long)CB);
        cg_line(b, 3, "const int64_t lo = task %% %lld * %lld, hi = tlm_imin(lo + %lld, %lld);",
                (long long)NB, (long long)TB, (long long)TB, (long long)OHB);
        cg_line(b, 3, "const int64_t ih_lo = tlm_imax(tlm_imin(lo * %lld, %lld) * %lld - %lld, 0);",
                (long long)R, (long long)(OH - R), (long long)SH, (long long)gm->PH);
        cg_line(b, 3,
                "const int64_t ih_hi = tlm_imin((tlm_imin((hi - 1) * %lld, %lld) + %lld) * %lld + "
                "%lld, %lld);",
                (long long)R, (long long)(OH - R), (long long)(R - 1), (long long)SH,
                (long long)((KH - 1) * DH + 1 - gm->PH), (long long)ihi);
    } else {
        cg_line(b, 3, "const int64_t %s = task / %lld, cb = task %% %lld;", ax_n, (long long)CB,
                (long long)CB);
    }
    char chan[96];
    window_block_channel(chan, sizeof chan, L, C);
    cg_line(b, 3, "const float *const xp = %s + %s * %lld;", xn, ax_n, (long long)(C * H * Wd));
    const int64_t KK = KH * KW;
    if (wn) {
        /* the block's weights (tap, channel): the caller's prepacked copy, else packed here */
        cg_line(b, 3, "const float *const wb = tlm_pre0 ? tlm_pre0 + cb * %lld : Wp;",
                (long long)(KK * L));
        cg_line(b, 3, "if (!tlm_pre0) {");
        emit_window_weight_pack(b, 4, wn, chan, KK, L, "Wp");
        cg_line(b, 3, "}");
    }
    emit_window_plane_pack(b, gm, L, chan, ih_lo, ih_hi, NB > 1, ihi, jhi, WP);
    /* the register tiles, a row of them at a time, then the row's epilogue */
    cg_line(b, 3, "for (int64_t ohb = %s; ohb < %s; ohb++) {", oh_lo, oh_hi);
    cg_line(b, 4, "const int64_t oh0 = ohb * %lld < %lld ? ohb * %lld : %lld;", (long long)R,
            (long long)(OH - R), (long long)R, (long long)(OH - R));
    cg_line(b, 4, "for (int64_t owb = 0; owb < %lld; owb++) {", (long long)OWB);
    cg_line(b, 5, "const int64_t ow0 = owb * %lld < %lld ? owb * %lld : %lld;", (long long)CO,
            (long long)(OW - CO), (long long)CO, (long long)(OW - CO));
    cg_line(b, 5, "const float *pr = P + (oh0 * %lld + ow0 * %lld) * %d;", (long long)(SH * WP),
            (long long)SW, L);
    for (int64_t i = 0; i < R; i++)
        for (int64_t u = 0; u < CO; u++)
            cg_line(b, 5, "tlm_vf a%lld_%lld = (tlm_vf){} + %s;", (long long)i, (long long)u,
                    gm->maxr ? "-INFINITY" : "0.0f");
    if (wn) cg_line(b, 5, "const float *wr = wb;");
    /* the window's rows in a loop, its columns in straight code: each tap's weight vector
     * feeds the tile's FMAs, each FMA loading its input vector */
    cg_line(b, 5, "#pragma GCC unroll 1");
    cg_line(b, 5, "for (int64_t kh = 0; kh < %lld; kh++) {", (long long)KH);
    for (int64_t kw = 0; kw < KW; kw++) {
        if (wn) cg_line(b, 6, "const tlm_vf w%lld = *(const tlm_vf *)&wr[%lld];", (long long)kw,
                        (long long)(kw * L));
        for (int64_t i = 0; i < R; i++)
            for (int64_t u = 0; u < CO; u++) {
                long long off = (long long)((i * SH * WP + u * SW + kw * DW) * L);
                if (gm->maxr)
                    cg_line(b, 6, "a%lld_%lld = tlm_v_max(a%lld_%lld, *(const tlm_vf *)&pr[%lld]);",
                            (long long)i, (long long)u, (long long)i, (long long)u, off);
                else if (wn)
                    cg_line(b, 6, "a%lld_%lld += w%lld * *(const tlm_vf *)&pr[%lld];", (long long)i,
                            (long long)u, (long long)kw, off);
                else
                    cg_line(b, 6, "a%lld_%lld += *(const tlm_vf *)&pr[%lld];", (long long)i,
                            (long long)u, off);
            }
    }
    cg_line(b, 6, "pr += %lld;", (long long)(DH * WP * L));
    if (wn) cg_line(b, 6, "wr += %lld;", (long long)(KW * L));
    cg_line(b, 5, "}");
    for (int64_t i = 0; i < R; i++)
        for (int64_t u = 0; u < CO; u++) {
            if (flat_out)
                cg_line(b, 5, "*(tlm_vf *)&T[(oh0 * %lld + ow0 + %lld) * %d] = a%lld_%lld;",
                        (long long)OW, (long long)(i * OW + u), L, (long long)i, (long long)u);
            else
                cg_line(b, 5, "*(tlm_vf *)&T[(%lld + ow0) * %d] = a%lld_%lld;",
                        (long long)(i * OWp + u), L, (long long)i, (long long)u);
        }
    cg_line(b, 4, "}");
    if (flat_out) {
        cg_line(b, 3, "}");
        emit_window_flat_epilogue(c, L, OH * OW, OW, C);
    } else {
        emit_window_row_epilogue(c, L, R, OW, C);
        cg_line(b, 3, "}");
    }
    for (int i = 2; i >= 0; i--)
        cg_line(b, i, "}"); /* task, thread, function */
    if (wn) emit_window_prepack_entries(c, entry, gm, L, KK);
    return 0;
}

/* A 1 x 1 window of stride 1 without padding along OW (a squeeze-and-excitation scale,
 * x * gate[c], as the frontend writes it: a 1 x 1 depthwise conv): each plane is one row of
 * H x W points in memory order, through the weight and the epilogue as one vectorised loop,
 * with nothing to pack and no tiles (the tile slots change nothing here). Through the plane
 * pack and register tiles, EfficientNet-B0's 32 x 112 x 112 scale took 0.052 ms in its plan
 * against ONNX Runtime's 0.029 (Zen 4). planes: N x C; hw: the points of a plane. */
static int gen_window_pointwise(cgc *c, const char *entry, const ir_expr *X, int lw, int64_t planes,
                                int64_t hw, int64_t C, int64_t OW)
{
    cg_buf *b = &c->b;
    const ir_stage *a = c->a;
    params_and_packed(c, entry, 0);
    cg_line(b, 0, "{");
    const char *xn = c->nm.tensor[X->tensor];
    const char *wn = lw >= 0 ? c->nm.tensor[a->expr[lw].tensor] : NULL;
    if (space_get(c->sp, c->s, SLOT_PARALLEL, 0) != 0)
        cg_line(b, 1, "#pragma omp parallel for schedule(static)");
    cg_line(b, 1, "for (int64_t task = 0; task < %lld; task++) {", (long long)planes);
    cg_line(b, 2, "const int64_t %s = task / %lld, %s = task %% %lld;", a->axis[0], (long long)C,
            a->axis[1], (long long)C);
    cg_line(b, 2, "const float *const xp = %s + task * %lld;", xn, (long long)hw);
    if (wn) cg_line(b, 2, "const float wc = %s[%s];", wn, a->axis[1]);
    cg_line(b, 2, "#pragma omp simd");
    cg_line(b, 2, "for (int64_t q = 0; q < %lld; q++) {", (long long)hw);
    emit_plane_point(c, 3, "q", OW, wn ? "xp[q] * wc" : "xp[q]");
    cg_line(b, 2, "}");
    cg_line(b, 1, "}");
    cg_line(b, 0, "}");
    return 0;
}

/* Depthwise conv / max pool / avg pool in NCHW (space.h CPU_WINDOW). Per (n, c) plane:
 *   Q[r][ph][j] = the zero (-inf) padded input row r at column j * SW + ph
 * so tap (kh, kw) of output (oh, ow) is Q[oh * SH + kh * DH][(kw * DW) % SW][ow + kw * DW / SW],
 * contiguous along ow whatever the stride. The register tile (R rows x NV vectors) walks the
 * input rows its window covers once: each loaded vector feeds every (row, kh) that reads it.
 * Accumulators go to a row buffer; the epilogue stores the real points. */
static int gen_window(cgc *c, const char *entry)
{
    cg_buf *b = &c->b;
    const ir_subgraph *g = c->g;
    const ir_stage *a = c->a;
    const space *sp = c->sp;
    /* the input load, the weight load (depthwise) and the padding's fill value */
    int lx = -1, lw = -1;
    double fill = 0.0;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind == IR_E_LOAD && g->tensor[e->tensor].ndim == 4) lx = id;
        if (e->kind == IR_E_LOAD && g->tensor[e->tensor].ndim == 3) lw = id;
        if (e->kind == IR_E_SELECT) fill = a->expr[e->b].value;
    }
    if (lx < 0) return TLM_EINVAL;
    const ir_expr *X = &a->expr[lx];
    const ir_tensor *xt = &g->tensor[X->tensor];
    int64_t H = xt->shape[2], Wd = xt->shape[3];
    int64_t SH = X->idx[2].coef[2], DH = X->idx[2].coef[4], PH = -X->idx[2].off;
    int64_t SW = X->idx[3].coef[3], DW = X->idx[3].coef[5], PW = -X->idx[3].off;
    int64_t N = a->extent[0], C = a->extent[1], OH = a->extent[2], OW = a->extent[3];
    int64_t KH = a->extent[4], KW = a->extent[5];
    bool maxr = a->reduce == IR_RED_MAX;
    if (space_window_channels(sp, c->s, sp->n_slot)) {
        const win_geom gm = {X,  lw, fill, maxr, H, Wd, SH, DH, PH,
                             SW, DW, PW,   N,    C, OH, OW, KH, KW};
        return gen_window_channels(c, entry, &gm);
    }
    int W = space_window_lanes(sp, c->s, sp->n_slot);
    if (W > 1 && space_window_pointwise(sp))
        return gen_window_pointwise(c, entry, X, lw, N * C, H * Wd, C, OW);
    int64_t CO = space_tile(sp, c->s, 3, 3), R = space_tile(sp, c->s, 2, 3);
    int64_t NV = CO / W, OHB = (OH + R - 1) / R, OWB = (OW + CO - 1) / CO;
    int64_t OHc = OHB * R, OWc = OWB * CO;
    int64_t HP = (OHc - 1) * SH + (KH - 1) * DH + 1;
    int64_t WQ = OWc + (KW - 1) * DW / SW + 1;
    /* each phase row a whole number of vectors, and Q placed so that the first column the
     * plane pack writes starts a vector: its stores aligned (alternating rounds on a Xeon:
     * a 5x5 stride-2 depthwise, 72 x 56 x 56, rows of 35 floats written from column 1,
     * 1.04x AVX-512, 1.07x AVX2; a 3x3 stride-2 avg pool 1.16x / 1.11x; 7x7 depthwise and
     * a 5x5 max pool 0.99-1.05x) */
    if (W > 1) WQ = (WQ + W - 1) / W * W;
    const int64_t qoff = W > 1 ? (W - (PW + SW - 1) / SW % W) % W : 0;
    int64_t span = (R - 1) * SH + (KH - 1) * DH + 1; /* padded input rows of a register tile */
    bool par = space_get(sp, c->s, SLOT_PARALLEL, 0) != 0;
    char fl[64];
    cg_float_literal(fill, fl, sizeof fl);
    const char *ty = W > 1 ? "tlm_vf" : "float";
    if (W > 1) {
        c->W = W;
        emit_vec_helpers(c);
    }
    const bool deint8 = SW == 2 && W == 8; /* the plane pack's stride-2 split below */
    if (deint8) {
        /* the even and odd floats of 16: two in-lane shuffles and two 64-bit permutes, where
         * GCC lowers each __builtin_shuffle to three operations */
        cg_line(b, 0, "static inline void tlm_deint2(const float *x, float *ev, float *od)");
        cg_line(b, 0, "{");
        cg_line(b, 0, "#if defined(__AVX2__)");
        cg_line(b, 1, "const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);");
        cg_line(b, 1, "const __m256d e = _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88));");
        cg_line(b, 1, "const __m256d o = _mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xdd));");
        cg_line(b, 1, "_mm256_storeu_ps(ev, _mm256_castpd_ps(_mm256_permute4x64_pd(e, 0xd8)));");
        cg_line(b, 1, "_mm256_storeu_ps(od, _mm256_castpd_ps(_mm256_permute4x64_pd(o, 0xd8)));");
        cg_line(b, 0, "#else");
        cg_line(b, 1, "for (int l = 0; l < 8; l++) ev[l] = x[2 * l], od[l] = x[2 * l + 1];");
        cg_line(b, 0, "#endif");
        cg_line(b, 0, "}");
    }
    /* A window's output past the streaming bound (space_cpu_output_streams) in rows of whole
     * 64-byte lines goes out of the row buffer with non-temporal stores, the epilogue applied
     * in place first: no reads for ownership. */
    const bool wstream = W > 1 && OW % 16 == 0 && output_streams(c);
    if (wstream) emit_stream_helper(b);
    /* the buffered write-back of short AVX-512 rows (below) */
    const bool vwb = !wstream && W == 16 && OW <= 2 * W && !epilogue_reads_axis(g, 3);
    if (vwb && OW % W) {
        /* the first n floats of v to p (a row's last, partial vector) */
        cg_line(b, 0, "#include <immintrin.h>");
        cg_line(b, 0, "static inline void tlm_vstore_part(float *p, tlm_vf v, int64_t n)");
        cg_line(b, 0, "{");
        cg_line(b, 0, "#if defined(__AVX512F__)");
        cg_line(b, 1, "_mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), (__m512)v);");
        cg_line(b, 0, "#else");
        cg_line(b, 1, "for (int64_t l = 0; l < n; l++) p[l] = v[l];");
        cg_line(b, 0, "#endif");
        cg_line(b, 0, "}");
    }
    params_and_packed(c, entry, 0);
    cg_line(b, 0, "{");
    const char *xn = c->nm.tensor[X->tensor];
    const char *wn = lw >= 0 ? c->nm.tensor[a->expr[lw].tensor] : NULL;
    /* Q (HP x SW x WQ) and the row buffer (R x OWc) on each thread's stack: the space bounds
     * them (CPU_WINDOW_FLOATS_MAX in space.c) */
    int64_t qn = HP * SW * WQ, rb = R * OWc;
    if (par) cg_line(b, 1, "#pragma omp parallel");
    cg_line(b, 1, "{");
    cg_line(b, 2, "float Qb[%lld] __attribute__((aligned(64)));", (long long)(qn + qoff));
    cg_line(b, 2, "float *const Q = Qb + %lld;", (long long)qoff);
    cg_line(b, 2, "float rowbuf[%lld] __attribute__((aligned(64)));", (long long)rb);
    /* the padding (rows outside the input, each phase's columns outside it) is the same in
     * every plane: written once per thread, then each plane writes its input's points only
     * (the per-plane fill and phase split had 40 % of a 5x5 stride-2 depthwise's samples on
     * AVX2; the fill written once: 0.087 -> 0.071 ms on two threads) */
    cg_line(b, 2, "for (int64_t j = 0; j < %lld; j++) Q[j] = %s;", (long long)qn, fl);
    if (par) cg_line(b, 2, "#pragma omp for schedule(static)");
    cg_line(b, 2, "for (int64_t task = 0; task < %lld; task++) {", (long long)(N * C));
    cg_line(b, 3, "const int64_t %s = task / %lld, %s = task %% %lld;", a->axis[0], (long long)C,
            a->axis[1], (long long)C);
    cg_line(b, 3, "const float *const xp = %s + task * %lld;", xn, (long long)(H * Wd));
    if (wn)
        cg_line(b, 3, "const float *const wt = %s + %s * %lld;", wn, a->axis[1],
                (long long)(KH * KW));
    /* The register tiles, row block by row block, each packing the input rows of the block
     * after it (the first also its own): the plane's pack, which read it from L2 and took a
     * quarter of a 5x5 stride-2 depthwise's time, then overlaps the FMAs, and a block reads
     * rows written a block earlier, not ones still in the store buffer (packed just before
     * their own block, a 5x5 at 14 x 14 lost 11 %). Alternated against the whole plane packed
     * first, 2 threads: 3x3 depthwise at 112 x 112 1.13-1.19x, stride 2 1.03-1.13x, 5x5
     * stride 2 at 56 x 56 1.05-1.07x, MobileNetV2's 144 x 56 x 56 batch 8 1.02-1.11x, a
     * 3x3 stride-2 max pool at 112 1.12x (AVX-512), avg pool 1.07-1.09x. A plane under 8 KiB
     * (28 x 28 and less: read from L2 in a few hundred cycles) is packed whole first, as
     * before: 3x3 depthwise at 14 x 14 lost 6-9 % on AVX2 with its pack in the blocks' loop
     * (ResNet's and MobileNet's 28 x 28 ones 0.97-1.08x). */
    const bool ahead = H * Wd * (int64_t)sizeof(float) >= 8192;
    const int pi = ahead ? 1 : 0; /* the pack's extra indent inside the row blocks' loop */
    /* Each row block also requests into L2 its share of the next task's plane (the plane
     * after this one in memory), where the input is larger than the cores' L2s together: a
     * plane is a run of 4 KiB pages that the hardware prefetchers, which stop at a page's
     * end, start on again page by page, the pack waiting on memory at each. Zen 4 EPYC, 2
     * threads, alternated, alone warm / from DRAM: MobileNetV2's stride-2 3x3 depthwise at
     * batch 8 (96 x 112 x 112 in) 1.15-1.20x / 1.24-1.31x, on AVX2 1.53x / 1.44x, at 56 x 56
     * 1.10-1.19x (AVX2 1.20x), stride 1 at 56 x 56 1.11x (AVX2 a tie), at 112 x 112 a tie;
     * ResNet-50's 3x3 stride-2 max pool at batch 8 1.5x / 1.24-1.49x (AVX2 1.37x / 1.19x).
     * In plans: MobileNetV2 b8 features.2.dw 3.03 -> 2.32 ms, features.4.dw 1.03 -> 0.70;
     * ResNet-50 b8 maxpool 1.70 -> 1.01 */
    const bool next_plane =
        ahead && N * C > 1 &&
        N * C * H * Wd * (int64_t)sizeof(float) > target_l2(c) * target_cores(c);
    if (ahead) {
        cg_line(b, 3, "int64_t rdone = 0;");
        cg_line(b, 3, "for (int64_t ohb = 0; ohb < %lld; ohb++) {", (long long)OHB);
        cg_line(b, 4, "const int64_t rend = ohb * %lld + %lld < %lld ? ohb * %lld + %lld : %lld;",
                (long long)(R * SH), (long long)(R * SH + span), (long long)HP, (long long)(R * SH),
                (long long)(R * SH + span), (long long)HP);
    }
    /* pack the plane: rows outside the input are fill; inside, each phase's columns */
    if (ahead)
        cg_line(b, 4, "for (int64_t r = rdone; r < rend; r++) {");
    else
        cg_line(b, 3, "for (int64_t r = 0; r < %lld; r++) {", (long long)HP);
    cg_line(b, 4 + pi, "const int64_t ih = r - %lld;", (long long)PH);
    cg_line(b, 4 + pi, "float *const q = Q + r * %lld;", (long long)(SW * WQ));
    cg_line(b, 4 + pi, "if (ih < 0 || ih >= %lld) continue;", (long long)H);
    cg_line(b, 4 + pi, "const float *const xr = xp + ih * %lld;", (long long)Wd);
    /* columns j of phase ph with 0 <= j * SW + ph - PW < Wd: [lo[ph], hi[ph]); the range
     * every phase has, [clo, chi), is one loop writing all phases (stride 2: one pair of
     * loads deinterleaved into two rows) */
    int64_t lo[16], hi[16], clo = 0, chi = WQ;
    for (int64_t ph = 0; ph < SW; ph++) { /* SW <= 16 (window_family) */
        lo[ph] = PW - ph > 0 ? (PW - ph + SW - 1) / SW : 0;
        hi[ph] = Wd - 1 + PW - ph >= 0 ? (Wd - 1 + PW - ph) / SW + 1 : 0;
        if (hi[ph] > WQ) hi[ph] = WQ;
        if (lo[ph] > hi[ph]) lo[ph] = hi[ph];
        if (lo[ph] > clo) clo = lo[ph];
        if (hi[ph] < chi) chi = hi[ph];
    }
    if (clo > chi) clo = chi = 0; /* no common range: per phase only */
    if (W > 1 && (SW == 1 || (SW == 2 && (W == 16 || deint8))) && chi - clo >= W) {
        /* whole vectors, the last one ending at chi (overlapping the one before it: the same
         * values written twice) instead of GCC's vector body and scalar tail; stride 2
         * splits each pair of loaded vectors into its two phases with shuffles, one
         * two-source permute each on AVX-512. The plane pack was 37 % of a 5x5 stride-2
         * depthwise (72 x 56 x 56, 2 threads, AVX-512: 0.0123 of 0.0332 ms), most of it the
         * tail's scalar copies; now 0.0340 -> 0.0299 in all. On AVX2 GCC lowers each
         * __builtin_shuffle to three operations, slower than its own loop (0.0293 -> 0.0301
         * ms), and tlm_deint2's two in-lane shuffles and two permutes per pair beat both
         * (Zen 5, AVX2 code: the same conv 0.0261 -> 0.0240 ms; 34 stride-2 depthwise convs
         * and pools of the records and zoo 1.05x geomean, 0.97-1.23x) */
        char ev[512] = "", od[512] = "";
        for (int l = 0, n1 = 0, n2 = 0; l < W; l++) {
            n1 += snprintf(ev + n1, sizeof ev - (size_t)n1, "%s%d", l ? ", " : "", 2 * l);
            n2 += snprintf(od + n2, sizeof od - (size_t)n2, "%s%d", l ? ", " : "", 2 * l + 1);
        }
        char jf[24], jl[24];
        emit_overlap_loop(b, 4 + pi, "j", lld(jf, sizeof jf, clo), W, lld(jl, sizeof jl, chi - W));
        if (SW == 1) {
            cg_line(b, 5 + pi, "*(tlm_vfu *)&q[j] = *(const tlm_vfu *)&xr[j - %lld];",
                    (long long)PW);
        } else if (deint8) {
            cg_line(b, 5 + pi, "tlm_deint2(&xr[j * 2 - %lld], &q[j], &q[%lld + j]);", (long long)PW,
                    (long long)WQ);
        } else {
            cg_line(b, 5 + pi, "const tlm_vf v0 = *(const tlm_vfu *)&xr[j * 2 - %lld];",
                    (long long)PW);
            cg_line(b, 5 + pi, "const tlm_vf v1 = *(const tlm_vfu *)&xr[j * 2 %c %lld];",
                    W >= PW ? '+' : '-', (long long)(W >= PW ? W - PW : PW - W));
            cg_line(b, 5 + pi, "*(tlm_vfu *)&q[j] = __builtin_shuffle(v0, v1, (tlm_wi){%s});", ev);
            cg_line(b, 5 + pi,
                    "*(tlm_vfu *)&q[%lld + j] = __builtin_shuffle(v0, v1, (tlm_wi){%s});",
                    (long long)WQ, od);
        }
        emit_overlap_loop_end(b, 4 + pi, "j", jl);
    } else if (chi > clo) {
        cg_line(b, 4 + pi, "for (int64_t j = %lld; j < %lld; j++) {", (long long)clo,
                (long long)chi);
        for (int64_t ph = 0; ph < SW; ph++)
            cg_line(b, 5 + pi, "q[%lld + j] = xr[j * %lld + %lld];", (long long)(ph * WQ),
                    (long long)SW, (long long)(ph - PW));
        cg_line(b, 4 + pi, "}");
    }
    for (int64_t ph = 0; ph < SW; ph++) {
        int64_t l = lo[ph], h = hi[ph];
        int64_t a0 = chi > clo ? clo : h, a1 = chi > clo ? chi : h; /* [a0, a1) done above */
        if (a0 > l)
            cg_line(b, 4 + pi,
                    "for (int64_t j = %lld; j < %lld; j++) q[%lld + j] = xr[j * %lld + %lld];",
                    (long long)l, (long long)a0, (long long)(ph * WQ), (long long)SW,
                    (long long)(ph - PW));
        if (h > a1)
            cg_line(b, 4 + pi,
                    "for (int64_t j = %lld; j < %lld; j++) q[%lld + j] = xr[j * %lld + %lld];",
                    (long long)a1, (long long)h, (long long)(ph * WQ), (long long)SW,
                    (long long)(ph - PW));
    }
    cg_line(b, 3 + pi, "}");
    if (ahead) {
        cg_line(b, 4, "rdone = rend;");
        if (next_plane) {
            const int64_t plane = H * Wd, share = (plane + OHB - 1) / OHB;
            cg_line(b, 4, "if (task + 1 < %lld) /* the next plane's share, into L2 */",
                    (long long)(N * C));
            cg_line(b, 5,
                    "for (int64_t p = ohb * %lld; p < ohb * %lld + %lld && p < %lld; p += 16)",
                    (long long)share, (long long)share, (long long)share, (long long)plane);
            cg_line(b, 6, "__builtin_prefetch(&xp[%lld + p], 0, 2);", (long long)plane);
        }
    } else {
        cg_line(b, 3, "for (int64_t ohb = 0; ohb < %lld; ohb++) {", (long long)OHB);
    }
    cg_line(b, 4, "for (int64_t owb = 0; owb < %lld; owb++) {", (long long)OWB);
    cg_line(b, 5, "const float *const q0 = Q + ohb * %lld + owb * %lld;",
            (long long)(R * SH * SW * WQ), (long long)CO);
    const char *init = maxr ? "-INFINITY" : "0.0f";
    for (int64_t i = 0; i < R; i++)
        for (int64_t v = 0; v < NV; v++)
            cg_line(b, 5, "%s a%lld_%lld = %s%s;", ty, (long long)i, (long long)v,
                    W > 1 ? "(tlm_vf){} + " : "", init);
    /* The taps' weights are read through wk, which an empty asm "changes" at each input row:
     * GCC otherwise hoists all KH x KW broadcasts out of the tile loops and spills them, and
     * then folds the input vectors into the FMAs, one 64-byte load per FMA (7x7 at 56x56, one
     * vector x 8 rows, one thread: 0.435 -> 0.367 ms). Under one vector column (pin) each
     * input vector is also pinned in a register by an empty asm, for the taps that read it,
     * and a compiler barrier ends each input row, so each FMA takes its weight as a 4-byte
     * broadcast operand (5x5 stride 2 at 56x56, 1 x 7, 2 threads: 0.047 -> 0.036 ms). Under
     * wider columns GCC then loads the row's weights early and spills the pinned vectors
     * (2 x 4 there: 0.053 -> 0.069 ms), so those keep the renewed pointer and no barrier.
     * Wider columns still pin their input vectors (pinw) while the accumulators, a row's
     * vectors and a broadcast fit the registers: unpinned, GCC folds each vector's load into
     * every FMA that reads it, and a tap shared by two rows reads Q twice, unaligned (5x5
     * stride 2, 2 x 4 vectors on AVX2: 200 vector loads per tile, pinned 140; one thread
     * 0.069 -> 0.058 ms). */
    bool pin = W > 1 && NV == 1;
    bool pinw = W > 1 && NV > 1 && !maxr &&
                R * NV + NV + 2 <= (int64_t)sp->tgt.cpu.vector_registers;
    /* Each input row feeds the accumulators of the output rows that read it: ceil(KH / SH)
     * rows at most, so a 5x5 stride-2 tile of one vector column has three FMA chains in
     * flight, short of the four a 4-cycle FMA needs to issue one a cycle. The sums then
     * alternate between two accumulator sets by input row (a, b), added at the end, where the
     * registers hold both (5x5 stride 2 at 56x56, 7 x 1 vectors, 2 threads, Zen 4: 0.0338 ->
     * 0.0327 ms; a 7x7 stride-7 avg pool, one chain: 0.0504 -> 0.0392, AVX2 0.0488 -> 0.0322).
     * Maxima keep one set (2-cycle latency). */
    const int64_t rows_per_input = (KH + SH - 1) / SH; /* output rows an input row feeds */
    const int64_t chains = rows_per_input * NV;
    const bool split = W > 1 && !maxr && chains < 4 &&
                       2 * R * NV + (pin ? KW : 1) * NV + 2 <= (int64_t)sp->tgt.cpu.vector_registers;
    if (split)
        for (int64_t i = 0; i < R; i++)
            for (int64_t v = 0; v < NV; v++)
                cg_line(b, 5, "tlm_vf b%lld_%lld = (tlm_vf){} + 0.0f;", (long long)i, (long long)v);
    if (wn) cg_line(b, 5, "const float *wk = wt;");
    /* Pools (no weights) are separable: each input row's KW taps are combined once, then
     * that one vector goes to every output row reading the row (KW - 1 + rows ops per input
     * row instead of KW x rows), where an input row feeds three output rows or more
     * (interleaved A/B, 2 threads: 5x5 stride-1 max pool at 20x20, 256 channels, 0.0664 ->
     * 0.0512 ms on AVX-512 and 0.0529 -> 0.0399 on AVX2; a 3x3 stride-2 max pool, two rows
     * per input row, 0.0918 -> 0.0955 on AVX-512, so it keeps the taps apart). The loaded
     * vectors are then overwritten, so they are not const. */
    const bool sep = !wn && W > 1 && KW > 1 && rows_per_input >= 3;
    int64_t blk = 0; /* input rows emitted: their parity picks the set under split */
    for (int64_t ir = 0; ir < span; ir++) {
        bool used = false;
        for (int64_t i = 0; i < R; i++)
            for (int64_t kh = 0; kh < KH; kh++)
                used |= i * SH + kh * DH == ir;
        if (!used) continue;
        const char acc = split && blk++ % 2 ? 'b' : 'a';
        cg_line(b, 5, "{");
        if (pin)
            cg_line(b, 6, wn ? "__asm__ volatile(\"\" : \"+r\"(wk) : : \"memory\");"
                             : "__asm__ volatile(\"\" : : : \"memory\");");
        else if (wn)
            cg_line(b, 6, "__asm__(\"\" : \"+r\"(wk));");
        for (int64_t kw = 0; kw < KW; kw++) {
            int64_t ph = (kw * DW) % SW, jo = kw * DW / SW;
            for (int64_t v = 0; v < NV; v++) {
                if (pin || pinw) /* both imply W > 1 */
                    cg_line(b, 6, "tlm_vf x%lld_%lld = *(const tlm_vfu *)&q0[%lld]; TLM_PIN(x%lld_%lld);",
                            (long long)kw, (long long)v,
                            (long long)((ir * SW + ph) * WQ + jo + v * W), (long long)kw,
                            (long long)v);
                else if (W > 1)
                    cg_line(b, 6, sep ? "tlm_vf x%lld_%lld = *(const tlm_vfu *)&q0[%lld];"
                                      : "const tlm_vf x%lld_%lld = *(const tlm_vfu *)&q0[%lld];",
                            (long long)kw, (long long)v,
                            (long long)((ir * SW + ph) * WQ + jo + v * W));
                else
                    cg_line(b, 6, "const float x%lld_%lld = q0[%lld];", (long long)kw, (long long)v,
                            (long long)((ir * SW + ph) * WQ + jo + v * W));
            }
            if (sep) continue; /* combined below, once the row's taps are loaded */
            for (int64_t i = 0; i < R; i++)
                for (int64_t kh = 0; kh < KH; kh++) {
                    if (i * SH + kh * DH != ir) continue;
                    for (int64_t v = 0; v < NV; v++) {
                        if (maxr)
                            cg_line(b, 6, "a%lld_%lld = %s(a%lld_%lld, x%lld_%lld);", (long long)i,
                                    (long long)v, W > 1 ? "tlm_v_max" : "tlm_max", (long long)i,
                                    (long long)v, (long long)kw, (long long)v);
                        else if (wn)
                            cg_line(b, 6, "%c%lld_%lld += x%lld_%lld * wk[%lld];", acc,
                                    (long long)i, (long long)v, (long long)kw, (long long)v,
                                    (long long)(kh * KW + kw));
                        else
                            cg_line(b, 6, "%c%lld_%lld += x%lld_%lld;", acc, (long long)i,
                                    (long long)v, (long long)kw, (long long)v);
                    }
                }
        }
        for (int64_t v = 0; sep && v < NV; v++) {
            /* the row's taps combined (a balanced tree), then one op per output row */
            for (int64_t n = KW, step = 1; n > 1; n = (n + 1) / 2, step *= 2)
                for (int64_t kw = 0; kw + step < KW; kw += 2 * step)
                    cg_line(b, 6, maxr ? "x%lld_%lld = tlm_v_max(x%lld_%lld, x%lld_%lld);"
                                       : "x%lld_%lld = x%lld_%lld + x%lld_%lld;",
                            (long long)kw, (long long)v, (long long)kw, (long long)v,
                            (long long)(kw + step), (long long)v);
            for (int64_t i = 0; i < R; i++)
                for (int64_t kh = 0; kh < KH; kh++) {
                    if (i * SH + kh * DH != ir) continue;
                    if (maxr)
                        cg_line(b, 6, "a%lld_%lld = tlm_v_max(a%lld_%lld, x0_%lld);", (long long)i,
                                (long long)v, (long long)i, (long long)v, (long long)v);
                    else
                        cg_line(b, 6, "%c%lld_%lld += x0_%lld;", acc, (long long)i, (long long)v,
                                (long long)v);
                }
        }
        cg_line(b, 5, "}");
    }
    for (int64_t i = 0; i < R; i++)
        for (int64_t v = 0; v < NV; v++) {
            if (split)
                cg_line(b, 5, "*(tlm_vfu *)&rowbuf[%lld + owb * %lld] = a%lld_%lld + b%lld_%lld;",
                        (long long)(i * OWc + v * W), (long long)CO, (long long)i, (long long)v,
                        (long long)i, (long long)v);
            else if (W > 1)
                cg_line(b, 5, "*(tlm_vfu *)&rowbuf[%lld + owb * %lld] = a%lld_%lld;",
                        (long long)(i * OWc + v * W), (long long)CO, (long long)i, (long long)v);
            else
                cg_line(b, 5, "rowbuf[%lld + owb * %lld] = a%lld_%lld;",
                        (long long)(i * OWc + v * W), (long long)CO, (long long)i, (long long)v);
        }
    cg_line(b, 4, "}");
    /* write-back: the real rows and columns, through the epilogue. On AVX-512, for a row of
     * at most two vectors, GCC would unroll it whole where R divides the output rows, forward
     * the accumulators into the epilogue's lanes and, for many tiles, spill the taps' weights
     * and input vectors all through the tile (5x5 stride 2 at 56x56 + bias + ReLU, 28
     * columns, 2 vectors x 4 rows: about 200 stack moves; 7x7 at 28x28 + bias, 2 x 3 rows:
     * about 380). There the barrier keeps rowbuf a buffer and, where the epilogue reads
     * nothing along the columns (a bias, a scale, pointwise functions), the epilogue runs in
     * place on the row's whole vectors, each stored whole or the last one masked, instead of
     * GCC's 16 + 8 + scalar tail. Old vs new alternated, Zen 5, default tiles, rows of 7-28
     * columns: MobileNetV3's 5x5 stride 2 + bias + ReLU 0.0280 -> 0.0160 ms, 5x5 at 14x14 +
     * bias + SiLU 2.1x, 3x3 at 14x14 + ReLU6 1.46x; 7x7 + bias, which did not spill, 0.98-1.01.
     * Longer rows (56, 112 columns) and AVX2 keep GCC's way: nothing spills there, and the
     * buffered rows cost 0.89-0.96x (MobileNetV2's 3x3 at 112 x 112 cold, 144 x 56 x 56). */
    const int64_t nfull = vwb ? OW / W : 0, tail = vwb ? OW % W : 0;
    const bool epi = a->post_scale != 1.0 || g->anchor + 1 < g->n_stage;
    if (vwb) cg_line(b, 4, "__asm__ volatile(\"\" : \"+m\"(rowbuf));");
    cg_line(b, 4, "for (int64_t i = 0; i < %lld && ohb * %lld + i < %lld; i++) {", (long long)R,
            (long long)R, (long long)OH);
    cg_line(b, 5, "const int64_t %s = ohb * %lld + i;", a->axis[2], (long long)R);
    cg_names nm = anchor_names(c, 4);
    if (!(vwb || wstream) || epi) { /* in place (vwb: over whole vectors; wstream), else out */
        char dest[96];
        snprintf(dest, sizeof dest, "rowbuf[i * %lld + %s]", (long long)OWc, a->axis[3]);
        cg_line(b, 5, "#pragma omp simd");
        cg_line(b, 5, "for (int64_t %s = 0; %s < %lld; %s++) {", a->axis[3], a->axis[3],
                (long long)(vwb ? (nfull + (tail > 0)) * W : OW), a->axis[3]);
        cg_printf(b, "%*sfloat v = rowbuf[i * %lld + %s]", 6 * 4, "", (long long)OWc, a->axis[3]);
        if (a->post_scale != 1.0) cg_printf(b, " * (float)%.17g", a->post_scale);
        cg_printf(b, ";\n");
        emit_epilogue_store(b, g, 6, &nm, vwb || wstream ? dest : NULL);
        cg_line(b, 5, "}");
    }
    if (wstream) {
        cg_names o0 = nm;
        o0.axis[3] = "0";
        cg_printf(b, "%*stlm_stream_row(&", 5 * 4, "");
        emit_output_ref(b, g, &o0);
        cg_printf(b, ", &rowbuf[i * %lld], %lld);\n", (long long)OWc, (long long)OW);
    }
    if (vwb) {
        cg_names o0 = nm;
        o0.axis[3] = "0";
        cg_printf(b, "%*sfloat *const o = &", 5 * 4, "");
        emit_output_ref(b, g, &o0);
        cg_printf(b, ";\n");
        if (nfull > 0)
            cg_line(b, 5, "for (int64_t k = 0; k < %lld; k += %d) *(tlm_vfu *)&o[k] = "
                          "*(const tlm_vf *)&rowbuf[i * %lld + k];",
                    (long long)(nfull * W), W, (long long)OWc);
        if (tail > 0)
            cg_line(b, 5, "tlm_vstore_part(&o[%lld], *(const tlm_vf *)&rowbuf[i * %lld + %lld], "
                          "%lld);",
                    (long long)(nfull * W), (long long)OWc, (long long)(nfull * W),
                    (long long)tail);
    }
    cg_line(b, 4, "}");
    cg_line(b, 3, "}");
    cg_line(b, 2, "}");
    if (wstream) cg_line(b, 2, "_mm_sfence(); /* the streamed rows, before the threads join */");
    cg_line(b, 1, "}");
    cg_line(b, 0, "}");
    return 0;
}

/* ---- CPU_ROWS ---- */

static int gen_rows(cgc *c, const char *entry);

/* The code generator of each CPU sketch (NULL: not a CPU sketch). */
static int (*const cpu_routes[SKETCH_COUNT])(cgc *, const char *) = {
    [SKETCH_CPU_TILE] = gen_tile,
    [SKETCH_CPU_ROWS] = gen_rows,
    [SKETCH_CPU_WINDOW] = gen_window,
};

bool cg_cpu_has_route(space_sketch s)
{
    return (unsigned)s < SKETCH_COUNT && cpu_routes[s] != NULL;
}

/* Whether expression id of stage st reads an axis past the row axes (index or condition). */
static bool expr_inner(const ir_stage *st, int id, int nra)
{
    const ir_expr *e = &st->expr[id];
    int n = st->n_spatial + st->n_reduce;
    switch (e->kind) {
    case IR_E_CONST: return false;
    case IR_E_LOAD:
        for (int d = 0; d < IR_MAX_DIMS; d++)
            for (int x = nra; x < n; x++)
                if (e->idx[d].coef[x]) return true;
        return false;
    case IR_E_UNARY: return expr_inner(st, e->a, nra);
    case IR_E_BINARY: return expr_inner(st, e->a, nra) || expr_inner(st, e->b, nra);
    case IR_E_SELECT:
        for (int k = 0; k < e->ncond; k++)
            for (int x = nra; x < n; x++)
                if (e->cond[k].coef[x]) return true;
        return expr_inner(st, e->a, nra) || expr_inner(st, e->b, nra);
    }
    return true;
}

/* Structural equality of two expressions of stages over the same axes (same names in the
 * same positions: checked by the caller). */
static bool expr_eq(const ir_stage *sa, int ia, const ir_stage *sb, int ib)
{
    const ir_expr *p = &sa->expr[ia], *q = &sb->expr[ib];
    int n = sa->n_spatial + sa->n_reduce;
    if (p->kind != q->kind) return false;
    switch (p->kind) {
    case IR_E_CONST: return p->value == q->value;
    case IR_E_LOAD:
        if (p->tensor != q->tensor) return false;
        for (int d = 0; d < IR_MAX_DIMS; d++)
            if (!affine_eq(&p->idx[d], &q->idx[d], n)) return false;
        return true;
    case IR_E_UNARY: return p->op == q->op && expr_eq(sa, p->a, sb, q->a);
    case IR_E_BINARY:
        return p->op == q->op && expr_eq(sa, p->a, sb, q->a) && expr_eq(sa, p->b, sb, q->b);
    case IR_E_SELECT:
        if (p->ncond != q->ncond) return false;
        for (int k = 0; k < p->ncond; k++)
            if (p->cond_hi[k] != q->cond_hi[k] || !affine_eq(&p->cond[k], &q->cond[k], n))
                return false;
        return expr_eq(sa, p->a, sb, q->a) && expr_eq(sa, p->b, sb, q->b);
    }
    return false;
}

static bool expr_has_exp(const ir_stage *st, int id)
{
    const ir_expr *e = &st->expr[id];
    if (e->kind == IR_E_UNARY)
        return e->op == IR_U_EXP || e->op == IR_U_GELU || e->op == IR_U_SILU ||
               e->op == IR_U_SIGMOID || e->op == IR_U_TANH || expr_has_exp(st, e->a);
    if (e->kind == IR_E_BINARY) return expr_has_exp(st, e->a) || expr_has_exp(st, e->b);
    if (e->kind == IR_E_SELECT) return expr_has_exp(st, e->a) || expr_has_exp(st, e->b);
    return false;
}

/* The anchor subtree equal to row-sum stage si's body (an exp worth computing once), or -1:
 * the sum stage then stores each term in the output row and the anchor reads it back
 * (softmax: one exp per element instead of two). The output is written by the anchor at the
 * same index in the same iteration, after the read. */
static int shared_term(const ir_subgraph *g, int si, int nra)
{
    const ir_stage *st = &g->stage[si], *an = &g->stage[g->anchor];
    if (st->reduce != IR_RED_SUM || st->n_spatial != nra || st->post_scale != 1.0) return -1;
    int n = st->n_spatial + st->n_reduce;
    if (an->n_spatial != n || an->n_reduce != 0 || !expr_has_exp(st, st->body)) return -1;
    if (g->tensor[g->output].ndim != n) return -1;
    for (int x = 0; x < n; x++)
        if (strcmp(st->axis[x], an->axis[x]) || st->extent[x] != an->extent[x]) return -1;
    for (int id = 0; id < an->n_expr; id++)
        if (expr_eq(an, id, st, st->body)) return id;
    return -1;
}

/* Row-invariant parts of the anchor, computed once per row before its inner loops: maximal
 * subtrees that read no inner axis, and the reciprocal of a row-invariant divisor (a
 * multiply per element instead of a divide). */
typedef struct {
    char name[IR_MAX_EXPR][20];
    char rname[IR_MAX_EXPR][20];
    const char *var[IR_MAX_EXPR];
    const char *recip[IR_MAX_EXPR];
    int n;
} rows_hoist;

static void hoist(cg_buf *b, const ir_subgraph *g, const ir_stage *st, int id, int nra,
                  rows_hoist *h, int ind, const cg_names *nm)
{
    const ir_expr *e = &st->expr[id];
    if (h->var[id]) return;
    if (!expr_inner(st, id, nra)) {
        if (e->kind == IR_E_LOAD || e->kind == IR_E_CONST) return;
        snprintf(h->name[id], sizeof h->name[id], "h%d", h->n++);
        cg_printf(b, "%*sconst float %s = ", ind * 4, "", h->name[id]);
        cg_emit_scalar(b, g, st, id, nm);
        cg_printf(b, ";\n");
        h->var[id] = h->name[id];
        return;
    }
    if (e->kind == IR_E_UNARY) {
        hoist(b, g, st, e->a, nra, h, ind, nm);
    } else if (e->kind == IR_E_BINARY || e->kind == IR_E_SELECT) {
        if (e->kind == IR_E_BINARY && e->op == IR_B_DIV && !expr_inner(st, e->b, nra)) {
            snprintf(h->rname[id], sizeof h->rname[id], "h%d", h->n++);
            cg_printf(b, "%*sconst float %s = 1.0f / ", ind * 4, "", h->rname[id]);
            cg_emit_scalar(b, g, st, e->b, nm);
            cg_printf(b, ";\n");
            h->recip[id] = h->rname[id];
            hoist(b, g, st, e->a, nra, h, ind, nm);
            return;
        }
        hoist(b, g, st, e->a, nra, h, ind, nm);
        hoist(b, g, st, e->b, nra, h, ind, nm);
    }
}

/* Streaming stores for a rows kernel whose output outgrows the last-level cache: the anchor
 * (a whole output row: softmax, layer_norm, rms_norm) writes a per-thread scratch row that
 * stays in L1/L2, and tlm_stream_row copies it out with non-temporal stores, so the output
 * is written without first being read (no read-for-ownership: a third less DRAM traffic).
 * The scratch row also keeps softmax's exp values, so they are computed once. Returns the
 * row's length, or 0 when the kernel keeps plain stores. */
static int64_t rows_stream_len(const cgc *c, bool vec)
{
    const ir_subgraph *g = c->g;
    const ir_stage *an = &g->stage[g->anchor];
    int nra = c->sp->n_rows_axes;
    if (!vec || an->reduce != IR_RED_NONE || an->n_spatial <= nra) return 0;
    int64_t n = 1;
    for (int i = nra; i < an->n_spatial; i++) n *= an->extent[i];
    int64_t out_bytes = output_bytes(c);
    int64_t llc = target_l3(c);
    if (out_bytes <= llc / 2 || n < 64 || n > (1 << 20)) return 0;
    return n;
}

/* tlm_stream_row: whole 64-byte lines only go out non-temporally; the partial lines at either
 * end take plain stores (a half line streamed while its other half is stored plainly, as
 * 8-float AVX2 streams did at row ends, costs a partial write to memory each time). */
static void emit_stream_helper(cg_buf *b)
{
    cg_line(b, 0, "#include <immintrin.h>");
    cg_line(b, 0, "#include <stdlib.h>");
    cg_line(b, 0, "static inline void tlm_stream_row(float *restrict dst, const float *restrict src, int64_t n)");
    cg_line(b, 0, "{");
    cg_line(b, 1, "int64_t i = 0;");
    cg_line(b, 1, "for (; i < n && ((uintptr_t)(dst + i) & 63); i++) dst[i] = src[i];");
    cg_line(b, 0, "#if defined(__AVX512F__)");
    cg_line(b, 1, "for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));");
    cg_line(b, 0, "#elif defined(__AVX__)");
    cg_line(b, 1, "for (; i + 16 <= n; i += 16) {");
    cg_line(b, 2, "_mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));");
    cg_line(b, 2, "_mm256_stream_ps(dst + i + 8, _mm256_loadu_ps(src + i + 8));");
    cg_line(b, 1, "}");
    cg_line(b, 0, "#endif");
    cg_line(b, 1, "for (; i < n; i++) dst[i] = src[i];");
    cg_line(b, 0, "}");
    cg_printf(b, "\n");
}

/* ---- vectorised rows kernels: softmax, layer_norm, rms_norm ----
 *
 * Memory-bound at DRAM sizes, so each row is read from memory once: the first pass over a row
 * (max, sum, sum of squares) reads it, the others find it in L1/L2, and the next row is
 * prefetched during the current row's last pass so that memory and arithmetic overlap. All
 * passes are explicit vectors (AVX-512 or AVX2+FMA, chosen by the compiler flags of the
 * target) with masked tails, so any row length runs at vector speed. An output past the
 * streaming threshold (output_streams) goes out with non-temporal stores (whole 64-byte
 * lines, from the first aligned one): no read-for-ownership of the output. Softmax computes
 * its exp values (one exp per element) into one of two per-thread rows, streamed out during
 * the next row's exp pass so the stores spread over the arithmetic (or into the output row
 * itself when it is not streamed); the norms stream from their last pass (tlm_norm_out). */
static const char rows_vec_common[] =
    "#if defined(__AVX512F__)\n"
    "#define TLM_VW 16\n"
    "typedef __m512 tlm_v;\n"
    "typedef __mmask16 tlm_m;\n"
    "static inline tlm_m tlm_vmask(int64_t n) { return (tlm_m)((1u << n) - 1u); }\n"
    "#define tlm_vset1 _mm512_set1_ps\n"
    "#define tlm_vload _mm512_loadu_ps\n"
    "#define tlm_vmload(p, m, fill) _mm512_mask_loadu_ps(_mm512_set1_ps(fill), (m), (p))\n"
    "#define tlm_vstore _mm512_storeu_ps\n"
    "#define tlm_vmstore(p, m, v) _mm512_mask_storeu_ps((p), (m), (v))\n"
    "#define tlm_vstream _mm512_stream_ps\n"
    "#define tlm_vadd _mm512_add_ps\n"
    "#define tlm_vsub _mm512_sub_ps\n"
    "#define tlm_vmul _mm512_mul_ps\n"
    "#define tlm_vmax _mm512_max_ps\n"
    "#define tlm_vmin _mm512_min_ps\n"
    "#define tlm_vfmadd _mm512_fmadd_ps\n"
    "#define tlm_vfnmadd _mm512_fnmadd_ps\n"
    "#define tlm_vhadd _mm512_reduce_add_ps\n"
    "#define tlm_vmaskz(k, v) _mm512_maskz_mov_ps((k), (v))\n"
    "#define tlm_vhmax _mm512_reduce_max_ps\n"

    "#define tlm_vshl23(v) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(v), 23))\n"
    "#elif defined(__AVX2__) && defined(__FMA__)\n"
    "#define TLM_VW 8\n"
    "typedef __m256 tlm_v;\n"
    "typedef __m256i tlm_m;\n"
    "static inline tlm_m tlm_vmask(int64_t n)\n"
    "{\n"
    "    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));\n"
    "}\n"
    "#define tlm_vset1 _mm256_set1_ps\n"
    "#define tlm_vload _mm256_loadu_ps\n"
    "#define tlm_vmload(p, m, fill) _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps((p), (m)), _mm256_castsi256_ps(m))\n"
    "#define tlm_vstore _mm256_storeu_ps\n"
    "#define tlm_vmstore(p, m, v) _mm256_maskstore_ps((p), (m), (v))\n"
    "#define tlm_vstream _mm256_stream_ps\n"
    "#define tlm_vadd _mm256_add_ps\n"
    "#define tlm_vsub _mm256_sub_ps\n"
    "#define tlm_vmul _mm256_mul_ps\n"
    "#define tlm_vmax _mm256_max_ps\n"
    "#define tlm_vmin _mm256_min_ps\n"
    "#define tlm_vfmadd _mm256_fmadd_ps\n"
    "#define tlm_vfnmadd _mm256_fnmadd_ps\n"
    "#define tlm_vmaskz(k, v) _mm256_and_ps((v), _mm256_castsi256_ps(k))\n"
    "static inline float tlm_vhadd(tlm_v v)\n"
    "{\n"
    "    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));\n"
    "    s = _mm_add_ps(s, _mm_movehl_ps(s, s));\n"
    "    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));\n"
    "}\n"
    "static inline float tlm_vhmax(tlm_v v)\n"
    "{\n"
    "    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));\n"
    "    s = _mm_max_ps(s, _mm_movehl_ps(s, s));\n"
    "    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));\n"
    "}\n"
    "#define tlm_vshl23(v) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(v), 23))\n"

    "#else\n"
    "#error \"tlm rows kernel: needs AVX2+FMA or AVX-512F\"\n"
    "#endif\n"
    "/* exp(x) for x <= 0 (softmax's x - max), lane-wise, in 8 FMA-unit operations (the exp\n"
    " * pass is compute-bound even at DRAM sizes on two cores): x = n ln2 + r with one ln2\n"
    " * constant, |r| <= ln2 / 2, e^r by a degree-5 minimax polynomial (relative error 9e-8),\n"
    " * 2^n from the rounding constant's low bits (n + 127). Relative error at most 1.8e-7 for\n"
    " * x > -10 and 3.9e-7 down to -87 (the single constant's error grows with n), against\n"
    " * 1.2e-7 for tlm_expf's Cody-Waite pair and Taylor polynomial, which took 10: a 4096-row\n"
    " * exp pass 0.187 -> 0.150 ns per element (Zen 4, one thread, L1). The upper clamp never\n"
    " * applies; the lower one keeps n + 127 > 0 (a masked logit, -inf, gives 1e-38, not NaN) */\n"
    "static inline tlm_v tlm_vexp_neg(tlm_v x)\n"
    "{\n"
    "    x = tlm_vmax(tlm_vset1(-87.3f), x); /* a NaN stays */\n"
    "    const tlm_v big = tlm_vset1(12583039.0f); /* 1.5 * 2^23 + 127 */\n"
    "    const tlm_v tb = tlm_vfmadd(x, tlm_vset1(1.44269504088896341f), big);\n"
    "    const tlm_v n = tlm_vsub(tb, big);\n"
    "    const tlm_v r = tlm_vfnmadd(n, tlm_vset1(0.693147180559945f), x);\n"
    "    tlm_v p = tlm_vfmadd(r, tlm_vset1(0.008290314115583897f), tlm_vset1(0.04189793020486832f));\n"
    "    p = tlm_vfmadd(p, r, tlm_vset1(0.1666763573884964f));\n"
    "    p = tlm_vfmadd(p, r, tlm_vset1(0.4999915063381195f));\n"
    "    p = tlm_vfmadd(p, r, tlm_vset1(0.9999997019767761f));\n"
    "    p = tlm_vfmadd(p, r, tlm_vset1(1.0f));\n"
    "    return tlm_vmul(p, tlm_vshl23(tb));\n"
    "}\n"
    "\n"
    "/* vectorised rows kernels (softmax, layer_norm, rms_norm): a row is read from memory once;\n"
    " * the next row is prefetched while this one is computed; softmax's streamed output row goes\n"
    " * out from a per-thread buffer with non-temporal stores during the next row's exp pass */\n"
    "typedef struct {\n"
    "    float *y;          /* the row streamed out (NULL: none) */\n"
    "    const float *src;  /* its values, times scale */\n"
    "    int64_t j, n;\n"
    "    tlm_v scale;\n"
    "    const char *pf;    /* the next input row, prefetched (NULL: none) */\n"
    "    int64_t pfi, pfn;\n"
    "} tlm_out;\n"
    "\n"
    "static inline void tlm_out_begin(tlm_out *o, float *y, const float *src, int64_t n, float scale,\n"
    "                                 const float *pf, int64_t pfn)\n"
    "{\n"
    "    o->y = y;\n"
    "    o->src = src;\n"
    "    o->n = y ? n : 0;\n"
    "    o->scale = tlm_vset1(scale);\n"
    "    o->pf = (const char *)pf;\n"
    "    o->pfi = 0;\n"
    "    o->pfn = pf ? pfn * 4 : 0;\n"
    "    /* plain stores up to the first 64-byte boundary of y; aligned streams after it */\n"
    "    int64_t h = y ? (int64_t)((64 - ((uintptr_t)y & 63)) & 63) / 4 : 0, j = 0;\n"
    "    if (h > o->n) h = o->n;\n"
    "    for (; j + TLM_VW <= h; j += TLM_VW) tlm_vstore(y + j, tlm_vmul(tlm_vload(src + j), o->scale));\n"
    "    if (j < h) {\n"
    "        tlm_m k = tlm_vmask(h - j);\n"
    "        tlm_vmstore(y + j, k, tlm_vmul(tlm_vmload(src + j, k, 0.0f), o->scale));\n"
    "    }\n"
    "    o->j = h;\n"
    "}\n"
    "\n"
    "/* beside two vectors of the current row: as many floats out, whole 64-byte lines only (a line\n"
    " * half written with non-temporal stores and then with plain ones is flushed twice, slowly), and\n"
    " * as many bytes of the next row prefetched */\n"
    "static inline void tlm_out_step(tlm_out *o)\n"
    "{\n"
    "    for (int k = 0; k < 2 * TLM_VW; k += 16)\n"
    "        if (o->j + 16 <= o->n) {\n"
    "            for (int v = 0; v < 16; v += TLM_VW)\n"
    "                tlm_vstream(o->y + o->j + v, tlm_vmul(tlm_vload(o->src + o->j + v), o->scale));\n"
    "            o->j += 16;\n"
    "        }\n"
    "    for (int k = 0; k < 2 * TLM_VW * 4; k += 64)\n"
    "        if (o->pfi < o->pfn) {\n"
    "            _mm_prefetch(o->pf + o->pfi, TLM_PF_HINT);\n"
    "            o->pfi += 64;\n"
    "        }\n"
    "}\n"
    "\n"
    "static inline void tlm_out_finish(tlm_out *o)\n"
    "{\n"
    "    for (; o->j + 16 <= o->n; o->j += 16)\n"
    "        for (int v = 0; v < 16; v += TLM_VW)\n"
    "            tlm_vstream(o->y + o->j + v, tlm_vmul(tlm_vload(o->src + o->j + v), o->scale));\n"
    "    for (; o->j + TLM_VW <= o->n; o->j += TLM_VW)\n"
    "        tlm_vstore(o->y + o->j, tlm_vmul(tlm_vload(o->src + o->j), o->scale));\n"
    "    if (o->j < o->n) {\n"
    "        tlm_m k = tlm_vmask(o->n - o->j);\n"
    "        tlm_vmstore(o->y + o->j, k, tlm_vmul(tlm_vmload(o->src + o->j, k, 0.0f), o->scale));\n"
    "        o->j = o->n;\n"
    "    }\n"
    "    for (; o->pfi < o->pfn; o->pfi += 64) _mm_prefetch(o->pf + o->pfi, TLM_PF_HINT);\n"
    "}\n";

static const char rows_vec_softmax[] =
    "/* t = exp(x - max(x)) (t: the output row itself, or the stream buffer); returns 1 / sum(t) */\n"
    "static inline float tlm_softmax_row(const float *restrict x, float *restrict t, int64_t C, tlm_out *o)\n"
    "{\n"
    "    int64_t i;\n"
    "    tlm_v m0 = tlm_vset1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;\n"
    "    for (i = 0; i + 4 * TLM_VW <= C; i += 4 * TLM_VW) {\n"
    "        m0 = tlm_vmax(m0, tlm_vload(x + i));\n"
    "        m1 = tlm_vmax(m1, tlm_vload(x + i + TLM_VW));\n"
    "        m2 = tlm_vmax(m2, tlm_vload(x + i + 2 * TLM_VW));\n"
    "        m3 = tlm_vmax(m3, tlm_vload(x + i + 3 * TLM_VW));\n"
    "    }\n"
    "    for (; i + TLM_VW <= C; i += TLM_VW) m0 = tlm_vmax(m0, tlm_vload(x + i));\n"
    "    if (i < C) m1 = tlm_vmax(m1, tlm_vmload(x + i, tlm_vmask(C - i), -INFINITY));\n"
    "    const tlm_v vm = tlm_vset1(tlm_vhmax(tlm_vmax(tlm_vmax(m0, m1), tlm_vmax(m2, m3))));\n"
    "    tlm_v s0 = tlm_vset1(0.0f), s1 = s0;\n"
    "    for (i = 0; i + 2 * TLM_VW <= C; i += 2 * TLM_VW) {\n"
    "        tlm_out_step(o);\n"
    "        tlm_v e0 = tlm_vexp_neg(tlm_vsub(tlm_vload(x + i), vm));\n"
    "        tlm_v e1 = tlm_vexp_neg(tlm_vsub(tlm_vload(x + i + TLM_VW), vm));\n"
    "        tlm_vstore(t + i, e0);\n"
    "        tlm_vstore(t + i + TLM_VW, e1);\n"
    "        s0 = tlm_vadd(s0, e0);\n"
    "        s1 = tlm_vadd(s1, e1);\n"
    "    }\n"
    "    for (; i < C; i += TLM_VW) {\n"
    "        tlm_m k = tlm_vmask(C - i < TLM_VW ? C - i : TLM_VW);\n"
    "        tlm_v e = tlm_vmaskz(k, tlm_vexp_neg(tlm_vsub(tlm_vmload(x + i, k, 0.0f), vm)));\n"
    "        tlm_vmstore(t + i, k, e);\n"
    "        s0 = tlm_vadd(s0, e);\n"
    "    }\n"
    "    tlm_out_finish(o);\n"
    "    return 1.0f / tlm_vhadd(tlm_vadd(s0, s1));\n"
    "}\n"
    "\n"
    "/* t *= s over the row (softmax's output row when it does not stream) */\n"
    "static inline void tlm_scale_row(float *restrict t, int64_t C, float s)\n"
    "{\n"
    "    const tlm_v v = tlm_vset1(s);\n"
    "    int64_t i;\n"
    "    for (i = 0; i + TLM_VW <= C; i += TLM_VW) tlm_vstore(t + i, tlm_vmul(tlm_vload(t + i), v));\n"
    "    if (i < C) {\n"
    "        tlm_m k = tlm_vmask(C - i);\n"
    "        tlm_vmstore(t + i, k, tlm_vmul(tlm_vmload(t + i, k, 0.0f), v));\n"
    "    }\n"
    "}\n";

/* The norms' last pass (layer_norm, rms_norm), emitted before their row functions. */
static const char rows_vec_norm_out[] =
    "/* a norm's value at x + i: (x - m) * s * g + b; rms_norm's with m = 0 and no b */\n"
    "static inline tlm_v tlm_norm_v(const float *x, const float *g, const float *b, int64_t i, tlm_v m, tlm_v s)\n"
    "{\n"
    "    const tlm_v v = tlm_vmul(tlm_vsub(tlm_vload(x + i), m), s);\n"
    "    return b ? tlm_vfmadd(v, tlm_vload(g + i), tlm_vload(b + i)) : tlm_vmul(v, tlm_vload(g + i));\n"
    "}\n"
    "static inline tlm_v tlm_norm_vm(const float *x, const float *g, const float *b, int64_t i, tlm_m k, tlm_v m,\n"
    "                                tlm_v s)\n"
    "{\n"
    "    const tlm_v v = tlm_vmul(tlm_vsub(tlm_vmload(x + i, k, 0.0f), m), s);\n"
    "    return b ? tlm_vfmadd(v, tlm_vmload(g + i, k, 0.0f), tlm_vmload(b + i, k, 0.0f))\n"
    "             : tlm_vmul(v, tlm_vmload(g + i, k, 0.0f));\n"
    "}\n"
    "\n"
    "/* a row's sums (sq 1: of squares into a0..a3, rms_norm; sq 2: of d = x - sh into a0 + a1\n"
    " * and of d * d into a2..a5, layer_norm's moments in one pass), resumable: whole chunks of\n"
    " * four vectors from the row's start, in order, then the tail, so a sum taken piece by piece\n"
    " * beside the previous row's last pass (tlm_norm_out) is bit for bit the one taken in one\n"
    " * go. A square a chunk into each of four accumulators: two FMAs in a row into one (their\n"
    " * latency, 8 cycles a chunk) bounded a 16384 x 4096 layer_norm's sum pass from L2 (Xeon,\n"
    " * 2 threads, alternated: AVX2 18.6 -> 17.5 ms) */\n"
    "typedef struct {\n"
    "    tlm_v a0, a1, a2, a3, a4, a5, sh;\n"
    "    float shf; /* sh's value: a tail's missing lanes, so that d is 0 there */\n"
    "    int64_t i;\n"
    "} tlm_rsum;\n"
    "static inline void tlm_rsum_init(tlm_rsum *s, float sh)\n"
    "{\n"
    "    s->a0 = s->a1 = s->a2 = s->a3 = s->a4 = s->a5 = tlm_vset1(0.0f);\n"
    "    s->sh = tlm_vset1(sh);\n"
    "    s->shf = sh;\n"
    "    s->i = 0;\n"
    "}\n"
    "/* one chunk of four vectors at x into the accumulators (in registers once inlined) */\n"
    "static inline void tlm_rsum_chunk(tlm_v *a0, tlm_v *a1, tlm_v *a2, tlm_v *a3, tlm_v *a4,\n"
    "                                  tlm_v *a5, const float *x, int sq, tlm_v sh)\n"
    "{\n"
    "    const tlm_v v0 = tlm_vload(x), v1 = tlm_vload(x + TLM_VW);\n"
    "    const tlm_v v2 = tlm_vload(x + 2 * TLM_VW), v3 = tlm_vload(x + 3 * TLM_VW);\n"
    "    if (sq == 2) {\n"
    "        const tlm_v d0 = tlm_vsub(v0, sh), d1 = tlm_vsub(v1, sh);\n"
    "        const tlm_v d2 = tlm_vsub(v2, sh), d3 = tlm_vsub(v3, sh);\n"
    "        *a0 = tlm_vadd(*a0, tlm_vadd(d0, d2));\n"
    "        *a1 = tlm_vadd(*a1, tlm_vadd(d1, d3));\n"
    "        *a2 = tlm_vfmadd(d0, d0, *a2), *a3 = tlm_vfmadd(d1, d1, *a3);\n"
    "        *a4 = tlm_vfmadd(d2, d2, *a4), *a5 = tlm_vfmadd(d3, d3, *a5);\n"
    "    } else {\n"
    "        *a0 = tlm_vfmadd(v0, v0, *a0), *a1 = tlm_vfmadd(v1, v1, *a1);\n"
    "        *a2 = tlm_vfmadd(v2, v2, *a2), *a3 = tlm_vfmadd(v3, v3, *a3);\n"
    "    }\n"
    "}\n"
    "static inline void tlm_rsum_step(tlm_rsum *s, const float *x, int64_t upto, int sq)\n"
    "{\n"
    "    /* in registers, not in *s */\n"
    "    tlm_v a0 = s->a0, a1 = s->a1, a2 = s->a2, a3 = s->a3, a4 = s->a4, a5 = s->a5;\n"
    "    int64_t i = s->i;\n"
    "    for (; i + 4 * TLM_VW <= upto; i += 4 * TLM_VW)\n"
    "        tlm_rsum_chunk(&a0, &a1, &a2, &a3, &a4, &a5, x + i, sq, s->sh);\n"
    "    s->a0 = a0, s->a1 = a1, s->a2 = a2, s->a3 = a3, s->a4 = a4, s->a5 = a5;\n"
    "    s->i = i;\n"
    "}\n"
    "/* one vector v into a (v * v; with sq 2: d = v - sh into a, d * d into q) */\n"
    "static inline void tlm_rsum_one(tlm_v *a, tlm_v *q, tlm_v v, int sq, tlm_v sh)\n"
    "{\n"
    "    if (sq == 2) {\n"
    "        const tlm_v d = tlm_vsub(v, sh);\n"
    "        *a = tlm_vadd(*a, d);\n"
    "        *q = tlm_vfmadd(d, d, *q);\n"
    "    } else {\n"
    "        *a = tlm_vfmadd(v, v, *a);\n"
    "    }\n"
    "}\n"
    "/* the row's sum of squares; with sq 2 the sum of d, and that of d * d in *s2 */\n"
    "static inline float tlm_rsum_finish(tlm_rsum *s, const float *x, int64_t C, int sq,\n"
    "                                    float *s2)\n"
    "{\n"
    "    tlm_rsum_step(s, x, C, sq);\n"
    "    int64_t i = s->i;\n"
    "    for (; i + TLM_VW <= C; i += TLM_VW)\n"
    "        tlm_rsum_one(&s->a0, &s->a2, tlm_vload(x + i), sq, s->sh);\n"
    "    if (i < C) {\n"
    "        const tlm_v v = tlm_vmload(x + i, tlm_vmask(C - i), s->shf);\n"
    "        tlm_rsum_one(&s->a1, &s->a3, v, sq, s->sh);\n"
    "    }\n"
    "    if (sq != 2) return tlm_vhadd(tlm_vadd(tlm_vadd(s->a0, s->a1), tlm_vadd(s->a2, s->a3)));\n"
    "    *s2 = tlm_vhadd(tlm_vadd(tlm_vadd(s->a2, s->a3), tlm_vadd(s->a4, s->a5)));\n"
    "    return tlm_vhadd(tlm_vadd(s->a0, s->a1));\n"
    "}\n"
    "/* a row whose sums were taken beside the row before it (x == NULL: none; cy NULL: never):\n"
    " * sum (rms_norm: of squares; layer_norm: of x - sh) and sum2 (layer_norm: of (x - sh)^2) */\n"
    "typedef struct {\n"
    "    const float *x;\n"
    "    float sum, sum2, sh;\n"
    "} tlm_carry;\n"
    "/* rms_norm's sum of squares, in its own pass or carried */\n"
    "static inline float tlm_row_sumsq(const tlm_carry *cy, const float *x, int64_t C)\n"
    "{\n"
    "    if (cy && cy->x == x) return cy->sum;\n"
    "    tlm_rsum a;\n"
    "    tlm_rsum_init(&a, 0.0f);\n"
    "    return tlm_rsum_finish(&a, x, C, 1, NULL);\n"
    "}\n"
    "/* layer_norm's shift: the mean of the row's first vector, near the row's mean wherever the\n"
    " * row sits, so the one-pass variance E[d^2] - E[d]^2 of d = x - sh does not cancel as\n"
    " * E[x^2] - E[x]^2 does on rows far from 0 */\n"
    "static inline float tlm_row_shift(const float *x, int64_t C)\n"
    "{\n"
    "    const int64_t n = C < TLM_VW ? C : TLM_VW;\n"
    "    const tlm_v v = n == TLM_VW ? tlm_vload(x) : tlm_vmload(x, tlm_vmask(n), 0.0f);\n"
    "    return tlm_vhadd(v) * (1.0f / (float)n);\n"
    "}\n"
    "/* a row's mean and variance from its shifted sums, in one pass or carried */\n"
    "static inline void tlm_row_moments(const tlm_carry *cy, const float *x, int64_t C,\n"
    "                                   float *mean, float *var)\n"
    "{\n"
    "    float s1, s2, sh;\n"
    "    if (cy && cy->x == x) {\n"
    "        s1 = cy->sum, s2 = cy->sum2, sh = cy->sh;\n"
    "    } else {\n"
    "        tlm_rsum a;\n"
    "        sh = tlm_row_shift(x, C);\n"
    "        tlm_rsum_init(&a, sh);\n"
    "        s1 = tlm_rsum_finish(&a, x, C, 2, &s2);\n"
    "    }\n"
    "    const float d = s1 * (float)(1.0 / (double)C);\n"
    "    const float v = s2 * (float)(1.0 / (double)C) - d * d;\n"
    "    *mean = sh + d;\n"
    "    *var = v > 0.0f ? v : 0.0f;\n"
    "}\n"
    "\n"
    "/* a norm's last pass, straight into the output row y; beside it, the next input row pf is\n"
    " * prefetched or, given ns, summed (as tlm_rsum) into ns, the rows after it prefetched\n"
    " * TLM_PF_AHEAD floats ahead. Streamed (nt), y's whole 64-byte lines go out with\n"
    " * non-temporal stores as they are computed and the partial lines at either end with plain\n"
    " * ones: on a 16384 x 4096 layer_norm (Zen 4, 2 threads) 14.1 ms against 16.6 through a\n"
    " * scratch row streamed out during the next row, a streaming copy of the same bytes 12.6\n"
    " * (softmax keeps that scratch row, where the deferred stream overlaps the exp pass: 3.7 ms\n"
    " * against 4.5 streamed directly). Where the rows stream (DRAM-sized) on AMD, the next\n"
    " * row's sum is taken here, its loads beside this row's stores, instead of in a pass of its\n"
    " * own (Zen 5, 2 threads, old / new alternated: the same layer_norm 11.07 -> 10.49 ms, a\n"
    " * streaming copy 9.1; 4096 x 1027 1.03-1.12x; rms_norm 1.02x); on Intel the pass of its\n"
    " * own is the faster (the generator's norm_sums_beside); in the caches it costs more than\n"
    " * it saves (rms_norm 512 x 4096 0.84-0.94x, layer_norm 197 x 768 0.93-0.95x) */\n"
    "static inline void tlm_norm_out(float *restrict y, const float *restrict x, const float *restrict g,\n"
    "                                const float *restrict b, int64_t C, tlm_v m, tlm_v s, const float *pf, int nt,\n"
    "                                tlm_rsum *ns, int sq)\n"
    "{\n"
    "    int64_t i = 0;\n"
    "    if (nt) { /* plain stores up to y's first line boundary */\n"
    "        int64_t h = (int64_t)((64 - ((uintptr_t)y & 63)) & 63) / 4;\n"
    "        if (h > C) h = C;\n"
    "        for (; i < h; i += TLM_VW) {\n"
    "            tlm_m k = tlm_vmask(h - i < TLM_VW ? h - i : TLM_VW);\n"
    "            tlm_vmstore(y + i, k, tlm_norm_vm(x, g, b, i, k, m, s));\n"
    "        }\n"
    "        i = h;\n"
    "    }\n"
    "    if (pf && ns) { /* four vectors out, the next row's next chunk of four summed */\n"
    "        tlm_v a0 = ns->a0, a1 = ns->a1, a2 = ns->a2, a3 = ns->a3, a4 = ns->a4, a5 = ns->a5;\n"
    "        int64_t k = ns->i;\n"
    "        for (; i + 4 * TLM_VW <= C; i += 4 * TLM_VW, k += 4 * TLM_VW) {\n"
    "            for (int p = 0; p < 16 * TLM_VW; p += 64)\n"
    "                _mm_prefetch((const char *)(pf + k + TLM_PF_AHEAD) + p, TLM_PF_HINT);\n"
    "            tlm_rsum_chunk(&a0, &a1, &a2, &a3, &a4, &a5, pf + k, sq, ns->sh);\n"
    "            tlm_v v[4];\n"
    "            for (int u = 0; u < 4; u++) v[u] = tlm_norm_v(x, g, b, i + u * TLM_VW, m, s);\n"
    "            for (int u = 0; u < 4; u++) {\n"
    "                if (nt) tlm_vstream(y + i + u * TLM_VW, v[u]);\n"
    "                else tlm_vstore(y + i + u * TLM_VW, v[u]);\n"
    "            }\n"
    "        }\n"
    "        ns->a0 = a0, ns->a1 = a1, ns->a2 = a2, ns->a3 = a3, ns->a4 = a4, ns->a5 = a5;\n"
    "        ns->i = k;\n"
    "    }\n"
    "    for (; i + 2 * TLM_VW <= C; i += 2 * TLM_VW) { /* whole lines when streamed */\n"
    "        if (pf && !ns)\n"
    "            for (int p = 0; p < 8 * TLM_VW; p += 64) _mm_prefetch((const char *)(pf + i) + p, TLM_PF_HINT);\n"
    "        const tlm_v v0 = tlm_norm_v(x, g, b, i, m, s), v1 = tlm_norm_v(x, g, b, i + TLM_VW, m, s);\n"
    "        if (nt) {\n"
    "            tlm_vstream(y + i, v0);\n"
    "            tlm_vstream(y + i + TLM_VW, v1);\n"
    "        } else {\n"
    "            tlm_vstore(y + i, v0);\n"
    "            tlm_vstore(y + i + TLM_VW, v1);\n"
    "        }\n"
    "    }\n"
    "    for (; i < C; i += TLM_VW) {\n"
    "        tlm_m k = tlm_vmask(C - i < TLM_VW ? C - i : TLM_VW);\n"
    "        tlm_vmstore(y + i, k, tlm_norm_vm(x, g, b, i, k, m, s));\n"
    "    }\n"
    "}\n";

static const char rows_vec_layer_norm[] =
    "/* y = (x - mean) / sqrt(var + eps) * g + b over the row, the moments in one pass (shifted:\n"
    " * tlm_row_shift) where two passes, a sum then the squares about the mean, took a third\n"
    " * more instructions: a 16384 x 4096 layer_norm from DRAM 1.05-1.08x on AVX2, 1.01-1.04x\n"
    " * on AVX-512 (Xeon, 2 threads, alternated; 197 x 768 in cache 1.08x on AVX-512, 1.00x on\n"
    " * AVX2); the next row pf's sums taken beside the output, into *cy (NULL: in their own\n"
    " * pass) */\n"
    "static inline void tlm_layer_norm_row(const float *restrict x, float *restrict y, const float *restrict g,\n"
    "                                      const float *restrict b, int64_t C, float eps, const float *pf, int nt,\n"
    "                                      tlm_carry *cy)\n"
    "{\n"
    "    float mean, var;\n"
    "    tlm_row_moments(cy, x, C, &mean, &var);\n"
    "    const float nsh = cy && pf ? tlm_row_shift(pf, C) : 0.0f;\n"
    "    tlm_rsum n;\n"
    "    tlm_rsum_init(&n, nsh);\n"
    "    tlm_norm_out(y, x, g, b, C, tlm_vset1(mean), tlm_vset1(1.0f / sqrtf(var + eps)), pf, nt,\n"
    "                 cy ? &n : NULL, 2);\n"
    "    if (!cy) return;\n"
    "    cy->x = pf;\n"
    "    cy->sh = nsh;\n"
    "    if (pf) cy->sum = tlm_rsum_finish(&n, pf, C, 2, &cy->sum2);\n"
    "}\n";

static const char rows_vec_rms_norm[] =
    "/* y = x / sqrt(mean(x^2) + eps) * w over the row; the next row pf's sum of squares taken\n"
    " * beside the output, into *cy (NULL: in its own pass) */\n"
    "static inline void tlm_rms_norm_row(const float *restrict x, float *restrict y, const float *restrict w,\n"
    "                                    int64_t C, float eps, const float *pf, int nt, tlm_carry *cy)\n"
    "{\n"
    "    const float ms = tlm_row_sumsq(cy, x, C) * (float)(1.0 / (double)C);\n"
    "    tlm_rsum n;\n"
    "    tlm_rsum_init(&n, 0.0f);\n"
    "    tlm_norm_out(y, x, w, NULL, C, tlm_vset1(0.0f), tlm_vset1(1.0f / sqrtf(ms + eps)), pf, nt,\n"
    "                 cy ? &n : NULL, 1);\n"
    "    if (!cy) return;\n"
    "    cy->x = pf;\n"
    "    if (pf) cy->sum = tlm_rsum_finish(&n, pf, C, 1, NULL);\n"
    "}\n";

static const char rows_vec_reduce[] =
    "/* the sum (max) of a row, four accumulators. A NaN anywhere makes the max NaN, as in the\n"
    " * reference: the max pass also sums the row (one add a vector, off the max chains; a\n"
    " * NaN-keeping max on them was 5-9 % slower, a NaN compare on each vector 10-13 %), and a\n"
    " * NaN sum (a NaN, or inf - inf) sends the row through a scalar check. One pass: the\n"
    " * hardware prefetcher streams the rows, and prefetching the next row beside it only costs\n"
    " * (8192 x 1531 on Zen 4: 1.22 -> 1.02 ms without) */\n"
    "static inline float tlm_reduce_row(const float *restrict x, int64_t C, int is_max)\n"
    "{\n"
    "    const float id = is_max ? -INFINITY : 0.0f;\n"
    "    tlm_v a0 = tlm_vset1(id), a1 = a0, a2 = a0, a3 = a0, u = tlm_vset1(0.0f);\n"
    "    int64_t i;\n"
    "    for (i = 0; i + 4 * TLM_VW <= C; i += 4 * TLM_VW) {\n"
    "        if (is_max) {\n"
    "            const tlm_v v0 = tlm_vload(x + i), v1 = tlm_vload(x + i + TLM_VW);\n"
    "            const tlm_v v2 = tlm_vload(x + i + 2 * TLM_VW), v3 = tlm_vload(x + i + 3 * TLM_VW);\n"
    "            a0 = tlm_vmax(a0, v0);\n"
    "            a1 = tlm_vmax(a1, v1);\n"
    "            a2 = tlm_vmax(a2, v2);\n"
    "            a3 = tlm_vmax(a3, v3);\n"
    "            u = tlm_vadd(u, tlm_vadd(tlm_vadd(v0, v1), tlm_vadd(v2, v3)));\n"
    "        } else {\n"
    "            a0 = tlm_vadd(a0, tlm_vload(x + i));\n"
    "            a1 = tlm_vadd(a1, tlm_vload(x + i + TLM_VW));\n"
    "            a2 = tlm_vadd(a2, tlm_vload(x + i + 2 * TLM_VW));\n"
    "            a3 = tlm_vadd(a3, tlm_vload(x + i + 3 * TLM_VW));\n"
    "        }\n"
    "    }\n"
    "    for (; i < C; i += TLM_VW) {\n"
    "        tlm_v v = tlm_vmload(x + i, tlm_vmask(C - i < TLM_VW ? C - i : TLM_VW), id);\n"
    "        if (is_max) {\n"
    "            a0 = tlm_vmax(a0, v);\n"
    "            u = tlm_vadd(u, v);\n"
    "        } else {\n"
    "            a0 = tlm_vadd(a0, v);\n"
    "        }\n"
    "    }\n"
    "    if (is_max) {\n"
    "        const float s = tlm_vhadd(u);\n"
    "        if (s != s)\n"
    "            for (i = 0; i < C; i++)\n"
    "                if (x[i] != x[i]) return x[i];\n"
    "        return tlm_vhmax(tlm_vmax(tlm_vmax(a0, a1), tlm_vmax(a2, a3)));\n"
    "    }\n"
    "    return tlm_vhadd(tlm_vadd(tlm_vadd(a0, a1), tlm_vadd(a2, a3)));\n"
    "}\n";

typedef enum { RV_NONE, RV_SOFTMAX, RV_LAYER_NORM, RV_RMS_NORM, RV_REDUCE } rows_vec_op;

static int tensor_named(const ir_subgraph *g, const char *name)
{
    for (int t = 0; t < g->n_tensor; t++)
        if (!strcmp(g->tensor[t].name, name)) return t;
    return -1;
}

/* Which vectorised rows kernel computes this subgraph exactly (RV_NONE: the generic rows
 * code): the op alone (no epilogue), over one row axis of a row-major X, on a target with
 * AVX2+FMA. */
static rows_vec_op rows_vec_kind(const cgc *c, bool vec)
{
    const ir_subgraph *g = c->g;
    const ir_stage *an = &g->stage[g->anchor];
    uint32_t isa = c->sp->tgt.cpu.isa;
    if (!vec || c->sp->n_rows_axes != 1 || g->n_stage != g->anchor + 1 ||
        an->n_spatial + an->n_reduce != 2 || an->extent[0] != c->sp->rows)
        return RV_NONE;
    if (!(isa & TARGET_ISA_AVX512F) && !((isa & TARGET_ISA_AVX2) && (isa & TARGET_ISA_FMA)))
        return RV_NONE;
    int x = tensor_named(g, "X");
    if (x < 0 || g->tensor[x].ndim != 2 || g->tensor[x].shape[0] != an->extent[0] ||
        g->tensor[x].shape[1] != an->extent[1])
        return RV_NONE;
    if (an->n_reduce == 1) {
        bool red = g->wl.op == IR_OP_REDUCE_SUM || g->wl.op == IR_OP_REDUCE_MEAN ||
                   g->wl.op == IR_OP_REDUCE_MAX;
        return red && g->n_stage == 1 && g->tensor[g->output].ndim == 1 ? RV_REDUCE : RV_NONE;
    }
    if (g->tensor[g->output].ndim != 2) return RV_NONE;
    switch (g->wl.op) {
    case IR_OP_SOFTMAX:
        return g->n_stage == 3 ? RV_SOFTMAX : RV_NONE;
    case IR_OP_LAYER_NORM:
        return g->n_stage == 3 && tensor_named(g, "gamma") >= 0 && tensor_named(g, "beta") >= 0
                   ? RV_LAYER_NORM
                   : RV_NONE;
    case IR_OP_RMS_NORM:
        return g->n_stage == 2 && tensor_named(g, "weight") >= 0 ? RV_RMS_NORM : RV_NONE;
    default:
        return RV_NONE;
    }
}

/* Whether a reduction stage's axes can run as one loop: two or more of them, every load
 * walking them as one strided run (each axis's coefficient the next one's times its extent:
 * an NCHW global pool's H x W plane) and no select testing them. One loop of H x W points
 * vectorises whole where a loop per row (56 points: 3.5 vectors) ends each row in a tail and
 * a horizontal sum: EfficientNet-B0's squeeze pool over 144 x 56 x 56, alternated alone,
 * 0.0587 -> 0.0118 ms. */
static bool reduce_axes_flatten(const ir_subgraph *g, const ir_stage *st)
{
    const int r0 = st->n_spatial, r1 = st->n_spatial + st->n_reduce;
    if (st->n_reduce < 2) return false;
    for (int id = 0; id < st->n_expr; id++) {
        const ir_expr *e = &st->expr[id];
        if (e->kind == IR_E_SELECT) return false;
        if (e->kind != IR_E_LOAD) continue;
        for (int a = r0; a + 1 < r1; a++)
            if (flat_coef(g, e, a) != flat_coef(g, e, a + 1) * st->extent[a + 1]) return false;
    }
    return true;
}

/* Whether a streamed (DRAM-sized) norm takes the next row's sums beside this row's output
 * (tlm_norm_out's ns) rather than in a pass of their own from L2 before the row's output. On
 * a Zen 5 beside: a 16384 x 4096 layer_norm 11.07 -> 10.49 ms (2 threads, alternated); on
 * a Zen 4 the same from DRAM beside 1.07-1.10x faster on AVX2, 0.96-0.98x on AVX-512. On
 * a Xeon (family 6 model 167, 2 threads, alternated, bench/ab_kernels) the pass of its own,
 * with the squares in four accumulators: AVX-512 18.6-19.0 -> 17.0 ms, AVX2 20.3 -> 18.0 (a
 * streaming copy of the same bytes 13.0-13.9 in runs beside); there every load beside the
 * non-temporal stores that misses L1 waits for a fill buffer the stores hold (hand-edited:
 * the next row requested into L1 during the output 16.3 -> 18.2 ms, into L2 during the sum
 * pass 18.1-18.8). So beside on AMD only; the generic targets, whose hosts are unknown, take
 * the pass of its own, the larger of the two gains */
static bool norm_sums_beside(const cgc *c)
{
    return target_vendor_amd(c->sp->tgt.cpu.vendor);
}

static int gen_rows_vec(cgc *c, const char *entry, rows_vec_op op)
{
    cg_buf *b = &c->b;
    const ir_subgraph *g = c->g;
    const space *sp = c->sp;
    int64_t rb = space_get(sp, c->s, SLOT_ROWS, 1);
    bool par = space_get(sp, c->s, SLOT_PARALLEL, 0) != 0;
    const ir_stage *an = &g->stage[g->anchor];
    long long R = (long long)an->extent[0], C = (long long)an->extent[1];
    long long CP = (C + 15) / 16 * 16; /* a scratch row, whole 64-byte lines */
    bool stream = op != RV_REDUCE && output_streams(c);
    /* softmax streams out of a scratch row (its exp values), the norms straight from their
     * last pass (tlm_norm_out) */
    bool scratch = stream && op == RV_SOFTMAX;
    /* the rows a row's passes touch: in L1, prefetch into it; else into L2 */
    int64_t foot = (scratch ? 3 : 2) * C * 4 + (op == RV_LAYER_NORM ? 2 : op == RV_RMS_NORM) * C * 4;
    int64_t l1 = sp->tgt.cpu.l1d_bytes > 0 ? sp->tgt.cpu.l1d_bytes : 32 << 10;
    const char *X = g->tensor[tensor_named(g, "X")].name, *Y = g->tensor[g->output].name;

    /* the ISA rows_vec_kind checked, named in the source: the kernel compiles to the same
     * code whatever flags the compiler gets (the driver's -march, or none at all) */
    cg_line(b, 0, "#pragma GCC target(\"%s\")",
            sp->tgt.cpu.isa & TARGET_ISA_AVX512F ? "avx512f,avx512bw,avx512vl,avx2,fma" : "avx2,fma");
    cg_line(b, 0, "#include <immintrin.h>");
    cg_line(b, 0, "#include <stdlib.h>");
    cg_line(b, 0, "#define TLM_PF_HINT %s", foot <= l1 ? "_MM_HINT_T0" : "_MM_HINT_T1");
    /* how far ahead a streamed norm's next rows are prefetched (tlm_norm_out): 8 KiB with
     * 64-byte vectors, 2 KiB with 32-byte ones. A 16384 x 4096 layer_norm from DRAM on a Xeon
     * (2 threads, alternated in several orders with bench/ab_kernels' fixed COLD rotation):
     * AVX2 at 2 KiB 1.13-1.20x faster than at 8 KiB (4 KiB 1.05-1.13x, 1 KiB and 512 bytes
     * none); AVX-512 at 2 KiB 0.93-0.96x of 8 KiB */
    cg_line(b, 0, "#define TLM_PF_AHEAD %d", sp->tgt.cpu.isa & TARGET_ISA_AVX512F ? 2048 : 512);
    cg_printf(b, "%s", rows_vec_common);
    if (op == RV_LAYER_NORM || op == RV_RMS_NORM) cg_printf(b, "\n%s", rows_vec_norm_out);
    cg_printf(b, "%s\n",
              op == RV_SOFTMAX      ? rows_vec_softmax
              : op == RV_LAYER_NORM ? rows_vec_layer_norm
              : op == RV_RMS_NORM   ? rows_vec_rms_norm
                                    : rows_vec_reduce);
    if (scratch) emit_row_scratch(b, 2 * CP * 4);
    params_and_packed(c, entry, 0);
    cg_line(b, 0, "{");
    int ind = 1;
    if (par) {
        cg_line(b, ind, "#pragma omp parallel");
        cg_line(b, ind++, "{");
    } else {
        cg_line(b, ind++, "{");
    }
    if (scratch) {
        cg_line(b, ind, "/* two scratch rows: the one computed and the one streaming out */");
        cg_line(b, ind,
                "float *const tlm_buf = (float *)tlm_scratch_take(omp_get_thread_num(), %lld);",
                2 * CP * 4);
        /* every thread must reach the worksharing loop; a kernel has no error path */
        cg_line(b, ind, "if (!tlm_buf) abort();");
        cg_line(b, ind, "float *py = NULL;");
        cg_line(b, ind, "const float *pt = NULL;");
        cg_line(b, ind, "float ps = 1.0f;");
        cg_line(b, ind, "int k = 0;");
    }
    /* DRAM-sized norms on AMD take each row's sum beside the row before it (tlm_norm_out) */
    const bool carry = stream && (op == RV_LAYER_NORM || op == RV_RMS_NORM) && norm_sums_beside(c);
    if (carry)
        cg_line(b, ind, "tlm_carry cy = {NULL, 0.0f, 0.0f, 0.0f}; /* the next row's, beside */");
    if (par) cg_line(b, ind, "#pragma omp for schedule(static)%s", stream ? " nowait" : "");
    loop(b, ind++, "rb", (int64_t)R / rb);
    loop(b, ind++, "rr", rb);
    cg_line(b, ind, "const int64_t r = rb * %lld + rr;", (long long)rb);
    cg_line(b, ind, "const float *const x = %s + r * %lld;", X, C);
    if (op != RV_REDUCE) cg_line(b, ind, "float *const y = %s + r * %lld;", Y, C);
    if (scratch) {
        cg_line(b, ind, "tlm_out o;");
        cg_line(b, ind, "float *const t = tlm_buf + k * %lld;", CP);
        cg_line(b, ind,
                "tlm_out_begin(&o, py, pt, %lld, ps, r + 1 < %lld ? x + %lld : NULL, %lld);", C, R,
                C, C);
    } else if (op == RV_SOFTMAX) {
        cg_line(b, ind, "tlm_out o;");
        cg_line(b, ind,
                "tlm_out_begin(&o, NULL, NULL, 0, 1.0f, r + 1 < %lld ? x + %lld : NULL, %lld);", R,
                C, C);
        cg_line(b, ind, "float *const t = y;");
    } else if (op != RV_REDUCE) {
        cg_line(b, ind, "const float *const pf = r + 1 < %lld ? x + %lld : NULL;", R, C);
    }
    char eps[40];
    snprintf(eps, sizeof eps, "%.9gf", (double)(float)g->wl.eps);
    if (op == RV_SOFTMAX) {
        cg_line(b, ind, "const float s = tlm_softmax_row(x, t, %lld, &o);", C);
        if (!scratch) cg_line(b, ind, "tlm_scale_row(y, %lld, s);", C);
    } else if (op == RV_LAYER_NORM) {
        cg_line(b, ind, "tlm_layer_norm_row(x, y, %s, %s, %lld, %s, pf, %d, %s);",
                g->tensor[tensor_named(g, "gamma")].name, g->tensor[tensor_named(g, "beta")].name,
                C, eps, stream, carry ? "&cy" : "NULL");
    } else if (op == RV_RMS_NORM) {
        cg_line(b, ind, "tlm_rms_norm_row(x, y, %s, %lld, %s, pf, %d, %s);",
                g->tensor[tensor_named(g, "weight")].name, C, eps, stream, carry ? "&cy" : "NULL");
    } else {
        cg_printf(b, "%*s%s[r] = tlm_reduce_row(x, %lld, %d)", ind * 4, "", Y, C,
                  an->reduce == IR_RED_MAX);
        if (an->post_scale != 1.0) cg_printf(b, " * (float)%.17g", an->post_scale);
        cg_printf(b, ";\n");
    }
    if (scratch) {
        cg_line(b, ind, "py = y;");
        cg_line(b, ind, "pt = t;");
        cg_line(b, ind, "ps = s;"); /* scratch rows are softmax's */
        cg_line(b, ind, "k ^= 1;");
    }
    while (ind > 2)
        cg_line(b, --ind, "}");
    if (scratch) {
        cg_line(b, ind, "if (py) { /* this thread's last row */");
        cg_line(b, ind + 1, "tlm_out o;");
        cg_line(b, ind + 1, "tlm_out_begin(&o, py, pt, %lld, ps, NULL, 0);", C);
        cg_line(b, ind + 1, "tlm_out_finish(&o);");
        cg_line(b, ind, "}");
    }
    if (stream) cg_line(b, ind, "_mm_sfence(); /* the streamed rows before the threads join */");
    if (scratch) cg_line(b, ind, "tlm_scratch_give(omp_get_thread_num(), tlm_buf);");
    cg_line(b, --ind, "}");
    cg_line(b, 0, "}");
    return 0;
}

static int gen_rows(cgc *c, const char *entry)
{
    cg_buf *b = &c->b;
    const ir_subgraph *g = c->g;
    const space *sp = c->sp;
    int64_t rb = space_get(sp, c->s, SLOT_ROWS, 1);
    bool par = space_get(sp, c->s, SLOT_PARALLEL, 0) != 0;
    bool vec = space_get(sp, c->s, SLOT_VECTORIZE, 0) != 0;
    int unroll = (int)space_get(sp, c->s, SLOT_UNROLL, 0);
    int nra = sp->n_rows_axes;
    const ir_stage *first = &g->stage[0];
    const ir_stage *anc = &g->stage[g->anchor];
    rows_vec_op rv = rows_vec_kind(c, vec);
    if (rv != RV_NONE) return gen_rows_vec(c, entry, rv);
    int64_t slen = rows_stream_len(c, vec);

    if (slen) emit_stream_helper(b);
    if (slen) emit_row_scratch(b, (slen * 4 + 63) / 64 * 64);
    params_and_packed(c, entry, 0);
    cg_line(b, 0, "{");
    int ind = 1;
    if (slen) {
        /* one scratch row per thread, 64-byte aligned */
        if (par) {
            cg_line(b, ind, "#pragma omp parallel");
            cg_line(b, ind++, "{");
        }
        cg_line(b, ind,
                "float *const tlm_row = (float *)tlm_scratch_take(omp_get_thread_num(), %lld);",
                (long long)((slen * 4 + 63) / 64 * 64));
        /* every thread must reach the worksharing loop; a kernel has no error path */
        cg_line(b, ind, "if (!tlm_row) abort();");
        if (par) cg_line(b, ind, "#pragma omp for schedule(static)");
    } else if (par) {
        cg_line(b, ind, "#pragma omp parallel for schedule(static)");
    }
    int top = ind;
    loop(b, ind++, "rb", sp->rows / rb);
    loop(b, ind++, "rr", rb);
    cg_line(b, ind, "int64_t rem = rb * %lld + rr;", (long long)rb);
    for (int i = nra - 1; i >= 0; i--) {
        cg_line(b, ind, "const int64_t %s = rem %% %lld;", first->axis[i], (long long)first->extent[i]);
        cg_line(b, ind, "rem /= %lld;", (long long)first->extent[i]);
    }
    cg_line(b, ind, "(void)rem;");
    cg_names base = c->nm;
    /* the scratch row's index: the anchor's inner axes, flattened */
    char rowref[256] = "";
    if (slen) {
        size_t len = (size_t)snprintf(rowref, sizeof rowref, "tlm_row[");
        int64_t st = 1;
        for (int i = anc->n_spatial - 1; i >= nra; i--) {
            len += (size_t)snprintf(rowref + len, sizeof rowref - len, "%s%s * %lld",
                                    i == anc->n_spatial - 1 ? "" : " + ", anc->axis[i],
                                    (long long)st);
            st *= anc->extent[i];
        }
        snprintf(rowref + len, sizeof rowref - len, "]");
    }
    char svar[IR_MAX_STAGES][24]; /* per call: pool threads generate concurrently */
    rows_hoist *h = calloc(1, sizeof *h);
    if (!h) return TLM_ENOMEM;
    /* one row-sum term shared with the anchor through the output row (softmax's exp) */
    int share_stage = -1, share_id = -1;
    char outref[256] = "";
    for (int si = 0; si < g->anchor && share_stage < 0; si++) {
        int id = shared_term(g, si, nra);
        if (id < 0) continue;
        share_stage = si;
        share_id = id;
        ir_expr ident;
        memset(&ident, 0, sizeof ident);
        ident.kind = IR_E_LOAD;
        ident.tensor = g->output;
        for (int d = 0; d < g->tensor[g->output].ndim; d++) ident.idx[d].coef[d] = 1;
        cg_names on = base;
        for (int i = 0; i < g->stage[g->anchor].n_spatial; i++)
            on.axis[i] = g->stage[g->anchor].axis[i];
        cg_buf ob = {0};
        cg_printf(&ob, "%s[", c->nm.tensor[g->output]);
        cg_emit_offset(&ob, g, &g->stage[g->anchor], &ident, &on);
        cg_printf(&ob, "]");
        char *t = cg_buf_take(&ob);
        snprintf(outref, sizeof outref, "%s", slen ? rowref : t ? t : "");
        free(t);
        if (!t || strlen(outref) >= sizeof outref - 1) share_stage = -1;
    }
    for (int si = 0; si <= g->anchor; si++) {
        const ir_stage *st = &g->stage[si];
        cg_names nm = base;
        for (int i = 0; i < st->n_spatial + st->n_reduce; i++) nm.axis[i] = st->axis[i];
        int sind = ind;
        const char *pragma_simd = NULL;
        char red[48];
        if (st->reduce != IR_RED_NONE && st->n_spatial == nra) {
            snprintf(svar[si], sizeof svar[si], "s_%s", st->name);
            cg_line(b, ind, "float %s = %s;", svar[si], st->reduce == IR_RED_MAX ? "-INFINITY" : "0.0f");
            /* sums only: OpenMP's max combiner of the lanes may drop a NaN that tlm_max keeps */
            snprintf(red, sizeof red, "#pragma omp simd reduction(+:%s)", svar[si]);
            if (st->reduce != IR_RED_MAX) pragma_simd = red;
            /* reduction axes walked as one strided run: one loop named after the
             * innermost, the outer ones' terms zero (reduce_axes_flatten) */
            const int last = st->n_spatial + st->n_reduce - 1;
            const bool flat = reduce_axes_flatten(g, st);
            int64_t flat_n = 1;
            for (int i = st->n_spatial; i <= last; i++) {
                if (flat && i < last) {
                    nm.axis[i] = "0";
                    flat_n *= st->extent[i];
                    continue;
                }
                bool inner = i == last;
                /* omp simd and GCC unroll cannot share a loop: vectorising wins */
                if (inner && vec && pragma_simd) cg_line(b, ind, "%s", pragma_simd);
                else if (inner && unroll) cg_line(b, ind, "#pragma GCC unroll %d", unroll);
                loop(b, ind++, st->axis[i], st->extent[i] * (inner ? flat_n : 1));
            }
            if (st->reduce == IR_RED_MAX) {
                cg_printf(b, "%*s%s = tlm_max(%s, ", ind * 4, "", svar[si], svar[si]);
                cg_emit_scalar(b, g, st, st->body, &nm);
                cg_printf(b, ");\n");
            } else if (si == share_stage) {
                /* the term is also the anchor's: keep it in the output row */
                cg_printf(b, "%*sconst float t = ", ind * 4, "");
                cg_emit_scalar(b, g, st, st->body, &nm);
                cg_printf(b, ";\n");
                cg_line(b, ind, "%s = t;", outref);
                cg_line(b, ind, "%s += t;", svar[si]);
            } else {
                cg_printf(b, "%*s%s += ", ind * 4, "", svar[si]);
                cg_emit_scalar(b, g, st, st->body, &nm);
                cg_printf(b, ";\n");
            }
            while (ind > sind) cg_line(b, --ind, "}");
            if (st->post_scale != 1.0) cg_line(b, ind, "%s *= (float)%.17g;", svar[si], st->post_scale);
            base.scalar_tensor[st->out] = svar[si];
            if (si == g->anchor) {
                cg_line(b, ind, "{");
                cg_line(b, ind + 1, "float v = %s;", svar[si]);
                emit_epilogue_store(b, g, ind + 1, &nm, NULL);
                cg_line(b, ind, "}");
            }
        } else {
            /* a stage over the row axes plus inner spatial axes: the anchor */
            if (share_stage >= 0) h->var[share_id] = outref;
            hoist(b, g, st, st->body, nra, h, ind, &nm);
            nm.expr_var = h->var;
            nm.recip_var = h->recip;
            for (int i = nra; i < st->n_spatial; i++) {
                bool inner = i == st->n_spatial - 1;
                if (inner && vec) cg_line(b, ind, "#pragma omp simd");
                else if (inner && unroll) cg_line(b, ind, "#pragma GCC unroll %d", unroll);
                loop(b, ind++, st->axis[i], st->extent[i]);
            }
            cg_printf(b, "%*sfloat v = ", ind * 4, "");
            cg_emit_scalar(b, g, st, st->body, &nm);
            cg_printf(b, ";\n");
            if (si == g->anchor) emit_epilogue_store(b, g, ind, &nm, slen ? rowref : NULL);
            while (ind > sind) cg_line(b, --ind, "}");
            if (si == g->anchor && slen) {
                /* the row out with non-temporal stores, from its first element */
                ir_expr ident;
                memset(&ident, 0, sizeof ident);
                ident.kind = IR_E_LOAD;
                ident.tensor = g->output;
                for (int d = 0; d < g->tensor[g->output].ndim; d++) ident.idx[d].coef[d] = 1;
                cg_names on = base;
                for (int i = 0; i < anc->n_spatial; i++) on.axis[i] = i < nra ? anc->axis[i] : "0";
                cg_printf(b, "%*stlm_stream_row(&%s[", ind * 4, "", c->nm.tensor[g->output]);
                cg_emit_offset(b, g, anc, &ident, &on);
                cg_printf(b, "], tlm_row, %lld);\n", (long long)slen);
            }
        }
    }
    free(h);
    while (ind > top) cg_line(b, --ind, "}");
    if (slen) {
        cg_line(b, ind, "_mm_sfence(); /* the streamed rows before the threads join */");
        cg_line(b, ind, "tlm_scratch_give(omp_get_thread_num(), tlm_row);");
        if (par) cg_line(b, --ind, "}");
    }
    cg_line(b, 0, "}");
    return 0;
}

int cg_generate_cpu(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                    tlm_error *err)
{
    if (!cg_cpu_has_route(sp->sketch))
        return tlm_err_set(err, TLM_EINVAL, "sketch", "sketch %s has no CPU code generator",
                           space_sketch_name(sp->sketch));
    cgc *c = calloc(1, sizeof *c);
    if (!c) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    c->sp = sp;
    c->s = s;
    c->keep_pi = -1;
    c->nt_load = -1;
    c->g = sp->g;
    c->a = &sp->g->stage[sp->g->anchor];
    c->ns = c->a->n_spatial;
    c->nr = c->a->n_reduce;
    c->x = sp->sketch == SKETCH_CPU_TILE ? space_cpu_vec_axis(sp, s, sp->n_slot) : c->ns - 1;
    c->nm.subst_tensor = -1;
    if (sp->sketch == SKETCH_CPU_TILE)
        for (int i = 0; i < c->ns + c->nr; i++) {
            int L = i < c->ns ? sp->s_levels : sp->r_levels;
            for (int l = 0; l < L; l++) c->T[i][l] = space_tile(sp, s, i, l);
            c->E[i] = c->a->extent[i];
            if (i < c->ns) {
                c->pad[i] = space_padded_extent(sp, s, i) != c->E[i];
                c->any_pad |= c->pad[i];
            } else {
                c->rtail[i] = c->E[i] % c->T[i][1] != 0;
            }
        }
    cg_printf(&c->b, "/* generated by tlm: %s, sketch %s */\n", ir_op_get(sp->g->wl.op)->name,
              space_sketch_name(sp->sketch));
    cg_printf(&c->b, "/* schedule: ");
    char sched[1024];
    space_print(sp, s, sched, sizeof sched);
    cg_printf(&c->b, "%s */\n", sched);
    cg_printf(&c->b, "%s", c_prelude);
    int rc = cpu_routes[sp->sketch](c, entry);
    if (rc == 0 && c->npre) emit_prepack_entries(c, entry);
    if (rc == 0) emit_packed(&c->b, sp->g, entry);
    char *src = cg_buf_take(&c->b);
    free(c->gpad);
    free(c);
    if (rc) {
        free(src);
        return rc;
    }
    if (!src) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    out->source = src;
    return 0;
}

int cg_generate(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                tlm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!entry) entry = "tlm_kernel";
    snprintf(out->entry, sizeof out->entry, "%s", entry);
    int rc = space_check(sp, s, err);
    if (rc) return rc;
    if (sp->tgt.kind == TARGET_CUDA) return cg_generate_cuda(sp, s, entry, out, err);
    return cg_generate_cpu(sp, s, entry, out, err);
}

/* ---- naive baseline ---- */

int cg_generate_naive_c(const ir_subgraph *g, const char *entry, cg_kernel *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!entry) entry = "tlm_kernel";
    snprintf(out->entry, sizeof out->entry, "%s", entry);
    cg_buf bb = {0}, *b = &bb;
    cg_names nm;
    memset(&nm, 0, sizeof nm);
    nm.subst_tensor = -1;
    cg_printf(b, "/* generated by tlm: naive loops for %s */\n", ir_op_get(g->wl.op)->name);
    cg_printf(b, "%s", c_prelude);
    cg_printf(b, "#include <stdlib.h>\n\nvoid %s(", entry);
    cg_emit_params(b, g, &nm, false);
    cg_printf(b, ")\n{\n");
    for (int t = 0; t < g->n_tensor; t++)
        if (g->tensor[t].kind == IR_T_TEMP) {
            cg_line(b, 1, "float *%s = malloc(sizeof(float) * %lld);", g->tensor[t].name,
                    (long long)ir_tensor_numel(&g->tensor[t]));
            nm.tensor[t] = g->tensor[t].name;
        }
    for (int si = 0; si < g->n_stage; si++) {
        const ir_stage *st = &g->stage[si];
        int ind = 1;
        cg_names sn = nm;
        for (int i = 0; i < st->n_spatial + st->n_reduce; i++) sn.axis[i] = st->axis[i];
        for (int i = 0; i < st->n_spatial; i++) loop(b, ind++, st->axis[i], st->extent[i]);
        int sind = ind;
        cg_line(b, ind, "float acc = %s;", st->reduce == IR_RED_MAX ? "-INFINITY" : "0.0f");
        for (int i = st->n_spatial; i < st->n_spatial + st->n_reduce; i++)
            loop(b, ind++, st->axis[i], st->extent[i]);
        cg_printf(b, "%*s", ind * 4, "");
        if (st->reduce == IR_RED_MAX) cg_printf(b, "acc = tlm_max(acc, ");
        else if (st->reduce == IR_RED_SUM) cg_printf(b, "acc += (");
        else cg_printf(b, "acc = (");
        cg_emit_scalar(b, g, st, st->body, &sn);
        cg_printf(b, ");\n");
        while (ind > sind) cg_line(b, --ind, "}");
        ir_expr e;
        memset(&e, 0, sizeof e);
        e.tensor = st->out;
        for (int d = 0; d < st->n_spatial; d++) e.idx[d].coef[d] = 1;
        cg_printf(b, "%*s%s[", ind * 4, "", g->tensor[st->out].name);
        cg_emit_offset(b, g, st, &e, &sn);
        cg_printf(b, "] = acc");
        if (st->post_scale != 1.0) cg_printf(b, " * (float)%.17g", st->post_scale);
        cg_printf(b, ";\n");
        while (ind > 1) cg_line(b, --ind, "}");
    }
    for (int t = 0; t < g->n_tensor; t++)
        if (g->tensor[t].kind == IR_T_TEMP) cg_line(b, 1, "free(%s);", g->tensor[t].name);
    cg_printf(b, "}\n");
    emit_packed(b, g, entry);
    out->source = cg_buf_take(b);
    if (!out->source) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    return 0;
}
