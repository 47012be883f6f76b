/* The staging hot path in a call that holds no GIL.
 *
 * claim(lock_fd, offset, path, size) takes the node-wide byte-range lock of a
 * sample and checks whether it is already published with that size; if so it
 * releases the lock again and returns True. The staging threads call it instead
 * of several system calls from Python, each of which would hand the GIL back
 * and forth, and it may block on another process's lock without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
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

static PyMethodDef methods[] = {
    {"claim", claim, METH_VARARGS,
     "claim(lock_fd, offset, path, size) -> True if published (lock released), else False (lock held)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcopy", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastcopy(void) { return PyModule_Create(&module); }
