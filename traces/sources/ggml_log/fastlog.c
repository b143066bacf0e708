/* The common case of a ggml log import, compiled: legacy ggml_allocr logs ("block" style, 2023-08).
 *
 * Plain C, loaded with ctypes (fastlog.py). It does what parse_log.parse_line, split.Splitter,
 * recover.LegacyReplay (with allocator/tallocr.py) and columns.encode do for those logs, over the
 * UTF-8 text LogReader decodes: lines in, finished graphs out as stored columns (narrowest dtypes,
 * the per-graph string table as JSON). Whatever it is not sure to treat exactly as the Python path
 * (a line shape it does not know that holds an allocator phrase, a number out of range, non-ASCII
 * text where decoding could differ, ...) makes it DECLINE: the import then runs the Python path.
 *
 * Its length: one compiled pipeline, in the order the Python path runs it, so each section can be read
 * beside its Python reference; splitting it would put ctypes boundaries where the hot loop runs.
 *
 * Sections: the string pool (every name once, a number each), parse_line's port, the line memo, the
 * splitter, the replay (LegacyTallocr's free list), the columns, the recovery cache (a graph seen before
 * from the same allocator state: the replay jumps to where it would end) and the exported calls.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#define MISSING INT64_MIN
#define MAX_SCAN 4096
#define MAX_BYTES (1LL << 50)
#define MAX_COUNT (1LL << 31)
#define MAX_GRAPH 1000000LL
#define INT_MAX63 INT64_MAX
#define SEEN_BYTES (4 << 20)  /* column bytes kept under numbers; the numbers start over when more */
#define CACHE_WORDS (1 << 21)  /* recovery cache key and state words held; it starts over when more */
#define CHUNK 64  /* events encoded a field at a time (64 of them fit in L1) */
#define RELEASE_EVENTS (1 << 16)  /* a walk longer than this gives its buffers back once it was read */

/* ---------- fields (columns.FIELDS order, less `graph`, `srcs`, `extra`) ---------- */
enum { F_SIZE, F_OFFSET, F_ADDR, F_CHUNK, F_BUFFER, F_BLOCK, F_N_FREE, F_LARGEST_FREE, F_TOTAL_FREE,
       F_N_FREE_BEFORE, F_CHILDREN, F_VIEWS, F_ALLOCATED, F_NEEDED, F_LARGEST, F_NODE, N_INTS };
enum { S_KIND, S_TENSOR, S_OP, S_PARENT, S_VIEW_SRC, S_REASON, S_SRCS, S_EXTRA, N_STRS };

typedef struct {
    int32_t s[N_STRS];  /* string ids, -1: None */
    int64_t v[N_INTS];  /* MISSING: None */
    int64_t key;        /* what the event was made from (a line number in the line memo, or a fixed one) */
} Ev;

/* ---------- growable arrays ---------- */
static void *grow(void *p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return p;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    if (!q) abort();
    *cap = c;
    return q;
}

/* ---------- string pool ---------- */
/* A hash table slot: the key's 32-bit hash above its number + 1 (0: empty). A probe compares the hashes
   first, so a slot of another key costs no look at that key's bytes; a table grows from the stored
   hashes, without hashing any key again. The home slot is the hash's low bits. */
typedef uint64_t Slot;
#define SLOT(h32, id) (((uint64_t)(h32) << 32) | (uint32_t)((id) + 1))
#define SLOT_ID(x) ((int32_t)(uint32_t)(x) - 1)
#define SLOT_H(x) ((uint32_t)((x) >> 32))

typedef struct {
    char *bytes; int64_t nbytes, capbytes;
    int64_t *off; int32_t *len; uint32_t *hash; int64_t n, cap;
    Slot *slots; int64_t nslots;
} Pool;

static uint64_t hash_bytes(const char *p, int64_t n) {  /* 8 bytes at a time, multiply and fold */
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    int64_t i = 0;
    if (n >= 64) {  /* four independent lanes, 32 bytes a round, folded into one */
        uint64_t a = h, b = h ^ 0x2545f4914f6cdd1dULL, c = h ^ 0x94d049bb133111ebULL, d = h ^ 0xbf58476d1ce4e5b9ULL;
        for (; i + 32 <= n; i += 32) {
            uint64_t w[4];
            memcpy(w, p + i, 32);
            a = (a ^ w[0]) * 0xff51afd7ed558ccdULL; a ^= a >> 32;
            b = (b ^ w[1]) * 0xff51afd7ed558ccdULL; b ^= b >> 32;
            c = (c ^ w[2]) * 0xff51afd7ed558ccdULL; c ^= c >> 32;
            d = (d ^ w[3]) * 0xff51afd7ed558ccdULL; d ^= d >> 32;
        }
        h = ((a * 0x9e3779b97f4a7c15ULL + b) * 0x9e3779b97f4a7c15ULL + c) * 0x9e3779b97f4a7c15ULL + d;
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, p + i, (size_t)(n - i));
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

static uint32_t hash32(const char *p, int64_t n) { return (uint32_t)hash_bytes(p, n); }

/* a table of nslots (a power of two) holding ids [0, n) by their stored hashes */
static Slot *slots_build(const uint32_t *hash, int64_t n, int64_t nslots) {
    Slot *t = calloc((size_t)nslots, sizeof(Slot));
    if (!t) abort();
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = hash[i] & (nslots - 1);
        while (t[h]) h = (h + 1) & (nslots - 1);
        t[h] = SLOT(hash[i], i);
    }
    return t;
}

static int32_t intern_h(Pool *P, const char *p, int64_t n, uint32_t hv) {
    if ((P->n + 1) * 2 > P->nslots) {
        int64_t m = P->nslots ? P->nslots * 2 : 1 << 14;
        free(P->slots);
        P->slots = slots_build(P->hash, P->n, m);
        P->nslots = m;
    }
    uint64_t mask = P->nslots - 1, h = hv & mask;
    for (Slot x; (x = P->slots[h]); h = (h + 1) & mask) {
        if (SLOT_H(x) != hv) continue;
        int32_t id = SLOT_ID(x);
        if (P->len[id] == n && memcmp(P->bytes + P->off[id], p, n) == 0) return id;
    }
    P->bytes = grow(P->bytes, &P->capbytes, P->nbytes + n + 1, 1);
    memcpy(P->bytes + P->nbytes, p, n);
    int64_t oldcap = P->cap;
    P->off = grow(P->off, &P->cap, P->n + 1, sizeof(int64_t));
    if (P->cap != oldcap) {
        P->len = realloc(P->len, P->cap * sizeof(int32_t));
        P->hash = realloc(P->hash, P->cap * sizeof(uint32_t));
        if (!P->len || !P->hash) abort();
    }
    P->off[P->n] = P->nbytes;
    P->len[P->n] = (int32_t)n;
    P->hash[P->n] = hv;
    P->nbytes += n;
    P->slots[h] = SLOT(hv, P->n);
    return (int32_t)P->n++;
}
static int32_t intern(Pool *P, const char *p, int64_t n) { return intern_h(P, p, n, hash32(p, n)); }

/* ---------- parsed items ---------- */
enum { IT_BLANK, IT_PROGRAM, IT_DEBUG, IT_EVENT, IT_GLUED, IT_GRAPH, IT_ASSERT, IT_COMPUTE, IT_MEASURE,
       IT_BUFSIZE, IT_ALIGN, IT_DECLINE };

typedef struct { int type; Ev ev; int64_t a; int oofb; } Item;

typedef struct {
    Ev *items; int64_t n, cap;
    int64_t n_exec;
    int measure_before, compute_after;
    int64_t buffer_before, alignment;  /* MISSING: None */
    int incomplete;
} Draft;

typedef struct {  /* the line memo: line text -> parsed item (with its line number as the key) */
    int64_t *start; int32_t *len; uint32_t *hash; Item *item; int64_t n, cap;
    int32_t *hist; int64_t nhist, cursor;  /* the entries of the last HIST lines; where the last line was seen before */
    int64_t *last; int32_t blank;  /* where each entry was seen last (in hist); the blank line's entry (-1: none) */
    char *bytes; int64_t nbytes, capbytes;
    Slot *slots; int64_t nslots;
} LineMemo;

#define MEMO_LIMIT (1 << 16)
#define MEMO_LONGEST 512

typedef struct {
    Pool pool;
    int32_t k_alloc, k_free, k_exec, k_reuse, k_no_reuse, k_view_src, k_step, k_barrier, k_graph, k_oom,
        k_abort, r_external, r_layout, r_output, r_oofb, k_none, k_empty;
    LineMemo memo;
    int64_t next_key;
    int64_t memo_hits, memo_lookups, memo_skip;  /* a memo that rarely hits is left alone for a while */
    /* line carry between blocks */
    char *carry; int64_t ncarry, capcarry;
    int64_t lineno;
    /* splitter */
    Draft *cur;
    int has_pending_measure, has_pending_buffer, has_pending_align;
    int64_t pending_buffer, pending_align;
    int headers_seen, gap, prev_alloc_line;
    int64_t exec_since_blank, setup_at;  /* setup_at -1: None */
    /* features */
    int64_t first_block; int has_first_block; int64_t setup_allocs; int64_t n_alloc_lines;
    int64_t *asserts; int64_t n_asserts, cap_asserts;
    /* snapshot when the first draft finished */
    int snap_taken, snap_due; int64_t snap[8 + 64]; int64_t snap_n;
    /* finished drafts */
    Draft **queue; int64_t qhead, qn, qcap;
    int finished;
    /* replay config */
    int configured, skips_last;
    int64_t max_free_blocks, backend_alignment, backend_slack, alignments[8]; int n_alignments;
    /* replay state */
    int64_t index; int life; /* 0 None, 1 measure, 2 real */
    int64_t measure_max, measure_align, buffer;  /* MISSING: None */
    int has_t; int64_t t_base, t_size, t_align, t_max; int t_measure;
    int64_t *addrs, *sizes; int64_t nfree, capfree;
    /* per-graph scratch */
    int64_t *op_stamp; int32_t *op_val; int64_t cap_ids;
    int32_t *local; int64_t *local_stamp;
    int64_t *live_head, *live_tail, *live_stamp;  /* per tensor id: a FIFO of pool entries */
    int64_t *lnext, *lev; int64_t nlive, caplive;
    int64_t stamp;
    /* graph output */
    Draft *out_draft;
    char *colbuf; int64_t capcol;
    char *table; int64_t ntable, captable;
    char *prevcol; int64_t capprevcol; int64_t prev_n, prev_off[N_INTS + N_STRS], prev_size[N_INTS + N_STRS];
    int32_t *prev_ids; int64_t nprev_ids, cap_prev_ids; int table_made;
    /* column bytes seen before (a number each, compared in full), so a column packed once is not packed again */
    char *seen_bytes; int64_t nseen_bytes, capseen_bytes;
    int64_t *seen_off, *seen_len; int64_t nseen, capseen;
    int32_t *seen_index; int64_t nseen_index, seen_epoch;
    int64_t seen_limit, cache_limit, memo_limit;  /* SEEN_BYTES, CACHE_WORDS, MEMO_LIMIT unless fl_tune changed them */
    int32_t *table_ids; int64_t ntable_ids, cap_table_ids;
    Draft *spare;
    /* graphs recovered before: (replay state, draft hints, the items' keys) -> the state after, a slot number */
    int64_t **cache_keys, **cache_ends; int64_t *cache_slot; int64_t ncache, capcache;
    int32_t *cache_index; int64_t ncache_index;
    int64_t cache_words, next_slot, epoch;
    int64_t *keybuf; int64_t capkey;
    char *scratch; int64_t capscratch;  /* a line's lower-case copy, an exec line's sources as JSON */
    char reason[200];
    int declined;
    int timed; double t_feed, t_replay, t_encode, t_key; int64_t n_hits, n_looks, n_skipped, n_guess;  /* ALLOCTRACE_FASTLOG_TIMES=1: seconds per phase */
} St;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The view of a finished graph that fastlog.py reads (a ctypes Structure of the same layout). */
typedef struct {
    int64_t n, index, max_size, buffer_size, oom_needed, oom_largest, incomplete;
    int32_t role, consistent, has_buffer, has_oom, oom_has_tensor, pad;
    const char *oom_tensor; int64_t oom_tensor_len;
    const char *cols[N_INTS + N_STRS]; int64_t itemsize[N_INTS + N_STRS];  /* itemsize 0: column absent */
    const char *table; int64_t table_len;
    int64_t slot, hit, epoch;  /* the graph's cache slot; hit: it is the slot's graph again (columns not filled) */
    int64_t same[N_INTS + N_STRS + 1];  /* this column (and, last, the table) equals the previous encoded graph's */
    int64_t blob[N_INTS + N_STRS], seen[N_INTS + N_STRS];  /* else: the number of its bytes; seen before? */
    int64_t seen_epoch;  /* changes when the numbers start over */
} GraphOut;

static int decline(St *st, const char *why) {
    if (!st->declined) {
        snprintf(st->reason, sizeof st->reason, "line %lld: %s", (long long)st->lineno, why);
        st->declined = 1;
    }
    return IT_DECLINE;
}

/* ---------- small text helpers ---------- */
static int64_t find(const char *s, int64_t n, int64_t from, const char *lit) {  /* leftmost start at or after from */
    int64_t m = (int64_t)strlen(lit);
    if (from < 0) from = 0;
    while (from + m <= n) {  /* the first character with memchr (vector compares), then the rest */
        const char *c = memchr(s + from, lit[0], (size_t)(n - m + 1 - from));
        if (!c) return -1;
        if (memcmp(c + 1, lit + 1, m - 1) == 0) return c - s;
        from = c - s + 1;
    }
    return -1;
}
static int64_t rfind(const char *s, int64_t from, int64_t to, const char *lit) {  /* last start in [from, to - m] */
    int64_t m = (int64_t)strlen(lit);
    for (int64_t i = to - m; i >= from; i--) {
        if (s[i] == lit[0] && memcmp(s + i, lit, m) == 0) return i;
    }
    return -1;
}
static int has(const char *s, int64_t n, const char *lit) { return find(s, n, 0, lit) >= 0; }
static int starts(const char *s, int64_t n, const char *lit) {
    int64_t m = (int64_t)strlen(lit);
    return n >= m && memcmp(s, lit, m) == 0;
}
static int ends(const char *s, int64_t n, const char *lit) {
    int64_t m = (int64_t)strlen(lit);
    return n >= m && memcmp(s + n - m, lit, m) == 0;
}
static int isdig(char c) { return c >= '0' && c <= '9'; }
static int isword(unsigned char c) { return isdig(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int isspace_ascii(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }
static int nonascii(const char *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) if ((unsigned char)s[i] >= 0x80) return 1;
    return 0;
}

/* digits [a, b) (optionally a leading '-') -> value; 0 when out of int64 range (the caller declines) */
static int parse_int(const char *s, int64_t a, int64_t b, int64_t *out) {
    int neg = 0;
    if (a < b && s[a] == '-') { neg = 1; a++; }
    if (b - a < 1 || b - a > 18) return 0;
    int64_t v = 0;
    for (int64_t i = a; i < b; i++) { if (!isdig(s[i])) return 0; v = v * 10 + (s[i] - '0'); }
    *out = neg ? -v : v;
    return 1;
}
/* a digit run ending right before `end` (backwards, maximal), with an optional '-' before it: its start */
static int64_t digits_before(const char *s, int64_t lo, int64_t end, int minus) {
    int64_t i = end;
    while (i > lo && isdig(s[i - 1])) i--;
    if (i == end) return -1;
    if (minus && i > lo && s[i - 1] == '-') i--;
    return i;
}

static int32_t str_id(St *st, const char *s, int64_t a, int64_t b, int *bad) {
    if (nonascii(s + a, b - a)) { *bad = 1; return -1; }
    return intern(&st->pool, s + a, b - a);
}

static void ev_init(Ev *e, int32_t kind) {
    for (int i = 0; i < N_STRS; i++) e->s[i] = -1;
    for (int i = 0; i < N_INTS; i++) e->v[i] = MISSING;
    e->s[S_KIND] = kind;
    e->key = 0;
}

/* ---------- JSON (json.dumps with ensure_ascii, ASCII input) ---------- */
static void put(char **buf, int64_t *n, int64_t *cap, const char *p, int64_t m) {
    *buf = grow(*buf, cap, *n + m + 1, 1);
    memcpy(*buf + *n, p, m);
    *n += m;
}
static void put_json_str(char **buf, int64_t *n, int64_t *cap, const char *p, int64_t m) {
    *buf = grow(*buf, cap, *n + 6 * m + 3, 1);  /* the longest escape (\u00XX) is 6 bytes */
    char *w = *buf + *n;
    *w++ = '"';
    for (int64_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f) { *w++ = (char)c; continue; }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default: {
            static const char hex[] = "0123456789abcdef";
            *w++ = 'u'; *w++ = '0'; *w++ = '0'; *w++ = hex[c >> 4]; *w++ = hex[c & 15];
        }
        }
    }
    *w++ = '"';
    *n = w - *buf;
}

/* ---------- one line -> one item (parse_log.parse_line) ---------- */

/* leftmost `ggml_\w*: <what>` at or after `from`; -1 none; sets *decl on a \w run it cannot judge */
static int64_t ggml_prefix(const char *s, int64_t n, int64_t from, const char *what, int64_t *after, int *decl) {
    int64_t wl = (int64_t)strlen(what);
    for (int64_t p = find(s, n, from, "ggml_"); p >= 0; p = find(s, n, p + 1, "ggml_")) {
        int64_t i = p + 5;
        while (i < n && isword((unsigned char)s[i])) i++;
        if (i < n && (unsigned char)s[i] >= 0x80) { *decl = 1; return -1; }
        if (i + 2 + wl <= n && s[i] == ':' && s[i + 1] == ' ' && memcmp(s + i + 2, what, wl) == 0) {
            *after = i + 2 + wl;
            return p;
        }
    }
    return -1;
}

static int glued(const char *s, int64_t start, int *decl) {
    if (start == 0) return 0;
    int any_non_ascii = 0;
    for (int64_t i = 0; i < start; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) any_non_ascii = 1;
        else if (!isspace_ascii(c)) return 1;
    }
    if (any_non_ascii) *decl = 1;  /* unicode whitespace or not: Python's str.isspace decides */
    return 0;
}

static int parse_oom(St *st, const char *s, int64_t n, Item *it);
static int parse_assert(St *st, const char *s, int64_t n, Item *it);
static int parse_program(St *st, const char *s, int64_t n, Item *it);

static int parse_alloc(St *st, const char *s, int64_t n, Item *it, int *matched) {
    int decl = 0; int64_t name_at;
    int64_t start = ggml_prefix(s, n, 0, "allocating ", &name_at, &decl);
    if (decl) return decline(st, "allocating line with non-ASCII in its function name");
    if (start < 0) return 0;
    /* ` (N bytes) - ` then an optional `block K` then the end: from the last '(' */
    int64_t lp = -1;
    for (int64_t i = n - 1; i >= 0; i--) if (s[i] == '(') { lp = i; break; }
    if (lp < 1 || s[lp - 1] != ' ' || lp - 1 < name_at) goto unsure;
    int64_t i = lp + 1, d0 = i;
    if (i < n && s[i] == '-') i++;
    while (i < n && isdig(s[i])) i++;
    if (i == d0 || (s[d0] == '-' && i == d0 + 1)) goto unsure;
    int64_t d1 = i;
    if (!(n - i >= 10 && memcmp(s + i, " bytes) - ", 10) == 0)) goto unsure;
    i += 10;
    int64_t size, block = MISSING;
    if (!parse_int(s, d0, d1, &size) || size < 0 || size > MAX_BYTES) return decline(st, "allocation size out of range");
    if (i < n) {
        if (!(n - i > 6 && memcmp(s + i, "block ", 6) == 0)) goto unsure;
        int64_t b0 = i + 6, j = b0;
        if (j < n && s[j] == '-') j++;
        int64_t dstart = j;
        while (j < n && isdig(s[j])) j++;
        if (j == dstart) goto unsure;
        if (j != n) return decline(st, "allocating line with addr/offset/chunk");
        if (!parse_int(s, b0, j, &block) || block < -1 || block > MAX_COUNT) return decline(st, "block out of range");
    }
    int bad = 0;
    ev_init(&it->ev, st->k_alloc);
    it->ev.s[S_TENSOR] = str_id(st, s, name_at, lp - 1, &bad);
    if (bad) return decline(st, "non-ASCII tensor name");
    it->ev.v[F_SIZE] = size;
    it->ev.v[F_BLOCK] = block;
    *matched = 1;
    int g = glued(s, start, &decl);
    if (decl) return decline(st, "non-ASCII text before allocator text");
    return g ? IT_GLUED : IT_EVENT;
unsure:
    if (has(s, n, " bytes) - ")) return decline(st, "allocating line of a shape not handled");
    return 0;
}

static int parse_free(St *st, const char *s, int64_t n, Item *it, int *matched) {
    int decl = 0; int64_t name_at;
    int64_t start = ggml_prefix(s, n, 0, "freeing ", &name_at, &decl);
    if (decl) return decline(st, "freeing line with non-ASCII in its function name");
    if (start >= 0) {
        /* ` (N bytes) - n_free_blocks = K` at the end */
        int64_t k0 = digits_before(s, 0, n, 1);
        const char *mid = " bytes) - n_free_blocks = ";
        int64_t ml = (int64_t)strlen(mid);
        if (k0 >= 0 && k0 >= ml && memcmp(s + k0 - ml, mid, ml) == 0) {
            int64_t d0 = digits_before(s, 0, k0 - ml, 1);
            if (d0 >= 2 && s[d0 - 1] == '(' && s[d0 - 2] == ' ' && d0 - 2 >= name_at) {
                int64_t name_end = d0 - 2;
                if (find(s, name_end, name_at, " at ") >= 0) return decline(st, "freeing line with a location");
                int64_t size, nfree;
                if (!parse_int(s, d0, k0 - ml, &size) || size < 0 || size > MAX_BYTES)
                    return decline(st, "free size out of range");
                if (!parse_int(s, k0, n, &nfree) || nfree < -1 || nfree > MAX_COUNT)
                    return decline(st, "n_free_blocks out of range");
                int bad = 0;
                ev_init(&it->ev, st->k_free);
                it->ev.s[S_TENSOR] = str_id(st, s, name_at, name_end, &bad);
                if (bad) return decline(st, "non-ASCII tensor name");
                it->ev.v[F_SIZE] = size;
                it->ev.v[F_N_FREE_BEFORE] = nfree;
                *matched = 1;
                int g = glued(s, start, &decl);
                if (decl) return decline(st, "non-ASCII text before allocator text");
                return g ? IT_GLUED : IT_EVENT;
            }
        }
        if (has(s, n, " bytes) - n_free_blocks = ")) return decline(st, "freeing line of a shape not handled");
    }
    if (has(s, n, "freeing extra ") || has(s, n, "not freeing output ")) return decline(st, "head freeing line");
    return 0;
}

static int parse_exec(St *st, const char *s, int64_t n, Item *it, int *matched) {
    for (int64_t p = find(s, n, 0, "exec: "); p >= 0; p = find(s, n, p + 1, "exec: ")) {
        int64_t i = p + 6;
        while (i < n && s[i] != ' ' && !(s[i] >= 9 && s[i] <= 13) && !(s[i] >= 0x1c && s[i] <= 0x1f)) {
            if ((unsigned char)s[i] >= 0x80) return decline(st, "exec line with non-ASCII op");
            i++;
        }
        if (!(i + 1 < n && s[i] == ' ' && s[i + 1] == '(')) continue;
        int64_t name_at = i + 2;
        int64_t arrow = rfind(s, name_at, n, ") <= ");
        if (arrow < 0) continue;
        int bad = 0;
        ev_init(&it->ev, st->k_exec);
        it->ev.s[S_OP] = str_id(st, s, p + 6, i, &bad);
        it->ev.s[S_TENSOR] = str_id(st, s, name_at, arrow, &bad);
        int64_t a = arrow + 5;
        if (nonascii(s + a, n - a)) bad = 1;
        if (bad) return decline(st, "non-ASCII name in an exec line");
        /* the sources as their JSON list: split on ", " */
        int64_t jn = 0;
        char **js = &st->scratch; int64_t *cap = &st->capscratch;
        put(js, &jn, cap, "[", 1);
        if (a < n) {
            int64_t q = a;
            for (;;) {
                int64_t c = find(s, n, q, ", ");
                int64_t e = c < 0 ? n : c;
                if (q > a) put(js, &jn, cap, ", ", 2);
                put_json_str(js, &jn, cap, s + q, e - q);
                if (c < 0) break;
                q = c + 2;
            }
        }
        put(js, &jn, cap, "]", 1);
        it->ev.s[S_SRCS] = intern(&st->pool, *js, jn);
        *matched = 1;
        int decl = 0;
        int g = glued(s, p, &decl);
        if (decl) return decline(st, "non-ASCII text before allocator text");
        return g ? IT_GLUED : IT_EVENT;
    }
    return 0;
}

static int parse_children(St *st, const char *s, int64_t n, Item *it, int *matched) {
    if (has(s, n, "parent ") && has(s, n, "views, allocated: ")) return decline(st, "head parent line");
    int64_t p = find(s, n, 0, "view_src ");
    if (p < 0 || !ends(s, n, " views")) return 0;
    int64_t v0 = digits_before(s, 0, n - 6, 1);
    const char *mid = " children, ";
    int64_t ml = (int64_t)strlen(mid);
    if (v0 < 0 || v0 < ml || memcmp(s + v0 - ml, mid, ml) != 0) return 0;
    int64_t c0 = digits_before(s, 0, v0 - ml, 1);
    if (c0 < 2 || s[c0 - 1] != ' ' || s[c0 - 2] != ':' || c0 - 2 < p + 9) return 0;
    int64_t children, views;
    if (!parse_int(s, c0, v0 - ml, &children) || !parse_int(s, v0, n - 6, &views))
        return decline(st, "count out of range");
    int bad = 0;
    ev_init(&it->ev, st->k_view_src);
    it->ev.s[S_TENSOR] = str_id(st, s, p + 9, c0 - 2, &bad);
    if (bad) return decline(st, "non-ASCII tensor name");
    it->ev.v[F_CHILDREN] = children;
    it->ev.v[F_VIEWS] = views;
    *matched = 1;
    return IT_EVENT;
}

static int parse_reuse(St *st, const char *s, int64_t n, Item *it) {
    int bad = 0;
    if (has(s, n, "not reusing")) {
        int64_t p = find(s, n, 0, "not reusing parent ");
        if (p < 0) return IT_PROGRAM;
        int64_t g1 = p + 19, tail = -1, reason = -1, addr_at = -1, addr_end = -1;
        if (ends(s, n, " as layouts are different")) { tail = n - 25; reason = st->r_layout; }
        else if (ends(s, n, " as it is an output")) { tail = n - 19; reason = st->r_output; }
        else if (ends(s, n, " is external")) {
            int64_t e = n - 12;
            if (ends(s, e, "(nil)")) { addr_at = e - 5; addr_end = e; }
            else {
                int64_t h = e;
                while (h > 0 && ((s[h - 1] >= '0' && s[h - 1] <= '9') || (s[h - 1] >= 'a' && s[h - 1] <= 'f') ||
                                 (s[h - 1] >= 'A' && s[h - 1] <= 'F'))) h--;
                if (h < e && h >= 2 && s[h - 1] == 'x' && s[h - 2] == '0') { addr_at = h - 2; addr_end = e; }
            }
            if (addr_at >= 4 && memcmp(s + addr_at - 4, " as ", 4) == 0) { tail = addr_at - 4; reason = st->r_external; }
        }
        if (tail < 0) return IT_PROGRAM;
        int64_t f = rfind(s, g1, tail, " for ");
        if (f < 0) return IT_PROGRAM;
        ev_init(&it->ev, st->k_no_reuse);
        it->ev.s[S_PARENT] = str_id(st, s, g1, f, &bad);
        it->ev.s[S_TENSOR] = str_id(st, s, f + 5, tail, &bad);
        if (bad) return decline(st, "non-ASCII tensor name");
        it->ev.s[S_REASON] = reason;
        if (addr_at >= 0) {
            if (s[addr_at] == '(') it->ev.v[F_ADDR] = 0;
            else {
                if (addr_end - addr_at > 18) return decline(st, "address out of range");
                uint64_t v = 0;
                for (int64_t i = addr_at + 2; i < addr_end; i++) {
                    char c = s[i];
                    v = v * 16 + (uint64_t)(isdig(c) ? c - '0' : (c | 32) - 'a' + 10);
                }
                if (v > (uint64_t)INT_MAX63) return decline(st, "address out of range");
                it->ev.v[F_ADDR] = (int64_t)v;
            }
        }
        return IT_EVENT;
    }
    int64_t p = find(s, n, 0, "reusing view parent ");
    if (p >= 0) {
        int64_t g1 = p + 20;
        int64_t L = rfind(s, g1 + 2, n, ") for ");
        if (L >= 0) {
            int64_t e = rfind(s, g1, L, " (");  /* the last ` (` that leaves room before L */
            if (e >= 0 && e + 2 <= L) {
                ev_init(&it->ev, st->k_reuse);
                it->ev.s[S_PARENT] = str_id(st, s, g1, e, &bad);
                it->ev.s[S_VIEW_SRC] = str_id(st, s, e + 2, L, &bad);
                it->ev.s[S_TENSOR] = str_id(st, s, L + 6, n, &bad);
                if (bad) return decline(st, "non-ASCII tensor name");
                return IT_EVENT;
            }
        }
    }
    p = find(s, n, 0, "reusing parent ");
    if (p >= 0) {
        int64_t g1 = p + 15;
        int64_t f = rfind(s, g1, n, " for ");
        if (f >= 0) {
            ev_init(&it->ev, st->k_reuse);
            it->ev.s[S_PARENT] = str_id(st, s, g1, f, &bad);
            it->ev.s[S_TENSOR] = str_id(st, s, f + 5, n, &bad);
            if (bad) return decline(st, "non-ASCII tensor name");
            return IT_EVENT;
        }
    }
    return IT_PROGRAM;
}

static int parse_graph(St *st, const char *s, int64_t n, Item *it, int *matched) {
    int64_t b0 = digits_before(s, 0, n, 1);
    if (b0 < 1 || s[b0 - 1] != '/') return 0;
    int64_t a0 = digits_before(s, 0, b0 - 1, 1);
    if (a0 < 14 || memcmp(s + a0 - 14, "####### graph ", 14) != 0) return 0;
    int64_t g, nn;
    if (!parse_int(s, a0, b0 - 1, &g) || !parse_int(s, b0, n, &nn) || g < 0 || g > MAX_GRAPH || nn < 0 || nn > MAX_GRAPH)
        return decline(st, "graph number out of range");
    ev_init(&it->ev, st->k_graph);
    char buf[80];
    int m = snprintf(buf, sizeof buf, "{\"g\": %lld, \"n\": %lld}", (long long)g, (long long)nn);
    it->ev.s[S_EXTRA] = intern(&st->pool, buf, m);
    *matched = 1;
    return IT_GRAPH;
}

static int parse_oom(St *st, const char *s, int64_t n, Item *it) {
    if (nonascii(s, n)) return decline(st, "non-ASCII oom line");
    /* `not enough space in the buffer (needed N, largest block available M)` at the end */
    if (ends(s, n, ")")) {
        int64_t m0 = digits_before(s, 0, n - 1, 0);
        const char *mid = ", largest block available ";
        int64_t ml = (int64_t)strlen(mid);
        const char *head = "not enough space in the buffer (needed ";
        int64_t hl = (int64_t)strlen(head);
        if (m0 >= ml && memcmp(s + m0 - ml, mid, ml) == 0) {
            int64_t n0 = digits_before(s, 0, m0 - ml, 0);
            if (n0 >= hl && memcmp(s + n0 - hl, head, hl) == 0) {
                int64_t needed, largest;
                if (!parse_int(s, n0, m0 - ml, &needed) || needed > MAX_BYTES ||
                    !parse_int(s, m0, n - 1, &largest) || largest > MAX_BYTES)
                    return decline(st, "oom numbers out of range");
                ev_init(&it->ev, st->k_oom);
                it->ev.v[F_NEEDED] = needed;
                it->ev.v[F_LARGEST] = largest;
                /* the tensor: `allocating (.*) \((\d+) bytes\) - ` (leftmost start, greedy name) */
                int64_t a = find(s, n, 0, "allocating ");
                if (a >= 0) {
                    int64_t g1 = a + 11;
                    for (int64_t q = n - 1; q >= g1; q--) {
                        if (s[q] != ' ' || q + 1 >= n || s[q + 1] != '(') continue;
                        int64_t j = q + 2;
                        while (j < n && isdig(s[j])) j++;
                        if (j > q + 2 && n - j >= 10 && memcmp(s + j, " bytes) - ", 10) == 0) {
                            int bad = 0;
                            it->ev.s[S_TENSOR] = str_id(st, s, g1, q, &bad);
                            break;
                        }
                    }
                }
                return IT_EVENT;
            }
        }
    }
    if (has(s, n, "not enough space in the buffer to allocate")) return decline(st, "head oom line");
    if (has(s, n, "GGML_ASSERT")) return parse_assert(st, s, n, it);
    return IT_PROGRAM;
}

static int parse_assert(St *st, const char *s, int64_t n, Item *it) {
    (void)st;
    int64_t p = find(s, n, 0, "GGML_ASSERT: ");
    if (p < 0) return IT_PROGRAM;
    for (int64_t c = n - 1; c >= p + 13; c--) {
        if (s[c] != ':') continue;
        int64_t j = c + 1;
        while (j < n && isdig(s[j])) j++;
        if (j == c + 1 || j + 2 > n || s[j] != ':' || s[j + 1] != ' ') continue;
        int64_t v = 0;
        if (j - (c + 1) < 12) parse_int(s, c + 1, j, &v);
        it->a = v;
        it->oofb = find(s, n, j + 2, "out of free blocks") >= 0;
        return IT_ASSERT;
    }
    return IT_PROGRAM;
}

static int parse_program(St *st, const char *s, int64_t n, Item *it) {
    char *low = st->scratch = grow(st->scratch, &st->capscratch, n + 1, 1);
    for (int64_t i = 0; i < n; i++) { char c = s[i]; low[i] = (c >= 'A' && c <= 'Z') ? (char)(c | 32) : c; }
    if (has(low, n, "compute buffer")) return IT_COMPUTE;
    if (has(low, n, "measure allocator")) return IT_MEASURE;
    if (has(low, n, "buffer size = ")) {
        for (int64_t p = find(low, n, 0, "buffer size = "); p >= 0; p = find(low, n, p + 1, "buffer size = ")) {
            int64_t j = p + 14;
            while (j < n && isdig(low[j])) j++;
            if (j > p + 14 && n - j >= 6 && memcmp(low + j, " bytes", 6) == 0) {
                int64_t v;
                if (!parse_int(low, p + 14, j, &v) || v > MAX_BYTES) return decline(st, "buffer size out of range");
                it->a = v;
                return IT_BUFSIZE;
            }
        }
    }
    if (has(low, n, "alignment")) {
        for (int64_t p = find(low, n, 0, "alignment"); p >= 0; p = find(low, n, p + 1, "alignment")) {
            if (p > 0 && isword((unsigned char)low[p - 1])) continue;
            int64_t j = p + 9;
            if (j >= n || (low[j] != ' ' && low[j] != '=')) continue;
            int64_t d = j + 1, e = d;
            while (e < n && isdig(low[e])) e++;
            if (e == d || (e < n && isword((unsigned char)low[e]))) continue;
            int64_t v;
            if (!parse_int(low, d, e, &v)) return decline(st, "alignment out of range");
            it->a = v;
            return IT_ALIGN;
        }
    }
    return IT_PROGRAM;
}

static const char *TRIGGERS[] = {"max_size", "allocating ", "freeing ", "exec: ", "children, ", "view_src",
                                 "reusing ", "#######", "not enough space", "ggml_", "input: ", "output: ",
                                 "GGML_ASSERT", "parent", NULL};
static const char *HINTS[] = {"compute buffer", "measure allocator", "buffer size = ", "alignment", NULL};

static int parse_line(St *st, const char *s, int64_t n, Item *it) {
    it->type = IT_PROGRAM; it->a = 0; it->oofb = 0;
    if (n == 0) return IT_BLANK;
    if (n > MAX_SCAN) {  /* the last MAX_SCAN characters (code points) */
        int64_t count = 0, i = n;
        while (i > 0) {
            i--;
            if (((unsigned char)s[i] & 0xc0) != 0x80 && ++count == MAX_SCAN) break;
        }
        if (count == MAX_SCAN) { s += i; n -= i; }
    }
    int64_t last_na = -1;
    for (int64_t i = n - 1; i >= 0; i--) if ((unsigned char)s[i] >= 0x80) { last_na = i; break; }
    if (last_na >= 0) {
        for (int k = 0; TRIGGERS[k]; k++) {
            int64_t p = find(s, n, 0, TRIGGERS[k]);
            if (p >= 0 && p <= last_na) return decline(st, "non-ASCII text before allocator text");
        }
        char *low = st->scratch = grow(st->scratch, &st->capscratch, n + 1, 1);
        for (int64_t i = 0; i < n; i++) { char c = s[i]; low[i] = (c >= 'A' && c <= 'Z') ? (char)(c | 32) : c; }
        for (int k = 0; HINTS[k]; k++) if (has(low, n, HINTS[k])) return decline(st, "non-ASCII program hint line");
    }
    int matched = 0, r;
    if (starts(s, n, "max_size") && has(s, n, " MB: tensors:")) return IT_DEBUG;
    if (has(s, n, "allocating ")) {
        if (has(s, n, "not enough space")) return parse_oom(st, s, n, it);
        r = parse_alloc(st, s, n, it, &matched);
        if (matched || r == IT_DECLINE) return r;
    }
    if (has(s, n, "freeing ")) {
        r = parse_free(st, s, n, it, &matched);
        if (matched || r == IT_DECLINE) return r;
    }
    if (has(s, n, "exec: ")) {
        r = parse_exec(st, s, n, it, &matched);
        if (matched || r == IT_DECLINE) return r;
    }
    if (has(s, n, "children, ")) {
        r = parse_children(st, s, n, it, &matched);
        if (matched || r == IT_DECLINE) return r;
    }
    if (has(s, n, "reusing ")) return parse_reuse(st, s, n, it);
    if (has(s, n, "#######")) {
        r = parse_graph(st, s, n, it, &matched);
        if (matched || r == IT_DECLINE) return r;
    }
    if (has(s, n, "not enough space")) return parse_oom(st, s, n, it);
    if (has(s, n, "ggml_")) {
        if (has(s, n, "ggml_gallocr_needs_realloc: ") || ends(s, n, "reallocating buffers automatically") ||
            has(s, n, ": reallocating ") || has(s, n, ": allocated data at ") ||
            has(s, n, "virtual memory for measure buffer at "))
            return decline(st, "a later generation's ggml line");
        if (has(s, n, "alloc->data = ")) return IT_DEBUG;
        if (has(s, n, "GGML_ASSERT")) return parse_assert(st, s, n, it);
        return parse_program(st, s, n, it);
    }
    if (starts(s, n, "input: ") || starts(s, n, "output: ")) return decline(st, "input/output line");
    if (has(s, n, "GGML_ASSERT")) return parse_assert(st, s, n, it);
    return parse_program(st, s, n, it);
}

/* ---------- the line memo ---------- */
static void memo_clear(LineMemo *m) {
    m->n = 0; m->nbytes = 0; m->nhist = 0; m->cursor = -2; m->blank = -1;
    if (m->slots) memset(m->slots, 0, m->nslots * sizeof(Slot));
}

#define HIST (1 << 16)
static void memo_seen(LineMemo *m, int32_t id) {  /* entry `id` is the line just read */
    m->hist[m->nhist & (HIST - 1)] = id;
    m->last[id] = m->nhist++;
}

/* the line's item: in *it, or (*use) the memo's own copy */
static int parse_memo(St *st, const char *s, int64_t n, Item *it, const Item **use) {
    *use = it;
    LineMemo *m = &st->memo;
    if (st->memo_lookups == MEMO_LIMIT) {  /* every MEMO_LIMIT lookups: was the memo worth it? */
        if (st->memo_hits * 8 < st->memo_lookups) st->memo_skip = 4 * MEMO_LIMIT;
        st->memo_hits = st->memo_lookups = 0;
    }
    if (st->memo_skip > 0) st->memo_skip--;
    else st->memo_lookups++;
    st->n_looks++;
    if (n > MEMO_LONGEST || st->memo_skip > 0) {
        st->n_skipped++;
        int t = parse_line(st, s, n, it);
        it->type = t;
        it->ev.key = st->next_key++;
        return t;
    }
    if (!m->slots) {  /* small first (a log of few lines touches little memory); it grows from stored hashes */
        m->nslots = 4096;
        m->slots = calloc(m->nslots, sizeof(Slot));
        m->hist = malloc(HIST * sizeof(int32_t));
        if (!m->slots || !m->hist) abort();
        m->nhist = 0; m->cursor = -2; m->blank = -1;
    }
    /* a log repeats its walks line for line: the entries of the lines seen last (`hist`, a ring) are
       followed from where the previous line was seen before (`cursor`), so the next line is first compared
       with the one that followed it then; a line that differs (a size that grows) is passed over, a line
       found in the table moves the cursor to where it was seen last. A blank line follows anything: it is
       left out. Entries lie in the order they were first seen, so the guesses read memory in order. */
    if (n == 0 && m->blank >= 0) { st->memo_hits++; st->n_hits++; *use = &m->item[m->blank]; return IT_BLANK; }
    int64_t c = m->cursor + 1;
    if (n && c >= 0 && c < m->nhist) {
        int32_t id = m->hist[c & (HIST - 1)];
        if (m->len[id] == n && memcmp(m->bytes + m->start[id], s, n) == 0) {
            st->memo_hits++; st->n_hits++; st->n_guess++;
            m->cursor = c;
            memo_seen(m, id);
            *use = &m->item[id];
            return m->item[id].type;
        }
    }
    uint32_t hv = hash32(s, n);  /* the one hash of the line: the lookup's and, on a miss, the insert's */
    uint64_t mask = m->nslots - 1, h = hv & mask;
    for (Slot x; (x = m->slots[h]); h = (h + 1) & mask) {
        if (SLOT_H(x) != hv) continue;
        int32_t id = SLOT_ID(x);
        if (m->len[id] == n && memcmp(m->bytes + m->start[id], s, n) == 0) {
            st->memo_hits++; st->n_hits++;
            if (n) {
                m->cursor = m->last[id];
                memo_seen(m, id);
            }
            *use = &m->item[id];
            return m->item[id].type;
        }
    }
    int t = parse_line(st, s, n, it);
    it->type = t;
    it->ev.key = st->next_key++;
    if (t == IT_DECLINE) return t;
    if (m->n >= st->memo_limit || (m->n + 1) * 2 > m->nslots) {
        if (m->n >= st->memo_limit) memo_clear(m);
        else {  /* no key is hashed again */
            int64_t ns = m->nslots * 2;
            free(m->slots);
            m->slots = slots_build(m->hash, m->n, ns);
            m->nslots = ns;
        }
        mask = m->nslots - 1;
        for (h = hv & mask; m->slots[h]; h = (h + 1) & mask) {}
    }
    m->bytes = grow(m->bytes, &m->capbytes, m->nbytes + n + 1, 1);
    memcpy(m->bytes + m->nbytes, s, n);
    int64_t oldcap = m->cap;
    m->start = grow(m->start, &m->cap, m->n + 1, sizeof(int64_t));
    if (m->cap != oldcap) {
        m->len = realloc(m->len, m->cap * sizeof(int32_t));
        m->hash = realloc(m->hash, m->cap * sizeof(uint32_t));
        m->item = realloc(m->item, m->cap * sizeof(Item));
        m->last = realloc(m->last, m->cap * sizeof(int64_t));
        if (!m->len || !m->hash || !m->item || !m->last) abort();
    }
    m->start[m->n] = m->nbytes; m->len[m->n] = (int32_t)n; m->hash[m->n] = hv; m->item[m->n] = *it;
    if (n) {
        m->cursor++;  /* a line in place of the one expected */
        memo_seen(m, (int32_t)m->n);
    } else m->blank = (int32_t)m->n;
    m->nbytes += n;
    m->slots[h] = SLOT(hv, m->n);
    m->n++;
    return t;
}

/* ---------- the splitter (split.Splitter) ---------- */
static void draft_push(Draft *d, const Ev *e) {
    d->items = grow(d->items, &d->cap, d->n + 1, sizeof(Ev));
    d->items[d->n++] = *e;
}

static void queue_push(St *st, Draft *d) {
    if (!st->snap_taken) st->snap_due = 1;
    st->queue = grow(st->queue, &st->qcap, st->qhead + st->qn + 1, sizeof(Draft *));
    st->queue[st->qhead + st->qn++] = d;
}

/* what the generation is detected from: the features once the line that ended the first walk is fed */
static void take_snapshot(St *st) {
    if (st->snap_due && !st->snap_taken) {
        st->snap_taken = 1;
        int64_t k = 0;
        st->snap[k++] = st->has_first_block;
        st->snap[k++] = st->first_block;
        st->snap[k++] = st->setup_allocs;
        int64_t na = st->n_asserts < 64 ? st->n_asserts : 64;
        st->snap[k++] = na;
        for (int64_t i = 0; i < na; i++) st->snap[k++] = st->asserts[i];
        st->snap_n = k;
        if (st->n_asserts > 64) decline(st, "too many assert lines");
    }
}

static void draft_free(St *st, Draft *d) {  /* one is kept for the next (no fresh pages per graph) */
    if (!d) return;
    if (st && !st->spare) { st->spare = d; return; }
    free(d->items); free(d);
}
static Draft *draft_alloc(St *st) {
    Draft *d = st->spare;
    st->spare = NULL;
    if (!d) return calloc(1, sizeof(Draft));
    Ev *items = d->items; int64_t cap = d->cap;
    memset(d, 0, sizeof *d);
    d->items = items; d->cap = cap;
    return d;
}

/* open the next draft with the pending hints; the one it ends (with items) is queued */
static void new_draft(St *st, Ev *items, int64_t nitems) {
    Draft *done = st->cur;
    Draft *d = draft_alloc(st);
    d->buffer_before = MISSING; d->alignment = MISSING;
    for (int64_t i = 0; i < nitems; i++) draft_push(d, &items[i]);
    if (st->has_pending_measure) d->measure_before = 1;
    if (st->has_pending_buffer) d->buffer_before = st->pending_buffer;
    if (st->has_pending_align) d->alignment = st->pending_align;
    st->has_pending_measure = st->has_pending_buffer = st->has_pending_align = 0;
    st->cur = d; st->gap = 0; st->exec_since_blank = 0;
    if (done && done->n) queue_push(st, done);
    else draft_free(st, done);
}

static void feed_event(St *st, const Ev *ev) {
    st->prev_alloc_line = 1;
    int32_t k = ev->s[S_KIND];
    if (k == st->k_alloc) {
        st->n_alloc_lines++;
        if (!st->has_first_block && ev->v[F_BLOCK] != MISSING) { st->has_first_block = 1; st->first_block = ev->v[F_BLOCK]; }
        int started = st->cur && st->cur->n_exec > 0;
        if (started && !st->headers_seen && st->gap) new_draft(st, NULL, 0);
    } else if (k == st->k_exec) {
        st->exec_since_blank++;
        if (st->setup_at >= 0 && st->cur && st->cur->n_exec == 0) {
            Draft *c = st->cur;
            int64_t at = st->setup_at < c->n ? st->setup_at : c->n;
            for (int64_t i = 0; i < at; i++) if (c->items[i].s[S_KIND] == st->k_alloc) st->setup_allocs++;
            memmove(c->items, c->items + at, (c->n - at) * sizeof(Ev));
            c->n -= at;
        }
        st->setup_at = -1;
    }
    if (!st->cur) new_draft(st, NULL, 0);
    if (k == st->k_exec) st->cur->n_exec++;
    draft_push(st->cur, ev);
}

static void feed_header(St *st, const Ev *ev) {
    st->headers_seen = 1;
    st->setup_at = -1;
    if (!st->cur || st->cur->n_exec == 0) {
        if (!st->cur) new_draft(st, NULL, 0);
        Draft *d = st->cur;
        if (st->has_pending_measure) d->measure_before = 1;
        if (st->has_pending_buffer) d->buffer_before = st->pending_buffer;
        if (st->has_pending_align) d->alignment = st->pending_align;
        st->has_pending_measure = st->has_pending_buffer = st->has_pending_align = 0;
        draft_push(d, ev);
        return;
    }
    Draft *c = st->cur;
    int64_t cut = c->n;
    while (cut > 0 && c->items[cut - 1].s[S_KIND] == st->k_alloc) cut--;
    int64_t nt = c->n - cut;
    Ev *tail = malloc((nt + 1) * sizeof(Ev));
    memcpy(tail, c->items + cut, nt * sizeof(Ev));
    tail[nt] = *ev;
    c->n = cut;
    new_draft(st, tail, nt + 1);
    free(tail);
}

static void feed(St *st, const Item *it) {
    int t = it->type;
    if (t == IT_EVENT) { feed_event(st, &it->ev); return; }
    if (t == IT_GLUED) {
        int started = st->cur && st->cur->n_exec > 0;
        st->gap = st->gap || started;
        if (started && !st->headers_seen) new_draft(st, NULL, 0);
        feed_event(st, &it->ev);
        return;
    }
    if (t == IT_BLANK) {
        if (st->cur && st->prev_alloc_line) {
            Ev e; ev_init(&e, st->exec_since_blank > 1 ? st->k_barrier : st->k_step);
            e.key = st->exec_since_blank > 1 ? 1 : 0;
            draft_push(st->cur, &e);
            st->exec_since_blank = 0;
        }
        st->prev_alloc_line = 0;
        return;
    }
    st->prev_alloc_line = !(t == IT_PROGRAM || t == IT_COMPUTE || t == IT_MEASURE || t == IT_BUFSIZE || t == IT_ALIGN);
    if (t == IT_GRAPH) { feed_header(st, &it->ev); return; }
    if (t == IT_DEBUG) return;
    int started = st->cur && st->cur->n_exec > 0;
    if (t == IT_ASSERT) {
        st->asserts = grow(st->asserts, &st->cap_asserts, st->n_asserts + 1, sizeof(int64_t));
        st->asserts[st->n_asserts++] = it->a;
        if (it->oofb && st->cur) {
            Ev e; ev_init(&e, st->k_abort);
            e.s[S_REASON] = st->r_oofb;
            e.key = 2;
            draft_push(st->cur, &e);
        }
        return;
    }
    if (!started && !st->headers_seen && st->cur && st->cur->n) st->setup_at = st->cur->n;
    if (t == IT_COMPUTE && started) st->cur->compute_after = 1;
    else if (t == IT_MEASURE) st->has_pending_measure = 1;
    else if (t == IT_BUFSIZE) { st->has_pending_buffer = 1; st->pending_buffer = it->a; }
    else if (t == IT_ALIGN) {
        st->has_pending_align = 1; st->pending_align = it->a;
        if (st->cur && st->cur->alignment == MISSING) st->cur->alignment = it->a;
    }
    st->gap = st->gap || started;
}

static void feed_line(St *st, const char *s, int64_t n) {
    st->lineno++;
    if (n >= (1 << 20)) { decline(st, "over-long line"); return; }
    Item it;
    const Item *use;
    int t = parse_memo(st, s, n, &it, &use);
    if (t == IT_DECLINE) { decline(st, "line not understood"); return; }
    feed(st, use);
    take_snapshot(st);
    /* memory stays bounded: the Python path takes inputs that would hold more */
    if (st->pool.nbytes > (128LL << 20)) decline(st, "too many distinct names");
    if (st->cur && st->cur->n > (1 << 20)) decline(st, "a graph walk of more than 2^20 lines");
}

/* ---------- API: lines in ---------- */
/* the size of the struct ctypes mirrors (fastlog.py checks it at load: one changed without the other fails
   there, not in a call) */
EXPORT int64_t fl_sizeof(const char *name) { return !strcmp(name, "GraphOut") ? (int64_t)sizeof(GraphOut) : -1; }

EXPORT void *fl_new(void) {
    St *st = calloc(1, sizeof(St));
    Pool *P = &st->pool;
#define K(name, text) st->name = intern(P, text, (int64_t)strlen(text))
    K(k_alloc, "alloc"); K(k_free, "free"); K(k_exec, "exec"); K(k_reuse, "reuse"); K(k_no_reuse, "no_reuse");
    K(k_view_src, "view_src"); K(k_step, "step"); K(k_barrier, "barrier"); K(k_graph, "graph"); K(k_oom, "oom");
    K(k_abort, "abort"); K(r_external, "external"); K(r_layout, "layout"); K(r_output, "output");
    K(r_oofb, "out of free blocks"); K(k_none, "NONE"); K(k_empty, "");
#undef K
    st->next_key = 16;  /* 0 step, 1 barrier, 2 abort */
    st->setup_at = -1;
    st->measure_max = st->buffer = MISSING;
    st->measure_align = 16;
    st->seen_limit = SEEN_BYTES;
    st->cache_limit = CACHE_WORDS;
    st->memo_limit = MEMO_LIMIT;
    const char *timed = getenv("ALLOCTRACE_FASTLOG_TIMES");
    st->timed = timed && timed[0] == '1';
    return st;
}

/* smaller memo limits, for tests of what happens when they start over */
EXPORT void fl_tune(void *p, int64_t seen_bytes, int64_t cache_words, int64_t memo_lines) {
    St *st = p;
    st->seen_limit = seen_bytes; st->cache_limit = cache_words; st->memo_limit = memo_lines;
}

EXPORT const char *fl_reason(void *p) { return ((St *)p)->reason; }
EXPORT int64_t fl_queued(void *p) { return ((St *)p)->qn; }
EXPORT int64_t fl_features(void *p, int64_t *out, int64_t cap) {
    St *st = p;
    if (!st->snap_taken) return -1;
    int64_t k = st->snap_n < cap ? st->snap_n : cap;
    memcpy(out, st->snap, k * sizeof(int64_t));
    return k;
}

/* feed decoded text (UTF-8); final: the text ended */
static int feed_block(St *st, const char *buf, int64_t len, int final);
EXPORT int fl_feed(void *p, const char *buf, int64_t len, int final) {
    St *st = p;
    if (!st->timed) return feed_block(st, buf, len, final);
    double t = now();
    int r = feed_block(st, buf, len, final);
    st->t_feed += now() - t;
    return r;
}
static int feed_block(St *st, const char *buf, int64_t len, int final) {
    if (st->declined) return -1;
    int64_t i = 0;
    if (st->ncarry) {
        const char *nl = memchr(buf, '\n', len);
        int64_t e = nl ? nl - buf : len;
        st->carry = grow(st->carry, &st->capcarry, st->ncarry + e + 1, 1);
        memcpy(st->carry + st->ncarry, buf, e);
        st->ncarry += e;
        if (st->ncarry >= (1 << 20)) { decline(st, "over-long line"); return -1; }
        if (!nl) goto end;
        feed_line(st, st->carry, st->ncarry);
        st->ncarry = 0;
        i = e + 1;
    }
    while (i < len && !st->declined) {
        const char *nl = memchr(buf + i, '\n', len - i);
        if (!nl) {
            int64_t e = len - i;
            if (e >= (1 << 20)) { decline(st, "over-long line"); return -1; }
            st->carry = grow(st->carry, &st->capcarry, e + 1, 1);
            memcpy(st->carry, buf + i, e);
            st->ncarry = e;
            break;
        }
        feed_line(st, buf + i, nl - (buf + i));
        i = nl - buf + 1;
    }
end:
    if (st->declined) return -1;
    if (final && !st->finished) {
        st->finished = 1;
        if (st->ncarry) { feed_line(st, st->carry, st->ncarry); st->ncarry = 0; }
        if (st->declined) return -1;
        int walk_ended = st->gap;
        Draft *d = st->cur;
        st->cur = NULL;
        if (d && d->n) {
            int32_t k = d->items[d->n - 1].s[S_KIND];
            int failed = k == st->k_oom || k == st->k_abort;
            d->incomplete = !(walk_ended || failed);
            queue_push(st, d);
            take_snapshot(st);
        } else draft_free(st, d);
        if (st->declined) return -1;
    }
    return 0;
}

/* ---------- the replay (recover.LegacyReplay over allocator/tallocr.LegacyTallocr) ---------- */
EXPORT void fl_configure(void *p, int skips_last, int64_t max_free_blocks, int64_t backend_alignment,
                         int64_t backend_slack, const int64_t *alignments, int n) {
    St *st = p;
    st->configured = 1;
    st->skips_last = skips_last; st->max_free_blocks = max_free_blocks; st->backend_alignment = backend_alignment;
    st->backend_slack = backend_slack;
    st->n_alignments = n < 8 ? n : 8;
    for (int i = 0; i < st->n_alignments; i++) st->alignments[i] = alignments[i];
}

static int64_t pad_to(int64_t size, int64_t a) { return (size + a - 1) / a * a; }

static void t_new(St *st, int64_t base, int64_t size, int64_t align, int measure) {
    st->has_t = 1; st->t_base = base; st->t_size = size; st->t_align = align; st->t_measure = measure; st->t_max = 0;
}
static void t_reset(St *st) {
    int64_t m = (st->t_base % st->t_align + st->t_align) % st->t_align;
    int64_t off = ((st->t_align - m) % st->t_align + st->t_align) % st->t_align;
    st->addrs = grow(st->addrs, &st->capfree, 1, sizeof(int64_t));
    st->sizes = realloc(st->sizes, st->capfree * sizeof(int64_t));
    st->addrs[0] = st->t_base + off; st->sizes[0] = st->t_size - off; st->nfree = 1;
}
static void free_insert(St *st, int64_t pos, int64_t at, int64_t size) {
    int64_t oldcap = st->capfree;
    st->addrs = grow(st->addrs, &st->capfree, st->nfree + 1, sizeof(int64_t));
    if (st->capfree != oldcap) st->sizes = realloc(st->sizes, st->capfree * sizeof(int64_t));
    memmove(st->addrs + pos + 1, st->addrs + pos, (st->nfree - pos) * sizeof(int64_t));
    memmove(st->sizes + pos + 1, st->sizes + pos, (st->nfree - pos) * sizeof(int64_t));
    st->addrs[pos] = at; st->sizes[pos] = size; st->nfree++;
}
static void free_delete(St *st, int64_t pos) {
    memmove(st->addrs + pos, st->addrs + pos + 1, (st->nfree - pos - 1) * sizeof(int64_t));
    memmove(st->sizes + pos, st->sizes + pos + 1, (st->nfree - pos - 1) * sizeof(int64_t));
    st->nfree--;
}

/* carve nbytes; 0 ok (*addr, *block), 1 out of space (*needed, *largest) */
static int t_alloc(St *st, int64_t nbytes, int64_t *addr, int64_t *block, int64_t *needed, int64_t *largest) {
    int64_t size = pad_to(nbytes, st->t_align);
    int64_t n = st->skips_last ? st->nfree - 1 : st->nfree;
    int64_t best = -1, best_size = -1, max_avail = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = st->sizes[i];
        if (s > max_avail) max_avail = s;
        if (s >= size && (best_size < 0 || s <= best_size)) { best = i; best_size = s; }
    }
    int64_t printed = best;
    if (best == -1) {
        int64_t last = st->nfree - 1;
        if (st->skips_last && last >= 0 && st->sizes[last] >= size) best = last;
        else { *needed = size; *largest = max_avail; return 1; }
    }
    int64_t a = st->addrs[best];
    st->addrs[best] += size;
    st->sizes[best] -= size;
    if (st->sizes[best] == 0) free_delete(st, best);
    if (a - st->t_base + size > st->t_max) st->t_max = a - st->t_base + size;
    *addr = a; *block = printed;
    return 0;
}

/* give bytes back (tallocr.release); 1 when out of free blocks */
static int t_free(St *st, int64_t at, int64_t nbytes) {
    int64_t size = pad_to(nbytes, st->t_align), n = st->nfree;
    int64_t *A = st->addrs, *S = st->sizes;
    for (int64_t i = 0; i < n; i++) {
        if (A[i] + S[i] == at) {
            S[i] += size;
            if (i < n - 1 && A[i] + S[i] == A[i + 1]) { S[i] += S[i + 1]; free_delete(st, i + 1); }
            return 0;
        }
        if (at + size == A[i]) {
            A[i] = at; S[i] += size;
            if (i > 0 && A[i - 1] + S[i - 1] == A[i]) { S[i - 1] += S[i]; free_delete(st, i); }
            return 0;
        }
    }
    if (n >= st->max_free_blocks) return 1;
    int64_t pos = 0;
    while (pos < n && A[pos] < at) pos++;
    free_insert(st, pos, at, size);
    return 0;
}

static void t_summary(St *st, int64_t *nf, int64_t *largest, int64_t *total) {
    int64_t n = st->nfree, mx = 0, sum = 0, cnt = n;
    int64_t upto = n;
    if (st->t_measure && n) {
        upto = n - 1;
        int64_t tail = st->t_base + st->t_max - st->addrs[n - 1];
        if (tail < 0) tail = 0;
        cnt = n - 1;
        if (tail) { cnt++; if (tail > mx) mx = tail; sum += tail; }
    }
    for (int64_t i = 0; i < upto; i++) { if (st->sizes[i] > mx) mx = st->sizes[i]; sum += st->sizes[i]; }
    *nf = cnt; *largest = mx; *total = sum;
}

static void ensure_ids(St *st) {
    int64_t need = st->pool.n + 1;
    if (need <= st->cap_ids) return;
    int64_t old = st->cap_ids, c = old;
    st->op_stamp = grow(st->op_stamp, &c, need, sizeof(int64_t));
    int64_t c2 = old; st->local_stamp = grow(st->local_stamp, &c2, need, sizeof(int64_t));
    int64_t c3 = old; st->live_stamp = grow(st->live_stamp, &c3, need, sizeof(int64_t));
    st->op_val = realloc(st->op_val, c * sizeof(int32_t));
    st->local = realloc(st->local, c * sizeof(int32_t));
    st->live_head = realloc(st->live_head, c * sizeof(int64_t));
    st->live_tail = realloc(st->live_tail, c * sizeof(int64_t));
    for (int64_t i = old; i < c; i++) { st->op_stamp[i] = st->local_stamp[i] = st->live_stamp[i] = -1; }
    st->cap_ids = c;
}

/* live allocations per tensor (a FIFO of event indices) */
static void live_append(St *st, int32_t id, int64_t ev) {
    if (st->live_stamp[id] != st->stamp) { st->live_stamp[id] = st->stamp; st->live_head[id] = st->live_tail[id] = -1; }
    int64_t oldcap = st->caplive;
    st->lnext = grow(st->lnext, &st->caplive, st->nlive + 1, sizeof(int64_t));
    if (st->caplive != oldcap) st->lev = realloc(st->lev, st->caplive * sizeof(int64_t));
    int64_t e = st->nlive++;
    st->lnext[e] = -1; st->lev[e] = ev;
    if (st->live_tail[id] >= 0) st->lnext[st->live_tail[id]] = e; else st->live_head[id] = e;
    st->live_tail[id] = e;
}
static int64_t live_head(St *st, int32_t id) {
    return (id >= 0 && st->live_stamp[id] == st->stamp) ? st->live_head[id] : -1;
}
static int64_t live_popleft(St *st, int32_t id) {
    int64_t e = live_head(st, id);
    if (e < 0) return -1;
    st->live_head[id] = st->lnext[e];
    if (st->live_head[id] < 0) st->live_tail[id] = -1;
    return st->lev[e];
}
/* the first live allocation of `id` with this logged size, removed; -1 none */
static int64_t live_take(St *st, int32_t id, int64_t size, Ev *evs) {
    int64_t prev = -1;
    for (int64_t e = live_head(st, id); e >= 0; prev = e, e = st->lnext[e]) {
        if (evs[st->lev[e]].v[F_SIZE] == size) {
            if (prev < 0) st->live_head[id] = st->lnext[e]; else st->lnext[prev] = st->lnext[e];
            if (st->live_tail[id] == e) st->live_tail[id] = prev;
            return st->lev[e];
        }
    }
    return -1;
}

static void replay(St *st, Draft *d, GraphOut *out) {
    Ev *E = d->items;
    int64_t n = d->n;
    int measure = st->index == 0 || d->compute_after || d->measure_before;
    int64_t align = d->alignment != MISSING && d->alignment ? d->alignment : 16;
    if (measure) {
        t_new(st, 0x1000, 1LL << 40, align, 1);
        t_reset(st);
        st->life = 1; st->buffer = MISSING;
    } else if (st->life != 2 || d->buffer_before != MISSING) {
        align = d->alignment != MISSING && d->alignment ? d->alignment : st->measure_align;
        int backend = align == st->backend_alignment;  /* a CPU backend buffer: its own slack beyond the size */
        int64_t padb = backend ? 0 : align;
        if (d->buffer_before != MISSING && d->buffer_before) st->buffer = d->buffer_before;
        else st->buffer = (st->measure_max != MISSING && st->measure_max) ? st->measure_max + padb : MISSING;
        t_new(st, 0, st->buffer != MISSING && st->buffer ? st->buffer + (backend ? st->backend_slack : 0) : (1LL << 40),
              align, 0);
        t_reset(st);
        st->life = 2;
    } else t_reset(st);
    ensure_ids(st);
    st->stamp++;
    /* ops_from_exec */
    int oom_next = 0;
    for (int64_t i = n - 1; i >= 0; i--) {
        Ev *e = &E[i];
        int32_t k = e->s[S_KIND], t = e->s[S_TENSOR];
        if (k == st->k_exec) {
            st->op_stamp[t] = st->stamp; st->op_val[t] = e->s[S_OP];
        } else if (k == st->k_alloc && e->s[S_OP] < 0) {
            if (t >= 0 && st->op_stamp[t] == st->stamp) e->s[S_OP] = st->op_val[t];
            else if (!oom_next) e->s[S_OP] = st->k_none;
        } else if (k == st->k_reuse && e->s[S_OP] < 0) {
            if (t >= 0 && st->op_stamp[t] == st->stamp) e->s[S_OP] = st->op_val[t];
        }
        oom_next = k == st->k_oom;
    }
    /* the walk through the allocator */
    int ok = 1, pending = 0;
    int64_t p_needed = 0, p_largest = 0;
    int32_t oom_tensor = -1;
    st->nlive = 0;
    int32_t empty = st->k_empty;
    for (int64_t i = 0; i < n; i++) {
        Ev *e = &E[i];
        int32_t k = e->s[S_KIND];
        if (k == st->k_alloc) {
            if (e->v[F_BLOCK] == MISSING) continue;
            int64_t addr, block, needed, largest;
            if (t_alloc(st, e->v[F_SIZE], &addr, &block, &needed, &largest)) {
                pending = 1; p_needed = needed; p_largest = largest; oom_tensor = e->s[S_TENSOR];
                ok = ok && e->v[F_BLOCK] == -1;
                continue;
            }
            if (block != e->v[F_BLOCK]) ok = 0;
            e->v[F_OFFSET] = addr - st->t_base;
            live_append(st, e->s[S_TENSOR], i);
            t_summary(st, &e->v[F_N_FREE], &e->v[F_LARGEST_FREE], &e->v[F_TOTAL_FREE]);
        } else if (k == st->k_free) {
            int64_t src = live_take(st, e->s[S_TENSOR], e->v[F_SIZE], E);
            if (src < 0) src = live_take(st, empty, e->v[F_SIZE], E);
            if (src < 0 || e->v[F_N_FREE_BEFORE] != st->nfree) ok = 0;
            if (src >= 0) {
                int64_t addr = st->t_base + E[src].v[F_OFFSET];
                if (t_free(st, addr, e->v[F_SIZE])) { ok = 0; continue; }
                e->v[F_OFFSET] = addr - st->t_base;
                t_summary(st, &e->v[F_N_FREE], &e->v[F_LARGEST_FREE], &e->v[F_TOTAL_FREE]);
            }
        } else if (k == st->k_reuse) {
            int32_t from = e->s[S_VIEW_SRC] >= 0 && st->pool.len[e->s[S_VIEW_SRC]] > 0 ? e->s[S_VIEW_SRC] : e->s[S_PARENT];
            int64_t src = from >= 0 ? live_popleft(st, from) : -1;
            if (src >= 0) live_append(st, e->s[S_TENSOR], src);
        } else if (k == st->k_oom) {
            if (e->s[S_TENSOR] < 0) e->s[S_TENSOR] = oom_tensor;
            if (!pending) {
                int64_t addr, block, needed, largest;
                if (t_alloc(st, e->v[F_NEEDED], &addr, &block, &needed, &largest)) {
                    pending = 1; p_needed = needed; p_largest = largest;
                }
            }
            if (!pending || p_needed != e->v[F_NEEDED] || p_largest != e->v[F_LARGEST]) ok = 0;
            pending = 0;
        }
    }
    out->consistent = ok && !pending;
    out->max_size = st->t_max;
    out->role = measure ? 0 : 1;
    out->has_buffer = st->buffer != MISSING;
    out->buffer_size = st->buffer;
    out->has_oom = 0;
    for (int64_t i = 0; i < n; i++) {
        if (E[i].s[S_KIND] == st->k_oom) {
            out->has_oom = 1;
            out->oom_needed = E[i].v[F_NEEDED]; out->oom_largest = E[i].v[F_LARGEST];
            int32_t t = E[i].s[S_TENSOR];
            out->oom_has_tensor = t >= 0;
            out->oom_tensor = t >= 0 ? st->pool.bytes + st->pool.off[t] : "";
            out->oom_tensor_len = t >= 0 ? st->pool.len[t] : 0;
            break;
        }
    }
    if (measure) {
        st->measure_max = st->t_max;
        if (d->alignment != MISSING && d->alignment) st->measure_align = d->alignment;
        else {
            int64_t found = 16;
            int any = 0;
            for (int64_t i = 0; i < n; i++) if (E[i].s[S_KIND] == st->k_alloc) { any = 1; break; }
            if (any) {
                for (int a = 0; a < st->n_alignments; a++) {
                    int all = 1;
                    for (int64_t i = 0; i < n && all; i++)
                        if (E[i].s[S_KIND] == st->k_alloc && E[i].v[F_SIZE] % st->alignments[a]) all = 0;
                    if (all) { found = st->alignments[a]; break; }
                }
            }
            st->measure_align = found;
        }
    }
    out->index = st->index++;
}

/* ---------- column bytes seen before ---------- */

static void seen_clear(St *st) {
    st->nseen = st->nseen_bytes = 0;
    st->seen_epoch++;
    if (st->seen_index) memset(st->seen_index, 0xff, st->nseen_index * sizeof(int32_t));
}
/* the number of these bytes; *was: seen before */
static int64_t seen_id(St *st, const char *p, int64_t n, int64_t *was) {
    if (!st->seen_index || (st->nseen + 1) * 2 > st->nseen_index) {
        int64_t m = st->seen_index ? st->nseen_index * 2 : 4096;
        free(st->seen_index);
        st->seen_index = malloc(m * sizeof(int32_t));
        memset(st->seen_index, 0xff, m * sizeof(int32_t));
        st->nseen_index = m;
        for (int64_t e = 0; e < st->nseen; e++) {
            uint64_t h = hash_bytes(st->seen_bytes + st->seen_off[e], st->seen_len[e]) & (m - 1);
            while (st->seen_index[h] >= 0) h = (h + 1) & (m - 1);
            st->seen_index[h] = (int32_t)e;
        }
    }
    uint64_t h = hash_bytes(p, n) & (st->nseen_index - 1);
    while (st->seen_index[h] >= 0) {
        int64_t e = st->seen_index[h];
        if (st->seen_len[e] == n && memcmp(st->seen_bytes + st->seen_off[e], p, n) == 0) { *was = 1; return e; }
        h = (h + 1) & (st->nseen_index - 1);
    }
    st->seen_bytes = grow(st->seen_bytes, &st->capseen_bytes, st->nseen_bytes + n + 1, 1);
    memcpy(st->seen_bytes + st->nseen_bytes, p, n);
    int64_t oldcap = st->capseen;
    st->seen_off = grow(st->seen_off, &st->capseen, st->nseen + 1, sizeof(int64_t));
    if (st->capseen != oldcap) st->seen_len = realloc(st->seen_len, st->capseen * sizeof(int64_t));
    int64_t e = st->nseen++;
    st->seen_off[e] = st->nseen_bytes; st->seen_len[e] = n;
    st->nseen_bytes += n;
    st->seen_index[h] = (int32_t)e;
    *was = 0;
    return e;
}

/* ---------- columns (columns.encode) ---------- */
static void encode(St *st, Draft *d, GraphOut *out) {
    Ev *E = d->items;
    int64_t n = d->n;
    out->n = n;
    /* the range of every integer field in one pass, then each present field's column */
    int64_t total = 0;
    int64_t isz[N_INTS], lo[N_INTS], hi[N_INTS];
    for (int f = 0; f < N_INTS; f++) { lo[f] = INT64_MAX; hi[f] = INT64_MIN; }
    for (int64_t i = 0; i < n; i++) {  /* an event at a time: 16 independent bounds; a bound moves rarely */
        const int64_t *v = E[i].v;
#pragma GCC unroll 16
        for (int f = 0; f < N_INTS; f++) {
            int64_t x = v[f];
            if (x < lo[f] && x != MISSING) lo[f] = x;
            if (x > hi[f]) hi[f] = x;
        }
    }
    for (int f = 0; f < N_INTS; f++) {
        int64_t l = lo[f], h = hi[f];
        isz[f] = 0;
        if (l <= h) {
            if (l > INT8_MIN && h <= INT8_MAX) isz[f] = 1;
            else if (l > INT16_MIN && h <= INT16_MAX) isz[f] = 2;
            else if (l > INT32_MIN && h <= INT32_MAX) isz[f] = 4;
            else isz[f] = 8;
        }
        total += isz[f] * n;
    }
    total += N_STRS * 4 * n;
    st->colbuf = grow(st->colbuf, &st->capcol, total + 8, 1);
    char *w = st->colbuf;
    for (int f = 0; f < N_INTS; f++) {
        out->itemsize[f] = isz[f];
        out->cols[f] = w;
        w += isz[f] * n;
    }
    /* the string fields' ids, a column each (made codes in place below), 8-byte aligned (the slack of `total`) */
    int32_t *sid = (int32_t *)(st->colbuf + ((w - st->colbuf + 7) & ~(int64_t)7));
    int32_t present[N_STRS] = {0};
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        for (int f = 0; f < N_STRS; f++) {
            int32_t *c = sid + f * n, any = 0;
            for (int64_t i = i0; i < i1; i++) { int32_t id = E[i].s[f]; c[i] = id; any |= id >= 0; }
            present[f] |= any;
        }
        for (int f = 0; f < N_INTS; f++) {
            char *c = (char *)out->cols[f];
            switch (isz[f]) {
            case 1: for (int64_t i = i0; i < i1; i++) { int64_t v = E[i].v[f]; int8_t x = v == MISSING ? INT8_MIN : (int8_t)v; memcpy(c + i, &x, 1); } break;
            case 2: for (int64_t i = i0; i < i1; i++) { int64_t v = E[i].v[f]; int16_t x = v == MISSING ? INT16_MIN : (int16_t)v; memcpy(c + 2 * i, &x, 2); } break;
            case 4: for (int64_t i = i0; i < i1; i++) { int64_t v = E[i].v[f]; int32_t x = v == MISSING ? INT32_MIN : (int32_t)v; memcpy(c + 4 * i, &x, 4); } break;
            case 8: for (int64_t i = i0; i < i1; i++) memcpy(c + 8 * i, &E[i].v[f], 8); break;
            }
        }
    }
    /* the string table: first appearance over kind, tensor, op, parent, view_src, reason, srcs, extra */
    ensure_ids(st);
    st->stamp++;
    st->ntable_ids = 0;
    int64_t used = w - st->colbuf;  /* bytes of the present columns */
    for (int f = 0; f < N_STRS; f++) {  /* a field at a time, over its ids in a row (the table's order) */
        int32_t *c = sid + f * n;
        out->itemsize[N_INTS + f] = present[f] ? 4 : 0;
        out->cols[N_INTS + f] = (const char *)c;
        if (!present[f]) continue;
        used += 4 * n;
        int64_t *stamps = st->local_stamp, stamp = st->stamp;  /* in registers: the stores below alias nothing */
        int32_t *local = st->local;
        for (int64_t i = 0; i < n; i++) {
            int32_t id = c[i];
            if (id < 0) continue;  /* -1 stays -1 */
            if (stamps[id] != stamp) {
                stamps[id] = stamp;
                local[id] = (int32_t)st->ntable_ids;
                st->table_ids = grow(st->table_ids, &st->cap_table_ids, st->ntable_ids + 1, sizeof(int32_t));
                st->table_ids[st->ntable_ids++] = id;
            }
            c[i] = local[id];
        }
    }
    /* the table as JSON; the previous graph's text stands when its strings are the same ones */
    int same_ids = st->table_made && st->nprev_ids == st->ntable_ids &&
                   memcmp(st->prev_ids, st->table_ids, st->ntable_ids * sizeof(int32_t)) == 0;
    if (!same_ids) {
        st->ntable = 0;
        put(&st->table, &st->ntable, &st->captable, "[", 1);
        for (int64_t j = 0; j < st->ntable_ids; j++) {
            int32_t id = st->table_ids[j];
            if (j) put(&st->table, &st->ntable, &st->captable, ", ", 2);
            put_json_str(&st->table, &st->ntable, &st->captable, st->pool.bytes + st->pool.off[id], st->pool.len[id]);
        }
        put(&st->table, &st->ntable, &st->captable, "]", 1);
        st->prev_ids = grow(st->prev_ids, &st->cap_prev_ids, st->ntable_ids + 1, sizeof(int32_t));
        memcpy(st->prev_ids, st->table_ids, st->ntable_ids * sizeof(int32_t));
        st->nprev_ids = st->ntable_ids;
        st->table_made = 1;
    }
    out->table = st->table; out->table_len = st->ntable;
    out->incomplete = d->incomplete;
    /* which columns repeat the previous encoded graph's, or bytes numbered before (their packed bytes are
       reused); the numbers start over between graphs only, and a huge graph's columns get none */
    int number = used <= st->seen_limit;
    if (number && st->nseen_bytes + used > st->seen_limit) seen_clear(st);
    for (int f = 0; f < N_INTS + N_STRS; f++) {
        int64_t sz = out->itemsize[f], off = out->cols[f] - st->colbuf;
        out->same[f] = st->prev_n == n && st->prev_size[f] == sz && sz &&
                       memcmp(st->prevcol + st->prev_off[f], out->cols[f], sz * n) == 0;
        st->prev_off[f] = off; st->prev_size[f] = sz;
        out->blob[f] = -1; out->seen[f] = 0;
        if (sz && !out->same[f] && number) out->blob[f] = seen_id(st, out->cols[f], sz * n, &out->seen[f]);
    }
    out->seen_epoch = st->seen_epoch;
    out->same[N_INTS + N_STRS] = same_ids;  /* other strings (ids are distinct strings): other JSON */
    st->prev_n = n;
    /* this graph's columns become the previous ones; the next graph writes into the other buffer */
    char *t = st->prevcol; int64_t tc = st->capprevcol;
    st->prevcol = st->colbuf; st->capprevcol = st->capcol;
    st->colbuf = t; st->capcol = tc;
}

/* ---------- the recovery cache (recover_fast.RecoveryCache) ---------- */

static int64_t state_words(St *st, int64_t *w) {  /* everything `replay` reads besides the draft */
    int64_t k = 0;
    w[k++] = st->index == 0; w[k++] = st->life; w[k++] = st->measure_max; w[k++] = st->measure_align;
    w[k++] = st->buffer; w[k++] = st->has_t;
    if (st->has_t) {
        w[k++] = st->t_base; w[k++] = st->t_size; w[k++] = st->t_align; w[k++] = st->t_measure; w[k++] = st->t_max;
        w[k++] = st->nfree;
        for (int64_t i = 0; i < st->nfree; i++) { w[k++] = st->addrs[i]; w[k++] = st->sizes[i]; }
    }
    return k;
}
static void state_restore(St *st, const int64_t *w) {
    int64_t k = 1;
    st->life = (int)w[k++]; st->measure_max = w[k++]; st->measure_align = w[k++]; st->buffer = w[k++];
    st->has_t = (int)w[k++];
    if (st->has_t) {
        st->t_base = w[k++]; st->t_size = w[k++]; st->t_align = w[k++]; st->t_measure = (int)w[k++]; st->t_max = w[k++];
        int64_t n = w[k++];
        int64_t oldcap = st->capfree;
        st->addrs = grow(st->addrs, &st->capfree, n + 1, sizeof(int64_t));
        if (st->capfree != oldcap) st->sizes = realloc(st->sizes, st->capfree * sizeof(int64_t));
        for (int64_t i = 0; i < n; i++) { st->addrs[i] = w[k++]; st->sizes[i] = w[k++]; }
        st->nfree = n;
    }
}
static int64_t draft_key(St *st, Draft *d) {  /* into st->keybuf: [length, state..., hints..., item keys...] */
    st->keybuf = grow(st->keybuf, &st->capkey, 32 + 2 * st->nfree + d->n, sizeof(int64_t));
    int64_t *w = st->keybuf, k = 1;
    k += state_words(st, w + k);
    w[k++] = d->measure_before; w[k++] = d->compute_after; w[k++] = d->buffer_before; w[k++] = d->alignment;
    w[k++] = d->n_exec; w[k++] = d->n;
    for (int64_t i = 0; i < d->n; i++) w[k++] = d->items[i].key;
    w[0] = k;
    return k;
}
static uint64_t key_hash(const int64_t *w, int64_t k) { return hash_bytes((const char *)w, k * 8); }

static void cache_clear(St *st) {
    for (int64_t i = 0; i < st->ncache; i++) { free(st->cache_keys[i]); free(st->cache_ends[i]); }
    st->ncache = 0; st->cache_words = 0; st->epoch++;
    if (st->cache_index) memset(st->cache_index, 0xff, st->ncache_index * sizeof(int32_t));
}
static int64_t cache_find(St *st, const int64_t *w, int64_t k) {
    if (!st->ncache_index) return -1;
    uint64_t h = key_hash(w, k) & (st->ncache_index - 1);
    while (st->cache_index[h] >= 0) {
        int64_t e = st->cache_index[h];
        if (st->cache_keys[e][0] == k && memcmp(st->cache_keys[e], w, k * 8) == 0) return e;
        h = (h + 1) & (st->ncache_index - 1);
    }
    return -1;
}
static void cache_insert(St *st, const int64_t *w, int64_t k, int64_t slot) {
    int64_t end[64 + 2 * 256];
    int64_t ke = 0;
    if (st->nfree > 256) return;
    ke = state_words(st, end);
    if (st->cache_words + k + ke > st->cache_limit) cache_clear(st);
    if (!st->ncache_index || (st->ncache + 1) * 2 > st->ncache_index) {
        int64_t n = st->ncache_index ? st->ncache_index * 2 : 1024;
        free(st->cache_index);
        st->cache_index = malloc(n * sizeof(int32_t));
        memset(st->cache_index, 0xff, n * sizeof(int32_t));
        st->ncache_index = n;
        for (int64_t e = 0; e < st->ncache; e++) {
            uint64_t h = key_hash(st->cache_keys[e], st->cache_keys[e][0]) & (n - 1);
            while (st->cache_index[h] >= 0) h = (h + 1) & (n - 1);
            st->cache_index[h] = (int32_t)e;
        }
    }
    int64_t oldcap = st->capcache;
    st->cache_keys = grow(st->cache_keys, &st->capcache, st->ncache + 1, sizeof(int64_t *));
    if (st->capcache != oldcap) {
        st->cache_ends = realloc(st->cache_ends, st->capcache * sizeof(int64_t *));
        st->cache_slot = realloc(st->cache_slot, st->capcache * sizeof(int64_t));
    }
    int64_t e = st->ncache++;
    st->cache_keys[e] = malloc(k * 8); memcpy(st->cache_keys[e], w, k * 8);
    st->cache_ends[e] = malloc(ke * 8); memcpy(st->cache_ends[e], end, ke * 8);
    st->cache_slot[e] = slot;
    st->cache_words += k + ke;
    uint64_t h = key_hash(w, k) & (st->ncache_index - 1);
    while (st->cache_index[h] >= 0) h = (h + 1) & (st->ncache_index - 1);
    st->cache_index[h] = (int32_t)e;
}

/* replay and encode the next finished graph: 1 one is in *out, 0 none queued, -1 declined */
EXPORT int fl_next(void *p, GraphOut *out) {
    St *st = p;
    if (st->declined) return -1;
    if (!st->configured) { decline(st, "not configured"); return -1; }
    draft_free(st, st->out_draft);
    st->out_draft = NULL;
    if (!st->qn) { st->qhead = 0; return 0; }
    Draft *d = st->queue[st->qhead++];
    st->qn--;
    if (!st->qn) st->qhead = 0;
    if (d->alignment != MISSING && (d->alignment < 0 || d->alignment > (1 << 30))) {
        decline(st, "odd alignment"); draft_free(st, d); return -1;
    }
    double t0 = st->timed ? now() : 0;
    int64_t k = draft_key(st, d);
    int64_t e = cache_find(st, st->keybuf, k);
    if (st->timed) st->t_key += now() - t0;
    out->incomplete = d->incomplete;
    out->n = d->n;
    if (e >= 0) {  /* the graph the replay would produce again: jump to the state it would reach */
        state_restore(st, st->cache_ends[e]);
        out->index = st->index++;
        out->slot = st->cache_slot[e];
        out->hit = 1;
        out->epoch = st->epoch;
        st->out_draft = d;
        return 1;
    }
    double t1 = st->timed ? now() : 0;
    replay(st, d, out);
    double t2 = st->timed ? now() : 0;
    encode(st, d, out);
    if (st->timed) { double t3 = now(); st->t_replay += t2 - t1; st->t_encode += t3 - t2; }
    out->slot = st->next_slot++;
    out->hit = 0;
    cache_insert(st, st->keybuf, k, out->slot);
    out->epoch = st->epoch;
    st->out_draft = d;
    return 1;
}

/* The walk fl_next handed out has been read (its columns compressed): a long one's buffers go back now,
   so the caller does not store it while they are held (a million events: ~170 MB of items and two copies
   of the columns). The next walk's columns are then compared with nothing. */
EXPORT void fl_release(void *p) {
    St *st = p;
    Draft *d = st->out_draft;
    if (!d || d->n <= RELEASE_EVENTS) return;
    st->out_draft = NULL;
    draft_free(NULL, d);
    draft_free(NULL, st->spare);
    st->spare = NULL;
    free(st->colbuf); st->colbuf = NULL; st->capcol = 0;
    free(st->prevcol); st->prevcol = NULL; st->capprevcol = 0;
    st->prev_n = -1;
}

EXPORT void fl_free(void *p) {
    St *st = p;
    if (!st) return;
    if (st->timed)
        fprintf(stderr, "fastlog: feed %.4f s, cache key %.4f s, replay %.4f s, encode %.4f s; %lld lines; memo %lld hits of %lld (%lld not looked up, %lld guessed)\n",
                st->t_feed, st->t_key, st->t_replay, st->t_encode, (long long)st->lineno, (long long)st->n_hits,
                (long long)st->n_looks, (long long)st->n_skipped, (long long)st->n_guess);
    free(st->pool.bytes); free(st->pool.off); free(st->pool.len); free(st->pool.hash); free(st->pool.slots);
    free(st->memo.start); free(st->memo.len); free(st->memo.hash); free(st->memo.item); free(st->memo.hist); free(st->memo.last); free(st->memo.bytes); free(st->memo.slots);
    free(st->carry);
    draft_free(st, st->cur); draft_free(st, st->out_draft);
    for (int64_t i = 0; i < st->qn; i++) draft_free(st, st->queue[st->qhead + i]);
    free(st->queue); free(st->asserts);
    free(st->addrs); free(st->sizes);
    free(st->op_stamp); free(st->op_val); free(st->local); free(st->local_stamp);
    free(st->live_head); free(st->live_tail); free(st->live_stamp); free(st->lnext); free(st->lev);
    if (st->spare) { free(st->spare->items); free(st->spare); }
    free(st->scratch);
    cache_clear(st);
    free(st->cache_keys); free(st->cache_ends); free(st->cache_slot); free(st->cache_index); free(st->keybuf);
    free(st->colbuf); free(st->prevcol); free(st->prev_ids);
    free(st->seen_bytes); free(st->seen_off); free(st->seen_len); free(st->seen_index); free(st->table); free(st->table_ids);
    free(st);
}
