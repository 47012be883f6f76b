/*
 * emufs: a read-only FUSE view of a directory that behaves like a busy shared file system.
 *
 * The kernel-path twin of clairvoyant.testing.EmulatedStore: any program (clairvoyant's Loader
 * given a plain path, PyTorch's DataLoader, cat) reads through the kernel, the FUSE daemon and
 * the page cache, as it would read from a real parallel file system client.
 *
 *   emufs -f [--open-latency=S] [--read-latency=S] [--bandwidth=B/s] [--max-inflight=N]
 *         --counters=FILE [--watch-parent] [fuse options] SOURCE MOUNTPOINT
 *
 * The model, per request the kernel sends (clairvoyant.testing.fusestore says the same):
 *   - at most --max-inflight opens, reads and listings are in service at once (a counting
 *     semaphore; the others wait for a slot, as at a busy metadata or object server);
 *   - an open or a listing (readdir) holds its slot for --open-latency seconds;
 *   - a read of n bytes holds its slot until max(start + read latency, pipe free) + n / bandwidth:
 *     one shared pipe, each read queued after the bytes of the reads before it;
 *   - getattr, lookup and release are free (counted: getattrs).
 * Every open starts with a cold page cache: keep_cache is never set, so the kernel drops the
 * file's cached pages at each open, like a shared store far larger than the client's RAM. Within
 * one open the page cache and the kernel's readahead work as usual.
 *
 * Counters live in FILE, a fixed little-endian struct (struct emufs_shared below), mmap'd
 * shared, so that a reader maps it and reads or zeroes the counters without talking to us.
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
#include <dirent.h>
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

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "emufs: the counters file is little-endian; big-endian hosts are not supported"
#endif

#define EMUFS_MAGIC "CVEMUFS"  /* 7 characters and a NUL: 8 bytes */
#define EMUFS_VERSION 1
#define EMUFS_MAX_INFLIGHT 4096

/* The counters file. Python's reader (fusestore.py, _LAYOUT) must match it field for field. */
struct emufs_shared {
    char magic[8];
    uint32_t version;
    uint32_t size;          /* sizeof(struct emufs_shared) */
    uint64_t opens;         /* file opens served */
    uint64_t reads;         /* read requests served */
    uint64_t bytes;         /* bytes returned by reads */
    uint64_t listings;      /* readdir calls */
    uint64_t getattrs;      /* getattr calls */
    uint64_t peak_inflight; /* most requests in service at once since the last reset */
    uint64_t inflight;      /* requests in service now */
};
_Static_assert(sizeof(struct emufs_shared) == 72, "emufs_shared layout");

static struct {
    double open_latency, read_latency, bandwidth;
    int max_inflight, watch_parent;
    char *counters, *source;
} opt = {0.010, 0.002, 400e6, 64, 0, NULL, NULL};

static int src_fd = -1;        /* the source directory: every path is resolved under it */
static struct emufs_shared *sh;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slot_free = PTHREAD_COND_INITIALIZER;
static int inflight;
static double pipe_free;       /* when the shared pipe has sent every byte queued so far */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static void count(uint64_t *field, uint64_t n) { __atomic_fetch_add(field, n, __ATOMIC_RELAXED); }

/* Take one of max_inflight slots; return the time service starts. */
static double slot_take(void) {
    pthread_mutex_lock(&mu);
    while (inflight >= opt.max_inflight) pthread_cond_wait(&slot_free, &mu);
    inflight++;
    /* a reader may have zeroed the peak meanwhile: it restarts from the requests in service */
    if ((uint64_t)inflight > __atomic_load_n(&sh->peak_inflight, __ATOMIC_RELAXED))
        __atomic_store_n(&sh->peak_inflight, (uint64_t)inflight, __ATOMIC_RELAXED);
    __atomic_store_n(&sh->inflight, (uint64_t)inflight, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&mu);
    return now();
}

static void slot_give(double until) {
    sleep_until(until);
    pthread_mutex_lock(&mu);
    inflight--;
    __atomic_store_n(&sh->inflight, (uint64_t)inflight, __ATOMIC_RELAXED);
    pthread_cond_signal(&slot_free);
    pthread_mutex_unlock(&mu);
}

/* "/a/b" -> "a/b", "/" -> ".": relative to src_fd */
static const char *rel(const char *path) {
    while (*path == '/') path++;
    return *path ? path : ".";
}

static void *emu_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    cfg->kernel_cache = 0;  /* no keep_cache: each open starts cold (see the top of the file) */
    cfg->auto_cache = 0;
    cfg->direct_io = 0;     /* reads go through the page cache and readahead, as usual */
    cfg->use_ino = 0;
    /* Readahead reads are background requests, capped by the kernel at max_background (12 by
       default): raise the cap so that --max-inflight, not the kernel, bounds reads in service. */
    if ((unsigned)opt.max_inflight > conn->max_background) {
        conn->max_background = (unsigned)opt.max_inflight;
        conn->congestion_threshold = (unsigned)opt.max_inflight * 3 / 4;
    }
    return NULL;
}

static int emu_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    count(&sh->getattrs, 1);
    int r = fi ? fstat((int)fi->fh, st) : fstatat(src_fd, rel(path), st, AT_SYMLINK_NOFOLLOW);
    return r < 0 ? -errno : 0;
}

static int emu_readlink(const char *path, char *buf, size_t size) {
    ssize_t n = readlinkat(src_fd, rel(path), buf, size - 1);
    if (n < 0) return -errno;
    buf[n] = '\0';
    return 0;
}

static int emu_access(const char *path, int mask) {
    if (mask & W_OK) return -EROFS;
    return faccessat(src_fd, rel(path), mask, 0) < 0 ? -errno : 0;
}

static int emu_open(const char *path, struct fuse_file_info *fi) {
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_CREAT))) return -EROFS;
    double t0 = slot_take();
    int fd = openat(src_fd, rel(path), O_RDONLY | O_CLOEXEC);
    int err = fd < 0 ? errno : 0;
    count(&sh->opens, 1);
    slot_give(t0 + opt.open_latency);
    if (fd < 0) return -err;
    fi->fh = (uint64_t)fd;
    fi->keep_cache = 0;     /* the default, stated: the kernel drops this file's cached pages now */
    return 0;
}

static int emu_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    double t0 = slot_take();
    size_t got = 0;
    int err = 0;
    while (got < size) {
        ssize_t n = pread((int)fi->fh, buf + got, size - got, off + (off_t)got);
        if (n < 0) { if (errno == EINTR) continue; err = errno; break; }
        if (n == 0) break;
        got += (size_t)n;
    }
    pthread_mutex_lock(&mu);
    double start = t0 + opt.read_latency;
    if (got) {
        if (pipe_free > start) start = pipe_free;
        start += (double)got / opt.bandwidth;
        pipe_free = start;
    }
    pthread_mutex_unlock(&mu);
    count(&sh->reads, 1);
    count(&sh->bytes, got);
    slot_give(start);
    return err && !got ? -err : (int)got;
}

static int emu_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int emu_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                       struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    double t0 = slot_take();
    count(&sh->listings, 1);
    int err = 0;
    int fd = openat(src_fd, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        err = errno;
        if (fd >= 0) close(fd);
    } else {
        struct dirent *e;
        /* offset 0 for every entry: libfuse keeps the whole listing, one call per opendir */
        while ((e = readdir(d)) != NULL) {
            struct stat st;
            memset(&st, 0, sizeof st);
            st.st_ino = e->d_ino;
            st.st_mode = (mode_t)DTTOIF(e->d_type);
            if (fill(buf, e->d_name, &st, 0, 0)) break;
        }
        closedir(d);
    }
    slot_give(t0 + opt.open_latency);
    return -err;
}

static int emu_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return fstatvfs(src_fd, st) < 0 ? -errno : 0;
}

static const struct fuse_operations ops = {
    .init = emu_init,
    .getattr = emu_getattr,
    .readlink = emu_readlink,
    .access = emu_access,
    .open = emu_open,
    .read = emu_read,
    .release = emu_release,
    .readdir = emu_readdir,
    .statfs = emu_statfs,
    CV_READONLY_OPS,
};

static const struct fuse_opt spec[] = {
    OPT("--open-latency=%lf", open_latency, 0),
    OPT("--read-latency=%lf", read_latency, 0),
    OPT("--bandwidth=%lf", bandwidth, 0),
    OPT("--max-inflight=%d", max_inflight, 0),
    OPT("--counters=%s", counters, 0),
    OPT("--watch-parent", watch_parent, 1),
    FUSE_OPT_END
};


static int map_counters(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof *sh) < 0) goto fail;
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) goto fail;
    close(fd);
    sh->version = EMUFS_VERSION;
    sh->size = sizeof *sh;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(sh->magic, EMUFS_MAGIC, sizeof sh->magic);  /* last: a reader sees the whole header */
    return 0;
fail:
    fprintf(stderr, "emufs: cannot create the counters file %s: %s\n", path, strerror(errno));
    return -1;
}

int main(int argc, char *argv[]) {
    CV_LOAD_LIBFUSE_OR_RETURN("emufs", argc, argv);
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    if (fuse_opt_parse(&args, &opt, spec, cv_take_source) < 0) return 2;
    opt.source = cv_source;
    if (!opt.source || !opt.counters) {
        fprintf(stderr, "usage: emufs -f [--open-latency=S] [--read-latency=S] [--bandwidth=B/s] "
                        "[--max-inflight=N] --counters=FILE [--watch-parent] [fuse options] SOURCE MOUNTPOINT\n");
        return 2;
    }
    if (opt.open_latency < 0 || opt.read_latency < 0 || !(opt.bandwidth > 0) ||
        opt.max_inflight < 1 || opt.max_inflight > EMUFS_MAX_INFLIGHT) {
        fprintf(stderr, "emufs: latencies must be >= 0, bandwidth > 0 and max-inflight in [1, %d]\n",
                EMUFS_MAX_INFLIGHT);
        return 2;
    }
    src_fd = open(opt.source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (src_fd < 0) {
        fprintf(stderr, "emufs: cannot open the source directory %s: %s\n", opt.source, strerror(errno));
        return 2;
    }
    if (map_counters(opt.counters) < 0) return 2;
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
    /* worker threads: one per slot and a few for getattr and lookup while every slot is busy
       (libfuse >= 3.12 caps them at 10 by default) */
#if FUSE_MAJOR_VERSION > 3 || (FUSE_MAJOR_VERSION == 3 && FUSE_MINOR_VERSION >= 12)
    snprintf(o, sizeof o, "-omax_threads=%d,max_idle_threads=%d", opt.max_inflight + 8, opt.max_inflight + 8);
    fuse_opt_add_arg(&args, o);
#endif
    snprintf(o, sizeof o, "-ofsname=emufs,subtype=emufs");
    fuse_opt_add_arg(&args, o);
    int rc = fuse_main(args.argc, args.argv, &ops, NULL);
    fuse_opt_free_args(&args);
    return rc;
}
