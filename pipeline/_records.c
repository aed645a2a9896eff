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
 * validation (pipeline.protocol.records), and the front end's per-request hot path (issue 23): a
 * Produce body read into its partitions (produce_body) and the whole check of uncompressed batches
 * (summarize). Decompression and every error message stay in Python: these decline (None) whatever
 * they do not accept, and the Python code they stand in front of decides.
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
    if (n == 0) return 0; /* b->data may still be NULL, and memcpy(NULL, ..., 0) is undefined (UBSan) */
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
    memset(&key, 0, sizeof(key)); /* all four: column_free of one never initialized is then a no-op */
    memset(&value, 0, sizeof(value));
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

/* ------------------------------------------------------------------ big-endian fields */

static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }
static inline uint32_t be32u(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline int32_t be32(const uint8_t *p) { return (int32_t)be32u(p); }
static inline int64_t be64(const uint8_t *p) { return (int64_t)(((uint64_t)be32u(p) << 32) | be32u(p + 4)); }

/* ------------------------------------------------------------------ summarize */

static PyObject *crc32c_function; /* crc32c.crc32c: the CRC32C of a bytes-like object (the crc32c package) */

/* The CRC32C of n bytes at p, computed by the crc32c package; 0 with *ok = 0 on a Python error. */
static uint32_t crc32c_of(const uint8_t *p, Py_ssize_t n, int *ok) {
    *ok = 0;
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) return 0;
    PyObject *value = PyObject_CallOneArg(crc32c_function, view);
    Py_DECREF(view);
    if (value == NULL) return 0;
    unsigned long crc = PyLong_AsUnsignedLong(value);
    Py_DECREF(value);
    if (PyErr_Occurred()) return 0;
    *ok = 1;
    return (uint32_t)crc;
}

#define LOG_OVERHEAD 12      /* base offset: int64, length: int32 */
#define BATCH_HEADER 61      /* RecordBatch v2 header (DefaultRecordBatch.RECORD_BATCH_OVERHEAD) */
#define CODEC_MASK 0x07
#define TIMESTAMP_TYPE_MASK 0x08
#define TRANSACTIONAL_MASK 0x10
#define CONTROL_MASK 0x20

PyDoc_STRVAR(summarize_doc,
"summarize(records, min_timestamp_ms, max_timestamp_ms) -> tuple | None\n\n"
"The summary of one partition's records (concatenated RecordBatch v2 batches) when every batch is\n"
"uncompressed and valid, else None: the caller's full check (pipeline.protocol.records.validate_records)\n"
"then inflates compressed batches or names what is wrong. For the records it summarizes it checks\n"
"exactly what validate_records checks (lengths, magic 2, the 61-byte header, CRC32C through the crc32c\n"
"package, the record count against the last offset delta, no control batch, one producer and one\n"
"transactional flag for all batches, every record as ``scan`` reads it, CreateTime timestamps within\n"
"[min_timestamp_ms, max_timestamp_ms]) and returns the same fields as its RecordsInfo:\n"
"(record_count, batch_count, producer_id, producer_epoch, base_sequence, last_sequence,\n"
"is_transactional, max_timestamp_ms, uncompressed_bytes).");

typedef struct {
    int64_t record_count, uncompressed, max_timestamp, last_sequence, producer_id;
    Py_ssize_t batch_count;
    int producer_epoch, base_sequence, transactional;
} Summary;

/* summarize's checks over n bytes at base: 1 with *out filled when every batch is uncompressed and
 * valid, 0 to decline, -1 with a Python error set (the crc32c call failed). */
static int summarize_buf(const uint8_t *base, Py_ssize_t end, long long min_ts, long long max_ts, Summary *out) {
    Py_ssize_t pos = 0, index = 0;
    int64_t record_count = 0, uncompressed = 0, max_timestamp = -1, last_sequence = -1;
    int64_t producer_id = 0;
    int producer_epoch = 0, base_sequence = 0, transactional = 0;
    if (end == 0) return 0;
    while (pos < end) {
        const uint8_t *b = base + pos;
        Py_ssize_t remaining = end - pos;
        if (remaining < LOG_OVERHEAD) return 0;
        int32_t length = be32(b + 8);
        if (length < 0 || (int64_t)length > remaining - LOG_OVERHEAD) return 0;
        Py_ssize_t batch_size = LOG_OVERHEAD + (Py_ssize_t)length;
        if (batch_size < BATCH_HEADER || b[16] != 2) return 0;
        uint32_t crc = be32u(b + 17);
        int attributes = be16(b + 21);
        int32_t last_offset_delta = be32(b + 23);
        int64_t first_timestamp = be64(b + 27);
        int64_t batch_max_timestamp = be64(b + 35);
        int64_t pid = be64(b + 43);
        int epoch = be16(b + 51);
        int32_t sequence = be32(b + 53);
        int32_t count = be32(b + 57);
        if (attributes & (CODEC_MASK | CONTROL_MASK)) return 0; /* compressed: inflated by the caller */
        int ok;
        uint32_t computed = crc32c_of(b + 21, batch_size - 21, &ok); /* the CRC covers attributes..end */
        if (!ok) return -1;
        if (computed != crc) return 0;
        if (count < 1 || (int64_t)count != (int64_t)last_offset_delta + 1) return 0;
        int txn = (attributes & TRANSACTIONAL_MASK) != 0;
        if (index == 0) {
            producer_id = pid;
            producer_epoch = epoch;
            base_sequence = sequence;
            transactional = txn;
        } else if (txn != transactional || pid != producer_id || epoch != producer_epoch) {
            return 0;
        }
        Reader r = {b + BATCH_HEADER, b + batch_size};
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        Record rec;
        for (int32_t i = 0; i < count; i++) {
            if (read_record(&r, index, i, &rec) < 0) {
                PyErr_Clear(); /* the caller's full check says what is wrong */
                return 0;
            }
            if (rec.timestamp_delta < lo) lo = rec.timestamp_delta;
            if (rec.timestamp_delta > hi) hi = rec.timestamp_delta;
        }
        if (r.p != r.end) return 0;
        if (!(attributes & TIMESTAMP_TYPE_MASK)) { /* CreateTime: each record's time must fit the table */
            int64_t low, high;
            if (__builtin_add_overflow(first_timestamp, lo, &low) ||
                __builtin_add_overflow(first_timestamp, hi, &high) || low < min_ts || high > max_ts)
                return 0;
        }
        if (sequence == -1) {
            last_sequence = -1;
        } else { /* sequences wrap from INT32_MAX to 0 (DefaultRecordBatch.incrementSequence) */
            int64_t m = (int64_t)INT32_MAX + 1;
            last_sequence = (((int64_t)sequence + last_offset_delta) % m + m) % m;
        }
        record_count += count;
        uncompressed += batch_size;
        if (batch_max_timestamp > max_timestamp) max_timestamp = batch_max_timestamp;
        pos += batch_size;
        index++;
    }
    out->record_count = record_count;
    out->batch_count = index;
    out->producer_id = producer_id;
    out->producer_epoch = producer_epoch;
    out->base_sequence = base_sequence;
    out->last_sequence = last_sequence;
    out->transactional = transactional;
    out->max_timestamp = max_timestamp;
    out->uncompressed = uncompressed;
    return 1;
}

static PyObject *summarize(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long min_ts, max_ts;
    if (!PyArg_ParseTuple(args, "y*LL", &view, &min_ts, &max_ts)) return NULL;
    Summary s;
    int got = summarize_buf((const uint8_t *)view.buf, view.len, min_ts, max_ts, &s);
    PyBuffer_Release(&view);
    if (got < 0) return NULL;
    if (got == 0) Py_RETURN_NONE;
    return Py_BuildValue("(LnLiiLOLL)", (long long)s.record_count, s.batch_count, (long long)s.producer_id,
                         s.producer_epoch, s.base_sequence, (long long)s.last_sequence,
                         s.transactional ? Py_True : Py_False, (long long)s.max_timestamp,
                         (long long)s.uncompressed);
}

/* ------------------------------------------------------------------ produce_body */

typedef struct {
    const uint8_t *buf;
    Py_ssize_t pos, end;
    int flexible;
} Body;

/* An unsigned varint of at most 5 bytes (as kio reads them); -1 when truncated or longer. */
static int64_t body_uvarint(Body *r) {
    uint64_t value = 0;
    int shift = 0;
    for (Py_ssize_t i = r->pos; i < r->pos + 5 && i < r->end; i++) {
        uint8_t byte = r->buf[i];
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            r->pos = i + 1;
            return (int64_t)value;
        }
        shift += 7;
    }
    return -1;
}

/* A string, bytes or array length: compact (uvarint, length + 1, 0 = null) when flexible, else a
 * signed int16 (fixed == 2) or int32 (fixed == 4), -1 = null. Returns 0 with *out set (-1: null,
 * below -1: malformed), -1 when truncated. */
static int body_length(Body *r, int fixed, int64_t *out) {
    if (r->flexible) {
        if (r->pos >= r->end) return -1;
        int64_t n = body_uvarint(r);
        *out = n >= 0 ? n - 1 : -2;
        return 0;
    }
    if (r->pos + fixed > r->end) return -1;
    *out = fixed == 2 ? be16(r->buf + r->pos) : be32(r->buf + r->pos);
    r->pos += fixed;
    return 0;
}

/* A flexible version's empty tagged-field section (one 0 byte): 0 if there, -1 otherwise. */
static int body_no_tags(Body *r) {
    if (!r->flexible) return 0;
    if (r->pos >= r->end || r->buf[r->pos] != 0) return -1;
    r->pos++;
    return 0;
}

/* A non-null UTF-8 string of n bytes at the read position, or NULL (no Python error) if it is not. */
static PyObject *body_string(Body *r, int64_t n) {
    if (n < 0 || n > r->end - r->pos) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->buf + r->pos, (Py_ssize_t)n, "strict");
    if (s == NULL) {
        PyErr_Clear();
        return NULL;
    }
    r->pos += (Py_ssize_t)n;
    return s;
}

PyDoc_STRVAR(produce_body_doc,
"produce_body(frame, pos, flexible) -> tuple | None\n\n"
"Read a Produce v3-v11 request body at byte ``pos`` of ``frame`` (bytes or bytearray): returns\n"
"(acks, timeout_ms, transactional_id, [(topic, partition, records), ...]) in request order, each\n"
"``records`` a bytes copy of the partition's records or None (a null records field). ``flexible``:\n"
"the compact encodings of v9+ (KIP-482). Returns None for anything else, for the general decoder to\n"
"accept or refuse: a tagged field, a null where Kafka allows none, a negative length, a length past\n"
"the frame's end, a varint over 5 bytes, a name that is not UTF-8. Bytes after the body are ignored.");

/* The body walk of produce_body (plain == 0) and plain_produce (plain == 1); see their docstrings.
 * Returns a new reference: the result, None to decline, or NULL with a Python error set. */
static PyObject *walk_produce(Py_buffer *view, Py_ssize_t start, int flexible, int plain, long long min_ts,
                              long long max_ts) {
    Body r = {(const uint8_t *)view->buf, start, view->len, flexible};
    PyObject *transactional_id = NULL, *partitions = NULL, *topic = NULL;
    int64_t n, topics, count;
    if (start < 0 || start > view->len) goto decline;
    if (body_length(&r, 2, &n) < 0) goto decline;
    if (n == -1) {
        transactional_id = Py_None;
        Py_INCREF(Py_None);
    } else if (plain || (transactional_id = body_string(&r, n)) == NULL) {
        goto decline;
    }
    if (r.pos + 6 > r.end) goto decline;
    int acks = be16(r.buf + r.pos);
    int32_t timeout_ms = be32(r.buf + r.pos + 2);
    r.pos += 6;
    if (plain && acks != 0 && acks != 1 && acks != -1) goto decline;
    if (body_length(&r, 4, &topics) < 0 || topics < 0 || topics > r.end - r.pos) goto decline;
    if ((partitions = PyList_New(0)) == NULL) goto error;
    for (int64_t t = 0; t < topics; t++) {
        if (body_length(&r, 2, &n) < 0 || (topic = body_string(&r, n)) == NULL) goto decline;
        if (body_length(&r, 4, &count) < 0 || count < 0 || count > r.end - r.pos) goto decline;
        for (int64_t p = 0; p < count; p++) {
            if (r.pos + 4 > r.end) goto decline;
            int32_t index = be32(r.buf + r.pos);
            r.pos += 4;
            if (body_length(&r, 4, &n) < 0) goto decline;
            PyObject *records, *entry;
            if (n == -1) {
                if (plain) goto decline;
                records = Py_None;
                Py_INCREF(Py_None);
            } else if (n < 0 || n > r.end - r.pos) {
                goto decline;
            } else {
                records = PyBytes_FromStringAndSize((const char *)r.buf + r.pos, (Py_ssize_t)n);
                if (records == NULL) goto error;
                r.pos += (Py_ssize_t)n;
            }
            if (plain) {
                Summary s;
                int got = n == 0 ? 0 : summarize_buf((const uint8_t *)PyBytes_AS_STRING(records), n, min_ts, max_ts, &s);
                if (got <= 0 || s.producer_id != -1 || s.transactional) {
                    Py_DECREF(records);
                    if (got < 0) goto error;
                    goto decline;
                }
                entry = Py_BuildValue("(OiNLL)", topic, index, records, (long long)s.record_count,
                                      (long long)s.uncompressed);
            } else {
                entry = Py_BuildValue("(OiN)", topic, index, records);
            }
            if (entry == NULL) goto error;
            int appended = PyList_Append(partitions, entry);
            Py_DECREF(entry);
            if (appended < 0) goto error;
            if (body_no_tags(&r) < 0) goto decline; /* the partition's */
        }
        Py_CLEAR(topic);
        if (body_no_tags(&r) < 0) goto decline; /* the topic's */
    }
    if (body_no_tags(&r) < 0) goto decline; /* the request's */
    if (plain) {
        Py_DECREF(transactional_id);
        if (PyList_GET_SIZE(partitions) == 0) {
            Py_DECREF(partitions);
            Py_RETURN_NONE;
        }
        return Py_BuildValue("(iiN)", acks, timeout_ms, partitions);
    }
    return Py_BuildValue("(iiNN)", acks, timeout_ms, transactional_id, partitions);
decline:
    Py_XDECREF(transactional_id);
    Py_XDECREF(partitions);
    Py_XDECREF(topic);
    Py_RETURN_NONE;
error:
    Py_XDECREF(transactional_id);
    Py_XDECREF(partitions);
    Py_XDECREF(topic);
    return NULL;
}

static PyObject *produce_body(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    int flexible;
    if (!PyArg_ParseTuple(args, "y*np", &view, &start, &flexible)) return NULL;
    PyObject *result = walk_produce(&view, start, flexible, 0, 0, 0);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(plain_produce_doc,
"plain_produce(frame, pos, flexible, min_timestamp_ms, max_timestamp_ms) -> tuple | None\n\n"
"``produce_body`` and ``summarize`` of each partition in one call, for the handler's produce runs:\n"
"(acks, timeout_ms, [(topic, partition, records, record_count, uncompressed_bytes), ...]) when the\n"
"body reads (as produce_body reads it), has no transactional id, acks 0, 1 or -1 and at least one\n"
"partition, and every partition's records are non-empty and summarized (as summarize checks them)\n"
"from producer id -1 and not transactional. None otherwise, for the general path to decide.");

static PyObject *plain_produce(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    int flexible;
    long long min_ts, max_ts;
    if (!PyArg_ParseTuple(args, "y*npLL", &view, &start, &flexible, &min_ts, &max_ts)) return NULL;
    PyObject *result = walk_produce(&view, start, flexible, 1, min_ts, max_ts);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(plain_run_doc,
"plain_run(requests, start, checked, now, min_timeout_ms, min_timestamp_ms, max_timestamp_ms,\n"
"          produce_key, first_version, last_version, first_flexible_version) -> (plains, next)\n\n"
"The handler's produce run over ``requests[start:]`` (objects with ``header`` (api_key, api_version,\n"
"body_offset), ``frame``, ``received_at`` and ``dequeued_at``): each request of api key produce_key\n"
"and a version in [first_version, last_version] (flexible from first_flexible_version) whose\n"
"frame is bytes or bytearray, whose body ``plain_produce`` reads, and whose every (topic, partition)\n"
"is True in ``checked`` (the run's memo of partition checks) becomes (request, acks, deadline,\n"
"parts), with deadline = received_at + max(timeout_ms, min_timeout_ms) / 1000 (s), and gets\n"
"dequeued_at = now. It stops at the first other request; ``next`` is its index (len(requests) if\n"
"none). Returns the plains in order.");

/* The attribute names plain_run reads (and sets: dequeued_at), spelled once: the module's
 * PLAIN_RUN_READS exports them, and pipeline.native checks them against the classes at import. */
#define A_HEADER "header"
#define A_FRAME "frame"
#define A_RECEIVED_AT "received_at"
#define A_DEQUEUED_AT "dequeued_at"
#define A_API_KEY "api_key"
#define A_API_VERSION "api_version"
#define A_BODY_OFFSET "body_offset"

static PyObject *plain_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static PyObject *s_header, *s_frame, *s_api_key, *s_api_version, *s_body_offset, *s_received_at,
        *s_dequeued_at;
    if (s_header == NULL) {
        s_header = PyUnicode_InternFromString(A_HEADER);
        s_frame = PyUnicode_InternFromString(A_FRAME);
        s_api_key = PyUnicode_InternFromString(A_API_KEY);
        s_api_version = PyUnicode_InternFromString(A_API_VERSION);
        s_body_offset = PyUnicode_InternFromString(A_BODY_OFFSET);
        s_received_at = PyUnicode_InternFromString(A_RECEIVED_AT);
        s_dequeued_at = PyUnicode_InternFromString(A_DEQUEUED_AT);
        if (!s_header || !s_frame || !s_api_key || !s_api_version || !s_body_offset || !s_received_at
                || !s_dequeued_at)
            return NULL;
    }
    if (nargs != 11 || !PyList_Check(args[0]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "plain_run(requests: list, start, checked: dict, now, min_timeout_ms, "
                                         "min_timestamp_ms, max_timestamp_ms, produce_key, first_version, "
                                         "last_version, first_flexible_version)");
        return NULL;
    }
    long produce_key = PyLong_AsLong(args[7]), first_version = PyLong_AsLong(args[8]);
    long last_version = PyLong_AsLong(args[9]), first_flexible = PyLong_AsLong(args[10]);
    PyObject *requests = args[0], *checked = args[2], *now = args[3];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    long long min_timeout = PyLong_AsLongLong(args[4]);
    long long min_ts = PyLong_AsLongLong(args[5]), max_ts = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (i < 0) i = 0;
    PyObject *plains = PyList_New(0);
    if (plains == NULL) return NULL;
    for (; i < PyList_GET_SIZE(requests); i++) {
        PyObject *request = PyList_GET_ITEM(requests, i);
        PyObject *header = NULL, *frame = NULL, *body = NULL, *value = NULL;
        long api_key = -1, version = -1;
        Py_ssize_t body_offset = -1;
        int take = 0;
        if ((header = PyObject_GetAttr(request, s_header)) == NULL) goto error;
        if ((value = PyObject_GetAttr(header, s_api_key)) == NULL) goto error_item;
        api_key = PyLong_AsLong(value);
        Py_CLEAR(value);
        if ((value = PyObject_GetAttr(header, s_api_version)) == NULL) goto error_item;
        version = PyLong_AsLong(value);
        Py_CLEAR(value);
        if ((value = PyObject_GetAttr(header, s_body_offset)) == NULL) goto error_item;
        body_offset = PyLong_AsSsize_t(value);
        Py_CLEAR(value);
        if (PyErr_Occurred()) goto error_item;
        if (api_key != produce_key || version < first_version || version > last_version) goto stop_item;
        if ((frame = PyObject_GetAttr(request, s_frame)) == NULL) goto error_item;
        if (!PyBytes_CheckExact(frame) && !PyByteArray_CheckExact(frame)) goto stop_item;
        Py_buffer view;
        if (PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE) < 0) goto error_item;
        body = walk_produce(&view, body_offset, version >= first_flexible, 1, min_ts, max_ts);
        PyBuffer_Release(&view);
        if (body == NULL) goto error_item;
        if (body == Py_None) goto stop_item;
        /* (acks, timeout_ms, parts): every part's (topic, partition) checked True in this run */
        PyObject *parts = PyTuple_GET_ITEM(body, 2);
        take = 1;
        for (Py_ssize_t k = 0; take && k < PyList_GET_SIZE(parts); k++) {
            PyObject *key = PyTuple_GetSlice(PyList_GET_ITEM(parts, k), 0, 2);
            if (key == NULL) goto error_item;
            PyObject *ok = PyDict_GetItemWithError(checked, key);
            Py_DECREF(key);
            if (ok == NULL && PyErr_Occurred()) goto error_item;
            take = ok == Py_True;
        }
        if (!take) goto stop_item;
        long long timeout_ms = PyLong_AsLongLong(PyTuple_GET_ITEM(body, 1));
        if ((value = PyObject_GetAttr(request, s_received_at)) == NULL) goto error_item;
        double received_at = PyFloat_AsDouble(value);
        Py_CLEAR(value);
        if (PyErr_Occurred()) goto error_item;
        double deadline = received_at + (double)(timeout_ms > min_timeout ? timeout_ms : min_timeout) / 1000.0;
        if (PyObject_SetAttr(request, s_dequeued_at, now) < 0) goto error_item;
        PyObject *plain = Py_BuildValue("(OOdO)", request, PyTuple_GET_ITEM(body, 0), deadline, parts);
        if (plain == NULL) goto error_item;
        int appended = PyList_Append(plains, plain);
        Py_DECREF(plain);
        if (appended < 0) goto error_item;
        Py_DECREF(header);
        Py_DECREF(frame);
        Py_DECREF(body);
        continue;
    stop_item:
        Py_XDECREF(header);
        Py_XDECREF(frame);
        Py_XDECREF(body);
        break;
    error_item:
        Py_XDECREF(header);
        Py_XDECREF(frame);
        Py_XDECREF(body);
        Py_XDECREF(value);
        goto error;
    }
    return Py_BuildValue("(Nn)", plains, i);
error:
    Py_DECREF(plains);
    return NULL;
}

/* ------------------------------------------------------------------ max_timestamp */

PyDoc_STRVAR(max_timestamp_doc,
"max_timestamp(records) -> int\n\n"
"The largest batch maxTimestamp (ms) of concatenated RecordBatch v2 batches, -1 if there are none:\n"
"what the WAL index keeps per append (pipeline.log.partition.max_timestamp). Only each batch\n"
"header's length and maxTimestamp are read. Raises ValueError when a header runs past the end or a\n"
"batch length is not positive or runs past the end.");

static PyObject *max_timestamp(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    const uint8_t *data = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    int64_t best = -1;
    /* baseOffset 8 | batchLength 4 | leaderEpoch 4 | magic 1 | crc 4 | attributes 2 | lastOffsetDelta 4 |
       firstTimestamp 8 | maxTimestamp 8: 43 bytes up to and with maxTimestamp (Kafka DefaultRecordBatch). */
    while (pos < end) {
        if (pos + 43 > end) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "truncated RecordBatch header at byte %zd", pos);
        }
        const uint8_t *h = data + pos;
        int32_t length = be32(h + 8);
        if (length <= 0 || (int64_t)pos + 12 + length > (int64_t)end) {
            PyBuffer_Release(&view);
            return PyErr_Format(PyExc_ValueError, "RecordBatch at byte %zd of length %d runs past the end (%zd bytes)",
                                pos, (int)length, end);
        }
        int64_t ts = be64(h + 35);
        if (ts > best) best = ts;
        pos += 12 + (Py_ssize_t)length;
    }
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(best);
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"columns", columns, METH_VARARGS, columns_doc},
    {"summarize", summarize, METH_VARARGS, summarize_doc},
    {"produce_body", produce_body, METH_VARARGS, produce_body_doc},
    {"plain_produce", plain_produce, METH_VARARGS, plain_produce_doc},
    {"plain_run", (PyCFunction)(void (*)(void))plain_run, METH_FASTCALL, plain_run_doc},
    {"max_timestamp", max_timestamp, METH_VARARGS, max_timestamp_doc},
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
    PyObject *crc32c_module = PyImport_ImportModule("crc32c");
    if (crc32c_module == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    crc32c_function = PyObject_GetAttrString(crc32c_module, "crc32c");
    Py_DECREF(crc32c_module);
    if (crc32c_function == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *reads = Py_BuildValue("((ssss)(sss))", A_HEADER, A_FRAME, A_RECEIVED_AT, A_DEQUEUED_AT, A_API_KEY,
                                    A_API_VERSION, A_BODY_OFFSET);
    if (reads == NULL || PyModule_AddObject(m, "PLAIN_RUN_READS", reads) < 0) {
        Py_XDECREF(reads);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
