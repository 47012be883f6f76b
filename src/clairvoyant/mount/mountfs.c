/*
 * mountfs: the daemon of `clairvoyant mount`, a read-only FUSE view of a data set's directory.
 *
 *   mountfs -f --listing=FILE --index=FILE --extents=DIR --stats=FILE --info=FILE
 *           [--events-fd=N] [--handoff=DIR] [--watch-parent] [fuse options] SOURCE MOUNTPOINT
 *
 * Metadata never touches SOURCE: getattr, lookup, readdir and open are answered from the
 * listing (written by clairvoyant/mount/listing.py from the manifest: every file's relative
 * path, size, key digest, mode and times, and every folder's, empty ones included), so a
 * training job's `stat`/`listdir` storm stays on this node.
 *
 * Opens cost nothing: where the kernel allows (no_open), the first open answers ENOSYS, and the
 * kernel then sends no OPEN or RELEASE for any file, only READs, and keeps a file's pages between
 * opens (CLAIRVOYANT_MOUNT_OPENS=1 in the environment keeps one OPEN and RELEASE per open, as on
 * kernels without no_open). A file's first READ (offset 0, i.e. each time the kernel lacks its
 * first page) looks its digest up in the local tier's shared index (cache/extents.py: a mapped
 * open-addressing table, slots read under their seqlock, never written here). When the slot
 * holds an entry of the file's size plus the 32-byte trailer, the whole entry is read and its
 * xxh3-64 checksum compared with the trailer's; only then is the READ served from those bytes.
 * Anything else (absent, another length, a bad trailer, a failed checksum, a vanished extent, an
 * entry of an earlier session whose source file changed) reads the source instead: a corrupt
 * staged entry is never served. A later READ of a large file reads in place the very entry that
 * was verified whole (the slot's extent, offset and sequence number unchanged), else checks again.
 *
 * Counters live in the --stats file (struct mountfs_stats, mapped shared; the Python reader
 * clairvoyant/mount/fs.py must match it field for field); "opens" count first READs. What the
 * kernel serves from its page cache sends no READ: with no_open (no_open = 1 in the stats) it
 * sends nothing at all for such an open, and the daemon cannot count it; with an OPEN and a
 * RELEASE per open, an open of a non-empty file released with no READ through its handle is
 * counted as served by the page cache (opens_cached), and the file is looked up in the tier or
 * the source only at its handle's first READ. Each first READ
 * writes the file's number (u64; bit 63 set where the tier served it) to --events-fd, if given,
 * without blocking: the mount process stages what was read from the source (read-through
 * caching), reads ahead in the order of the opens, and with a sampler counts a use as past. With --handoff=DIR such
 * an open reads the whole file at once and leaves its bytes, then the source file's mtime in ns
 * (u64, little-endian), in DIR/<number> (written to a temporary name, then renamed, before the
 * event), so that the mount process caches them from there instead of reading the shared store
 * a second time.
 * With --homes=FILE and --node=N (``clairvoyant mount --cluster``): FILE holds each file's home node
 * (u32 per file number). A first READ of a file the tier lacks and whose home is another node asks
 * the mount process for it (its number with EVENT_ASK set, on --events-fd), then waits up to
 * --ask-wait ms for DIR/<number> (--handoff: the bytes the home sent, then their mtime, as above)
 * or DIR/<number>.miss (the home could not say): the READ is served from the former, else from
 * the source. Counted: opens_peer, bytes_peer, asks, ask_timeouts.
 * /.clairvoyant.json (not listed by readdir) serves the bytes of --info.
 * Writes, creates, unlinks, renames and every other change fail with EROFS.
 * --watch-parent: exit (and unmount) when the process that started us is gone.
 */

#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include "fuse_common.h"
#include "fuse_loader.h"
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#define XXH_INLINE_ALL   /* xxhash compiled in from its header: nothing to link */
#include "cache/tier_format.h"
#include "mount_stats.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mountfs: the listing, index and stats files are little-endian"
#endif

#define LISTING_MAGIC "CVMNTLS1"
#define LISTING_VERSION 2
#define INFO_NAME "/.clairvoyant.json"

struct listing_head {   /* 64 bytes */
    char magic[8];
    uint32_t version, pad;
    uint64_t nfiles, ndirs, nchildren, strings;
    uint64_t reserved[2];
};
struct lfile { uint64_t size, digest, path; uint32_t mode, pad; int64_t mtime, atime, ctime; };
struct ldir { uint64_t path, first, count; uint32_t mode, nlink; int64_t mtime, atime, ctime; };
struct lchild { uint64_t name, ref; };  /* ref: index << 1 | is_dir */
_Static_assert(sizeof(struct lfile) == 56 && sizeof(struct ldir) == 56 && sizeof(struct lchild) == 16,
               "the listing's records are laid out as clairvoyant/mount/listing.py writes them");

static struct {
    char *listing, *index, *extents, *stats, *info, *source, *handoff, *homes;
    int events_fd, watch_parent;
    unsigned session;   /* the tier's present session: entries stamped otherwise are checked once */
    unsigned node;      /* this node's number among the homes */
    unsigned ask_wait;  /* ms a READ waits for a file asked of a peer */
} opt = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, 0, 0, 0, 2000};
static const uint32_t *homes;   /* per file: its home node (--homes), or NULL: no cluster */

static const struct lfile *files;
static const struct ldir *dirs;
static const struct lchild *children;
static const char *strs;
static uint64_t nfiles, ndirs;
static int no_open;        /* the kernel sends no OPEN/RELEASE (see mnt_open) */
static uint8_t *checked;   /* per file: its entry of an earlier session matched the source here */
static uint64_t total_bytes;

static int src_fd = -1;
static struct tier_index tindex = TIER_INDEX_INIT;
static int locks_fd = -1;   /* the tier's byte-range locks: a locked key is being staged now */

static char *info_bytes;
static size_t info_len;
static struct mountfs_stats *sh;
static struct timespec started;

struct handle {
    const struct lfile *file;   /* NULL for the info file */
    uint64_t pub;    /* (4) the publication of the entry read in place */
    int fd;          /* source file or (4) extent, or -1 when served from buf */
    char *buf;       /* the verified sample's bytes (local), the source's (read whole), or the info file */
    uint64_t size, base;   /* base: (4) where the entry starts in the extent */
    int local;       /* 1: from the tier, 2: the info file, 3: read whole from the source,
                      * 4: a later part of an entry verified whole here (read in place),
                      * 5: a later part of a file this daemon read whole and handed over,
                      * 6: a file another node's tier sent (--homes) */
};

/* A handle of an OPEN (without no_open): prepared at its first READ, so that an open the kernel
 * serves from its page cache reads nothing and is counted as such at its RELEASE. */
struct opened {
    pthread_mutex_t mu;
    int state;       /* 0: not prepared yet, 1: prepared, < 0: -errno of the preparation */
    int read;        /* a READ came through this handle */
    struct handle h;
};

static void count(uint64_t *field, uint64_t n) { __atomic_fetch_add(field, n, __ATOMIC_RELAXED); }

static const char *rel(const char *path) { return path[0] == '/' ? path + 1 : path; }

/* The file or directory named by ``path`` (relative, no leading slash), by binary search over the
   listing's sorted paths: >= 0 a file, -1 not found; *dir set to the directory's index when it is one. */
static int64_t find(const char *p, int64_t *dir) {
    int64_t lo = 0, hi = (int64_t)nfiles - 1;
    *dir = -1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p, strs + files[mid].path);
        if (c == 0) return mid;
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    lo = 0, hi = (int64_t)ndirs - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p, strs + dirs[mid].path);
        if (c == 0) { *dir = mid; return -1; }
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return -1;
}

/* -- the local tier's index ------------------------------------------------------------------ */

/* Read up to ``n`` bytes at ``at`` (fewer only at the end of the file): the count, or -errno if
 * reading failed before any byte. */
static ssize_t pread_all(int fd, char *buf, size_t n, off_t at) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, at + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return got ? (ssize_t)got : -errno;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Whether the entry of file ``f`` (its trailer at ``trailer``), written in an earlier session, still
 * matches the source: one stat of the source file per file and daemon, as the Loader does once per
 * entry and session (size and mtime against those the trailer recorded). */
static int current(const struct lfile *f, const char *trailer) {
    uint64_t i = (uint64_t)(f - files);
    if (__atomic_load_n(&checked[i], __ATOMIC_RELAXED)) return 1;
    struct stat st;
    int64_t mtime;
    memcpy(&mtime, trailer + 16, 8);
    if (fstatat(src_fd, strs + f->path, &st, 0) != 0 || (uint64_t)st.st_size != f->size ||
        (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != mtime)
        return 0;
    __atomic_store_n(&checked[i], 1, __ATOMIC_RELAXED);
    return 1;
}

/* Which publication of each file's entry was last verified whole here: a hash of (extent, offset,
 * the slot's sequence number), 0 if none. A later part of a large file is then read in place
 * (``read_local_part``) instead of verifying the whole entry again for every READ. */
static uint64_t *verified;

static uint64_t publication(uint32_t extent, uint64_t offset, uint32_t seq) {
    uint64_t k[2] = {(uint64_t)extent << 32 | seq, offset};
    return XXH3_64bits(k, sizeof k) | 1;
}

static int open_extent(uint32_t extent) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%u", opt.extents, extent);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* The verified, current bytes of file ``f`` from the local tier, or NULL (counting a corrupt
 * entry; *stale set for one of an earlier session whose source changed: its trailer alone is read). */
static char *read_local(const struct lfile *f, int *stale) {
    uint32_t extent, length, stamp, seq;
    uint64_t offset;
    if (!tier_index_lookup(&tindex, f->digest, &extent, &offset, &length, &stamp, &seq)) return NULL;
    if ((uint64_t)length != f->size + TRAILER) return NULL;   /* another size: stale, not ours */
    int fd = open_extent(extent);
    if (fd < 0) return NULL;   /* evicted meanwhile */
    if (stamp != opt.session && !__atomic_load_n(&checked[f - files], __ATOMIC_RELAXED)) {
        char trailer[TRAILER];
        if (pread(fd, trailer, TRAILER, (off_t)(offset + f->size)) == TRAILER &&
            memcmp(trailer, ENTRY_MAGIC, 8) == 0 && !current(f, trailer)) {
            close(fd);
            *stale = 1;
            return NULL;
        }
    }
    char *buf = malloc(length ? length : 1);
    ssize_t got = buf ? pread_all(fd, buf, length, (off_t)offset) : -1;
    close(fd);
    if (!buf) return NULL;
    uint64_t sum, n;
    if (got != (ssize_t)length || memcmp(buf + f->size, ENTRY_MAGIC, 8) != 0) goto bad;
    memcpy(&sum, buf + f->size + 8, 8);
    memcpy(&n, buf + f->size + 24, 8);
    if (n != f->size || XXH3_64bits(buf, f->size) != sum) goto bad;
    if (stamp != opt.session && !current(f, buf + f->size)) { free(buf); *stale = 1; return NULL; }
    __atomic_store_n(&verified[f - files], publication(extent, offset, seq), __ATOMIC_RELAXED);
    return buf;
bad:
    count(&sh->corrupt, 1);
    free(buf);
    return NULL;
}

/* An open extent and the entry's offset in it, if the tier holds the very publication of file
 * ``f``'s entry that was verified whole here last; else -1. */
static int read_local_part(const struct lfile *f, uint64_t *base, uint64_t *pub) {
    uint32_t extent, length, stamp, seq;
    uint64_t offset;
    if (!tier_index_lookup(&tindex, f->digest, &extent, &offset, &length, &stamp, &seq)) return -1;
    *pub = publication(extent, offset, seq);
    if ((uint64_t)length != f->size + TRAILER || __atomic_load_n(&verified[f - files], __ATOMIC_RELAXED) != *pub)
        return -1;
    int fd = open_extent(extent);
    *base = offset;
    return fd;
}

/* Whether the tier still holds publication ``pub`` of file ``f``'s entry: looked at after a part
 * was read in place, so that bytes read from an entry evicted (or replaced) meanwhile are never
 * served. */
static int still_published(const struct lfile *f, uint64_t pub) {
    uint32_t extent, length, stamp, seq;
    uint64_t offset;
    return tier_index_lookup(&tindex, f->digest, &extent, &offset, &length, &stamp, &seq) &&
           publication(extent, offset, seq) == pub;
}

/* -- files being read whole, and the ones just read ---------------------------------------------
 * A file's first READ that goes to the source reads it whole. When the kernel asks for the file in
 * several READs, the later ones wait while that read runs (reading[]), then take their part from
 * memory: the last files read whole that the first READ did not cover (ring, up to RING_BYTES),
 * so that no later part reads the source again, whether or not the tier took the file. */
#define RING_SLOTS 64
#define RING_BYTES (256ull << 20)
#define RING_FILE_MAX (RING_BYTES / 4)   /* a larger file is not read whole for its later parts */
static uint8_t *reading;
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_cv;   /* on CLOCK_MONOTONIC: ring_init */
static struct { int64_t f; char *buf; uint64_t size; } ring[RING_SLOTS];
static unsigned ring_next;
static uint64_t ring_bytes;

static int ring_init(void) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return -1;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int r = pthread_cond_init(&ring_cv, &a);
    pthread_condattr_destroy(&a);
    return r;
}

/* Forget the copies of file ``f`` (caller holds ring_mu). */
static void ring_forget(int64_t f) {
    for (unsigned i = 0; i < RING_SLOTS; i++) {
        if (ring[i].buf && ring[i].f == f) {
            ring_bytes -= ring[i].size;
            free(ring[i].buf);
            ring[i].buf = NULL;
        }
    }
}

static void ring_drop(int64_t f) {
    pthread_mutex_lock(&ring_mu);
    ring_forget(f);
    pthread_mutex_unlock(&ring_mu);
}

static void reading_set(int64_t f, int on) {
    pthread_mutex_lock(&ring_mu);
    reading[f] = (uint8_t)on;
    if (!on) pthread_cond_broadcast(&ring_cv);
    pthread_mutex_unlock(&ring_mu);
}

/* Keep a copy of ``buf`` (file ``f``, read whole) for its later parts; the oldest give way. */
static void ring_put(int64_t f, const char *buf, uint64_t size) {
    if (size > RING_FILE_MAX) return;
    char *copy = malloc(size ? size : 1);
    if (!copy) return;
    memcpy(copy, buf, size);
    pthread_mutex_lock(&ring_mu);
    ring_forget(f);   /* one copy per file: the newest */
    for (unsigned i = 0; i < RING_SLOTS; i++) {   /* slots fill in turn: the next is the oldest */
        if (i > 0 && ring_bytes + size <= RING_BYTES) break;
        unsigned j = (ring_next + i) % RING_SLOTS;
        if (ring[j].buf) {
            ring_bytes -= ring[j].size;
            free(ring[j].buf);
            ring[j].buf = NULL;
        }
    }
    ring[ring_next].f = f;
    ring[ring_next].buf = copy;
    ring[ring_next].size = size;
    ring_bytes += size;
    ring_next = (ring_next + 1) % RING_SLOTS;
    pthread_mutex_unlock(&ring_mu);
}

/* Serve ``size`` bytes at ``off`` of file ``f`` from memory, after waiting (up to 2 s) for a whole
 * read of it under way here; -1 if it is not there. */
static int ring_read(int64_t f, char *buf, size_t size, off_t off) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += 2;
    pthread_mutex_lock(&ring_mu);
    while (reading[f] && pthread_cond_timedwait(&ring_cv, &ring_mu, &until) == 0) {}
    int r = -1;
    for (unsigned i = 0; i < RING_SLOTS; i++) {
        if (ring[i].buf && ring[i].f == f) {
            uint64_t n = (uint64_t)off >= ring[i].size ? 0 : ring[i].size - (uint64_t)off;
            if (n > size) n = size;
            if (n) memcpy(buf, ring[i].buf + off, n);
            r = (int)n;
            break;
        }
    }
    pthread_mutex_unlock(&ring_mu);
    return r;
}

/* -- operations ------------------------------------------------------------------------------ */

static struct timespec from_ns(int64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    if (t.tv_nsec < 0) { t.tv_nsec += 1000000000L; t.tv_sec -= 1; }
    return t;
}

static void fill_plain(struct stat *st, uint64_t size) {   /* the info file */
    memset(st, 0, sizeof *st);
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = (off_t)size;
    st->st_blocks = (blkcnt_t)((size + 511) / 512);
    st->st_blksize = 4096;
    st->st_uid = getuid();
    st->st_gid = getgid();
    st->st_mtim = st->st_ctim = st->st_atim = started;
}

/* A file's attributes: its size, and the source's mode bits and times (as the manifest has them). */
static void fill_file(struct stat *st, const struct lfile *f) {
    fill_plain(st, f->size);
    st->st_mode = S_IFREG | (f->mode & 07777);
    st->st_mtim = from_ns(f->mtime);
    st->st_atim = from_ns(f->atime);
    st->st_ctim = from_ns(f->ctime);
}

static void fill_dir(struct stat *st, const struct ldir *d) {
    memset(st, 0, sizeof *st);
    st->st_mode = S_IFDIR | (d->mode & 07777);
    st->st_nlink = d->nlink;
    st->st_uid = getuid();
    st->st_gid = getgid();
    st->st_mtim = from_ns(d->mtime);
    st->st_atim = from_ns(d->atime);
    st->st_ctim = from_ns(d->ctime);
}

static void *mnt_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    /* readdir fills the kernel's dentries and attributes too (readdirplus, always): a program that
     * lists a directory and then opens its files sends no lookup per file */
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    if (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) {
        conn->want |= FUSE_CAP_NO_OPEN_SUPPORT;
        no_open = getenv("CLAIRVOYANT_MOUNT_OPENS") == NULL;   /* set: every open reaches the daemon */
    }
    __atomic_store_n(&sh->no_open, (uint64_t)no_open, __ATOMIC_RELAXED);
    conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
    /* Read-ahead is background work, and the kernel skips it once this many background requests
     * wait (9 by default): with dozens of readers, a file would arrive a page per READ. As many as
     * the daemon has threads may wait. */
    conn->max_background = 64;
    conn->congestion_threshold = 64;
    cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 3600.0;  /* the listing never changes */
    cfg->kernel_cache = 1;   /* a file's bytes never change either: keep its pages between opens */
    return NULL;
}

static int mnt_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    if (strcmp(path, INFO_NAME) == 0) { fill_plain(st, info_len); return 0; }
    int64_t d, f = find(rel(path), &d);
    if (f >= 0) { fill_file(st, &files[f]); return 0; }
    if (d >= 0) { fill_dir(st, &dirs[d]); return 0; }
    return -ENOENT;
}

static int mnt_access(const char *path, int mask) {
    struct stat st;
    int r = mnt_getattr(path, &st, NULL);
    if (r) return r;
    return (mask & W_OK) ? -EROFS : 0;
}

/* Read the whole source file of ``h`` (file number ``f``) now, serve it from memory and leave a
 * copy in the handoff directory for the mount process. On any failure the handle stays as it was
 * (reads go to the source file) and nothing is handed over. */
static void read_whole(struct handle *h, uint64_t f, uint64_t mtime) {
    char *buf = malloc(h->size ? h->size : 1);
    if (!buf) return;
    ssize_t r = pread_all(h->fd, buf, h->size, 0);
    char extra;
    if (r != (ssize_t)h->size || pread(h->fd, &extra, 1, (off_t)r) != 0) { free(buf); return; }  /* changed size */
    uint64_t got = (uint64_t)r;
    count(&sh->bytes_source, got);
    h->buf = buf;
    h->local = 3;
    close(h->fd);
    h->fd = -1;
    if (!opt.handoff) return;
    char tmp[PATH_MAX], dst[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.%llu.%ld.tmp", opt.handoff, (unsigned long long)f, (long)gettid());
    snprintf(dst, sizeof dst, "%s/%llu", opt.handoff, (unsigned long long)f);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    uint64_t put = 0;
    while (put < got) {
        ssize_t w = write(fd, buf + put, got - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        put += (uint64_t)w;
    }
    int ok = put == got && write(fd, &mtime, sizeof mtime) == (ssize_t)sizeof mtime;   /* little-endian hosts */
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, dst) != 0) unlink(tmp);
}

/* fcntl ``cmd`` (F_GETLK or F_SETLK) on the node-wide lock of the key with ``digest`` (cache/local.py:
 * byte sha1[:4] of the tier's locks file); ``fl`` holds the answer. 0 on success. */
static int key_fcntl(uint64_t digest, int cmd, short type, struct flock *fl) {
    if (locks_fd < 0) return -1;
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = key_lock_offset(digest);
    fl->l_len = 1;
    return fcntl(locks_fd, cmd, fl);
}

/* Whether another process holds that lock, i.e. is copying the file into the tier right now. */
static int being_staged(uint64_t digest) {
    struct flock fl;
    return key_fcntl(digest, F_GETLK, F_WRLCK, &fl) == 0 && fl.l_type != F_UNLCK;
}

/* A file the tier lacks but that the mount process (or a Loader of the node) is staging now: wait
 * for that copy rather than read the shared store a second time. The lock goes with its holder
 * (the kernel lets go of a dead process's locks), so the wait ends when the copy does; a copy
 * that takes longer than STAGING_WAIT_MS gets the read a second time (``first``: counted as a
 * wait_timeout; on a loaded node 2 s was once too short, and the file was read twice). At most
 * STAGING_WAITERS of the daemon's threads wait that long at once (a holder stuck alive must not
 * take every thread, and with them the mount's stats and reads of local files): past that a wait
 * ends after SHORT_WAIT_MS, as it always did. Polled at 1 ms, then 10. */
#define STAGING_WAIT_MS 60000
#define SHORT_WAIT_MS 2000
#define STAGING_WAITERS 16
static int staging_waiters;
static char *wait_for_staging(const struct lfile *f, int *stale, int first) {
    struct timespec t0, t;
    int longer = __atomic_add_fetch(&staging_waiters, 1, __ATOMIC_RELAXED) <= STAGING_WAITERS;
    long most = longer ? STAGING_WAIT_MS : SHORT_WAIT_MS;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0; being_staged(f->digest); i++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= most) {
            if (first) count(&sh->wait_timeouts, 1);
            break;
        }
        usleep(i < 100 ? 1000 : 10000);
    }
    __atomic_sub_fetch(&staging_waiters, 1, __ATOMIC_RELAXED);
    return read_local(f, stale);
}

/* The bytes of file number ``f`` that this daemon read whole from the source and left for the
 * mount process, while they are still there (the stager removes them under the key's lock, then
 * publishes the entry before letting go); -1 if not. When the kernel asks for a file in several
 * READs (it does when its queue of background requests is long), the later ones come from here,
 * not from the source a second time. */
static int open_handoff(uint64_t f) {
    if (!opt.handoff) return -1;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%llu", opt.handoff, (unsigned long long)f);
    return open(p, O_RDONLY | O_CLOEXEC);
}

/* Tell the mount process of a file's first read (its number; EVENT_LOCAL set: served from the
 * tier, else read from the source and handed over): it caches what came from the source, and reads
 * ahead from the order of the opens when no sampler publishes one. 1 if told. */
#define EVENT_LOCAL (1ull << 63)
#define EVENT_ASK (1ull << 62)
static int report(uint64_t ev) {
    if (opt.events_fd < 0) return 0;
    if (write(opt.events_fd, &ev, sizeof ev) == (ssize_t)sizeof ev) return 1;
    count(&sh->events_dropped, 1);
    return 0;
}

/* Take or let go of the key's lock for this daemon (F_SETLK: never waits); 1 if taken. While the
 * daemon reads a file from the source and hands it over, the mount process's staging of that file
 * waits for the lock and then finds the handoff, instead of reading the source again. */
static int key_lock(uint64_t digest, short type) {
    struct flock fl;
    return key_fcntl(digest, F_SETLK, type, &fl) == 0;
}

/* The bytes of file ``f``, whose home is another node, from that node's tier: ask the mount
 * process and wait for its answer (DIR/<f>: the bytes; DIR/<f>.miss: none), up to --ask-wait ms.
 * A descriptor of DIR/<f> (its bytes first), or -1: read the source. */
static int ask_peer(uint64_t f) {
    if (!opt.handoff || opt.events_fd < 0) return -1;
    char miss[PATH_MAX];
    snprintf(miss, sizeof miss, "%s/%llu.miss", opt.handoff, (unsigned long long)f);
    unlink(miss);   /* the mark of an earlier ask that missed: this ask waits for its own answer */
    count(&sh->asks, 1);
    if (!report(f | EVENT_ASK)) return -1;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned pause = 50;; pause = pause < 400 ? pause * 2 : 400) {
        int fd = open_handoff(f);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == files[f].size + 8) return fd;
            close(fd);   /* not this file's bytes: read the source */
            return -1;
        }
        if (access(miss, F_OK) == 0) return -1;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= (long)opt.ask_wait) {
            count(&sh->ask_timeouts, 1);
            return -1;
        }
        usleep(pause);
    }
}

/* Make ``h`` serve the file at ``path``: the info file, the verified entry from the tier, or the
 * source (read whole and handed over when staging runs). ``first``: this is the file's first
 * request (counted as an open, and a source read is reported to the mount process); ``want``: the
 * bytes it asks for from the start (less than the file: later parts will follow). 0 or -errno. */
static int prepare_file(const char *path, struct handle *h, int64_t f, int first, int parts);

static int prepare(const char *path, struct handle *h, int first, uint64_t want) {
    memset(h, 0, sizeof *h);
    h->fd = -1;
    if (strcmp(path, INFO_NAME) == 0) {
        h->buf = info_bytes;   /* not freed at release */
        h->size = info_len;
        h->local = 2;
        if (first) count(&sh->info_opens, 1);
        return 0;
    }
    int64_t d, f = find(rel(path), &d);
    if (f < 0) return d >= 0 ? -EISDIR : -ENOENT;
    h->size = files[f].size;
    h->file = &files[f];
    /* A first READ starts the file afresh: copies kept from an earlier read whole go (the file may
     * have changed since). One that asks for less than the file means later READs will follow:
     * they wait for this one, and a read from the source keeps a copy for them. */
    int parts = first && want < h->size && h->size <= RING_FILE_MAX;
    if (first) ring_drop(f);
    if (parts) reading_set(f, 1);
    int r = prepare_file(path, h, f, first, parts);
    if (parts) reading_set(f, 0);
    return r;
}

static int prepare_file(const char *path, struct handle *h, int64_t f, int first, int parts) {
    if (!first && (h->fd = read_local_part(&files[f], &h->base, &h->pub)) >= 0) {
        h->local = 4;
        return 0;
    }
    if (!first && (h->fd = open_handoff((uint64_t)f)) >= 0) {
        h->local = 5;
        return 0;
    }
    int stale = 0;
    h->buf = read_local(&files[f], &stale);
    int locked = 0;
    if (!h->buf && opt.handoff && first) {   /* staging runs: read the source once, whoever reads it */
        locked = key_lock(files[f].digest, F_WRLCK);
        if (!locked) h->buf = wait_for_staging(&files[f], &stale, 1);   /* the mount process copies it now */
        else if ((h->buf = read_local(&files[f], &stale)) != NULL) {  /* staged just before the lock */
            key_lock(files[f].digest, F_UNLCK);
            locked = 0;
        }
    } else if (!h->buf && opt.handoff) {   /* a later part: its handoff may be in the copy under way */
        h->buf = wait_for_staging(&files[f], &stale, 0);
    }
    if (stale && first) count(&sh->stale, 1);   /* once per open, however often it was looked at */
    if (!h->buf && first && homes && homes[f] != opt.node) {   /* another node's file: ask its home */
        if (locked) {   /* a peer's copy is not staged here: nothing waits on this lock */
            key_lock(files[f].digest, F_UNLCK);
            locked = 0;
        }
        if ((h->fd = ask_peer((uint64_t)f)) >= 0) {
            h->local = 6;
            count(&sh->opens_peer, 1);
            report((uint64_t)f | EVENT_LOCAL);   /* a first read, not from the source: nothing to cache */
            return 0;
        }
    }
    if (h->buf) {
        h->local = 1;
        if (first) {
            count(&sh->opens_local, 1);
            report((uint64_t)f | EVENT_LOCAL);
        }
        return 0;
    }
    h->fd = openat(src_fd, rel(path), O_RDONLY | O_CLOEXEC);
    if (h->fd < 0) {
        int e = errno;
        if (locked) key_lock(files[f].digest, F_UNLCK);
        return -e;
    }
    if (!first) return 0;   /* a later part of a file: straight from the source, nothing handed over */
    count(&sh->opens_source, 1);
    struct stat st;
    uint64_t mtime = 0;
    if (fstat(h->fd, &st) == 0) mtime = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    if (opt.handoff || parts) read_whole(h, (uint64_t)f, mtime);
    if (parts && h->local == 3) ring_put(f, h->buf, h->size);
    if (locked) key_lock(files[f].digest, F_UNLCK);   /* handed over (or not): staging may go on */
    if (opt.events_fd >= 0) {
        if (!report((uint64_t)f) && opt.handoff) {
            /* the mount process will not hear of it (pipe full or closed): take the handoff back */
            char dst[PATH_MAX];
            snprintf(dst, sizeof dst, "%s/%llu", opt.handoff, (unsigned long long)f);
            unlink(dst);
        }
    }
    return 0;
}

static void unprepare(struct handle *h) {
    if (h->fd >= 0) close(h->fd);
    if (h->local == 1 || h->local == 3) free(h->buf);
}

/* Serve ``size`` bytes at ``off`` of the file ``h`` serves: the count, -errno, or ENTRY_MOVED when
 * the entry read in place (4) was evicted or replaced meanwhile (those bytes are not served). */
#define ENTRY_MOVED INT_MIN
static int serve(struct handle *h, char *buf, size_t size, off_t off) {
    if (off < 0 || (uint64_t)off >= h->size) return 0;
    if (size > h->size - (uint64_t)off) size = (size_t)(h->size - (uint64_t)off);
    if (h->buf) {
        memcpy(buf, h->buf + off, size);
        if (h->local == 1) count(&sh->bytes_local, size);   /* a source read whole was counted at open */
        return (int)size;
    }
    ssize_t got = pread_all(h->fd, buf, size, off + (off_t)h->base);
    if (got < 0) return (int)got;
    if (h->local == 4 && !still_published(h->file, h->pub)) return ENTRY_MOVED;   /* evicted while read */
    if (h->local == 6) count(&sh->bytes_peer, (uint64_t)got);
    else if (h->local != 5) count(h->local == 4 ? &sh->bytes_local : &sh->bytes_source, (uint64_t)got);  /* 5: counted whole */
    return (int)got;
}

/* Where the kernel can do without opens (no_open, Linux 3.19 and later), the first open answers
 * ENOSYS: the kernel then sends no OPEN and no RELEASE for any file, only READs, and keeps a
 * file's pages between opens. Each READ is then served on its own (``prepare`` at the request's
 * offset: a file's first page counts as its open). A read-only mount has the kernel refuse
 * writes before they get here; the check below covers a kernel that still asks. */
static int mnt_open(const char *path, struct fuse_file_info *fi) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_CREAT))) return -EROFS;
    if (no_open) return -ENOSYS;
    int info = strcmp(path, INFO_NAME) == 0;
    int64_t d;
    if (!info && find(rel(path), &d) < 0) return d >= 0 ? -EISDIR : -ENOENT;
    struct opened *o = calloc(1, sizeof *o);
    if (!o) return -ENOMEM;
    pthread_mutex_init(&o->mu, NULL);
    if (info) {   /* the info file: served from memory, not counted */
        prepare(path, &o->h, 1, UINT64_MAX);
        o->state = 1;
        fi->direct_io = 1;
    } else {
        count(&sh->opens_seen, 1);
    }
    fi->fh = (uint64_t)(uintptr_t)o;
    fi->keep_cache = 1;
    fi->noflush = 1;   /* read-only: nothing to flush at close, so close sends no request */
    return 0;
}

/* The handle of an OPEN, prepared at its first READ (reads come through it, and it holds it all). */
static int opened_handle(struct opened *o, const char *path, struct handle **h) {
    pthread_mutex_lock(&o->mu);
    o->read = 1;
    if (o->state == 0) {
        int r = prepare(path, &o->h, 1, UINT64_MAX);
        o->state = r ? r : 1;
    }
    int r = o->state < 0 ? o->state : 0;
    pthread_mutex_unlock(&o->mu);
    *h = &o->h;
    return r;
}

static int mnt_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    count(&sh->reads, 1);
    if (fi->fh) {
        struct handle *h;
        int r = opened_handle((struct opened *)(uintptr_t)fi->fh, path, &h);
        return r ? r : serve(h, buf, size, off);
    }
    if (off != 0) {   /* a later part of a file read whole from the source moments ago: from memory */
        int64_t d, f = find(rel(path), &d);
        int r = f >= 0 ? ring_read(f, buf, size, off) : -1;
        if (r >= 0) return r;
    }
    int r = ENTRY_MOVED;
    for (int tries = 0; r == ENTRY_MOVED && tries < 3; tries++) {   /* moved: prepared again, it is not
                                                                  * read in place (not verified here) */
        struct handle h;
        r = prepare(path, &h, off == 0, (uint64_t)off + size);
        if (r) return r;
        r = serve(&h, buf, size, off);
        unprepare(&h);
    }
    return r == ENTRY_MOVED ? -EIO : r;
}

static int mnt_release(const char *path, struct fuse_file_info *fi) {
    struct opened *o = (struct opened *)(uintptr_t)fi->fh;
    if (!o) return 0;
    if (!o->read && path && strcmp(path, INFO_NAME) != 0) {
        int64_t d, f = find(rel(path), &d);
        if (f >= 0 && files[f].size > 0) count(&sh->opens_cached, 1);   /* the kernel had every page */
    }
    if (o->state == 1) unprepare(&o->h);
    pthread_mutex_destroy(&o->mu);
    free(o);
    return 0;
}

static int mnt_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                       struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi;
    enum fuse_fill_dir_flags plus = (flags & FUSE_READDIR_PLUS) ? FUSE_FILL_DIR_PLUS : 0;
    int64_t d;
    if (find(rel(path), &d) >= 0) return -ENOTDIR;
    if (d < 0) return -ENOENT;
    struct stat st;
    fill_dir(&st, &dirs[d]);
    fill(buf, ".", &st, 0, 0);
    fill(buf, "..", &st, 0, 0);
    for (uint64_t k = 0; k < dirs[d].count; k++) {
        const struct lchild *c = &children[dirs[d].first + k];
        if (c->ref & 1) fill_dir(&st, &dirs[c->ref >> 1]); else fill_file(&st, &files[c->ref >> 1]);
        if (fill(buf, strs + c->name, &st, 0, plus)) break;
    }
    return 0;
}

static int mnt_statfs(const char *path, struct statvfs *st) {
    (void)path;
    memset(st, 0, sizeof *st);
    st->f_bsize = st->f_frsize = 4096;
    st->f_blocks = total_bytes / 4096 + 1;
    st->f_files = nfiles + ndirs;
    st->f_namemax = 255;
    st->f_flag = ST_RDONLY;
    return 0;
}


static const struct fuse_operations ops = {
    .init = mnt_init,
    .getattr = mnt_getattr,
    .access = mnt_access,
    .open = mnt_open,
    .read = mnt_read,
    .release = mnt_release,
    .readdir = mnt_readdir,
    .statfs = mnt_statfs,
    CV_READONLY_OPS,
};

/* -- start-up -------------------------------------------------------------------------------- */

static const struct fuse_opt spec[] = {
    OPT("--listing=%s", listing, 0),
    OPT("--index=%s", index, 0),
    OPT("--extents=%s", extents, 0),
    OPT("--stats=%s", stats, 0),
    OPT("--info=%s", info, 0),
    OPT("--events-fd=%d", events_fd, 0),
    OPT("--handoff=%s", handoff, 0),
    OPT("--session=%u", session, 0),
    OPT("--watch-parent", watch_parent, 1),
    OPT("--homes=%s", homes, 0),
    OPT("--node=%u", node, 0),
    OPT("--ask-wait=%u", ask_wait, 0),
    FUSE_OPT_END
};



static int die(const char *what, const char *path) {
    fprintf(stderr, "mountfs: %s %s: %s\n", what, path, strerror(errno));
    return 2;
}

static int load_listing(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) return die("cannot open the listing", path);
    if ((size_t)st.st_size < sizeof(struct listing_head)) { errno = EINVAL; return die("truncated listing", path); }
    const uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return die("cannot map the listing", path);
    const struct listing_head *h = (const void *)m;
    uint64_t need = sizeof *h, part;
    int over = __builtin_mul_overflow(h->nfiles, (uint64_t)sizeof(struct lfile), &part) ||
               __builtin_add_overflow(need, part, &need) ||
               __builtin_mul_overflow(h->ndirs, (uint64_t)sizeof(struct ldir), &part) ||
               __builtin_add_overflow(need, part, &need) ||
               __builtin_mul_overflow(h->nchildren, (uint64_t)sizeof(struct lchild), &part) ||
               __builtin_add_overflow(need, part, &need) || __builtin_add_overflow(need, h->strings, &need);
    if (memcmp(h->magic, LISTING_MAGIC, 8) != 0 || h->version != LISTING_VERSION || over ||
        need != (uint64_t)st.st_size) {
        errno = EINVAL;
        return die("not a listing of this version", path);
    }
    nfiles = h->nfiles, ndirs = h->ndirs;
    files = (const void *)(m + sizeof *h);
    dirs = (const void *)(files + nfiles);
    children = (const void *)(dirs + ndirs);
    strs = (const char *)(children + h->nchildren);
    /* every offset and index inside its section, every string ended within the strings: a damaged
     * listing is refused here rather than read out of bounds later */
    int bad = h->strings == 0 || strs[h->strings - 1] != 0 || ndirs == 0;
    for (uint64_t i = 0; !bad && i < nfiles; i++) bad = files[i].path >= h->strings;
    for (uint64_t i = 0; !bad && i < ndirs; i++)
        bad = dirs[i].path >= h->strings || dirs[i].first > h->nchildren || dirs[i].count > h->nchildren - dirs[i].first;
    for (uint64_t i = 0; !bad && i < h->nchildren; i++)
        bad = children[i].name >= h->strings || (children[i].ref >> 1) >= ((children[i].ref & 1) ? ndirs : nfiles);
    if (bad) {
        errno = EINVAL;
        return die("a damaged listing (an offset or index outside its section)", path);
    }
    for (uint64_t i = 0; i < nfiles; i++) total_bytes += files[i].size;
    checked = calloc(nfiles ? nfiles : 1, 1);
    reading = calloc(nfiles ? nfiles : 1, 1);
    if (ring_init() != 0) return die("cannot set up the daemon's memory of files read whole for", path);
    verified = calloc(nfiles ? nfiles : 1, sizeof *verified);
    return checked && reading && verified ? 0 : die("out of memory for", path);
}

static int load_homes(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) return die("cannot open the homes", path);
    if ((uint64_t)st.st_size != nfiles * sizeof(uint32_t)) {
        close(fd);
        errno = EINVAL;
        return die("homes of another listing (not 4 bytes per file)", path);
    }
    if (nfiles == 0) { close(fd); return 0; }
    const void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return die("cannot map the homes", path);
    homes = m;
    return 0;
}

static int load_info(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return die("cannot open the info file", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    info_bytes = malloc(n > 0 ? (size_t)n : 1);
    info_len = info_bytes ? fread(info_bytes, 1, (size_t)(n > 0 ? n : 0), f) : 0;
    fclose(f);
    return info_bytes ? 0 : 2;
}

static int map_stats(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof *sh) < 0) return die("cannot create the stats file", path);
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (sh == MAP_FAILED) return die("cannot map the stats file", path);
    sh->version = STATS_VERSION;
    sh->size = sizeof *sh;
    sh->pid = (uint64_t)getpid();
    sh->no_open = 1;   /* until the kernel's answer (mnt_init): opens are not claimed to be counted */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(sh->magic, STATS_MAGIC, sizeof sh->magic);  /* last: a reader sees the whole header */
    return 0;
}

int main(int argc, char *argv[]) {
    CV_LOAD_LIBFUSE_OR_RETURN("mountfs", argc, argv);
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    if (fuse_opt_parse(&args, &opt, spec, cv_take_source) < 0) return 2;
    opt.source = cv_source;
    if (!opt.source || !opt.listing || !opt.index || !opt.extents || !opt.stats || !opt.info) {
        fprintf(stderr, "usage: mountfs -f --listing=FILE --index=FILE --extents=DIR --stats=FILE --info=FILE "
                        "[--events-fd=N] [--handoff=DIR] [--watch-parent] [fuse options] SOURCE MOUNTPOINT\n");
        return 2;
    }
    clock_gettime(CLOCK_REALTIME, &started);
    src_fd = open(opt.source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (src_fd < 0) return die("cannot open the source directory", opt.source);
    tindex.fd = open(opt.index, O_RDONLY | O_CLOEXEC);
    if (tindex.fd < 0) return die("cannot open the index", opt.index);
    {
        char locks[PATH_MAX];
        snprintf(locks, sizeof locks, "%s", opt.index);
        char *slash = strrchr(locks, '/');
        if (slash) {
            snprintf(slash + 1, sizeof locks - (size_t)(slash + 1 - locks), "locks");
            locks_fd = open(locks, O_RDWR | O_CLOEXEC);   /* absent: no waiting, reads go to the source */
        }
    }
    tier_index_remap(&tindex);
    int rc = load_listing(opt.listing);
    if (!rc && opt.homes) rc = load_homes(opt.homes);
    if (!rc) rc = load_info(opt.info);
    if (!rc) rc = map_stats(opt.stats);
    if (rc) return rc;
    if (opt.events_fd >= 0) {
        int fl = fcntl(opt.events_fd, F_GETFL);
        fcntl(opt.events_fd, F_SETFL, fl | O_NONBLOCK);
        fcntl(opt.events_fd, F_SETFD, FD_CLOEXEC);
    }
    cv_parent = getppid();
    if (opt.watch_parent) {
        pthread_t t;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        if (pthread_create(&t, NULL, cv_watch_parent, NULL) == 0) pthread_detach(t);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    char o[128];
#if FUSE_MAJOR_VERSION > 3 || (FUSE_MAJOR_VERSION == 3 && FUSE_MINOR_VERSION >= 12)
    snprintf(o, sizeof o, "-omax_threads=64,max_idle_threads=64");
    fuse_opt_add_arg(&args, o);
#endif
    snprintf(o, sizeof o, "-ofsname=clairvoyant,subtype=clairvoyant,ro,default_permissions");
    fuse_opt_add_arg(&args, o);
    rc = fuse_main(args.argc, args.argv, &ops, NULL);
    fuse_opt_free_args(&args);
    return rc;
}
