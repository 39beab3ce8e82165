/* lang.c — vocabulary, prompt/decision encoding, grammar masks. */
#include "compiler/lang/lang.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "compiler/util/util.h"

#define MAX_TOKENS 8192
#define NAME_LEN 32

static char vocab[MAX_TOKENS][NAME_LEN];
static int n_vocab;
static pthread_once_t vocab_once = PTHREAD_ONCE_INIT;

/* First ids of the token ranges. */
static int tok_small, tok_digit, tok_slot_tile, tok_slot_other;

static const char *slot_other_names[] = {"parallel", "vectorize", "unroll",   "rows",
                                         "threads",  "stage",     "vec_load", "pack",
                                         "warp_m",   "warp_n",    "warps_m",  "warps_n",
                                         "block_k",  "pipeline",  "swizzle"};
static const space_slot_kind slot_other_kinds[] = {
    SLOT_PARALLEL, SLOT_VECTORIZE, SLOT_UNROLL,  SLOT_ROWS,    SLOT_THREADS,
    SLOT_STAGE,    SLOT_VEC_LOAD,  SLOT_PACK,    SLOT_WARP_M,  SLOT_WARP_N,
    SLOT_WARPS_M,  SLOT_WARPS_N,   SLOT_BLOCK_K, SLOT_PIPELINE, SLOT_SWIZZLE};
_Static_assert(sizeof slot_other_names / sizeof slot_other_names[0] ==
                   sizeof slot_other_kinds / sizeof slot_other_kinds[0],
               "one token name per non-tile slot kind");
_Static_assert(sizeof slot_other_kinds / sizeof slot_other_kinds[0] == SLOT_KIND_COUNT - 1,
               "every non-tile slot kind has a token");
static const int sms[] = {70, 75, 80, 86, 89, 90};
static const char *quantities[] = {"cores", "lanes", "vregs", "l1_kib", "l2_kib",  "l3_kib",
                                   "sms",   "smem_kib", "regs_k", "threads", "stride", "pad",
                                   "dilation", "groups"};

static void add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void add(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(vocab[n_vocab++], NAME_LEN, fmt, ap);
    va_end(ap);
}

static void build_vocab(void)
{
    add("[PAD]");
    add("[BOS]");
    add("[SEP]");
    add("[EOS]");
    add("[NUM]");
    tok_small = n_vocab;
    for (int v = 0; v < LANG_SMALL; v++) add("N_%d", v);
    tok_digit = n_vocab;
    for (int d = 0; d < 64; d++) add("D_%d", d);
    add("tgt:cpu");
    add("tgt:cuda");
    for (int b = 0; b < TARGET_ISA_COUNT; b++) add("isa:%s", target_isa_name(1u << b));
    for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++) add("sm:%d", sms[i]);
    for (size_t i = 0; i < sizeof quantities / sizeof quantities[0]; i++) add("q:%s", quantities[i]);
    for (int o = 0; o < IR_OP_COUNT; o++) add("op:%s", ir_op_get((ir_op)o)->name);
    for (int d = 0; d < IR_DTYPE_COUNT; d++) add("dtype:%s", ir_dtype_name((ir_dtype)d));
    for (int l = 0; l < IR_LAYOUT_COUNT; l++) add("layout:%s", ir_layout_name((ir_layout)l));
    for (int e = 0; e < IR_EPI_COUNT; e++) add("epi:%s", ir_epilogue_name((ir_epilogue)e));
    add("attr:transpose_a");
    add("attr:transpose_b");
    add("ax:s");
    add("ax:r");
    for (int s = 0; s < SKETCH_COUNT; s++) add("sketch:%s", space_sketch_name((space_sketch)s));
    tok_slot_tile = n_vocab;
    for (int a = 0; a < IR_MAX_AXES; a++)
        for (int l = 1; l <= 4; l++) add("slot:tile.a%d.l%d", a, l);
    tok_slot_other = n_vocab;
    for (size_t i = 0; i < sizeof slot_other_names / sizeof slot_other_names[0]; i++)
        add("slot:%s", slot_other_names[i]);
}

static void ensure(void)
{
    pthread_once(&vocab_once, build_vocab);
}

int lang_vocab_size(void)
{
    ensure();
    return n_vocab;
}

const char *lang_token_name(int id)
{
    ensure();
    return id >= 0 && id < n_vocab ? vocab[id] : NULL;
}

int lang_token_id(const char *name)
{
    ensure();
    for (int i = 0; name && i < n_vocab; i++)
        if (strcmp(vocab[i], name) == 0) return i;
    return -1;
}

void lang_vocab_hash(uint8_t out[32])
{
    ensure();
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned len = 0;
    char head[64];
    int n = snprintf(head, sizeof head, "tlm-vocab-v%d\n", LANG_VERSION);
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    EVP_DigestUpdate(ctx, head, (size_t)n);
    for (int i = 0; i < n_vocab; i++) {
        EVP_DigestUpdate(ctx, vocab[i], strlen(vocab[i]));
        EVP_DigestUpdate(ctx, "\n", 1);
    }
    EVP_DigestFinal_ex(ctx, out, &len);
    EVP_MD_CTX_free(ctx);
}

void lang_vocab_hash_hex(char out[65])
{
    uint8_t h[32];
    lang_vocab_hash(h);
    tlm_hex(h, 32, out);
}

int lang_encode_int(int64_t v, int *toks, int cap)
{
    ensure();
    if (v < 0 || v >= (INT64_C(1) << (6 * LANG_DIGITS))) return TLM_EINVAL;
    if (v < LANG_SMALL) {
        if (cap < 1) return TLM_ELIMIT;
        toks[0] = tok_small + (int)v;
        return 1;
    }
    if (cap < 1 + LANG_DIGITS) return TLM_ELIMIT;
    toks[0] = LANG_NUM;
    for (int d = 0; d < LANG_DIGITS; d++)
        toks[1 + d] = tok_digit + (int)((v >> (6 * (LANG_DIGITS - 1 - d))) & 63);
    return 1 + LANG_DIGITS;
}

/* ---- prompt ---- */

typedef struct {
    int *t;
    int n, cap, rc;
} tbuf;

static void put(tbuf *b, int tok)
{
    if (b->n >= b->cap) {
        b->rc = TLM_ELIMIT;
        return;
    }
    b->t[b->n++] = tok;
}

static void put_name(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_name(tbuf *b, const char *fmt, ...)
{
    char nm[NAME_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nm, sizeof nm, fmt, ap);
    va_end(ap);
    int id = lang_token_id(nm);
    if (id < 0) {
        b->rc = TLM_EINVAL;
        return;
    }
    put(b, id);
}

static void put_int(tbuf *b, int64_t v)
{
    if (v < 0) v = 0;
    if (v >= (INT64_C(1) << 36)) v = (INT64_C(1) << 36) - 1;
    int k = lang_encode_int(v, b->t + b->n, b->cap - b->n);
    if (k < 0) b->rc = k;
    else b->n += k;
}

static void put_q(tbuf *b, const char *q, int64_t v)
{
    put_name(b, "q:%s", q);
    put_int(b, v);
}

static int slot_token(const space_slot *s)
{
    if (s->kind == SLOT_TILE) return tok_slot_tile + s->axis * 4 + (s->level - 1);
    for (size_t i = 0; i < sizeof slot_other_kinds / sizeof slot_other_kinds[0]; i++)
        if (slot_other_kinds[i] == s->kind) return tok_slot_other + (int)i;
    return -1;
}

int lang_encode_prompt(const space *sp, int *toks, int cap)
{
    ensure();
    tbuf b = {toks, 0, cap, 0};
    const target *t = &sp->tgt;
    const ir_workload *w = &sp->g->wl;
    put(&b, LANG_BOS);
    if (t->kind == TARGET_CPU) {
        put_name(&b, "tgt:cpu");
        for (int i = 0; i < TARGET_ISA_COUNT; i++)
            if (t->cpu.isa & (1u << i)) put_name(&b, "isa:%s", target_isa_name(1u << i));
        put_q(&b, "cores", t->cpu.cores);
        put_q(&b, "lanes", t->cpu.vector_lanes);
        put_q(&b, "vregs", t->cpu.vector_registers);
        put_q(&b, "l1_kib", t->cpu.l1d_bytes / 1024);
        put_q(&b, "l2_kib", t->cpu.l2_bytes / 1024);
        put_q(&b, "l3_kib", t->cpu.l3_bytes / 1024);
    } else {
        put_name(&b, "tgt:cuda");
        int sm = t->gpu.sm;
        int best = sms[0];
        for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++)
            if (sms[i] <= sm) best = sms[i];
        put_name(&b, "sm:%d", best);
        put_q(&b, "sms", t->gpu.sm_count);
        put_q(&b, "smem_kib", t->gpu.smem_per_block / 1024);
        put_q(&b, "regs_k", t->gpu.regs_per_sm / 1024);
        put_q(&b, "threads", t->gpu.max_threads_per_block);
    }
    put_name(&b, "op:%s", ir_op_get(w->op)->name);
    put_name(&b, "dtype:%s", ir_dtype_name(w->dtype));
    unsigned f = ir_op_get(w->op)->fields;
    if (f & IR_F_LAYOUT) put_name(&b, "layout:%s", ir_layout_name(w->layout));
    if ((f & IR_F_TRANSPOSE) && w->transpose_a) put_name(&b, "attr:transpose_a");
    if ((f & IR_F_TRANSPOSE) && w->transpose_b) put_name(&b, "attr:transpose_b");
    if (f & IR_F_STRIDE) put_q(&b, "stride", w->stride[1]);
    if (f & IR_F_PAD) put_q(&b, "pad", w->pad[1]);
    if (f & IR_F_DILATION) put_q(&b, "dilation", w->dilation[1]);
    if (f & IR_F_GROUPS) put_q(&b, "groups", w->groups);
    for (int i = 0; i < w->n_epilogue; i++) put_name(&b, "epi:%s", ir_epilogue_name(w->epilogue[i]));
    const ir_stage *a = &sp->g->stage[sp->g->anchor];
    for (int x = 0; x < a->n_spatial + a->n_reduce; x++) {
        put_name(&b, x < a->n_spatial ? "ax:s" : "ax:r");
        put_int(&b, a->extent[x]);
    }
    put_name(&b, "sketch:%s", space_sketch_name(sp->sketch));
    put(&b, LANG_SEP);
    return b.rc ? b.rc : b.n;
}

static int64_t hint_value(lang_state *st);

int lang_encode_decisions(const space *sp, const space_sched *s, int *toks, int cap)
{
    ensure();
    tbuf b = {toks, 0, cap, 0};
    lang_state st; /* only for its hints: the same completions the grammar walks */
    memset(&st, 0, sizeof st);
    st.sp = sp;
    st.partial = *s;
    for (int i = 0; i < sp->n_slot; i++) {
        st.slot = i;
        put(&b, slot_token(&sp->slot[i]));
        put_int(&b, hint_value(&st));
        put_int(&b, s->v[i]);
    }
    put(&b, LANG_EOS);
    return b.rc ? b.rc : b.n;
}

int lang_sentence_text(const int *toks, int n, char *buf, size_t cap)
{
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = lang_token_name(toks[i]);
        int k = snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0, "%s%s",
                         i ? " " : "", nm ? nm : "?");
        if (k > 0) len += (size_t)k;
    }
    return (int)len;
}

/* ---- grammar state ---- */

int lang_state_init(lang_state *st, const space *sp)
{
    ensure();
    memset(st, 0, sizeof *st);
    st->sp = sp;
    st->want_slot = true;
    st->vals = malloc(sizeof(int64_t) * SPACE_MAX_VALUES);
    return st->vals ? 0 : TLM_ENOMEM;
}

void lang_state_reset(lang_state *st)
{
    int64_t *vals = st->vals;
    const space *sp = st->sp;
    space_sched d = st->dflt, g = st->dflt_given;
    int dn = st->dflt_n;
    bool ok = st->dflt_ok;
    memset(st, 0, sizeof *st);
    st->sp = sp;
    st->vals = vals;
    st->want_slot = true;
    st->dflt = d, st->dflt_given = g, st->dflt_n = dn, st->dflt_ok = ok;
}

/* The rule of thumb's value for the current slot after the decisions so far: the cached
 * completion while the decisions since it was made are its own, else a new one. */
static int64_t hint_value(lang_state *st)
{
    int i = st->slot;
    bool ok = st->dflt_ok && st->dflt_n <= i &&
              !memcmp(st->dflt_given.v, st->partial.v, sizeof(int64_t) * (size_t)st->dflt_n);
    for (int j = st->dflt_n; j < i && ok; j++) ok = st->partial.v[j] == st->dflt.v[j];
    if (!ok) {
        st->partial.n = i;
        space_default_given(st->sp, &st->partial, i, &st->dflt);
        st->dflt_given = st->partial;
        st->dflt_n = i;
        st->dflt_ok = true;
    }
    return st->dflt.v[i];
}

bool lang_state_in_value(const lang_state *st)
{
    return !st->done && st->slot < st->sp->n_slot && !st->want_slot && st->hint_pos >= st->nhint;
}

void lang_state_free(lang_state *st)
{
    free(st->vals);
    st->vals = NULL;
}

static void load_values(lang_state *st)
{
    st->partial.n = st->slot;
    st->nvals = space_legal_values(st->sp, st->slot, &st->partial, st->vals);
    if (st->nvals < 0) st->nvals = 0;
}

/* Calls fn for each legal value whose encoding extends the current prefix. */
static int next_tokens(const lang_state *st, uint64_t *mask, int *only, int64_t *complete)
{
    int count = 0, last = -1;
    *complete = -1;
    for (int i = 0; i < st->nvals; i++) {
        int enc[LANG_MAX_VALUE_TOKENS];
        int k = lang_encode_int(st->vals[i], enc, LANG_MAX_VALUE_TOKENS);
        if (k <= st->nprefix) {
            if (k == st->nprefix && memcmp(enc, st->prefix, sizeof(int) * (size_t)k) == 0)
                *complete = st->vals[i];
            continue;
        }
        if (memcmp(enc, st->prefix, sizeof(int) * (size_t)st->nprefix) != 0) continue;
        int t = enc[st->nprefix];
        if (mask && !(mask[t / 64] & (1ull << (t % 64)))) {
            mask[t / 64] |= 1ull << (t % 64);
            count++;
            last = t;
        } else if (!mask && t != last) {
            count++;
            last = t;
        }
    }
    *only = last;
    return count;
}

int lang_state_next(lang_state *st, uint64_t *mask)
{
    if (st->done) return -2;
    if (st->slot == st->sp->n_slot) return LANG_EOS;
    if (st->want_slot) return slot_token(&st->sp->slot[st->slot]);
    if (st->hint_pos < st->nhint) return st->hint[st->hint_pos];
    int words = (lang_vocab_size() + 63) / 64;
    memset(mask, 0, sizeof(uint64_t) * (size_t)words);
    int only;
    int64_t complete;
    int n = next_tokens(st, mask, &only, &complete);
    if (n == 1) return only;
    return -1;
}

int lang_state_push(lang_state *st, int token)
{
    if (st->done) return TLM_EINVAL;
    if (st->slot == st->sp->n_slot) {
        if (token != LANG_EOS) return TLM_EINVAL;
        st->done = true;
        return 0;
    }
    if (st->want_slot) {
        if (token != slot_token(&st->sp->slot[st->slot])) return TLM_EINVAL;
        st->want_slot = false;
        st->nprefix = 0;
        int k = lang_encode_int(hint_value(st), st->hint, LANG_MAX_VALUE_TOKENS);
        st->nhint = k > 0 ? k : 0;
        st->hint_pos = 0;
        load_values(st);
        return 0;
    }
    if (st->hint_pos < st->nhint) {
        if (token != st->hint[st->hint_pos]) return TLM_EINVAL;
        st->hint_pos++;
        return 0;
    }
    if (st->nprefix >= LANG_MAX_VALUE_TOKENS) return TLM_EINVAL;
    st->prefix[st->nprefix++] = token;
    int only;
    int64_t complete;
    int n = next_tokens(st, NULL, &only, &complete);
    if (complete >= 0) {
        st->partial.v[st->slot] = complete;
        st->slot++;
        st->partial.n = st->slot;
        st->want_slot = true;
        st->nprefix = 0;
        return 0;
    }
    if (n == 0) { /* the token led nowhere: undo */
        st->nprefix--;
        return TLM_EINVAL;
    }
    return 0;
}

int lang_decode_decisions(const space *sp, const int *toks, int n, space_sched *out,
                          tlm_error *err)
{
    lang_state st;
    if (lang_state_init(&st, sp)) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (lang_state_push(&st, toks[i])) {
            const char *nm = lang_token_name(toks[i]);
            rc = tlm_err_set(err, TLM_EINVAL,
                             st.slot < sp->n_slot ? sp->slot[st.slot].name : "sentence",
                             "token %d (%s) is not allowed here", i, nm ? nm : "?");
        }
    }
    if (rc == 0 && !st.done)
        rc = tlm_err_set(err, TLM_EINVAL, "sentence", "the sentence ends early (at slot %d of %d)",
                         st.slot, sp->n_slot);
    if (rc == 0) {
        *out = st.partial;
        out->n = sp->n_slot;
        rc = space_check(sp, out, err);
    }
    lang_state_free(&st);
    return rc;
}
