/* The counters of `clairvoyant mount`'s daemon (mountfs.c), in the --stats file it maps shared:
 * written down once for C here, read by mount/fs.py (its _FIELDS, in this order, and _MAGIC /
 * _VERSION); tests/mount/test_mount_stats.py checks that the two agree. Change both, and STATS_VERSION. */
#ifndef CLAIRVOYANT_MOUNT_STATS_H
#define CLAIRVOYANT_MOUNT_STATS_H

#include <stdint.h>

#define STATS_MAGIC "CVMNTST"     /* 7 characters and a NUL */
#define STATS_VERSION 7

struct mountfs_stats {
    char magic[8];
    uint32_t version;
    uint32_t size;
    uint64_t opens_local, opens_source, bytes_local, bytes_source, corrupt, reads, info_opens, pid;
    uint64_t stale;   /* entries of an earlier session whose source changed since (never served) */
    uint64_t wait_timeouts;  /* first reads that waited STAGING_WAIT_MS for another process's copy
                              * of the file and then read the source themselves (read twice) */
    uint64_t events_dropped;   /* reports the mount process could not take (its pipe was full) */
    uint64_t no_open;         /* 1: the kernel sends no OPEN/RELEASE: opens served by its page cache are unseen */
    uint64_t opens_seen;      /* OPEN requests of files (without no_open) */
    uint64_t opens_cached;    /* of those, released with no READ of a non-empty file: the page cache served them */
    uint64_t opens_peer, bytes_peer;   /* first READs served from another node's tier (--homes) */
    uint64_t asks, ask_timeouts;       /* files asked of the mount process; of those, no answer in time */
};

#endif
