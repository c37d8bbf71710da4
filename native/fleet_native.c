#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fleet_native.h"

uint64_t fleet_load_acquire_u64(const uint64_t *addr) {
    return __atomic_load_n(addr, __ATOMIC_ACQUIRE);
}

void fleet_store_release_u64(uint64_t *addr, uint64_t value) {
    __atomic_store_n(addr, value, __ATOMIC_RELEASE);
}

int fleet_cas_u64(uint64_t *addr, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(addr, &expected, desired, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

uint64_t fleet_fetch_add_u64(uint64_t *addr, uint64_t delta) {
    return __atomic_fetch_add(addr, delta, __ATOMIC_SEQ_CST);
}

uint32_t fleet_load_acquire_u32(const uint32_t *addr) {
    return __atomic_load_n(addr, __ATOMIC_ACQUIRE);
}

uint32_t fleet_fetch_add_u32(uint32_t *addr, uint32_t delta) {
    return __atomic_fetch_add(addr, delta, __ATOMIC_SEQ_CST);
}

int fleet_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    /* Not FUTEX_PRIVATE: the word lives in a segment shared between processes. */
    long rc = syscall(SYS_futex, addr, FUTEX_WAIT, expected, tsp, NULL, 0);
    if (rc == 0) return 0;
    if (errno == EAGAIN || errno == EINTR) return 0;   /* value changed, or a signal: re-check */
    if (errno == ETIMEDOUT) return 1;
    return -errno;
}

int fleet_futex_wake(uint32_t *addr, int n) {
    long rc = syscall(SYS_futex, addr, FUTEX_WAKE, n < 0 ? INT_MAX : n, NULL, NULL, 0);
    return rc < 0 ? -errno : (int)rc;
}

size_t fleet_mutex_size(void) { return sizeof(pthread_mutex_t); }

int fleet_mutex_init(void *addr) {
    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (rc) return -rc;
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    /* Robust: a holder killed with SIGKILL must not wedge every other process. */
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    rc = pthread_mutex_init((pthread_mutex_t *)addr, &attr);
    pthread_mutexattr_destroy(&attr);
    return -rc;
}

int fleet_mutex_lock(void *addr) {
    int rc = pthread_mutex_lock((pthread_mutex_t *)addr);
    if (rc == 0) return 0;
    if (rc == EOWNERDEAD) {
        /* The data it guards is ours to repair; without this the mutex turns
           ENOTRECOVERABLE for everybody. */
        pthread_mutex_consistent((pthread_mutex_t *)addr);
        return 1;
    }
    return -rc;
}

int fleet_mutex_unlock(void *addr) { return -pthread_mutex_unlock((pthread_mutex_t *)addr); }

int fleet_mutex_destroy(void *addr) { return -pthread_mutex_destroy((pthread_mutex_t *)addr); }

int fleet_set_pdeathsig(int sig) {
    return prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0 ? 0 : -errno;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One seqlocked read of a record into dst; 1 when it was consistent. */
static int read_record(const uint64_t *src, uint64_t *dst, int64_t start, int64_t len, int64_t seq_at) {
    uint64_t before = __atomic_load_n(&src[seq_at], __ATOMIC_ACQUIRE);
    if (before & 1) return 0;
    for (int64_t w = start; w < start + len; w++)
        dst[w] = __atomic_load_n(&src[w], __ATOMIC_RELAXED);
    /* The data loads must complete before the sequence is read again. */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&src[seq_at], __ATOMIC_RELAXED) == before;
}

int fleet_snapshot_copy(const uint64_t *src, uint64_t *dst, size_t n_words,
                        const int64_t *rec_start, const int64_t *rec_len, const int64_t *seq_at,
                        size_t n_recs, int spins, int64_t timeout_ns, uint8_t *unsettled) {
    int n_unsettled = 0;
    /* Words outside records (the header) are written once at creation: a plain copy. */
    for (size_t w = 0; w < n_words; w++) dst[w] = __atomic_load_n(&src[w], __ATOMIC_RELAXED);
    for (size_t i = 0; i < n_recs; i++) {
        int settled = 0;
        for (int t = 0; t < spins && !settled; t++) {
            settled = read_record(src, dst, rec_start[i], rec_len[i], seq_at[i]);
            if (!settled) cpu_relax();
        }
        if (!settled) {
            int64_t deadline = monotonic_ns() + timeout_ns;
            do {
                sched_yield();
                settled = read_record(src, dst, rec_start[i], rec_len[i], seq_at[i]);
            } while (!settled && monotonic_ns() < deadline);
        }
        unsettled[i] = !settled;
        n_unsettled += !settled;
    }
    return n_unsettled;
}
