/* build.c — lowering a checked workload into stages; FLOPs, bytes, printing, scalar math. */
#include "compiler/ir/ir.h"

#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

/* ---- builder helpers (they only fail on our own invariants: fixed-size arrays) ---- */

typedef struct {
    ir_subgraph *g;
    tlm_error *err;
    int rc;
} bld;

static int t_add(bld *b, const char *name, int ndim, const int64_t *shape, ir_tensor_kind kind)
{
    ir_subgraph *g = b->g;
    if (g->n_tensor >= IR_MAX_TENSORS) {
        b->rc = tlm_err_set(b->err, TLM_ELIMIT, "epilogue", "too many tensors in one subgraph");
        return 0;
    }
    ir_tensor *t = &g->tensor[g->n_tensor];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->dtype = g->wl.dtype;
    t->kind = kind;
    return g->n_tensor++;
}

static ir_stage *st_add(bld *b, const char *name, ir_role role, int out, int nsp, int nred,
                        const int64_t *ext, const char *const *axes)
{
    ir_subgraph *g = b->g;
    if (g->n_stage >= IR_MAX_STAGES) {
        b->rc = tlm_err_set(b->err, TLM_ELIMIT, "epilogue", "too many stages in one subgraph");
        return NULL;
    }
    ir_stage *s = &g->stage[g->n_stage++];
    /* the header only: e_new clears each expression as it is added (a stage's 40 expression
     * slots are 19 KB, and most stages use a few) */
    memset(s, 0, offsetof(ir_stage, expr));
    snprintf(s->name, sizeof s->name, "%s", name);
    s->role = role;
    s->out = out;
    s->n_spatial = nsp;
    s->n_reduce = nred;
    for (int i = 0; i < nsp + nred; i++) {
        s->extent[i] = ext[i];
        snprintf(s->axis[i], sizeof s->axis[i], "%s", axes[i]);
    }
    s->reduce = IR_RED_NONE;
    s->post_scale = 1.0;
    s->body = -1;
    return s;
}

static ir_expr *e_new(ir_stage *s, int *id)
{
    if (s->n_expr >= IR_MAX_EXPR) {
        *id = -1;
        return NULL;
    }
    ir_expr *e = &s->expr[s->n_expr];
    memset(e, 0, sizeof *e);
    e->a = e->b = -1;
    *id = s->n_expr++;
    return e;
}

static int e_const(ir_stage *s, double v)
{
    int id;
    ir_expr *e = e_new(s, &id);
    if (e) e->kind = IR_E_CONST, e->value = v;
    return id;
}

static ir_affine ax(int a)
{
    ir_affine r;
    memset(&r, 0, sizeof r);
    if (a >= 0) r.coef[a] = 1;
    return r;
}

static ir_affine ax2(int a, int32_t ca, int b2, int32_t cb, int64_t off)
{
    ir_affine r = ax(-1);
    if (a >= 0) r.coef[a] += ca;
    if (b2 >= 0) r.coef[b2] += cb;
    r.off = off;
    return r;
}

static int e_load(ir_stage *s, int tensor, int ndim, const ir_affine *idx)
{
    int id;
    ir_expr *e = e_new(s, &id);
    if (!e) return -1;
    e->kind = IR_E_LOAD;
    e->tensor = tensor;
    for (int i = 0; i < ndim; i++) e->idx[i] = idx[i];
    return id;
}

/* Load at the identity index (tensor dims = the stage's first ndim spatial axes). */
static int e_load_id(ir_stage *s, int tensor, int ndim)
{
    ir_affine idx[IR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) idx[i] = ax(i);
    return e_load(s, tensor, ndim, idx);
}

static int e_un(ir_stage *s, ir_unop op, int a)
{
    int id;
    ir_expr *e = e_new(s, &id);
    if (e) e->kind = IR_E_UNARY, e->op = op, e->a = a;
    return id;
}

static int e_bin(ir_stage *s, ir_binop op, int a, int b2)
{
    int id;
    ir_expr *e = e_new(s, &id);
    if (e) e->kind = IR_E_BINARY, e->op = op, e->a = a, e->b = b2;
    return id;
}

static int e_sel(ir_stage *s, int ncond, const ir_affine *cond, const int64_t *hi, int a, int b2)
{
    int id;
    ir_expr *e = e_new(s, &id);
    if (!e) return -1;
    e->kind = IR_E_SELECT;
    e->a = a;
    e->b = b2;
    e->ncond = ncond;
    for (int i = 0; i < ncond; i++) e->cond[i] = cond[i], e->cond_hi[i] = hi[i];
    return id;
}

/* ---- per-family lowering; each returns the anchor's output tensor shape ---- */

typedef struct {
    int ndim;
    int64_t shape[IR_MAX_DIMS];
    ir_affine chan;   /* bias index over the anchor's spatial axes */
    int anchor_stage; /* index in g->stage */
} anchor_info;

/* The anchor (or last prologue) writes into `out`, which is the final output when there is
 * no epilogue, otherwise a temp. */
static int out_tensor(bld *b, int ndim, const int64_t *shape)
{
    return t_add(b, b->g->wl.n_epilogue ? "t_anchor" : "out", ndim, shape,
                 b->g->wl.n_epilogue ? IR_T_TEMP : IR_T_OUTPUT);
}

static void lower_matmul(bld *b, anchor_info *ai)
{
    const ir_workload *w = &b->g->wl;
    bool bmm = w->op == IR_OP_BATCH_MATMUL;
    int64_t Bt = bmm ? w->shape[IR_BMM_B] : 1;
    int64_t M = w->shape[bmm ? IR_BMM_M : IR_DENSE_M], N = w->shape[bmm ? IR_BMM_N : IR_DENSE_N],
            K = w->shape[bmm ? IR_BMM_K : IR_DENSE_K];
    int o = bmm ? 1 : 0; /* axis offset: b is axis 0 for batch_matmul */
    int nb = bmm ? 1 : 0;
    int64_t sa[3], sb[3], so[3];
    sa[0] = sb[0] = so[0] = Bt;
    sa[nb] = w->transpose_a ? K : M, sa[nb + 1] = w->transpose_a ? M : K;
    sb[nb] = w->transpose_b ? N : K, sb[nb + 1] = w->transpose_b ? K : N;
    so[nb] = M, so[nb + 1] = N;
    int A = t_add(b, "A", 2 + nb, sa, IR_T_INPUT);
    int B = t_add(b, "B", 2 + nb, sb, IR_T_INPUT);
    int out = out_tensor(b, 2 + nb, so);
    int64_t ext[4] = {Bt, M, N, K};
    const char *names[4] = {"b", "i", "j", "k"};
    ir_stage *s = st_add(b, w->op == IR_OP_DENSE ? "dense" : "batch_matmul", IR_ROLE_ANCHOR, out,
                         2 + nb, 1, ext + 1 - nb, names + 1 - nb);
    if (!s) return;
    int i = o, j = o + 1, k = o + 2;
    ir_affine ia[3], ib[3];
    ia[0] = ib[0] = ax(0);
    ia[nb] = ax(w->transpose_a ? k : i), ia[nb + 1] = ax(w->transpose_a ? i : k);
    ib[nb] = ax(w->transpose_b ? j : k), ib[nb + 1] = ax(w->transpose_b ? k : j);
    int la = e_load(s, A, 2 + nb, ia), lb = e_load(s, B, 2 + nb, ib);
    s->body = e_bin(s, IR_B_MUL, la, lb);
    s->reduce = IR_RED_SUM;
    ai->ndim = 2 + nb;
    memcpy(ai->shape, so, sizeof so);
    ai->chan = ax(j);
}

static void lower_conv(bld *b, anchor_info *ai)
{
    const ir_workload *w = &b->g->wl;
    const int64_t *sh = w->shape;
    bool nhwc = w->layout == IR_NHWC;
    int64_t N = sh[IR_CONV_N], C = sh[IR_CONV_C], H = sh[IR_CONV_H], W = sh[IR_CONV_W],
            F = sh[IR_CONV_F], KH = sh[IR_CONV_KH], KW = sh[IR_CONV_KW], G = w->groups;
    int64_t OH, OW;
    ir_workload_out_hw(w, &OH, &OW);
    /* A pointwise conv's positions on one axis: a tile along it runs across image rows
     * (ResNet-50's 64 -> 256 at 56 x 56, batch 8: 3.66 -> 2.05 ms, where 56 was a ragged
     * 64-wide tile and every row a partial one) */
    if (ir_conv_pointwise(w)) W = OW = H * W, H = OH = 1;
    int64_t Cg = C / G, Fg = F / G;
    bool grouped = G > 1;
    int64_t xs[4], ws[5], os[5];
    if (!nhwc) {
        int64_t a[4] = {N, C, H, W};
        memcpy(xs, a, sizeof a);
    } else {
        int64_t a[4] = {N, H, W, C};
        memcpy(xs, a, sizeof a);
    }
    /* Spatial axes: NCHW (n, [g,] f, oh, ow); NHWC (n, oh, ow, [g,] f). Reduction: c, kh, kw.
     * A grouped conv splits F into (g, f) so every index stays affine; the output and weight
     * tensors are declared with that split, which is the same row-major memory. */
    int ns = grouped ? 5 : 4;
    int64_t ext[8];
    const char *names[8];
    int an, ag = -1, af, aoh, aow;
    if (!nhwc) {
        an = 0;
        if (grouped) ag = 1;
        af = grouped ? 2 : 1, aoh = af + 1, aow = af + 2;
    } else {
        an = 0, aoh = 1, aow = 2;
        if (grouped) ag = 3;
        af = grouped ? 4 : 3;
    }
    ext[an] = N, names[an] = "n";
    if (grouped) ext[ag] = G, names[ag] = "g";
    ext[af] = grouped ? Fg : F, names[af] = "f";
    ext[aoh] = OH, names[aoh] = "oh";
    ext[aow] = OW, names[aow] = "ow";
    int ac = ns, akh = ns + 1, akw = ns + 2;
    ext[ac] = Cg, names[ac] = "c";
    ext[akh] = KH, names[akh] = "kh";
    ext[akw] = KW, names[akw] = "kw";
    for (int i = 0; i < ns; i++) os[i] = ext[i];
    int wn;
    if (!nhwc) {
        if (grouped) {
            int64_t a[5] = {G, Fg, Cg, KH, KW};
            memcpy(ws, a, sizeof a), wn = 5;
        } else {
            int64_t a[4] = {F, Cg, KH, KW};
            memcpy(ws, a, sizeof a), wn = 4;
        }
    } else {
        if (grouped) {
            int64_t a[5] = {KH, KW, Cg, G, Fg};
            memcpy(ws, a, sizeof a), wn = 5;
        } else {
            int64_t a[4] = {KH, KW, Cg, F};
            memcpy(ws, a, sizeof a), wn = 4;
        }
    }
    int X = t_add(b, "X", 4, xs, IR_T_INPUT);
    int Wt = t_add(b, "Wt", wn, ws, IR_T_INPUT);
    int out = out_tensor(b, ns, os);
    ir_stage *s = st_add(b, "conv2d", IR_ROLE_ANCHOR, out, ns, 3, ext, names);
    if (!s) return;
    ir_affine ih = ax2(aoh, (int32_t)w->stride[0], akh, (int32_t)w->dilation[0], -w->pad[0]);
    ir_affine iw = ax2(aow, (int32_t)w->stride[1], akw, (int32_t)w->dilation[1], -w->pad[1]);
    ir_affine ic = grouped ? ax2(ag, (int32_t)Cg, ac, 1, 0) : ax(ac);
    ir_affine xi[4], wi[5];
    if (!nhwc) xi[0] = ax(an), xi[1] = ic, xi[2] = ih, xi[3] = iw;
    else xi[0] = ax(an), xi[1] = ih, xi[2] = iw, xi[3] = ic;
    if (!nhwc) {
        int k = 0;
        if (grouped) wi[k++] = ax(ag);
        wi[k++] = ax(af), wi[k++] = ax(ac), wi[k++] = ax(akh), wi[k++] = ax(akw);
    } else {
        int k = 0;
        wi[k++] = ax(akh), wi[k++] = ax(akw), wi[k++] = ax(ac);
        if (grouped) wi[k++] = ax(ag);
        wi[k++] = ax(af);
    }
    int lx = e_load(s, X, 4, xi);
    bool padded = w->pad[0] > 0 || w->pad[1] > 0;
    if (padded) {
        ir_affine cond[2] = {ih, iw};
        int64_t hi[2] = {H, W};
        lx = e_sel(s, 2, cond, hi, lx, e_const(s, 0.0));
    }
    int lw = e_load(s, Wt, wn, wi);
    s->body = e_bin(s, IR_B_MUL, lx, lw);
    s->reduce = IR_RED_SUM;
    ai->ndim = ns;
    memcpy(ai->shape, os, sizeof(int64_t) * (size_t)ns);
    ai->chan = grouped ? ax2(ag, (int32_t)Fg, af, 1, 0) : ax(af);
}

/* depthwise conv and the two windowed pools share the geometry */
static void lower_window(bld *b, anchor_info *ai)
{
    const ir_workload *w = &b->g->wl;
    const int64_t *sh = w->shape;
    bool nhwc = w->layout == IR_NHWC;
    int64_t N = sh[IR_DW_N], C = sh[IR_DW_C], H = sh[IR_DW_H], W = sh[IR_DW_W],
            KH = sh[IR_DW_KH], KW = sh[IR_DW_KW];
    int64_t OH, OW;
    ir_workload_out_hw(w, &OH, &OW);
    int an = 0, acc = nhwc ? 3 : 1, aoh = nhwc ? 1 : 2, aow = nhwc ? 2 : 3, akh = 4, akw = 5;
    int64_t ext[6];
    const char *names[6];
    ext[an] = N, names[an] = "n";
    ext[acc] = C, names[acc] = "c";
    ext[aoh] = OH, names[aoh] = "oh";
    ext[aow] = OW, names[aow] = "ow";
    ext[akh] = KH, names[akh] = "kh";
    ext[akw] = KW, names[akw] = "kw";
    int64_t xs[4], os[4];
    for (int i = 0; i < 4; i++) os[i] = ext[i];
    xs[0] = N, xs[acc] = C, xs[aoh] = H, xs[aow] = W;
    int X = t_add(b, "X", 4, xs, IR_T_INPUT);
    int Wt = -1;
    if (w->op == IR_OP_DEPTHWISE_CONV2D) {
        int64_t ws[3] = {C, KH, KW};
        if (nhwc) ws[0] = KH, ws[1] = KW, ws[2] = C;
        Wt = t_add(b, "Wt", 3, ws, IR_T_INPUT);
    }
    int out = out_tensor(b, 4, os);
    const char *nm = w->op == IR_OP_DEPTHWISE_CONV2D ? "depthwise_conv2d"
                     : w->op == IR_OP_MAX_POOL2D     ? "max_pool2d"
                                                     : "avg_pool2d";
    ir_stage *s = st_add(b, nm, IR_ROLE_ANCHOR, out, 4, 2, ext, names);
    if (!s) return;
    ir_affine ih = ax2(aoh, (int32_t)w->stride[0], akh, (int32_t)w->dilation[0], -w->pad[0]);
    ir_affine iw = ax2(aow, (int32_t)w->stride[1], akw, (int32_t)w->dilation[1], -w->pad[1]);
    ir_affine xi[4];
    xi[0] = ax(an), xi[acc] = ax(acc), xi[aoh] = ih, xi[aow] = iw;
    int lx = e_load(s, X, 4, xi);
    bool padded = w->pad[0] > 0 || w->pad[1] > 0;
    double fill = w->op == IR_OP_MAX_POOL2D ? -INFINITY : 0.0;
    if (padded) {
        ir_affine cond[2] = {ih, iw};
        int64_t hi[2] = {H, W};
        lx = e_sel(s, 2, cond, hi, lx, e_const(s, fill));
    }
    if (w->op == IR_OP_DEPTHWISE_CONV2D) {
        ir_affine wi[3] = {ax(acc), ax(akh), ax(akw)};
        if (nhwc) wi[0] = ax(akh), wi[1] = ax(akw), wi[2] = ax(acc);
        s->body = e_bin(s, IR_B_MUL, lx, e_load(s, Wt, 3, wi));
        s->reduce = IR_RED_SUM;
    } else if (w->op == IR_OP_MAX_POOL2D) {
        s->body = lx;
        s->reduce = IR_RED_MAX;
    } else {
        s->body = lx;
        s->reduce = IR_RED_SUM;
        s->post_scale = 1.0 / (double)(KH * KW);
    }
    ai->ndim = 4;
    memcpy(ai->shape, os, sizeof os);
    ai->chan = ax(acc);
}

static void lower_global_pool(bld *b, anchor_info *ai)
{
    const ir_workload *w = &b->g->wl;
    const int64_t *sh = w->shape;
    bool nhwc = w->layout == IR_NHWC;
    int64_t N = sh[IR_GP_N], C = sh[IR_GP_C], H = sh[IR_GP_H], W = sh[IR_GP_W];
    int64_t xs[4] = {N, C, H, W};
    if (nhwc) xs[1] = H, xs[2] = W, xs[3] = C;
    int X = t_add(b, "X", 4, xs, IR_T_INPUT);
    int64_t os[2] = {N, C};
    int out = out_tensor(b, 2, os);
    int64_t ext[4] = {N, C, H, W};
    const char *names[4] = {"n", "c", "h", "w"};
    ir_stage *s = st_add(b, "global_avg_pool2d", IR_ROLE_ANCHOR, out, 2, 2, ext, names);
    if (!s) return;
    ir_affine xi[4] = {ax(0), ax(1), ax(2), ax(3)};
    if (nhwc) xi[1] = ax(2), xi[2] = ax(3), xi[3] = ax(1);
    s->body = e_load(s, X, 4, xi);
    s->reduce = IR_RED_SUM;
    s->post_scale = 1.0 / (double)(H * W);
    ai->ndim = 2;
    memcpy(ai->shape, os, sizeof os);
    ai->chan = ax(1);
}

static void lower_rows(bld *b, anchor_info *ai)
{
    ir_subgraph *g = b->g;
    const ir_workload *w = &g->wl;
    int64_t R = w->shape[IR_ROW_R], C = w->shape[IR_ROW_C];
    int64_t xs[2] = {R, C};
    int X = t_add(b, "X", 2, xs, IR_T_INPUT);
    int64_t ext[2] = {R, C};
    const char *rc[2] = {"r", "c"};
    ir_affine xi[2] = {ax(0), ax(1)};
    ir_affine ri[1] = {ax(0)};
    ir_affine ci[1] = {ax(1)};
    int64_t rs[1] = {R}, cs[1] = {C};
    ir_stage *s;

    switch (w->op) {
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX: {
        int out = out_tensor(b, 1, rs);
        const char *nm = w->op == IR_OP_REDUCE_SUM    ? "reduce_sum"
                         : w->op == IR_OP_REDUCE_MEAN ? "reduce_mean"
                                                      : "reduce_max";
        if (!(s = st_add(b, nm, IR_ROLE_ANCHOR, out, 1, 1, ext, rc))) return;
        s->body = e_load(s, X, 2, xi);
        s->reduce = w->op == IR_OP_REDUCE_MAX ? IR_RED_MAX : IR_RED_SUM;
        if (w->op == IR_OP_REDUCE_MEAN) s->post_scale = 1.0 / (double)C;
        ai->ndim = 1, ai->shape[0] = R, ai->chan = ax(0);
        return;
    }
    case IR_OP_TRANSPOSE: {
        int64_t os[2] = {C, R};
        int out = out_tensor(b, 2, os);
        int64_t e2[2] = {C, R};
        const char *cr[2] = {"c", "r"};
        if (!(s = st_add(b, "transpose", IR_ROLE_ANCHOR, out, 2, 0, e2, cr))) return;
        ir_affine ti[2] = {ax(1), ax(0)};
        s->body = e_load(s, X, 2, ti);
        ai->ndim = 2, ai->shape[0] = C, ai->shape[1] = R, ai->chan = ax(1);
        return;
    }
    case IR_OP_SOFTMAX: {
        int tmax = t_add(b, "t_max", 1, rs, IR_T_TEMP);
        int tsum = t_add(b, "t_sum", 1, rs, IR_T_TEMP);
        int out = out_tensor(b, 2, xs);
        if (!(s = st_add(b, "row_max", IR_ROLE_PROLOGUE, tmax, 1, 1, ext, rc))) return;
        s->body = e_load(s, X, 2, xi);
        s->reduce = IR_RED_MAX;
        if (!(s = st_add(b, "row_sumexp", IR_ROLE_PROLOGUE, tsum, 1, 1, ext, rc))) return;
        s->body = e_un(s, IR_U_EXP,
                       e_bin(s, IR_B_SUB, e_load(s, X, 2, xi), e_load(s, tmax, 1, ri)));
        s->reduce = IR_RED_SUM;
        if (!(s = st_add(b, "softmax", IR_ROLE_ANCHOR, out, 2, 0, ext, rc))) return;
        int ex = e_un(s, IR_U_EXP, e_bin(s, IR_B_SUB, e_load(s, X, 2, xi), e_load(s, tmax, 1, ri)));
        s->body = e_bin(s, IR_B_DIV, ex, e_load(s, tsum, 1, ri));
        break;
    }
    case IR_OP_LAYER_NORM: {
        int gam = t_add(b, "gamma", 1, cs, IR_T_INPUT);
        int bet = t_add(b, "beta", 1, cs, IR_T_INPUT);
        int tmean = t_add(b, "t_mean", 1, rs, IR_T_TEMP);
        int tvar = t_add(b, "t_var", 1, rs, IR_T_TEMP);
        int out = out_tensor(b, 2, xs);
        if (!(s = st_add(b, "row_mean", IR_ROLE_PROLOGUE, tmean, 1, 1, ext, rc))) return;
        s->body = e_load(s, X, 2, xi);
        s->reduce = IR_RED_SUM;
        s->post_scale = 1.0 / (double)C;
        if (!(s = st_add(b, "row_var", IR_ROLE_PROLOGUE, tvar, 1, 1, ext, rc))) return;
        int d = e_bin(s, IR_B_SUB, e_load(s, X, 2, xi), e_load(s, tmean, 1, ri));
        s->body = e_bin(s, IR_B_MUL, d, d);
        s->reduce = IR_RED_SUM;
        s->post_scale = 1.0 / (double)C;
        if (!(s = st_add(b, "layer_norm", IR_ROLE_ANCHOR, out, 2, 0, ext, rc))) return;
        int d2 = e_bin(s, IR_B_SUB, e_load(s, X, 2, xi), e_load(s, tmean, 1, ri));
        int inv = e_un(s, IR_U_RSQRT,
                       e_bin(s, IR_B_ADD, e_load(s, tvar, 1, ri), e_const(s, w->eps)));
        int y = e_bin(s, IR_B_MUL, e_bin(s, IR_B_MUL, d2, inv), e_load(s, gam, 1, ci));
        s->body = e_bin(s, IR_B_ADD, y, e_load(s, bet, 1, ci));
        break;
    }
    case IR_OP_RMS_NORM: {
        int wt = t_add(b, "weight", 1, cs, IR_T_INPUT);
        int tms = t_add(b, "t_ms", 1, rs, IR_T_TEMP);
        int out = out_tensor(b, 2, xs);
        if (!(s = st_add(b, "row_meansq", IR_ROLE_PROLOGUE, tms, 1, 1, ext, rc))) return;
        int x = e_load(s, X, 2, xi);
        s->body = e_bin(s, IR_B_MUL, x, x);
        s->reduce = IR_RED_SUM;
        s->post_scale = 1.0 / (double)C;
        if (!(s = st_add(b, "rms_norm", IR_ROLE_ANCHOR, out, 2, 0, ext, rc))) return;
        int inv = e_un(s, IR_U_RSQRT,
                       e_bin(s, IR_B_ADD, e_load(s, tms, 1, ri), e_const(s, w->eps)));
        s->body = e_bin(s, IR_B_MUL, e_bin(s, IR_B_MUL, e_load(s, X, 2, xi), inv),
                        e_load(s, wt, 1, ci));
        break;
    }
    default:
        break;
    }
    ai->ndim = 2, ai->shape[0] = R, ai->shape[1] = C, ai->chan = ax(1);
}

static void lower_elementwise(bld *b, anchor_info *ai)
{
    int64_t n[1] = {b->g->wl.shape[IR_EW_N]};
    int X = t_add(b, "X", 1, n, IR_T_INPUT);
    int out = out_tensor(b, 1, n);
    const char *nm[1] = {"i"};
    ir_stage *s = st_add(b, "copy", IR_ROLE_ANCHOR, out, 1, 0, n, nm);
    if (!s) return;
    s->body = e_load_id(s, X, 1);
    ai->ndim = 1, ai->shape[0] = n[0], ai->chan = ax(0);
}

static void lower_epilogue(bld *b, const anchor_info *ai)
{
    ir_subgraph *g = b->g;
    const ir_stage *anc = &g->stage[g->anchor];
    int prev = anc->out;
    int64_t bias_n = 1;
    /* the bias extent: the extent behind the channel index */
    for (int a = 0; a < anc->n_spatial; a++)
        if (ai->chan.coef[a]) bias_n = ai->chan.coef[a] * anc->extent[a] > bias_n
                                           ? ai->chan.coef[a] * anc->extent[a]
                                           : bias_n;
    int nb = 0, nr = 0, nm = 0;
    for (int e = 0; e < g->wl.n_epilogue && b->rc == 0; e++) {
        ir_epilogue ep = g->wl.epilogue[e];
        bool last = e == g->wl.n_epilogue - 1;
        int extra = -1;
        char nmbuf[16];
        if (ep == IR_EPI_BIAS_ADD) {
            snprintf(nmbuf, sizeof nmbuf, nb ? "bias%d" : "bias", nb);
            nb++;
            extra = t_add(b, nmbuf, 1, &bias_n, IR_T_INPUT);
        } else if (ep == IR_EPI_ADD || ep == IR_EPI_MUL) {
            int *cnt = ep == IR_EPI_ADD ? &nr : &nm;
            const char *base = ep == IR_EPI_ADD ? "res" : "mul";
            if (*cnt) snprintf(nmbuf, sizeof nmbuf, "%s%d", base, *cnt);
            else snprintf(nmbuf, sizeof nmbuf, "%s", base);
            (*cnt)++;
            extra = t_add(b, nmbuf, ai->ndim, ai->shape, IR_T_INPUT);
        }
        char tname[24];
        snprintf(tname, sizeof tname, "t_epi%d", e);
        int out = last ? t_add(b, "out", ai->ndim, ai->shape, IR_T_OUTPUT)
                       : t_add(b, tname, ai->ndim, ai->shape, IR_T_TEMP);
        if (b->rc) return;
        const char *names[IR_MAX_AXES];
        for (int a = 0; a < anc->n_spatial; a++) names[a] = anc->axis[a];
        ir_stage *s = st_add(b, ir_epilogue_name(ep), IR_ROLE_EPILOGUE, out, anc->n_spatial, 0,
                             anc->extent, names);
        if (!s) return;
        int x = e_load_id(s, prev, ai->ndim);
        switch (ep) {
        case IR_EPI_BIAS_ADD:
            s->body = e_bin(s, IR_B_ADD, x, e_load(s, extra, 1, &ai->chan));
            break;
        case IR_EPI_ADD:
            s->body = e_bin(s, IR_B_ADD, x, e_load_id(s, extra, ai->ndim));
            break;
        case IR_EPI_MUL:
            s->body = e_bin(s, IR_B_MUL, x, e_load_id(s, extra, ai->ndim));
            break;
        case IR_EPI_RELU: s->body = e_un(s, IR_U_RELU, x); break;
        case IR_EPI_RELU6: s->body = e_un(s, IR_U_RELU6, x); break;
        case IR_EPI_GELU: s->body = e_un(s, IR_U_GELU, x); break;
        case IR_EPI_SILU: s->body = e_un(s, IR_U_SILU, x); break;
        case IR_EPI_SIGMOID: s->body = e_un(s, IR_U_SIGMOID, x); break;
        case IR_EPI_TANH: s->body = e_un(s, IR_U_TANH, x); break;
        default: break;
        }
        prev = out;
    }
}

int ir_subgraph_build(const ir_workload *w, ir_subgraph *g, tlm_error *err)
{
    int rc = ir_workload_check(w, err);
    if (rc) return rc;
    /* everything but the stages, which new_stage clears as they are added: the subgraph is
     * 230 KB, mostly 12 stage slots of which a workload uses a few, and tlm train builds one
     * per teacher copy (15,547 of them: 3.9 GB resident when every page was written here) */
    memset(g, 0, offsetof(ir_subgraph, stage));
    g->anchor = 0;
    g->output = 0;
    g->wl = *w;
    ir_workload_normalize(&g->wl);
    bld b = {g, err, 0};
    anchor_info ai;
    memset(&ai, 0, sizeof ai);
    switch (w->op) {
    case IR_OP_DENSE:
    case IR_OP_BATCH_MATMUL: lower_matmul(&b, &ai); break;
    case IR_OP_CONV2D: lower_conv(&b, &ai); break;
    case IR_OP_DEPTHWISE_CONV2D:
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D: lower_window(&b, &ai); break;
    case IR_OP_GLOBAL_AVG_POOL2D: lower_global_pool(&b, &ai); break;
    case IR_OP_ELEMENTWISE: lower_elementwise(&b, &ai); break;
    default: lower_rows(&b, &ai); break;
    }
    if (b.rc) return b.rc;
    g->anchor = g->n_stage - 1;
    lower_epilogue(&b, &ai);
    if (b.rc) return b.rc;
    /* A full expression arena yields -1 ids; refuse rather than build a broken graph. */
    for (int i = 0; i < g->n_stage; i++) {
        const ir_stage *s = &g->stage[i];
        bool ok = s->body >= 0 && s->body < s->n_expr;
        for (int e = 0; ok && e < s->n_expr; e++) {
            const ir_expr *x = &s->expr[e];
            if (x->kind == IR_E_UNARY) ok = x->a >= 0 && x->a < e;
            if (x->kind == IR_E_BINARY || x->kind == IR_E_SELECT)
                ok = x->a >= 0 && x->a < e && x->b >= 0 && x->b < e;
        }
        if (!ok)
            return tlm_err_set(err, TLM_ELIMIT, "", "internal: stage %s is malformed", s->name);
    }
    g->output = g->stage[g->n_stage - 1].out;
    return 0;
}

/* ---- queries ---- */

int64_t ir_tensor_numel(const ir_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int ir_subgraph_inputs(const ir_subgraph *g, int idx[IR_MAX_TENSORS])
{
    int n = 0;
    for (int i = 0; i < g->n_tensor; i++)
        if (g->tensor[i].kind == IR_T_INPUT) idx[n++] = i;
    return n;
}

/* Whether expression x loads tensor t at exactly the output point of its stage: the
 * same shape as the output, each dim indexed by its own spatial axis */
static bool loads_at_point(const ir_subgraph *g, const ir_expr *x, int t)
{
    const ir_tensor *o = &g->tensor[g->output], *in = &g->tensor[t];
    if (in->ndim != o->ndim || in->dtype != o->dtype) return false;
    for (int d = 0; d < in->ndim; d++) {
        if (in->shape[d] != o->shape[d] || x->idx[d].off != 0) return false;
        for (int ax = 0; ax < IR_MAX_AXES; ax++)
            if (x->idx[d].coef[ax] != (ax == d)) return false;
    }
    return true;
}

int ir_subgraph_inplace_input(const ir_subgraph *g)
{
    /* not a depthwise conv: its row blocks may overlap the one before (a short row's last
     * vector), recomputing points already written, the residual there read again */
    switch (g->wl.op) {
    case IR_OP_DENSE:
    case IR_OP_BATCH_MATMUL:
    case IR_OP_CONV2D:
        break;
    default:
        return -1;
    }
    int in[IR_MAX_TENSORS];
    const int n = ir_subgraph_inputs(g, in);
    for (int a = 0; a < n; a++) {
        bool read = false, elsewhere = false;
        for (int s = 0; s < g->n_stage && !elsewhere; s++) {
            const ir_stage *st = &g->stage[s];
            for (int e = 0; e < st->n_expr; e++) {
                const ir_expr *x = &st->expr[e];
                if (x->kind != IR_E_LOAD || x->tensor != in[a]) continue;
                if (s <= g->anchor || st->n_reduce || !loads_at_point(g, x, in[a])) {
                    elsewhere = true;
                    break;
                }
                read = true;
            }
        }
        if (read && !elsewhere) return a;
    }
    return -1;
}

int64_t ir_stage_points(const ir_stage *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->n_spatial + s->n_reduce; i++) n *= s->extent[i];
    return n;
}

static int64_t expr_ops(const ir_stage *s, int id)
{
    if (id < 0) return 0;
    const ir_expr *e = &s->expr[id];
    switch (e->kind) {
    case IR_E_UNARY: return 1 + expr_ops(s, e->a);
    case IR_E_BINARY: return 1 + expr_ops(s, e->a) + expr_ops(s, e->b);
    case IR_E_SELECT: return expr_ops(s, e->a) + expr_ops(s, e->b);
    default: return 0;
    }
}

int64_t ir_subgraph_flops(const ir_subgraph *g)
{
    int64_t total = 0;
    for (int i = 0; i < g->n_stage; i++) {
        const ir_stage *s = &g->stage[i];
        int64_t per = expr_ops(s, s->body) + (s->reduce != IR_RED_NONE ? 1 : 0);
        total += per * ir_stage_points(s);
        if (s->post_scale != 1.0) {
            int64_t sp = 1;
            for (int a = 0; a < s->n_spatial; a++) sp *= s->extent[a];
            total += sp;
        }
    }
    return total;
}

int64_t ir_subgraph_bytes(const ir_subgraph *g)
{
    int64_t total = 0;
    for (int i = 0; i < g->n_tensor; i++) {
        const ir_tensor *t = &g->tensor[i];
        if (t->kind != IR_T_TEMP) total += ir_tensor_numel(t) * (int64_t)ir_dtype_size(t->dtype);
    }
    return total;
}

/* ---- scalar semantics ---- */

double ir_unop_eval(ir_unop op, double x)
{
    switch (op) {
    case IR_U_NEG: return -x;
    case IR_U_EXP: return exp(x);
    case IR_U_SQRT: return sqrt(x);
    case IR_U_RSQRT: return 1.0 / sqrt(x);
    case IR_U_RECIP: return 1.0 / x;
    case IR_U_RELU: return x > 0 ? x : 0;
    case IR_U_RELU6: return x < 0 ? 0 : (x > 6 ? 6 : x);
    case IR_U_GELU: return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
    case IR_U_SILU: return x / (1.0 + exp(-x));
    case IR_U_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case IR_U_TANH: return tanh(x);
    default: return NAN;
    }
}

double ir_binop_eval(ir_binop op, double x, double y)
{
    switch (op) {
    case IR_B_ADD: return x + y;
    case IR_B_SUB: return x - y;
    case IR_B_MUL: return x * y;
    case IR_B_DIV: return x / y;
    case IR_B_MAX: return x > y ? x : y;
    case IR_B_MIN: return x < y ? x : y;
    default: return NAN;
    }
}

const char *ir_unop_name(ir_unop op)
{
    static const char *n[IR_U_COUNT] = {"neg",  "exp",  "sqrt", "rsqrt",   "recip", "relu",
                                        "relu6", "gelu", "silu", "sigmoid", "tanh"};
    return (unsigned)op < IR_U_COUNT ? n[op] : "?";
}

const char *ir_binop_name(ir_binop op)
{
    static const char *n[IR_B_COUNT] = {"add", "sub", "mul", "div", "max", "min"};
    return (unsigned)op < IR_B_COUNT ? n[op] : "?";
}

/* ---- printing ---- */

typedef struct {
    char *p;
    size_t cap, len;
} pbuf;

static void pb(pbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pb(pbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t off = b->len < b->cap ? b->len : b->cap;
    int n = vsnprintf(b->p + off, b->cap - off, fmt, ap);
    va_end(ap);
    if (n > 0) b->len += (size_t)n;
}

static void print_affine(pbuf *b, const ir_stage *s, const ir_affine *a)
{
    bool any = false;
    for (int i = 0; i < s->n_spatial + s->n_reduce; i++) {
        if (!a->coef[i]) continue;
        if (any) pb(b, " + ");
        if (a->coef[i] != 1) pb(b, "%d*", a->coef[i]);
        pb(b, "%s", s->axis[i]);
        any = true;
    }
    if (a->off || !any) pb(b, any ? " %c %lld" : "%c%lld", a->off < 0 ? '-' : '+',
                          (long long)(a->off < 0 ? -a->off : a->off));
}

static void print_expr(pbuf *b, const ir_subgraph *g, const ir_stage *s, int id)
{
    const ir_expr *e = &s->expr[id];
    switch (e->kind) {
    case IR_E_CONST: pb(b, "%g", e->value); break;
    case IR_E_LOAD:
        pb(b, "%s[", g->tensor[e->tensor].name);
        for (int d = 0; d < g->tensor[e->tensor].ndim; d++) {
            if (d) pb(b, ", ");
            print_affine(b, s, &e->idx[d]);
        }
        pb(b, "]");
        break;
    case IR_E_UNARY:
        pb(b, "%s(", ir_unop_name((ir_unop)e->op));
        print_expr(b, g, s, e->a);
        pb(b, ")");
        break;
    case IR_E_BINARY:
        pb(b, "%s(", ir_binop_name((ir_binop)e->op));
        print_expr(b, g, s, e->a);
        pb(b, ", ");
        print_expr(b, g, s, e->b);
        pb(b, ")");
        break;
    case IR_E_SELECT:
        pb(b, "select(");
        for (int i = 0; i < e->ncond; i++) {
            if (i) pb(b, " && ");
            pb(b, "0 <= ");
            print_affine(b, s, &e->cond[i]);
            pb(b, " < %lld", (long long)e->cond_hi[i]);
        }
        pb(b, ", ");
        print_expr(b, g, s, e->a);
        pb(b, ", ");
        print_expr(b, g, s, e->b);
        pb(b, ")");
        break;
    }
}

int ir_subgraph_print(const ir_subgraph *g, char *buf, size_t cap)
{
    pbuf b = {buf, cap, 0};
    if (cap) buf[0] = 0;
    static const char *kinds[] = {"input", "temp", "output"};
    for (int i = 0; i < g->n_tensor; i++) {
        const ir_tensor *t = &g->tensor[i];
        pb(&b, "%-6s %-9s %s[", kinds[t->kind], t->name, ir_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) pb(&b, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        pb(&b, "]\n");
    }
    static const char *roles[] = {"prologue", "anchor", "epilogue"};
    static const char *reds[] = {"", "sum", "max"};
    for (int i = 0; i < g->n_stage; i++) {
        const ir_stage *s = &g->stage[i];
        pb(&b, "stage %s (%s): %s[", s->name, roles[s->role], g->tensor[s->out].name);
        for (int a = 0; a < s->n_spatial; a++) pb(&b, "%s%s", a ? ", " : "", s->axis[a]);
        pb(&b, "] = ");
        if (s->reduce != IR_RED_NONE) {
            if (s->post_scale != 1.0) pb(&b, "%.9g * ", s->post_scale);
            pb(&b, "%s over (", reds[s->reduce]);
            for (int a = s->n_spatial; a < s->n_spatial + s->n_reduce; a++)
                pb(&b, "%s%s", a > s->n_spatial ? ", " : "", s->axis[a]);
            pb(&b, ") of ");
        }
        print_expr(&b, g, s, s->body);
        pb(&b, "    ; extents");
        for (int a = 0; a < s->n_spatial + s->n_reduce; a++)
            pb(&b, " %s=%lld", s->axis[a], (long long)s->extent[a]);
        pb(&b, "\n");
    }
    return (int)(b.len < cap ? b.len : (cap ? cap - 1 : 0));
}
