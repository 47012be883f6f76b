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

#include <stdint.h>
#include <string.h>
#include <sys/types.h>
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

#endif
