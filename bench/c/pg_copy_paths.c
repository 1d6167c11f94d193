/* Two ways for two processes on one host to swap 32 MiB (the remote half of a 2-rank
 * all_to_all of 64 MiB), timed side by side with a plain memcpy of the same size:
 *
 *   readv  each process copies the peer's piece with one process_vm_readv (what
 *          mooncake.pg's direct reads do: one kernel copy per byte);
 *   ring   each process pushes its piece through a shared ring of K chunks of C bytes and
 *          pops the peer's (two userspace copies per byte, the second from cache when the
 *          ring is small: what MPI-style shared-memory transports do);
 *   memcpy each process copies 32 MiB of its own (the floor: one userspace copy per byte).
 *
 *   cc -O2 -march=native -o /tmp/pg_copy_paths bench/c/pg_copy_paths.c
 *   /tmp/pg_copy_paths [C bytes, default 65536] [K chunks, default 4]
 *
 * Prints the median over 15 rounds as seen by process 0. Results: bench/README.md,
 * "`mooncake.pg` against Gloo", "A quiet run". */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 15 };
static const size_t N = 32u << 20;

typedef struct {
    _Atomic uint64_t head;
    char pad[56];
    _Atomic uint64_t tail;
} ring;

static struct {
    _Atomic int arrived;
    _Atomic int pid[2];
    double t[3][ROUNDS];
} *sh;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Both processes spin here until the other one arrived for the `gen`-th time. */
static void barrier(int gen) {
    atomic_fetch_add(&sh->arrived, 1);
    while (atomic_load(&sh->arrived) < 2 * gen) {
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run(int r, size_t c, int k, char *rings) {
    char *src = aligned_alloc(4096, N), *dst = aligned_alloc(4096, N);
    memset(src, r + 1, N);
    memset(dst, 0, N);
    sh->pid[r] = getpid();
    int peer = 1 - r, gen = 0;
    size_t ring_bytes = 4096 + (size_t)k * c;
    ring *out = (ring *)(rings + r * ring_bytes), *in = (ring *)(rings + peer * ring_bytes);
    char *outb = (char *)out + 4096, *inb = (char *)in + 4096;
    barrier(++gen);
    for (int it = 0; it < ROUNDS; it++) {
        barrier(++gen);
        double t0 = now();
        /* src and dst sit at the same addresses in both forked processes. */
        struct iovec l = {dst, N}, rm = {src, N};
        if (process_vm_readv(sh->pid[peer], &l, 1, &rm, 1, 0) != (ssize_t)N) {
            perror("process_vm_readv");
            exit(1);
        }
        barrier(++gen);
        sh->t[0][it] = now() - t0;

        barrier(++gen);
        t0 = now();
        size_t sent = 0, got = 0;
        while (sent < N || got < N) {
            if (sent < N) {
                uint64_t h = atomic_load_explicit(&out->head, memory_order_relaxed);
                if (h - atomic_load_explicit(&out->tail, memory_order_acquire) < (uint64_t)k) {
                    memcpy(outb + (h % k) * c, src + sent, c);
                    atomic_store_explicit(&out->head, h + 1, memory_order_release);
                    sent += c;
                }
            }
            if (got < N) {
                uint64_t t = atomic_load_explicit(&in->tail, memory_order_relaxed);
                if (atomic_load_explicit(&in->head, memory_order_acquire) > t) {
                    memcpy(dst + got, inb + (t % k) * c, c);
                    atomic_store_explicit(&in->tail, t + 1, memory_order_release);
                    got += c;
                }
            }
        }
        barrier(++gen);
        sh->t[1][it] = now() - t0;
        if (dst[N / 2] != peer + 1) {
            fprintf(stderr, "wrong bytes\n");
            exit(1);
        }

        barrier(++gen);
        t0 = now();
        memcpy(dst, src, N);
        barrier(++gen);
        sh->t[2][it] = now() - t0;
    }
}

int main(int argc, char **argv) {
    size_t c = argc > 1 ? strtoul(argv[1], 0, 0) : 65536;
    int k = argc > 2 ? atoi(argv[2]) : 4;
    if (c == 0 || N % c != 0 || k < 1) {
        fprintf(stderr, "C must divide 32 MiB, K >= 1\n");
        return 2;
    }
    sh = mmap(0, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *rings = mmap(0, 2 * (4096 + (size_t)k * c), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || rings == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    for (int r = 0; r < 2; r++) {
        if (fork() == 0) {
            run(r, c, k, rings);
            exit(0);
        }
    }
    int status, failed = 0;
    for (int r = 0; r < 2; r++) {
        wait(&status);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    if (failed)
        return 1;
    for (int m = 0; m < 3; m++)
        qsort(sh->t[m], ROUNDS, sizeof(double), cmp);
    printf("C=%zu K=%d, 32 MiB per process, median of %d: readv %.2f ms, ring %.2f ms, "
           "memcpy %.2f ms\n",
           c, k, ROUNDS, sh->t[0][ROUNDS / 2] * 1e3, sh->t[1][ROUNDS / 2] * 1e3,
           sh->t[2][ROUNDS / 2] * 1e3);
    return 0;
}
