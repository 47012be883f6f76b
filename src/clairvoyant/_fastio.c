/* The staging hot path in calls that hold no GIL while they wait on the kernel.
 *
 * claim(lock_fd, offset, path, size) takes the node-wide byte-range lock of a
 * sample and checks whether it is already published with that size; if so it
 * releases the lock again and returns True.
 *
 * read_meta(path) returns (bytes, mtime_ns): open, fstat, read, close.
 *
 * write_publish(tmp, dst, data, trailer, reuse=False) creates tmp (O_EXCL; with
 * reuse, rewrites an existing file of ours from the start instead), writes data
 * and trailer with writev, closes and renames tmp to dst; on any failure tmp is
 * removed and OSError names the failing path.
 *
 * The staging threads call these instead of several system calls from Python,
 * each of which would hand the GIL back and forth among dozens of threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

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

static PyObject *read_meta(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    int fd, err = 0;
    struct stat st;
    Py_BEGIN_ALLOW_THREADS
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
    } else if (fstat(fd, &st) < 0) {
        err = errno;
        close(fd);
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    }
    PyObject *buf = PyBytes_FromStringAndSize(NULL, st.st_size);
    if (buf == NULL) {
        close(fd);
        return NULL;
    }
    char *p = PyBytes_AS_STRING(buf);  /* no one else holds buf yet: filled without the GIL */
    Py_ssize_t got = 0, want = st.st_size;
    Py_BEGIN_ALLOW_THREADS
    while (got < want) {
        ssize_t n = read(fd, p + got, (size_t)(want - got));
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        if (n == 0) break;
        got += n;
    }
    close(fd);
    Py_END_ALLOW_THREADS
    if (err) {
        Py_DECREF(buf);
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    }
    if (got < want && _PyBytes_Resize(&buf, got) < 0) return NULL;  /* the file shrank meanwhile */
    long long mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    PyObject *out = Py_BuildValue("(NL)", buf, mtime_ns);
    return out;
}

static PyObject *write_publish(PyObject *self, PyObject *args) {
    const char *tmp, *dst;
    Py_buffer data, trailer;
    int reuse = 0;
    if (!PyArg_ParseTuple(args, "ssy*y*|p", &tmp, &dst, &data, &trailer, &reuse)) return NULL;
    int err = 0;
    const char *where = tmp;
    Py_BEGIN_ALLOW_THREADS
    int flags = reuse ? (O_WRONLY | O_TRUNC | O_CLOEXEC) : (O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC);
    int fd = open(tmp, flags, 0600);
    if (fd < 0) {
        err = errno;
    } else {
        struct iovec iov[2] = {{data.buf, (size_t)data.len}, {trailer.buf, (size_t)trailer.len}};
        int first = 0;
        while (first < 2) {
            ssize_t n = writev(fd, iov + first, 2 - first);
            if (n < 0) {
                if (errno == EINTR) continue;
                err = errno;
                break;
            }
            while (first < 2 && (size_t)n >= iov[first].iov_len) {
                n -= (ssize_t)iov[first].iov_len;
                first++;
            }
            if (first < 2) {
                iov[first].iov_base = (char *)iov[first].iov_base + n;
                iov[first].iov_len -= (size_t)n;
            }
        }
        if (close(fd) < 0 && !err) err = errno;
        if (!err && rename(tmp, dst) < 0) {
            err = errno;
            where = dst;
        }
        if (err) unlink(tmp);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&trailer);
    if (err) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, where);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"read_meta", read_meta, METH_VARARGS, "read_meta(path) -> (bytes, mtime_ns)"},
    {"write_publish", write_publish, METH_VARARGS,
     "write_publish(tmp, dst, data, trailer, reuse=False): write data + trailer to tmp, rename to dst."},
    {"claim", claim, METH_VARARGS,
     "claim(lock_fd, offset, path, size) -> True if published (lock released), else False (lock held)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastio(void) { return PyModule_Create(&module); }
