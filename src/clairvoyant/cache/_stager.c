/* MECHANISM: copying files of a directory into places of the local tier's extents, on native
 * threads that never take the GIL (stage/native_files.py drives it).
 *
 * Python reserves each entry's place (ledger bytes, an extent and an offset) and publishes it in
 * the tier's index once written; this engine does what lies between, per file:
 *   1. take the node-wide lock of the file's key (a byte-range lock of the tier's locks file; the
 *      mount daemon waits on it instead of reading the source a second time), then look the key
 *      up in the tier's index (given its digest): an entry of this session published meanwhile
 *      by another process of the node (a job beside this one) ends the job with EEXIST, the
 *      source unread;
 *   2. take the bytes from the handoff directory if a reader's open already read them from the
 *      source (``<token>``: the bytes, then the source's mtime in ns), else read the source file
 *      (openat, fstat, read, close) and check its size is the listed one, or, for a sample packed
 *      in a file with others (a tar shard), pread its bytes at their offset;
 *   3. write the entry (the bytes, then the 32-byte trailer of tier_format.h, the format
 *      cache/entry.py reads) at its place with one pwrite.
 * The lock stays held: Python lets go once the entry is published (or given up).
 *
 * One Python-level staging call per file costs a dozen GIL hand-offs among dozens of threads
 * (docs/benchmarks.md: about 250 us of CPU per file on 2 cores); here it is one submit and a
 * share of one collect.
 *
 *   Stager(src_dir, lock_fd, handoff_dir or None, threads[, index, session])
 *              up to ``threads`` threads, started as jobs wait for them (one at once): an engine
 *              given few files (a tar shard's pass, where whole reads take most) starts few
 *   .limit(n)  at most n of the threads carry a job at once from now on (the choice of requests in
 *              flight: tune/inflight.py); all of them at the start
 *   .load() -> (jobs done, seconds they took in all, jobs running now, jobs queued now)
 *   .submit_many([(token, path, size, out_fd, offset, lock_offset[, src_offset, src_mtime, digest]), ...])
 *              src_offset: the sample is ``size`` bytes at this offset of the file (a tar shard's
 *              member), whose mtime must still be src_mtime (-1: not checked); -1 or none: the
 *              whole file, whose size must be ``size``
 *   .collect(timeout) -> [(token, errno or 0, mtime_ns, handed_over, locked)]
 *   .close()   jobs not started come back from collect with ECANCELED; threads joined
 */
#define _GNU_SOURCE   /* pthread_setname_np */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define XXH_INLINE_ALL
#include "tier_format.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define THREAD_NAME "cv-native-stage"   /* at most 15 characters */
#define MAX_PACKS 1024   /* files that pack samples (tar shards) kept open per stager */

struct job {
    struct job *next;
    long long token;
    char *path;
    uint64_t size;
    int out_fd;
    int64_t offset, lock_offset;
    int64_t src_offset;   /* where the bytes lie in the source file; -1: the whole file is the sample */
    int64_t src_mtime;    /* the packing file's mtime when it was indexed (-1: not checked) */
    uint64_t digest;      /* the key's index digest (0: not looked up before the read) */
    int err, handed, locked;
    int64_t mtime;
};

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct job *queue, *queue_tail, *finished, *finished_tail;
    int src_fd, lock_fd, handoff_fd;
    struct tier_index index;           /* the tier's index: an entry there already is not read again */
    uint32_t session;                  /* the tier's session: an entry stamped with it is current */
    int nthreads, most, idle;          /* threads started, at most, and carrying no job now */
    int stopping, drained;             /* drained: stopped, and every job is on the finished list */
    int active, running;               /* jobs carried at once at most (limit), and now */
    long long queued, ndone;           /* jobs waiting for a thread now; finished so far */
    double busy;                       /* seconds the finished jobs took, in all */
    pthread_mutex_t packs_mu;          /* files that pack samples, opened once each: an open of a */
    pthread_cond_t packs_cv;           /* (an open under way: its waiters) */
    char *pack_path[MAX_PACKS];        /* shared file system costs a round trip, and a fresh open */
    int pack_fd[MAX_PACKS], npacks;    /* drops the kernel's pages of the file */
    int max_packs;                     /* kept open at most: MAX_PACKS, or a quarter of RLIMIT_NOFILE */
    pthread_t threads[MAX_THREADS];
} Stager;

static void push(struct job **head, struct job **tail, struct job *j) {
    j->next = NULL;
    if (*tail) (*tail)->next = j; else *head = j;
    *tail = j;
}

static int lock_key(int fd, int64_t at) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)at;
    fl.l_len = 1;
    for (;;) {
        if (fcntl(fd, F_SETLKW, &fl) == 0) return 0;
        if (errno == EINTR) continue;
        /* POSIX locks belong to processes: two processes whose threads wait on each other's locks
         * look like a deadlock to the kernel although no thread waits holding one */
        if (errno == EDEADLK) { usleep(1000); continue; }
        return errno;
    }
}

/* Read exactly ``n`` bytes from ``fd`` into ``buf``: 0, or an errno (ESTALE: the file ended first). */
static int read_exact(int fd, char *buf, uint64_t n) {
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0) { if (errno == EINTR) continue; return errno; }
        if (r == 0) return ESTALE;
        got += (uint64_t)r;
    }
    return 0;
}

/* The bytes a reader's open handed over, if any (always removed once looked at). */
static int from_handoff(Stager *s, struct job *j, char *buf) {
    if (s->handoff_fd < 0) return 0;
    char name[32];
    snprintf(name, sizeof name, "%lld", j->token);
    int fd = openat(s->handoff_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == j->size + 8 &&
             read_exact(fd, buf, j->size) == 0 && read_exact(fd, (char *)&j->mtime, 8) == 0;
    close(fd);
    unlinkat(s->handoff_fd, name, 0);
    return ok;
}

/* Read exactly ``n`` bytes at ``at`` of ``fd``: 0, or an errno (ESTALE: the file ended first). */
static int pread_exact(int fd, char *buf, uint64_t n, int64_t at) {
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(at + (int64_t)got));
        if (r < 0) { if (errno == EINTR) continue; return errno; }
        if (r == 0) return ESTALE;
        got += (uint64_t)r;
    }
    return 0;
}

/* A file that packs samples, opened once per stager (kept: *kept set, not to be closed by the
 * caller); -1 with errno set. The first thread to want a file opens it while the others wait for
 * that open (fd -2 meanwhile), so that each file is opened once; a failed open (-1) is tried
 * again in its slot by the next job that wants the file. Past ``max_packs`` files (a share of the
 * process's descriptors), each job opens its own. */
static int pack_open(Stager *s, const char *path, int *kept) {
    *kept = 0;
    pthread_mutex_lock(&s->packs_mu);
    int slot = -1;
    for (;;) {
        int i = 0;
        while (i < s->npacks && strcmp(s->pack_path[i], path) != 0) i++;
        if (i == s->npacks) break;
        if (s->pack_fd[i] >= 0) { *kept = 1; int fd = s->pack_fd[i]; pthread_mutex_unlock(&s->packs_mu); return fd; }
        if (s->pack_fd[i] == -1) { slot = i; s->pack_fd[i] = -2; break; }   /* failed before: this job tries */
        pthread_cond_wait(&s->packs_cv, &s->packs_mu);
    }
    if (slot < 0 && s->npacks < s->max_packs) {
        char *p = strdup(path);
        if (p) { slot = s->npacks++; s->pack_path[slot] = p; s->pack_fd[slot] = -2; }
    }
    pthread_mutex_unlock(&s->packs_mu);
    int fd = openat(s->src_fd, path, O_RDONLY | O_CLOEXEC);
    int err = errno;
    /* samples are read at random: the kernel's read-ahead would fill the store's pipe with bytes
     * needed later, ahead of those needed now */
    if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    if (slot >= 0) {
        pthread_mutex_lock(&s->packs_mu);
        s->pack_fd[slot] = fd < 0 ? -1 : fd;
        pthread_cond_broadcast(&s->packs_cv);
        pthread_mutex_unlock(&s->packs_mu);
        *kept = fd >= 0;
    }
    errno = err;
    return fd;
}

static void close_packs(Stager *s) {
    pthread_mutex_lock(&s->packs_mu);
    for (int i = 0; i < s->npacks; i++) { if (s->pack_fd[i] >= 0) close(s->pack_fd[i]); free(s->pack_path[i]); }
    s->npacks = 0;
    pthread_mutex_unlock(&s->packs_mu);
}

/* The sample's bytes from the source: the whole file (its size the listed one), or ``size`` bytes
 * at ``src_offset`` of a file that packs samples (a tar shard: the file must still hold them). */
static int from_source(Stager *s, struct job *j, char *buf) {
    int kept = 0;
    int fd = j->src_offset < 0 ? openat(s->src_fd, j->path, O_RDONLY | O_CLOEXEC) : pack_open(s, j->path, &kept);
    if (fd < 0) return errno;
    struct stat st;
    int err = fstat(fd, &st) < 0 ? errno : 0;
    if (j->src_offset < 0) {
        if (!err && (uint64_t)st.st_size != j->size) err = ESTALE;   /* changed since it was listed */
        if (!err) err = read_exact(fd, buf, j->size);
    } else {   /* the file as it was indexed (its mtime), still holding the sample's bytes */
        int64_t now = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        if (!err && ((uint64_t)st.st_size < (uint64_t)j->src_offset + j->size ||
                     (j->src_mtime >= 0 && now != j->src_mtime))) err = ESTALE;
        if (!err) err = pread_exact(fd, buf, j->size, j->src_offset);
    }
    if (!kept) close(fd);
    if (!err) j->mtime = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    return err;
}

static void run(Stager *s, struct job *j) {
    int err = lock_key(s->lock_fd, j->lock_offset);
    if (err) { j->err = err; return; }
    j->locked = 1;
    if (j->digest && s->index.fd >= 0) {   /* another process of the node published it meanwhile (a job
                                            * beside this one): its entry is there, the source is not read */
        uint32_t extent, length, stamp, seq;
        uint64_t offset;
        if (tier_index_lookup(&s->index, j->digest, &extent, &offset, &length, &stamp, &seq) &&
            length == j->size + TRAILER && stamp == s->session) {
            j->err = EEXIST;
            return;
        }
    }
    uint64_t n = j->size + TRAILER;
    char *buf = malloc(n ? n : 1);
    if (!buf) { j->err = ENOMEM; return; }
    j->handed = from_handoff(s, j, buf);
    if (!j->handed) err = from_source(s, j, buf);
    if (!err) {
        seal_trailer(buf + j->size, buf, j->size, j->mtime);
        uint64_t put = 0;
        while (put < n) {
            ssize_t w = pwrite(j->out_fd, buf + put, n - put, (off_t)(j->offset + (int64_t)put));
            if (w < 0) { if (errno == EINTR) continue; err = errno; break; }
            if (w == 0) { err = EIO; break; }
            put += (uint64_t)w;
        }
    }
    free(buf);
    j->err = err;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
    Stager *s = arg;
#ifdef __linux__
    pthread_setname_np(pthread_self(), THREAD_NAME);   /* (top -H, py-spy, the tests count them) */
#endif
    pthread_mutex_lock(&s->mu);
    for (;;) {   /* (counted idle by whoever started it, until it takes a job) */
        while ((!s->queue || s->running >= s->active) && !s->stopping) pthread_cond_wait(&s->work, &s->mu);
        if (s->stopping) break;   /* jobs not started are cancelled by close */
        struct job *j = s->queue;
        s->queue = j->next;
        if (!s->queue) s->queue_tail = NULL;
        s->queued--;
        s->running++;
        s->idle--;
        pthread_mutex_unlock(&s->mu);
        double t0 = now_s();
        run(s, j);
        double took = now_s() - t0;
        pthread_mutex_lock(&s->mu);
        s->running--;
        s->idle++;
        s->ndone++;
        s->busy += took;
        if (s->queue) pthread_cond_signal(&s->work);   /* a thread held back by the limit may go now */
        push(&s->finished, &s->finished_tail, j);
        pthread_cond_signal(&s->done);
    }
    s->idle--;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* With ``mu`` held: start threads while more jobs wait than idle threads will take, up to the
 * limit and the most. A thread that cannot start ends it: those running carry the queue. */
static void grow(Stager *s) {
    int cap = s->active < s->most ? s->active : s->most;
    while (!s->stopping && s->nthreads < cap && s->queued > s->idle) {
        if (pthread_create(&s->threads[s->nthreads], NULL, worker, s) != 0) return;
        s->nthreads++;
        s->idle++;
    }
}

static void free_list(struct job *j) {
    while (j) { struct job *n = j->next; free(j->path); free(j); j = n; }
}

/* Stop the threads; jobs not started move to the finished list as ECANCELED. A second caller
 * (close from another thread, then dealloc) waits until the first has done it. */
static void stop(Stager *s) {
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        while (!s->drained) pthread_cond_wait(&s->done, &s->mu);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->stopping = 1;
    pthread_cond_broadcast(&s->work);
    int n = s->nthreads;   /* (none starts once stopping) */
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) pthread_join(s->threads[i], NULL);
    pthread_mutex_lock(&s->mu);
    s->nthreads = 0;
    while (s->queue) {
        struct job *j = s->queue;
        s->queue = j->next;
        j->err = ECANCELED;
        push(&s->finished, &s->finished_tail, j);
    }
    s->queue_tail = NULL;
    s->queued = 0;
    s->drained = 1;
    pthread_cond_broadcast(&s->done);
    pthread_mutex_unlock(&s->mu);
}

/* A directory's descriptor from a path object (str, bytes or os.PathLike); -1 with OSError set. */
static int open_dir(PyObject *path) {
    PyObject *b;
    if (!PyUnicode_FSConverter(path, &b)) return -1;
    int fd = open(PyBytes_AS_STRING(b), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, b);
    Py_DECREF(b);
    return fd;
}

static int Stager_init(Stager *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"src_dir", "lock_fd", "handoff_dir", "threads", "index", "session", NULL};
    PyObject *src, *handoff, *index = Py_None;
    int lock_fd, threads;
    unsigned int session = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiOi|OI", names, &src, &lock_fd, &handoff, &threads, &index,
                                     &session))
        return -1;
    if (s->nthreads || s->stopping) { PyErr_SetString(PyExc_RuntimeError, "Stager already started"); return -1; }
    if ((s->src_fd = open_dir(src)) < 0) return -1;
    if (handoff != Py_None && (s->handoff_fd = open_dir(handoff)) < 0) return -1;   /* src_fd: dealloc */
    s->lock_fd = lock_fd;
    if (index != Py_None) {   /* absent or unreadable: every job reads its source (publish checks again) */
        PyObject *b;
        if (!PyUnicode_FSConverter(index, &b)) return -1;
        s->index.fd = open(PyBytes_AS_STRING(b), O_RDONLY | O_CLOEXEC);
        Py_DECREF(b);
    }
    s->session = session;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    s->active = s->most = threads;
    struct rlimit rl;   /* the process's descriptors: this engine keeps at most a quarter open */
    s->max_packs = MAX_PACKS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < MAX_PACKS)
        s->max_packs = (int)(rl.rlim_cur / 4);
    if (pthread_create(&s->threads[0], NULL, worker, s) != 0) {   /* one at once: queued jobs always have one */
        PyErr_SetString(PyExc_OSError, "cannot start a staging thread");
        return -1;
    }
    s->nthreads = s->idle = 1;
    return 0;
}

static PyObject *Stager_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    (void)args; (void)kw;
    Stager *s = (Stager *)type->tp_alloc(type, 0);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->packs_mu, NULL);
    pthread_cond_init(&s->packs_cv, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    s->src_fd = s->lock_fd = s->handoff_fd = -1;
    s->index.fd = -1;
    pthread_rwlock_init(&s->index.lock, NULL);
    return (PyObject *)s;
}

/* A job from its tuple (token, path, size, out_fd, offset, lock_offset[, src_offset, src_mtime, digest]),
 * parsed with ``fmt``; NULL with the Python error set. */
static struct job *parse_job(PyObject *t, const char *fmt) {
    long long token, offset, lock_offset, src_offset = -1, src_mtime = -1;
    PyObject *path;
    unsigned long long size, digest = 0;
    int out_fd;
    if (!PyArg_ParseTuple(t, fmt, &token, PyUnicode_FSConverter, &path, &size, &out_fd, &offset, &lock_offset,
                          &src_offset, &src_mtime, &digest))
        return NULL;
    struct job *j = calloc(1, sizeof *j);
    char *p = j ? strdup(PyBytes_AS_STRING(path)) : NULL;
    Py_DECREF(path);
    if (!p) { free(j); PyErr_NoMemory(); return NULL; }
    j->token = token;
    j->path = p;
    j->size = size;
    j->out_fd = out_fd;
    j->offset = offset;
    j->lock_offset = lock_offset;
    j->src_offset = src_offset;
    j->src_mtime = src_mtime;
    j->digest = digest;
    return j;
}

/* Queue the list head..tail of ``n`` jobs and wake a thread per job; the list is freed and a
 * RuntimeError set if the stager is closed. */
static PyObject *enqueue(Stager *s, struct job *head, struct job *tail, Py_ssize_t n) {
    pthread_mutex_lock(&s->mu);
    int open_ = s->nthreads > 0 && !s->stopping;
    Py_ssize_t wake = 0;
    if (open_) {
        if (s->queue_tail) s->queue_tail->next = head; else s->queue = head;
        s->queue_tail = tail;
        s->queued += n;
        grow(s);
        wake = s->active - s->running;   /* the threads that may take a job now, at most one per job */
        if (wake > n) wake = n;
    }
    pthread_mutex_unlock(&s->mu);
    for (Py_ssize_t k = 0; k < wake; k++) pthread_cond_signal(&s->work);   /* (woken threads find the lock free) */
    if (!open_) {
        free_list(head);
        PyErr_SetString(PyExc_RuntimeError, "the stager is closed");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* submit_many([(token, path, size, out_fd, offset, lock_offset), ...]): the jobs queued under one
 * lock and the threads woken once (one call, not one GIL hand-off per file). All or none: on a
 * bad item or a closed stager nothing is queued. */
static PyObject *Stager_submit_many(Stager *s, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "submit_many takes a sequence of job tuples");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    struct job *head = NULL, *tail = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        struct job *j = parse_job(PySequence_Fast_GET_ITEM(seq, k),
                                  "LO&KiLL|LLK;a job is (token, path, size, out_fd, offset, lock_offset[, src_offset, src_mtime, digest])");
        if (!j) {
            Py_DECREF(seq);
            free_list(head);
            return NULL;
        }
        push(&head, &tail, j);
    }
    Py_DECREF(seq);
    if (!head) Py_RETURN_NONE;
    return enqueue(s, head, tail, n);
}

static PyObject *Stager_collect(Stager *s, PyObject *args) {
    double timeout;
    if (!PyArg_ParseTuple(args, "d", &timeout)) return NULL;
    struct job *got;
    Py_BEGIN_ALLOW_THREADS
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = (long long)(timeout * 1e9) + until.tv_nsec;
    until.tv_sec += ns / 1000000000LL;
    until.tv_nsec = ns % 1000000000LL;
    pthread_mutex_lock(&s->mu);
    while (!s->finished && !s->drained)
        if (pthread_cond_timedwait(&s->done, &s->mu, &until) == ETIMEDOUT) break;
    got = s->finished;
    s->finished = s->finished_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(0);
    for (struct job *j = got; j && out; j = j->next) {
        PyObject *t = Py_BuildValue("(LiLii)", j->token, j->err, (long long)j->mtime, j->handed, j->locked);
        if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
        Py_XDECREF(t);
    }
    free_list(got);
    return out;
}

static PyObject *Stager_limit(Stager *s, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    pthread_mutex_lock(&s->mu);
    s->active = n < 1 ? 1 : n;
    grow(s);
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    Py_RETURN_NONE;
}

static PyObject *Stager_load(Stager *s, PyObject *unused) {
    (void)unused;
    pthread_mutex_lock(&s->mu);
    long long done = s->ndone, queued = s->queued;
    double busy = s->busy;
    int running = s->running;
    pthread_mutex_unlock(&s->mu);
    return Py_BuildValue("(LdiL)", done, busy, running, queued);
}

static PyObject *Stager_close(Stager *s, PyObject *unused) {
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    stop(s);
    Py_END_ALLOW_THREADS
    close_packs(s);
    if (s->src_fd >= 0) close(s->src_fd);
    if (s->handoff_fd >= 0) close(s->handoff_fd);
    s->src_fd = s->handoff_fd = -1;
    Py_RETURN_NONE;
}

static void Stager_dealloc(Stager *s) {
    Py_BEGIN_ALLOW_THREADS
    stop(s);
    Py_END_ALLOW_THREADS
    if (s->src_fd >= 0) close(s->src_fd);
    if (s->handoff_fd >= 0) close(s->handoff_fd);
    tier_index_close(&s->index);
    pthread_rwlock_destroy(&s->index.lock);
    free_list(s->finished);   /* stop() emptied the queue */
    close_packs(s);
    pthread_mutex_destroy(&s->packs_mu);
    pthread_cond_destroy(&s->packs_cv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Stager_methods[] = {
    {"submit_many", (PyCFunction)Stager_submit_many, METH_O,
     "submit_many(jobs): files to stage, (token, path, size, out_fd, offset, lock_offset[, src_offset, src_mtime, digest]) each, queued at once"},
    {"collect", (PyCFunction)Stager_collect, METH_VARARGS,
     "collect(timeout) -> [(token, errno, mtime_ns, handed_over, locked)] of the jobs finished so far"},
    {"limit", (PyCFunction)Stager_limit, METH_VARARGS, "limit(n): at most n jobs carried at once from now on"},
    {"load", (PyCFunction)Stager_load, METH_NOARGS,
     "load() -> (jobs done, seconds they took in all, jobs running now, jobs queued now)"},
    {"close", (PyCFunction)Stager_close, METH_NOARGS, "stop and join the threads; queued jobs end ECANCELED"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StagerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "clairvoyant.cache._stager.Stager",
    .tp_basicsize = sizeof(Stager),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Native threads that copy source files into reserved places of the local tier.",
    .tp_new = Stager_new,
    .tp_init = (initproc)Stager_init,
    .tp_dealloc = (destructor)Stager_dealloc,
    .tp_methods = Stager_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stager", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__stager(void) {
    if (PyType_Ready(&StagerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&StagerType);
    if (PyModule_AddObject(m, "Stager", (PyObject *)&StagerType) < 0) {
        Py_DECREF(&StagerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
