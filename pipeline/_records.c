/*
 * pipeline._records: the records of RecordBatch v2 batches, read once, into Arrow column buffers.
 *
 * Kafka's record layout (DefaultRecord.writeTo / readFrom, KIP-82 headers):
 *
 *   length: varint | attributes: int8 | timestampDelta: varlong | offsetDelta: varint |
 *   keyLength: varint (-1: null) | key | valueLength: varint (-1: null) | value |
 *   headersCount: varint | headers: [keyLength: varint | key (UTF-8) | valueLength: varint (-1: null) | value]
 *
 * varint/varlong are zigzag-encoded LEB128 (ByteUtils.readVarint / readVarlong).
 *
 * This file is the per-record loop of the decode worker (pipeline.table.arrow) and of the front end's
 * validation (pipeline.protocol.records); batch headers, CRCs and decompression stay in Python.
 * It has no state and does no I/O: bytes in, bytes out.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ reading */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Reader;

/* 0 on success; -1 when the bytes end first or the value has too many bytes. */
static int read_varlong(Reader *r, int max_bytes, int64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (r->p >= r->end) return -1;
        uint8_t b = *r->p++;
        value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
            return 0;
        }
        shift += 7;
    }
    return -1;
}

static int read_varint(Reader *r, int64_t *out) { return read_varlong(r, 5, out); }

/* ------------------------------------------------------------------ growing output buffers */

typedef struct {
    char *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
} Buffer;

static int buffer_reserve(Buffer *b, Py_ssize_t extra) {
    if (b->size + extra <= b->capacity) return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + extra) capacity *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int buffer_append(Buffer *b, const void *src, Py_ssize_t n) {
    if (buffer_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->size, src, (size_t)n);
    b->size += n;
    return 0;
}

static PyObject *buffer_to_bytes(Buffer *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->size);
}

/* A binary column being built: data, int32 offsets, a validity bitmap (1: present). */
typedef struct {
    Buffer data;
    int32_t *offsets; /* n + 1 */
    uint8_t *validity; /* (n + 7) / 8, zeroed */
    Py_ssize_t nulls;
} Column;

static int column_init(Column *c, Py_ssize_t n) {
    memset(c, 0, sizeof(*c));
    c->offsets = PyMem_Calloc((size_t)n + 1, sizeof(int32_t));
    c->validity = PyMem_Calloc((size_t)(n + 7) / 8 + 1, 1);
    if (c->offsets == NULL || c->validity == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void column_free(Column *c) {
    PyMem_Free(c->data.data);
    PyMem_Free(c->offsets);
    PyMem_Free(c->validity);
}

/* Row i: len < 0 is null. Raises OverflowError past 2 GiB of data (int32 offsets). */
static int column_put(Column *c, Py_ssize_t i, const uint8_t *src, int64_t len) {
    if (len < 0) {
        c->nulls++;
    } else {
        if (c->data.size + len > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "more than 2 GiB in one binary column");
            return -1;
        }
        if (buffer_append(&c->data, src, (Py_ssize_t)len) < 0) return -1;
        c->validity[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    c->offsets[i + 1] = (int32_t)c->data.size;
    return 0;
}

/* (data, offsets, validity or None when there is no null, null count) */
static PyObject *column_result(Column *c, Py_ssize_t n) {
    PyObject *data = buffer_to_bytes(&c->data);
    PyObject *offsets = PyBytes_FromStringAndSize((const char *)c->offsets, (n + 1) * (Py_ssize_t)sizeof(int32_t));
    PyObject *validity;
    if (c->nulls) {
        validity = PyBytes_FromStringAndSize((const char *)c->validity, (n + 7) / 8);
    } else {
        validity = Py_None;
        Py_INCREF(validity);
    }
    if (data == NULL || offsets == NULL || validity == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(offsets);
        Py_XDECREF(validity);
        return NULL;
    }
    return Py_BuildValue("(NNNn)", data, offsets, validity, c->nulls);
}

/* ------------------------------------------------------------------ errors */

static PyObject *RecordsError; /* pipeline._records.RecordsError(ValueError) */

/* Raise RecordsError(message, batch index, record index). */
static int fail(Py_ssize_t batch, Py_ssize_t record, const char *what) {
    PyObject *args = Py_BuildValue("(snn)", what, batch, record);
    if (args != NULL) {
        PyErr_SetObject(RecordsError, args);
        Py_DECREF(args);
    }
    return -1;
}

/* ------------------------------------------------------------------ one record */

typedef struct {
    int64_t timestamp_delta;
    const uint8_t *key;
    int64_t key_len;
    const uint8_t *value;
    int64_t value_len;
    int64_t header_count;
    const uint8_t *headers; /* the first header's bytes */
    const uint8_t *headers_end;
} Record;

/* Read one record at r (DefaultRecord.readFrom): its length must cover exactly its fields. */
static int read_record(Reader *r, Py_ssize_t batch, Py_ssize_t index, Record *rec) {
    int64_t length, offset_delta;
    if (read_varint(r, &length) < 0) return fail(batch, index, "truncated record length");
    if (length < 0 || length > r->end - r->p) return fail(batch, index, "record length past the end of the batch");
    Reader body = {r->p, r->p + length};
    r->p += length;
    if (body.p >= body.end) return fail(batch, index, "truncated attributes");
    body.p++; /* attributes: unused by Kafka for records */
    if (read_varlong(&body, 10, &rec->timestamp_delta) < 0) return fail(batch, index, "truncated timestamp delta");
    if (read_varint(&body, &offset_delta) < 0) return fail(batch, index, "truncated offset delta");
    if (read_varint(&body, &rec->key_len) < 0) return fail(batch, index, "truncated key length");
    if (rec->key_len < -1 || rec->key_len > body.end - body.p) return fail(batch, index, "key length out of range");
    rec->key = body.p;
    if (rec->key_len > 0) body.p += rec->key_len;
    if (read_varint(&body, &rec->value_len) < 0) return fail(batch, index, "truncated value length");
    if (rec->value_len < -1 || rec->value_len > body.end - body.p) return fail(batch, index, "value length out of range");
    rec->value = body.p;
    if (rec->value_len > 0) body.p += rec->value_len;
    if (read_varint(&body, &rec->header_count) < 0) return fail(batch, index, "truncated header count");
    if (rec->header_count < 0) return fail(batch, index, "negative header count");
    rec->headers = body.p;
    for (int64_t h = 0; h < rec->header_count; h++) {
        int64_t klen, vlen;
        if (read_varint(&body, &klen) < 0) return fail(batch, index, "truncated header key length");
        if (klen < 0 || klen > body.end - body.p) return fail(batch, index, "header key length out of range");
        PyObject *text = PyUnicode_DecodeUTF8((const char *)body.p, klen, "strict"); /* Kafka: a String */
        if (text == NULL) {
            PyErr_Clear();
            return fail(batch, index, "header key is not UTF-8");
        }
        Py_DECREF(text);
        body.p += klen;
        if (read_varint(&body, &vlen) < 0) return fail(batch, index, "truncated header value length");
        if (vlen < -1 || vlen > body.end - body.p) return fail(batch, index, "header value length out of range");
        if (vlen > 0) body.p += vlen;
    }
    rec->headers_end = body.p;
    if (body.p != body.end) return fail(batch, index, "bytes left inside the record after its headers");
    return 0;
}

/* ------------------------------------------------------------------ scan */

PyDoc_STRVAR(scan_doc,
"scan(records, count) -> (count, min_timestamp_delta, max_timestamp_delta)\n\n"
"Read the ``count`` records of one RecordBatch v2 (``records``: a bytes-like object holding\n"
"the bytes after the 61-byte batch header, decompressed) and check each one as Kafka's\n"
"DefaultRecord.readFrom does: every field inside the record's declared length, the length\n"
"used exactly, header keys UTF-8, no bytes after the last record.\n\n"
"Raises RecordsError(message, batch 0, record index) on the first bad record.");

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &view, &count)) return NULL;
    Reader r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    Record rec;
    Py_ssize_t i;
    for (i = 0; i < count; i++) {
        if (read_record(&r, 0, i, &rec) < 0) goto error;
        if (rec.timestamp_delta < lo) lo = rec.timestamp_delta;
        if (rec.timestamp_delta > hi) hi = rec.timestamp_delta;
    }
    if (r.p != r.end) {
        fail(0, count, "bytes left after the declared record count");
        goto error;
    }
    PyBuffer_Release(&view);
    if (count == 0) return Py_BuildValue("(nOO)", count, Py_None, Py_None);
    return Py_BuildValue("(nLL)", count, (long long)lo, (long long)hi);
error:
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ columns */

PyDoc_STRVAR(columns_doc,
"columns(batches, counts) -> dict\n\n"
"The records of many RecordBatch v2 batches as Arrow column buffers, in order.\n\n"
"``batches``: a list of bytes-like objects, each the bytes after one batch's 61-byte header,\n"
"decompressed; ``counts``: a list of the same length, each batch's record count. Returns a dict:\n"
"``rows``; ``timestamp_delta``: bytes of int64 (native order), one per row; ``key`` and\n"
"``value``: (data, int32 offsets, validity bitmap or None, null count), Arrow's binary layout;\n"
"``header_offsets``: bytes of int32 (rows + 1) into the headers, or None when no row has one;\n"
"``header_key`` (UTF-8, checked) and ``header_value``: (data, offsets, validity,\n"
"null count) over all headers. Checks every record as ``scan`` does.\n\n"
"Raises RecordsError(message, batch index, record index); OverflowError past 2 GiB in a column.");

static PyObject *columns(PyObject *self, PyObject *args) {
    PyObject *batches, *counts;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &batches, &PyList_Type, &counts)) return NULL;
    Py_ssize_t nbatches = PyList_GET_SIZE(batches);
    if (PyList_GET_SIZE(counts) != nbatches) {
        PyErr_SetString(PyExc_ValueError, "batches and counts differ in length");
        return NULL;
    }
    Py_ssize_t rows = 0;
    for (Py_ssize_t b = 0; b < nbatches; b++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyList_GET_ITEM(counts, b));
        if (c < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative record count");
            return NULL;
        }
        rows += c;
    }
    PyObject *result = NULL;
    Column key, value, hkey, hvalue;
    int64_t *deltas = NULL;
    int32_t *header_offsets = NULL;
    Py_ssize_t headers = 0;
    int any_headers = 0;
    memset(&hkey, 0, sizeof(hkey));
    memset(&hvalue, 0, sizeof(hvalue));
    if (column_init(&key, rows) < 0 || column_init(&value, rows) < 0) goto done;
    deltas = PyMem_Malloc(sizeof(int64_t) * (size_t)(rows ? rows : 1));
    header_offsets = PyMem_Calloc((size_t)rows + 1, sizeof(int32_t));
    if (deltas == NULL || header_offsets == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* the header columns grow as headers come: their row count is not known up front */
    Py_ssize_t hcap = 0;
    Py_ssize_t row = 0;
    for (Py_ssize_t b = 0; b < nbatches; b++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PyList_GET_ITEM(batches, b), &view, PyBUF_SIMPLE) < 0) goto done;
        Py_ssize_t count = PyLong_AsSsize_t(PyList_GET_ITEM(counts, b));
        Reader r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
        Record rec;
        for (Py_ssize_t i = 0; i < count; i++, row++) {
            if (read_record(&r, b, i, &rec) < 0) goto batch_error;
            deltas[row] = rec.timestamp_delta;
            if (column_put(&key, row, rec.key, rec.key_len) < 0) goto batch_error;
            if (column_put(&value, row, rec.value, rec.value_len) < 0) goto batch_error;
            if (rec.header_count > 0) {
                any_headers = 1;
                Reader h = {rec.headers, rec.headers_end};
                for (int64_t k = 0; k < rec.header_count; k++, headers++) {
                    int64_t klen = 0, vlen = -1;
                    if (headers + 1 >= hcap) { /* grow both header columns' offsets and validity */
                        Py_ssize_t cap = hcap ? hcap * 2 : 1024;
                        int32_t *ko = PyMem_Realloc(hkey.offsets, sizeof(int32_t) * (size_t)(cap + 1));
                        if (ko == NULL) { PyErr_NoMemory(); goto batch_error; }
                        hkey.offsets = ko;
                        int32_t *vo = PyMem_Realloc(hvalue.offsets, sizeof(int32_t) * (size_t)(cap + 1));
                        if (vo == NULL) { PyErr_NoMemory(); goto batch_error; }
                        hvalue.offsets = vo;
                        uint8_t *kv = PyMem_Realloc(hkey.validity, (size_t)(cap + 7) / 8 + 1);
                        if (kv == NULL) { PyErr_NoMemory(); goto batch_error; }
                        hkey.validity = kv;
                        uint8_t *vv = PyMem_Realloc(hvalue.validity, (size_t)(cap + 7) / 8 + 1);
                        if (vv == NULL) { PyErr_NoMemory(); goto batch_error; }
                        hvalue.validity = vv;
                        Py_ssize_t old = hcap ? (hcap + 7) / 8 + 1 : 0;
                        memset(hkey.validity + old, 0, (size_t)((cap + 7) / 8 + 1 - old));
                        memset(hvalue.validity + old, 0, (size_t)((cap + 7) / 8 + 1 - old));
                        if (!hcap) { hkey.offsets[0] = 0; hvalue.offsets[0] = 0; }
                        hcap = cap;
                    }
                    read_varint(&h, &klen); /* read_record checked these bounds */
                    if (column_put(&hkey, headers, h.p, klen) < 0) goto batch_error;
                    h.p += klen;
                    read_varint(&h, &vlen);
                    if (column_put(&hvalue, headers, h.p, vlen) < 0) goto batch_error;
                    if (vlen > 0) h.p += vlen;
                }
            }
            if (headers > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "more than 2**31 headers");
                goto batch_error;
            }
            header_offsets[row + 1] = (int32_t)headers;
        }
        if (r.p != r.end) {
            fail(b, count, "bytes left after the declared record count");
            goto batch_error;
        }
        PyBuffer_Release(&view);
        continue;
    batch_error:
        PyBuffer_Release(&view);
        goto done;
    }
    PyObject *key_result = column_result(&key, rows);
    PyObject *value_result = column_result(&value, rows);
    PyObject *delta_bytes = PyBytes_FromStringAndSize((const char *)deltas, rows * (Py_ssize_t)sizeof(int64_t));
    PyObject *hoffsets, *hkey_result, *hvalue_result;
    if (any_headers) {
        hoffsets = PyBytes_FromStringAndSize((const char *)header_offsets, (rows + 1) * (Py_ssize_t)sizeof(int32_t));
        hkey_result = column_result(&hkey, headers);
        hvalue_result = column_result(&hvalue, headers);
    } else {
        hoffsets = Py_None; Py_INCREF(Py_None);
        hkey_result = Py_None; Py_INCREF(Py_None);
        hvalue_result = Py_None; Py_INCREF(Py_None);
    }
    if (key_result && value_result && delta_bytes && hoffsets && hkey_result && hvalue_result) {
        result = Py_BuildValue("{s:n,s:N,s:N,s:N,s:N,s:N,s:N}", "rows", rows, "timestamp_delta", delta_bytes,
                               "key", key_result, "value", value_result, "header_offsets", hoffsets,
                               "header_key", hkey_result, "header_value", hvalue_result);
    } else {
        Py_XDECREF(key_result);
        Py_XDECREF(value_result);
        Py_XDECREF(delta_bytes);
        Py_XDECREF(hoffsets);
        Py_XDECREF(hkey_result);
        Py_XDECREF(hvalue_result);
    }
done:
    column_free(&key);
    column_free(&value);
    column_free(&hkey);
    column_free(&hvalue);
    PyMem_Free(deltas);
    PyMem_Free(header_offsets);
    return result;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"columns", columns, METH_VARARGS, columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeline._records",
    "RecordBatch v2 records read once, into Arrow column buffers (see pipeline/_records.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__records(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    RecordsError = PyErr_NewExceptionWithDoc(
        "pipeline._records.RecordsError",
        "A malformed record: args are (message, batch index, record index).", PyExc_ValueError, NULL);
    if (RecordsError == NULL || PyModule_AddObjectRef(m, "RecordsError", RecordsError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
