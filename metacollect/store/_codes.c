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
 *   3. look each string up in the table's codes (Codes, a hash table of its own), adding
 *      the new ones (code = the next row of the group's strings table, in first-seen
 *      order) to ``new``;
 *   4. write every row's code (None and float NaN: -1) into ``out``.
 *
 * A Python encoder of these rows paid ~80 ns a value and ~500 ns a distinct string in
 * interpreted steps (numpy object arrays, pandas' factorize, str() of each key tuple);
 * here it is a few ns a value and a hash table's look-up a string. Python code runs only
 * in str() of values that are not str, int tuples: the distinct objects are held (strong
 * references) from step 1 on, and the columns are not read again after it, so that code
 * cannot pull an object out from under the encoder.
 *
 * The table and ``new`` always agree: each code added to the table is appended to ``new``
 * at once, so a failure part-way (MemoryError, a __str__ that raises) leaves every code given
 * out true, and the caller's next code is its start plus the strings appended.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

typedef struct {
    PyObject *key;
    Py_ssize_t index;
} Slot;

/* address -> index of the distinct object, open addressing, a power of two in size; and
 * the distinct objects, held (strong references) in a C array: a Python list of them would
 * be traversed by every collection of the cyclic GC while it lives */
typedef struct {
    Slot *slots;
    size_t mask;
    Py_ssize_t used;
    PyObject **objects; /* room for mask / 2 + 1: the table grows before it is fuller */
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
    t->objects = PyMem_Malloc((size / 2) * sizeof(PyObject *));
    if (t->objects == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
identity_free(Identity *t)
{
    PyMem_Free(t->slots);
    t->slots = NULL;
    for (Py_ssize_t i = 0; i < t->used; i++) {
        Py_DECREF(t->objects[i]);
    }
    PyMem_Free(t->objects);
    t->objects = NULL;
    t->used = 0;
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
    PyObject **objects = PyMem_Realloc(t->objects, (size / 2) * sizeof(PyObject *));
    if (objects == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->objects = objects;
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
                return NULL; /* not ASCII, or an error (set: the caller passes it on) */
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

/* step 1: every row's distinct object (its index into `seen->objects`) into `out` */
static int
tell_apart(PyObject *columns, int32_t *out, Identity *seen)
{
    Py_ssize_t row = 0;
    Py_ssize_t ncols = PyTuple_GET_SIZE(columns);
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *col = PyTuple_GET_ITEM(columns, c);
        Py_ssize_t len = PySequence_Fast_GET_SIZE(col);
        PyObject **items = PySequence_Fast_ITEMS(col);
        for (Py_ssize_t i = 0; i < len; i++, row++) {
            /* addresses only: reading each object (its type) would be a cache miss a key */
            PyObject *v = items[i];
            if (i + 8 < len) {
                PREFETCH(&seen->slots[address_hash(items[i + 8]) & seen->mask]);
            }
            size_t j = address_hash(v) & seen->mask;
            while (seen->slots[j].key != NULL && seen->slots[j].key != v) {
                j = (j + 1) & seen->mask;
            }
            if (seen->slots[j].key == NULL) {
                Py_INCREF(v); /* held from now on */
                seen->objects[seen->used] = v;
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

/* The string table's cache: text -> code. Its texts and their codes are held in arrays, in
 * the order added; a hash table of (hash, place in those arrays) finds them: 8 bytes a
 * slot, where (text, hash, code) took 16, so a scheduler's table of ~160k strings probed
 * once a distinct string is 4 MB of cache misses, not 8. It keeps its size when it
 * restarts (its texts let go, its slots zeroed): a dict emptied by clear() grows again
 * through ~15 resizes to a flush's 100k strings. */
typedef struct {
    uint32_t hash;
    int32_t place; /* 1 + the text's place in `texts`; 0: an empty slot */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries;
    size_t mask;
    PyObject **texts; /* exact str, held */
    int32_t *codes;
    Py_ssize_t used;
    Py_ssize_t room; /* of texts and codes */
    Py_ssize_t cache_size;
} Codes;

static inline int
same_text(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return len == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)len * (size_t)kind) == 0;
}

static inline size_t
slot_hash(uint32_t hash)
{
    return (size_t)hash * 0x9E3779B1u;
}

/* the slot of text (an exact str with its hash): the entry holding it, or the empty one
 * where it goes */
static inline Entry *
codes_slot(Codes *t, PyObject *text, uint32_t hash)
{
    size_t j = slot_hash(hash) & t->mask;
    for (;;) {
        Entry *e = &t->entries[j];
        if (e->place == 0 || (e->hash == hash && same_text(t->texts[e->place - 1], text))) {
            return e;
        }
        j = (j + 1) & t->mask;
    }
}

/* the hash table anew at `size` slots, for the texts held (NULL: no memory, nothing
 * changed) */
static Entry *
codes_rehash(Codes *t, size_t size)
{
    Entry *entries = PyMem_Calloc(size, sizeof(Entry));
    if (entries == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < t->used; i++) {
        uint32_t hash = (uint32_t)PyObject_Hash(t->texts[i]); /* cached in the str */
        size_t j = slot_hash(hash) & (size - 1);
        while (entries[j].place != 0) {
            j = (j + 1) & (size - 1);
        }
        entries[j].hash = hash;
        entries[j].place = (int32_t)(i + 1);
    }
    PyMem_Free(t->entries);
    t->entries = entries;
    t->mask = size - 1;
    return entries;
}

/* room for one more text; the hash table grown when it would be more than half full */
static int
codes_make_room(Codes *t)
{
    if (t->used == t->room) {
        Py_ssize_t room = t->room ? t->room * 2 : 512;
        PyObject **texts = PyMem_Realloc(t->texts, (size_t)room * sizeof(PyObject *));
        if (texts == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->texts = texts;
        int32_t *codes = PyMem_Realloc(t->codes, (size_t)room * sizeof(int32_t));
        if (codes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->codes = codes;
        t->room = room;
    }
    if ((size_t)(t->used + 1) * 2 > t->mask && codes_rehash(t, (t->mask + 1) * 2) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* slots for n strings: a power of two, at least twice n */
static size_t
codes_size(Py_ssize_t n)
{
    size_t size = 1024;
    while (size < 2 * (size_t)n) {
        size <<= 1;
    }
    return size;
}

/* forget every string; a table that a burst grew past twice what its cache needs goes
 * back to that size (else it would keep a burst's size for the rest of the run) */
static void
codes_clear(Codes *t)
{
    for (Py_ssize_t i = 0; i < t->used; i++) {
        Py_DECREF(t->texts[i]);
    }
    t->used = 0;
    if (t->entries == NULL) {
        return;
    }
    size_t want = codes_size(t->cache_size);
    if (t->mask + 1 <= 2 * want || codes_rehash(t, want) == NULL) {
        memset(t->entries, 0, (t->mask + 1) * sizeof(Entry)); /* kept at its size */
    }
    Py_ssize_t room = (Py_ssize_t)(want / 2);
    if (t->room > 2 * room) { /* a shrinking realloc that fails keeps the larger array */
        PyObject **texts = PyMem_Realloc(t->texts, (size_t)room * sizeof(PyObject *));
        if (texts != NULL) {
            t->texts = texts;
            t->room = room; /* codes hold at least as many, shrunk or not */
            int32_t *codes = PyMem_Realloc(t->codes, (size_t)room * sizeof(int32_t));
            if (codes != NULL) {
                t->codes = codes;
            }
        }
    }
}

static int
Codes_init(Codes *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cache_size", NULL};
    Py_ssize_t cache_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &cache_size)) {
        return -1;
    }
    codes_clear(self);
    PyMem_Free(self->entries);
    self->entries = PyMem_Calloc(1024, sizeof(Entry));
    if (self->entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->mask = 1023;
    self->used = 0;
    self->cache_size = cache_size;
    return 0;
}

static void
Codes_dealloc(Codes *self)
{
    codes_clear(self);
    PyMem_Free(self->entries);
    PyMem_Free(self->texts);
    PyMem_Free(self->codes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
Codes_len(Codes *self)
{
    return self->used;
}

/* the text of a distinct object for look_up: NULL for no value (None, float NaN); NULL
 * with an error set when str() failed */
static PyObject *
text_for_code(Names *names, PyObject *v)
{
    if (no_value(v)) {
        return NULL;
    }
    PyObject *text = text_of(names, v);
    if (text != NULL && !PyUnicode_CheckExact(text)) { /* a __str__ gave a subclass */
        Py_SETREF(text, PyUnicode_FromObject(text));
    }
    return text;
}

/* the code of text (with its hash): the table's, or the next one, given to it now (0), or
 * -1 with an error set */
static int
code_of(Codes *codes, PyObject *text, uint32_t hash, PyObject *new_, long long *next,
        int32_t *code)
{
    Entry *e = codes_slot(codes, text, hash);
    if (e->place != 0) {
        *code = codes->codes[e->place - 1];
        return 0;
    }
    if (codes_make_room(codes) < 0) {
        return -1;
    }
    if (PyList_Append(new_, text) < 0) {
        return -1;
    }
    /* appended: the code is this string's (its row of the strings table) */
    e = codes_slot(codes, text, hash); /* the table may have grown for it */
    *code = (int32_t)*next;
    Py_INCREF(text);
    codes->texts[codes->used] = text;
    codes->codes[codes->used] = (int32_t)(*next)++;
    e->hash = hash;
    e->place = (int32_t)++codes->used;
    return 0;
}

/* distinct objects whose texts and hashes are made before their slots are probed: each
 * probe of a large table is a cache miss, fetched meanwhile (a third of the encoder's time
 * waited on it when each text was probed as soon as made) */
#define BATCH 32

/* steps 2 and 3: the code of each distinct object, into `codes_of`, in order */
static int
look_up(Identity *seen, int32_t *codes_of, Codes *codes, PyObject *new_, long long start)
{
    Names names;
    memset(&names, 0, sizeof(names));
    long long next = start;
    Py_ssize_t d = seen->used;
    PyObject *texts[BATCH];
    uint32_t hashes[BATCH];
    int failed = 0;
    for (Py_ssize_t base = 0; base < d && !failed; base += BATCH) {
        Py_ssize_t m = d - base < BATCH ? d - base : BATCH, made = 0;
        for (; made < m; made++) {
            if (made + 4 < m) {
                PREFETCH(seen->objects[base + made + 4]);
            }
            PyObject *text = text_for_code(&names, seen->objects[base + made]);
            Py_hash_t hash = text == NULL ? 0 : PyObject_Hash(text);
            if (hash == -1) {
                Py_CLEAR(text);
            }
            if (text == NULL && PyErr_Occurred()) {
                failed = 1; /* the texts made before it still get their codes, in order */
                break;
            }
            texts[made] = text;
            hashes[made] = (uint32_t)hash;
            if (text != NULL) {
                PREFETCH(&codes->entries[slot_hash((uint32_t)hash) & codes->mask]);
            }
        }
        for (Py_ssize_t i = 0; i < made; i++) {
            PyObject *text = texts[i];
            if (text == NULL) {
                codes_of[base + i] = -1;
                continue;
            }
            if (!failed && code_of(codes, text, hashes[i], new_, &next, &codes_of[base + i]) < 0) {
                failed = 1; /* the rest of the batch only let go */
            }
            Py_DECREF(text);
        }
    }
    names_clear(&names);
    return failed ? -1 : 0;
}

PyDoc_STRVAR(encode_into_doc,
    "encode_into(columns, out, new, start, hint)\n--\n\n"
    "Write the int32 code of every value of ``columns`` (a tuple of sequences, one after\n"
    "the other) into ``out`` (a writable int32 buffer of their total length). ``None``\n"
    "and float NaN are -1; a str is itself, anything else ``str(v)``. A string this table\n"
    "holds has its code; one it does not gets the code ``start`` plus the strings\n"
    "appended to ``new`` before it, and is appended to ``new``. The table restarts\n"
    "(forgets every string) first when it and this call's distinct values would exceed\n"
    "its ``cache_size``.\n"
    "``hint``: how many distinct objects to expect (the last call's count will do).\n"
    "Returns how many distinct objects the columns held.");

static PyObject *
Codes_encode_into(Codes *codes, PyObject *args)
{
    PyObject *columns_in, *out_obj, *new_;
    long long start;
    Py_ssize_t hint;
    if (!PyArg_ParseTuple(args, "O!OO!Ln", &PyTuple_Type, &columns_in, &out_obj, &PyList_Type,
                          &new_, &start, &hint)) {
        return NULL;
    }
    if (codes->entries == NULL) {
        PyErr_SetString(PyExc_ValueError, "Codes(cache_size) was not initialised");
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
    int32_t *codes_of = NULL;
    Identity seen = {NULL, 0, 0, NULL};
    PyObject *result = NULL;
    if (view.itemsize != 4 || view.format == NULL || view.format[0] == '\0' ||
        strchr("iIl", view.format[0]) == NULL || view.len != n * 4) {
        PyErr_Format(PyExc_ValueError, "out must be an int32 buffer of %zd values", n);
        goto done;
    }
    int32_t *out = (int32_t *)view.buf;
    /* sized for what is expected, at most a value a slot: a table made for a million rows
     * that hold a few thousand objects misses the CPU's caches */
    hint = hint < 1024 ? 1024 : hint;
    if (identity_init(&seen, (size_t)(hint < n ? hint : n)) < 0) {
        goto done;
    }
    if (tell_apart(columns, out, &seen) < 0) {
        goto done;
    }
    /* the columns are not read again: Python code that str() runs may change them */
    Py_CLEAR(columns);
    PyMem_Free(seen.slots); /* the addresses are not looked up again */
    seen.slots = NULL;
    Py_ssize_t d = seen.used;
    if (codes->used + d > codes->cache_size) {
        codes_clear(codes);
    }
    codes_of = PyMem_Malloc((size_t)(d ? d : 1) * sizeof(int32_t));
    if (codes_of == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (look_up(&seen, codes_of, codes, new_, start) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = codes_of[out[i]]; /* -1 for None and NaN */
    }
    result = PyLong_FromSsize_t(d);
done:
    identity_free(&seen);
    PyMem_Free(codes_of);
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

PyDoc_STRVAR(holds_blank_doc,
    "holds_blank(data)\n--\n\n"
    "Whether vlen-utf8 bytes (see vlen_utf8) hold a string that is empty or only NULs:\n"
    "read off each string's length and bytes, in one pass. ``ValueError`` when the\n"
    "bytes are not whole vlen-utf8.");

static PyObject *
holds_blank(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *p = view.buf, *end = p + view.len;
#define GET_U32(at) \
    ((uint32_t)(at)[0] | (uint32_t)(at)[1] << 8 | (uint32_t)(at)[2] << 16 | (uint32_t)(at)[3] << 24)
    int found = 0, whole = view.len >= 4;
    if (whole) {
        uint32_t n = GET_U32(p);
        p += 4;
        for (uint32_t i = 0; i < n && !found; i++) {
            if (end - p < 4 || (uint32_t)(end - p - 4) < GET_U32(p)) {
                whole = 0;
                break;
            }
            uint32_t len = GET_U32(p);
            p += 4;
            found = 1;
            for (uint32_t k = 0; k < len; k++) {
                if (p[k]) {
                    found = 0;
                    break;
                }
            }
            p += len;
        }
    }
#undef GET_U32
    PyBuffer_Release(&view);
    if (!whole) {
        PyErr_SetString(PyExc_ValueError, "not whole vlen-utf8 bytes");
        return NULL;
    }
    return PyBool_FromLong(found);
}

PyDoc_STRVAR(items_doc,
    "items()\n--\n\n"
    "The (string, code) pairs the table holds, in the order they were added.");

static PyObject *
Codes_items(Codes *self, PyObject *unused)
{
    PyObject *out = PyList_New(self->used);
    for (Py_ssize_t i = 0; out != NULL && i < self->used; i++) {
        PyObject *pair = Py_BuildValue("(Oi)", self->texts[i], (int)self->codes[i]);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyObject *
Codes_clear(Codes *self, PyObject *unused)
{
    codes_clear(self);
    Py_RETURN_NONE;
}

static PyMethodDef Codes_methods[] = {
    {"encode_into", (PyCFunction)Codes_encode_into, METH_VARARGS, encode_into_doc},
    {"items", (PyCFunction)Codes_items, METH_NOARGS, items_doc},
    {"clear", (PyCFunction)Codes_clear, METH_NOARGS, "clear()\n--\n\nForget every string."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Codes_as_sequence = {
    .sq_length = (lenfunc)Codes_len,
};

static PyTypeObject CodesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metacollect.store._codes.Codes",
    .tp_doc = PyDoc_STR("Codes(cache_size)\n--\n\n"
                        "A group's strings and their codes, at most about ``cache_size``\n"
                        "of them (see encode_into)."),
    .tp_basicsize = sizeof(Codes),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Codes_init,
    .tp_dealloc = (destructor)Codes_dealloc,
    .tp_methods = Codes_methods,
    .tp_as_sequence = &Codes_as_sequence,
};

static PyMethodDef methods[] = {
    {"holds_blank", holds_blank, METH_O, holds_blank_doc},
    {"vlen_utf8", vlen_utf8, METH_O, vlen_utf8_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "metacollect.store._codes",
    "The string table's codes (Codes.encode_into) and the bytes of string columns\n"
    "(vlen_utf8, holds_blank).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__codes(void)
{
    if (PyType_Ready(&CodesType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&CodesType);
    if (PyModule_AddObject(m, "Codes", (PyObject *)&CodesType) < 0) {
        Py_DECREF(&CodesType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
