#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
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
