/* Farthest-next-use over one epoch's accesses: the loop of plan/residency.py in C.
 *
 * simulate(seq, nxt, sizes, capacity, res_samples, res_first, res_sizes, hit, keep[, admit])
 *   seq, nxt:   int64 per access (the sample, the position of its next access or INT64_MAX)
 *   sizes:      int64 per sample
 *   res_*:      int64 per resident from before, already in the order to admit them
 *   hit, keep:  writable bytes per access, filled with 0/1
 *   admit:      optional bytes per access (None: all 1); a miss where it is 0 is not admitted
 * returns (drop, after_samples, after_sizes): drop a list, the residents at the end as bytes of
 * int64 (ascending samples, their sizes).
 *
 * next_uses(seq, nsamples, out): out[i] = the next position j > i with seq[j] == seq[i], else
 *   INT64_MAX; one pass backwards (the argsort of plan/evict.py's next_uses, in O(n)).
 * group_by(keys, ngroups, order[, place]): a stable counting sort of int32 keys in [0, ngroups):
 *   order (int32 or int64) lists the positions group by group, ascending within each; place[i]
 *   (int64, optional) is position i's index within its group.
 *
 * Same decisions, in the same order, as the Python loop (plan/residency.py with
 * plan/evict.py's FarthestNextUse): a max-heap on (next use, then smallest
 * sample) with stale entries skipped lazily. Pure computation: no I/O.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int64_t nu, s; } Entry;

/* a before b in the heap: larger next use first, then smaller sample */
static int above(Entry a, Entry b) { return a.nu > b.nu || (a.nu == b.nu && a.s < b.s); }

typedef struct { Entry *v; Py_ssize_t n, cap; } Heap;

static int push(Heap *h, Entry e) {
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap ? 2 * h->cap : 1024;
        Entry *v = realloc(h->v, (size_t)cap * sizeof(Entry));
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    Py_ssize_t i = h->n++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!above(e, h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
    return 0;
}

static Entry pop(Heap *h) {
    Entry top = h->v[0], last = h->v[--h->n];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && above(h->v[c + 1], h->v[c])) c++;
        if (!above(h->v[c], last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

typedef struct {
    int64_t *next;     /* per sample: its next use while resident */
    int64_t *size;     /* per sample: bytes while resident */
    char *resident;
    int64_t used, capacity;
    Heap heap;
    Entry *held;       /* victims taken off the heap during one admission */
} Cache;

/* the resident with the farthest next use, not yet taken; stale entries dropped */
static int farthest(Cache *c, Entry *out) {
    while (c->heap.n) {
        Entry e = c->heap.v[0];
        if (c->resident[e.s] == 1 && c->next[e.s] == e.nu) {
            *out = e;
            return 1;
        }
        pop(&c->heap);
    }
    return 0;
}

/* 1 admitted (victims in c->held[0..*nv)), 0 refused; -1 out of memory */
static int admit(Cache *c, int64_t s, int64_t size, int64_t nu, Py_ssize_t *nv) {
    *nv = 0;
    if (size > c->capacity) return 0;
    int64_t freed = 0;
    while (c->used - freed + size > c->capacity) {
        Entry top;
        if (!farthest(c, &top) || top.nu <= nu) {
            for (Py_ssize_t k = 0; k < *nv; k++) {
                c->resident[c->held[k].s] = 1;
                if (push(&c->heap, c->held[k]) < 0) return -1;
            }
            *nv = 0;
            return 0;
        }
        pop(&c->heap);
        c->resident[top.s] = 2;   /* taken: not a candidate again in this admission */
        c->held[(*nv)++] = top;
        freed += c->size[top.s];
    }
    for (Py_ssize_t k = 0; k < *nv; k++) {
        int64_t v = c->held[k].s;
        c->resident[v] = 0;
        c->used -= c->size[v];
    }
    c->resident[s] = 1;
    c->next[s] = nu;
    c->size[s] = size;
    c->used += size;
    return push(&c->heap, (Entry){nu, s}) < 0 ? -1 : 1;
}

static PyObject *simulate(PyObject *self, PyObject *args) {
    Py_buffer seq, nxt, sizes, rs, rf, rz, hit, keep, adm = {0};
    long long capacity;
    PyObject *admit_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*y*y*Ly*y*y*w*w*|O", &seq, &nxt, &sizes, &capacity, &rs, &rf, &rz, &hit, &keep,
                          &admit_obj))
        return NULL;
    PyObject *result = NULL, *drop = NULL, *after_s = NULL, *after_z = NULL;
    Py_ssize_t n = seq.len / 8, nsamples = sizes.len / 8, nres = rs.len / 8;
    const int64_t *S = seq.buf, *NX = nxt.buf, *Z = sizes.buf, *RS = rs.buf, *RF = rf.buf, *RZ = rz.buf;
    char *H = hit.buf, *K = keep.buf;
    const char *A = NULL;   /* admit per access; NULL: every miss may be admitted */
    Cache c = {0};
    int64_t *last = NULL;
    if (admit_obj != Py_None) {
        if (PyObject_GetBuffer(admit_obj, &adm, PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (adm.len != n) {
            PyErr_SetString(PyExc_ValueError, "admit must hold one byte per access");
            goto done;
        }
        A = adm.buf;
    }
    c.capacity = capacity;
    c.next = calloc((size_t)nsamples + 1, sizeof(int64_t));
    c.size = calloc((size_t)nsamples + 1, sizeof(int64_t));
    c.resident = calloc((size_t)nsamples + 1, 1);
    c.held = malloc(((size_t)nsamples + 1) * sizeof(Entry));
    last = malloc(((size_t)nsamples + 1) * sizeof(int64_t));
    drop = PyList_New(0);
    if (!c.next || !c.size || !c.resident || !c.held || !last || !drop) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t s = 0; s < nsamples; s++) last[s] = -1;
    Py_ssize_t nv;
    for (Py_ssize_t k = 0; k < nres; k++) {
        int r = admit(&c, RS[k], RZ[k], RF[k], &nv);
        if (r < 0) { PyErr_NoMemory(); goto done; }
        if (r == 0) {
            PyObject *o = PyLong_FromLongLong(RS[k]);
            if (!o || PyList_Append(drop, o) < 0) { Py_XDECREF(o); goto done; }
            Py_DECREF(o);
        }
    }
    memset(H, 0, (size_t)n);
    memset(K, 0, (size_t)n);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = S[i], nu = NX[i];
        if (s < 0 || s >= nsamples) {
            PyErr_SetString(PyExc_IndexError, "sample index outside the sizes array");
            goto done;
        }
        if (c.resident[s] == 1) {
            H[i] = 1;
            K[i] = 1;
            c.next[s] = nu;
            if (push(&c.heap, (Entry){nu, s}) < 0) { PyErr_NoMemory(); goto done; }
        } else {
            if (A && !A[i]) continue;   /* a miss this tier may not keep: read elsewhere, not admitted */
            int r = admit(&c, s, Z[s], nu, &nv);
            if (r < 0) { PyErr_NoMemory(); goto done; }
            if (r == 0) continue;
            K[i] = 1;
            for (Py_ssize_t k = 0; k < nv; k++) {
                int64_t v = c.held[k].s;
                if (last[v] < 0) {
                    PyObject *o = PyLong_FromLongLong(v);
                    if (!o || PyList_Append(drop, o) < 0) { Py_XDECREF(o); goto done; }
                    Py_DECREF(o);
                } else {
                    K[last[v]] = 0;
                }
            }
        }
        last[s] = i;
    }
    Py_ssize_t nafter = 0;
    for (Py_ssize_t s = 0; s < nsamples; s++) nafter += c.resident[s] == 1;
    after_s = PyBytes_FromStringAndSize(NULL, nafter * 8);
    after_z = PyBytes_FromStringAndSize(NULL, nafter * 8);
    if (!after_s || !after_z) goto done;
    {
        int64_t *AS = (int64_t *)PyBytes_AS_STRING(after_s), *AZ = (int64_t *)PyBytes_AS_STRING(after_z);
        Py_ssize_t k = 0;
        for (Py_ssize_t s = 0; s < nsamples; s++) {
            if (c.resident[s] == 1) {
                AS[k] = s;
                AZ[k++] = c.size[s];
            }
        }
    }
    result = Py_BuildValue("(OOO)", drop, after_s, after_z);
done:
    Py_XDECREF(drop);
    Py_XDECREF(after_s);
    Py_XDECREF(after_z);
    free(c.next);
    free(c.size);
    free(c.resident);
    free(c.held);
    free(c.heap.v);
    free(last);
    PyBuffer_Release(&seq); PyBuffer_Release(&nxt); PyBuffer_Release(&sizes);
    PyBuffer_Release(&rs); PyBuffer_Release(&rf); PyBuffer_Release(&rz);
    PyBuffer_Release(&hit); PyBuffer_Release(&keep);
    if (adm.obj) PyBuffer_Release(&adm);
    return result;
}

static PyObject *next_uses(PyObject *self, PyObject *args) {
    Py_buffer seq, out;
    Py_ssize_t nsamples;
    if (!PyArg_ParseTuple(args, "y*nw*", &seq, &nsamples, &out)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = seq.len / 8;
    const int64_t *S = seq.buf;
    int64_t *O = out.buf, *last = NULL;
    if (out.len != seq.len) {
        PyErr_SetString(PyExc_ValueError, "out must hold one int64 per access");
        goto done;
    }
    last = malloc(((size_t)nsamples + 1) * sizeof(int64_t));
    if (!last) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t s = 0; s < nsamples; s++) last[s] = INT64_MAX;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        int64_t s = S[i];
        if (s < 0 || s >= nsamples) {
            PyErr_SetString(PyExc_IndexError, "sample index outside [0, nsamples)");
            goto done;
        }
        O[i] = last[s];
        last[s] = i;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    free(last);
    PyBuffer_Release(&seq); PyBuffer_Release(&out);
    return result;
}

static PyObject *group_by(PyObject *self, PyObject *args) {
    Py_buffer keys, order, place = {0};
    Py_ssize_t ngroups;
    PyObject *place_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*nw*|O", &keys, &ngroups, &order, &place_obj)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = keys.len / 4;
    const int32_t *K = keys.buf;
    int wide = order.len == n * 8;   /* order as int64, else int32 */
    int64_t *P = NULL, *start = NULL;
    if (!wide && order.len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "order must hold one int32 or int64 per key");
        goto done;
    }
    if (place_obj != Py_None) {
        if (PyObject_GetBuffer(place_obj, &place, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (place.len != n * 8) {
            PyErr_SetString(PyExc_ValueError, "place must hold one int64 per key");
            goto done;
        }
        P = place.buf;
    }
    start = calloc((size_t)ngroups + 1, sizeof(int64_t));
    if (!start) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (K[i] < 0 || K[i] >= ngroups) {
            PyErr_SetString(PyExc_IndexError, "key outside [0, ngroups)");
            goto done;
        }
        start[K[i] + 1]++;
    }
    for (Py_ssize_t g = 0; g < ngroups; g++) start[g + 1] += start[g];
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t g = K[i], at = start[g]++;
        if (wide) ((int64_t *)order.buf)[at] = i;
        else ((int32_t *)order.buf)[at] = (int32_t)i;
        if (P) P[i] = at;
    }
    /* start[g] is now the end of group g: the beginning of g is start[g - 1] (0 for g = 0) */
    if (P) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t g = K[i];
            P[i] -= g ? start[g - 1] : 0;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    free(start);
    PyBuffer_Release(&keys); PyBuffer_Release(&order);
    if (place.obj) PyBuffer_Release(&place);
    return result;
}

/* group_accesses(seq, home_local, ngroups, nthis, order, lseq, cuts, this_cuts): the cluster plan's
 * grouping of accesses by home, in two passes with one lookup per access each.
 * seq: int32 samples per access (this epoch's nthis first, then the next epoch's); home_local:
 * int64 per sample, (home << 32) | its index among its home's samples. Fills order (int32): the
 * accesses home by home, ascending within each; lseq (int32): the local index for each entry of
 * order; cuts and this_cuts (int64, ngroups + 1): where each home's accesses begin in order, and
 * where each home's accesses of this epoch begin among this epoch's. */
static PyObject *group_accesses(PyObject *self, PyObject *args) {
    Py_buffer seq, hl, order, lseq, cuts, tcuts;
    Py_ssize_t ngroups, nthis;
    if (!PyArg_ParseTuple(args, "y*y*nnw*w*w*w*", &seq, &hl, &ngroups, &nthis, &order, &lseq, &cuts, &tcuts))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = seq.len / 4, nsamples = hl.len / 8;
    const int32_t *S = seq.buf;
    const int64_t *HL = hl.buf;
    int32_t *O = order.buf, *LS = lseq.buf;
    int64_t *C = cuts.buf, *T = tcuts.buf;
    if (order.len != n * 4 || lseq.len != n * 4 || n >= INT32_MAX || nthis > n ||
        cuts.len != (ngroups + 1) * 8 || tcuts.len != (ngroups + 1) * 8) {
        PyErr_SetString(PyExc_ValueError, "group_accesses: buffer sizes do not match");
        goto done;
    }
    memset(C, 0, (size_t)(ngroups + 1) * 8);
    memset(T, 0, (size_t)(ngroups + 1) * 8);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = S[i], g;
        if (s < 0 || s >= nsamples || (g = HL[s] >> 32) < 0 || g >= ngroups) {
            PyErr_SetString(PyExc_IndexError, "a sample or its home is out of range");
            goto done;
        }
        C[g + 1]++;
        if (i < nthis) T[g + 1]++;
    }
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        C[g + 1] += C[g];
        T[g + 1] += T[g];
    }
    for (Py_ssize_t i = 0; i < n; i++) {   /* C[g] moves to the end of group g, then back */
        int64_t v = HL[S[i]], at = C[v >> 32]++;
        O[at] = (int32_t)i;
        LS[at] = (int32_t)(v & 0xffffffffLL);
    }
    for (Py_ssize_t g = ngroups; g > 0; g--) C[g] = C[g - 1];
    C[0] = 0;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&seq); PyBuffer_Release(&hl); PyBuffer_Release(&order); PyBuffer_Release(&lseq);
    PyBuffer_Release(&cuts); PyBuffer_Release(&tcuts);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS,
     "simulate(seq, nxt, sizes, capacity, res_samples, res_first, res_sizes, hit, keep[, admit]) -> "
     "(drop, after_samples, after_sizes)"},
    {"next_uses", next_uses, METH_VARARGS, "next_uses(seq, nsamples, out) -> None"},
    {"group_accesses", group_accesses, METH_VARARGS, "group_accesses(seq, home_local, ngroups, nthis, order, lseq, cuts, this_cuts) -> None"},
    {"group_by", group_by, METH_VARARGS, "group_by(keys, ngroups, order[, place]) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_belady", NULL, -1, methods};

PyMODINIT_FUNC PyInit__belady(void) { return PyModule_Create(&module); }
