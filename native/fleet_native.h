/* The C half of fleet: what Python and numba cannot express on their own.
 *
 * Every function takes raw addresses inside a shared-memory segment, so the same
 * code serves any process that mapped the segment. Declarations here are parsed
 * by cffi (native/build_native.py); keep them plain C.
 */

/* 64-bit atomics with explicit ordering (sequentially consistent CAS). */
uint64_t fleet_load_acquire_u64(const uint64_t *addr);
void     fleet_store_release_u64(uint64_t *addr, uint64_t value);
int      fleet_cas_u64(uint64_t *addr, uint64_t expected, uint64_t desired);
uint64_t fleet_fetch_add_u64(uint64_t *addr, uint64_t delta);

/* 32-bit atomics for futex words. */
uint32_t fleet_load_acquire_u32(const uint32_t *addr);
uint32_t fleet_fetch_add_u32(uint32_t *addr, uint32_t delta);

/* Futex wait/wake on a process-shared 32-bit word.
 * fleet_futex_wait sleeps while *addr == expected, at most timeout_ns (< 0: forever).
 * Returns 0 when woken (or the value already differed), 1 on timeout, -errno on error. */
int fleet_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns);
/* Wakes up to n waiters; returns how many were woken or -errno. */
int fleet_futex_wake(uint32_t *addr, int n);

/* A robust, process-shared mutex living in shared memory.
 * fleet_mutex_size() bytes at addr; init once by the segment's creator.
 * fleet_mutex_lock returns 0, or 1 when the previous owner died holding it
 * (the lock is then held and already made consistent), or -errno. */
size_t fleet_mutex_size(void);
int fleet_mutex_init(void *addr);
int fleet_mutex_lock(void *addr);
int fleet_mutex_unlock(void *addr);
int fleet_mutex_destroy(void *addr);

/* Ask the kernel to send `sig` to this process when its parent dies; returns 0 or -errno. */
int fleet_set_pdeathsig(int sig);

/* Copy a table of n_words 64-bit words from src to dst, reading each of the n_recs
 * seqlocked records (rec_start[i], rec_len[i] words, sequence at word seq_at[i]) until
 * it is consistent: sequence even and unchanged across the copy. A record is retried
 * spinning `spins` times, then yielding the CPU (its writer may have been preempted
 * mid-write) until `timeout_ns` has passed; a record that never settles (its writer
 * died mid-write) keeps its last copy and gets unsettled[i] = 1. Returns how many
 * records never settled. */
int fleet_snapshot_copy(const uint64_t *src, uint64_t *dst, size_t n_words,
                        const int64_t *rec_start, const int64_t *rec_len, const int64_t *seq_at,
                        size_t n_recs, int spins, int64_t timeout_ns, uint8_t *unsettled);
