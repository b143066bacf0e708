/* A program that makes the recorder's lock matter (linked against fake_ggml.c's library, the recorder
 * preloaded): `assert` makes a gallocr, then one whose buffer type's name asserts (ggml_abort) while the
 * recorder holds its lock;
 * `fork` forks while another thread holds that lock (asking a slow buffer type's name), then the child makes
 * a gallocr of its own. Either finishes at once when nothing deadlocks: SIGABRT, or exit status 0. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct fake_buft { int mode; volatile int asked; };
void *ggml_gallocr_new_n(void **bufts, int n);

static struct fake_buft slow = {2, 0};

static void *make_slow(void *arg) {
    (void)arg;
    void *b = &slow;
    ggml_gallocr_new_n(&b, 1);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "assert")) {
        struct fake_buft plain = {0, 0}, bad = {1, 0};
        void *b = &plain;
        ggml_gallocr_new_n(&b, 1); /* recorded whole */
        b = &bad;
        ggml_gallocr_new_n(&b, 1);
        return 3; /* not reached: ggml_abort aborts */
    }
    pthread_t t;
    pthread_create(&t, NULL, make_slow, NULL);
    for (int ms = 0; !slow.asked; ms++) { /* until the other thread is inside (the recorder asks the name) */
        if (ms == 10000) return 4;          /* no recorder preloaded: nothing asks */
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    }
    pid_t pid = fork();
    if (pid == 0) {
        struct fake_buft plain = {0, 0};
        void *b = &plain;
        ggml_gallocr_new_n(&b, 1);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    pthread_join(t, NULL);
    printf("child %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok" : "failed");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
