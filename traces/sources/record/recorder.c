/*
 * alloctrace recorder: a preloaded library that watches ggml's graph allocator in an unmodified program.
 *
 * It defines the few ggml entry points the allocator is driven through (gallocr create/reserve/alloc,
 * ggml_backend_tensor_alloc, ggml_backend_view_init, ggml_backend_buft_alloc_buffer, a few scheduler calls),
 * writes what it sees as one text line per fact, and forwards every call to the real function. Calls that
 * bypass the dynamic linker's global scope (a Python program's ctypes handle) are caught through dlsym.
 *
 * Its length: one preloaded library is one translation unit (the program loads a single file); the hooks
 * share the output stream and the tensor layout they read.
 *
 * No ggml header is needed: tensors are read at offsets chosen by the ggml version and checked against
 * ggml's own accessors (ggml_get_name, ggml_get_data, ggml_nelements, ggml_nbytes, ggml_op_desc). Built with
 * -DAT_GGML_H, the offsets come from the user's ggml.h instead.
 *
 * Stream (docs/record.md): lines `KIND field...`; names are the last field, escaped (\\ \n \r).
 * Each thread composes its lines in its own buffer; a mutex orders whole chunks into the file; a crash
 * signal writes the pending chunk before the program dies. The mutex never turns a program's end into a hang:
 * a thread that already holds it (an assert or exit inside a ggml function asked under it) writes without
 * taking it again, and fork() waits for it, so the child never starts with it held by a thread it lacks.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef AT_GGML_H
#include <stddef.h> /* the user's ggml.h comes in with -include */
#endif

#define AT_EXPORT __attribute__((visibility("default")))
#define MAX_BUFS 16
#define MAX_SRC 10
#define MAX_DEPTH 16

/* ------------------------------------------------------------------ tensor layouts */
struct layout {
    const char *name;
    int type, buffer, ne, nb, op, flags, src, view_src, view_offs, data, name_off, cgraph_leafs;
};
/* ggml_tensor across 2024..today: type, [backend], buffer, ne, nb, op, op_params[16], flags, [grad],
 * src[10], [perf_runs, perf_cycles, perf_time_us], view_src, view_offs, data, name[64], extra.
 * The optional fields set the three layouts; ggml_cgraph gained grad_accs (leafs moved) with the grad removal. */
static const struct layout LAYOUTS[] = {
    {"2024-02", 0, 8, 16, 48, 80, 148, 160, 264, 272, 280, 288, 32}, /* grad + perf counters (v3 gallocr) */
    {"2024-06", 0, 8, 16, 48, 80, 148, 160, 240, 248, 256, 264, 32}, /* perf counters removed */
    {"2024-11", 0, 8, 16, 48, 80, 148, 152, 232, 240, 248, 256, 40}, /* grad removed: ggml 0.9 .. today */
};
static struct layout L;
static int layout_state; /* 0 unknown, 1 ok, -1 refused */

/* ------------------------------------------------------------------ ggml functions we call */
typedef const char *(*str_fn)(void);
typedef const char *(*tstr_fn)(const void *);
typedef void *(*tptr_fn)(const void *);
typedef size_t (*tsize_fn)(const void *);
typedef int64_t (*ti64_fn)(const void *);
typedef const char *(*istr_fn)(int);
typedef int64_t (*ii64_fn)(int);
typedef size_t (*isize_fn)(int);
typedef int (*gint_fn)(void *);
typedef void *(*gnode_fn)(void *, int);
typedef size_t (*gbsize_fn)(void *, int);
typedef size_t (*bsz2_fn)(void *, const void *);

static void *(*real_dlsym)(void *, const char *);
static void *g_lib; /* the libggml-base the program uses */

static struct {
    str_fn version, commit;
    tstr_fn get_name, op_desc;
    tptr_fn get_data, buffer_get_base, buffer_get_type;
    tsize_fn nbytes, buft_alignment, buft_max_size, buffer_get_size;
    ti64_fn nelements;
    istr_fn op_name, type_name;
    ii64_fn blck_size;
    isize_fn type_size;
    gint_fn graph_n_nodes;
    gnode_fn graph_node;
    gbsize_fn get_buffer_size;
    tstr_fn buft_name;
    bsz2_fn buft_alloc_size;
    int ready;
} G;

/* ------------------------------------------------------------------ output */
static int g_fd = -1;
static pid_t g_pid;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_holds_mu; /* this thread holds g_mu (it asks ggml functions under it) */
static unsigned long g_seq;
static __thread char *t_buf;
static __thread size_t t_len, t_cap;
static __thread int t_in; /* inside our own code: skip nested interposed calls we make ourselves */
static __thread unsigned long t_stack[MAX_DEPTH];
static __thread int t_depth;
static __thread struct { void *galloc, *graph; bool consumed; } t_reserve; /* ggml_gallocr_reserve pending */

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void mu_lock(void) {
    pthread_mutex_lock(&g_mu);
    t_holds_mu = 1;
}

static void mu_unlock(void) {
    t_holds_mu = 0;
    pthread_mutex_unlock(&g_mu);
}

/* fork() while another thread holds g_mu would leave the child a mutex locked by a thread it does not have:
   its first recorded call would wait for ever. The fork waits for the mutex instead (unless this thread holds
   it: a fork from inside a ggml function asked under it), and both sides carry on with it free. */
static __thread int t_fork_locked;
static void before_fork(void) {
    if (!t_holds_mu) mu_lock(), t_fork_locked = 1;
}
static void after_fork_parent(void) {
    if (t_fork_locked) t_fork_locked = 0, mu_unlock();
}
static void after_fork_child(void) {
    if (t_fork_locked) t_fork_locked = 0, t_holds_mu = 0, pthread_mutex_init(&g_mu, NULL);
}

/* The record folder: the one the command made for this run, this user's and no one else's, checked on the
   opened folder rather than its path. Once the command has collected the run's results the folder is gone
   (renamed away), so a process the program left running records nothing more; a folder planted at that
   path belongs to another user (or is a link) and is refused. */
static int open_record_dir(void) {
    const char *dir = getenv("ALLOCTRACE_RECORD_DIR");
    if (!dir) return -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return -1;
    struct stat st;
    if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        close(dfd);
        return -1;
    }
    return dfd;
}

/* a new file of this process in the record folder: never one that is there already, never through a link
   (a process that execs keeps its pid: its next program writes rec-PID-2 and so on) */
static void open_stream(void) {
    pid_t pid = getpid();
    if (g_pid == pid) return; /* opened, or refused: once per process */
    g_fd = -1;
    g_pid = pid;
    int dfd = open_record_dir();
    if (dfd < 0) return;
    char name[64];
    for (int k = 1; k <= 64 && g_fd < 0; k++) {
        if (k == 1) snprintf(name, sizeof name, "rec-%d.atrec", (int)pid);
        else snprintf(name, sizeof name, "rec-%d-%d.atrec", (int)pid, k);
        g_fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_APPEND | O_CLOEXEC, 0600);
        if (g_fd < 0 && errno != EEXIST) break;
    }
    close(dfd);
    if (g_fd >= 0) {
        char head[64];
        int n = snprintf(head, sizeof head, "ATREC 1 %d\n", (int)pid);
        write_all(g_fd, head, (size_t)n);
    }
}

/* Started with no live record folder (after the run, or a planted one): this process records nothing, and
   the recorder leaves its environment, so the programs it starts neither load it nor look for the folder. */
static void leave_environment(void) {
    unsetenv("ALLOCTRACE_RECORD_DIR");
    Dl_info self;
    const char *pre = getenv("LD_PRELOAD");
    if (!pre || !dladdr((void *)leave_environment, &self) || !self.dli_fname) return;
    size_t n = strlen(pre);
    char *kept = malloc(n + 1), *copy = strdup(pre);
    if (!kept || !copy) {
        free(kept), free(copy);
        return;
    }
    kept[0] = 0;
    for (char *save = NULL, *w = strtok_r(copy, " :", &save); w; w = strtok_r(NULL, " :", &save)) {
        if (!strcmp(w, self.dli_fname)) continue;
        if (kept[0]) strcat(kept, ":");
        strcat(kept, w);
    }
    if (kept[0]) setenv("LD_PRELOAD", kept, 1);
    else unsetenv("LD_PRELOAD");
    free(kept), free(copy);
}

static void flush(void) {
    if (!t_len) return;
    int held = t_holds_mu; /* already this thread's: an abort or exit inside a ggml function asked under it */
    if (!held) mu_lock();
    open_stream();
    if (g_fd >= 0) write_all(g_fd, t_buf, t_len);
    if (!held) mu_unlock();
    t_len = 0;
}

/* at least n free bytes in this thread's buffer */
static bool room(size_t n) {
    if (t_buf && t_cap - t_len > n) return true;
    size_t cap = t_cap ? t_cap * 2 : 1 << 16;
    while (cap - t_len <= n) cap *= 2;
    char *nb = realloc(t_buf, cap);
    if (!nb) return false;
    t_buf = nb;
    t_cap = cap;
    return true;
}

static void put(const char *fmt, ...) {
    for (;;) {
        size_t room = t_cap - t_len;
        va_list ap;
        va_start(ap, fmt);
        int n = t_buf ? vsnprintf(t_buf + t_len, room, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && (size_t)n < room) {
            t_len += (size_t)n;
            return;
        }
        size_t cap = t_cap ? t_cap * 2 : 1 << 16;
        while (n >= 0 && cap - t_len <= (size_t)n) cap *= 2;
        char *nb = realloc(t_buf, cap);
        if (!nb) return;
        t_buf = nb;
        t_cap = cap;
    }
}

static void put_name(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (!room(2 * n + 2)) return;
    char *o = t_buf + t_len;
    *o++ = ' ';
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' || c == '\n' || c == '\r') *o++ = '\\', c = c == '\n' ? 'n' : c == '\r' ? 'r' : c;
        *o++ = c;
    }
    *o++ = '\n';
    t_len = (size_t)(o - t_buf);
}

/* lines reach the file at call boundaries (flush), so a call's lines stay together */
static void line_end(void) { put("\n"); }

/* a line a crash cut short (inside a ggml function asked for one of its fields) is left out: the recording
   ends with the lines before it and the crash's own line */
static void drop_cut_line(void) {
    while (t_len && t_buf[t_len - 1] != '\n') t_len--;
}

/* a crash (GGML_ASSERT aborts) writes this thread's pending lines, then dies as it would have */
static struct sigaction old_sa[32];
static void on_crash(int sig) {
    drop_cut_line();
    if (t_len) open_stream();
    if (t_len && g_fd >= 0) write_all(g_fd, t_buf, t_len), t_len = 0;
    if (g_fd >= 0) {
        char m[32];
        int n = snprintf(m, sizeof m, "X %d\n", sig);
        write_all(g_fd, m, (size_t)n);
    }
    sigaction(sig, &old_sa[sig], NULL);
    raise(sig);
}

__attribute__((constructor)) static void at_init(void) {
    if (getenv("ALLOCTRACE_RECORD_DIR")) {
        int dfd = open_record_dir();
        if (dfd < 0) leave_environment();
        else close(dfd);
    }
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_crash;
        sa.sa_flags = SA_RESETHAND | SA_NODEFER;
        sigaction(sigs[i], &sa, &old_sa[sigs[i]]);
    }
}

__attribute__((destructor)) static void at_fini(void) { flush(); }

/* ------------------------------------------------------------------ finding the real functions */
static void find_real_dlsym(void) {
    if (real_dlsym) return;
    static const char *vers[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; vers[i] && !real_dlsym; i++) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", vers[i]);
}

static void *g_lib_base; /* where that library is mapped */

static void lib_from_addr(void *p) {
    Dl_info info;
    if (g_lib || !p || !dladdr(p, &info) || !info.dli_fname) return;
    g_lib = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
    g_lib_base = info.dli_fbase;
}

static void *resolve(const char *name, void *own, void *caller) {
    find_real_dlsym();
    void *p = NULL;
    if (g_lib) p = real_dlsym(g_lib, name);
    if (!p || p == own) {
        p = real_dlsym(RTLD_NEXT, name);
        if (p && p != own) lib_from_addr(p);
    }
    if ((!p || p == own) && caller) {
        Dl_info info;
        if (dladdr(caller, &info) && info.dli_fname) {
            void *h = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
            if (h) p = real_dlsym(h, name);
            if (p && p != own) lib_from_addr(p);
        }
    }
    if (!p || p == own) {
        fprintf(stderr, "alloctrace recorder: cannot find the real %s\n", name);
        abort();
    }
    return p;
}

static void *opt(const char *name) {
    if (!g_lib) return NULL;
    return real_dlsym(g_lib, name);
}

static void load_ggml_functions(void) {
    if (G.ready || !g_lib) return;
    G.version = (str_fn)opt("ggml_version");
    G.commit = (str_fn)opt("ggml_commit");
    G.get_name = (tstr_fn)opt("ggml_get_name");
    G.op_desc = (tstr_fn)opt("ggml_op_desc");
    G.get_data = (tptr_fn)opt("ggml_get_data");
    G.buffer_get_base = (tptr_fn)opt("ggml_backend_buffer_get_base");
    G.buffer_get_type = (tptr_fn)opt("ggml_backend_buffer_get_type");
    G.buffer_get_size = (tsize_fn)opt("ggml_backend_buffer_get_size");
    G.nbytes = (tsize_fn)opt("ggml_nbytes");
    G.buft_alignment = (tsize_fn)opt("ggml_backend_buft_get_alignment");
    G.buft_max_size = (tsize_fn)opt("ggml_backend_buft_get_max_size");
    G.buft_name = (tstr_fn)opt("ggml_backend_buft_name");
    G.buft_alloc_size = (bsz2_fn)opt("ggml_backend_buft_get_alloc_size");
    G.nelements = (ti64_fn)opt("ggml_nelements");
    G.op_name = (istr_fn)opt("ggml_op_name");
    G.type_name = (istr_fn)opt("ggml_type_name");
    G.blck_size = (ii64_fn)opt("ggml_blck_size");
    G.type_size = (isize_fn)opt("ggml_type_size");
    G.graph_n_nodes = (gint_fn)opt("ggml_graph_n_nodes");
    G.graph_node = (gnode_fn)opt("ggml_graph_node");
    G.get_buffer_size = (gbsize_fn)opt("ggml_gallocr_get_buffer_size");
    G.ready = 1;
}

#define REAL(ret, name, args)                                                           \
    static ret(*real_##name) args;                                                      \
    if (!real_##name) real_##name = (ret(*) args)resolve(#name, (void *)name, __builtin_return_address(0))

/* ------------------------------------------------------------------ reading tensors */
#define F(t, off, T) (*(T *)((char *)(t) + (off)))

static bool check_tensor(const struct layout *l, const void *t) {
    if (!G.get_name || G.get_name(t) != (const char *)t + l->name_off) return false;
    if (G.get_data && G.get_data(t) != F(t, l->data, void *)) return false;
    int type = F(t, l->type, int);
    if (type < 0 || type > 1000 || (G.type_name && !G.type_name(type))) return false;
    const int64_t *ne = &F(t, l->ne, int64_t);
    const size_t *nb = &F(t, l->nb, size_t);
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        if (ne[i] < 0) return false;
        n *= ne[i];
    }
    if (G.nelements && G.nelements(t) != n) return false;
    if (n > 0 && G.nbytes && G.blck_size && G.type_size) {
        int64_t bs = G.blck_size(type);
        size_t sz = bs == 1 ? G.type_size(type) : (size_t)ne[0] * nb[0] / (size_t)bs;
        for (int i = bs == 1 ? 0 : 1; i < 4; i++) sz += (size_t)(ne[i] - 1) * nb[i];
        if (G.nbytes(t) != sz) return false;
    }
    int op = F(t, l->op, int);
    if (op < 0 || op > 1000) return false;
    if (G.op_desc && G.op_name && strcmp(G.op_name(op), "UNARY") != 0 && strcmp(G.op_name(op), G.op_desc(t)) != 0)
        return false;
    return true;
}

static const char *ver(void) { return G.version ? G.version() : "-"; }

/* choose the layout on the first tensor seen: by version when ggml says it, else the one that checks out */
static bool pick_layout(const void *t) {
    if (layout_state) return layout_state > 0;
    load_ggml_functions();
#ifdef AT_GGML_H
    struct layout h = {"ggml.h", offsetof(struct ggml_tensor, type), offsetof(struct ggml_tensor, buffer),
                       offsetof(struct ggml_tensor, ne), offsetof(struct ggml_tensor, nb),
                       offsetof(struct ggml_tensor, op), offsetof(struct ggml_tensor, flags),
                       offsetof(struct ggml_tensor, src), offsetof(struct ggml_tensor, view_src),
                       offsetof(struct ggml_tensor, view_offs), offsetof(struct ggml_tensor, data),
                       offsetof(struct ggml_tensor, name), AT_CGRAPH_LEAFS};
    int found = check_tensor(&h, t) ? 1 : 0;
    if (found) L = h;
#else
    int found = 0;
    size_t nl = sizeof LAYOUTS / sizeof LAYOUTS[0];
    if (G.version) { /* ggml_version() exists only after the grad removal */
        if (check_tensor(&LAYOUTS[nl - 1], t)) L = LAYOUTS[nl - 1], found = 1;
    } else {
        for (size_t i = 0; i < nl; i++)
            if (check_tensor(&LAYOUTS[i], t)) L = LAYOUTS[i], found++;
    }
#endif
    if (found == 1) {
        layout_state = 1;
        put("H ggml %s %s layout %s", ver(), G.commit ? G.commit() : "-", L.name);
        line_end();
        return true;
    }
    layout_state = -1;
    put("E layout %s %s %d %s", ver(), G.commit ? G.commit() : "-", found,
#ifdef AT_GGML_H
        "ggml.h"
#else
        "builtin"
#endif
    );
    line_end();
    flush();
    return false;
}

/* ------------------------------------------------------------------ buffer types and gallocrs */
struct galloc_info { void *g; int n; void *bufts[MAX_BUFS]; uint64_t last_hash; unsigned long last_seq; };
static struct galloc_info g_gallocs[256];
static int g_n_gallocs;
static void *g_bufts_seen[256];
static int g_n_bufts_seen;

static void note_buft(void *buft) {
    for (int i = 0; i < g_n_bufts_seen; i++)
        if (g_bufts_seen[i] == buft) return;
    if (g_n_bufts_seen < 256) g_bufts_seen[g_n_bufts_seen++] = buft;
    load_ggml_functions();
    put("T %p %zu %zu", buft, G.buft_alignment ? G.buft_alignment(buft) : 0,
        G.buft_max_size ? G.buft_max_size(buft) : SIZE_MAX);
    put_name(G.buft_name ? G.buft_name(buft) : "?");
}

static struct galloc_info *galloc_of(void *g) {
    for (int i = g_n_gallocs - 1; i >= 0; i--)
        if (g_gallocs[i].g == g) return &g_gallocs[i];
    return NULL;
}

static void new_galloc(void *g, void **bufts, int n) {
    mu_lock();
    struct galloc_info *gi = galloc_of(g);
    if (!gi && g_n_gallocs < 256) gi = &g_gallocs[g_n_gallocs++];
    if (gi) {
        gi->g = g;
        gi->last_hash = 0, gi->last_seq = 0;
        gi->n = n < MAX_BUFS ? n : MAX_BUFS;
        for (int i = 0; i < gi->n; i++) gi->bufts[i] = bufts[i];
    }
    for (int i = 0; i < n; i++) note_buft(bufts[i]);
    mu_unlock();
    put("N %p %d", g, n);
    for (int i = 0; i < n; i++) put(" %p", bufts[i]);
    line_end();
    flush();
}

/* ------------------------------------------------------------------ graphs */
static unsigned long cur_call(void) { return t_depth ? t_stack[(t_depth > MAX_DEPTH ? MAX_DEPTH : t_depth) - 1] : 0; }

struct pset { void **v; size_t cap, n; };

static bool pset_add(struct pset *s, void *p) {
    if (!p) return false;
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        void **v = calloc(cap, sizeof *v);
        if (!v) return false;
        for (size_t i = 0; i < s->cap; i++)
            if (s->v[i]) {
                size_t h = ((uintptr_t)s->v[i] >> 4) * 0x9E3779B97F4A7C15ull % cap;
                while (v[h]) h = (h + 1) % cap;
                v[h] = s->v[i];
            }
        free(s->v);
        s->v = v;
        s->cap = cap;
    }
    size_t h = ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull % s->cap;
    while (s->v[h]) {
        if (s->v[h] == p) return false;
        h = (h + 1) % s->cap;
    }
    s->v[h] = p;
    s->n++;
    return true;
}

static void put_tensor(char kind, void *t, const struct galloc_info *gi) {
    int type = F(t, L.type, int), op = F(t, L.op, int);
    const int64_t *ne = &F(t, L.ne, int64_t);
    const size_t *nb = &F(t, L.nb, size_t);
    size_t nbytes = G.nbytes(t);
    put("%c %p %s %s %s %d %lld %lld %lld %lld %zu %zu %zu %zu %zu %p %p %p %zu", kind, t, G.type_name(type),
        G.op_name(op), op == 0 ? "NONE" : G.op_desc(t), F(t, L.flags, int32_t), (long long)ne[0], (long long)ne[1],
        (long long)ne[2], (long long)ne[3], nb[0], nb[1], nb[2], nb[3], nbytes, F(t, L.data, void *),
        F(t, L.buffer, void *), F(t, L.view_src, void *), F(t, L.view_offs, size_t));
    int n_src = MAX_SRC;
    void **src = &F(t, L.src, void *);
    while (n_src > 0 && !src[n_src - 1]) n_src--;
    put(" %d", n_src);
    for (int i = 0; i < n_src; i++) put(" %p", src[i]);
    /* what the buffer types would allocate, when a type pads beyond nbytes (quantized rows on GPUs) */
    if (gi && G.buft_alloc_size && !F(t, L.data, void *) && !F(t, L.view_src, void *)) {
        bool differs = false;
        size_t sz[MAX_BUFS];
        for (int i = 0; i < gi->n; i++) {
            sz[i] = G.buft_alloc_size(gi->bufts[i], t);
            differs |= sz[i] != nbytes;
        }
        put(" %d", differs ? gi->n : 0);
        for (int i = 0; differs && i < gi->n; i++) put(" %zu", sz[i]);
    } else {
        put(" 0");
    }
    put_name(G.get_name(t));
}

static void **graph_leafs(void *graph, int n_leafs) {
    void **leafs = F(graph, L.cgraph_leafs, void **);
    if (n_leafs == 0) return leafs;
    int other = L.cgraph_leafs == 40 ? 32 : 40;
    for (int k = 0; k < 2; k++) {
        bool ok = leafs != NULL;
        for (int i = 0; ok && i < n_leafs; i++) ok = leafs[i] && F(leafs[i], L.op, int) == 0;
        if (ok) return leafs;
        leafs = F(graph, other, void **);
    }
    return NULL;
}

/* FNV-1a over 8-byte words (the tail bytewise): only compares a graph with the previous one */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* the whole graph: nodes, leafs, then every other tensor they point at (sources, view sources).
 * A graph identical to this gallocr's previous one (same tensors, same bytes up to the name, same buffer
 * ids: llama.cpp rebuilds the same decode graph each token) is written as a reference to it. */
static bool put_graph(void *graph, struct galloc_info *gi, const int *node_ids, const int *leaf_ids) {
    int n_nodes = F(graph, 4, int), n_leafs = F(graph, 8, int);
    if (G.graph_n_nodes && G.graph_n_nodes(graph) != n_nodes) {
        put("E graph: ggml_cgraph layout not recognised");
        line_end();
        return false;
    }
    void **nodes = F(graph, 16, void **);
    if (n_nodes > 0 && !pick_layout(nodes[0])) return false;
    void **leafs = graph_leafs(graph, n_leafs);
    if (n_leafs > 0 && !pick_layout(leafs[0])) return false;
    if (n_leafs > 0 && !leafs) {
        put("E graph: ggml_cgraph leafs not found");
        line_end();
        return false;
    }
    struct pset seen = {0};
    for (int i = 0; i < n_nodes; i++) pset_add(&seen, nodes[i]);
    for (int i = 0; i < n_leafs; i++) pset_add(&seen, leafs[i]);
    /* referenced tensors outside the graph, breadth first */
    void **queue = NULL;
    size_t qn = 0, qcap = 0;
    for (long k = 0; k < (long)n_leafs + n_nodes + (long)qn; k++) {
        void *t = k < n_leafs ? leafs[k] : k < (long)n_leafs + n_nodes ? nodes[k - n_leafs]
                                                                       : queue[k - n_leafs - n_nodes];
        void **src = &F(t, L.src, void *);
        for (int j = 0; j <= MAX_SRC; j++) {
            void *p = j < MAX_SRC ? src[j] : F(t, L.view_src, void *);
            if (pset_add(&seen, p)) {
                if (qn == qcap) {
                    qcap = qcap ? qcap * 2 : 64;
                    void **nq = realloc(queue, qcap * sizeof *queue);
                    if (!nq) break;
                    queue = nq;
                }
                queue[qn++] = p;
            }
        }
    }
    free(seen.v);
    uint64_t h = 0xcbf29ce484222325ull;
    h = hash_bytes(h, &n_nodes, sizeof n_nodes);
    h = hash_bytes(h, &n_leafs, sizeof n_leafs);
    if (node_ids) h = hash_bytes(h, node_ids, sizeof(int) * (size_t)n_nodes);
    if (leaf_ids) h = hash_bytes(h, leaf_ids, sizeof(int) * (size_t)n_leafs);
    h = hash_bytes(h, &qn, sizeof qn);
    for (long k = 0; k < (long)n_leafs + n_nodes + (long)qn; k++) {
        void *t = k < n_leafs ? leafs[k] : k < (long)n_leafs + n_nodes ? nodes[k - n_leafs]
                                                                       : queue[k - n_leafs - n_nodes];
        h = hash_bytes(h, &t, sizeof t);
        h = hash_bytes(h, t, (size_t)L.name_off + 64);
    }
    unsigned long seq = cur_call();
    if (gi && gi->last_seq && gi->last_hash == h) {
        put("g %lu %d %d =%lu", seq, n_nodes, n_leafs, gi->last_seq);
        line_end();
        free(queue);
        return true;
    }
    if (gi) gi->last_hash = h, gi->last_seq = seq;
    put("g %lu %d %d", seq, n_nodes, n_leafs);
    line_end();
    for (int i = 0; i < n_leafs; i++) put_tensor('l', leafs[i], gi);
    for (int i = 0; i < n_nodes; i++) put_tensor('n', nodes[i], gi);
    for (size_t q = 0; q < qn; q++) put_tensor('x', queue[q], gi);
    free(queue);
    if (node_ids) {
        put("i");
        for (int i = 0; i < n_nodes; i++) put(" %d", node_ids[i]);
        line_end();
    }
    if (leaf_ids) {
        put("j");
        for (int i = 0; i < n_leafs; i++) put(" %d", leaf_ids[i]);
        line_end();
    }
    return true;
}

/* ------------------------------------------------------------------ calls */
static unsigned long call_begin(const char *kind, void *g, void *graph) {
    mu_lock();
    unsigned long seq = ++g_seq;
    mu_unlock();
    put("C %lu %s %p %p %lu", seq, kind, g, graph, cur_call());
    line_end();
    if (t_depth < MAX_DEPTH) t_stack[t_depth] = seq;
    t_depth++;
    return seq;
}

static void call_end(unsigned long seq, long rc, void *g, const size_t *sizes, int n_sizes) {
    t_depth--;
    put("R %lu %ld", seq, rc);
    struct galloc_info *gi = g ? galloc_of(g) : NULL;
    if (sizes) {
        for (int i = 0; i < n_sizes; i++) put(" %zu", sizes[i]);
    } else if (gi && G.get_buffer_size) {
        for (int i = 0; i < gi->n; i++) put(" %zu", G.get_buffer_size(g, i));
    }
    line_end();
    if (t_depth == 0) flush(); /* the outermost call's end; a crash inside writes the pending lines itself */
}


AT_EXPORT void *ggml_gallocr_new_n(void **bufts, int n) {
    REAL(void *, ggml_gallocr_new_n, (void **, int));
    void *g = real_ggml_gallocr_new_n(bufts, n);
    if (g && !t_in) new_galloc(g, bufts, n);
    return g;
}

AT_EXPORT void *ggml_gallocr_new(void *buft) {
    REAL(void *, ggml_gallocr_new, (void *));
    t_in++; /* new calls new_n: record once, here */
    void *g = real_ggml_gallocr_new(buft);
    t_in--;
    if (g && !t_in) new_galloc(g, &buft, 1);
    return g;
}

AT_EXPORT void ggml_gallocr_free(void *g) {
    REAL(void, ggml_gallocr_free, (void *));
    if (g) {
        mu_lock();
        struct galloc_info *gi = galloc_of(g);
        if (gi) *gi = g_gallocs[--g_n_gallocs]; /* forget it: the table holds the live ones */
        mu_unlock();
        put("F %p", g);
        line_end();
        flush();
    }
    real_ggml_gallocr_free(g);
}

AT_EXPORT bool ggml_gallocr_reserve_n(void *g, void *graph, const int *node_ids, const int *leaf_ids) {
    REAL(bool, ggml_gallocr_reserve_n, (void *, void *, const int *, const int *));
    if (t_reserve.galloc == g && t_reserve.graph == graph) t_reserve.consumed = true;
    load_ggml_functions();
    unsigned long seq = call_begin("reserve_n", g, graph);
    put_graph(graph, galloc_of(g), node_ids, leaf_ids);
    bool rc = real_ggml_gallocr_reserve_n(g, graph, node_ids, leaf_ids);
    call_end(seq, rc, g, NULL, 0);
    return rc;
}

AT_EXPORT void ggml_gallocr_reserve_n_size(void *g, void *graph, const int *node_ids, const int *leaf_ids,
                                           size_t *sizes) {
    REAL(void, ggml_gallocr_reserve_n_size, (void *, void *, const int *, const int *, size_t *));
    load_ggml_functions();
    unsigned long seq = call_begin("reserve_n_size", g, graph);
    put_graph(graph, galloc_of(g), node_ids, leaf_ids);
    real_ggml_gallocr_reserve_n_size(g, graph, node_ids, leaf_ids, sizes);
    struct galloc_info *gi = galloc_of(g);
    call_end(seq, 1, g, sizes, gi ? gi->n : 1);
}

AT_EXPORT bool ggml_gallocr_reserve(void *g, void *graph) {
    REAL(bool, ggml_gallocr_reserve, (void *, void *));
    /* ggml_gallocr_reserve calls reserve_n; if that call is bound inside ggml, record the plan here */
    t_reserve.galloc = g, t_reserve.graph = graph, t_reserve.consumed = false;
    bool rc = real_ggml_gallocr_reserve(g, graph);
    if (!t_reserve.consumed) {
        load_ggml_functions();
        unsigned long seq = call_begin("reserve_n", g, graph);
        put_graph(graph, galloc_of(g), NULL, NULL);
        call_end(seq, rc, g, NULL, 0);
    }
    t_reserve.galloc = NULL;
    return rc;
}

AT_EXPORT bool ggml_gallocr_alloc_graph(void *g, void *graph) {
    REAL(bool, ggml_gallocr_alloc_graph, (void *, void *));
    load_ggml_functions();
    unsigned long seq = call_begin("alloc_graph", g, graph);
    put_graph(graph, galloc_of(g), NULL, NULL);
    bool rc = real_ggml_gallocr_alloc_graph(g, graph);
    call_end(seq, rc, g, NULL, 0);
    return rc;
}

/* ------------------------------------------------------------------ placements and buffers */
static void *g_buffers[4096]; /* buffers made through buft_alloc_buffer, to tell view_init's old signature */
static int g_n_buffers;

static bool known_buffer(void *p) {
    for (int i = g_n_buffers - 1; i >= 0; i--)
        if (g_buffers[i] == p) return true;
    return false;
}

/* placements are the bulk of a long run's lines: formatted by hand, not by printf */
static char *hex(char *o, uint64_t v) {
    *o++ = '0', *o++ = 'x';
    int shift = 60;
    while (shift > 0 && !(v >> shift)) shift -= 4;
    for (; shift >= 0; shift -= 4) *o++ = "0123456789abcdef"[(v >> shift) & 15];
    return o;
}

static void put_place(char kind, void *t) {
    if (layout_state <= 0) return;
    void *buf = F(t, L.buffer, void *), *data = F(t, L.data, void *);
    void *base = buf && G.buffer_get_base ? G.buffer_get_base(buf) : NULL;
    char line[128], *o = line;
    int n = snprintf(o, 32, "%c %lu", kind, cur_call());
    o += n;
    const void *ps[4] = {t, buf, data, base};
    for (int i = 0; i < 4; i++) *o++ = ' ', o = hex(o, (uint64_t)(uintptr_t)ps[i]);
    *o++ = '\n';
    if (!room((size_t)(o - line))) return;
    memcpy(t_buf + t_len, line, (size_t)(o - line));
    t_len += (size_t)(o - line);
}

AT_EXPORT int ggml_backend_tensor_alloc(void *buffer, void *tensor, void *addr) {
    REAL(int, ggml_backend_tensor_alloc, (void *, void *, void *));
    int rc = real_ggml_backend_tensor_alloc(buffer, tensor, addr);
    if (t_depth) put_place('P', tensor);
    return rc;
}

/* (tensor) today; (buffer, tensor) in early 2024 */
AT_EXPORT int ggml_backend_view_init(void *a, void *b) {
    REAL(int, ggml_backend_view_init, (void *, void *));
    int rc = real_ggml_backend_view_init(a, b);
    if (t_depth) put_place('V', a && known_buffer(a) ? b : a);
    return rc;
}

AT_EXPORT void *ggml_backend_buft_alloc_buffer(void *buft, size_t size) {
    REAL(void *, ggml_backend_buft_alloc_buffer, (void *, size_t));
    void *b = real_ggml_backend_buft_alloc_buffer(buft, size);
    if (!t_depth) return b; /* weights and probes: only buffers made inside allocator calls matter */
    load_ggml_functions();
    mu_lock();
    note_buft(buft);
    if (b) {
        if (g_n_buffers == 4096) g_n_buffers = 0;
        g_buffers[g_n_buffers++] = b;
    }
    mu_unlock();
    put("B %lu %p %zu %p %p %zu", cur_call(), buft, size, b, b && G.buffer_get_base ? G.buffer_get_base(b) : NULL,
        b && G.buffer_get_size ? G.buffer_get_size(b) : 0);
    line_end();
    return b;
}

/* ------------------------------------------------------------------ the scheduler */
#define SCHED2(ret, name)                                                  \
    AT_EXPORT ret name(void *sched, void *graph) {                         \
        REAL(ret, name, (void *, void *));                                 \
        unsigned long seq = call_begin(#name + 13, sched, graph);          \
        ret rc = real_##name(sched, graph);                                \
        call_end(seq, (long)rc, NULL, NULL, 0);                            \
        return rc;                                                         \
    }
SCHED2(bool, ggml_backend_sched_reserve)
SCHED2(bool, ggml_backend_sched_alloc_graph)
SCHED2(int, ggml_backend_sched_graph_compute_async)

/* the weightless dry run of llama.cpp's parameter fitting: plan sizes only */
AT_EXPORT void ggml_backend_sched_reserve_size(void *sched, void *graph, size_t *sizes) {
    REAL(void, ggml_backend_sched_reserve_size, (void *, void *, size_t *));
    unsigned long seq = call_begin("sched_reserve_size", sched, graph);
    real_ggml_backend_sched_reserve_size(sched, graph, sizes);
    call_end(seq, 1, NULL, NULL, 0);
}

/* ------------------------------------------------------------------ GGML_ASSERT */
/* ggml_abort (GGML_ASSERT, GGML_ABORT) writes the pending lines first: a program may have replaced the
 * SIGABRT handler. The message is formatted here and passed on as one string, so it prints the same. */
AT_EXPORT __attribute__((noreturn)) void ggml_abort(const char *file, int line, const char *fmt, ...) {
    REAL(void, ggml_abort, (const char *, int, const char *, ...));
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    drop_cut_line();
    flush();
    real_ggml_abort(file, line, "%s", msg);
    abort();
}

/* ------------------------------------------------------------------ dlsym: ctypes and friends */
static const struct { const char *name; void *fn; } HOOKS[] = {
    {"ggml_gallocr_new", (void *)ggml_gallocr_new},
    {"ggml_gallocr_new_n", (void *)ggml_gallocr_new_n},
    {"ggml_gallocr_free", (void *)ggml_gallocr_free},
    {"ggml_gallocr_reserve", (void *)ggml_gallocr_reserve},
    {"ggml_gallocr_reserve_n", (void *)ggml_gallocr_reserve_n},
    {"ggml_gallocr_reserve_n_size", (void *)ggml_gallocr_reserve_n_size},
    {"ggml_gallocr_alloc_graph", (void *)ggml_gallocr_alloc_graph},
    {"ggml_backend_tensor_alloc", (void *)ggml_backend_tensor_alloc},
    {"ggml_backend_view_init", (void *)ggml_backend_view_init},
    {"ggml_backend_buft_alloc_buffer", (void *)ggml_backend_buft_alloc_buffer},
    {"ggml_backend_sched_reserve", (void *)ggml_backend_sched_reserve},
    {"ggml_backend_sched_alloc_graph", (void *)ggml_backend_sched_alloc_graph},
    {"ggml_backend_sched_graph_compute_async", (void *)ggml_backend_sched_graph_compute_async},
    {"ggml_backend_sched_reserve_size", (void *)ggml_backend_sched_reserve_size},
};

static void *self_dlsym(void *h, const char *name) {
    find_real_dlsym();
    void *p = real_dlsym(h, name);
    if (!p || !name || strncmp(name, "ggml_", 5) != 0) return p;
    for (size_t i = 0; i < sizeof HOOKS / sizeof HOOKS[0]; i++)
        if (strcmp(HOOKS[i].name, name) == 0 && p != HOOKS[i].fn) {
            lib_from_addr(p); /* the library this handle reaches is the ggml in use */
            Dl_info info;
            if (!dladdr(p, &info) || info.dli_fbase != g_lib_base) return p; /* a second ggml: left alone */
            return HOOKS[i].fn;
        }
    return p;
}

AT_EXPORT void *dlsym(void *h, const char *name) {
    if (h == RTLD_NEXT || h == RTLD_DEFAULT) {
        find_real_dlsym();
        return real_dlsym(h, name); /* the caller is now this library: good enough for these handles */
    }
    return self_dlsym(h, name);
}
