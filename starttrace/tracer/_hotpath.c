/* starttrace.tracer._hotpath: the C core of the hot path (optional; the pure-Python code does the same).

   Two things run for every event a traced process records, and here they cost a few hundred
   instructions instead of thousands (docs/benchmarks.md, "In instructions"):

   - Segment: a journal segment's mapping, written by a memory copy at a position of its own.
     `Segment(mapping).write` is the journal writer's `put` (journal.py): one C call, atomic under
     the GIL, ValueError when the record does not fit, like `mmap.write`. `map_segment(fd, length)`
     maps the file itself (the journal then never loads the `mmap` module: ~0.5 M instructions of
     every process's activation) and keeps the mapping for the rest of the process.
   - ImportHook: the common case of the import probe (probes/imports.py, `_make_wrapper`): the
     main thread, an `import` statement, a name without a newline, spans not held back. It writes
     the same compact `I` and `E` records as the Python wrapper, copying them straight into the
     current Segment. Every other case is handed, whole, to the Python wrapper (`fallback`), and
     the rare ends (probes waiting for the module, a fork meanwhile, a failed import, a path that
     needs escaping, a full segment) to the probe's own Python helpers. The records are
     byte-for-byte those of the Python wrapper (tests/integration/test_hotpath.py).

   Built by hatch_build.py when the package is installed; without a C compiler the package is
   pure Python and nothing changes but the cost. STARTTRACE_PURE_PYTHON=1 ignores this module. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/mman.h>
#include <structmember.h> /* T_OBJECT_EX: the journal writer's `put` slot */

/* ---- Segment ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Py_buffer view; /* the mapping's memory, held for the segment's life (it is never closed) */
    Py_ssize_t pos;
} Segment;

static PyTypeObject SegmentType;

static int
Segment_init(Segment *self, PyObject *args, PyObject *kwds)
{
    PyObject *mapping;
    if (!PyArg_ParseTuple(args, "O:Segment", &mapping)) {
        return -1;
    }
    if (self->view.obj != NULL || self->view.buf != NULL) {
        PyErr_SetString(PyExc_TypeError, "Segment already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(mapping, &self->view, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    self->pos = 0;
    return 0;
}

static void
Segment_dealloc(Segment *self)
{
    if (self->view.obj != NULL) {
        PyBuffer_Release(&self->view);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Room for `n` more bytes? Then the address to copy them to (the caller advances pos). */
static inline char *
segment_room(Segment *seg, Py_ssize_t n)
{
    if (seg->view.buf == NULL || n > seg->view.len - seg->pos) {
        return NULL;
    }
    return (char *)seg->view.buf + seg->pos;
}

static PyObject *
Segment_write(Segment *self, PyObject *data)
{
    Py_buffer in;
    char *dst;
    if (PyBytes_CheckExact(data)) {
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        if ((dst = segment_room(self, n)) == NULL) {
            PyErr_SetString(PyExc_ValueError, "data out of range");
            return NULL;
        }
        memcpy(dst, PyBytes_AS_STRING(data), n);
        self->pos += n;
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(data, &in, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if ((dst = segment_room(self, in.len)) == NULL) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_ValueError, "data out of range");
        return NULL;
    }
    memcpy(dst, in.buf, in.len);
    self->pos += in.len;
    PyBuffer_Release(&in);
    Py_RETURN_NONE;
}

static PyObject *
Segment_tell(Segment *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->pos);
}

static PyObject *
Segment_size(Segment *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->view.buf == NULL ? 0 : self->view.len);
}

/* map_segment(fd, length): a Segment over `length` bytes of file `fd` from its start, mapped shared
   for writing. The mapping is never unmapped (as journal._keep keeps an mmap object) and holds no
   descriptor: the caller closes `fd`. OSError when the mapping fails. */
static PyObject *
map_segment(PyObject *Py_UNUSED(module), PyObject *args)
{
    int fd;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "in:map_segment", &fd, &length)) {
        return NULL;
    }
    if (length <= 0) {
        PyErr_SetString(PyExc_ValueError, "map_segment: length must be positive");
        return NULL;
    }
    Segment *seg = PyObject_New(Segment, &SegmentType);
    if (seg == NULL) {
        return NULL;
    }
    memset(&seg->view, 0, sizeof(seg->view));
    seg->pos = 0;
    void *addr;
    Py_BEGIN_ALLOW_THREADS
    addr = mmap(NULL, (size_t)length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    Py_END_ALLOW_THREADS
    if (addr == MAP_FAILED) {
        Py_DECREF(seg);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    seg->view.buf = addr;
    seg->view.len = length;
    return (PyObject *)seg;
}

static PyMethodDef Segment_methods[] = {
    {"write", (PyCFunction)Segment_write, METH_O, "Copy a record (bytes) in; ValueError if it does not fit."},
    {"tell", (PyCFunction)Segment_tell, METH_NOARGS, "Bytes written so far."},
    {"size", (PyCFunction)Segment_size, METH_NOARGS, "Bytes the segment can hold."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "starttrace.tracer._hotpath.Segment",
    .tp_basicsize = sizeof(Segment),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A journal segment's mapping, written at a position of its own.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Segment_init,
    .tp_dealloc = (destructor)Segment_dealloc,
    .tp_methods = Segment_methods,
};

/* ---- ImportHook --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;       /* importlib's _find_and_load */
    PyObject *builtin_import; /* builtins.__import__: an `import` statement */
    PyObject *fallback;       /* the Python wrapper: every case this one does not take */
    PyObject *modules;        /* sys.modules */
    PyObject *rec;            /* the recorder module's globals */
    PyObject *stacks;         /* recorder._stacks: thread ident -> open span ids */
    PyObject *pending;        /* recorder.pending: held-back begin records */
    PyObject *post_hooks;     /* recorder._post_import_hooks */
    PyObject *end_slow;       /* imports._end_slow(name, span_id, path, module) */
    PyObject *end_failed;     /* imports._end_failed(span_id, exc) */
    PyObject *end_record;     /* imports._end_record(span_id, start, path) -> str (a path to escape) */
    PyObject *write_compact;  /* imports._write_compact(line) */
    PyObject *ident_key;      /* the last thread ident looked up in `stacks`, as an int */
    unsigned long ident_value;
    int ident_is_key;          /* ident_key is the key object `stacks` holds (found once per ident) */
    PyTypeObject *writer_type; /* the journal writer's class, once its `put` slot was found ... */
    Py_ssize_t put_offset;     /* ... and where that slot is in its instances (0: not found) */
    /* The globals every span reads, borrowed from `rec` as they were when its version was
       `rec_version` (rec_read: read since the last rebind): 4 dict lookups a span become one compare. */
    int rec_read;
    uint64_t rec_version;
    PyObject *rec_writer, *rec_plain, *rec_ids, *rec_process_span;
    /* the stack thread_stack found last, borrowed from `stacks` at version `stack_version` */
    PyObject *stack;
    unsigned long stack_ident;
    uint64_t stack_version;
} ImportHook;

static PyObject *str_writer, *str_put, *str_span_ids, *str_refill, *str_plain_ident, *str_process_span, *str_file;

/* A dict's version tag changes with every change of the dict (PEP 509). Python 3.12 and 3.13
   deprecate reading it but still keep it so; 3.14 removed it: there every span looks up again. */
#if PY_VERSION_HEX < 0x030E0000
#define REC_BY_VERSION 1
static inline uint64_t
dict_version(PyObject *dict)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return ((PyDictObject *)dict)->ma_version_tag;
#pragma GCC diagnostic pop
}
#else
#define REC_BY_VERSION 0
#endif

/* Refresh the hook's borrowed copies of the recorder globals a span reads (a missing one is NULL);
   they stay valid while `rec` keeps the version they were read at. -1 with an exception set. */
static int
read_rec(ImportHook *self)
{
#if REC_BY_VERSION
    uint64_t version = dict_version(self->rec);
    if (self->rec_read && version == self->rec_version) {
        return 0;
    }
#endif
    PyObject *rec = self->rec;
    self->rec_read = 0;
    if ((self->rec_writer = PyDict_GetItemWithError(rec, str_writer)) == NULL && PyErr_Occurred()) {
        return -1;
    }
    if ((self->rec_plain = PyDict_GetItemWithError(rec, str_plain_ident)) == NULL && PyErr_Occurred()) {
        return -1;
    }
    if ((self->rec_ids = PyDict_GetItemWithError(rec, str_span_ids)) == NULL && PyErr_Occurred()) {
        return -1;
    }
    if ((self->rec_process_span = PyDict_GetItemWithError(rec, str_process_span)) == NULL && PyErr_Occurred()) {
        return -1;
    }
#if REC_BY_VERSION
    self->rec_version = version;
    self->rec_read = 1;
#endif
    return 0;
}

typedef struct {
    const char *p;
    Py_ssize_t n;
} Piece;

static inline long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns()'s clock */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* `value` in decimal, two digits per division (a start time has 19 of them). */
static Py_ssize_t
format_int(char *out, long long value)
{
    char tmp[24];
    char *at = tmp + sizeof(tmp);
    unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    while (v >= 100) {
        unsigned pair = (unsigned)(v % 100) * 2;
        v /= 100;
        *--at = DIGIT_PAIRS[pair + 1];
        *--at = DIGIT_PAIRS[pair];
    }
    if (v >= 10) {
        *--at = DIGIT_PAIRS[v * 2 + 1];
        *--at = DIGIT_PAIRS[v * 2];
    } else {
        *--at = (char)('0' + v);
    }
    if (value < 0) {
        *--at = '-';
    }
    Py_ssize_t len = tmp + sizeof(tmp) - at;
    memcpy(out, at, len);
    return len;
}

/* writer.put (a new reference): read from its slot where the writer is of the class whose slot
   was found before (journal.JournalWriter has __slots__), else as an attribute; NULL with an
   exception set. The same value either way: a slot holds what the attribute read returns. */
static PyObject *
writer_put(ImportHook *self, PyObject *writer)
{
    PyTypeObject *type = Py_TYPE(writer);
    if (type == self->writer_type && self->put_offset > 0) {
        PyObject *put = *(PyObject **)((char *)writer + self->put_offset);
        if (put != NULL) {
            Py_INCREF(put);
            return put;
        }
    } else if (self->writer_type == NULL) {
        PyObject *descr = _PyType_Lookup(type, str_put); /* borrowed */
        if (descr != NULL && Py_TYPE(descr) == &PyMemberDescr_Type) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY) && member->offset > 0) {
                Py_INCREF(type);
                self->writer_type = type;
                self->put_offset = member->offset;
            }
        }
    }
    return PyObject_GetAttr(writer, str_put);
}

/* A start time in decimal: its digits above the last eight are those of the span before, most of
   the time (they change every 0.1 s), so they are kept, and only the last eight formatted. */
static long long time_high = -1;
static char time_high_text[24];
static Py_ssize_t time_high_len;

static Py_ssize_t
format_time(char *out, long long value)
{
    long long high = value / 100000000LL;
    if (high <= 0) {
        return format_int(out, value);
    }
    if (high != time_high) {
        time_high_len = format_int(time_high_text, high);
        time_high = high;
    }
    memcpy(out, time_high_text, time_high_len);
    unsigned low = (unsigned)(value - high * 100000000LL);
    char *at = out + time_high_len + 8;
    for (int i = 0; i < 4; i++) {
        unsigned pair = (low % 100) * 2;
        low /= 100;
        *--at = DIGIT_PAIRS[pair + 1];
        *--at = DIGIT_PAIRS[pair];
    }
    return time_high_len + 8;
}

/* A str's UTF-8 (NULL with an exception set): an ASCII string's own characters, without a call. */
static inline const char *
utf8_of(PyObject *text, Py_ssize_t *len)
{
    if (PyUnicode_Check(text) && PyUnicode_IS_COMPACT_ASCII(text)) {
        *len = PyUnicode_GET_LENGTH(text);
        return (const char *)PyUnicode_DATA(text);
    }
    return PyUnicode_AsUTF8AndSize(text, len);
}

/* Write one record (valid UTF-8, in pieces) through `writer`: copied straight into its current
   Segment when there is room, else as a str through imports._write_compact, which opens the next
   segment or finds the journal failed. 0, or -1 with an exception set. */
static int
emit(ImportHook *self, PyObject *writer, const Piece *pieces, int count)
{
    Py_ssize_t total = 0;
    for (int i = 0; i < count; i++) {
        total += pieces[i].n;
    }
    /* the writer: activation.py's light case writes into its first Segment itself; the journal
       writer (journal.py) has the current Segment's write as its `put` */
    Segment *seg = NULL;
    PyObject *put = NULL;
    if (Py_TYPE(writer) == &SegmentType) {
        seg = (Segment *)writer;
    } else {
        put = writer_put(self, writer);
        if (put == NULL) {
            return -1;
        }
        if (PyCFunction_Check(put)) {
            PyObject *owner = PyCFunction_GET_SELF(put);
            if (owner != NULL && Py_TYPE(owner) == &SegmentType) {
                seg = (Segment *)owner;
            }
        }
    }
    if (seg != NULL) {
        char *dst = segment_room(seg, total);
        if (dst != NULL) {
            for (int i = 0; i < count; i++) {
                if (pieces[i].n == 1) { /* the record's letter, a space, the newline: no call */
                    *dst++ = *pieces[i].p;
                    continue;
                }
                memcpy(dst, pieces[i].p, pieces[i].n);
                dst += pieces[i].n;
            }
            seg->pos += total;
            Py_XDECREF(put);
            return 0;
        }
    }
    Py_XDECREF(put);
    char *joined = PyMem_Malloc(total ? total : 1);
    if (joined == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char *at = joined;
    for (int i = 0; i < count; i++) {
        memcpy(at, pieces[i].p, pieces[i].n);
        at += pieces[i].n;
    }
    PyObject *line = PyUnicode_DecodeUTF8(joined, total, "strict");
    PyMem_Free(joined);
    if (line == NULL) {
        return -1;
    }
    PyObject *done = PyObject_CallOneArg(self->write_compact, line);
    Py_DECREF(line);
    if (done == NULL) {
        return -1;
    }
    Py_DECREF(done);
    return 0;
}

static PyObject *
call_original(ImportHook *self, PyObject *const *args)
{
    return PyObject_Vectorcall(self->original, args, 2, NULL);
}

static PyObject *thread_stack_lookup(ImportHook *self, unsigned long ident);

/* The stack of open span ids of this thread (a new reference), made if missing. */
static PyObject *
thread_stack(ImportHook *self, unsigned long ident)
{
#if REC_BY_VERSION
    if (self->stack != NULL && self->stack_ident == ident && dict_version(self->stacks) == self->stack_version) {
        Py_INCREF(self->stack);
        return self->stack;
    }
#endif
    self->stack = NULL;
    PyObject *found = thread_stack_lookup(self, ident);
#if REC_BY_VERSION
    if (found != NULL) {
        self->stack = found; /* `stacks` holds it: valid while the dict keeps this version */
        self->stack_ident = ident;
        self->stack_version = dict_version(self->stacks);
    }
#endif
    return found;
}

static PyObject *
thread_stack_lookup(ImportHook *self, unsigned long ident)
{
    if (self->ident_key == NULL || self->ident_value != ident) {
        PyObject *key = PyLong_FromUnsignedLong(ident);
        if (key == NULL) {
            return NULL;
        }
        Py_XSETREF(self->ident_key, key);
        self->ident_value = ident;
        self->ident_is_key = 0;
    }
    PyObject *stack = PyDict_GetItemWithError(self->stacks, self->ident_key);
    if (stack != NULL && !self->ident_is_key) {
        /* keep the dict's own key object: the next lookups match it by identity, not by comparing */
        PyObject *key, *value;
        Py_ssize_t at = 0;
        while (PyDict_Next(self->stacks, &at, &key, &value)) {
            if (value == stack) {
                Py_INCREF(key);
                Py_SETREF(self->ident_key, key);
                break;
            }
        }
        self->ident_is_key = 1;
    }
    if (stack == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        stack = PyList_New(0);
        if (stack == NULL || PyDict_SetItem(self->stacks, self->ident_key, stack) < 0) {
            Py_XDECREF(stack);
            return NULL;
        }
        self->ident_is_key = 1;
        return stack;
    }
    Py_INCREF(stack);
    return stack;
}

static PyObject *
next_span_id(ImportHook *self)
{
    PyObject *ids = self->rec_ids; /* read_rec ran, and no Python code since */
    if (ids != NULL && Py_TYPE(ids)->tp_iternext != NULL) {
        PyObject *span_id = Py_TYPE(ids)->tp_iternext(ids);
        if (span_id != NULL) {
            return span_id;
        }
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
                return NULL;
            }
            PyErr_Clear();
        }
    } else if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *refill = PyDict_GetItemWithError(self->rec, str_refill);
    if (refill == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "starttrace.tracer.recorder.refill_span_ids is missing");
        }
        return NULL;
    }
    return PyObject_CallNoArgs(refill);
}

/* The span's end: the common case writes an `E` record, the rest goes to the probe's helpers. */
static int
end_span(ImportHook *self, PyObject *writer, PyObject *name, PyObject *span_id, PyObject *stack,
         long long start, PyObject *path, PyObject *module)
{
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    /* the common end: this span on top of the stack, nothing held back, no probe waiting */
    int common = depth > 0 && PyList_GET_ITEM(stack, depth - 1) == span_id && PyDict_GET_SIZE(self->pending) == 0;
    if (common) {
        int hooked = PyDict_Contains(self->post_hooks, name);
        if (hooked < 0) {
            return -1;
        }
        common = !hooked;
    }
    if (!common) {
        PyObject *done = PyObject_CallFunctionObjArgs(self->end_slow, name, span_id, path ? path : Py_None, module, NULL);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *top = PyList_GET_ITEM(stack, depth - 1); /* `span_id`: the caller holds it still */
    Py_SET_SIZE(stack, depth - 1);                      /* the list's `del stack[-1]`, no call */
    Py_DECREF(top);
    Py_ssize_t id_len, path_len = 0;
    const char *id_text = utf8_of(span_id, &id_len);
    if (id_text == NULL) {
        return -1;
    }
    const char *path_text = NULL;
    if (path != NULL && PyUnicode_CheckExact(path)) {
        path_text = utf8_of(path, &path_len);
        if (path_text == NULL || memchr(path_text, '\n', path_len) != NULL) {
            PyErr_Clear(); /* lone surrogates or a newline: the Python helpers write that record */
            PyObject *start_obj = PyLong_FromLongLong(start);
            if (start_obj == NULL) {
                return -1;
            }
            PyObject *line = PyObject_CallFunctionObjArgs(self->end_record, span_id, start_obj, path, NULL);
            Py_DECREF(start_obj);
            if (line == NULL) {
                return -1;
            }
            PyObject *done = PyObject_CallOneArg(self->write_compact, line);
            Py_DECREF(line);
            Py_XDECREF(done);
            return done == NULL ? -1 : 0;
        }
    }
    char digits[24];
    Py_ssize_t digits_len = format_int(digits, monotonic_ns() - start);
    Piece pieces[6] = {{"E", 1}, {id_text, id_len}, {digits, digits_len}, {" ", 1}, {path_text, path_len}, {"\n", 1}};
    if (path_text == NULL) {
        pieces[3] = pieces[5];
        return emit(self, writer, pieces, 4);
    }
    return emit(self, writer, pieces, 6);
}

static PyObject *
ImportHook_vectorcall(ImportHook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL) {
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    }
    PyObject *name = args[0];
    if (read_rec(self) < 0) {
        return NULL;
    }
    PyObject *writer = self->rec_writer;
    if (writer == NULL) {
        return PyObject_Vectorcall(self->fallback, args, nargsf, NULL);
    }
    if (writer == Py_None) {
        return call_original(self, args);
    }
    int loaded = PyDict_Contains(self->modules, name);
    if (loaded < 0) {
        return NULL;
    }
    if (loaded) {
        return call_original(self, args);
    }
    /* the common case only: the thread that takes the inlined path, an `import` statement */
    if (args[1] != self->builtin_import || !PyUnicode_CheckExact(name)) {
        return PyObject_Vectorcall(self->fallback, args, nargsf, NULL);
    }
    unsigned long ident = PyThread_get_thread_ident();
    PyObject *plain = self->rec_plain;
    if (plain == NULL || !PyLong_CheckExact(plain)) {
        return PyObject_Vectorcall(self->fallback, args, nargsf, NULL);
    }
    int overflow = 0;
    long long plain_value = PyLong_AsLongLongAndOverflow(plain, &overflow);
    if (overflow || plain_value < 0 || (unsigned long long)plain_value != (unsigned long long)ident) {
        return PyObject_Vectorcall(self->fallback, args, nargsf, NULL);
    }
    Py_ssize_t name_len;
    const char *name_text = utf8_of(name, &name_len);
    if (name_text == NULL || memchr(name_text, '\n', name_len) != NULL) {
        PyErr_Clear(); /* lone surrogates or a newline: the JSON record of the Python wrapper */
        return PyObject_Vectorcall(self->fallback, args, nargsf, NULL);
    }

    PyObject *span_id = NULL, *stack = NULL, *module = NULL, *path = NULL;
    Py_INCREF(writer); /* the recorder may drop it meanwhile (a fork, a failure): its end goes there still */
    span_id = next_span_id(self);
    if (span_id == NULL || (stack = thread_stack(self, ident)) == NULL) {
        goto error;
    }
    PyObject *parent;
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (depth > 0) {
        parent = PyList_GET_ITEM(stack, depth - 1);
    } else {
        /* a refill of the span ids ran Python code: read again (a compare, most of the time) */
        if (read_rec(self) < 0) {
            goto error;
        }
        parent = self->rec_process_span;
        if (parent == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "starttrace.tracer.recorder.process_span_id is missing");
            goto error;
        }
    }
    Py_ssize_t id_len, parent_len;
    const char *id_text = utf8_of(span_id, &id_len);
    const char *parent_text = id_text ? utf8_of(parent, &parent_len) : NULL;
    if (parent_text == NULL) {
        goto error;
    }
    long long start = monotonic_ns();
    char digits[24];
    Py_ssize_t digits_len = format_time(digits, start);
    Piece begin[7] = {{"I", 1}, {id_text, id_len}, {parent_text, parent_len}, {digits, digits_len}, {" ", 1}, {name_text, name_len}, {"\n", 1}};
    if (emit(self, writer, begin, 7) < 0 || PyList_Append(stack, span_id) < 0) {
        goto error;
    }

    module = call_original(self, args);
    if (module == NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL && value != NULL) {
            PyException_SetTraceback(value, traceback);
        }
        PyObject *done = PyObject_CallFunctionObjArgs(self->end_failed, span_id, value ? value : Py_None, NULL);
        if (done == NULL) {
            PyErr_Clear();
        }
        Py_XDECREF(done);
        PyErr_Restore(type, value, traceback);
        goto error;
    }
    /* a plain attribute read (AttributeError for built-ins), from the module's dict where it is there */
    path = PyModule_CheckExact(module) ? PyDict_GetItemWithError(PyModule_GetDict(module), str_file) : NULL;
    if (path != NULL) {
        Py_INCREF(path);
    } else if (!PyErr_Occurred()) {
        path = PyObject_GetAttr(module, str_file);
    }
    if (path == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            goto error;
        }
        PyErr_Clear();
    }
    if (end_span(self, writer, name, span_id, stack, start, path, module) < 0) {
        goto error;
    }
    Py_DECREF(writer);
    Py_DECREF(span_id);
    Py_DECREF(stack);
    Py_XDECREF(path);
    return module;

error:
    Py_DECREF(writer);
    Py_XDECREF(span_id);
    Py_XDECREF(stack);
    Py_XDECREF(path);
    Py_XDECREF(module);
    return NULL;
}

/* The recorder's dicts the hook keeps (borrowed): its stacks, held-back spans and post-import
   hooks, from its globals `rec`; -1 with TypeError where `rec` is not the recorder's. */
static int
recorder_dicts(PyObject *rec, PyObject **stacks, PyObject **pending, PyObject **post_hooks)
{
    *stacks = PyDict_GetItemString(rec, "_stacks");
    *pending = PyDict_GetItemString(rec, "pending");
    *post_hooks = PyDict_GetItemString(rec, "_post_import_hooks");
    if (*stacks == NULL || *pending == NULL || *post_hooks == NULL || !PyDict_Check(*stacks) ||
        !PyDict_Check(*pending) || !PyDict_Check(*post_hooks)) {
        PyErr_SetString(PyExc_TypeError, "recorder_globals: not the recorder's (no _stacks, pending, _post_import_hooks)");
        return -1;
    }
    return 0;
}

static int
ImportHook_init(ImportHook *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"original", "builtin_import", "fallback", "modules", "recorder_globals", "end_slow",
                               "end_failed", "end_record", "write_compact", NULL};
    PyObject *original, *builtin_import, *fallback, *modules, *rec, *end_slow, *end_failed, *end_record, *write_compact;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!O!OOOO:ImportHook", keywords, &original, &builtin_import,
                                     &fallback, &PyDict_Type, &modules, &PyDict_Type, &rec, &end_slow, &end_failed,
                                     &end_record, &write_compact)) {
        return -1;
    }
    if (self->original != NULL) {
        PyErr_SetString(PyExc_TypeError, "ImportHook already initialised");
        return -1;
    }
    PyObject *stacks, *pending, *post_hooks;
    if (recorder_dicts(rec, &stacks, &pending, &post_hooks) < 0) {
        return -1;
    }
#define KEEP(field, value) Py_INCREF(value); self->field = value
    KEEP(original, original);
    KEEP(builtin_import, builtin_import);
    KEEP(fallback, fallback);
    KEEP(modules, modules);
    KEEP(rec, rec);
    KEEP(stacks, stacks);
    KEEP(pending, pending);
    KEEP(post_hooks, post_hooks);
    KEEP(end_slow, end_slow);
    KEEP(end_failed, end_failed);
    KEEP(end_record, end_record);
    KEEP(write_compact, write_compact);
#undef KEEP
    self->vectorcall = (vectorcallfunc)ImportHook_vectorcall;
    return 0;
}

static void
ImportHook_dealloc(ImportHook *self)
{
    Py_XDECREF(self->original);
    Py_XDECREF(self->builtin_import);
    Py_XDECREF(self->fallback);
    Py_XDECREF(self->modules);
    Py_XDECREF(self->rec);
    Py_XDECREF(self->stacks);
    Py_XDECREF(self->pending);
    Py_XDECREF(self->post_hooks);
    Py_XDECREF(self->end_slow);
    Py_XDECREF(self->end_failed);
    Py_XDECREF(self->end_record);
    Py_XDECREF(self->write_compact);
    Py_XDECREF(self->ident_key);
    Py_XDECREF(self->writer_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
ImportHook_call(ImportHook *self, PyObject *args, PyObject *kwargs)
{
    if (self->original == NULL) {
        PyErr_SetString(PyExc_TypeError, "ImportHook not initialised");
        return NULL;
    }
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static PyObject *
ImportHook_get_true(PyObject *self, void *closure)
{
    Py_RETURN_TRUE;
}

static PyObject *
ImportHook_get_wrapped(ImportHook *self, void *closure)
{
    PyObject *wrapped = self->original ? self->original : Py_None;
    Py_INCREF(wrapped);
    return wrapped;
}

/* rebind(recorder_globals, fallback, end_slow, end_failed, end_record, write_compact): activation.py's
   light case built the hook over its own globals and trampolines; once the recorder and the import
   probe are loaded (activation.adopt), the hook reads theirs. The stacks, held-back spans and
   post-import hooks are the same objects (the recorder adopts them), read again all the same. */
static PyObject *
ImportHook_rebind(ImportHook *self, PyObject *args)
{
    PyObject *rec, *fallback, *end_slow, *end_failed, *end_record, *write_compact;
    if (!PyArg_ParseTuple(args, "O!OOOOO:rebind", &PyDict_Type, &rec, &fallback, &end_slow, &end_failed, &end_record,
                          &write_compact)) {
        return NULL;
    }
    PyObject *stacks, *pending, *post_hooks;
    if (recorder_dicts(rec, &stacks, &pending, &post_hooks) < 0) {
        return NULL;
    }
#define REPLACE(field, value) Py_INCREF(value); Py_XSETREF(self->field, value)
    REPLACE(rec, rec);
    REPLACE(stacks, stacks);
    REPLACE(pending, pending);
    REPLACE(post_hooks, post_hooks);
    REPLACE(fallback, fallback);
    REPLACE(end_slow, end_slow);
    REPLACE(end_failed, end_failed);
    REPLACE(end_record, end_record);
    REPLACE(write_compact, write_compact);
#undef REPLACE
    Py_CLEAR(self->ident_key); /* a key of the stacks dict before: looked up again */
    self->ident_is_key = 0;
    Py_CLEAR(self->writer_type); /* the recorder's writer is of another class: its slot found again */
    self->put_offset = 0;
    self->rec_read = 0;
    self->stack = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef ImportHook_methods[] = {
    {"rebind", (PyCFunction)ImportHook_rebind, METH_VARARGS,
     "Read these recorder globals and call these helpers from now on (activation.adopt)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ImportHook_getset[] = {
    {"__starttrace__", (getter)ImportHook_get_true, NULL, "Marks starttrace's import hook.", NULL},
    {"__wrapped__", (getter)ImportHook_get_wrapped, NULL, "importlib's _find_and_load.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ImportHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "starttrace.tracer._hotpath.ImportHook",
    .tp_basicsize = sizeof(ImportHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "importlib's _find_and_load, recording the common import span in C (see probes/imports.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ImportHook_init,
    .tp_dealloc = (destructor)ImportHook_dealloc,
    .tp_call = (ternaryfunc)ImportHook_call,
    .tp_vectorcall_offset = offsetof(ImportHook, vectorcall),
    .tp_getset = ImportHook_getset,
    .tp_methods = ImportHook_methods,
};

/* ---- the module --------------------------------------------------------------------------- */

/* span_id_block(block): the 256 span ids of a block (recorder.py has the scheme: 14 hex digits of
   the block, 2 of the id within it), made here at once instead of by 256 string additions. */
static PyObject *
span_id_block(PyObject *module, PyObject *arg)
{
    static const char hex[] = "0123456789abcdef";
    unsigned long long block = PyLong_AsUnsignedLongLong(arg);
    if (block == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (block >> 56) {
        PyErr_SetString(PyExc_ValueError, "a span id block has 56 bits");
        return NULL;
    }
    char text[16];
    for (int i = 13; i >= 0; i--) {
        text[i] = hex[block & 15];
        block >>= 4;
    }
    PyObject *ids = PyList_New(256);
    if (ids == NULL) {
        return NULL;
    }
    for (int n = 0; n < 256; n++) {
        text[14] = hex[n >> 4];
        text[15] = hex[n & 15];
        PyObject *span_id = PyUnicode_FromStringAndSize(text, 16);
        if (span_id == NULL) {
            Py_DECREF(ids);
            return NULL;
        }
        PyList_SET_ITEM(ids, n, span_id);
    }
    return ids;
}

/* untrack_module(module): take one of starttrace's modules off the garbage collector's lists: its
   functions, its dict and itself. They live as long as the process, so no collection can free them,
   yet every collection that reaches their generation walks them, and the collections at exit walk
   them all: ~0.5 M instructions of a traced program's exit, for starttrace's own ~10 modules. An
   untracked object is never garbage to the collector (what it refers to counts as referred to from
   outside), so nothing is freed too early. The functions keep one reference more: a function's
   dealloc assumes it is tracked, so these are never deallocated (the module's dict, which Python
   clears at exit, would free them). The dict tracks itself again if a container is stored in it. */
static PyObject *
untrack_module(PyObject *self, PyObject *module)
{
    if (!PyModule_CheckExact(module)) {
        PyErr_SetString(PyExc_TypeError, "untrack_module: not a module");
        return NULL;
    }
    PyObject *dict = PyModule_GetDict(module); /* borrowed */
    PyObject *key, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(dict, &at, &key, &value)) {
        if (PyFunction_Check(value) && PyObject_GC_IsTracked(value)) {
            Py_INCREF(value); /* never deallocated (see above) */
            PyObject_GC_UnTrack(value);
        }
    }
    if (PyObject_GC_IsTracked(dict)) {
        PyObject_GC_UnTrack(dict);
    }
    if (PyObject_GC_IsTracked(module)) {
        PyObject_GC_UnTrack(module);
    }
    Py_RETURN_NONE;
}

static PyMethodDef hotpath_functions[] = {
    {"map_segment", map_segment, METH_VARARGS, "A Segment over a new shared mapping of a journal file (fd, length)."},
    {"span_id_block", span_id_block, METH_O, "The 256 span ids (str) of a block of 56 bits."},
    {"untrack_module", untrack_module, METH_O, "Take one of starttrace's modules off the garbage collector's lists."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = hotpath_functions,
    .m_name = "starttrace.tracer._hotpath",
    .m_doc = "The C core of starttrace's hot path: journal segments and the common import span.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    if (PyType_Ready(&SegmentType) < 0 || PyType_Ready(&ImportHookType) < 0) {
        return NULL;
    }
#define INTERN(var, text)                                                                                              \
    if ((var = PyUnicode_InternFromString(text)) == NULL) {                                                            \
        return NULL;                                                                                                   \
    }
    INTERN(str_writer, "_writer");
    INTERN(str_put, "put");
    INTERN(str_span_ids, "span_ids");
    INTERN(str_refill, "refill_span_ids");
    INTERN(str_plain_ident, "plain_ident");
    INTERN(str_process_span, "process_span_id");
    INTERN(str_file, "__file__");
#undef INTERN
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&SegmentType);
    Py_INCREF(&ImportHookType);
    if (PyModule_AddObject(module, "Segment", (PyObject *)&SegmentType) < 0 ||
        PyModule_AddObject(module, "ImportHook", (PyObject *)&ImportHookType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
