/* The string table's encoder: the values of a flush's code columns -> int32 codes.
 *
 * What StringTable.encode did in Python and numpy, in one C pass over the columns (see
 * metacollect/store/writer.py, which holds the lock and the table's state):
 *
 *   1. tell the values apart by identity (a hash table of their addresses, for this call):
 *      the hooks hand over the very objects Dask passes around, so a flush of a million
 *      transitions holds a few states and one key object per task;
 *   2. turn each distinct object into its string once: itself for a str, a tuple of str
 *      and int (a Dask key) assembled from its parts, anything else str(v);
 *   3. look each string up in the table's dict of codes, adding the new ones (code = the
 *      next row of the group's strings table, in first-seen order) to ``new``;
 *   4. write every row's code (None and float NaN: -1) into ``out``.
 *
 * A Python encoder of these rows paid ~80 ns a value and ~500 ns a distinct string in
 * interpreted steps (numpy object arrays, pandas' factorize, str() of each key tuple);
 * here it is a few ns a value and the dict's own look-up a string. Python code runs only
 * in str() of values that are not str, int tuples: the distinct objects are held (strong
 * references) from step 1 on, and the columns are not read again after it, so that code
 * cannot pull an object out from under the encoder.
 *
 * The dict and ``new`` always agree: each code added to the dict is appended to ``new`` at
 * once, so a failure part-way (MemoryError, a __str__ that raises) leaves every code given
 * out true, and the caller's next code is its start plus the strings appended.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject *key; /* borrowed from the columns while step 1 runs, then held in `distinct` */
    Py_ssize_t index;
} Slot;

/* address -> index of the distinct object, open addressing, a power of two in size */
typedef struct {
    Slot *slots;
    size_t mask;
    Py_ssize_t used;
} Identity;

static inline size_t
address_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static int
identity_init(Identity *t, size_t capacity)
{
    size_t size = 1024;
    while (size < capacity * 2) {
        size <<= 1;
    }
    t->slots = PyMem_Calloc(size, sizeof(Slot));
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = size - 1;
    t->used = 0;
    return 0;
}

static int
identity_grow(Identity *t)
{
    size_t size = (t->mask + 1) * 4;
    Slot *slots = PyMem_Calloc(size, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].key != NULL) {
            size_t j = address_hash(t->slots[i].key) & (size - 1);
            while (slots[j].key != NULL) {
                j = (j + 1) & (size - 1);
            }
            slots[j] = t->slots[i];
        }
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->mask = size - 1;
    return 0;
}

/* the strings of a tuple's str items, for this call: a key's name is one object shared by
 * the keys of its graph layer, so its repr is made once, not once a key */
#define NAMES 64
typedef struct {
    PyObject *name[NAMES];
    PyObject *repr[NAMES];
} Names;

static void
names_clear(Names *c)
{
    for (int i = 0; i < NAMES; i++) {
        Py_CLEAR(c->name[i]);
        Py_CLEAR(c->repr[i]);
    }
}

/* repr(s) of an exact str, ASCII (NULL, no error: not ASCII; NULL with an error: failed) */
static PyObject *
name_repr(Names *c, PyObject *s)
{
    size_t i = address_hash(s) & (NAMES - 1);
    if (c->name[i] != s) {
        PyObject *r = PyObject_Repr(s);
        if (r == NULL) {
            return NULL;
        }
        Py_INCREF(s);
        Py_XSETREF(c->name[i], s);
        Py_XSETREF(c->repr[i], r);
    }
    return PyUnicode_IS_ASCII(c->repr[i]) ? c->repr[i] : NULL;
}

static Py_ssize_t decimal(char *buf, long long v);

#define KEY_ITEMS 16

/* str(t) of an exact tuple of exact str and int items, made from its parts as tuple's repr
 * makes it ("(a, b)", "(a,)"); NULL without an error when it is not such a tuple (the
 * caller then calls str() itself) */
static PyObject *
key_text(Names *names, PyObject *t)
{
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n == 0 || n > KEY_ITEMS) {
        return NULL;
    }
    PyObject *reprs[KEY_ITEMS];
    char digits[KEY_ITEMS][24];
    Py_ssize_t lengths[KEY_ITEMS];
    Py_ssize_t total = 2 + 2 * (n - 1) + (n == 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(t, i);
        reprs[i] = NULL;
        if (PyUnicode_CheckExact(item)) {
            PyObject *r = name_repr(names, item);
            if (r == NULL) {
                return NULL; /* not ASCII (or an error, which the caller's str() raises) */
            }
            reprs[i] = r;
            lengths[i] = PyUnicode_GET_LENGTH(r);
        }
        else if (PyLong_CheckExact(item)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
            if (overflow || (v == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return NULL;
            }
            lengths[i] = decimal(digits[i], v);
        }
        else {
            return NULL;
        }
        total += lengths[i];
    }
    PyObject *text = PyUnicode_New(total, 127);
    if (text == NULL) {
        return NULL;
    }
    char *out = (char *)PyUnicode_1BYTE_DATA(text);
    *out++ = '(';
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) {
            *out++ = ',';
            *out++ = ' ';
        }
        const char *src = reprs[i] ? (const char *)PyUnicode_1BYTE_DATA(reprs[i]) : digits[i];
        memcpy(out, src, (size_t)lengths[i]);
        out += lengths[i];
    }
    if (n == 1) {
        *out++ = ',';
    }
    *out = ')';
    return text;
}

static PyObject *
text_of(Names *names, PyObject *v)
{
    if (PyUnicode_CheckExact(v)) {
        Py_INCREF(v);
        return v;
    }
    if (PyTuple_CheckExact(v)) {
        PyObject *text = key_text(names, v);
        if (text != NULL || PyErr_Occurred()) {
            return text;
        }
    }
    return PyObject_Str(v);
}

static inline int
no_value(PyObject *v)
{
    /* the exact types first: PyFloat_Check of anything else walks its type's bases */
    if (PyUnicode_CheckExact(v) || PyTuple_CheckExact(v)) {
        return 0;
    }
    return v == Py_None || (PyFloat_Check(v) && isnan(PyFloat_AS_DOUBLE(v)));
}

/* the decimal digits of v into buf (at least 21 bytes), as int's repr writes them; their
 * count */
static Py_ssize_t
decimal(char *buf, long long v)
{
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    Py_ssize_t len = 0;
    if (v < 0) {
        buf[len++] = '-';
    }
    while (n) {
        buf[len++] = tmp[--n];
    }
    return len;
}

/* step 1: every row's distinct object (its index into `distinct`, or -1) into `out` */
static int
tell_apart(PyObject *columns, int32_t *out, Identity *seen, PyObject *distinct)
{
    Py_ssize_t row = 0;
    Py_ssize_t ncols = PyTuple_GET_SIZE(columns);
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *col = PyTuple_GET_ITEM(columns, c);
        Py_ssize_t len = PySequence_Fast_GET_SIZE(col);
        PyObject **items = PySequence_Fast_ITEMS(col);
        for (Py_ssize_t i = 0; i < len; i++, row++) {
            PyObject *v = items[i];
            if (no_value(v)) {
                out[row] = -1;
                continue;
            }
            size_t j = address_hash(v) & seen->mask;
            while (seen->slots[j].key != NULL && seen->slots[j].key != v) {
                j = (j + 1) & seen->mask;
            }
            if (seen->slots[j].key == NULL) {
                if (PyList_Append(distinct, v) < 0) { /* holds it from now on */
                    return -1;
                }
                seen->slots[j].key = v;
                seen->slots[j].index = seen->used++;
                out[row] = (int32_t)(seen->used - 1);
                if ((size_t)seen->used * 2 > seen->mask && identity_grow(seen) < 0) {
                    return -1;
                }
                continue;
            }
            out[row] = (int32_t)seen->slots[j].index;
        }
    }
    return 0;
}

/* steps 2 and 3: the code of each distinct object, into `codes_of` */
static int
look_up(PyObject *distinct, int32_t *codes_of, PyObject *codes, PyObject *new_, long long start)
{
    Names names;
    memset(&names, 0, sizeof(names));
    long long next = start;
    Py_ssize_t d = PyList_GET_SIZE(distinct);
    int failed = 0;
    for (Py_ssize_t k = 0; k < d && !failed; k++) {
        PyObject *text = text_of(&names, PyList_GET_ITEM(distinct, k));
        if (text == NULL) {
            failed = 1;
            break;
        }
        PyObject *found = PyDict_GetItemWithError(codes, text); /* borrowed */
        if (found != NULL) {
            codes_of[k] = (int32_t)PyLong_AsLong(found);
        }
        else if (PyErr_Occurred()) {
            failed = 1;
        }
        else {
            PyObject *code = PyLong_FromLongLong(next);
            if (code == NULL || PyList_Append(new_, text) < 0) {
                Py_XDECREF(code);
                failed = 1;
            }
            else {
                /* appended: the code is this string's (its row of the strings table) even
                 * if the dict cannot take it, which only means a later row gets another */
                codes_of[k] = (int32_t)next++;
                failed = PyDict_SetItem(codes, text, code) < 0;
                Py_DECREF(code);
            }
        }
        Py_DECREF(text);
    }
    names_clear(&names);
    return failed ? -1 : 0;
}

PyDoc_STRVAR(encode_into_doc,
    "encode_into(columns, out, codes, new, start, cache_size, hint)\n--\n\n"
    "Write the int32 code of every value of ``columns`` (a tuple of sequences, one after\n"
    "the other) into ``out`` (a writable int32 buffer of their total length). ``None``\n"
    "and float NaN are -1; a str is itself, anything else ``str(v)``. ``codes`` maps each\n"
    "known string to its code; a string not in it gets the code ``start`` plus the\n"
    "strings appended to ``new`` before it, and is appended to ``new``. ``codes`` is\n"
    "cleared first when it and this call's distinct values would exceed ``cache_size``.\n"
    "``hint``: how many distinct objects to expect (the last call's count will do).\n"
    "Returns how many distinct objects the columns held.");

static PyObject *
encode_into(PyObject *self, PyObject *args)
{
    PyObject *columns_in, *out_obj, *codes, *new_;
    long long start;
    Py_ssize_t cache_size, hint;
    if (!PyArg_ParseTuple(args, "O!OO!O!Lnn", &PyTuple_Type, &columns_in, &out_obj, &PyDict_Type,
                          &codes, &PyList_Type, &new_, &start, &cache_size, &hint)) {
        return NULL;
    }
    Py_ssize_t ncols = PyTuple_GET_SIZE(columns_in);
    PyObject *columns = PyTuple_New(ncols);
    if (columns == NULL) {
        return NULL;
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *col = PySequence_Fast(PyTuple_GET_ITEM(columns_in, c), "columns are sequences");
        if (col == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyTuple_SET_ITEM(columns, c, col);
        n += PySequence_Fast_GET_SIZE(col);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(out_obj, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(columns);
        return NULL;
    }
    PyObject *distinct = NULL;
    int32_t *codes_of = NULL;
    Identity seen = {NULL, 0, 0};
    PyObject *result = NULL;
    if (view.itemsize != 4 || view.format == NULL || strchr("iIl", view.format[0]) == NULL ||
        view.len != n * 4) {
        PyErr_Format(PyExc_ValueError, "out must be an int32 buffer of %zd values", n);
        goto done;
    }
    int32_t *out = (int32_t *)view.buf;
    distinct = PyList_New(0);
    /* sized for what is expected, at most a value a slot: a table made for a million rows
     * that hold a few thousand objects misses the CPU's caches */
    hint = hint < 1024 ? 1024 : hint;
    if (distinct == NULL || identity_init(&seen, (size_t)(hint < n ? hint : n)) < 0) {
        goto done;
    }
    if (tell_apart(columns, out, &seen, distinct) < 0) {
        goto done;
    }
    /* the columns are not read again: Python code that str() runs may change them */
    Py_CLEAR(columns);
    PyMem_Free(seen.slots);
    seen.slots = NULL;
    Py_ssize_t d = PyList_GET_SIZE(distinct);
    if (PyDict_GET_SIZE(codes) + d > cache_size) {
        PyDict_Clear(codes);
    }
    codes_of = PyMem_Malloc((size_t)(d ? d : 1) * sizeof(int32_t));
    if (codes_of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (look_up(distinct, codes_of, codes, new_, start) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (out[i] >= 0) {
            out[i] = codes_of[out[i]];
        }
    }
    result = PyLong_FromSsize_t(d);
done:
    PyMem_Free(seen.slots);
    PyMem_Free(codes_of);
    Py_XDECREF(distinct);
    Py_XDECREF(columns);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(vlen_utf8_doc,
    "vlen_utf8(values)\n--\n\n"
    "The bytes numcodecs' VLenUTF8 (Zarr v3's vlen-utf8 codec) encodes ``values`` (a\n"
    "sequence of str; ``None`` is an empty string) into: their count, then each one's\n"
    "UTF-8 length and bytes (little-endian uint32s). Each str's UTF-8 is read in place\n"
    "(an ASCII str is its own), not copied into a bytes object of its own first.");

static PyObject *
vlen_utf8(PyObject *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "values are a sequence of str");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL;
    if ((unsigned long long)n > 0xffffffffULL) {
        PyErr_SetString(PyExc_ValueError, "too many values for a vlen-utf8 chunk");
        goto done;
    }
    Py_ssize_t total = 4 + 4 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        Py_ssize_t len = 0;
        if (v == Py_None) {
            continue;
        }
        if (!PyUnicode_Check(v)) {
            PyErr_Format(PyExc_TypeError, "Expected str, got %s", Py_TYPE(v)->tp_name);
            goto done;
        }
        if (PyUnicode_AsUTF8AndSize(v, &len) == NULL) { /* cached in the str: read again below */
            goto done;
        }
        if ((unsigned long long)len > 0xffffffffULL) {
            PyErr_SetString(PyExc_ValueError, "a string too long for a vlen-utf8 chunk");
            goto done;
        }
        total += len;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        goto done;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
#define PUT_U32(x)                                 \
    do {                                           \
        uint32_t u_ = (uint32_t)(x);               \
        p[0] = (unsigned char)(u_ & 0xff);         \
        p[1] = (unsigned char)((u_ >> 8) & 0xff);  \
        p[2] = (unsigned char)((u_ >> 16) & 0xff); \
        p[3] = (unsigned char)(u_ >> 24);          \
        p += 4;                                    \
    } while (0)
    PUT_U32(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        Py_ssize_t len = 0;
        const char *utf8 = v == Py_None ? "" : PyUnicode_AsUTF8AndSize(v, &len);
        PUT_U32(len);
        memcpy(p, utf8, (size_t)len);
        p += len;
    }
#undef PUT_U32
done:
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"encode_into", encode_into, METH_VARARGS, encode_into_doc},
    {"vlen_utf8", vlen_utf8, METH_O, vlen_utf8_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "metacollect.store._codes",
    "The string table's encoder of code columns (encode_into) and of string columns\n"
    "(vlen_utf8).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__codes(void)
{
    return PyModule_Create(&module);
}
