/* The local tier's on-disk format, for the C that writes or reads it: the stager
 * (cache/_stager.c) and the mount's daemon (mount/mountfs.c). Python's side of the same
 * format is cache/entry.py (the entry trailer) and cache/extents.py (the index and its
 * slots); tests/cache/test_tier_format.py reads this header and checks that both sides agree.
 *
 * An entry is the sample's bytes followed by a 32-byte trailer (little-endian):
 *   "CVENTRY1" | xxh3-64 of the bytes | the source's mtime in ns | the bytes' length.
 * The index is a 4096-byte header, a 4-byte counter per slot, then the slots.
 * A key's node-wide lock is the byte (digest >> 32) of the tier's locks file, where
 * digest is the key's index digest (the first 8 bytes of its sha1, big-endian). */
#ifndef CLAIRVOYANT_TIER_FORMAT_H
#define CLAIRVOYANT_TIER_FORMAT_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <xxhash.h>

#define ENTRY_MAGIC "CVENTRY1"
#define TRAILER 32
#define INDEX_MAGIC "CVINDEX1"
#define INDEX_HEADER 4096

struct entry_trailer { char magic[8]; uint64_t checksum; int64_t mtime_ns; uint64_t length; };
struct slot { uint64_t digest; uint32_t seq, extent; uint64_t offset; uint32_t length, stamp; };

_Static_assert(sizeof(struct entry_trailer) == TRAILER, "the entry trailer is 32 bytes (cache/entry.py)");
_Static_assert(sizeof(struct slot) == 32, "an index slot is 32 bytes (cache/extents.py)");

/* Write the trailer of the ``size`` bytes at ``data`` to ``out`` (32 bytes; little-endian hosts). */
static inline void seal_trailer(char *out, const char *data, uint64_t size, int64_t mtime_ns) {
    struct entry_trailer t;
    memcpy(t.magic, ENTRY_MAGIC, 8);
    t.checksum = XXH3_64bits(data, size);
    t.mtime_ns = mtime_ns;
    t.length = size;
    memcpy(out, &t, sizeof t);
}

/* The byte of the tier's locks file that is the node-wide lock of the key with index ``digest``. */
static inline off_t key_lock_offset(uint64_t digest) { return (off_t)(digest >> 32); }

/* -- the index, read: the daemon's reads (mount/mountfs.c) and the stager's check that an entry
 * is there before it reads the source (cache/_stager.c) ---------------------------------------- */

struct tier_index {
    int fd;                      /* the index file, read-only; -1: none */
    const uint8_t *map;          /* mapped read-only, or NULL */
    size_t len;
    pthread_rwlock_t lock;       /* readers look up under it; a remap takes it for writing */
};

#define TIER_INDEX_INIT {-1, NULL, 0, PTHREAD_RWLOCK_INITIALIZER}

static inline size_t tier_index_bytes(uint32_t bits) {
    return INDEX_HEADER + ((size_t)4 + sizeof(struct slot)) * ((size_t)1 << bits);
}

/* Map (or map again: a new session may have grown the table) the index; under the write lock. */
static inline int tier_index_remap(struct tier_index *ix) {
    struct stat st;
    if (ix->fd < 0 || fstat(ix->fd, &st) < 0 || (size_t)st.st_size < INDEX_HEADER) return -1;
    if (ix->map) munmap((void *)ix->map, ix->len);
    ix->map = NULL;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, ix->fd, 0);
    if (m == MAP_FAILED) return -1;
    ix->map = m;
    ix->len = (size_t)st.st_size;
    return 0;
}

/* The index's present entry of ``digest``: 1 and (extent, offset, length, the session it was written
 * or checked in, the slot's sequence number: it changes with every write of the slot), or 0. */
static inline int tier_index_lookup(struct tier_index *ix, uint64_t digest, uint32_t *extent, uint64_t *offset,
                                    uint32_t *length, uint32_t *stamp, uint32_t *seq) {
    int found = 0;
    pthread_rwlock_rdlock(&ix->lock);
    uint32_t bits = 0;
    if (ix->map) memcpy(&bits, ix->map + 12, 4);
    if (!ix->map || memcmp(ix->map, INDEX_MAGIC, 8) != 0 || bits > 40 || tier_index_bytes(bits) != ix->len) {
        pthread_rwlock_unlock(&ix->lock);
        pthread_rwlock_wrlock(&ix->lock);
        tier_index_remap(ix);
        if (ix->map) memcpy(&bits, ix->map + 12, 4);
        int ok = ix->map && memcmp(ix->map, INDEX_MAGIC, 8) == 0 && bits <= 40 && tier_index_bytes(bits) <= ix->len;
        pthread_rwlock_unlock(&ix->lock);
        if (!ok) return 0;
        pthread_rwlock_rdlock(&ix->lock);
        if (!ix->map) { pthread_rwlock_unlock(&ix->lock); return 0; }
        memcpy(&bits, ix->map + 12, 4);
        if (bits > 40 || tier_index_bytes(bits) > ix->len) { pthread_rwlock_unlock(&ix->lock); return 0; }
    }
    uint64_t n = (uint64_t)1 << bits, mask = n - 1, i = digest & mask;
    struct slot *slots = (struct slot *)(ix->map + INDEX_HEADER + 4 * n);
    for (uint64_t step = 0; step < n; step++, i = (i + 1) & mask) {
        uint64_t d = __atomic_load_n(&slots[i].digest, __ATOMIC_ACQUIRE);
        if (d == 0) break;
        if (d != digest) continue;
        for (int tries = 0; tries < 1000; tries++) {   /* the slot's seqlock */
            uint32_t s1 = __atomic_load_n(&slots[i].seq, __ATOMIC_ACQUIRE);
            if (s1 & 1) continue;
            uint32_t e = __atomic_load_n(&slots[i].extent, __ATOMIC_RELAXED);
            uint64_t o = __atomic_load_n(&slots[i].offset, __ATOMIC_RELAXED);
            uint32_t l = __atomic_load_n(&slots[i].length, __ATOMIC_RELAXED);
            uint32_t t = __atomic_load_n(&slots[i].stamp, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(&slots[i].seq, __ATOMIC_RELAXED) != s1) continue;
            if (l) { *extent = e; *offset = o; *length = l; *stamp = t; *seq = s1; found = 1; }
            break;
        }
        break;
    }
    pthread_rwlock_unlock(&ix->lock);
    return found;
}

static inline void tier_index_close(struct tier_index *ix) {
    if (ix->map) munmap((void *)ix->map, ix->len);
    ix->map = NULL;
    if (ix->fd >= 0) close(ix->fd);
    ix->fd = -1;
}

#endif
