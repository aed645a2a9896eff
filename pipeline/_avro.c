/*
 * pipeline._avro: Avro binary record values straight into Arrow column buffers.
 *
 * A typed topic's values are read with fastavro into one Python dict per record, then each
 * column built from those dicts: ~11 CPU s per million 1 KiB records of a 16-field record on the
 * 2-core dev machine, most of a decode worker's time (issue 32). This module reads the common
 * case itself: a record of scalar fields (boolean, int, long, float, double, bytes, string, enum,
 * fixed; date, timestamp-millis/micros, local-timestamp-millis/micros; each optionally in a union
 * with null), each value read with the table's own schema (no resolution), into the validity
 * bitmaps, offsets and data of Arrow's columnar format (arrow.apache.org/docs/format/Columnar.html).
 *
 * It declines, value by value, everything else: a value that is not exactly a record of the plan
 * (short, trailing bytes, a union branch or enum index out of range, invalid UTF-8, an int or date
 * outside int32, a timestamp past int64 microseconds, a boolean byte other than 0 or 1, a varint
 * of more than 64 bits), a wire-format id not among the accepted ones, a value the caller marks
 * (skip). A declined value is a null row here; the caller reads it with its Python path
 * (pipeline.table.values), which says what is wrong with it, so errors are worded in one place.
 * No state, no I/O, no Python object per value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Avro's and Arrow's floats, Arrow's offsets and values are little-endian: copied as they are"
#endif

enum {
    K_BOOLEAN = 1, K_INT = 2, K_LONG = 3, K_FLOAT = 4, K_DOUBLE = 5, K_BYTES = 6, K_STRING = 7,
    K_FIXED = 8, K_ENUM = 9, K_DATE = 10, K_TIMESTAMP_MILLIS = 11, K_TIMESTAMP_MICROS = 12,
};
enum { WIRE_NONE = 0, WIRE_AUTO = 1, WIRE_CONFLUENT = 2 };
#define WIRE_HEADER 5 /* magic byte 0 + 4-byte big-endian schema id (Confluent's wire format) */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

typedef struct {
    int kind;
    Py_ssize_t union_n;     /* 0: not a union; else the union's branch count */
    Py_ssize_t null_index;  /* the null branch's index, -1 without */
    Py_ssize_t value_index; /* the value branch's index */
    Py_ssize_t fixed_size;  /* K_FIXED */
    PyObject *symbols;      /* K_ENUM: a tuple of bytes (UTF-8), borrowed from ops */
    int width;              /* bytes per value of a fixed-width column; 0: bit (boolean), -1: variable */
    Buf validity, offsets, data;
} Column;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) { PyErr_NoMemory(); return -1; }
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* A zero-filled buffer of exactly n bytes. */
static int buf_zeros(Buf *b, Py_ssize_t n) {
    b->p = PyMem_Calloc((size_t)(n ? n : 1), 1);
    if (b->p == NULL) { PyErr_NoMemory(); return -1; }
    b->len = b->cap = n;
    return 0;
}

static inline void bit_set(char *bits, Py_ssize_t i) { bits[i >> 3] |= (char)(1 << (i & 7)); }
static inline void bit_clear(char *bits, Py_ssize_t i) { bits[i >> 3] &= (char)~(1 << (i & 7)); }

/* Avro's long: a zigzag varint of at most 64 bits (10 bytes, the 10th 0 or 1); 0 or -1 (decline). */
static inline int read_long(const uint8_t **pp, const uint8_t *end, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t n = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return -1;
        uint8_t b = *p++;
        if (shift == 63 && b > 1) return -1; /* bits past 64: fastavro keeps the low ones; leave it to it */
        n |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = (int64_t)((n >> 1) ^ (~(n & 1) + 1));
            return 0;
        }
    }
    return -1;
}

/* UTF-8 as Python's strict decoder has it (RFC 3629: no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_valid(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) { i += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0; /* overlong */
            if (c == 0xED && c1 > 0x9F) return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0; /* overlong */
            if (c == 0xF4 && c1 > 0x8F) return 0; /* past U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Append a variable-width value (row i) to its column; -1 with an exception set on failure. */
static int put_bytes(Column *c, Py_ssize_t i, const uint8_t *s, Py_ssize_t n) {
    if (buf_reserve(&c->data, n) < 0) return -1;
    memcpy(c->data.p + c->data.len, s, (size_t)n);
    c->data.len += n;
    if (c->data.len > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a column's values exceed 2 GiB (int32 offsets)");
        return -1;
    }
    ((int32_t *)c->offsets.p)[i + 1] = (int32_t)c->data.len;
    return 0;
}

/* Read column c's value of row i from *pp: 1 read, 0 decline, -1 error (exception set). */
static int read_value(Column *c, Py_ssize_t i, const uint8_t **pp, const uint8_t *end) {
    const uint8_t *p = *pp;
    int64_t v;
    if (c->union_n) {
        if (read_long(&p, end, &v) < 0 || v < 0 || v >= c->union_n) return 0;
        if (v == c->null_index) { /* null: validity bit stays 0, offsets repeat */
            if (c->width < 0) ((int32_t *)c->offsets.p)[i + 1] = (int32_t)c->data.len;
            *pp = p;
            return 1;
        }
        if (v != c->value_index) return 0;
    }
    switch (c->kind) {
    case K_BOOLEAN:
        if (p >= end || *p > 1) return 0;
        if (*p) bit_set(c->data.p, i);
        p++;
        break;
    case K_INT:
    case K_DATE:
        if (read_long(&p, end, &v) < 0 || v < INT32_MIN || v > INT32_MAX) return 0;
        ((int32_t *)c->data.p)[i] = (int32_t)v;
        break;
    case K_LONG:
    case K_TIMESTAMP_MICROS:
        if (read_long(&p, end, &v) < 0) return 0;
        ((int64_t *)c->data.p)[i] = v;
        break;
    case K_TIMESTAMP_MILLIS: {
        int64_t us;
        if (read_long(&p, end, &v) < 0 || __builtin_mul_overflow(v, (int64_t)1000, &us)) return 0;
        ((int64_t *)c->data.p)[i] = us;
        break;
    }
    case K_FLOAT:
        if (end - p < 4) return 0;
        memcpy(c->data.p + 4 * i, p, 4); /* Avro and Arrow: IEEE 754, little-endian */
        p += 4;
        break;
    case K_DOUBLE:
        if (end - p < 8) return 0;
        memcpy(c->data.p + 8 * i, p, 8);
        p += 8;
        break;
    case K_BYTES:
    case K_STRING:
        if (read_long(&p, end, &v) < 0 || v < 0 || v > end - p) return 0;
        if (c->kind == K_STRING && !utf8_valid(p, (Py_ssize_t)v)) return 0;
        if (put_bytes(c, i, p, (Py_ssize_t)v) < 0) return -1;
        p += v;
        break;
    case K_FIXED:
        if (end - p < c->fixed_size) return 0;
        if (put_bytes(c, i, p, c->fixed_size) < 0) return -1;
        p += c->fixed_size;
        break;
    case K_ENUM: {
        if (read_long(&p, end, &v) < 0 || v < 0 || v >= PyTuple_GET_SIZE(c->symbols)) return 0;
        PyObject *symbol = PyTuple_GET_ITEM(c->symbols, v);
        if (put_bytes(c, i, (const uint8_t *)PyBytes_AS_STRING(symbol), PyBytes_GET_SIZE(symbol)) < 0) return -1;
        break;
    }
    default:
        return 0;
    }
    bit_set(c->validity.p, i);
    *pp = p;
    return 1;
}

/* Row i of every column is null: a tombstone, or a value declined after some columns were read. */
static void null_row(Column *cols, Py_ssize_t ncols, Py_ssize_t i, const Py_ssize_t *data_marks) {
    for (Py_ssize_t k = 0; k < ncols; k++) {
        Column *c = &cols[k];
        bit_clear(c->validity.p, i);
        if (c->width < 0) {
            c->data.len = data_marks[k];
            ((int32_t *)c->offsets.p)[i + 1] = (int32_t)c->data.len;
        } else if (c->width == 0) {
            bit_clear(c->data.p, i);
        } else {
            memset(c->data.p + (Py_ssize_t)c->width * i, 0, (size_t)c->width);
        }
    }
}

static void free_columns(Column *cols, Py_ssize_t ncols) {
    if (cols == NULL) return;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        PyMem_Free(cols[k].validity.p);
        PyMem_Free(cols[k].offsets.p);
        PyMem_Free(cols[k].data.p);
    }
    PyMem_Free(cols);
}

/* The plan: one (kind, union_n, null_index, value_index, extra) tuple per field; 0 or -1. */
static int read_plan(PyObject *ops, Column *cols, Py_ssize_t ncols, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < ncols; k++) {
        PyObject *op = PyTuple_GET_ITEM(ops, k);
        Column *c = &cols[k];
        PyObject *extra;
        if (!PyTuple_Check(op) || !PyArg_ParseTuple(op, "innnO", &c->kind, &c->union_n, &c->null_index,
                                                    &c->value_index, &extra)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an op is a (kind, union_n, null_index, value_index, extra) tuple");
            return -1;
        }
        if (c->union_n < 0 || (c->union_n && (c->value_index < 0 || c->value_index >= c->union_n ||
                                              c->null_index >= c->union_n || c->null_index == c->value_index))) {
            PyErr_Format(PyExc_ValueError, "op %zd: bad union branches", k);
            return -1;
        }
        switch (c->kind) {
        case K_BOOLEAN: c->width = 0; break;
        case K_INT: case K_DATE: case K_FLOAT: c->width = 4; break;
        case K_LONG: case K_DOUBLE: case K_TIMESTAMP_MILLIS: case K_TIMESTAMP_MICROS: c->width = 8; break;
        case K_BYTES: case K_STRING: c->width = -1; break;
        case K_FIXED:
            c->width = -1;
            c->fixed_size = PyLong_AsSsize_t(extra);
            if (c->fixed_size < 1) {
                if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "op %zd: a fixed needs a size >= 1", k);
                return -1;
            }
            break;
        case K_ENUM:
            c->width = -1;
            if (!PyTuple_Check(extra) || PyTuple_GET_SIZE(extra) == 0) {
                PyErr_Format(PyExc_TypeError, "op %zd: an enum's symbols are a non-empty tuple of bytes", k);
                return -1;
            }
            for (Py_ssize_t s = 0; s < PyTuple_GET_SIZE(extra); s++) {
                if (!PyBytes_Check(PyTuple_GET_ITEM(extra, s))) {
                    PyErr_Format(PyExc_TypeError, "op %zd: an enum's symbols are bytes", k);
                    return -1;
                }
            }
            c->symbols = extra;
            break;
        default:
            PyErr_Format(PyExc_ValueError, "op %zd: unknown kind %d", k, c->kind);
            return -1;
        }
        if (buf_zeros(&c->validity, (count + 7) / 8) < 0) return -1;
        if (c->width < 0) {
            if (buf_zeros(&c->offsets, 4 * (count + 1)) < 0) return -1;
            c->data.p = NULL;
            c->data.len = c->data.cap = 0;
            if (buf_reserve(&c->data, 64) < 0) return -1;
        } else if (buf_zeros(&c->data, c->width ? (Py_ssize_t)c->width * count : (count + 7) / 8) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *column_tuple(Column *c) {
    PyObject *validity = PyBytes_FromStringAndSize(c->validity.p, c->validity.len);
    PyObject *offsets = c->width < 0 ? PyBytes_FromStringAndSize(c->offsets.p, c->offsets.len) : Py_NewRef(Py_None);
    PyObject *data = PyBytes_FromStringAndSize(c->data.p, c->data.len);
    PyObject *t = NULL;
    if (validity && offsets && data) t = PyTuple_Pack(3, validity, offsets, data);
    Py_XDECREF(validity);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    return t;
}

PyDoc_STRVAR(columns_doc,
"columns(ops, count, validity, offsets, data, offset, large, wire, ids, skip, /)\n"
"    -> (list[(validity, offsets | None, data)], declined: list[int])\n\n"
"Read ``count`` Avro record values of an Arrow binary array (its ``validity`` bitmap or None, its\n"
"``offsets``: int32, or int64 when ``large``, and its ``data`` buffer or None; ``offset``: the\n"
"array's slice offset) into one column per op, as Arrow buffers (bytes): a validity bitmap, int32\n"
"offsets for a variable-width column (else None), and the values (a bitmap for a boolean).\n\n"
"``ops``: a tuple of (kind, union_n, null_index, value_index, extra) per field, in order: kind as\n"
"the K_* constants, union_n 0 when the field is not a union (else its branch count, null_index\n"
"the null branch or -1, value_index the value's branch), extra the size of a fixed or the enum's\n"
"symbols as a tuple of UTF-8 bytes (else None). ``wire``: 0 never strip a wire-format header, 1\n"
"strip one when a value starts with magic byte 0 and has 5 bytes, 2 require one. ``ids``: None\n"
"(any wire-format schema id) or a tuple of the ids read with this plan; ``skip``: None or a\n"
"buffer of ``count`` bytes, nonzero for a value to decline.\n\n"
"A null value (tombstone) is a null row. A declined value is a null row and its index is in\n"
"``declined``, ascending. Raises ValueError for offsets outside the data, TypeError or\n"
"ValueError for a malformed plan, OverflowError when a column's values pass 2 GiB.");

static PyObject *columns(PyObject *self, PyObject *args) {
    PyObject *ops, *validity_obj, *offsets_obj, *data_obj, *ids_obj, *skip_obj;
    Py_ssize_t count, offset;
    int large, wire;
    if (!PyArg_ParseTuple(args, "O!nOOOnpiOO", &PyTuple_Type, &ops, &count, &validity_obj, &offsets_obj,
                          &data_obj, &offset, &large, &wire, &ids_obj, &skip_obj))
        return NULL;
    if (count < 0 || offset < 0 || wire < WIRE_NONE || wire > WIRE_CONFLUENT) {
        PyErr_SetString(PyExc_ValueError, "count and offset are >= 0, wire 0, 1 or 2");
        return NULL;
    }
    Py_buffer vbuf = {0}, obuf = {0}, dbuf = {0}, sbuf = {0};
    Column *cols = NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(ops);
    int64_t *ids = NULL;
    Py_ssize_t nids = -1;
    Py_ssize_t *marks = NULL;
    PyObject *declined = NULL, *result = NULL, *out = NULL;

    if (validity_obj != Py_None && PyObject_GetBuffer(validity_obj, &vbuf, PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(offsets_obj, &obuf, PyBUF_SIMPLE) < 0) goto done;
    if (data_obj != Py_None && PyObject_GetBuffer(data_obj, &dbuf, PyBUF_SIMPLE) < 0) goto done;
    if (skip_obj != Py_None && PyObject_GetBuffer(skip_obj, &sbuf, PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t width = large ? 8 : 4;
    if (obuf.len < (offset + count + 1) * width || (vbuf.buf && vbuf.len * 8 < offset + count) ||
        (sbuf.buf && sbuf.len < count)) {
        PyErr_SetString(PyExc_ValueError, "buffers shorter than offset + count values");
        goto done;
    }
    if (ids_obj != Py_None) {
        if (!PyTuple_Check(ids_obj)) {
            PyErr_SetString(PyExc_TypeError, "ids is None or a tuple of ints");
            goto done;
        }
        nids = PyTuple_GET_SIZE(ids_obj);
        ids = PyMem_Malloc(sizeof(int64_t) * (size_t)(nids ? nids : 1));
        if (ids == NULL) { PyErr_NoMemory(); goto done; }
        for (Py_ssize_t j = 0; j < nids; j++) {
            ids[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(ids_obj, j));
            if (ids[j] == -1 && PyErr_Occurred()) goto done;
        }
    }
    cols = PyMem_Calloc((size_t)(ncols ? ncols : 1), sizeof(Column));
    marks = PyMem_Calloc((size_t)(ncols ? ncols : 1), sizeof(Py_ssize_t));
    if (cols == NULL || marks == NULL) { PyErr_NoMemory(); goto done; }
    if (read_plan(ops, cols, ncols, count) < 0) goto done;
    declined = PyList_New(0);
    if (declined == NULL) goto done;

    const uint8_t *vbits = vbuf.buf;
    const uint8_t *data = dbuf.buf;
    Py_ssize_t data_len = dbuf.buf ? dbuf.len : 0;
    const uint8_t *skip = sbuf.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t at = offset + i;
        int64_t start, stop;
        if (large) {
            memcpy(&start, (const char *)obuf.buf + 8 * at, 8);
            memcpy(&stop, (const char *)obuf.buf + 8 * (at + 1), 8);
        } else {
            int32_t s32, e32;
            memcpy(&s32, (const char *)obuf.buf + 4 * at, 4);
            memcpy(&e32, (const char *)obuf.buf + 4 * (at + 1), 4);
            start = s32;
            stop = e32;
        }
        for (Py_ssize_t k = 0; k < ncols; k++) marks[k] = cols[k].data.len;
        if (vbits && !(vbits[at >> 3] >> (at & 7) & 1)) { /* a tombstone */
            null_row(cols, ncols, i, marks);
            continue;
        }
        if (start < 0 || stop < start || stop > data_len) {
            PyErr_Format(PyExc_ValueError, "value %zd: offsets %lld..%lld outside %zd data bytes", i,
                         (long long)start, (long long)stop, data_len);
            goto done;
        }
        const uint8_t *p = data + start, *end = data + stop;
        int ok = !(skip && skip[i]);
        if (ok && wire != WIRE_NONE && end - p >= WIRE_HEADER && p[0] == 0) {
            int32_t id = (int32_t)((uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4]);
            if (ids) {
                ok = 0;
                for (Py_ssize_t j = 0; j < nids; j++) ok |= ids[j] == id;
            }
            p += WIRE_HEADER;
        } else if (wire == WIRE_CONFLUENT) {
            ok = 0;
        }
        for (Py_ssize_t k = 0; ok && k < ncols; k++) {
            int r = read_value(&cols[k], i, &p, end);
            if (r < 0) goto done;
            ok = r;
        }
        if (ok && p != end) ok = 0; /* trailing bytes */
        if (!ok) { /* the row is null in every column, what was read of it undone */
            null_row(cols, ncols, i, marks);
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(declined, index) < 0) { Py_XDECREF(index); goto done; }
            Py_DECREF(index);
        }
    }
    out = PyList_New(ncols);
    if (out == NULL) goto done;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        PyObject *t = column_tuple(&cols[k]);
        if (t == NULL) goto done;
        PyList_SET_ITEM(out, k, t);
    }
    result = PyTuple_Pack(2, out, declined);

done:
    Py_XDECREF(out);
    Py_XDECREF(declined);
    free_columns(cols, ncols);
    PyMem_Free(marks);
    PyMem_Free(ids);
    if (vbuf.buf) PyBuffer_Release(&vbuf);
    if (obuf.buf) PyBuffer_Release(&obuf);
    if (dbuf.buf) PyBuffer_Release(&dbuf);
    if (sbuf.buf) PyBuffer_Release(&sbuf);
    return result;
}

static PyMethodDef methods[] = {
    {"columns", columns, METH_VARARGS, columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeline._avro",
    "Avro binary record values into Arrow column buffers (see pipeline/_avro.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__avro(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    struct { const char *name; int value; } constants[] = {
        {"K_BOOLEAN", K_BOOLEAN}, {"K_INT", K_INT}, {"K_LONG", K_LONG}, {"K_FLOAT", K_FLOAT},
        {"K_DOUBLE", K_DOUBLE}, {"K_BYTES", K_BYTES}, {"K_STRING", K_STRING}, {"K_FIXED", K_FIXED},
        {"K_ENUM", K_ENUM}, {"K_DATE", K_DATE}, {"K_TIMESTAMP_MILLIS", K_TIMESTAMP_MILLIS},
        {"K_TIMESTAMP_MICROS", K_TIMESTAMP_MICROS},
    };
    for (size_t j = 0; j < sizeof constants / sizeof constants[0]; j++) {
        if (PyModule_AddIntConstant(m, constants[j].name, constants[j].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
