/* starttrace._modelcore: the C core of the service's model build (optional; the Python code does
   the same).

   Not the traced program's hot path (that is `_hotpath.c`) but the service's: the first answer for
   a run of 100k spans waits for its waterfall model, and the passes of that build that touch every
   span one by one cost tens of thousands of instructions per span in Python. Each function here is
   one such loop, written over the slots of the objects it reads and writes (`run.Span`,
   `analysis.model.SpanNode`, `sources.lazy_attrs.LazyAttrs`) at the offsets their member
   descriptors name, and called from the Python function it replaces, which stays the reference and
   the fallback (tests/unit/test_span_nodes_c.py and tests/service/test_store_ingest.py compare
   the two on every field). Built by hatch_build.py with `_hotpath.c`; STARTTRACE_PURE_PYTHON does
   not apply (it is about the traced program). */

#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <string.h>
#include <stdint.h>
#include <limits.h>

/* ---- peek_attrs: the three hot attributes of a stored span ----------------------------------- */

/* Building the waterfall model asks every stored span for the same three attributes (sources/lazy_attrs.py, `peek_hot`), and in Python the
   byte searches for them cost ~20,000 instructions per span, a quarter of the build. This is the
   common case of `peek_hot`, the same rule: a key whose pattern is not in the bytes is missing;
   one that occurs once, as a short string value of a top-level `Span.attributes` entry, is that
   string; anything else is `unknown` (the Python code reads it, or decodes the whole list). */

/* The first occurrence of pat (m >= 2 bytes) in hay[from:n], or -1. Scans for the pattern's second
   byte (the key's length: rare in span bytes; the first, a 0x0A tag, is everywhere). */
static Py_ssize_t
find_from(const unsigned char *hay, Py_ssize_t n, Py_ssize_t from, const unsigned char *pat, Py_ssize_t m)
{
    Py_ssize_t last = n - m; /* the last place the pattern can start */
    Py_ssize_t i = from + 1; /* where its second byte is looked for */
    while (i <= last + 1) {
        const unsigned char *hit = memchr(hay + i, pat[1], (size_t)(last + 1 - i + 1));
        if (hit == NULL) {
            return -1;
        }
        i = hit - hay;
        if (hay[i - 1] == pat[0] && memcmp(hit + 1, pat + 2, (size_t)(m - 2)) == 0) {
            return i - 1;
        }
        i++;
    }
    return -1;
}

/* One pattern's value in b[0:n]: a new reference to the string, or to missing or unknown; NULL
   with an exception set only for an error other than invalid UTF-8. */
static PyObject *
peek_one(const unsigned char *b, Py_ssize_t n, const unsigned char *pat, Py_ssize_t plen, PyObject *missing,
         PyObject *unknown)
{
    Py_ssize_t at = find_from(b, n, 0, pat, plen);
    if (at < 0) {
        Py_INCREF(missing);
        return missing;
    }
    if (find_from(b, n, at + 1, pat, plen) < 0 && at + plen < n) {
        /* J <kv len> | pattern | <value len> 0x0A <string len> <string>, every length one byte */
        Py_ssize_t pos = at + plen;
        Py_ssize_t size = b[pos];
        if (size >= 2 && size < 0x80 && pos + 1 + size <= n && at >= 2 && b[at - 2] == 0x4A &&
            (Py_ssize_t)b[at - 1] == plen + 1 + size && b[pos + 1] == 0x0A && (Py_ssize_t)b[pos + 2] == size - 2) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)b + pos + 3, size - 2, NULL);
            if (text != NULL) {
                return text;
            }
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                return NULL;
            }
            PyErr_Clear(); /* unknown: the Python code finds it cannot be read either */
        }
    }
    Py_INCREF(unknown);
    return unknown;
}

static int
check_patterns(PyObject *patterns)
{
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(patterns); k++) {
        PyObject *p = PyTuple_GET_ITEM(patterns, k);
        if (!PyBytes_Check(p) || PyBytes_GET_SIZE(p) < 2) {
            PyErr_SetString(PyExc_TypeError, "peek_attrs: patterns must be bytes of two or more");
            return -1;
        }
    }
    return 0;
}

static PyObject *
peek_attrs(PyObject *module, PyObject *args)
{
    Py_buffer raw;
    PyObject *patterns, *missing, *unknown;
    if (!PyArg_ParseTuple(args, "y*O!OO:peek_attrs", &raw, &PyTuple_Type, &patterns, &missing, &unknown)) {
        return NULL;
    }
    PyObject *out = NULL;
    if (check_patterns(patterns) < 0 || (out = PyTuple_New(PyTuple_GET_SIZE(patterns))) == NULL) {
        PyBuffer_Release(&raw);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(patterns); k++) {
        PyObject *p = PyTuple_GET_ITEM(patterns, k);
        PyObject *value = peek_one(raw.buf, raw.len, (const unsigned char *)PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p),
                                   missing, unknown);
        if (value == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&raw);
            return NULL;
        }
        PyTuple_SET_ITEM(out, k, value);
    }
    PyBuffer_Release(&raw);
    return out;
}

/* ---- analysis/lanes.py: span nodes, tree links, effective ends, lane intervals ----------------- */

/* `analysis.lanes._span_nodes` and `_link_tree` touch every span's fields one by one (in Python
   ~21,000 instructions per span, a third of the build before this code); `_set_durations` and
   `_phase_intervals` run once per span too (the hotspot sums: `hotspot_top`, below). The Python functions stay the
   reference and the fallback; these do the same, step for step (tests/unit/test_span_nodes_c.py
   builds every model both ways and compares them). SpanNode's fields are written straight into its
   slots, at the offsets its member descriptors name (`NodeSlots`). */

enum { S_SPAN_ID, S_PARENT_ID, S_NAME, S_START_NS, S_END_NS, S_ATTRS, S_ERROR, S_THREAD, S_INSTANT, S_IN_PROGRESS, S_FIELDS };
static const char *const SPAN_FIELD_NAMES[S_FIELDS] = {
    "span_id", "parent_id", "name", "start_ns", "end_ns", "attrs", "error", "thread", "instant", "in_progress",
};
static PyObject *span_fields[S_FIELDS];
static PyObject *str_process, *str_startup;
static PyObject *str_import, *str_preload_phase, *str_other, *str_import_prefix, *str_preload_prefix;
static PyObject *str_spans, *str_index; /* Lane attributes */

/* The offset of slot `name` of `type` (a T_OBJECT_EX member descriptor of it or a base), or -1. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL) {
        return -1;
    }
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDescrObject *member = (PyMemberDescrObject *)descr;
        if (member->d_member->type == T_OBJECT_EX && !(member->d_member->flags & READONLY) &&
            PyType_IsSubtype(type, PyDescr_TYPE(member))) {
            offset = member->d_member->offset;
        }
    }
    Py_DECREF(descr);
    if (offset < 0) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
    }
    return offset;
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* Store a new reference (stolen) into a slot. */
static inline void
slot_set(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    SLOT(obj, offset) = value;
    Py_XDECREF(old);
}

static inline void
slot_set_borrowed(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    Py_INCREF(value);
    slot_set(obj, offset, value);
}

/* Every slot offset of a span node type (analysis.model.SpanNode), found once per type. */
typedef struct {
    PyTypeObject *type; /* a strong reference, once set */
    Py_ssize_t attrs, children, depth, duration, eff_end, end, error, id, idx, imports, in_progress, instant, lane, module, name, parent, parent_node, phase, pos, self_us, start, thread;
    /* the type's NO_CHILDREN: the one empty list every leaf shares (a strong reference; NULL: a
       list per node). Never appended to: link_tree gives a parent its own list first. */
    PyObject *no_children;
} NodeSlots;
static NodeSlots node_slots_cache;

static NodeSlots *
node_slots(PyObject *node_type)
{
    if (!PyType_Check(node_type)) {
        PyErr_SetString(PyExc_TypeError, "node_type must be a type");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)node_type;
    if (node_slots_cache.type == type) {
        return &node_slots_cache;
    }
    NodeSlots t;
    t.type = type;
    if ((t.attrs = slot_offset(type, "attrs")) < 0) {
        return NULL;
    }
    if ((t.children = slot_offset(type, "children")) < 0) {
        return NULL;
    }
    if ((t.depth = slot_offset(type, "depth")) < 0) {
        return NULL;
    }
    if ((t.duration = slot_offset(type, "duration")) < 0) {
        return NULL;
    }
    if ((t.eff_end = slot_offset(type, "eff_end")) < 0) {
        return NULL;
    }
    if ((t.end = slot_offset(type, "end")) < 0) {
        return NULL;
    }
    if ((t.error = slot_offset(type, "error")) < 0) {
        return NULL;
    }
    if ((t.id = slot_offset(type, "id")) < 0) {
        return NULL;
    }
    if ((t.imports = slot_offset(type, "imports")) < 0) {
        return NULL;
    }
    if ((t.in_progress = slot_offset(type, "in_progress")) < 0) {
        return NULL;
    }
    if ((t.instant = slot_offset(type, "instant")) < 0) {
        return NULL;
    }
    if ((t.lane = slot_offset(type, "lane")) < 0) {
        return NULL;
    }
    if ((t.module = slot_offset(type, "module")) < 0) {
        return NULL;
    }
    if ((t.name = slot_offset(type, "name")) < 0) {
        return NULL;
    }
    if ((t.parent = slot_offset(type, "parent")) < 0) {
        return NULL;
    }
    if ((t.parent_node = slot_offset(type, "parent_node")) < 0) {
        return NULL;
    }
    if ((t.phase = slot_offset(type, "phase")) < 0) {
        return NULL;
    }
    if ((t.pos = slot_offset(type, "pos")) < 0) {
        return NULL;
    }
    if ((t.idx = slot_offset(type, "idx")) < 0) {
        return NULL;
    }
    if ((t.self_us = slot_offset(type, "self_us")) < 0) {
        return NULL;
    }
    if ((t.start = slot_offset(type, "start")) < 0) {
        return NULL;
    }
    if ((t.thread = slot_offset(type, "thread")) < 0) {
        return NULL;
    }
    t.no_children = PyObject_GetAttrString(node_type, "NO_CHILDREN");
    if (t.no_children == NULL) {
        PyErr_Clear();
    } else if (!PyList_CheckExact(t.no_children) || PyList_GET_SIZE(t.no_children) != 0) {
        Py_CLEAR(t.no_children);
    }
    Py_INCREF(type);
    Py_XDECREF(node_slots_cache.type);
    Py_XDECREF(node_slots_cache.no_children);
    node_slots_cache = t;
    return &node_slots_cache;
}

typedef struct {
    NodeSlots *node;
    PyTypeObject *span_type; /* run.Span: its fields read from its slots */
    Py_ssize_t span_off[S_FIELDS];
    PyTypeObject *lazy_type; /* LazyAttrs */
    Py_ssize_t lazy_peeked, lazy_raw;
    PyObject *patterns, *keys, *missing, *unknown, *name_phases, *hot_values;
    PyObject *last_phase; /* the interned phase of the last node (a strong reference), or NULL */
} NodeBuild;

/* The phase a node keeps: `phase` interned, so that it is the very object of the names the
   analysis compares it with ("import", ...): `select` and the findings then match phases by
   identity (each span's phase otherwise is a str of its own, read from its stored bytes, and every
   comparison was a string compare). Spans in a row mostly share a phase: the last one is reused
   without a lookup. A new reference. */
static PyObject *
shared_phase(NodeBuild *nb, PyObject *phase)
{
    PyObject *last = nb->last_phase;
    if (last != NULL && (last == phase || (PyUnicode_GET_LENGTH(last) == PyUnicode_GET_LENGTH(phase) &&
                                           PyUnicode_KIND(last) == PyUnicode_KIND(phase) &&
                                           memcmp(PyUnicode_DATA(last), PyUnicode_DATA(phase),
                                                  (size_t)PyUnicode_GET_LENGTH(phase) * PyUnicode_KIND(phase)) == 0))) {
        Py_INCREF(last);
        return last;
    }
    Py_INCREF(phase);
    PyUnicode_InternInPlace(&phase);
    Py_INCREF(phase);
    Py_XSETREF(nb->last_phase, phase);
    return phase;
}

static int
node_build_init(NodeBuild *nb, PyObject *node_type, PyObject *span_type, PyObject *lazy_type)
{
    if (!PyType_Check(node_type) || !PyType_Check(span_type) || (lazy_type != Py_None && !PyType_Check(lazy_type))) {
        PyErr_SetString(PyExc_TypeError, "span_nodes: node_type, span_type and lazy_type must be types");
        return -1;
    }
    nb->span_type = (PyTypeObject *)span_type;
    for (int k = 0; k < S_FIELDS; k++) {
        if ((nb->span_off[k] = slot_offset(nb->span_type, SPAN_FIELD_NAMES[k])) < 0) {
            return -1;
        }
    }
    if ((nb->node = node_slots(node_type)) == NULL) {
        return -1;
    }
    nb->lazy_type = NULL;
    if (lazy_type == Py_None) {
        return 0;
    }
    nb->lazy_type = (PyTypeObject *)lazy_type;
    if ((nb->lazy_peeked = slot_offset(nb->lazy_type, "_peeked")) < 0 ||
        (nb->lazy_raw = slot_offset(nb->lazy_type, "_raw")) < 0) {
        return -1;
    }
    return 0;
}

/* The three hot values of `attrs` (new references into out[3]), as `run.hot_values` answers them. */
static int
hot_of(NodeBuild *nb, PyObject *attrs, PyObject **out)
{
    if (PyDict_CheckExact(attrs)) {
        for (int k = 0; k < 3; k++) {
            PyObject *v = PyDict_GetItemWithError(attrs, PyTuple_GET_ITEM(nb->keys, k));
            if (v == NULL && PyErr_Occurred()) {
                for (int j = 0; j < k; j++) {
                    Py_CLEAR(out[j]);
                }
                return -1;
            }
            out[k] = v == NULL ? Py_None : v;
            Py_INCREF(out[k]);
        }
        return 0;
    }
    if (nb->lazy_type != NULL && Py_IS_TYPE(attrs, nb->lazy_type)) {
        /* the common case of LazyAttrs.hot (its peek_hot, in one pass): nothing read yet, protobuf bytes */
        PyObject *peeked = SLOT(attrs, nb->lazy_peeked);
        PyObject *raw = SLOT(attrs, nb->lazy_raw);
        if (peeked != NULL && PyDict_CheckExact(peeked) && PyDict_GET_SIZE(peeked) == 0 && raw != NULL &&
            PyBytes_CheckExact(raw)) {
            PyObject *v[3] = {NULL, NULL, NULL};
            int known = 1;
            for (int k = 0; k < 3; k++) {
                PyObject *p = PyTuple_GET_ITEM(nb->patterns, k);
                v[k] = peek_one((const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw),
                                (const unsigned char *)PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p), nb->missing,
                                nb->unknown);
                if (v[k] == NULL) {
                    Py_XDECREF(v[0]);
                    Py_XDECREF(v[1]);
                    return -1;
                }
                known &= v[k] != nb->unknown;
            }
            if (known) {
                /* the values are the node's (phase, module, self time): not kept on the LazyAttrs
                   too (a dict per span); a later `get` of one reads it in place again */
                for (int k = 0; k < 3; k++) {
                    if (v[k] == nb->missing) {
                        Py_DECREF(v[k]);
                        Py_INCREF(Py_None);
                        v[k] = Py_None;
                    }
                    out[k] = v[k];
                }
                return 0;
            }
            for (int k = 0; k < 3; k++) {
                Py_DECREF(v[k]);
            }
            goto python;
        }
    }
python: {
    PyObject *got = PyObject_CallOneArg(nb->hot_values, attrs);
    if (got == NULL) {
        return -1;
    }
    if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 3) {
        Py_DECREF(got);
        PyErr_SetString(PyExc_TypeError, "hot_values must return a tuple of three");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        out[k] = PyTuple_GET_ITEM(got, k);
        Py_INCREF(out[k]);
    }
    Py_DECREF(got);
    return 0;
}
}

/* `analysis.phases.phase_by_name` of a str (new reference). */
static PyObject *
phase_by_name_c(NodeBuild *nb, PyObject *name)
{
    PyObject *known = PyDict_GetItemWithError(nb->name_phases, name);
    if (known == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (known != NULL) {
        int truth = PyObject_IsTrue(known);
        if (truth < 0) {
            return NULL;
        }
        if (truth) {
            Py_INCREF(known);
            return known;
        }
    }
    PyObject *phase = str_other;
    if (PyUnicode_Tailmatch(name, str_import_prefix, 0, PY_SSIZE_T_MAX, -1) == 1) {
        phase = str_import;
    } else if (PyUnicode_Tailmatch(name, str_preload_prefix, 0, PY_SSIZE_T_MAX, -1) == 1) {
        phase = str_preload_phase;
    }
    Py_INCREF(phase);
    return phase;
}

/* One SpanNode of `span` on `lane` (a new reference), or NULL. */
static PyObject *
make_node(NodeBuild *nb, PyObject *span, PyObject *lane)
{
    PyObject *f[S_FIELDS] = {NULL};
    PyObject *node = NULL, *hot[3] = {NULL, NULL, NULL};
    int exact = Py_IS_TYPE(span, nb->span_type);
    for (int k = 0; k < S_FIELDS; k++) {
        if (exact) {
            if ((f[k] = SLOT(span, nb->span_off[k])) == NULL) {
                PyErr_SetString(PyExc_AttributeError, SPAN_FIELD_NAMES[k]);
                goto done;
            }
            Py_INCREF(f[k]);
        } else if ((f[k] = PyObject_GetAttr(span, span_fields[k])) == NULL) {
            goto done;
        }
    }
    PyObject *name = f[S_NAME];
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "span_nodes: a span's name must be a str");
        goto done;
    }
    const NodeSlots *ns = nb->node;
    node = ns->type->tp_alloc(ns->type, 0);
    if (node == NULL) {
        goto done;
    }
    PyObject *children = ns->no_children != NULL ? Py_NewRef(ns->no_children) : PyList_New(0);
    if (children == NULL) {
        Py_CLEAR(node);
        goto done;
    }
    slot_set(node, ns->children, children);
    slot_set_borrowed(node, ns->parent_node, Py_None);
    slot_set_borrowed(node, ns->imports, Py_None);
    slot_set(node, ns->depth, PyLong_FromLong(0)); /* small ints: cannot fail */
    slot_set(node, ns->pos, PyLong_FromLong(0));
    slot_set_borrowed(node, ns->self_us, Py_None);
    slot_set_borrowed(node, ns->id, f[S_SPAN_ID]);
    slot_set_borrowed(node, ns->parent, f[S_PARENT_ID]);
    slot_set_borrowed(node, ns->name, name);
    PyObject *attrs = f[S_ATTRS];
    if (attrs == Py_None) {
        attrs = PyDict_New(); /* not `or`: keeps lazily decoded attrs undecoded */
        if (attrs == NULL) {
            Py_CLEAR(node);
            goto done;
        }
        slot_set(node, ns->attrs, attrs);
    } else {
        slot_set_borrowed(node, ns->attrs, attrs);
    }
    if (hot_of(nb, attrs, hot) < 0) {
        Py_CLEAR(node);
        goto done;
    }
    PyObject *phase = hot[0];
    if (PyUnicode_CheckExact(phase) && PyUnicode_GET_LENGTH(phase) > 0) {
        slot_set(node, ns->phase, shared_phase(nb, phase));
    } else {
        PyObject *by_name = phase_by_name_c(nb, name);
        if (by_name == NULL) {
            Py_CLEAR(node);
            goto done;
        }
        slot_set(node, ns->phase, by_name);
    }
    PyObject *mod = hot[1];
    if (PyUnicode_Check(mod)) {
        slot_set_borrowed(node, ns->module, mod);
    } else if (PyUnicode_Tailmatch(name, str_import_prefix, 0, PY_SSIZE_T_MAX, -1) == 1) {
        PyObject *tail = PyUnicode_Substring(name, 7, PyUnicode_GET_LENGTH(name));
        if (tail == NULL) {
            Py_CLEAR(node);
            goto done;
        }
        slot_set(node, ns->module, tail);
    } else {
        slot_set_borrowed(node, ns->module, Py_None);
    }
    PyObject *self_us = hot[2];
    if ((PyLong_Check(self_us) || PyFloat_Check(self_us)) && !PyBool_Check(self_us)) {
        slot_set_borrowed(node, ns->self_us, self_us);
    }
    slot_set_borrowed(node, ns->start, f[S_START_NS]);
    /* is_open = s.in_progress or s.end_ns is None */
    int truth = PyObject_IsTrue(f[S_IN_PROGRESS]);
    if (truth < 0) {
        Py_CLEAR(node);
        goto done;
    }
    PyObject *is_open = truth ? f[S_IN_PROGRESS] : (f[S_END_NS] == Py_None ? Py_True : Py_False);
    int open = truth || f[S_END_NS] == Py_None;
    slot_set_borrowed(node, ns->in_progress, is_open);
    slot_set_borrowed(node, ns->end, open ? Py_None : f[S_END_NS]);
    int instant = PyObject_IsTrue(f[S_INSTANT]);
    if (instant < 0) {
        Py_CLEAR(node);
        goto done;
    }
    slot_set_borrowed(node, ns->instant, instant && !open ? Py_True : Py_False);
    slot_set_borrowed(node, ns->error, f[S_ERROR]);
    slot_set_borrowed(node, ns->thread, f[S_THREAD]);
    slot_set_borrowed(node, ns->lane, lane);
done:
    for (int k = 0; k < 3; k++) {
        Py_XDECREF(hot[k]);
    }
    for (int k = 0; k < S_FIELDS; k++) {
        Py_XDECREF(f[k]);
    }
    return node;
}

/* The nodes as a new list sorted by start, stable (what `list.sort(key=start)` gives), sorted here
   on C integers; None when a start is not an int in [0, 2**63). */
typedef struct {
    long long start;
    Py_ssize_t index;
} StartIndex;

static int
start_index_order(const void *a, const void *b)
{
    const StartIndex *x = a, *y = b;
    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    return x->index < y->index ? -1 : (x->index > y->index);
}

static int as_time(PyObject *value, long long *out);

static PyObject *
sorted_by_start(PyObject *nodes, const NodeSlots *t)
{
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    StartIndex *order = PyMem_Malloc(sizeof(StartIndex) * (size_t)(count > 0 ? count : 1));
    if (order == NULL) {
        return PyErr_NoMemory();
    }
    int sorted = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *start = SLOT(PyList_GET_ITEM(nodes, i), t->start);
        if (start == NULL || !as_time(start, &order[i].start)) {
            PyMem_Free(order);
            Py_RETURN_NONE;
        }
        order[i].index = i;
        sorted &= i == 0 || order[i - 1].start <= order[i].start;
    }
    if (!sorted) {
        qsort(order, (size_t)count, sizeof(StartIndex), start_index_order);
    }
    PyObject *out = PyList_New(count);
    if (out != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *n = PyList_GET_ITEM(nodes, order[i].index);
            Py_INCREF(n);
            PyList_SET_ITEM(out, i, n);
        }
    }
    PyMem_Free(order);
    return out;
}

static PyObject *
span_nodes(PyObject *module, PyObject *args)
{
    PyObject *groups, *node_type, *span_type, *lazy_type;
    NodeBuild nb;
    if (!PyArg_ParseTuple(args, "O!OOO!O!OOOOO:span_nodes", &PyList_Type, &groups, &node_type, &span_type,
                          &PyTuple_Type, &nb.keys, &PyDict_Type, &nb.name_phases, &nb.hot_values, &lazy_type,
                          &nb.patterns, &nb.missing, &nb.unknown)) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(nb.keys) != 3 ||
        (lazy_type != Py_None && (!PyTuple_Check(nb.patterns) || PyTuple_GET_SIZE(nb.patterns) != 3))) {
        PyErr_SetString(PyExc_TypeError, "span_nodes: three keys, and three patterns with a lazy type");
        return NULL;
    }
    if (lazy_type != Py_None && check_patterns(nb.patterns) < 0) {
        return NULL;
    }
    nb.last_phase = NULL;
    if (node_build_init(&nb, node_type, span_type, lazy_type) < 0) {
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(groups); g++) {
        PyObject *group = PyList_GET_ITEM(groups, g);
        if (PyTuple_Check(group) && PyTuple_GET_SIZE(group) == 2 && PyList_Check(PyTuple_GET_ITEM(group, 1))) {
            total += PyList_GET_SIZE(PyTuple_GET_ITEM(group, 1));
        }
    }
    /* sized once: growing a dict of 100k+ entries step by step re-inserted them all ~twice */
#if PY_VERSION_HEX < 0x030D0000
    PyObject *nodes = PyList_New(0), *by_id = _PyDict_NewPresized(total);
#else /* no longer in the headers from 3.13 */
    PyObject *nodes = PyList_New(0), *by_id = PyDict_New();
    (void)total;
#endif
    if (nodes == NULL || by_id == NULL) {
        goto fail;
    }
    for (Py_ssize_t g = 0; g < PyList_GET_SIZE(groups); g++) {
        PyObject *group = PyList_GET_ITEM(groups, g);
        if (!PyTuple_Check(group) || PyTuple_GET_SIZE(group) != 2 || !PyList_Check(PyTuple_GET_ITEM(group, 1))) {
            PyErr_SetString(PyExc_TypeError, "span_nodes: groups are (lane, list of spans)");
            goto fail;
        }
        PyObject *lane = PyTuple_GET_ITEM(group, 0);
        PyObject *spans = PyTuple_GET_ITEM(group, 1);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
            PyObject *node = make_node(&nb, PyList_GET_ITEM(spans, i), lane);
            if (node == NULL) {
                goto fail;
            }
            if (PyDict_SetItem(by_id, SLOT(node, nb.node->id), node) < 0 || PyList_Append(nodes, node) < 0) {
                Py_DECREF(node);
                goto fail;
            }
            Py_DECREF(node);
        }
    }
    PyObject *sorted = sorted_by_start(nodes, nb.node);
    if (sorted == NULL) {
        goto fail;
    }
    PyObject *out = Py_BuildValue("(NOO)", sorted, by_id, sorted == Py_None ? Py_False : Py_True);
    if (sorted == Py_None && out != NULL) { /* not plain int64 starts: the nodes as made, sorted by the caller */
        Py_SETREF(out, Py_BuildValue("(OOO)", nodes, by_id, Py_False));
    }
    Py_DECREF(nodes);
    Py_DECREF(by_id);
    Py_XDECREF(nb.last_phase);
    return out;
fail:
    Py_XDECREF(nodes);
    Py_XDECREF(by_id);
    Py_XDECREF(nb.last_phase);
    return NULL;
}

static PyObject *
link_tree(PyObject *module, PyObject *args)
{
    PyObject *nodes, *by_id, *node_type;
    if (!PyArg_ParseTuple(args, "O!O!O:link_tree", &PyList_Type, &nodes, &PyDict_Type, &by_id, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!Py_IS_TYPE(PyList_GET_ITEM(nodes, i), t->type)) {
            PyErr_SetString(PyExc_TypeError, "link_tree: nodes must be of node_type");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        PyObject *pid = SLOT(n, t->parent);
        if (pid == NULL) {
            PyErr_SetString(PyExc_AttributeError, "parent");
            return NULL;
        }
        int truth = PyObject_IsTrue(pid);
        if (truth < 0) {
            return NULL;
        }
        if (!truth) {
            continue;
        }
        PyObject *parent = PyDict_GetItemWithError(by_id, pid);
        if (parent == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            continue;
        }
        if (parent == n) {
            continue;
        }
        slot_set_borrowed(n, t->parent_node, parent);
        if (Py_IS_TYPE(parent, t->type) && SLOT(parent, t->lane) == SLOT(n, t->lane)) {
            PyObject *children = SLOT(parent, t->children);
            if (children != NULL && children == t->no_children) { /* its first child: a list of its own */
                if ((children = PyList_New(0)) == NULL) {
                    return NULL;
                }
                slot_set(parent, t->children, children);
            }
            if (children == NULL || !PyList_Check(children) || PyList_Append(children, n) < 0) {
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_TypeError, "children must be a list");
                }
                return NULL;
            }
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        long depth = 0;
        PyObject *lane = SLOT(n, t->lane);
        PyObject *p = SLOT(n, t->parent_node);
        /* bounded: guards cycles */
        while (p != NULL && p != Py_None && Py_IS_TYPE(p, t->type) && SLOT(p, t->lane) == lane && depth < 10000) {
            depth++;
            p = SLOT(p, t->parent_node);
        }
        PyObject *value = PyLong_FromLong(depth);
        if (value == NULL) {
            return NULL;
        }
        slot_set(n, t->depth, value);
    }
    Py_RETURN_NONE;
}

/* The end used for every node, as `analysis.lanes._build` sets it: `t_eff` for a span in progress,
   else its end; never before its start (then `duration` 0). */
static PyObject *
set_durations(PyObject *module, PyObject *args)
{
    PyObject *nodes, *node_type, *t_eff;
    if (!PyArg_ParseTuple(args, "O!OO:set_durations", &PyList_Type, &nodes, &node_type, &t_eff)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        if (!Py_IS_TYPE(n, t->type) || SLOT(n, t->start) == NULL || SLOT(n, t->end) == NULL || SLOT(n, t->in_progress) == NULL) {
            PyErr_SetString(PyExc_TypeError, "set_durations: nodes must be built span nodes");
            Py_DECREF(zero);
            return NULL;
        }
        PyObject *start = SLOT(n, t->start);
        int open = PyObject_IsTrue(SLOT(n, t->in_progress));
        if (open < 0) {
            Py_DECREF(zero);
            return NULL;
        }
        PyObject *end = open ? t_eff : SLOT(n, t->end);
        int later = PyObject_RichCompareBool(end, start, Py_GT);
        if (later < 0) {
            Py_DECREF(zero);
            return NULL;
        }
        if (later) {
            PyObject *duration = PyNumber_Subtract(end, start);
            if (duration == NULL) {
                Py_DECREF(zero);
                return NULL;
            }
            slot_set_borrowed(n, t->eff_end, end);
            slot_set(n, t->duration, duration);
        } else {
            slot_set_borrowed(n, t->eff_end, start);
            slot_set_borrowed(n, t->duration, zero);
        }
    }
    Py_DECREF(zero);
    Py_RETURN_NONE;
}

/* `analysis.lanes._lane_facts`'s interval arithmetic over a lane's work spans (instants left out):
   per phase, in first-seen order, the union of its spans' [start, eff_end] (`phases.union_ns`),
   and the union of those intervals clipped to [low, high] (`phases.merge_intervals`, empty ones
   dropped). Done on 64-bit integers; None when a time is not an int in [0, 2**63) (the Python code
   then does it on Python ints), which also keeps every sum below 2**63. */
typedef struct {
    long long s, e;
} Interval;

static int
interval_order(const void *a, const void *b)
{
    const Interval *x = a, *y = b;
    if (x->s != y->s) {
        return x->s < y->s ? -1 : 1;
    }
    return x->e < y->e ? -1 : (x->e > y->e ? 1 : 0);
}

/* Sort and merge in place, as merge_intervals does (intervals with e < s skipped); the count left. */
static Py_ssize_t
merge_in_place(Interval *iv, Py_ssize_t n)
{
    qsort(iv, (size_t)n, sizeof(Interval), interval_order);
    Py_ssize_t out = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (iv[i].e < iv[i].s) {
            continue;
        }
        if (out > 0 && iv[i].s <= iv[out - 1].e) {
            if (iv[i].e > iv[out - 1].e) {
                iv[out - 1].e = iv[i].e;
            }
        } else {
            iv[out++] = iv[i];
        }
    }
    return out;
}

static int
as_time(PyObject *value, long long *out)
{
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = v;
    return v >= 0;
}

static PyObject *
phase_intervals(PyObject *module, PyObject *args)
{
    PyObject *work, *node_type, *low_obj, *high_obj;
    if (!PyArg_ParseTuple(args, "O!OOO:phase_intervals", &PyList_Type, &work, &node_type, &low_obj, &high_obj)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    long long low, high;
    if (!as_time(low_obj, &low) || !as_time(high_obj, &high)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t count = PyList_GET_SIZE(work);
    Interval *all = PyMem_Malloc(sizeof(Interval) * (size_t)(count > 0 ? count : 1) * 2);
    Py_ssize_t *phase_of = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(count > 0 ? count : 1));
    PyObject *index = PyDict_New(), *result = NULL, *phases = NULL, *covered = NULL;
    if (all == NULL || phase_of == NULL || index == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Interval *clipped = all + count;
    Py_ssize_t used = 0, n_clipped = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *n = PyList_GET_ITEM(work, i);
        if (!Py_IS_TYPE(n, t->type) || SLOT(n, t->start) == NULL || SLOT(n, t->eff_end) == NULL || SLOT(n, t->phase) == NULL ||
            SLOT(n, t->instant) == NULL) {
            PyErr_SetString(PyExc_TypeError, "phase_intervals: work must be built span nodes");
            goto done;
        }
        int instant = PyObject_IsTrue(SLOT(n, t->instant));
        if (instant < 0) {
            goto done;
        }
        if (instant) {
            continue;
        }
        long long s0, e0;
        if (!as_time(SLOT(n, t->start), &s0) || !as_time(SLOT(n, t->eff_end), &e0)) {
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        PyObject *phase = SLOT(n, t->phase);
        PyObject *at = PyDict_GetItemWithError(index, phase);
        Py_ssize_t k;
        if (at == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            k = PyDict_GET_SIZE(index);
            PyObject *key = PyLong_FromSsize_t(k);
            if (key == NULL || PyDict_SetItem(index, phase, key) < 0) {
                Py_XDECREF(key);
                goto done;
            }
            Py_DECREF(key);
        } else {
            k = PyLong_AsSsize_t(at);
        }
        all[used].s = s0;
        all[used].e = e0;
        phase_of[used++] = k;
        if (e0 > low) {
            clipped[n_clipped].s = s0 > low ? s0 : low;
            clipped[n_clipped++].e = e0 < high ? e0 : high;
        }
    }
    /* per phase: its intervals gathered (stable by phase index), merged, summed */
    Py_ssize_t n_phases = PyDict_GET_SIZE(index);
    phases = PyDict_New();
    if (phases == NULL) {
        goto done;
    }
    Interval *group = PyMem_Malloc(sizeof(Interval) * (size_t)(used > 0 ? used : 1));
    if (group == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(index, &pos, &key, &value)) { /* first-seen order */
        Py_ssize_t k = PyLong_AsSsize_t(value), m = 0;
        for (Py_ssize_t i = 0; i < used; i++) {
            if (phase_of[i] == k) {
                group[m++] = all[i];
            }
        }
        Py_ssize_t merged = merge_in_place(group, m);
        long long total = 0;
        for (Py_ssize_t i = 0; i < merged; i++) {
            total += group[i].e - group[i].s;
        }
        PyObject *ns = PyLong_FromLongLong(total);
        if (ns == NULL || PyDict_SetItem(phases, key, ns) < 0) {
            Py_XDECREF(ns);
            PyMem_Free(group);
            goto done;
        }
        Py_DECREF(ns);
    }
    PyMem_Free(group);
    (void)n_phases;
    Py_ssize_t merged = merge_in_place(clipped, n_clipped);
    covered = PyList_New(0);
    if (covered == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < merged; i++) {
        if (clipped[i].e > clipped[i].s) {
            PyObject *pair = Py_BuildValue("(LL)", clipped[i].s, clipped[i].e);
            if (pair == NULL || PyList_Append(covered, pair) < 0) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
        }
    }
    result = PyTuple_Pack(2, phases, covered);
done:
    PyMem_Free(all);
    PyMem_Free(phase_of);
    Py_XDECREF(index);
    Py_XDECREF(phases);
    Py_XDECREF(covered);
    return result;
}

/* ---- import trees, select, step candidates (analysis/findings, model.py, critical_path.py) ---- */

/* `import_children`, `subtree_modules`, `top_imports` and `covered_nodes` walk the import trees of
   every rank several times over (the `preload` findings: ~40 % of the model build in Python). The
   same walks, over the span nodes' slots; the Python functions stay the reference and fallback. */

/* a == b for two phase names (str); -1 with an exception when they cannot be compared */
static inline int
same_str(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b)) {
        if (PyUnicode_CHECK_INTERNED(a) && PyUnicode_CHECK_INTERNED(b)) {
            return 0; /* two interned strings are equal only when they are one (span nodes' phases are) */
        }
        return PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) && PyUnicode_Compare(a, b) == 0;
    }
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

static inline PyObject *
node_slot(PyObject *n, Py_ssize_t offset, const char *name)
{
    PyObject *v = SLOT(n, offset);
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "a span node has no %s yet", name);
    }
    return v;
}

/* node.imports, computed once (a borrowed reference), as findings.common.import_children */
static PyObject *
imports_of(NodeSlots *t, PyObject *node)
{
    if (!Py_IS_TYPE(node, t->type)) {
        PyErr_SetString(PyExc_TypeError, "import trees: not a span node");
        return NULL;
    }
    PyObject *cached = SLOT(node, t->imports);
    if (cached != NULL && cached != Py_None) {
        return cached;
    }
    PyObject *children = node_slot(node, t->children, "children");
    if (children == NULL) {
        return NULL;
    }
    if (!PyList_Check(children)) {
        PyErr_SetString(PyExc_TypeError, "a span node's children must be a list");
        return NULL;
    }
    /* children that are all imports (none, mostly) are its imports: that very list, not a copy */
    Py_ssize_t imports = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(children); i++) {
        PyObject *child = PyList_GET_ITEM(children, i);
        PyObject *phase = Py_IS_TYPE(child, t->type) ? SLOT(child, t->phase) : NULL;
        if (phase == NULL) {
            break; /* the loop below says what is wrong */
        }
        int is_import = same_str(phase, str_import);
        if (is_import < 0) {
            return NULL;
        }
        if (!is_import) {
            break;
        }
        imports++;
    }
    if (imports == PyList_GET_SIZE(children)) {
        slot_set_borrowed(node, t->imports, children);
        return children;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    slot_set(node, t->imports, out); /* first, as the Python code: a cycle finds it (being filled) */
    if (Py_EnterRecursiveCall(" in import_children")) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(children); i++) {
        PyObject *child = PyList_GET_ITEM(children, i);
        PyObject *phase = Py_IS_TYPE(child, t->type) ? node_slot(child, t->phase, "phase") : NULL;
        if (phase == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "import trees: not a span node");
            }
            Py_LeaveRecursiveCall();
            return NULL;
        }
        int is_import = same_str(phase, str_import);
        if (is_import < 0) {
            Py_LeaveRecursiveCall();
            return NULL;
        }
        if (is_import) {
            if (PyList_Append(out, child) < 0) {
                Py_LeaveRecursiveCall();
                return NULL;
            }
            continue;
        }
        int structural = same_str(phase, str_process);
        if (structural == 0) {
            structural = same_str(phase, str_startup);
        }
        if (structural < 0) {
            Py_LeaveRecursiveCall();
            return NULL;
        }
        if (!structural) {
            PyObject *inner = imports_of(t, child);
            /* extended by itself (a cycle), the list is copied first, as by list.extend */
            Py_ssize_t end = PyList_GET_SIZE(out);
            if (inner == NULL || PyList_SetSlice(out, end, end, inner) < 0) {
                Py_LeaveRecursiveCall();
                return NULL;
            }
        }
    }
    Py_LeaveRecursiveCall();
    return out;
}

static PyObject *
import_children_c(PyObject *module, PyObject *args)
{
    PyObject *node, *node_type;
    if (!PyArg_ParseTuple(args, "OO:import_children", &node, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    PyObject *out = t == NULL ? NULL : imports_of(t, node);
    Py_XINCREF(out);
    return out;
}

/* A growable stack of borrowed node references (the nodes are held by the model meanwhile). */
typedef struct {
    PyObject **items;
    Py_ssize_t size, cap;
} Stack;

static int
stack_push_all(Stack *st, PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (st->size + n > st->cap) {
        Py_ssize_t cap = (st->size + n) * 2 + 16;
        PyObject **items = PyMem_Realloc(st->items, sizeof(PyObject *) * (size_t)cap);
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        st->items = items;
        st->cap = cap;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        st->items[st->size++] = PyList_GET_ITEM(list, i);
    }
    return 0;
}

/* The imports on `st` and every import inside them: their modules added to `mods` (a set, or a
   frozenset nobody else holds yet); -1 with an exception (`who` names the caller). */
static int
add_subtree_modules(NodeSlots *t, Stack *st, PyObject *mods, const char *who)
{
    while (st->size > 0) {
        PyObject *n = st->items[--st->size];
        PyObject *mod = Py_IS_TYPE(n, t->type) ? node_slot(n, t->module, "module") : NULL;
        if (mod == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "%s: not a span node", who);
            }
            return -1;
        }
        int truth = PyObject_IsTrue(mod);
        if (truth < 0 || (truth && PySet_Add(mods, mod) < 0)) {
            return -1;
        }
        PyObject *inner = imports_of(t, n);
        if (inner == NULL || stack_push_all(st, inner) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
subtree_modules_c(PyObject *module, PyObject *args)
{
    PyObject *node, *memo, *node_type;
    if (!PyArg_ParseTuple(args, "OO!O:subtree_modules", &node, &PyDict_Type, &memo, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    if (!Py_IS_TYPE(node, t->type) || node_slot(node, t->id, "id") == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "subtree_modules: not a span node");
        }
        return NULL;
    }
    PyObject *key = SLOT(node, t->id);
    PyObject *got = PyDict_GetItemWithError(memo, key);
    if (got != NULL && got != Py_None) {
        Py_INCREF(got);
        return got;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    /* filled while nobody else has it, as PySet_Add allows for a brand-new frozenset: no copy */
    PyObject *mods = PyFrozenSet_New(NULL);
    Stack st = {NULL, 0, 0};
    if (mods == NULL || (st.items = PyMem_Malloc(sizeof(PyObject *) * 16)) == NULL) {
        Py_XDECREF(mods);
        return mods == NULL ? NULL : PyErr_NoMemory();
    }
    st.cap = 16;
    st.items[st.size++] = node;
    PyObject *result = NULL;
    if (add_subtree_modules(t, &st, mods, "subtree_modules") == 0 && PyDict_SetItem(memo, key, mods) == 0) {
        result = Py_NewRef(mods);
    }
    PyMem_Free(st.items);
    Py_DECREF(mods);
    return result;
}

/* findings.common.paid_modules: the modules of every import under `roots` (themselves included),
   one set for all of them: what a rank paid for, counted once per rank by the preload findings
   (a frozenset per root, then their union, built each module's entry twice). */
static PyObject *
paid_modules_c(PyObject *module, PyObject *args)
{
    PyObject *roots, *node_type;
    if (!PyArg_ParseTuple(args, "O!O:paid_modules", &PyList_Type, &roots, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    PyObject *mods = PySet_New(NULL);
    Stack st = {NULL, 0, 0};
    if (mods == NULL || (st.items = PyMem_Malloc(sizeof(PyObject *) * 16)) == NULL) {
        Py_XDECREF(mods);
        return mods == NULL ? NULL : PyErr_NoMemory();
    }
    st.cap = 16;
    if (stack_push_all(&st, roots) < 0 || add_subtree_modules(t, &st, mods, "paid_modules") < 0) {
        Py_CLEAR(mods);
    }
    PyMem_Free(st.items);
    return mods;
}

/* findings.common.top_imports over a lane's spans: imports no other import of the lane encloses
   (completed, started before `until` unless it is None). */
static PyObject *
top_imports_c(PyObject *module, PyObject *args)
{
    PyObject *spans, *until, *node_type;
    if (!PyArg_ParseTuple(args, "O!OO:top_imports", &PyList_Type, &spans, &until, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    PyObject *out = t == NULL ? NULL : PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
        PyObject *n = PyList_GET_ITEM(spans, i);
        if (!Py_IS_TYPE(n, t->type) || SLOT(n, t->phase) == NULL || SLOT(n, t->in_progress) == NULL ||
            SLOT(n, t->start) == NULL || SLOT(n, t->parent_node) == NULL || SLOT(n, t->lane) == NULL) {
            PyErr_SetString(PyExc_TypeError, "top_imports: spans must be built span nodes");
            goto fail;
        }
        int is_import = same_str(SLOT(n, t->phase), str_import);
        if (is_import <= 0) {
            if (is_import < 0) {
                goto fail;
            }
            continue;
        }
        int open = PyObject_IsTrue(SLOT(n, t->in_progress));
        if (open != 0) {
            if (open < 0) {
                goto fail;
            }
            continue;
        }
        if (until != Py_None) {
            int late = PyObject_RichCompareBool(SLOT(n, t->start), until, Py_GE);
            if (late != 0) {
                if (late < 0) {
                    goto fail;
                }
                continue;
            }
        }
        PyObject *lane = SLOT(n, t->lane);
        PyObject *p = SLOT(n, t->parent_node);
        int enclosed = 0;
        for (long steps = 0; p != Py_None; steps++) {
            if (!Py_IS_TYPE(p, t->type) || SLOT(p, t->lane) == NULL || SLOT(p, t->phase) == NULL ||
                SLOT(p, t->parent_node) == NULL) {
                PyErr_SetString(PyExc_TypeError, "top_imports: a parent is not a built span node");
                goto fail;
            }
            int same_lane = SLOT(p, t->lane) == lane ? 1 : PyObject_RichCompareBool(SLOT(p, t->lane), lane, Py_EQ);
            if (same_lane < 0) {
                goto fail;
            }
            if (!same_lane) {
                break;
            }
            int parent_import = same_str(SLOT(p, t->phase), str_import);
            if (parent_import < 0) {
                goto fail;
            }
            if (parent_import || steps >= 10000) { /* bounded: guards cycles (then: enclosed) */
                enclosed = 1;
                break;
            }
            p = SLOT(p, t->parent_node);
        }
        if (!enclosed && PyList_Append(out, n) < 0) {
            goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* findings.preload.covered_nodes's walk: the outermost nodes under `roots` whose module is in `covered` */
static PyObject *
covered_nodes_c(PyObject *module, PyObject *args)
{
    PyObject *roots, *covered, *node_type;
    if (!PyArg_ParseTuple(args, "O!OO:covered_nodes", &PyList_Type, &roots, &covered, &node_type)) {
        return NULL;
    }
    if (!PyAnySet_Check(covered)) {
        PyErr_SetString(PyExc_TypeError, "covered_nodes: covered must be a set");
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    PyObject *out = t == NULL ? NULL : PyList_New(0);
    Stack st = {NULL, 0, 0};
    if (out == NULL || stack_push_all(&st, roots) < 0) {
        Py_XDECREF(out);
        PyMem_Free(st.items);
        return NULL;
    }
    while (st.size > 0) {
        PyObject *n = st.items[--st.size];
        PyObject *mod = Py_IS_TYPE(n, t->type) ? node_slot(n, t->module, "module") : NULL;
        if (mod == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "covered_nodes: not a span node");
            }
            goto fail;
        }
        int in = PySet_Contains(covered, mod);
        if (in < 0) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                goto fail;
            }
            PyErr_Clear(); /* an unhashable module is in no set */
            in = 0;
        }
        if (in) {
            if (PyList_Append(out, n) < 0) {
                goto fail;
            }
            continue;
        }
        PyObject *inner = imports_of(t, n);
        if (inner == NULL || stack_push_all(&st, inner) < 0) {
            goto fail;
        }
    }
    PyMem_Free(st.items);
    return out;
fail:
    PyMem_Free(st.items);
    Py_DECREF(out);
    return NULL;
}

/* findings.preload.covering's walk over one rank's import trees: from each root down, a node whose
   module is in `allowed` and that did not fail is picked (and not walked into); a node whose module
   is in `flagged` is noted; every other node is walked into. Returns (picked, noted), in walk order. */
static PyObject *
pick_walk(PyObject *module, PyObject *args)
{
    PyObject *roots, *allowed, *flagged, *node_type;
    if (!PyArg_ParseTuple(args, "O!OOO:pick_walk", &PyList_Type, &roots, &allowed, &flagged, &node_type)) {
        return NULL;
    }
    if (!PyAnySet_Check(allowed) || !PyAnySet_Check(flagged)) {
        PyErr_SetString(PyExc_TypeError, "pick_walk: allowed and flagged must be sets");
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    PyObject *picked = PyList_New(0), *noted = PyList_New(0), *result = NULL;
    Stack st = {NULL, 0, 0};
    if (picked == NULL || noted == NULL || stack_push_all(&st, roots) < 0) {
        goto done;
    }
    while (st.size > 0) {
        PyObject *n = st.items[--st.size];
        PyObject *mod = Py_IS_TYPE(n, t->type) ? node_slot(n, t->module, "module") : NULL;
        PyObject *error = mod == NULL ? NULL : node_slot(n, t->error, "error");
        if (error == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "pick_walk: not a span node");
            }
            goto done;
        }
        int in = mod == Py_None ? 0 : PySet_Contains(allowed, mod);
        if (in < 0) {
            goto done;
        }
        if (in) {
            int failed = PyObject_IsTrue(error);
            if (failed < 0) {
                goto done;
            }
            if (!failed) {
                if (PyList_Append(picked, n) < 0) {
                    goto done;
                }
                continue;
            }
        }
        int note = mod == Py_None ? 0 : PySet_Contains(flagged, mod);
        if (note < 0 || (note && PyList_Append(noted, n) < 0)) {
            goto done;
        }
        PyObject *inner = imports_of(t, n);
        if (inner == NULL || stack_push_all(&st, inner) < 0) {
            goto done;
        }
    }
    result = PyTuple_Pack(2, picked, noted);
done:
    PyMem_Free(st.items);
    Py_XDECREF(picked);
    Py_XDECREF(noted);
    return result;
}

/* analysis.model.select: the nodes whose phase is one of `phases` or whose name is one of `names`
   (tuples), or with `keep` false all the others; in their order. */
static int
in_names(PyObject *value, PyObject *names)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        int eq = same_str(value, PyTuple_GET_ITEM(names, i));
        if (eq != 0) {
            return eq;
        }
    }
    return 0;
}

static PyObject *
select_c(PyObject *module, PyObject *args)
{
    PyObject *spans, *node_type, *phases, *names;
    int keep;
    if (!PyArg_ParseTuple(args, "O!OO!O!p:select", &PyList_Type, &spans, &node_type, &PyTuple_Type, &phases,
                          &PyTuple_Type, &names, &keep)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    PyObject *out = t == NULL ? NULL : PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
        PyObject *n = PyList_GET_ITEM(spans, i);
        if (!Py_IS_TYPE(n, t->type) || SLOT(n, t->phase) == NULL || SLOT(n, t->name) == NULL) {
            PyErr_SetString(PyExc_TypeError, "select: spans must be built span nodes");
            Py_DECREF(out);
            return NULL;
        }
        int hit = in_names(SLOT(n, t->phase), phases);
        if (hit == 0) {
            hit = in_names(SLOT(n, t->name), names);
        }
        if (hit < 0) {
            Py_DECREF(out);
            return NULL;
        }
        if (hit == keep && PyList_Append(out, n) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* critical_path._candidates for one lane: the spans that can be steps (not `proc`, no structural
   phase, not instant, duration > 0), ordered by end, the longest first among equal ends, then in
   lane order (what two stable sorts give: by duration descending, then by end); and their ends.
   None when a time is not an int in [0, 2**63) (the Python code then does it). */
typedef struct {
    long long end, duration;
    Py_ssize_t index;
    PyObject *node;
} Candidate;

static int
candidate_order(const void *a, const void *b)
{
    const Candidate *x = a, *y = b;
    if (x->end != y->end) {
        return x->end < y->end ? -1 : 1;
    }
    if (x->duration != y->duration) {
        return x->duration > y->duration ? -1 : 1;
    }
    return x->index < y->index ? -1 : (x->index > y->index ? 1 : 0);
}

static PyObject *
step_candidates(PyObject *module, PyObject *args)
{
    PyObject *spans, *proc, *node_type, *structural;
    if (!PyArg_ParseTuple(args, "O!OOO!:step_candidates", &PyList_Type, &spans, &proc, &node_type, &PyTuple_Type,
                          &structural)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(spans), used = 0;
    Candidate *c = PyMem_Malloc(sizeof(Candidate) * (size_t)(count > 0 ? count : 1));
    if (c == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *result = NULL, *cand = NULL, *ends = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *n = PyList_GET_ITEM(spans, i);
        if (n == proc) {
            continue;
        }
        if (!Py_IS_TYPE(n, t->type) || SLOT(n, t->phase) == NULL || SLOT(n, t->instant) == NULL ||
            SLOT(n, t->duration) == NULL || SLOT(n, t->eff_end) == NULL) {
            PyErr_SetString(PyExc_TypeError, "step_candidates: spans must be built span nodes");
            goto done;
        }
        int skip = in_names(SLOT(n, t->phase), structural);
        if (skip == 0) {
            skip = PyObject_IsTrue(SLOT(n, t->instant));
        }
        if (skip != 0) {
            if (skip < 0) {
                goto done;
            }
            continue;
        }
        long long duration, end;
        if (!PyLong_CheckExact(SLOT(n, t->duration))) { /* the Python code compares what it is */
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        int overflow = 0;
        duration = PyLong_AsLongLongAndOverflow(SLOT(n, t->duration), &overflow);
        if (overflow || (duration == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        if (duration <= 0) {
            continue;
        }
        if (!as_time(SLOT(n, t->eff_end), &end)) {
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        c[used].end = end;
        c[used].duration = duration;
        c[used].index = i;
        c[used++].node = n;
    }
    qsort(c, (size_t)used, sizeof(Candidate), candidate_order);
    cand = PyList_New(used);
    ends = PyList_New(used);
    if (cand == NULL || ends == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < used; i++) {
        Py_INCREF(c[i].node);
        PyList_SET_ITEM(cand, i, c[i].node);
        PyObject *end = SLOT(c[i].node, t->eff_end);
        Py_INCREF(end);
        PyList_SET_ITEM(ends, i, end);
    }
    result = PyTuple_Pack(2, cand, ends);
done:
    PyMem_Free(c);
    Py_XDECREF(cand);
    Py_XDECREF(ends);
    return result;
}

/* ---- spans_from_rows: the store's rows as the run type ------------------------------------- */

/* `sources.store.run_from_rows`'s loop over one lane's stored rows (SpanTuple: trace, span id,
   parent, name, start, end, in_progress, instant, attribute bytes or text, error, thread): one
   `run.Span` per row, its attributes a `LazyAttrs(raw, decode)` for non-empty bytes, else what
   `fallback(raw)` makes of them; and the indices of the rows whose raw attributes hold `marker`
   (bytes) or `text_marker` (text), when `linked` (the Python code then reads their link). */
static PyObject *
spans_from_rows(PyObject *module, PyObject *args)
{
    PyObject *rows, *span_type, *lazy_type, *decode, *fallback, *marker, *text_marker;
    int linked;
    if (!PyArg_ParseTuple(args, "O!OOOOSUp:spans_from_rows", &PyList_Type, &rows, &span_type, &lazy_type, &decode,
                          &fallback, &marker, &text_marker, &linked)) {
        return NULL;
    }
    if (!PyType_Check(span_type) || !PyType_Check(lazy_type) ||
        !PyType_IsSubtype((PyTypeObject *)lazy_type, &PyDict_Type)) {
        PyErr_SetString(PyExc_TypeError, "spans_from_rows: span_type, and lazy_type a dict subclass");
        return NULL;
    }
    PyTypeObject *stype = (PyTypeObject *)span_type, *ltype = (PyTypeObject *)lazy_type;
    static const char *const names[] = {"span_id", "parent_id", "name", "start_ns", "end_ns", "attrs",
                                        "error", "thread", "instant", "in_progress", "links"};
    Py_ssize_t off[11];
    for (int k = 0; k < 11; k++) {
        if ((off[k] = slot_offset(stype, names[k])) < 0) {
            return NULL;
        }
    }
    Py_ssize_t o_raw = slot_offset(ltype, "_raw"), o_decode = slot_offset(ltype, "_decode");
    Py_ssize_t o_peeked = slot_offset(ltype, "_peeked");
    if (o_raw < 0 || o_decode < 0 || o_peeked < 0) {
        return NULL;
    }
    /* LazyAttrs' one shared empty `_peeked` (sources.lazy_attrs), else a dict per span */
    PyObject *nothing_peeked = PyObject_GetAttrString((PyObject *)ltype, "_nothing_peeked");
    if (nothing_peeked == NULL) {
        PyErr_Clear();
    } else if (!PyDict_CheckExact(nothing_peeked)) {
        Py_CLEAR(nothing_peeked);
    }
    const char *mark = PyBytes_AS_STRING(marker);
    Py_ssize_t mark_len = PyBytes_GET_SIZE(marker);
    PyObject *spans = PyList_New(PyList_GET_SIZE(rows)), *marked = PyList_New(0), *no_args = PyTuple_New(0);
    if (spans == NULL || marked == NULL || no_args == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *r = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 11) {
            PyErr_SetString(PyExc_ValueError, "spans_from_rows: rows are span tuples");
            goto fail;
        }
        PyObject *raw = PyTuple_GET_ITEM(r, 8);
        PyObject *attrs;
        int is_bytes = PyBytes_CheckExact(raw) && PyBytes_GET_SIZE(raw) > 0;
        if (is_bytes) {
            attrs = ltype->tp_new(ltype, no_args, NULL);
            PyObject *peeked = attrs == NULL ? NULL : nothing_peeked != NULL ? Py_NewRef(nothing_peeked) : PyDict_New();
            if (peeked == NULL) {
                Py_XDECREF(attrs);
                goto fail;
            }
            slot_set_borrowed(attrs, o_raw, raw);
            slot_set_borrowed(attrs, o_decode, decode);
            slot_set(attrs, o_peeked, peeked);
        } else if ((attrs = PyObject_CallOneArg(fallback, raw)) == NULL) {
            goto fail;
        }
        int in_progress = PyObject_IsTrue(PyTuple_GET_ITEM(r, 6));
        int instant = in_progress < 0 ? -1 : PyObject_IsTrue(PyTuple_GET_ITEM(r, 7));
        PyObject *span = instant < 0 ? NULL : stype->tp_alloc(stype, 0);
        if (span == NULL) {
            Py_DECREF(attrs);
            goto fail;
        }
        slot_set_borrowed(span, off[0], PyTuple_GET_ITEM(r, 1));
        slot_set_borrowed(span, off[1], PyTuple_GET_ITEM(r, 2));
        slot_set_borrowed(span, off[2], PyTuple_GET_ITEM(r, 3));
        slot_set_borrowed(span, off[3], PyTuple_GET_ITEM(r, 4));
        slot_set_borrowed(span, off[4], PyTuple_GET_ITEM(r, 5));
        slot_set(span, off[5], attrs);
        slot_set_borrowed(span, off[6], PyTuple_GET_ITEM(r, 9));
        slot_set_borrowed(span, off[7], PyTuple_GET_ITEM(r, 10));
        slot_set_borrowed(span, off[8], instant ? Py_True : Py_False);
        slot_set_borrowed(span, off[9], in_progress ? Py_True : Py_False);
        slot_set_borrowed(span, off[10], no_args); /* links: the shared empty tuple (run.Span) */
        PyList_SET_ITEM(spans, i, span);
        if (!linked) {
            continue;
        }
        int found = 0;
        if (PyBytes_Check(raw)) {
            found = PyBytes_GET_SIZE(raw) >= mark_len &&
                    memmem(PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw), mark, (size_t)mark_len) != NULL;
        } else if (PyUnicode_Check(raw) && PyUnicode_GET_LENGTH(raw) > 0) {
            Py_ssize_t at = PyUnicode_Find(raw, text_marker, 0, PY_SSIZE_T_MAX, 1);
            if (at == -2) {
                goto fail;
            }
            found = at >= 0;
        }
        if (found) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(marked, index) < 0) {
                Py_XDECREF(index);
                goto fail;
            }
            Py_DECREF(index);
        }
    }
    Py_DECREF(no_args);
    Py_XDECREF(nothing_peeked);
    PyObject *out = PyTuple_Pack(2, spans, marked);
    Py_DECREF(spans);
    Py_DECREF(marked);
    return out;
fail:
    Py_XDECREF(spans); /* its empty items are NULL: list_dealloc skips them */
    Py_XDECREF(marked);
    Py_XDECREF(no_args);
    Py_XDECREF(nothing_peeked);
    return NULL;
}

/* `analysis.lanes.import_hotspots`'s sums and its cut in one pass, with no Python object per
   module: per module (`n.module or n.name`) of the import spans, its cumulative and self ns and
   import count as C integers and its lanes as bits, in an open-addressing table keyed by the
   module's hash. Returns (module, [cumulative ns, self ns, set of lane indices, count]) for every
   module whose cumulative time is at least the `limit`-th longest (all of them when there are no
   more than `limit`; none for a limit <= 0), unordered: what `import_hotspots` keeps of
   `lanes._hotspot_sums`' dict before it sorts. None when a value is not a plain int in int64 (or a
   float self time), or a lane is not an index below `lanes`: the Python sums then do it. A synthetic run
   with a module per import span made the dict's list and set per module half of the old pass. */
typedef struct {
    PyObject *mod; /* borrowed: the nodes keep it */
    Py_hash_t hash;
    long long cum, own, count;
} HotEntry;

typedef struct {
    HotEntry *entries;
    uint64_t *bits; /* `words` per entry */
    Py_ssize_t *table; /* entry index + 1; 0: empty */
    Py_ssize_t used, cap_entries, mask, words;
} HotTable;

static int
hot_grow_table(HotTable *h)
{
    Py_ssize_t size = (h->mask + 1) * 2;
    Py_ssize_t *table = PyMem_Calloc((size_t)size, sizeof(Py_ssize_t));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t e = 0; e < h->used; e++) {
        Py_ssize_t slot = (Py_ssize_t)((size_t)h->entries[e].hash & (size_t)(size - 1));
        while (table[slot] != 0) {
            slot = (slot + 1) & (size - 1);
        }
        table[slot] = e + 1;
    }
    PyMem_Free(h->table);
    h->table = table;
    h->mask = size - 1;
    return 0;
}

/* the entry of `mod` (added when new); -1 with an exception */
static Py_ssize_t
hot_entry(HotTable *h, PyObject *mod)
{
    Py_hash_t hash = PyObject_Hash(mod);
    if (hash == -1) {
        return -1;
    }
    Py_ssize_t slot = (Py_ssize_t)((size_t)hash & (size_t)h->mask);
    for (;;) {
        Py_ssize_t at = h->table[slot];
        if (at == 0) {
            break;
        }
        HotEntry *e = &h->entries[at - 1];
        if (e->hash == hash) {
            int eq = same_str(e->mod, mod);
            if (eq < 0) {
                return -1;
            }
            if (eq) {
                return at - 1;
            }
        }
        slot = (slot + 1) & h->mask;
    }
    if (h->used == h->cap_entries) {
        Py_ssize_t cap = h->cap_entries * 2;
        HotEntry *entries = PyMem_Realloc(h->entries, sizeof(HotEntry) * (size_t)cap);
        if (entries == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->entries = entries;
        uint64_t *bits = PyMem_Realloc(h->bits, sizeof(uint64_t) * (size_t)(cap * h->words));
        if (bits == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->bits = bits;
        h->cap_entries = cap;
    }
    Py_ssize_t e = h->used++;
    h->entries[e] = (HotEntry){mod, hash, 0, 0, 0};
    memset(&h->bits[e * h->words], 0, sizeof(uint64_t) * (size_t)h->words);
    h->table[slot] = e + 1;
    if (h->used * 2 > h->mask + 1 && hot_grow_table(h) < 0) {
        return -1;
    }
    return e;
}

/* a plain int in int64 (bool is not), else 0 */
static int
plain_ll(PyObject *v, long long *out)
{
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

/* self_ns(n) in int64; 0: not plain (the caller falls back), -1: an error */
static int
hot_self_ns(const NodeSlots *t, PyObject *n, long long duration, long long *own)
{
    PyObject *self_us = SLOT(n, t->self_us), *children = SLOT(n, t->children);
    if (self_us == NULL || children == NULL) {
        PyErr_SetString(PyExc_AttributeError, "hotspot_top: a span node is not built yet");
        return -1;
    }
    if (self_us != Py_None) {
        long long us;
        if (plain_ll(self_us, &us)) {
            return !__builtin_mul_overflow(us, 1000LL, own);
        }
        if (PyFloat_CheckExact(self_us)) {
            double ns = PyFloat_AS_DOUBLE(self_us) * 1000.0; /* int(self_us * 1000): truncated */
            if (!(ns > -9.2e18 && ns < 9.2e18)) {
                return 0;
            }
            *own = (long long)ns;
            return 1;
        }
        return 0;
    }
    if (!PyList_CheckExact(children)) {
        return 0;
    }
    long long sum = 0;
    for (Py_ssize_t c = 0; c < PyList_GET_SIZE(children); c++) {
        PyObject *child = PyList_GET_ITEM(children, c);
        PyObject *cd = Py_IS_TYPE(child, t->type) ? SLOT(child, t->duration) : NULL;
        long long d;
        if (cd == NULL || !plain_ll(cd, &d) || __builtin_add_overflow(sum, d, &sum)) {
            return 0;
        }
    }
    if (PyList_GET_SIZE(children) == 0) {
        *own = duration;
        return 1;
    }
    long long left;
    if (__builtin_sub_overflow(duration, sum, &left)) {
        return 0;
    }
    *own = left > 0 ? left : 0;
    return 1;
}

/* the k-th largest (0-based) of v[0..n) (reorders v) */
static long long
kth_largest(long long *v, Py_ssize_t n, Py_ssize_t k)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        long long pivot = v[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) {
                i++;
            }
            while (v[j] < pivot) {
                j--;
            }
            if (i <= j) {
                long long tmp = v[i];
                v[i] = v[j];
                v[j] = tmp;
                i++;
                j--;
            }
        }
        if (k <= j) {
            hi = j;
        } else if (k >= i) {
            lo = i;
        } else {
            return v[k];
        }
    }
    return v[k];
}

static PyObject *
hotspot_top(PyObject *module, PyObject *args)
{
    PyObject *nodes, *node_type, *import_phase;
    Py_ssize_t limit, lanes;
    if (!PyArg_ParseTuple(args, "O!OUnn:hotspot_top", &PyList_Type, &nodes, &node_type, &import_phase, &limit,
                          &lanes)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    HotTable h = {NULL, NULL, NULL, 0, 256, 511, lanes > 0 ? (lanes + 63) / 64 : 1};
    PyObject *result = NULL;
    long long *cums = NULL;
    h.entries = PyMem_Malloc(sizeof(HotEntry) * (size_t)h.cap_entries);
    h.bits = PyMem_Malloc(sizeof(uint64_t) * (size_t)(h.cap_entries * h.words));
    h.table = PyMem_Calloc((size_t)(h.mask + 1), sizeof(Py_ssize_t));
    if (h.entries == NULL || h.bits == NULL || h.table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        if (!Py_IS_TYPE(n, t->type)) {
            PyErr_SetString(PyExc_TypeError, "hotspot_top: nodes must be of node_type");
            goto done;
        }
        PyObject *phase = SLOT(n, t->phase), *mod = SLOT(n, t->module), *duration = SLOT(n, t->duration);
        PyObject *lane = SLOT(n, t->lane), *name = SLOT(n, t->name);
        if (phase == NULL || mod == NULL || duration == NULL || lane == NULL || name == NULL) {
            PyErr_SetString(PyExc_AttributeError, "hotspot_top: a span node is not built yet");
            goto done;
        }
        int is_import = same_str(phase, import_phase);
        if (is_import < 0) {
            goto done;
        }
        if (!is_import) {
            continue;
        }
        int truth = PyObject_IsTrue(mod);
        if (truth < 0) {
            goto done;
        }
        long long d, own, lane_index;
        if (!plain_ll(duration, &d) || !plain_ll(lane, &lane_index) || lane_index < 0 || lane_index >= lanes) {
            goto fallback;
        }
        int plain = hot_self_ns(t, n, d, &own);
        if (plain < 0) {
            goto done;
        }
        if (!plain) {
            goto fallback;
        }
        Py_ssize_t e = hot_entry(&h, truth ? mod : name);
        if (e < 0) {
            goto done;
        }
        HotEntry *entry = &h.entries[e];
        if (__builtin_add_overflow(entry->cum, d, &entry->cum) || __builtin_add_overflow(entry->own, own, &entry->own)) {
            goto fallback;
        }
        entry->count++;
        h.bits[e * h.words + lane_index / 64] |= (uint64_t)1 << (lane_index % 64);
    }
    long long cut = LLONG_MIN;
    if (limit <= 0) {
        result = PyList_New(0);
        goto done;
    }
    if (h.used > limit) {
        cums = PyMem_Malloc(sizeof(long long) * (size_t)h.used);
        if (cums == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t e = 0; e < h.used; e++) {
            cums[e] = h.entries[e].cum;
        }
        cut = kth_largest(cums, h.used, limit - 1);
    }
    result = PyList_New(0);
    if (result == NULL) {
        goto done;
    }
    for (Py_ssize_t e = 0; e < h.used; e++) {
        HotEntry *entry = &h.entries[e];
        if (entry->cum < cut) {
            continue;
        }
        PyObject *set = PySet_New(NULL);
        if (set == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        for (Py_ssize_t w = 0; w < h.words; w++) {
            uint64_t word = h.bits[e * h.words + w];
            while (word) {
                int b = __builtin_ctzll(word);
                word &= word - 1;
                PyObject *index = PyLong_FromSsize_t(w * 64 + b);
                if (index == NULL || PySet_Add(set, index) < 0) {
                    Py_XDECREF(index);
                    Py_DECREF(set);
                    Py_CLEAR(result);
                    goto done;
                }
                Py_DECREF(index);
            }
        }
        PyObject *sums = Py_BuildValue("[LLNL]", entry->cum, entry->own, set, entry->count);
        PyObject *item = sums == NULL ? NULL : Py_BuildValue("(ON)", entry->mod, sums);
        if (item == NULL || PyList_Append(result, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(item);
    }
    goto done;
fallback:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(h.entries);
    PyMem_Free(h.bits);
    PyMem_Free(h.table);
    PyMem_Free(cums);
    return result;
}

/* `analysis.lanes._order_lanes`'s two loops over every node. `lane_positions`: each node joins
   its lane's spans (`n.lane` is the Lane then), `n.pos` its place there. `lane_indexes`, once the
   lanes are ordered: `n.lane` becomes the lane's index, `n.idx` the node's place in the run. Each
   lane's attribute is looked up once, in a dict by lane. */
typedef struct {
    PyObject **keys, **values; /* lanes (borrowed) -> their attribute (strong) */
    Py_ssize_t mask, used;
} LaneCache; /* Lane is a dataclass: not hashable, so by identity here */

static void
lane_cache_free(LaneCache *c)
{
    if (c->values != NULL) {
        for (Py_ssize_t i = 0; i <= c->mask; i++) {
            Py_XDECREF(c->values[i]);
        }
    }
    PyMem_Free(c->keys);
    PyMem_Free(c->values);
}

static int
lane_cache_init(LaneCache *c, Py_ssize_t size)
{
    c->keys = PyMem_Calloc((size_t)size, sizeof(PyObject *));
    c->values = PyMem_Calloc((size_t)size, sizeof(PyObject *));
    c->mask = size - 1;
    c->used = 0;
    if (c->keys == NULL || c->values == NULL) {
        lane_cache_free(c);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* lane.<attr>, looked up once per lane (borrowed; NULL with an exception) */
static PyObject *
lane_attr_cached(LaneCache *c, PyObject *lane, PyObject *attr)
{
    Py_ssize_t slot = (Py_ssize_t)(((size_t)lane >> 4) & (size_t)c->mask);
    while (c->keys[slot] != NULL) {
        if (c->keys[slot] == lane) {
            return c->values[slot];
        }
        slot = (slot + 1) & c->mask;
    }
    PyObject *value = PyObject_GetAttr(lane, attr);
    if (value == NULL) {
        return NULL;
    }
    if ((c->used + 1) * 2 > c->mask + 1) { /* grow: rehash into twice the size */
        LaneCache bigger;
        if (lane_cache_init(&bigger, (c->mask + 1) * 2) < 0) {
            Py_DECREF(value);
            return NULL;
        }
        for (Py_ssize_t i = 0; i <= c->mask; i++) {
            if (c->keys[i] != NULL) {
                Py_ssize_t to = (Py_ssize_t)(((size_t)c->keys[i] >> 4) & (size_t)bigger.mask);
                while (bigger.keys[to] != NULL) {
                    to = (to + 1) & bigger.mask;
                }
                bigger.keys[to] = c->keys[i];
                bigger.values[to] = c->values[i];
                c->values[i] = NULL;
            }
        }
        bigger.used = c->used;
        lane_cache_free(c);
        *c = bigger;
        slot = (Py_ssize_t)(((size_t)lane >> 4) & (size_t)c->mask);
        while (c->keys[slot] != NULL) {
            slot = (slot + 1) & c->mask;
        }
    }
    c->keys[slot] = lane;
    c->values[slot] = value;
    c->used++;
    return value;
}

/* One step of a lane walk: node `n`, the `i`-th, with its lane's attribute (borrowed). */
typedef int (*LaneStep)(const NodeSlots *t, PyObject *n, Py_ssize_t i, PyObject *value);

/* Every node of `args` (nodes, node_type) with its lane's `attr`, looked up once per lane. */
static PyObject *
lane_walk(PyObject *args, const char *format, PyObject *attr, LaneStep step)
{
    PyObject *nodes, *node_type;
    if (!PyArg_ParseTuple(args, format, &PyList_Type, &nodes, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    LaneCache cache;
    if (t == NULL || lane_cache_init(&cache, 64) < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        PyObject *lane = Py_IS_TYPE(n, t->type) ? SLOT(n, t->lane) : NULL;
        if (lane == NULL) {
            PyErr_SetString(PyExc_TypeError, "lane walk: nodes must be span nodes with their lane");
            lane_cache_free(&cache);
            return NULL;
        }
        PyObject *value = lane_attr_cached(&cache, lane, attr);
        if (value == NULL || step(t, n, i, value) < 0) {
            lane_cache_free(&cache);
            return NULL;
        }
    }
    lane_cache_free(&cache);
    Py_RETURN_NONE;
}

/* the node joins its lane's spans; `n.pos` its place there */
static int
position_step(const NodeSlots *t, PyObject *n, Py_ssize_t i, PyObject *spans)
{
    if (!PyList_Check(spans)) {
        PyErr_SetString(PyExc_TypeError, "lane_positions: a lane's spans must be a list");
        return -1;
    }
    PyObject *pos = PyLong_FromSsize_t(PyList_GET_SIZE(spans));
    if (pos == NULL) {
        return -1;
    }
    slot_set(n, t->pos, pos);
    return PyList_Append(spans, n);
}

/* `n.lane` becomes the lane's index (dropping the node's reference to the lane: `ordered` holds
   it), `n.idx` the node's place in the run */
static int
index_step(const NodeSlots *t, PyObject *n, Py_ssize_t i, PyObject *index)
{
    PyObject *idx = PyLong_FromSsize_t(i);
    if (idx == NULL) {
        return -1;
    }
    slot_set_borrowed(n, t->lane, index);
    slot_set(n, t->idx, idx);
    return 0;
}

static PyObject *
lane_positions(PyObject *module, PyObject *args)
{
    return lane_walk(args, "O!O:lane_positions", str_spans, position_step);
}

static PyObject *
lane_indexes(PyObject *module, PyObject *args)
{
    return lane_walk(args, "O!O:lane_indexes", str_index, index_step);
}

/* `analysis.lanes._last_time`: the latest end of the nodes, a node without an end counting by
   its start; 0 for none. None when a time is not an int in [0, 2**63). */
static PyObject *
last_time(PyObject *module, PyObject *args)
{
    PyObject *nodes, *node_type;
    if (!PyArg_ParseTuple(args, "O!O:last_time", &PyList_Type, &nodes, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    long long last = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        PyObject *end = Py_IS_TYPE(n, t->type) ? SLOT(n, t->end) : NULL;
        PyObject *start = Py_IS_TYPE(n, t->type) ? SLOT(n, t->start) : NULL;
        if (end == NULL || start == NULL) {
            PyErr_SetString(PyExc_TypeError, "last_time: nodes must be span nodes with start and end");
            return NULL;
        }
        long long v;
        if (!as_time(end == Py_None ? start : end, &v)) {
            Py_RETURN_NONE;
        }
        if (v > last) {
            last = v;
        }
    }
    return PyLong_FromLongLong(last);
}

/* analysis.model.split_imports: a lane's spans split into those a first answer always sends (not
   an import, or still in progress) and the imports at least `min_ns` long; in their order. */
static PyObject *
split_imports(PyObject *module, PyObject *args)
{
    PyObject *spans, *node_type, *min_ns, *import_phase;
    if (!PyArg_ParseTuple(args, "O!OOU:split_imports", &PyList_Type, &spans, &node_type, &min_ns, &import_phase)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    if (t == NULL) {
        return NULL;
    }
    PyObject *always = PyList_New(0), *longer = PyList_New(0), *result = NULL;
    if (always == NULL || longer == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
        PyObject *n = PyList_GET_ITEM(spans, i);
        PyObject *phase = Py_IS_TYPE(n, t->type) ? SLOT(n, t->phase) : NULL;
        PyObject *open = phase == NULL ? NULL : SLOT(n, t->in_progress);
        PyObject *duration = open == NULL ? NULL : SLOT(n, t->duration);
        if (duration == NULL) {
            PyErr_SetString(PyExc_TypeError, "split_imports: spans must be built span nodes");
            goto done;
        }
        int is_import = same_str(phase, import_phase);
        int is_open = is_import <= 0 ? 0 : PyObject_IsTrue(open);
        if (is_import < 0 || is_open < 0) {
            goto done;
        }
        if (!is_import || is_open) {
            if (PyList_Append(always, n) < 0) {
                goto done;
            }
            continue;
        }
        int long_enough = PyObject_RichCompareBool(duration, min_ns, Py_GE);
        if (long_enough < 0 || (long_enough && PyList_Append(longer, n) < 0)) {
            goto done;
        }
    }
    result = PyTuple_Pack(2, always, longer);
done:
    Py_XDECREF(always);
    Py_XDECREF(longer);
    return result;
}

/* findings.preload.FastestImports' pass: over import nodes, the shortest duration of each module
   among the completed imports without an error ({module: duration}). */
static PyObject *
fastest_imports_c(PyObject *module, PyObject *args)
{
    PyObject *nodes, *node_type;
    if (!PyArg_ParseTuple(args, "O!O:fastest_imports", &PyList_Type, &nodes, &node_type)) {
        return NULL;
    }
    NodeSlots *t = node_slots(node_type);
    PyObject *best = t == NULL ? NULL : PyDict_New();
    if (best == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *n = PyList_GET_ITEM(nodes, i);
        if (!Py_IS_TYPE(n, t->type) || SLOT(n, t->in_progress) == NULL || SLOT(n, t->error) == NULL ||
            SLOT(n, t->module) == NULL || SLOT(n, t->duration) == NULL) {
            PyErr_SetString(PyExc_TypeError, "fastest_imports: nodes must be built span nodes");
            goto fail;
        }
        int open = PyObject_IsTrue(SLOT(n, t->in_progress));
        int error = open ? 0 : PyObject_IsTrue(SLOT(n, t->error));
        if (open < 0 || error < 0) {
            goto fail;
        }
        if (open || error) {
            continue;
        }
        PyObject *mod = SLOT(n, t->module), *duration = SLOT(n, t->duration);
        PyObject *old = PyDict_GetItemWithError(best, mod);
        if (old == NULL && PyErr_Occurred()) {
            goto fail;
        }
        int shorter = 1;
        if (old != NULL) {
            long long a, b;
            shorter = plain_ll(duration, &a) && plain_ll(old, &b) ? a < b : PyObject_RichCompareBool(duration, old, Py_LT);
        }
        if (shorter < 0 || (shorter && PyDict_SetItem(best, mod, duration) < 0)) {
            goto fail;
        }
    }
    return best;
fail:
    Py_DECREF(best);
    return NULL;
}

static PyMethodDef modelcore_methods[] = {
    {"peek_attrs", peek_attrs, METH_VARARGS,
     "peek_attrs(raw, patterns, missing, unknown): per pattern, the short string value after it, or missing or unknown."},
    {"span_nodes", span_nodes, METH_VARARGS,
     "span_nodes(groups, node_type, span_type, keys, name_phases, hot_values, lazy_type, patterns, missing, unknown): "
     "analysis.lanes._span_nodes's loop; (nodes, by_id)."},
    {"link_tree", link_tree, METH_VARARGS, "link_tree(nodes, by_id, node_type): analysis.lanes._link_tree."},
    {"split_imports", split_imports, METH_VARARGS, "split_imports(spans, node_type, min_ns, 'import'): model's."},
    {"last_time", last_time, METH_VARARGS, "last_time(nodes, node_type): analysis.lanes._last_time, or None."},
    {"lane_positions", lane_positions, METH_VARARGS, "lane_positions(nodes, node_type): _order_lanes's first loop."},
    {"lane_indexes", lane_indexes, METH_VARARGS, "lane_indexes(nodes, node_type): _order_lanes's last loop."},
    {"hotspot_top", hotspot_top, METH_VARARGS,
     "hotspot_top(nodes, node_type, 'import', limit, lanes): import_hotspots's sums of its top modules, or None."},
    {"import_children", import_children_c, METH_VARARGS, "import_children(node, node_type): findings.common's."},
    {"subtree_modules", subtree_modules_c, METH_VARARGS, "subtree_modules(node, memo, node_type): findings.common's."},
    {"top_imports", top_imports_c, METH_VARARGS, "top_imports(spans, until, node_type): findings.common's."},
    {"paid_modules", paid_modules_c, METH_VARARGS, "paid_modules(roots, node_type): findings.common's."},
    {"fastest_imports", fastest_imports_c, METH_VARARGS,
     "fastest_imports(import_nodes, node_type): findings.preload.FastestImports' {module: shortest duration}."},
    {"covered_nodes", covered_nodes_c, METH_VARARGS, "covered_nodes(roots, covered, node_type): findings.preload's walk."},
    {"step_candidates", step_candidates, METH_VARARGS,
     "step_candidates(spans, proc, node_type, structural): critical_path._candidates of one lane, or None."},
    {"pick_walk", pick_walk, METH_VARARGS, "pick_walk(roots, allowed, flagged, node_type): (picked, noted)."},
    {"select", select_c, METH_VARARGS, "select(spans, node_type, phases, names, keep): analysis.model.select."},
    {"spans_from_rows", spans_from_rows, METH_VARARGS,
     "spans_from_rows(rows, span_type, lazy_type, decode, fallback, marker, text_marker, linked): (spans, marked)."},
    {"phase_intervals", phase_intervals, METH_VARARGS,
     "phase_intervals(work, node_type, low, high): ({phase: union ns}, covered intervals), or None."},
    {"set_durations", set_durations, METH_VARARGS,
     "set_durations(nodes, node_type, t_eff): every node's eff_end and duration."},
    {NULL, NULL, 0, NULL},
};

/* ---- the module --------------------------------------------------------------------------- */

static struct PyModuleDef modelcore_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "starttrace._modelcore",
    .m_doc = "The C core of the service's model build: the per-span loops of analysis and the store.",
    .m_size = -1,
    .m_methods = modelcore_methods,
};

PyMODINIT_FUNC
PyInit__modelcore(void)
{
#define INTERN(var, text)                                                                                              \
    if ((var = PyUnicode_InternFromString(text)) == NULL) {                                                            \
        return NULL;                                                                                                   \
    }
    INTERN(str_import, "import");
    INTERN(str_preload_phase, "forkserver_preload");
    INTERN(str_other, "other");
    INTERN(str_process, "process");
    INTERN(str_startup, "startup");
    INTERN(str_import_prefix, "import ");
    INTERN(str_preload_prefix, "preload ");
    INTERN(str_spans, "spans");
    INTERN(str_index, "index");
    for (int k = 0; k < S_FIELDS; k++) {
        INTERN(span_fields[k], SPAN_FIELD_NAMES[k]);
    }
#undef INTERN
    return PyModule_Create(&modelcore_module);
}
