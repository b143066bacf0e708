/* The compiled fast path of a recorded reserve: parse one call's tensor lines, plan the graph as ggml-head's
 * gallocr does (allocator/gallocr.py, dyn_tallocr.py), and lay the events out as the store's columns
 * (traces/store/columns.py: encode_arrays), byte for byte.
 *
 * Anything outside what it covers (a line it does not read exactly as the Python reader would, a value out of
 * range, a tensor it cannot find) makes it decline: rf_reserve returns -1 and rf_reason says why, and the
 * caller replays the call on the Python path. tests/record/test_replay_fast.py compares both paths.
 *
 * Built by traces/util/cbuild.py with the system C compiler; loaded through ctypes (plans_fast.py).
 *
 * Its length: it is one pipeline over one call's state (St): the tensor lines parsed, the walk and the dynamic
 * allocator it calls, the column encoder and the shapes, each section mirroring one Python module, in the order
 * a call goes through them. Split into files, every part would need the same structs and helpers declared again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_CHUNKS 16
#define I64_MAX INT64_MAX
#define HALF_SIZE_MAX INT64_MAX /* SIZE_MAX // 2 */

enum { F_GRAPH, F_SIZE, F_OFFSET, F_ADDR, F_CHUNK, F_BUFFER, F_BLOCK, F_N_FREE, F_LARGEST_FREE, F_TOTAL_FREE,
       F_N_FREE_BEFORE, F_CHILDREN, F_VIEWS, F_ALLOCATED, F_NEEDED, F_LARGEST, F_NODE, N_INT };
enum { S_KIND, S_TENSOR, S_OP, S_PARENT, S_VIEW_SRC, S_REASON, N_STR };
#define N_COLS (N_INT + N_STR + 2) /* + srcs, extra */

typedef struct { const char *p; int64_t n; } Str;

typedef struct {
    int64_t v[N_INT];
    uint32_t has;     /* bit per int field */
    Str s[N_STR];     /* p NULL: missing */
    int32_t srcs;     /* exec: the node whose source names it lists; -1: none */
    int64_t from;     /* buffer: extra {"from": N} */
    int has_from;
} Ev;

typedef struct {
    char kind;
    uint64_t ptr, view_src_ptr;
    Str type, op, desc, name;
    int64_t flags, ne[4], nb[4], nbytes, data, buffer;
    int32_t n_src;
    int64_t src_at;   /* into St.srcs */
    int32_t n_sizes;
    int64_t size_at;  /* into St.sizes */
    int32_t view_src; /* tensor index, -1 none */
    int inplace;
    /* the hash node */
    int64_t children, views, buffer_id, chunk, offset;
    int allocated;
} T;

typedef struct { int64_t *off, *size; int64_t n, cap, max_size; } Chunk;
typedef struct { Chunk ch[MAX_CHUNKS]; int n; int64_t alignment, max_chunk; } Dyn;

typedef struct {
    /* input */
    int64_t n_bufs, max_free_blocks, graph, no_alloc;
    int64_t *alignment, *max_chunk, *owner;
    Str *buft_name;
    /* parsed */
    T *t; int64_t nt;
    int32_t *srcs; int64_t n_srcs;
    int64_t *sizes; int64_t n_sizes;
    int32_t *nodes, *leafs; int64_t n_nodes, n_leafs;
    char *names; int64_t names_len; /* unescaped names */
    Dyn dyn[64];
    /* events */
    Ev *ev; int64_t n_ev, cap_ev;
    int64_t node; /* the node being processed, -1: none */
    /* failure */
    int failed; /* 0 none, 1 oom, 2 abort */
    int64_t fail_event;
    /* output */
    char *cols[N_COLS]; int64_t col_len[N_COLS]; int32_t itemsize[N_COLS];
    char *table; int64_t table_len, table_cap;
    char *shapes; int64_t shapes_len, shapes_cap;
    int64_t *state; int64_t state_len; /* per buffer: n chunks (-1 None), sizes...; then dyns; then plan */
    char reason[200];
    int oom_memory;
} St;

static int decline(St *st, const char *why) {
    if (!st->reason[0]) snprintf(st->reason, sizeof st->reason, "%s", why);
    return -1;
}

static void *grow(St *st, void *p, int64_t *cap, int64_t need, size_t elem) {
    if (p && need <= *cap) return p;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    if (!q) { st->oom_memory = 1; return NULL; }
    *cap = c;
    return q;
}

/* ---------- parsing one tensor line, as stream.parse_tensor reads it ---------- */

static int dec(const char *s, int64_t n, int64_t *out) { /* [-]digits, what int() gives for them */
    int64_t i = 0, neg = 0;
    uint64_t v = 0;
    if (n > 0 && s[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 18) return 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

static int ptr_tok(const char *s, int64_t n, uint64_t *out) { /* stream._int: 0x..., (nil) or decimal */
    if (n == 5 && memcmp(s, "(nil)", 5) == 0) { *out = 0; return 1; }
    if (n >= 3 && s[0] == '0' && s[1] == 'x') {
        if (n - 2 > 16) return 0;
        uint64_t v = 0;
        for (int64_t i = 2; i < n; i++) {
            char c = s[i];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                    c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return 0;
            v = v * 16 + (uint64_t)d;
        }
        *out = v;
        return 1;
    }
    int64_t v;
    if (!dec(s, n, &v) || v < 0) return 0;
    *out = (uint64_t)v;
    return 1;
}

/* the name (the rest of the line), unescaped as stream._unescape does, into St.names */
static int put_name(St *st, const char *s, int64_t n, Str *out, int64_t *cap) {
    char *buf = grow(st, st->names, cap, st->names_len + n + 1, 1);
    if (!buf) return 0;
    st->names = buf;
    int64_t at = st->names_len, k = at;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[i + 1];
            buf[k++] = c == 'n' ? '\n' : c == 'r' ? '\r' : c;
            i++;
        } else {
            buf[k++] = s[i];
        }
    }
    st->names_len = k;
    out->p = (const char *)(intptr_t)at; /* an offset until every name is in (the buffer may move) */
    out->n = k - at;
    return 1;
}

#define MAX_TOK (21 + 64 + 64)
/* the next field of s[0..n) from *i, split at single spaces as str.split(" ") does; 0 when none is left */
static int field(const char *s, int64_t n, int64_t *i, const char **tok, int64_t *len) {
    if (*i > n) return 0;
    int64_t j = *i;
    while (j < n && s[j] != ' ') j++;
    *tok = s + *i; *len = j - *i;
    *i = j + 1; /* past the end (n + 1) once the last field is taken */
    return 1;
}

static int parse_line(St *st, const char *s, int64_t n, T *t, int64_t *src_cap, int64_t *size_cap, int64_t *name_cap) {
    const char *tok[MAX_TOK]; int64_t len[MAX_TOK];
    int64_t nt = 0, i = 0;
    for (int64_t k = 0; k < n; k++)
        if ((unsigned char)s[k] >= 0x80) return decline(st, "a tensor line that is not ASCII");
    while (nt < 20 && field(s, n, &i, &tok[nt], &len[nt])) nt++;
    int64_t ns, nz;
    if (nt < 20 || !dec(tok[19], len[19], &ns) || ns < 0 || ns > 64) return decline(st, "a short tensor line or n_src");
    while (nt < 21 + ns && field(s, n, &i, &tok[nt], &len[nt])) nt++;
    if (nt < 21 + ns || !dec(tok[20 + ns], len[20 + ns], &nz) || nz < 0 || nz > 64) return decline(st, "n_sizes");
    while (nt < 21 + ns + nz && field(s, n, &i, &tok[nt], &len[nt])) nt++;
    if (nt < 21 + ns + nz) return decline(st, "fewer alloc sizes than the line says");
    t->n_sizes = (int32_t)nz;
    if (len[0] != 1) return decline(st, "tensor kind");
    t->kind = tok[0][0];
    if (!ptr_tok(tok[1], len[1], &t->ptr)) return decline(st, "tensor pointer");
    t->type = (Str){tok[2], len[2]};
    t->op = (Str){tok[3], len[3]};
    t->desc = (Str){tok[4], len[4]};
    int64_t v[10];
    for (int k = 0; k < 10; k++)
        if (!dec(tok[5 + k], len[5 + k], &v[k])) return decline(st, "a tensor number");
    t->flags = v[0];
    for (int k = 0; k < 4; k++) { t->ne[k] = v[1 + k]; t->nb[k] = v[5 + k]; }
    t->nbytes = v[9];
    uint64_t data, buffer, vs;
    if (!ptr_tok(tok[15], len[15], &data) || !ptr_tok(tok[16], len[16], &buffer) ||
        !ptr_tok(tok[17], len[17], &vs)) return decline(st, "a tensor pointer");
    if (data > (uint64_t)I64_MAX || buffer > (uint64_t)I64_MAX) return decline(st, "an address out of range");
    t->data = (int64_t)data; t->buffer = (int64_t)buffer; t->view_src_ptr = vs;
    int64_t view_offs;
    if (!dec(tok[18], len[18], &view_offs)) return decline(st, "view_offs");
    t->n_src = (int32_t)ns;
    t->src_at = st->n_srcs;
    int32_t *sp = grow(st, st->srcs, src_cap, st->n_srcs + ns, sizeof *sp);
    if (!sp) return -1;
    st->srcs = sp;
    for (int64_t k = 0; k < ns; k++) { /* pointers now, tensor indices once every line is in */
        uint64_t p;
        if (!ptr_tok(tok[20 + k], len[20 + k], &p)) return decline(st, "a source pointer");
        st->srcs[st->n_srcs++] = -1;
        /* keep the pointer beside: reuse the sizes pool for it */
        int64_t *zp = grow(st, st->sizes, size_cap, st->n_sizes + 1, sizeof *zp);
        if (!zp) return -1;
        st->sizes = zp;
        st->sizes[st->n_sizes++] = (int64_t)p;
    }
    t->size_at = st->n_sizes;
    int64_t *zp = grow(st, st->sizes, size_cap, st->n_sizes + t->n_sizes, sizeof *zp);
    if (!zp) return -1;
    st->sizes = zp;
    for (int32_t k = 0; k < t->n_sizes; k++) {
        int64_t z;
        if (!dec(tok[21 + ns + k], len[21 + ns + k], &z)) return decline(st, "an alloc size");
        st->sizes[st->n_sizes++] = z;
    }
    if (!put_name(st, i <= n ? s + i : s + n, i <= n ? n - i : 0, &t->name, name_cap)) return -1;
    return 0;
}

/* ---------- a pointer -> tensor index map ---------- */

typedef struct { uint64_t key; int32_t val; } Slot;

static int64_t slot_of(Slot *tab, int64_t cap, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    int64_t i = (int64_t)(h >> 20) & (cap - 1);
    while (tab[i].val >= 0 && tab[i].key != key) i = (i + 1) & (cap - 1);
    return i;
}

static int str_eq(Str a, Str b) { return a.n == b.n && memcmp(a.p, b.p, (size_t)a.n) == 0; }
static int str_is(Str a, const char *lit) { int64_t m = (int64_t)strlen(lit); return a.n == m && memcmp(a.p, lit, (size_t)m) == 0; }

/* ---------- ggml-head's dynamic allocator (dyn_tallocr.py) ---------- */

static int64_t pad(int64_t size, int64_t a) { return (size + a - 1) / a * a; }

static int chunk_insert(St *st, Chunk *c, int64_t pos, int64_t off, int64_t size) {
    if (c->n + 1 > c->cap) {
        int64_t cap = c->cap ? c->cap * 2 : 8;
        int64_t *o = realloc(c->off, (size_t)cap * 8), *s;
        if (!o) { st->oom_memory = 1; return 0; }
        c->off = o;
        s = realloc(c->size, (size_t)cap * 8);
        if (!s) { st->oom_memory = 1; return 0; }
        c->size = s;
        c->cap = cap;
    }
    memmove(c->off + pos + 1, c->off + pos, (size_t)(c->n - pos) * 8);
    memmove(c->size + pos + 1, c->size + pos, (size_t)(c->n - pos) * 8);
    c->off[pos] = off; c->size[pos] = size; c->n++;
    return 1;
}

static void chunk_delete(Chunk *c, int64_t pos) {
    memmove(c->off + pos, c->off + pos + 1, (size_t)(c->n - pos - 1) * 8);
    memmove(c->size + pos, c->size + pos + 1, (size_t)(c->n - pos - 1) * 8);
    c->n--;
}

static int new_chunk(St *st, Dyn *d, int64_t min_size) {
    if (d->n >= MAX_CHUNKS) return -1;
    int64_t size = min_size > d->max_chunk ? min_size : d->max_chunk;
    if (d->n == MAX_CHUNKS - 1) size = HALF_SIZE_MAX;
    Chunk *c = &d->ch[d->n];
    c->n = 0; c->max_size = 0;
    if (!chunk_insert(st, c, 0, 0, size)) return -2;
    return d->n++;
}

/* 0: placed; 1: out of space (needed, largest set); -2: out of memory */
static int dyn_alloc(St *st, Dyn *d, int64_t nbytes, int64_t *chunk, int64_t *block, int64_t *off,
                     int64_t *needed, int64_t *largest) {
    int64_t size = pad(nbytes, d->alignment);
    int64_t best_chunk = -1, best_block = -1, max_avail = 0;
    for (int c = 0; c < d->n; c++) {
        Chunk *ch = &d->ch[c];
        int64_t best_fit = INT64_MAX; /* SIZE_MAX: no block is that large */
        for (int64_t i = 0; i + 1 < ch->n; i++) {
            int64_t s = ch->size[i];
            if (s > max_avail) max_avail = s;
            if (size <= s && s <= best_fit) { best_chunk = c; best_block = i; best_fit = s; }
        }
    }
    if (best_block == -1) {
        int have = 0;
        __int128 best_reuse = 0;
        for (int c = 0; c < d->n; c++) {
            Chunk *ch = &d->ch[c];
            if (!ch->n) continue;
            int64_t last = ch->n - 1;
            if (ch->size[last] > max_avail) max_avail = ch->size[last];
            __int128 reuse = (__int128)ch->max_size - ch->off[last] - size;
            int better = !have || (best_reuse < 0 && reuse > best_reuse) || (reuse >= 0 && reuse < best_reuse);
            if (ch->size[last] >= size && better) { best_chunk = c; best_block = last; best_reuse = reuse; have = 1; }
        }
    }
    if (best_block == -1) {
        int r = new_chunk(st, d, size);
        if (r == -2) return -2;
        best_chunk = r;
        best_block = 0;
    }
    if (best_chunk == -1) { *needed = size; *largest = max_avail; return 1; }
    Chunk *ch = &d->ch[best_chunk];
    int64_t o = ch->off[best_block];
    ch->off[best_block] += size;
    ch->size[best_block] -= size;
    if (ch->size[best_block] == 0) chunk_delete(ch, best_block);
    if (o + size > ch->max_size) ch->max_size = o + size;
    *chunk = best_chunk; *block = best_block; *off = o;
    return 0;
}

/* tallocr.release: 0 done, 1 out of free blocks, -2 out of memory */
static int dyn_free(St *st, Dyn *d, int64_t chunk, int64_t at, int64_t nbytes) {
    Chunk *c = &d->ch[chunk];
    int64_t size = pad(nbytes, d->alignment), n = c->n;
    for (int64_t i = 0; i < n; i++) {
        if (c->off[i] + c->size[i] == at) {
            c->size[i] += size;
            if (i < n - 1 && c->off[i] + c->size[i] == c->off[i + 1]) {
                c->size[i] += c->size[i + 1];
                chunk_delete(c, i + 1);
            }
            return 0;
        }
        if (at + size == c->off[i]) {
            c->off[i] = at;
            c->size[i] += size;
            if (i > 0 && c->off[i - 1] + c->size[i - 1] == c->off[i]) {
                c->size[i - 1] += c->size[i];
                chunk_delete(c, i);
            }
            return 0;
        }
    }
    if (n >= st->max_free_blocks) return 1;
    int64_t pos = 0;
    while (pos < n && c->off[pos] < at) pos++;
    return chunk_insert(st, c, pos, at, size) ? 0 : -2;
}

static void dyn_summary(Dyn *d, int64_t *nf, int64_t *largest, int64_t *total) {
    int64_t n = 0, lg = 0, tot = 0;
    for (int c = 0; c < d->n; c++) {
        Chunk *ch = &d->ch[c];
        if (!ch->n) continue;
        int64_t k = ch->n - 1;
        for (int64_t i = 0; i < k; i++) {
            n++;
            if (ch->size[i] > lg) lg = ch->size[i];
            tot += ch->size[i];
        }
        int64_t s = ch->max_size - ch->off[k];
        if (ch->size[k] < s) s = ch->size[k];
        if (s < 0) s = 0;
        if (s) { n++; if (s > lg) lg = s; tot += s; }
    }
    *nf = n; *largest = lg; *total = tot;
}

/* ---------- events ---------- */

static Ev *emit(St *st, const char *kind) {
    Ev *e = grow(st, st->ev, &st->cap_ev, st->n_ev + 1, sizeof *e);
    if (!e) return NULL;
    st->ev = e;
    e = &st->ev[st->n_ev++];
    memset(e, 0, sizeof *e);
    e->srcs = -1;
    e->s[S_KIND] = (Str){kind, (int64_t)strlen(kind)};
    e->v[F_GRAPH] = st->graph; e->has = 1u << F_GRAPH;
    if (st->node >= 0) { e->v[F_NODE] = st->node; e->has |= 1u << F_NODE; }
    return e;
}

static void set(Ev *e, int f, int64_t v) { e->v[f] = v; e->has |= 1u << f; }
static void set_buf(St *st, Ev *e, int64_t bid) { if (st->n_bufs > 1) set(e, F_BUFFER, st->owner[bid]); }

static int64_t alloc_size(St *st, T *t, int64_t bid) { return t->n_sizes ? st->sizes[t->size_at + bid] : t->nbytes; }
static Dyn *dyn_of(St *st, int64_t bid) { return &st->dyn[st->owner[bid]]; }

#define STOP 1
#define NOMEM (-2)
#define TRY(x) do { int r_ = (x); if (r_) return r_; } while (0)
#define EMIT(e, kind) Ev *e = emit(st, kind); if (!e) return NOMEM

static int alloc_bytes(St *st, T *t, int64_t bid) {
    Dyn *d = dyn_of(st, bid);
    t->buffer_id = bid;
    int64_t size = alloc_size(st, t, bid), chunk = 0, block = 0, off = 0, needed = 0, largest = 0;
    int r = dyn_alloc(st, d, size, &chunk, &block, &off, &needed, &largest);
    if (r == -2) return NOMEM;
    if (r == 1) {
        EMIT(e, "oom");
        e->s[S_TENSOR] = t->name; e->s[S_OP] = t->op;
        set(e, F_NEEDED, needed); set(e, F_LARGEST, largest); set_buf(st, e, bid);
        st->failed = 1; st->fail_event = st->n_ev - 1;
        return STOP;
    }
    t->chunk = chunk; t->offset = off;
    int64_t nf, lg, tot;
    dyn_summary(d, &nf, &lg, &tot);
    EMIT(e, "alloc");
    e->s[S_TENSOR] = t->name; e->s[S_OP] = t->op;
    set(e, F_SIZE, pad(size, d->alignment)); set(e, F_BLOCK, block); set(e, F_OFFSET, off); set(e, F_CHUNK, chunk);
    set_buf(st, e, bid); set(e, F_N_FREE, nf); set(e, F_LARGEST_FREE, lg); set(e, F_TOTAL_FREE, tot);
    return 0;
}

static int free_bytes(St *st, int64_t bid, int64_t chunk, int64_t off, int64_t nbytes, Str who) {
    int r = dyn_free(st, dyn_of(st, bid), chunk, off, nbytes);
    if (r == -2) return NOMEM;
    if (r == 1) {
        EMIT(e, "abort");
        e->s[S_TENSOR] = who;
        e->s[S_REASON] = (Str){"out of free blocks", 18};
        st->failed = 2; st->fail_event = st->n_ev - 1;
        return STOP;
    }
    return 0;
}

static int same_layout(T *a, T *b) {
    if (!str_eq(a->type, b->type)) return 0;
    for (int k = 0; k < 4; k++) if (a->ne[k] != b->ne[k] || a->nb[k] != b->nb[k]) return 0;
    return 1;
}

static int reuse(St *st, T *t, int *done) {
    *done = 0;
    for (int32_t k = 0; k < t->n_src; k++) {
        int32_t pi = st->srcs[t->src_at + k];
        if (pi < 0) continue;
        T *p = &st->t[pi];
        if (!p->allocated) {
            EMIT(e, "no_reuse");
            e->s[S_TENSOR] = t->name; e->s[S_PARENT] = p->name; e->s[S_REASON] = (Str){"external", 8};
            set(e, F_ADDR, p->data);
            continue;
        }
        if ((p->flags & 2) || (p->view_src >= 0 && (st->t[p->view_src].flags & 2))) {
            EMIT(e, "no_reuse");
            e->s[S_TENSOR] = t->name; e->s[S_PARENT] = p->name; e->s[S_REASON] = (Str){"output", 6};
            continue;
        }
        if (!same_layout(t, p)) {
            EMIT(e, "no_reuse");
            e->s[S_TENSOR] = t->name; e->s[S_PARENT] = p->name; e->s[S_REASON] = (Str){"layout", 6};
            continue;
        }
        if (p->children == 1 && p->views == 0) {
            EMIT(e, "reuse");
            e->s[S_TENSOR] = t->name; e->s[S_OP] = t->op; e->s[S_PARENT] = p->name;
            set(e, F_CHUNK, p->chunk); set(e, F_OFFSET, p->offset); set_buf(st, e, p->buffer_id);
            t->buffer_id = p->buffer_id; t->chunk = p->chunk; t->offset = p->offset;
            p->allocated = 0;
            *done = 1;
            /* the parent's unused tail goes back (free_extra) */
            int64_t align = dyn_of(st, p->buffer_id)->alignment;
            int64_t psize = pad(alloc_size(st, p, p->buffer_id), align);
            int64_t nsize = pad(alloc_size(st, t, t->buffer_id), align);
            if (psize > nsize) {
                EMIT(x, "free_extra");
                x->s[S_TENSOR] = t->name; x->s[S_PARENT] = p->name;
                set(x, F_SIZE, psize - nsize); set(x, F_CHUNK, p->chunk); set(x, F_OFFSET, p->offset + nsize);
                set_buf(st, x, p->buffer_id);
                TRY(free_bytes(st, p->buffer_id, p->chunk, p->offset + nsize, psize - nsize, t->name));
            }
            return 0;
        }
    }
    return 0;
}

static int allocate(St *st, int32_t ti, int64_t bid) {
    T *t = &st->t[ti];
    if (t->allocated || t->buffer || t->view_src >= 0 || t->data != 0) return 0;
    t->allocated = 1;
    if (t->inplace) {
        int done;
        TRY(reuse(st, t, &done));
        if (done) return 0;
    }
    return alloc_bytes(st, t, bid);
}

static int free_node(St *st, int32_t ti) {
    T *t = &st->t[ti];
    if (t->flags & 2) {
        EMIT(e, "not_freed");
        e->s[S_TENSOR] = t->name;
        return 0;
    }
    Dyn *d = dyn_of(st, t->buffer_id);
    int64_t size = alloc_size(st, t, t->buffer_id);
    EMIT(e, "free");
    int64_t at = st->n_ev - 1;
    e->s[S_TENSOR] = t->name; e->s[S_OP] = t->op;
    set(e, F_SIZE, size); set(e, F_CHUNK, t->chunk); set(e, F_OFFSET, t->offset);
    set(e, F_N_FREE_BEFORE, d->ch[t->chunk].n); set_buf(st, e, t->buffer_id);
    TRY(free_bytes(st, t->buffer_id, t->chunk, t->offset, size, t->name));
    t->allocated = 0;
    int64_t nf, lg, tot;
    dyn_summary(d, &nf, &lg, &tot);
    e = &st->ev[at];
    set(e, F_N_FREE, nf); set(e, F_LARGEST_FREE, lg); set(e, F_TOTAL_FREE, tot);
    return 0;
}

static int64_t id_of(const int64_t *ids, int64_t n, int64_t i) { return n ? ids[i] : 0; }

static int walk(St *st, const int64_t *node_ids, int64_t n_node_ids, const int64_t *leaf_ids, int64_t n_leaf_ids) {
    st->node = -1;
    for (int64_t i = 0; i < st->n_leafs; i++) TRY(allocate(st, st->leafs[i], id_of(leaf_ids, n_leaf_ids, i)));
    for (int64_t i = 0; i < st->n_nodes; i++) {
        T *t = &st->t[st->nodes[i]];
        int64_t bid = id_of(node_ids, n_node_ids, i);
        if (t->view_src >= 0 && !str_is(t->op, "NONE")) st->t[t->view_src].views++;
        if (t->flags & 1) TRY(allocate(st, st->nodes[i], bid));
        for (int32_t k = 0; k < t->n_src; k++) {
            int32_t s = st->srcs[t->src_at + k];
            if (s < 0) continue;
            st->t[s].children++;
            if (st->t[s].flags & 1) TRY(allocate(st, s, bid));
        }
    }
    for (int64_t i = 0; i < st->n_nodes; i++) {
        st->node = i;
        int32_t ni = st->nodes[i];
        T *t = &st->t[ni];
        int64_t bid = id_of(node_ids, n_node_ids, i);
        for (int32_t k = 0; k < t->n_src; k++) {
            int32_t s = st->srcs[t->src_at + k];
            if (s >= 0 && !st->t[s].allocated) TRY(allocate(st, s, bid));
        }
        TRY(allocate(st, ni, bid));
        EMIT(x, "exec");
        x->s[S_TENSOR] = t->name;
        x->s[S_OP] = (t->desc.n && !str_is(t->desc, "NONE")) ? t->desc : t->op;
        x->srcs = ni;
        if (t->allocated) { set(x, F_CHUNK, t->chunk); set(x, F_OFFSET, t->offset); }
        set(x, F_SIZE, t->nbytes);
        for (int32_t k = 0; k < t->n_src; k++) {
            int32_t pi = st->srcs[t->src_at + k];
            if (pi < 0) continue;
            T *p = &st->t[pi];
            p->children--;
            EMIT(e, "parent");
            e->s[S_TENSOR] = p->name;
            set(e, F_CHILDREN, p->children); set(e, F_VIEWS, p->views); set(e, F_ALLOCATED, p->allocated ? 1 : 0);
            if (p->children == 0 && p->views == 0) {
                if (p->view_src >= 0) {
                    T *v = &st->t[p->view_src];
                    v->views--;
                    EMIT(w, "view_src");
                    w->s[S_TENSOR] = v->name;
                    set(w, F_CHILDREN, v->children); set(w, F_VIEWS, v->views);
                    if (v->views == 0 && v->children == 0 && v->allocated) TRY(free_node(st, p->view_src));
                } else if (p->allocated) {
                    TRY(free_node(st, pi));
                }
            }
            EMIT(s, "step");
            (void)s;
        }
    }
    st->node = -1;
    return 0;
}

/* ---------- the columns (columns.encode_arrays) ---------- */

typedef struct { Str s; int32_t code; } TSlot;

typedef struct {
    TSlot *tab; int64_t cap, n;
    St *st;
} Intern;

static uint64_t hash_str(const char *p, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 1099511628211ull; }
    return h;
}

static void quote(St *st, char **buf, int64_t *len, int64_t *cap, const char *p, int64_t n, int *ok);

static void put(St *st, char **buf, int64_t *len, int64_t *cap, const char *p, int64_t n, int *ok) {
    if (!*ok) return;
    char *b = grow(st, *buf, cap, *len + n + 1, 1);
    if (!b) { *ok = 0; return; }
    *buf = b;
    memcpy(b + *len, p, (size_t)n);
    *len += n;
}

/* json's encode_basestring_ascii of an ASCII string */
static void quote(St *st, char **buf, int64_t *len, int64_t *cap, const char *p, int64_t n, int *ok) {
    put(st, buf, len, cap, "\"", 1, ok);
    int64_t run = 0;
    for (int64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\""; else if (c == '\\') esc = "\\\\"; else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r"; else if (c == '\t') esc = "\\t"; else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        if (esc) {
            put(st, buf, len, cap, p + run, i - run, ok);
            put(st, buf, len, cap, esc, (int64_t)strlen(esc), ok);
            run = i + 1;
        }
    }
    put(st, buf, len, cap, p + run, n - run, ok);
    put(st, buf, len, cap, "\"", 1, ok);
}

/* the table strings live in one pool (srcs lists are made here; names point into St.names) */
typedef struct { char *p; int64_t len, cap; } Pool;

static int32_t intern(Intern *in, Str s, int *ok) {
    if (in->n * 2 >= in->cap) {
        int64_t cap = in->cap ? in->cap * 2 : 256;
        TSlot *t = calloc((size_t)cap, sizeof *t);
        if (!t) { *ok = 0; in->st->oom_memory = 1; return -1; }
        for (int64_t i = 0; i < cap; i++) t[i].code = -1;
        for (int64_t i = 0; i < in->cap; i++) {
            if (in->tab[i].code < 0) continue;
            int64_t j = (int64_t)(hash_str(in->tab[i].s.p, in->tab[i].s.n) & (uint64_t)(cap - 1));
            while (t[j].code >= 0) j = (j + 1) & (cap - 1);
            t[j] = in->tab[i];
        }
        free(in->tab);
        in->tab = t; in->cap = cap;
    }
    int64_t j = (int64_t)(hash_str(s.p, s.n) & (uint64_t)(in->cap - 1));
    while (in->tab[j].code >= 0) {
        if (str_eq(in->tab[j].s, s)) return in->tab[j].code;
        j = (j + 1) & (in->cap - 1);
    }
    in->tab[j].s = s;
    in->tab[j].code = (int32_t)in->n++;
    return in->tab[j].code;
}

static int width_of(int64_t lo, int64_t hi) { /* columns.narrowest_type: its minimum stays free for "missing" */
    if (lo > INT8_MIN && hi <= INT8_MAX) return 1;
    if (lo > INT16_MIN && hi <= INT16_MAX) return 2;
    if (lo > INT32_MIN && hi <= INT32_MAX) return 4;
    if (lo > INT64_MIN) return 8;
    return 0;
}

static int put_col(St *st, int c, int width, int64_t n, const int64_t *vals) {
    char *b = malloc((size_t)(n * width) + 1);
    if (!b) { st->oom_memory = 1; return 0; }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = vals[i];
        switch (width) {
        case 1: { int8_t x = (int8_t)v; memcpy(b + i, &x, 1); break; }
        case 2: { int16_t x = (int16_t)v; memcpy(b + 2 * i, &x, 2); break; }
        case 4: { int32_t x = (int32_t)v; memcpy(b + 4 * i, &x, 4); break; }
        default: memcpy(b + 8 * i, &v, 8);
        }
    }
    st->cols[c] = b; st->col_len[c] = n * width; st->itemsize[c] = width;
    return 1;
}

static int encode(St *st) {
    int64_t n = st->n_ev;
    int64_t *vals = malloc((size_t)(n ? n : 1) * 8);
    if (!vals) return decline(st, "out of memory");
    for (int f = 0; f < N_INT; f++) {
        int64_t lo = INT64_MAX, hi = INT64_MIN, present = 0;
        for (int64_t i = 0; i < n; i++)
            if (st->ev[i].has & (1u << f)) {
                int64_t v = st->ev[i].v[f];
                present++;
                if (v < lo) lo = v;
                if (v > hi) hi = v;
            }
        if (!present) continue;
        int w = width_of(lo, hi);
        if (!w) { free(vals); return decline(st, "an event value out of range"); }
        int64_t missing = w == 1 ? INT8_MIN : w == 2 ? INT16_MIN : w == 4 ? INT32_MIN : INT64_MIN;
        for (int64_t i = 0; i < n; i++) vals[i] = (st->ev[i].has & (1u << f)) ? st->ev[i].v[f] : missing;
        if (!put_col(st, f, w, n, vals)) { free(vals); return -1; }
    }
    Intern in = {NULL, 0, 0, st};
    int ok = 1;
    for (int f = 0; f < N_STR; f++) {
        int64_t present = 0;
        for (int64_t i = 0; i < n; i++) present += st->ev[i].s[f].p != NULL;
        if (!present) continue;
        for (int64_t i = 0; i < n; i++) vals[i] = st->ev[i].s[f].p ? intern(&in, st->ev[i].s[f], &ok) : -1;
        if (!ok || !put_col(st, N_INT + f, 4, n, vals)) { free(vals); free(in.tab); return decline(st, "out of memory"); }
    }
    /* srcs: each exec lists its node's source names, dumped as JSON once per distinct list */
    Pool pool = {NULL, 0, 0};
    int64_t *pool_at = malloc((size_t)(n ? n : 1) * 16);
    int64_t n_pool = 0;
    int any_srcs = 0;
    for (int64_t i = 0; i < n; i++) any_srcs |= st->ev[i].srcs >= 0;
    if (any_srcs) {
        /* first the JSON texts into the pool (it may move while it grows), then intern them */
        for (int64_t i = 0; i < n && ok; i++) {
            if (st->ev[i].srcs < 0) continue;
            T *t = &st->t[st->ev[i].srcs];
            int64_t at = pool.len;
            put(st, &pool.p, &pool.len, &pool.cap, "[", 1, &ok);
            for (int32_t k = 0; k < t->n_src; k++) {
                if (k) put(st, &pool.p, &pool.len, &pool.cap, ", ", 2, &ok);
                int32_t s = st->srcs[t->src_at + k];
                if (s < 0) put(st, &pool.p, &pool.len, &pool.cap, "null", 4, &ok);
                else quote(st, &pool.p, &pool.len, &pool.cap, st->t[s].name.p, st->t[s].name.n, &ok);
            }
            put(st, &pool.p, &pool.len, &pool.cap, "]", 1, &ok);
            pool_at[2 * n_pool] = at; pool_at[2 * n_pool + 1] = pool.len - at; n_pool++;
        }
        int64_t k = 0;
        for (int64_t i = 0; i < n && ok; i++) {
            if (st->ev[i].srcs < 0) { vals[i] = -1; continue; }
            vals[i] = intern(&in, (Str){pool.p + pool_at[2 * k], pool_at[2 * k + 1]}, &ok);
            k++;
        }
        if (!ok || !put_col(st, N_INT + N_STR, 4, n, vals)) ok = 0;
    }
    /* extra: {"from": N} of a buffer event */
    char *xbuf = NULL; int64_t xlen = 0, xcap = 0, nx = 0;
    int64_t *x_at = NULL;
    for (int64_t i = 0; i < n; i++) nx += st->ev[i].has_from;
    if (nx && ok) {
        x_at = malloc((size_t)nx * 16);
        int64_t k = 0;
        for (int64_t i = 0; i < n && ok && x_at; i++) {
            if (!st->ev[i].has_from) continue;
            char tmp[64];
            int m = snprintf(tmp, sizeof tmp, "{\"from\": %lld}", (long long)st->ev[i].from);
            x_at[2 * k] = xlen; x_at[2 * k + 1] = m; k++;
            put(st, &xbuf, &xlen, &xcap, tmp, m, &ok);
        }
        k = 0;
        for (int64_t i = 0; i < n && ok && x_at; i++) {
            if (!st->ev[i].has_from) { vals[i] = -1; continue; }
            vals[i] = intern(&in, (Str){xbuf + x_at[2 * k], x_at[2 * k + 1]}, &ok);
            k++;
        }
        if (!x_at || !ok || !put_col(st, N_INT + N_STR + 1, 4, n, vals)) ok = 0;
    }
    /* the table in code order, as json.dumps(list) writes it */
    if (ok) {
        Str *order = malloc((size_t)(in.n ? in.n : 1) * sizeof *order);
        if (!order) ok = 0;
        for (int64_t i = 0; ok && i < in.cap; i++)
            if (in.tab[i].code >= 0) order[in.tab[i].code] = in.tab[i].s;
        put(st, &st->table, &st->table_len, &st->table_cap, "[", 1, &ok);
        for (int64_t i = 0; ok && i < in.n; i++) {
            if (i) put(st, &st->table, &st->table_len, &st->table_cap, ", ", 2, &ok);
            quote(st, &st->table, &st->table_len, &st->table_cap, order[i].p, order[i].n, &ok);
        }
        put(st, &st->table, &st->table_len, &st->table_cap, "]", 1, &ok);
        free(order);
    }
    free(vals); free(in.tab); free(pool.p); free(pool_at); free(xbuf); free(x_at);
    return ok ? 0 : decline(st, "out of memory");
}

/* ---------- shapes (replay.shapes) as JSON ---------- */

static int shapes(St *st, int64_t max_shapes) {
    Intern seen = {NULL, 0, 0, st};
    int ok = 1;
    int64_t count = 0;
    put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, "{", 1, &ok);
    for (int64_t i = 0; i < st->nt && ok; i++) {
        T *t = &st->t[i];
        if (t->view_src_ptr || t->nbytes <= 0) continue;
        int64_t before = seen.n;
        intern(&seen, t->name, &ok);
        if (seen.n == before) continue; /* the name is in already */
        if (count >= max_shapes) break;
        if (count++) put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, ", ", 2, &ok);
        quote(st, &st->shapes, &st->shapes_len, &st->shapes_cap, t->name.p, t->name.n, &ok);
        put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, ": [", 3, &ok);
        quote(st, &st->shapes, &st->shapes_len, &st->shapes_cap, t->type.p, t->type.n, &ok);
        char tmp[128];
        int m = snprintf(tmp, sizeof tmp, ", [%lld, %lld, %lld, %lld], ", (long long)t->ne[0], (long long)t->ne[1],
                         (long long)t->ne[2], (long long)t->ne[3]);
        put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, tmp, m, &ok);
        quote(st, &st->shapes, &st->shapes_len, &st->shapes_cap, t->op.p, t->op.n, &ok);
        put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, ", [", 3, &ok);
        int first = 1;
        for (int32_t k = 0; k < t->n_src; k++) {
            int32_t s = st->srcs[t->src_at + k];
            if (s < 0) continue; /* a NULL source (a source the recording lacks is declined earlier) */
            if (!first) put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, ", ", 2, &ok);
            first = 0;
            quote(st, &st->shapes, &st->shapes_len, &st->shapes_cap, st->t[s].name.p, st->t[s].name.n, &ok);
        }
        put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, "]]", 2, &ok);
    }
    put(st, &st->shapes, &st->shapes_len, &st->shapes_cap, "}", 1, &ok);
    free(seen.tab);
    return ok ? 0 : decline(st, "out of memory");
}

/* ---------- the call ---------- */

typedef struct {
    const char *text; int64_t text_len;      /* the tensor lines, each ended by '\n' */
    int64_t n_nodes, n_leafs;
    const int64_t *node_ids; int64_t n_node_ids; /* n 0: every id 0 */
    const int64_t *leaf_ids; int64_t n_leaf_ids;
    int64_t n_bufs;
    const int64_t *alignment, *max_chunk, *owner; /* per buffer id */
    const char *buft_names; const int64_t *buft_name_len; /* the buffer types' names, one after another */
    const int64_t *cur_n;     /* per buffer: chunks of its current buffer, -1: none yet */
    const int64_t *cur_sizes; /* those chunks' sizes, buffer after buffer */
    int64_t no_alloc, max_free_blocks, graph, want_shapes, max_shapes;
    const char *inplace; int64_t inplace_len; /* op names, each ended by '\n' */
} RfIn;

typedef struct {
    int64_t ok;          /* the reserve's result */
    int64_t n_events;
    int64_t failed;      /* 0, 1 oom, 2 abort */
    int64_t fail_event;
    const char *cols[N_COLS]; int64_t col_len[N_COLS]; int64_t itemsize[N_COLS];
    const char *table; int64_t table_len;
    const char *shapes; int64_t shapes_len;
    const int64_t *state; int64_t state_len;
} RfOut;

/* the sizes of the structs ctypes mirrors (plans_fast.py checks them at load: one changed without the other
   fails there, not in a call) */
EXPORT int64_t rf_sizeof(const char *name) {
    return !strcmp(name, "RfIn") ? (int64_t)sizeof(RfIn) : !strcmp(name, "RfOut") ? (int64_t)sizeof(RfOut) : -1;
}

EXPORT St *rf_new(void) { return calloc(1, sizeof(St)); }

static void reset(St *st) {
    free(st->t); free(st->srcs); free(st->sizes); free(st->nodes); free(st->leafs); free(st->names); free(st->ev);
    for (int b = 0; b < 64; b++)
        for (int c = 0; c < MAX_CHUNKS; c++) { free(st->dyn[b].ch[c].off); free(st->dyn[b].ch[c].size); }
    for (int c = 0; c < N_COLS; c++) free(st->cols[c]);
    free(st->table); free(st->shapes); free(st->state);
    memset(st, 0, sizeof *st);
}

EXPORT void rf_free(St *st) { if (st) { reset(st); free(st); } }
EXPORT const char *rf_reason(St *st) { return st->reason; }

static int in_list(Str op, const char *list, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        int64_t j = i;
        while (j < n && list[j] != '\n') j++;
        if (j - i == op.n && memcmp(list + i, op.p, (size_t)op.n) == 0) return 1;
        i = j + 1;
    }
    return 0;
}

static int push_state(St *st, int64_t *cap, int64_t v) {
    int64_t *s = grow(st, st->state, cap, st->state_len + 1, 8);
    if (!s) return 0;
    st->state = s;
    st->state[st->state_len++] = v;
    return 1;
}

static int load(St *st, const RfIn *in) {
    int64_t src_cap = 0, size_cap = 0, name_cap = 0, tcap = 0;
    for (int64_t i = 0; i < in->text_len;) {
        int64_t j = i;
        while (j < in->text_len && in->text[j] != '\n') j++;
        T *t = grow(st, st->t, &tcap, st->nt + 1, sizeof *t);
        if (!t) return decline(st, "out of memory");
        st->t = t;
        t = &st->t[st->nt];
        memset(t, 0, sizeof *t);
        t->n_sizes = -1;
        if (parse_line(st, in->text + i, j - i, t, &src_cap, &size_cap, &name_cap)) return -1;
        st->nt++;
        i = j + 1;
    }
    if (st->oom_memory) return decline(st, "out of memory");
    /* name offsets -> pointers, now that the names buffer stays put */
    for (int64_t i = 0; i < st->nt; i++) st->t[i].name.p = st->names + (intptr_t)st->t[i].name.p;
    /* pointers -> indices */
    int64_t cap = 16;
    while (cap < 2 * st->nt + 2) cap *= 2;
    Slot *tab = malloc((size_t)cap * sizeof *tab);
    if (!tab) return decline(st, "out of memory");
    for (int64_t i = 0; i < cap; i++) tab[i].val = -1;
    for (int64_t i = 0; i < st->nt; i++) {
        int64_t s = slot_of(tab, cap, st->t[i].ptr);
        if (tab[s].val >= 0) { free(tab); return decline(st, "two tensor lines with one pointer"); }
        tab[s].key = st->t[i].ptr; tab[s].val = (int32_t)i;
    }
    /* the source pointers were kept in the sizes pool just before each tensor's own sizes */
    for (int64_t i = 0; i < st->nt; i++) {
        T *t = &st->t[i];
        for (int32_t k = 0; k < t->n_src; k++) {
            uint64_t p = (uint64_t)st->sizes[t->size_at - t->n_src + k];
            if (!p) { st->srcs[t->src_at + k] = -1; continue; }
            int64_t s = slot_of(tab, cap, p);
            if (tab[s].val < 0) { free(tab); return decline(st, "a source the recording lacks"); }
            st->srcs[t->src_at + k] = tab[s].val;
        }
        t->view_src = -1;
        if (t->view_src_ptr) {
            int64_t s = slot_of(tab, cap, t->view_src_ptr);
            if (tab[s].val < 0) { free(tab); return decline(st, "a view source the recording lacks"); }
            t->view_src = tab[s].val;
        }
        if (t->nbytes <= 0) { free(tab); return decline(st, "a tensor without bytes"); }
        if (t->nbytes > ((int64_t)1 << 60)) { free(tab); return decline(st, "a tensor too large"); }
        if (t->n_sizes && t->n_sizes < in->n_bufs) { free(tab); return decline(st, "fewer alloc sizes than buffers"); }
        for (int32_t k = 0; k < t->n_sizes; k++)
            if (st->sizes[t->size_at + k] < 0 || st->sizes[t->size_at + k] > ((int64_t)1 << 60)) {
                free(tab); return decline(st, "an alloc size out of range");
            }
        t->inplace = in_list(t->op, in->inplace, in->inplace_len);
    }
    free(tab);
    st->nodes = malloc((size_t)(st->nt + 1) * sizeof(int32_t));
    st->leafs = malloc((size_t)(st->nt + 1) * sizeof(int32_t));
    if (!st->nodes || !st->leafs) return decline(st, "out of memory");
    for (int64_t i = 0; i < st->nt; i++) {
        if (st->t[i].kind == 'n') st->nodes[st->n_nodes++] = (int32_t)i;
        else if (st->t[i].kind == 'l') st->leafs[st->n_leafs++] = (int32_t)i;
        else if (st->t[i].kind != 'x') return decline(st, "tensor kind");
    }
    if (st->n_nodes != in->n_nodes || st->n_leafs != in->n_leafs) return decline(st, "node or leaf count");
    if ((in->n_node_ids && in->n_node_ids < st->n_nodes) || (in->n_leaf_ids && in->n_leaf_ids < st->n_leafs))
        return decline(st, "fewer buffer ids than tensors");
    return 0;
}

/* the plan's allocation of tensor i (gallocr._talloc): NO_ALLOC as bid -1 */
static int put_talloc(St *st, int64_t *cap, int32_t i) {
    if (i < 0 || st->t[i].view_src >= 0 || st->t[i].data != 0)
        return push_state(st, cap, -1) && push_state(st, cap, 0) && push_state(st, cap, 0) && push_state(st, cap, 0);
    T *t = &st->t[i];
    return push_state(st, cap, t->buffer_id) && push_state(st, cap, t->chunk) && push_state(st, cap, t->offset) &&
           push_state(st, cap, alloc_size(st, t, t->buffer_id));
}

/* whether buffer b's plan outgrows the buffer it has (none yet: it does), as gallocr.reserve decides; its size */
static int grows(const RfIn *in, const Dyn *d, int64_t b, int64_t *cur_size) {
    const int64_t *cur = in->cur_sizes;
    for (int64_t q = 0; q < b; q++) if (in->cur_n[q] > 0) cur += in->cur_n[q];
    int64_t ncur = in->cur_n[b];
    *cur_size = 0;
    for (int64_t c = 0; c < ncur; c++) *cur_size += cur[c];
    if (ncur < 0) return 1;
    for (int c = 0; c < d->n; c++) if (d->ch[c].max_size > (c < ncur ? cur[c] : 0)) return 1;
    return 0;
}

/* 0: replayed (out->ok says how the reserve ended); -1: declined (rf_reason) */
EXPORT int rf_reserve(St *st, const RfIn *in, RfOut *out) {
    reset(st);
    memset(out, 0, sizeof *out);
    {
        uint16_t one = 1;
        uint8_t first;
        memcpy(&first, &one, 1);
        if (!first) return decline(st, "a big-endian machine");
    }
    if (in->n_bufs < 1 || in->n_bufs > 64) return decline(st, "buffer count");
    st->n_bufs = in->n_bufs; st->max_free_blocks = in->max_free_blocks; st->graph = in->graph;
    st->no_alloc = in->no_alloc;
    st->alignment = (int64_t *)in->alignment; st->max_chunk = (int64_t *)in->max_chunk; st->owner = (int64_t *)in->owner;
    for (int64_t b = 0; b < in->n_bufs; b++) {
        if (in->alignment[b] <= 0 || in->owner[b] < 0 || in->owner[b] > b) return decline(st, "a buffer type");
        st->dyn[b].alignment = in->alignment[b];
        st->dyn[b].max_chunk = in->max_chunk[b];
    }
    if (load(st, in)) return -1;
    for (int64_t i = 0; i < st->n_nodes; i++) if (in->n_node_ids && (in->node_ids[i] < 0 || in->node_ids[i] >= in->n_bufs))
        return decline(st, "a node buffer id");
    for (int64_t i = 0; i < st->n_leafs; i++) if (in->n_leaf_ids && (in->leaf_ids[i] < 0 || in->leaf_ids[i] >= in->n_bufs))
        return decline(st, "a leaf buffer id");
    int r = walk(st, in->node_ids, in->n_node_ids, in->leaf_ids, in->n_leaf_ids);
    if (r == NOMEM || st->oom_memory) return decline(st, "out of memory");
    int64_t cap = 0;
    /* state: per buffer id its new chunk sizes (or -1 kept as it was, -2 dropped: None) */
    if (r == 0) {
        for (int64_t b = 0; b < in->n_bufs; b++) {
            if (in->owner[b] != b) continue;
            Dyn *d = &st->dyn[b];
            int64_t cur_size = 0, new_size = 0;
            if (!grows(in, d, b, &cur_size)) continue;
            for (int c = 0; c < d->n; c++) new_size += d->ch[c].max_size;
            if (cur_size > 0) {
                Ev *e = emit(st, "buffer");
                if (!e) return decline(st, "out of memory");
                int64_t at = 0;
                for (int64_t q = 0; q < b; q++) at += in->buft_name_len[q];
                e->s[S_REASON] = (Str){in->buft_names + at, in->buft_name_len[b]};
                set(e, F_SIZE, new_size); e->from = cur_size; e->has_from = 1; set_buf(st, e, b);
            }
        }
    }
    if (encode(st)) return -1;
    if (in->want_shapes && shapes(st, in->max_shapes)) return -1;
    /* state for the Python model: [per owner buffer: n chunks, then per chunk max_size, n free, offsets, sizes];
       [per buffer id: 1 and its new chunk sizes (n, sizes...), or 0 left alone, or 2 set to None];
       [per node: dst talloc, n srcs, src tallocs]; [per leaf: talloc] (each talloc: bid, chunk, offset, size) */
    for (int64_t b = 0; b < in->n_bufs; b++) {
        if (in->owner[b] != b) continue;
        Dyn *d = &st->dyn[b];
        if (!push_state(st, &cap, d->n)) return decline(st, "out of memory");
        for (int c = 0; c < d->n; c++) {
            Chunk *ch = &d->ch[c];
            if (!push_state(st, &cap, ch->max_size) || !push_state(st, &cap, ch->n)) return decline(st, "out of memory");
            for (int64_t i = 0; i < ch->n; i++) if (!push_state(st, &cap, ch->off[i])) return decline(st, "out of memory");
            for (int64_t i = 0; i < ch->n; i++) if (!push_state(st, &cap, ch->size[i])) return decline(st, "out of memory");
        }
    }
    if (r == 0) {
        for (int64_t b = 0; b < in->n_bufs; b++) {
            if (in->owner[b] != b) { if (!push_state(st, &cap, 0)) return decline(st, "out of memory"); continue; }
            Dyn *d = &st->dyn[b];
            int64_t cur_size;
            if (!grows(in, d, b, &cur_size)) { if (!push_state(st, &cap, 0)) return decline(st, "out of memory"); continue; }
            if (in->no_alloc) { if (!push_state(st, &cap, 2)) return decline(st, "out of memory"); continue; }
            if (!push_state(st, &cap, 1) || !push_state(st, &cap, d->n)) return decline(st, "out of memory");
            for (int c = 0; c < d->n; c++) if (!push_state(st, &cap, d->ch[c].max_size)) return decline(st, "out of memory");
        }
        for (int64_t i = 0; i < st->n_nodes; i++) {
            T *t = &st->t[st->nodes[i]];
            if (!put_talloc(st, &cap, st->nodes[i]) || !push_state(st, &cap, t->n_src)) return decline(st, "out of memory");
            for (int32_t k = 0; k < t->n_src; k++)
                if (!put_talloc(st, &cap, st->srcs[t->src_at + k])) return decline(st, "out of memory");
        }
        for (int64_t i = 0; i < st->n_leafs; i++)
            if (!put_talloc(st, &cap, st->leafs[i])) return decline(st, "out of memory");
    }
    if (st->oom_memory) return decline(st, "out of memory");
    out->ok = r == 0;
    out->n_events = st->n_ev;
    out->failed = st->failed;
    out->fail_event = st->fail_event;
    for (int c = 0; c < N_COLS; c++) { out->cols[c] = st->cols[c]; out->col_len[c] = st->col_len[c]; out->itemsize[c] = st->itemsize[c]; }
    out->table = st->table; out->table_len = st->table_len;
    out->shapes = st->shapes; out->shapes_len = st->shapes_len;
    out->state = st->state; out->state_len = st->state_len;
    return 0;
}
