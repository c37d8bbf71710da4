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

/* ---- Single-producer single-consumer byte rings (the data plane) ----------------
 *
 * A ring sits at a 64-byte-aligned address in a shared mapping: 256 bytes of
 * header (4 cache lines: producer index, consumer index, data wake-up,
 * space wake-up + constants) followed by `capacity` data bytes, a power of two
 * >= 4096. Exactly one process pushes and exactly one pops.
 *
 * A message is an 8-byte frame {uint32 len, uint32 tag} and `len` payload bytes,
 * padded to 8. A message that would straddle the end of the data area is preceded
 * by a wrap marker (len = 0xffffffff) and starts at offset 0. A message fits the
 * ring at all only if len + 16 <= capacity / 2 (then it always fits an empty ring).
 *
 * Early wrap: from offset min(64 KiB, capacity / 4) on, a message pushed into an
 * empty ring goes back to offset 0 (behind a wrap marker) when it fits before that
 * offset. A ring's pages in use are then those of its longest backlog, not its whole
 * capacity: without it every byte that crossed a ring would have touched its page,
 * until all of it was held (a tmpfs page stays allocated for the segment's life).
 *
 * Wake-ups are futexes: the consumer sleeps on data_seq, the producer on space_seq,
 * and a side issues FUTEX_WAKE only when its peer announced it is waiting, so a
 * busy ring makes no system calls. */
size_t  fleet_ring_bytes(uint64_t capacity);
int     fleet_ring_init(void *ring, uint64_t capacity);   /* 0 or -EINVAL */
int     fleet_ring_check(const void *ring);               /* 0 or -EINVAL */
/* Producer. push/push2 return 0, -EAGAIN (no room now) or -EMSGSIZE (never fits);
 * they publish but do not wake: call fleet_ring_notify after a batch of pushes.
 * push2 sends one message whose payload is a followed by b. */
int     fleet_ring_push(void *ring, uint32_t tag, const void *buf, uint32_t len);
int     fleet_ring_push2(void *ring, uint32_t tag, const void *a, uint32_t alen,
                         const void *b, uint32_t blen);
/* Bumps data_seq; wakes the consumer only if it waits. 1 if it issued the wake, else 0. */
int     fleet_ring_notify(void *ring);
/* push_many: messages packed back to back in buf (lens[i] bytes each), pushed in order
 * until one does not fit; returns how many were pushed. notify != 0: wakes the
 * consumer once after them (if any were pushed). */
int     fleet_ring_push_many(void *ring, uint32_t tag, const void *buf, const uint32_t *lens,
                             uint32_t n, int notify);
/* Sleeps until a message of len bytes would fit (0) or timeout_ns passes (1);
 * timeout_ns < 0 waits forever; -EMSGSIZE if it can never fit. Spurious 0s happen. */
int     fleet_ring_wait_space(void *ring, uint32_t len, int64_t timeout_ns);
/* Consumer. pop copies one message into out and returns its length, -EAGAIN when
 * empty, or -ENOBUFS when cap is too small: the message stays in place and its
 * length goes to *needed (if needed is not NULL). */
int64_t fleet_ring_pop(void *ring, uint32_t *tag, void *out, uint32_t cap, uint32_t *needed);
/* Copies as many whole messages as fit in out[cap] (at most max_msgs), each starting
 * at an 8-byte boundary, their lengths and tags into lens/tags; returns the count
 * (0 when empty). -ENOBUFS if even the first does not fit (its length in lens[0]).
 * Wakes a waiting producer once, at the end. */
int64_t fleet_ring_pop_many(void *ring, void *out, uint64_t cap, uint32_t *lens,
                            uint32_t *tags, uint32_t max_msgs);
/* fleet_ring_pop_many for a consumer that does not trust the producer: `capacity` is the
 * one the consumer made the ring with; -EPROTO (the ring left as it was) when a word
 * of the ring or a frame's length would take a read outside it. */
int64_t fleet_ring_pop_many_checked(void *ring, uint64_t capacity, void *out, uint64_t cap,
                                    uint32_t *lens, uint32_t *tags, uint32_t max_msgs);
/* Returns 0 at once if a message is there, else sleeps until one may be (0) or
 * timeout_ns passes (1); timeout_ns < 0 waits forever. Spurious 0s happen. */
int     fleet_ring_wait(void *ring, int64_t timeout_ns);
/* fleet_ring_wait after looking up to spin_ns for a message (yielding the CPU at each
 * look; the spin is part of the timeout). Each look's time is counted in the ring's
 * header (fleet_ring_looked). */
int     fleet_ring_wait_spin(void *ring, int64_t timeout_ns, int64_t spin_ns);
/* What the consumer's looks (fleet_ring_wait_spin) took since the ring was made, in ns:
 * out[0] on CPU, out[1] off it in short yields (other threads that look, handing the CPU
 * straight back), out[2] off it in yields of 500 us or more (a task that ran a slice). */
void    fleet_ring_looked(const void *ring, uint64_t *out);
/* A consumer that also waits for wake-ups of its own (another thread of its process
 * calling fleet_ring_notify) reads seq = fleet_ring_seq(ring), looks at its own work,
 * then calls fleet_ring_wait_since(ring, seq, ...): it returns 0 at once if a message
 * is there or any notify came after seq was read, else sleeps like fleet_ring_wait.
 * No wake-up is lost between the look and the sleep. notify is atomics only, so any
 * thread may call it. */
uint32_t fleet_ring_seq(const void *ring);
int     fleet_ring_wait_since(void *ring, uint32_t seen, int64_t timeout_ns);
/* A relay turns a ring's wake-ups into a readable file descriptor, for a consumer whose
 * own loop waits on fds (an asyncio loop): called from a thread of its own, which it
 * never returns to Python from (so it needs no GIL), it waits until armed, then until
 * the ring has a message or a notify came after the seq given at arming, then writes
 * one byte to fd and waits to be armed again. The consumer reads seq, looks at its
 * work, and arms with that seq when it found none: no wake-up is lost between. `arm`
 * is two uint32 words of the consumer's process, zeroed. Returns 0 once stopped,
 * -errno if the write fails (EAGAIN excepted: a full pipe is readable already). */
int     fleet_ring_relay(void *ring, uint32_t *arm, int fd);
void    fleet_ring_relay_arm(uint32_t *arm, uint32_t seen);
void    fleet_ring_relay_stop(uint32_t *arm);
uint64_t fleet_ring_used(const void *ring);               /* bytes in flight */
uint64_t fleet_ring_capacity(const void *ring);
uint32_t fleet_ring_max_message(const void *ring);        /* largest len that can ever fit */

/* A doorbell: one consumer waits on a single word that many producers ring.
 * bell_ring bumps *bell and wakes the waiter only if *waiting is set; returns 1 if
 * it issued the wake. bell_wait sleeps while *bell == seen: 0 when woken or changed,
 * 1 on timeout (timeout_ns < 0: forever). */
int     fleet_bell_ring(uint32_t *bell, uint32_t *waiting);
int     fleet_bell_wait(uint32_t *bell, uint32_t *waiting, uint32_t seen, int64_t timeout_ns);
/* bell_wait_spin: bell_wait after spinning up to spin_ns (yielding the CPU at each look). */
int     fleet_bell_wait_spin(uint32_t *bell, uint32_t *waiting, uint32_t seen, int64_t timeout_ns,
                             int64_t spin_ns);
/* A word that one thread bumps (any atomic add) and other threads of the process
 * watch for a short while, never sleeping: word_watch looks until *word != seen (0)
 * or spin_ns have passed (1), yielding the CPU at each look. */
int     fleet_word_watch(const uint32_t *word, uint32_t seen, int64_t spin_ns);
/* A GIL handover between two threads of a process (fleet.shm.dataplane.Handover). The
 * thread that rings a bell or bumps a word for another sets its own `held` word first
 * (it holds the GIL), and these waits clear it as they begin (`mine`: the GIL is let
 * go by then). The woken thread, once it sees the ring or the bump (awake or after a
 * sleep), looks on while the other's word (`theirs`) is still set, at most
 * `handover_ns`, so it asks for the GIL once it is free instead of sleeping on the
 * GIL's condition and being woken again; only when that word was clear as the wait
 * began (one set before is a thread's that went on running: a burst of submits, a
 * loop turning). NULL: none.
 * Each returns what bell_wait_spin and word_watch return. */
int     fleet_bell_wait_spin_held(uint32_t *bell, uint32_t *waiting, uint32_t seen, int64_t timeout_ns,
                                  int64_t spin_ns, uint32_t *mine, const uint32_t *theirs, int64_t handover_ns);
int     fleet_word_watch_held(const uint32_t *word, uint32_t seen, int64_t spin_ns, uint32_t *mine,
                              const uint32_t *theirs, int64_t handover_ns);

/* epoll_wait with a nanosecond timeout (epoll_pwait2, Linux 5.11): an event loop's
 * timers then fire when due, where epoll_wait's whole milliseconds wake them up to 1 ms
 * late. Waits on `epfd` at most timeout_ns (< 0: no limit) and writes up to
 * `max_events` (at most 256 a call; level-triggered fds report the rest next call)
 * ready events to `out`, each as (events << 32) | fd. Returns how many, or -errno:
 * -ENOSYS (or -EPERM from a seccomp filter) when the kernel does not offer it, -EINTR
 * when a signal came (the caller runs its handlers and waits again for what is left). */
int     fleet_epoll_wait_ns(int epfd, uint64_t *out, int max_events, int64_t timeout_ns);

/* Map every page of [p, p + len) now: one read per `page` bytes (a shared memory file's
 * page is allocated at its first touch, read or write). cffi calls it with the GIL
 * released, where mmap's MAP_POPULATE would hold it for the whole populating. */
void    fleet_prefault(const void *p, size_t len, size_t page);
/* memcpy, for cffi to call with the GIL released: a large copy (a payload into its
 * parcel) then lets every other thread of the process run. */
void    fleet_copy(void *dst, const void *src, size_t n);
