/* The staging hot path in a call that holds no GIL while it waits on the kernel.
 *
 * read_meta(path) returns (bytes, mtime_ns): open, fstat, read, close.
 *
 * The staging threads call it instead of four system calls from Python, each of
 * which would hand the GIL back and forth among dozens of threads. (Cache entries
 * are written with os.pwritev into extents: one call already.)
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

static PyMethodDef methods[] = {
    {"read_meta", read_meta, METH_VARARGS, "read_meta(path) -> (bytes, mtime_ns)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastio", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastio(void) { return PyModule_Create(&module); }
