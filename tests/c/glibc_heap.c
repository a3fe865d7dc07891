// A long-running process with a fragmented glibc heap, for `fragscope snapshot` (with the
// argument "seccomp", under a seccomp filter that allows everything): another thread
// frees blocks the main thread allocated (`hand_over_blocks`); then the main
// thread and THREADS threads (each in its own arena) allocate blocks of mixed sizes and
// free most of them in a pattern that leaves holes (some in the threads' caches and the
// fastbins, in the glibc releases that have them), plus a few blocks above the mmap
// threshold. Then it prints glibc's own view, one line
//   mallinfo2 arena=A ordblks=B smblks=C hblks=D hblkhd=E uordblks=F fordblks=G keepcost=H
//     fsmblks=I big_usable=J
// (J: malloc_usable_size summed over its blocks above the threshold, its only ones: the
// tables of the blocks it keeps are mapped apart) and malloc_info's XML on stderr, and
// waits: for each line read on stdin it prints
// the mallinfo2 line again ("trim" first calls malloc_trim(0) and prints
// "trimmed RSS_BEFORE_KIB RSS_AFTER_KIB"; "sigchld" prints "sigchld N", the SIGCHLDs it
// has received, instead); it exits at the end of stdin.
// With the argument "noncontiguous", a mapping is put where the brk heap would grow once
// it holds a few blocks: glibc then extends its main arena with mmapped segments of its
// own, each ending in fenceposts (a "non-contiguous" main arena, as in a process whose
// other mappings crowd its break, such as Node's).
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#define THREADS 3

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ready, done;

// The blocks above the mmap threshold.
static void *big[4];

// Blocks of one size the main thread allocates and another thread frees, every other one:
// past what that thread's cache takes, they wait in the main arena's bins (its small bins
// in glibc 2.43, its fastbins before), and the main thread's first malloc of that size
// fills its own cache from them. In 2.43 that is where its cache's table is made, inside
// malloc (a chunk 16 bytes larger than one made at a thread's first free), the cache not
// being made at the first malloc any more.
#define HANDED 200
static void *handed[HANDED];

static void *free_handed(void *arg) {
    (void)arg;
    for (int i = 0; i < HANDED; i += 2) free(handed[i]);
    return NULL;
}

static void hand_over_blocks(void) {
    for (int i = 0; i < HANDED; i++) handed[i] = malloc(100);
    pthread_t t;
    pthread_create(&t, NULL, free_handed, NULL);
    pthread_join(t, NULL);
}

static void **fragment(int n, unsigned seed) {
    // The table of the blocks kept, outside the heap: whether glibc would mmap it alone or
    // carve it from a thread's new arena depends on the release (2.43 makes a thread's
    // arena at its first block, large enough for it).
    void **keep = mmap(NULL, n * sizeof(void *), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (keep == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 16 + (seed >> 16) % 2000;
        if (i % 16 == 0) size = 40; // a small size, freed below into tcache and fastbins
        keep[i] = malloc(size);
        memset(keep[i], 0x5a, size);
    }
    // Free three of four, keeping every fourth: pages stay pinned by the survivors.
    for (int i = 0; i < n; i++)
        if (i % 4 != 3) {
            free(keep[i]);
            keep[i] = NULL;
        }
    return keep;
}

static void *worker(void *arg) {
    void **keep = fragment(20000 + 5000 * (int)(long)arg, 7u + (unsigned)(long)arg);
    pthread_mutex_lock(&lock);
    ready++;
    pthread_cond_broadcast(&cond);
    while (!done) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    return keep;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

static volatile sig_atomic_t sigchld_count;
static void count_sigchld(int sig) {
    (void)sig;
    sigchld_count++;
}

static void print_mallinfo(void) {
    struct mallinfo2 m = mallinfo2();
    size_t big_usable = 0;
    for (int i = 0; i < 4; i++) big_usable += malloc_usable_size(big[i]);
    printf("mallinfo2 arena=%zu ordblks=%zu smblks=%zu hblks=%zu hblkhd=%zu uordblks=%zu "
           "fordblks=%zu keepcost=%zu fsmblks=%zu big_usable=%zu\n",
           m.arena, m.ordblks, m.smblks, m.hblks, m.hblkhd, m.uordblks, m.fordblks, m.keepcost,
           m.fsmblks, big_usable);
    fflush(stdout);
}

// Runs the process under a seccomp filter that allows every call: what a sandboxed server
// looks like from outside (Seccomp: 2 in its status).
static void allow_all_under_seccomp(void) {
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = 1, .filter = &allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        exit(1);
    }
}

/* The brk heap holds a few blocks, then cannot grow: the page after its top is mapped. */
static void crowd_the_break(void) {
    static void *kept;
    for (int i = 0; i < 64; i++) free(malloc(64 + 16 * i));
    kept = malloc(1000);
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t end = ((uintptr_t)sbrk(0) + page - 1) & ~(uintptr_t)(page - 1);
    if (mmap((void *)end, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
             0) == MAP_FAILED) {
        perror("mmap at the break");
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "seccomp") == 0) allow_all_under_seccomp();
    if (argc > 1 && strcmp(argv[1], "noncontiguous") == 0) crowd_the_break();
    // stdio's buffers are static: glibc would otherwise malloc them at the first read and
    // write, after mallinfo2 is taken, and the heap the census reads would not be the one
    // printed.
    static char inbuf[4096], outbuf[4096];
    setvbuf(stdin, inbuf, _IOLBF, sizeof inbuf);
    setvbuf(stdout, outbuf, _IOLBF, sizeof outbuf);
    struct sigaction sa = {.sa_handler = count_sigchld, .sa_flags = SA_RESTART};
    sigaction(SIGCHLD, &sa, NULL);
    hand_over_blocks();
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    void **keep = fragment(40000, 1);
    for (int i = 0; i < 4; i++) {
        big[i] = malloc((size_t)(200 + 300 * i) << 10);
        memset(big[i], 1, 4096 * (i + 1)); // partly resident
    }
    pthread_mutex_lock(&lock);
    while (ready < THREADS) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);

    print_mallinfo();
    malloc_info(0, stderr);
    fflush(stderr);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "sigchld", 7) == 0) {
            printf("sigchld %d\n", (int)sigchld_count);
            continue;
        }
        if (strncmp(line, "trim", 4) == 0) {
            long before = rss_kib();
            malloc_trim(0);
            printf("trimmed %ld %ld\n", before, rss_kib());
        }
        print_mallinfo();
    }
    pthread_mutex_lock(&lock);
    done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) free(big[i]);
    munmap(keep, 40000 * sizeof(void *));
    return 0;
}
