#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
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

/* How long a waiter spins before it sleeps on its futex. */
#ifndef FLEET_SPIN_NS
#define FLEET_SPIN_NS 20000
#endif

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

/* ---- SPSC byte rings ------------------------------------------------------------ */

#define RING_MAGIC     0x31474e4952544c46ULL   /* "FLTRING1" */
#define RING_MIN_CAP   4096u
#define RING_WRAP      0xffffffffu
#define FRAME          8u
/* Early wrap's offset (see fleet_native.h), for rings larger than four times it. */
#define EARLY_WRAP_AT  (64u << 10)

/* Each line is written by one side only, so the two processes never fight over a
 * line on the hot path (false sharing costs ~4x per operation, PLATFORM.md). The
 * *_cache fields are each side's private stale copy of the other's index: a side
 * reads the peer's line only when its copy says the ring looks full/empty. */
struct ring_hdr {
    /* line 0: producer */
    uint64_t head;           /* bytes ever written; published with a release store */
    uint64_t tail_cache;     /* producer's last view of tail */
    uint8_t  _p0[48];
    /* line 1: consumer */
    uint64_t tail;           /* bytes ever read; published with a release store */
    uint64_t head_cache;     /* consumer's last view of head */
    uint8_t  _p1[48];
    /* line 2: data wake-up (consumer sleeps on data_seq); the consumer's looks */
    uint32_t data_seq;
    uint32_t consumer_waiting;
    uint64_t look_run_ns;    /* on CPU while the consumer looked for a message (wait_spin) */
    uint64_t look_wait_ns;   /* off it in the looks' short yields (see count_look) */
    uint64_t look_held_ns;   /* off it in yields that lasted LOOK_HELD_NS or more */
    uint8_t  _p2[32];
    /* line 3: space wake-up (producer sleeps on space_seq); constants */
    uint32_t space_seq;
    uint32_t producer_waiting;
    uint64_t capacity;
    uint64_t magic;          /* written last by init */
    uint8_t  _p3[40];
};

_Static_assert(sizeof(struct ring_hdr) == 256, "ring header is 4 cache lines");

#define HDR(r) ((struct ring_hdr *)(r))
#define DATA(r) ((uint8_t *)(r) + sizeof(struct ring_hdr))

static inline uint32_t pad8(uint32_t n) { return (n + 7u) & ~7u; }

/* Largest payload that always fits an empty ring: see the header comment. */
static inline uint64_t max_len(uint64_t cap) { return cap / 2 - 16; }

size_t fleet_ring_bytes(uint64_t capacity) { return sizeof(struct ring_hdr) + (size_t)capacity; }

int fleet_ring_init(void *ring, uint64_t capacity) {
    if (ring == NULL || ((uintptr_t)ring & 63) != 0) return -EINVAL;
    if (capacity < RING_MIN_CAP || (capacity & (capacity - 1)) != 0 || capacity > (1ULL << 31))
        return -EINVAL;
    struct ring_hdr *h = HDR(ring);
    __atomic_store_n(&h->magic, 0, __ATOMIC_RELAXED);
    h->head = h->tail_cache = h->tail = h->head_cache = 0;
    h->data_seq = h->consumer_waiting = h->space_seq = h->producer_waiting = 0;
    h->look_run_ns = h->look_wait_ns = h->look_held_ns = 0;
    h->capacity = capacity;
    /* Magic last: whoever sees it sees an initialised ring. */
    __atomic_store_n(&h->magic, RING_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

int fleet_ring_check(const void *ring) {
    if (ring == NULL || ((uintptr_t)ring & 63) != 0) return -EINVAL;
    const struct ring_hdr *h = (const struct ring_hdr *)ring;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != RING_MAGIC) return -EINVAL;
    uint64_t cap = h->capacity;
    if (cap < RING_MIN_CAP || (cap & (cap - 1)) != 0 || cap > (1ULL << 31)) return -EINVAL;
    return 0;
}

uint64_t fleet_ring_capacity(const void *ring) { return ((const struct ring_hdr *)ring)->capacity; }

uint32_t fleet_ring_max_message(const void *ring) {
    return (uint32_t)max_len(((const struct ring_hdr *)ring)->capacity);
}

/* Bytes a message of payload len occupies when written at `head`, wrap marker and
 * skipped tail end included. */
static inline uint64_t footprint(uint64_t cap, uint64_t head, uint32_t len) {
    uint64_t need = FRAME + pad8(len);
    uint64_t to_end = cap - (head & (cap - 1));
    return need <= to_end ? need : to_end + need;
}

/* Producer: room for `total` bytes? Re-reads the consumer's tail only when the cached
 * copy says no, so a ring with room costs no cross-core traffic. */
static inline int has_room(struct ring_hdr *h, uint64_t head, uint64_t total) {
    uint64_t cap = h->capacity;
    if (head - h->tail_cache + total <= cap) return 1;
    /* Acquire: the consumer finished reading those bytes before publishing tail. */
    h->tail_cache = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
    return head - h->tail_cache + total <= cap;
}

/* Producer, at offset `pos` >= early_wrap_at: is the ring empty, and does the message
 * (`need` bytes) fit before `pos`? Then it may go at offset 0, the rest of the lap
 * skipped: the consumer passes the marker at its next read and has the whole ring free
 * again. (Only an empty ring: one that wrapped early beside unread bytes would count
 * the skipped lap as used until they are read, and a slow consumer would leave its
 * producer a ring of `pos` bytes meanwhile.) The consumer's tail is re-read only when
 * the cached copy does not show it caught up. */
static inline int early_wrap(struct ring_hdr *h, uint64_t head, uint64_t pos, uint64_t need) {
    if (need > pos) return 0;
    if (h->tail_cache == head) return 1;
    h->tail_cache = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
    return h->tail_cache == head;
}

static inline uint64_t early_wrap_at(uint64_t cap) { return cap / 4 < EARLY_WRAP_AT ? cap / 4 : EARLY_WRAP_AT; }

static int push_parts(void *ring, uint32_t tag, const void *a, uint32_t alen,
                      const void *b, uint32_t blen) {
    struct ring_hdr *h = HDR(ring);
    uint64_t cap = h->capacity;
    uint64_t len64 = (uint64_t)alen + blen;
    if (len64 > max_len(cap)) return -EMSGSIZE;
    uint32_t len = (uint32_t)len64;
    uint64_t head = h->head;   /* ours: no ordering needed */
    uint64_t pos = head & (cap - 1);
    uint64_t need = FRAME + pad8(len);
    uint64_t total;
    if (pos >= early_wrap_at(cap) && early_wrap(h, head, pos, need)) {
        total = cap - pos + need;   /* room: the ring is empty and need <= pos */
    } else {
        total = footprint(cap, head, len);
        if (!has_room(h, head, total)) return -EAGAIN;
    }
    uint8_t *data = DATA(ring);
    if (total > need) {   /* behind a wrap marker, at offset 0 */
        uint32_t marker[2] = {RING_WRAP, 0};
        memcpy(data + pos, marker, FRAME);
        pos = 0;
    }
    uint32_t frame[2] = {len, tag};
    memcpy(data + pos, frame, FRAME);
    if (alen) memcpy(data + pos + FRAME, a, alen);
    if (blen) memcpy(data + pos + FRAME + alen, b, blen);
    /* Release: the frame and payload are visible before the consumer can see head move. */
    __atomic_store_n(&h->head, head + total, __ATOMIC_RELEASE);
    return 0;
}

int fleet_ring_push(void *ring, uint32_t tag, const void *buf, uint32_t len) {
    return push_parts(ring, tag, buf, len, NULL, 0);
}

int fleet_ring_push2(void *ring, uint32_t tag, const void *a, uint32_t alen,
                     const void *b, uint32_t blen) {
    return push_parts(ring, tag, a, alen, b, blen);
}

/* The lost-wake-up race is Dekker's: the waiter stores its flag then loads the index,
 * the waker stores the index then loads the flag. With a full fence between the store
 * and the load on both sides, at least one of them sees the other's store: either the
 * waiter sees the new index and does not sleep, or the waker sees the flag and wakes.
 * The sequence word closes the rest: the waiter samples it before announcing, and the
 * waker bumps it before waking, so FUTEX_WAIT on a stale sample returns at once.
 *
 * Only the waiter clears its flag (once it is awake). A waker must not: one that read
 * the flag of an earlier sleep and is preempted before clearing it would clear the flag
 * of the waiter's next sleep, and every later waker would then see no one asleep while
 * the waiter sleeps for good on a word that moved (the unit on its ring never runs).
 * Wakers that see the flag while the waiter is waking each make a FUTEX_WAKE that finds
 * no one: a syscall, never a lost wake-up. */
int fleet_ring_notify(void *ring) {
    struct ring_hdr *h = HDR(ring);
    __atomic_fetch_add(&h->data_seq, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* head store (in push) before waiting load */
    if (__atomic_load_n(&h->consumer_waiting, __ATOMIC_RELAXED) == 0) return 0;
    fleet_futex_wake(&h->data_seq, 1);
    return 1;
}

/* Push messages packed back to back in `buf` (message i is lens[i] bytes), in order,
 * until one does not fit: returns how many were pushed (the rest wait for the caller to
 * retry, and a message that can never fit is left for push/push2 to report). With
 * `notify`, wakes the consumer once after them, as fleet_ring_notify does. One call for
 * a batch: the caller crosses into C (and, from Python, gives up its GIL) once. */
int fleet_ring_push_many(void *ring, uint32_t tag, const void *buf, const uint32_t *lens,
                         uint32_t n, int notify) {
    const uint8_t *p = (const uint8_t *)buf;
    uint32_t i = 0;
    for (; i < n; i++) {
        if (push_parts(ring, tag, p, lens[i], NULL, 0) != 0) break;
        p += lens[i];
    }
    if (notify && i > 0) fleet_ring_notify(ring);
    return (int)i;
}

/* Consumer side of "pop made room": wake the producer only if it announced a wait. */
static inline void after_pop(struct ring_hdr *h) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* tail store before waiting load */
    if (__atomic_load_n(&h->producer_waiting, __ATOMIC_RELAXED) == 0) return;
    /* The waiter clears its own flag (see fleet_ring_notify). */
    __atomic_fetch_add(&h->space_seq, 1, __ATOMIC_SEQ_CST);
    fleet_futex_wake(&h->space_seq, 1);
}

/* Consumer: the frame of the next message at or after `tail`, skipping a wrap marker.
 * Returns the position of the frame, or -1 when the ring is empty up to `head`. */
static inline int64_t next_frame(struct ring_hdr *h, uint64_t *tail, uint64_t head,
                                 uint32_t frame[2]) {
    uint64_t cap = h->capacity;
    if (*tail == head) return -1;
    uint64_t pos = *tail & (cap - 1);
    memcpy(frame, DATA(h) + pos, FRAME);
    if (frame[0] == RING_WRAP) {
        *tail += cap - pos;
        pos = 0;
        memcpy(frame, DATA(h), FRAME);
    }
    return (int64_t)pos;
}

static inline uint64_t consumer_head(struct ring_hdr *h, uint64_t tail) {
    if (h->head_cache != tail) return h->head_cache;
    /* Acquire: pairs with the producer's release store of head. */
    h->head_cache = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
    return h->head_cache;
}

int64_t fleet_ring_pop(void *ring, uint32_t *tag, void *out, uint32_t cap, uint32_t *needed) {
    struct ring_hdr *h = HDR(ring);
    uint64_t tail = h->tail;   /* ours */
    uint64_t head = consumer_head(h, tail);
    uint32_t frame[2];
    int64_t pos = next_frame(h, &tail, head, frame);
    if (pos < 0) return -EAGAIN;
    uint32_t len = frame[0];
    if (len > cap) {
        if (needed) *needed = len;
        return -ENOBUFS;   /* tail not stored: the message stays */
    }
    memcpy(out, DATA(ring) + pos + FRAME, len);
    *tag = frame[1];
    /* Release: our reads of the slot are done before the producer may reuse it. */
    __atomic_store_n(&h->tail, tail + FRAME + pad8(len), __ATOMIC_RELEASE);
    after_pop(h);
    return len;
}

int64_t fleet_ring_pop_many(void *ring, void *out, uint64_t cap, uint32_t *lens,
                            uint32_t *tags, uint32_t max_msgs) {
    struct ring_hdr *h = HDR(ring);
    uint64_t tail = h->tail, start = tail;
    /* One acquire load of head for the whole batch. */
    uint64_t head = h->head_cache = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
    uint8_t *dst = (uint8_t *)out;
    uint64_t used = 0;
    uint32_t n = 0;
    while (n < max_msgs) {
        uint64_t t = tail;
        uint32_t frame[2];
        int64_t pos = next_frame(h, &t, head, frame);
        if (pos < 0) break;
        uint32_t len = frame[0];
        if (used + len > cap) {
            if (n == 0) { lens[0] = len; return -ENOBUFS; }
            break;
        }
        memcpy(dst + used, DATA(ring) + pos + FRAME, len);
        lens[n] = len;
        tags[n] = frame[1];
        used += pad8(len);
        tail = t + FRAME + pad8(len);
        n++;
    }
    if (tail != start) {
        __atomic_store_n(&h->tail, tail, __ATOMIC_RELEASE);
        after_pop(h);
    }
    return n;
}

/* A consumer that does not trust its producer (a service client's lane, fleet.shm.lane)
 * reads the ring with the capacity it made it with, never the ring's own word, and
 * checks every frame against it before a byte is copied: where the producer may write
 * anything into the shared pages, a bad word must cost the consumer an error, never a
 * read outside the ring. A payload may still change while it is copied: it is checked
 * after, as bytes of the consumer's own. */
int64_t fleet_ring_pop_many_checked(void *ring, uint64_t capacity, void *out, uint64_t cap,
                                    uint32_t *lens, uint32_t *tags, uint32_t max_msgs) {
    struct ring_hdr *h = HDR(ring);
    if (capacity < RING_MIN_CAP || (capacity & (capacity - 1)) != 0) return -EINVAL;
    uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_RELAXED), start = tail;
    uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
    if (head - tail > capacity || (tail & 7u) != 0 || (head & 7u) != 0) return -EPROTO;
    uint8_t *data = DATA(ring), *dst = (uint8_t *)out;
    uint64_t used = 0;
    uint32_t n = 0;
    while (n < max_msgs && tail != head) {
        uint64_t t = tail, pos = t & (capacity - 1);
        uint32_t frame[2];
        memcpy(frame, data + pos, FRAME);
        if (frame[0] == RING_WRAP) {   /* the rest of the ring skipped, a frame at 0 follows */
            if (head - t < capacity - pos + FRAME) return -EPROTO;
            t += capacity - pos;
            pos = 0;
            memcpy(frame, data, FRAME);
        }
        uint32_t len = frame[0];
        uint64_t padded = ((uint64_t)len + 7u) & ~(uint64_t)7u;   /* 64-bit: no length wraps to 0 */
        uint64_t need = FRAME + padded;
        if (pos + need > capacity || head - t < need) return -EPROTO;
        if (used + len > cap) {
            if (n == 0) { lens[0] = len; return -ENOBUFS; }
            break;
        }
        memcpy(dst + used, data + pos + FRAME, len);
        lens[n] = len;
        tags[n] = frame[1];
        used += padded;
        tail = t + need;
        n++;
    }
    if (tail != start) {
        __atomic_store_n(&h->tail, tail, __ATOMIC_RELEASE);
        after_pop(h);
    }
    return n;
}

uint64_t fleet_ring_used(const void *ring) {
    const struct ring_hdr *h = (const struct ring_hdr *)ring;
    uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
    uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
    return head - tail;
}

static inline int ring_nonempty(struct ring_hdr *h) {
    return __atomic_load_n(&h->head, __ATOMIC_ACQUIRE) != h->tail;
}

/* Consumer: sleep on data_seq while it still reads `seq` and the ring is empty. */
static int ring_sleep(struct ring_hdr *h, uint32_t seq, int64_t timeout_ns) {
    __atomic_store_n(&h->consumer_waiting, 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* waiting store before head load */
    int rc = 0;
    if (!ring_nonempty(h)) {
        rc = fleet_futex_wait(&h->data_seq, seq, timeout_ns);
        if (rc < 0) rc = 0;   /* unexpected errno: let the caller re-check */
    }
    /* Nobody sleeps now: spare the producer a wake-up syscall. */
    __atomic_store_n(&h->consumer_waiting, 0, __ATOMIC_RELAXED);
    return (rc == 1 && !ring_nonempty(h)) ? 1 : 0;
}

int fleet_ring_wait(void *ring, int64_t timeout_ns) {
    struct ring_hdr *h = HDR(ring);
    if (ring_nonempty(h)) return 0;
    for (int64_t until = monotonic_ns() + FLEET_SPIN_NS; monotonic_ns() < until;) {  /* see fleet_bell_wait */
        if (ring_nonempty(h)) return 0;
        cpu_relax();
    }
    return ring_sleep(h, __atomic_load_n(&h->data_seq, __ATOMIC_ACQUIRE), timeout_ns);
}

/* What is left of timeout_ns (< 0: forever) once a spin begun at `start` is over. */
static int64_t timeout_after_spin(int64_t timeout_ns, int64_t start) {
    if (timeout_ns < 0) return timeout_ns;
    timeout_ns -= monotonic_ns() - start;
    return timeout_ns < 0 ? 0 : timeout_ns;
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A yield in a look that kept the consumer off its CPU this long let another task run a
 * slice of its own: a busy neighbour's runs 0.7-4 ms (measured here beside a busy loop on
 * the same CPU: every yield either came back within 10 us or took 1-4.4 ms), where the
 * fleet's own threads, which look by yielding too, hand the CPU back within microseconds
 * (beside another yielding thread, 99.9% of yields under 50 us, none over 1 ms). */
#define LOOK_HELD_NS 500000

/* A look that began at `start` (wall) and `cpu0` (this thread's CPU time) is over,
 * `held` ns of it in yields of LOOK_HELD_NS or more: its time on CPU, off it in short
 * yields, and off it in long ones, added to the ring's counts. The supervisor's
 * contention watch takes the first two out of the consumer's wait (the look had
 * nothing to run) and keeps the third (a neighbour held the CPU). The consumer is the
 * counts' one writer; a reader takes each with an atomic load, and one look at most
 * lies between them. The thread's CPU clock is a system call (0.5 us a read on the 2-core VM,
 * where CLOCK_MONOTONIC is 23 ns): a look that a message ends pays one before it returns. */
static void count_look(struct ring_hdr *h, int64_t start, int64_t cpu0, int64_t held) {
    int64_t wall = monotonic_ns() - start, run = thread_cpu_ns() - cpu0;
    if (held > wall) held = wall;
    if (run < 0) run = 0;
    if (run > wall - held) run = wall - held;
    __atomic_store_n(&h->look_run_ns, h->look_run_ns + (uint64_t)run, __ATOMIC_RELAXED);
    __atomic_store_n(&h->look_wait_ns, h->look_wait_ns + (uint64_t)(wall - held - run), __ATOMIC_RELAXED);
    __atomic_store_n(&h->look_held_ns, h->look_held_ns + (uint64_t)held, __ATOMIC_RELAXED);
}

int fleet_ring_wait_spin(void *ring, int64_t timeout_ns, int64_t spin_ns) {
    struct ring_hdr *h = HDR(ring);
    if (ring_nonempty(h)) return 0;
    int64_t start = monotonic_ns(), cpu0 = thread_cpu_ns(), held = 0;
    if (timeout_ns >= 0 && spin_ns > timeout_ns) spin_ns = timeout_ns;  /* the spin is part of the wait */
    for (int64_t at = start, until = start + spin_ns; at < until;) {
        if (ring_nonempty(h)) {
            count_look(h, start, cpu0, held);
            return 0;
        }
        sched_yield();
        int64_t after = monotonic_ns();
        if (after - at >= LOOK_HELD_NS) held += after - at;
        at = after;
    }
    count_look(h, start, cpu0, held);
    return fleet_ring_wait(ring, timeout_after_spin(timeout_ns, start));
}

void fleet_ring_looked(const void *ring, uint64_t *out) {
    const struct ring_hdr *h = (const struct ring_hdr *)ring;
    out[0] = __atomic_load_n(&h->look_run_ns, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&h->look_wait_ns, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&h->look_held_ns, __ATOMIC_RELAXED);
}

uint32_t fleet_ring_seq(const void *ring) {
    return __atomic_load_n(&((const struct ring_hdr *)ring)->data_seq, __ATOMIC_ACQUIRE);
}

int fleet_ring_wait_since(void *ring, uint32_t seen, int64_t timeout_ns) {
    struct ring_hdr *h = HDR(ring);
    for (int64_t until = monotonic_ns() + FLEET_SPIN_NS; monotonic_ns() < until;) {  /* see fleet_bell_wait */
        if (ring_nonempty(h) || __atomic_load_n(&h->data_seq, __ATOMIC_ACQUIRE) != seen) return 0;
        cpu_relax();
    }
    return ring_sleep(h, seen, timeout_ns);
}

#define RELAY_IDLE 0u
#define RELAY_ARMED 1u
#define RELAY_STOP 2u

int fleet_ring_relay(void *ring, uint32_t *arm, int fd) {
    for (;;) {
        uint32_t a;
        while ((a = __atomic_load_n(&arm[0], __ATOMIC_ACQUIRE)) == RELAY_IDLE)
            fleet_futex_wait(&arm[0], RELAY_IDLE, -1);
        if (a == RELAY_STOP) return 0;
        uint32_t seen = __atomic_load_n(&arm[1], __ATOMIC_ACQUIRE);
        /* Disarm before the wait: an arm that comes while we wait is kept, and costs at
           most one spurious byte. */
        uint32_t expected = RELAY_ARMED;
        __atomic_compare_exchange_n(&arm[0], &expected, RELAY_IDLE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        if (expected == RELAY_STOP) return 0;
        /* Wake now and then to see a stop: the ring may stay silent forever. */
        while (fleet_ring_wait_since(ring, seen, 200000000LL) == 1)
            if (__atomic_load_n(&arm[0], __ATOMIC_ACQUIRE) == RELAY_STOP) return 0;
        char byte = 1;
        while (write(fd, &byte, 1) < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            return -errno;
        }
    }
}

void fleet_ring_relay_arm(uint32_t *arm, uint32_t seen) {
    __atomic_store_n(&arm[1], seen, __ATOMIC_RELEASE);
    uint32_t expected = RELAY_IDLE;
    if (__atomic_compare_exchange_n(&arm[0], &expected, RELAY_ARMED, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        fleet_futex_wake(&arm[0], 1);
}

void fleet_ring_relay_stop(uint32_t *arm) {
    __atomic_store_n(&arm[0], RELAY_STOP, __ATOMIC_RELEASE);
    fleet_futex_wake(&arm[0], 1);
}

static inline int space_for(struct ring_hdr *h, uint32_t len) {
    uint64_t head = h->head;
    uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
    return head - tail + footprint(h->capacity, head, len) <= h->capacity;
}

int fleet_ring_wait_space(void *ring, uint32_t len, int64_t timeout_ns) {
    struct ring_hdr *h = HDR(ring);
    if ((uint64_t)len > max_len(h->capacity)) return -EMSGSIZE;
    if (space_for(h, len)) return 0;
    uint32_t seq = __atomic_load_n(&h->space_seq, __ATOMIC_ACQUIRE);
    __atomic_store_n(&h->producer_waiting, 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* waiting store before tail load */
    int rc = 0;
    if (!space_for(h, len)) {
        rc = fleet_futex_wait(&h->space_seq, seq, timeout_ns);
        if (rc < 0) rc = 0;
    }
    __atomic_store_n(&h->producer_waiting, 0, __ATOMIC_RELAXED);
    return (rc == 1 && !space_for(h, len)) ? 1 : 0;
}

int fleet_bell_ring(uint32_t *bell, uint32_t *waiting) {
    __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiting, __ATOMIC_RELAXED) == 0) return 0;
    /* The waiter clears its own flag (see fleet_ring_notify). */
    fleet_futex_wake(bell, INT_MAX);
    return 1;
}

int fleet_bell_wait(uint32_t *bell, uint32_t *waiting, uint32_t seen, int64_t timeout_ns) {
    if (__atomic_load_n(bell, __ATOMIC_ACQUIRE) != seen) return 0;
    /* A short spin first: a reply that is microseconds away costs less to wait for
       than a sleep and a wake-up (~20-50 us each on a busy VM). Bounded, so an idle
       waiter still sleeps almost all the time. */
    for (int64_t until = monotonic_ns() + FLEET_SPIN_NS; monotonic_ns() < until;) {
        if (__atomic_load_n(bell, __ATOMIC_ACQUIRE) != seen) return 0;
        cpu_relax();
    }
    __atomic_store_n(waiting, 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* waiting store before bell load */
    int rc = 0;
    if (__atomic_load_n(bell, __ATOMIC_ACQUIRE) == seen) {
        rc = fleet_futex_wait(bell, seen, timeout_ns);
        if (rc < 0) rc = 0;
    }
    __atomic_store_n(waiting, 0, __ATOMIC_RELAXED);
    return (rc == 1 && __atomic_load_n(bell, __ATOMIC_ACQUIRE) == seen) ? 1 : 0;
}

/* fleet_bell_wait with a spin of `spin_ns` before the sleep, yielding the CPU at each
 * look: a waiter that expects its next ring within microseconds (replies to work in
 * flight) catches it without a wake-up, and a runnable thread on its core still runs. */
int fleet_bell_wait_spin(uint32_t *bell, uint32_t *waiting, uint32_t seen, int64_t timeout_ns,
                         int64_t spin_ns) {
    int64_t start = monotonic_ns();
    if (timeout_ns >= 0 && spin_ns > timeout_ns) spin_ns = timeout_ns;  /* the spin is part of the wait */
    for (int64_t until = start + spin_ns; monotonic_ns() < until;) {
        if (__atomic_load_n(bell, __ATOMIC_ACQUIRE) != seen) return 0;
        sched_yield();
    }
    return fleet_bell_wait(bell, waiting, seen, timeout_after_spin(timeout_ns, start));
}

/* Look on while *theirs is set (the thread that rang still holds the GIL), at most
 * `handover_ns`, yielding the CPU at each look: on a shared core the holder runs, and
 * lets go, in that yield. */
static void await_handover(const uint32_t *theirs, int64_t handover_ns) {
    if (theirs == NULL || handover_ns <= 0) return;
    for (int64_t until = monotonic_ns() + handover_ns;
         __atomic_load_n(theirs, __ATOMIC_ACQUIRE) != 0 && monotonic_ns() < until;)
        sched_yield();
}

/* `theirs` if it is clear now, else NULL: only a word set during a wait is the ringing
 * thread's, not one left set by a thread that has been running on since (a burst of
 * submits, a loop turning without a wait), for which looking on is a loss. */
static const uint32_t *armed(const uint32_t *theirs) {
    return theirs != NULL && __atomic_load_n(theirs, __ATOMIC_ACQUIRE) == 0 ? theirs : NULL;
}

int fleet_bell_wait_spin_held(uint32_t *bell, uint32_t *waiting, uint32_t seen, int64_t timeout_ns,
                              int64_t spin_ns, uint32_t *mine, const uint32_t *theirs, int64_t handover_ns) {
    if (mine != NULL) __atomic_store_n(mine, 0, __ATOMIC_RELEASE);  /* the cffi call let go of the GIL */
    theirs = armed(theirs);
    int rc = fleet_bell_wait_spin(bell, waiting, seen, timeout_ns, spin_ns);
    if (rc == 0) await_handover(theirs, handover_ns);  /* also after a sleep: one wake-up, not two */
    return rc;
}

int fleet_word_watch_held(const uint32_t *word, uint32_t seen, int64_t spin_ns, uint32_t *mine,
                          const uint32_t *theirs, int64_t handover_ns) {
    if (mine != NULL) __atomic_store_n(mine, 0, __ATOMIC_RELEASE);
    theirs = armed(theirs);
    int rc = fleet_word_watch(word, seen, spin_ns);
    if (rc == 0) await_handover(theirs, handover_ns);
    return rc;
}

int fleet_word_watch(const uint32_t *word, uint32_t seen, int64_t spin_ns) {
    for (int64_t until = monotonic_ns() + spin_ns;;) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return 0;
        if (monotonic_ns() >= until) return 1;
        sched_yield();
    }
}

#ifndef __NR_epoll_pwait2
#define __NR_epoll_pwait2 441 /* one number on every architecture (new syscalls since 5.1) */
#endif
#define EPOLL_NS_BATCH 256

/* The kernel's own timespec for epoll_pwait2 (struct __kernel_timespec: 64-bit fields on
   every architecture), spelled here so the build needs no recent kernel headers. */
struct epoll_ns_timespec {
    int64_t tv_sec;
    long long tv_nsec;
};

int fleet_epoll_wait_ns(int epfd, uint64_t *out, int max_events, int64_t timeout_ns) {
    struct epoll_event evs[EPOLL_NS_BATCH];
    struct epoll_ns_timespec ts, *tsp = NULL;
    if (max_events <= 0) return -EINVAL;
    if (max_events > EPOLL_NS_BATCH) max_events = EPOLL_NS_BATCH;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
        tsp = &ts;
    }
    /* Through syscall(): glibc wraps epoll_pwait2 only since 2.35. No signal mask. */
    long n = syscall(__NR_epoll_pwait2, epfd, evs, max_events, tsp, NULL, (size_t)0);
    if (n < 0) return -errno;
    for (long i = 0; i < n; i++)
        out[i] = ((uint64_t)evs[i].events << 32) | (uint32_t)evs[i].data.fd;
    return (int)n;
}

void fleet_prefault(const void *p, size_t len, size_t page) {
    const volatile uint8_t *at = (const volatile uint8_t *)p;
    if (page == 0) return;
    for (size_t off = 0; off < len; off += page) (void)at[off];
}

void fleet_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
