/* The staging hot path in calls that hold no GIL.
 *
 * claim(lock_fd, offset, path, size) takes the node-wide byte-range lock of a
 * sample and checks whether it is already published with that size; if so it
 * releases the lock again and returns True.
 *
 * copy_publish(src, tmp, dst, expected) opens src, creates tmp (O_EXCL), copies
 * in the kernel (copy_file_range, falling back to read/write), closes, and
 * renames tmp to dst, unless expected >= 0 and the size copied differs: then
 * tmp is removed and nothing is published. Returns the size copied. On any
 * failure tmp is removed and OSError is raised with the failing path.
 * Where lock_fd >= 0, the byte-range lock at offset is released at the end,
 * whatever happened.
 *
 * The staging threads call these instead of a dozen system calls from Python,
 * each of which would hand the GIL back and forth.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int copy_all(int in, int out, long long *total) {
    int use_range = 1;
    char buf[1 << 16];
    for (;;) {
        ssize_t n;
        if (use_range) {
            n = copy_file_range(in, NULL, out, NULL, 1 << 30, 0);
            if (n < 0 && *total == 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL ||
                                         errno == EOPNOTSUPP)) {
                use_range = 0;
                continue;
            }
        } else {
            n = read(in, buf, sizeof buf);
            if (n > 0) {
                ssize_t done = 0;
                while (done < n) {
                    ssize_t w = write(out, buf + done, (size_t)(n - done));
                    if (w < 0) {
                        if (errno == EINTR) continue;
                        return -1;
                    }
                    done += w;
                }
            }
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) return 0;
        *total += n;
    }
}

static int set_lock(int fd, long long offset, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)offset;
    fl.l_len = 1;
    for (;;) {
        if (fcntl(fd, type == F_UNLCK ? F_SETLK : F_SETLKW, &fl) == 0) return 0;
        if (errno == EDEADLK) {
            /* POSIX locks belong to processes, so two processes whose threads wait on each
               other's locks look like a deadlock to the kernel although no thread waits
               while holding one: wait a moment and ask again */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (errno != EINTR) return -1;
    }
}

static PyObject *claim(PyObject *self, PyObject *args) {
    int lock_fd;
    long long offset, size;
    const char *path;
    if (!PyArg_ParseTuple(args, "iLsL", &lock_fd, &offset, &path, &size)) return NULL;
    int err = 0, present = 0;
    Py_BEGIN_ALLOW_THREADS
    if (set_lock(lock_fd, offset, F_WRLCK) < 0) {
        err = errno;
    } else {
        struct stat st;
        if (stat(path, &st) == 0 && st.st_size == size) {
            present = 1;
            set_lock(lock_fd, offset, F_UNLCK);
        }
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(present);
}

static PyObject *copy_publish(PyObject *self, PyObject *args) {
    const char *src, *tmp, *dst;
    long long expected = -1, offset = 0;
    int lock_fd = -1;
    if (!PyArg_ParseTuple(args, "sss|LiL", &src, &tmp, &dst, &expected, &lock_fd, &offset)) return NULL;
    long long total = 0;
    int err = 0;
    const char *where = src;
    Py_BEGIN_ALLOW_THREADS
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        err = errno;
    } else {
        int out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (out < 0) {
            err = errno;
            where = tmp;
        } else {
            if (copy_all(in, out, &total) < 0) {
                err = errno;
                where = tmp;
            }
            if (close(out) < 0 && !err) {
                err = errno;
                where = tmp;
            }
            if (!err && expected >= 0 && total != expected) {
                unlink(tmp);  /* the source changed: publish nothing, the caller raises */
            } else {
                if (!err && rename(tmp, dst) < 0) {
                    err = errno;
                    where = dst;
                }
                if (err) unlink(tmp);
            }
        }
        close(in);
    }
    if (lock_fd >= 0) set_lock(lock_fd, offset, F_UNLCK);
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, where);
    }
    return PyLong_FromLongLong(total);
}

static PyMethodDef methods[] = {
    {"claim", claim, METH_VARARGS,
     "claim(lock_fd, offset, path, size) -> True if published (lock released), else False (lock held)."},
    {"copy_publish", copy_publish, METH_VARARGS,
     "copy_publish(src, tmp, dst, expected=-1, lock_fd=-1, offset=0) -> bytes copied: copy src to tmp, "
     "rename tmp to dst, release the lock."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcopy", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastcopy(void) { return PyModule_Create(&module); }
