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

/* THE eviction rule, for every heap here: sample sa (next use nua) gives way before sb (nub), the
 * larger next use first, then the smaller sample. plan/evict.py's FarthestNextUse.key is the same
 * rule in Python (tests/plan/test_evict.py checks the two agree, through `farther` below). */
static inline int farther(int64_t nua, int64_t sa, int64_t nub, int64_t sb) {
    return nua > nub || (nua == nub && sa < sb);
}

/* THE heap, for every tier here: a max-heap on that rule, for entries of either width (a struct
 * with fields nu and s): sift an entry up from place i, or the entry at i down among n. */
#define HEAP_OF(T)                                                                                   \
    static void T##_up(T *v, int64_t i, T e) {                                                      \
        while (i > 0) {                                                                             \
            int64_t q = (i - 1) / 2;                                                                \
            if (!farther(e.nu, e.s, v[q].nu, v[q].s)) break;                                        \
            v[i] = v[q];                                                                            \
            i = q;                                                                                  \
        }                                                                                           \
        v[i] = e;                                                                                   \
    }                                                                                               \
    static void T##_down(T *v, int64_t n, int64_t i) {                                              \
        T x = v[i];                                                                                 \
        for (;;) {                                                                                  \
            int64_t c = 2 * i + 1;                                                                  \
            if (c >= n) break;                                                                      \
            if (c + 1 < n && farther(v[c + 1].nu, v[c + 1].s, v[c].nu, v[c].s)) c++;                \
            if (!farther(v[c].nu, v[c].s, x.nu, x.s)) break;                                        \
            v[i] = v[c];                                                                            \
            i = c;                                                                                  \
        }                                                                                           \
        v[i] = x;                                                                                   \
    }
HEAP_OF(Entry)

typedef struct { Entry *v; Py_ssize_t n, cap; } Heap;

static int push(Heap *h, Entry e) {
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap ? 2 * h->cap : 1024;
        Entry *v = realloc(h->v, (size_t)cap * sizeof(Entry));
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    Entry_up(h->v, h->n++, e);
    return 0;
}

static Entry pop(Heap *h) {
    Entry top = h->v[0];
    if (--h->n) {
        h->v[0] = h->v[h->n];
        Entry_down(h->v, h->n, 0);
    }
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

/* ---------------------------------------------------------------------------------------------
 * plan_homes: the cluster plan's farthest-next-use for every home at once (plan/cluster.py).
 *
 * plan_homes(seq, nsamples, next_seq, home, sizes, capacities, res_samples, res_sizes, res_cuts,
 *            reader, hit, keep, late)
 *     -> (drops, drop_cuts, after, after_sizes, after_cuts)
 *   seq:        int32 per access of this epoch, in cluster order (every rank's batches interleaved:
 *               the Loader's arithmetic order and the mount's published orders alike)
 *   next_seq:   int32, the next epoch's accesses in cluster order (empty: no next epoch or none
 *               known); a sample's first access there gives the look-ahead
 *   home:       int16 or int32 per sample: its home node (< 65,536 homes)
 *   sizes:      int64 or int32 per sample: bytes in a tier (each < 2**31)
 *   capacities: int64 per home
 *   res_*:      int32 residents held at the start, home by home (res_cuts: int64, homes + 1)
 *   reader:     int16 or int32 per access: the node that makes it
 *   hit, keep, late: writable bytes per access. late[i]: bit 0 the home cuts the sample after a
 *               peer's read at i (a late drop), bit 1 the epoch reads that sample once.
 * Returns, as bytes: drops (int32, home by home: residents homed elsewhere, then in the order the
 * plan decides), drop_cuts (int64), after (int32 samples held at the end, home by home,
 * ascending), after_sizes (int32), after_cuts (int64).
 *
 * The same decisions as simulate() run once per home over the accesses to its samples with a miss
 * admitted only where the home itself reads (plan/cluster.py's Python path): positions are the
 * epoch's own instead of the home's, which keeps every comparison. One 12-byte cell per sample
 * (first use, then the latest access; bytes held; home; state), so each access touches one cache
 * line. No home lists its residents until some tier is full; a home's heap is built only once
 * its own tier is full (until then it lists its residents), and it is compacted when stale
 * entries pile up.
 * --------------------------------------------------------------------------------------------- */

#define NEVER32 INT32_MAX
/* the passes below touch one random cell per access: fetching the cells of accesses a little
 * ahead lets the memory system work on several at once (about 2x at 14 M samples) */
#define AHEAD 24
#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch((p), 1, 1)
#else
#define PREFETCH(p) ((void)0)
#endif
typedef struct { int32_t nu, s; } E32;
typedef struct { int32_t T, Z; uint16_t home; uint8_t st, pad; } Cell;
/* T: >= 0 the first use (not read yet this epoch), <= -2: -2 - the latest access; Z: bytes while
 * resident; st: 0 out, 1 resident, 2 taken as a victim, 3 held at the start (not placed yet) */
typedef struct {
    E32 *v;                 /* heaped: a max-heap on (nu, -s), stale entries skipped lazily; else the residents */
    int64_t n, cap, live, used, capacity, held;
    int heaped;
} Home;
typedef struct {
    Cell *C;
    Py_ssize_t N;
    const int32_t *NX;      /* per access: next use */
    E32 *victims;
    int64_t nvict, capvict;
    Home *homes;
    int listed;             /* the homes list their residents (from the first time any tier is full) */
} Plan;

static int32_t nu_of(const Plan *p, int32_t s) {
    int32_t t = p->C[s].T;
    return t >= 0 ? t : p->NX[-2 - t];
}
HEAP_OF(E32)
static int h_push(Home *h, E32 e) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 16;
        E32 *v = realloc(h->v, (size_t)cap * sizeof(E32));
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    int64_t i = h->n++;
    if (h->heaped) E32_up(h->v, i, e);
    else h->v[i] = e;
    return 0;
}
static void h_pop(Home *h) {
    if (--h->n) {
        h->v[0] = h->v[h->n];
        E32_down(h->v, h->n, 0);
    }
}
/* keep only live entries (a resident's current next use), then heapify; `refresh`: the list of
 * an unheaped home, one entry per resident, whose next uses are looked up now */
static void h_rebuild(Home *h, const Plan *p, int refresh) {
    int64_t k = 0;
    for (int64_t i = 0; i < h->n; i++) {
        E32 e = h->v[i];
        if (refresh) e.nu = nu_of(p, e.s);
        else if (p->C[e.s].st != 1 || nu_of(p, e.s) != e.nu) continue;
        h->v[k++] = e;
    }
    h->n = k;
    h->heaped = 1;
    for (int64_t i = k / 2 - 1; i >= 0; i--) E32_down(h->v, k, i);
}
static int p_victim(Plan *p, E32 e) {
    if (p->nvict == p->capvict) {
        int64_t cap = p->capvict ? 2 * p->capvict : 64;
        E32 *v = realloc(p->victims, (size_t)cap * sizeof(E32));
        if (!v) return -1;
        p->victims = v;
        p->capvict = cap;
    }
    p->victims[p->nvict++] = e;
    return 0;
}
/* the first time a tier is full: every home lists its residents (one pass over the cells), so
 * that a job whose tiers never fill keeps no list at all */
static int p_list(Plan *p) {
    for (Py_ssize_t s = 0; s < p->N; s++)
        if (p->C[s].st == 1 && h_push(&p->homes[p->C[s].home], (E32){0, (int32_t)s}) < 0) return -1;
    p->listed = 1;
    return 0;
}
/* admit sample s (size bytes, next use nu) at home h: 1 admitted (victims in p->victims), 0 refused, -1 no memory */
static int h_admit(Plan *p, Home *h, int32_t s, int64_t size, int32_t nu) {
    Cell *C = p->C;
    p->nvict = 0;
    if (size > h->capacity) return 0;
    if (h->used + size > h->capacity) {
        if (!p->listed && p_list(p) < 0) return -1;
        if (!h->heaped) h_rebuild(h, p, 1);
        int64_t freed = 0;
        while (h->used - freed + size > h->capacity) {
            E32 top;
            int found = 0;
            while (h->n) {
                top = h->v[0];
                if (C[top.s].st == 1 && nu_of(p, top.s) == top.nu) { found = 1; break; }
                h_pop(h);
            }
            if (!found || top.nu <= nu) {
                for (int64_t k = 0; k < p->nvict; k++) {
                    C[p->victims[k].s].st = 1;
                    if (h_push(h, p->victims[k]) < 0) return -1;
                }
                p->nvict = 0;
                return 0;
            }
            h_pop(h);
            C[top.s].st = 2;
            if (p_victim(p, top) < 0) return -1;
            freed += C[top.s].Z;
        }
        for (int64_t k = 0; k < p->nvict; k++) {
            Cell *v = &C[p->victims[k].s];
            v->st = 0;
            h->used -= v->Z;
            h->live--;
        }
    }
    C[s].st = 1;
    C[s].Z = (int32_t)size;
    h->used += size;
    h->live++;
    if (p->listed && h_push(h, (E32){nu, s}) < 0) return -1;
    if (h->heaped && h->n > 2 * h->live + 4096) h_rebuild(h, p, 0);
    return 1;
}
typedef struct { int32_t s; int32_t h; } Pair;
static int pair_push(Pair **v, int64_t *n, int64_t *cap, Pair x) {
    if (*n == *cap) {
        int64_t c = *cap ? 2 * *cap : 256;
        Pair *w = realloc(*v, (size_t)c * sizeof(Pair));
        if (!w) return -1;
        *v = w;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return 0;
}
static int by_first(const void *a, const void *b) {   /* E32 as (first use, sample): soonest, then smallest */
    const E32 *x = a, *y = b;
    if (x->nu != y->nu) return x->nu < y->nu ? -1 : 1;
    return (x->s > y->s) - (x->s < y->s);
}
static PyObject *plan_homes(PyObject *self, PyObject *args) {
    Py_buffer seq, nseq, hom, siz, caps, rsb, rzb, rcb, rdr, hit, keep, late;
    Py_ssize_t N;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*y*y*y*y*y*w*w*w*", &seq, &N, &nseq, &hom, &siz, &caps,
                          &rsb, &rzb, &rcb, &rdr, &hit, &keep, &late))
        return NULL;
    PyObject *result = NULL, *drops_b = NULL, *dcuts_b = NULL, *after_b = NULL, *asz_b = NULL, *acuts_b = NULL;
    Py_ssize_t L = seq.len / 4, NL = nseq.len / 4;
    Py_ssize_t H = caps.len / 8, R = rsb.len / 4;
    const int32_t *S = seq.buf, *NS = nseq.buf, *RS = rsb.buf, *RZ = rzb.buf;
    const int64_t *CAP = caps.buf, *RC = rcb.buf;
    uint8_t *HI = hit.buf, *KE = keep.buf, *LA = late.buf;
    Plan p = {0};
    Home *homes = NULL;
    int32_t *nxt = NULL;
    Pair *drops = NULL;
    E32 *later = NULL;
    int64_t ndrops = 0, capdrops = 0, nlater = 0;
    int home16 = hom.len == N * 2, size64 = siz.len == N * 8, reader16 = rdr.len == L * 2;
    if (N < 0 || (!home16 && hom.len != N * 4) || (!size64 && siz.len != N * 4) || (!reader16 && rdr.len != L * 4) ||
        seq.len % 4 || nseq.len % 4 || rzb.len != rsb.len || rcb.len != (H + 1) * 8 || hit.len != L ||
        keep.len != L || late.len != L || H < 1 || H > 65536 ||
        (double)L + (double)NL + (double)N + 2 >= (double)NEVER32 || RC[0] != 0 || RC[H] != R) {
        PyErr_SetString(PyExc_ValueError, "plan_homes: buffer sizes do not match");
        goto done;
    }
    homes = calloc((size_t)H, sizeof(Home));
    p.C = malloc(((size_t)N + 1) * sizeof(Cell));
    nxt = malloc(((size_t)L + 1) * sizeof(int32_t));
    if (!homes || !p.C || !nxt) { PyErr_NoMemory(); goto done; }
    p.NX = nxt;
    p.N = N;
    p.homes = homes;
    Cell *C = p.C;
    for (Py_ssize_t h = 0; h < H; h++) homes[h].capacity = CAP[h];
    for (Py_ssize_t s = 0; s < N; s++) {
        int64_t h = home16 ? ((const int16_t *)hom.buf)[s] : ((const int32_t *)hom.buf)[s];
        if (h < 0 || h >= H) { PyErr_SetString(PyExc_IndexError, "a home is out of range"); goto done; }
        C[s] = (Cell){NEVER32, 0, (uint16_t)h, 0, 0};
    }
    /* residents held at the start: those homed elsewhere are dropped first */
    for (Py_ssize_t h = 0; h < H; h++) {
        if (RC[h + 1] < RC[h]) { PyErr_SetString(PyExc_ValueError, "res_cuts must ascend"); goto done; }
        for (int64_t k = RC[h]; k < RC[h + 1]; k++) {
            int32_t s = RS[k];
            if (k + AHEAD < R && RS[k + AHEAD] >= 0 && RS[k + AHEAD] < N) PREFETCH(&C[RS[k + AHEAD]]);
            if (s < 0 || s >= N || C[s].home != h || C[s].st == 3) {
                if (pair_push(&drops, &ndrops, &capdrops, (Pair){s, (int32_t)h}) < 0) { PyErr_NoMemory(); goto done; }
                continue;
            }
            C[s].st = 3;
            C[s].Z = RZ[k];
            homes[h].held += RZ[k];
        }
    }
    /* next uses, backwards: the next epoch's first read of each sample, then this epoch's */
    for (Py_ssize_t j = NL - 1; j >= 0; j--) {   /* backwards: a sample's first access there wins */
        int32_t s = NS[j];
        if (j >= AHEAD && NS[j - AHEAD] >= 0 && NS[j - AHEAD] < N) PREFETCH(&C[NS[j - AHEAD]]);
        if (s < 0 || s >= N) { PyErr_SetString(PyExc_IndexError, "a sample is out of range"); goto done; }
        C[s].T = (int32_t)(L + j);
    }
    for (Py_ssize_t i = L - 1; i >= 0; i--) {
        int32_t s = S[i];
        if (s < 0 || s >= N) { PyErr_SetString(PyExc_IndexError, "a sample is out of range"); goto done; }
        if (i >= AHEAD && S[i - AHEAD] >= 0 && S[i - AHEAD] < N) PREFETCH(&C[S[i - AHEAD]]);
        nxt[i] = C[s].T;
        C[s].T = (int32_t)i;
    }
    /* the residents enter their home's tier soonest needed first (ties: the smaller sample), which
     * matters only where they do not all fit: elsewhere they go in as they come */
    for (Py_ssize_t s = 0; s < N; s++) {
        if (C[s].st != 3) continue;
        Home *h = &homes[C[s].home];
        if (h->held > h->capacity) { nlater++; continue; }
        C[s].st = 0;
        if (h_admit(&p, h, (int32_t)s, C[s].Z, C[s].T) < 0) { PyErr_NoMemory(); goto done; }
    }
    if (nlater) {
        later = malloc((size_t)nlater * sizeof(E32));
        if (!later) { PyErr_NoMemory(); goto done; }
        int64_t k = 0;
        for (Py_ssize_t s = 0; s < N; s++)
            if (C[s].st == 3) later[k++] = (E32){C[s].T, (int32_t)s};
        qsort(later, (size_t)nlater, sizeof(E32), by_first);
        for (k = 0; k < nlater; k++) {
            int32_t s = later[k].s, hh = C[s].home;
            C[s].st = 0;
            int r = h_admit(&p, &homes[hh], s, C[s].Z, C[s].T);
            if (r < 0) { PyErr_NoMemory(); goto done; }
            if (r == 0 && pair_push(&drops, &ndrops, &capdrops, (Pair){s, hh}) < 0) { PyErr_NoMemory(); goto done; }
            for (int64_t v = 0; v < p.nvict; v++)
                if (pair_push(&drops, &ndrops, &capdrops, (Pair){p.victims[v].s, hh}) < 0) { PyErr_NoMemory(); goto done; }
        }
    }
    /* the epoch */
#define READER(i) (reader16 ? (int64_t)((const int16_t *)rdr.buf)[i] : (int64_t)((const int32_t *)rdr.buf)[i])
    memset(HI, 0, (size_t)L);
    memset(KE, 0, (size_t)L);
    memset(LA, 0, (size_t)L);
    for (Py_ssize_t i = 0; i < L; i++) {
        int32_t s = S[i], nu = nxt[i];
        if (i + AHEAD < L) {   /* in range: checked by the pass above */
            PREFETCH(&C[S[i + AHEAD]]);
            if (size64) PREFETCH((const int64_t *)siz.buf + S[i + AHEAD]);
            else PREFETCH((const int32_t *)siz.buf + S[i + AHEAD]);
        }
        Cell *c = &C[s];
        Home *h = &homes[c->home];
        if (c->T >= 0 && nu >= L) LA[i] = 2;   /* the epoch's only read of s */
        if (c->st == 1) {
            HI[i] = KE[i] = 1;
            c->T = (int32_t)(-2 - i);
            if (h->heaped) {
                if (h_push(h, (E32){nu, s}) < 0) { PyErr_NoMemory(); goto done; }
                if (h->n > 2 * h->live + 4096) h_rebuild(h, &p, 0);
            }
            continue;
        }
        c->T = (int32_t)(-2 - i);   /* read now, kept or not: its latest access */
        if (READER(i) != c->home) continue;   /* a peer's miss: not kept */
        int r = h_admit(&p, h, s, size64 ? ((const int64_t *)siz.buf)[s] : ((const int32_t *)siz.buf)[s], nu);
        if (r < 0) { PyErr_NoMemory(); goto done; }
        if (r == 0) continue;
        KE[i] = 1;
        for (int64_t k = 0; k < p.nvict; k++) {
            int32_t v = p.victims[k].s;
            if (C[v].T >= 0) {   /* held from before, evicted before its first read */
                if (pair_push(&drops, &ndrops, &capdrops, (Pair){v, C[v].home}) < 0) { PyErr_NoMemory(); goto done; }
            } else {
                KE[-2 - C[v].T] = 0;   /* cut before its next use: never keep it at all */
            }
        }
    }
    for (Py_ssize_t i = 0; i < L; i++) {
        int cut = HI[i] && !KE[i] && READER(i) != C[S[i]].home;
        LA[i] = cut ? (uint8_t)(1 | LA[i]) : 0;
    }
    free(nxt); nxt = NULL;
    for (Py_ssize_t h = 0; h < H; h++) { free(homes[h].v); homes[h].v = NULL; }
    /* what each home holds at the end, and its drops, home by home */
    {
        dcuts_b = PyBytes_FromStringAndSize(NULL, (H + 1) * 8);
        acuts_b = PyBytes_FromStringAndSize(NULL, (H + 1) * 8);
        drops_b = PyBytes_FromStringAndSize(NULL, ndrops * 4);
        if (!dcuts_b || !acuts_b || !drops_b) goto done;
        int64_t *DC = (int64_t *)PyBytes_AS_STRING(dcuts_b), *AC = (int64_t *)PyBytes_AS_STRING(acuts_b);
        int32_t *D = (int32_t *)PyBytes_AS_STRING(drops_b);
        memset(DC, 0, (H + 1) * 8);
        memset(AC, 0, (H + 1) * 8);
        for (int64_t k = 0; k < ndrops; k++) DC[drops[k].h + 1]++;
        for (Py_ssize_t s = 0; s < N; s++) AC[C[s].home + 1] += C[s].st == 1;
        for (Py_ssize_t h = 0; h < H; h++) { DC[h + 1] += DC[h]; AC[h + 1] += AC[h]; }
        for (int64_t k = 0; k < ndrops; k++) D[DC[drops[k].h]++] = drops[k].s;
        for (Py_ssize_t h = H; h > 0; h--) DC[h] = DC[h - 1];
        DC[0] = 0;
        after_b = PyBytes_FromStringAndSize(NULL, AC[H] * 4);
        asz_b = PyBytes_FromStringAndSize(NULL, AC[H] * 4);
        if (!after_b || !asz_b) goto done;
        int32_t *A = (int32_t *)PyBytes_AS_STRING(after_b), *AZ = (int32_t *)PyBytes_AS_STRING(asz_b);
        for (Py_ssize_t s = 0; s < N; s++) {
            if (C[s].st != 1) continue;
            int64_t at = AC[C[s].home]++;
            A[at] = (int32_t)s;
            AZ[at] = C[s].Z;
        }
        for (Py_ssize_t h = H; h > 0; h--) AC[h] = AC[h - 1];
        AC[0] = 0;
    }
    result = Py_BuildValue("(OOOOO)", drops_b, dcuts_b, after_b, asz_b, acuts_b);
done:
    Py_XDECREF(drops_b); Py_XDECREF(dcuts_b); Py_XDECREF(after_b); Py_XDECREF(asz_b); Py_XDECREF(acuts_b);
    if (homes) for (Py_ssize_t h = 0; h < H; h++) free(homes[h].v);
    free(homes); free(p.C); free(nxt); free(drops); free(later); free(p.victims);
    PyBuffer_Release(&seq); PyBuffer_Release(&nseq); PyBuffer_Release(&hom); PyBuffer_Release(&siz);
    PyBuffer_Release(&caps); PyBuffer_Release(&rsb); PyBuffer_Release(&rzb); PyBuffer_Release(&rcb);
    PyBuffer_Release(&rdr); PyBuffer_Release(&hit); PyBuffer_Release(&keep); PyBuffer_Release(&late);
    return result;
}
#undef READER

static PyObject *py_farther(PyObject *self, PyObject *args) {
    long long nua, sa, nub, sb;
    if (!PyArg_ParseTuple(args, "LLLL", &nua, &sa, &nub, &sb)) return NULL;
    return PyBool_FromLong(farther(nua, sa, nub, sb));
}

static PyMethodDef methods[] = {
    {"farther", py_farther, METH_VARARGS, "farther(next_use_a, sample_a, next_use_b, sample_b) -> whether a gives way first"},
    {"simulate", simulate, METH_VARARGS,
     "simulate(seq, nxt, sizes, capacity, res_samples, res_first, res_sizes, hit, keep[, admit]) -> "
     "(drop, after_samples, after_sizes)"},
    {"next_uses", next_uses, METH_VARARGS, "next_uses(seq, nsamples, out) -> None"},
    {"group_accesses", group_accesses, METH_VARARGS, "group_accesses(seq, home_local, ngroups, nthis, order, lseq, cuts, this_cuts) -> None"},
    {"group_by", group_by, METH_VARARGS, "group_by(keys, ngroups, order[, place]) -> None"},
    {"plan_homes", plan_homes, METH_VARARGS,
     "plan_homes(seq, nsamples, next_seq, home, sizes, capacities, res_samples, res_sizes, res_cuts, "
     "reader, hit, keep, late)"
     " -> (drops, drop_cuts, after, after_sizes, after_cuts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_belady", NULL, -1, methods};

PyMODINIT_FUNC PyInit__belady(void) { return PyModule_Create(&module); }
