/* A stand-in for libggml-base with the few functions the recorder calls while it holds its own lock, each
 * buffer type saying how its name is asked for: that is where a real ggml function could assert (GGML_ASSERT
 * calls ggml_abort) or take a while (another thread forks meanwhile). Built as a shared library by
 * tests/record/test_record_locks.py. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct fake_buft { int mode; volatile int asked; }; /* mode 0: a name; 1: ggml_abort; 2: a slow name */

void ggml_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

const char *ggml_backend_buft_name(void *buft) {
    struct fake_buft *b = buft;
    b->asked = 1;
    if (b->mode == 1) ggml_abort("fake_ggml.c", __LINE__, "GGML_ASSERT(%s) failed", "buft->iface.get_name");
    if (b->mode == 2) nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    return "FAKE";
}

void *ggml_gallocr_new_n(void **bufts, int n) {
    (void)bufts, (void)n;
    return malloc(1);
}
