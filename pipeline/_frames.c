/*
 * pipeline._frames: the Processor's per-frame read path in one call per socket read.
 *
 * ConnectionState.next_request cuts one frame (FrameDecoder), parses its request header
 * (pipeline.protocol.header.parse_request_header) and registers it; the channel then builds a
 * Request. At acks=0 that was ~3.8 us of Python per request, a fifth of the event loop's samples
 * (issue 23). ``cut`` does the same for every frame already in the buffer that takes the header
 * parser's fast path, building the RequestHeader and Request objects directly, and stops at the
 * first frame that needs anything else (incomplete, a bad or too large size, no room in the
 * MemoryPool budget, an api key the table sends to the Python path, a null or non-UTF-8 client
 * id, tagged fields in the header): the caller's Python path then takes that one frame, with its
 * exact errors. No state, no I/O.
 *
 * ``Layout`` builds instances of a slotted dataclass the way pipeline.fastinit's __init__ does
 * (each field stored through its slot), without running Python code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* ------------------------------------------------------------------ Layout */

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    Py_ssize_t n;
    Py_ssize_t *offsets;   /* each field's slot offset in an instance */
    PyObject **defaults;   /* each field's default (a new reference), NULL: none */
    vectorcallfunc vectorcall;
} Layout;

static void layout_dealloc(Layout *self) {
    if (self->defaults != NULL) {
        for (Py_ssize_t i = 0; i < self->n; i++) Py_XDECREF(self->defaults[i]);
        PyMem_Free(self->defaults);
    }
    PyMem_Free(self->offsets);
    Py_XDECREF(self->cls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *layout_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *cls, *names, *defaults, *missing;
    static char *keywords[] = {"cls", "names", "defaults", "missing", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!O:Layout", keywords, &PyType_Type, &cls,
                                     &PyTuple_Type, &names, &PyTuple_Type, &defaults, &missing))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(defaults) != n) {
        PyErr_SetString(PyExc_ValueError, "Layout: one default (or the missing marker) per field");
        return NULL;
    }
    Layout *self = (Layout *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->n = n;
    self->offsets = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    self->defaults = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    Py_INCREF(cls);
    self->cls = (PyTypeObject *)cls;
    if (self->offsets == NULL || self->defaults == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    PyObject *dict = ((PyTypeObject *)cls)->tp_dict;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        PyObject *descr = PyDict_GetItemWithError(dict, name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "Layout: %R is not a slot of %R", name, cls);
            Py_DECREF(self);
            return NULL;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "Layout: slot %R of %R is not a plain object slot", name, cls);
            Py_DECREF(self);
            return NULL;
        }
        self->offsets[i] = member->offset;
        PyObject *d = PyTuple_GET_ITEM(defaults, i);
        if (d != missing) {
            Py_INCREF(d);
            self->defaults[i] = d;
        }
    }
    return (PyObject *)self;
}

/* A new instance of layout->cls with values[0..given) and the defaults for the rest; NULL with an
 * exception set if a field without a default is not given. */
static PyObject *layout_make(Layout *layout, PyObject *const *values, Py_ssize_t given) {
    for (Py_ssize_t i = given; i < layout->n; i++) {
        if (layout->defaults[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s: field %zd has no default", layout->cls->tp_name, i);
            return NULL;
        }
    }
    PyObject *obj = layout->cls->tp_alloc(layout->cls, 0);
    if (obj == NULL) return NULL;
    for (Py_ssize_t i = 0; i < layout->n; i++) {
        PyObject *v = i < given ? values[i] : layout->defaults[i];
        Py_INCREF(v);
        *(PyObject **)((char *)obj + layout->offsets[i]) = v;
    }
    return obj;
}

static PyObject *layout_call(Layout *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "Layout(): positional fields only");
        return NULL;
    }
    if (nargs > self->n) {
        PyErr_Format(PyExc_TypeError, "%s takes at most %zd fields", self->cls->tp_name, self->n);
        return NULL;
    }
    return layout_make(self, args, nargs);
}

static PyObject *layout_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *layout_new_vc(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *self = layout_new(type, args, kwargs);
    if (self != NULL) ((Layout *)self)->vectorcall = (vectorcallfunc)layout_call;
    return self;
}

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pipeline._frames.Layout",
    .tp_basicsize = sizeof(Layout),
    .tp_dealloc = (destructor)layout_dealloc,
    .tp_vectorcall_offset = offsetof(Layout, vectorcall),
    .tp_call = layout_tp_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = PyDoc_STR(
        "Layout(cls, names, defaults, missing): builds instances of the slotted dataclass cls.\n\n"
        "names: its fields in order; defaults: each field's default, or ``missing`` for none.\n"
        "Calling it with the first k fields returns an instance with the defaults for the rest,\n"
        "each field stored in its slot (pipeline.fastinit's __init__, in C). Raises TypeError\n"
        "when a name is not a plain object slot of cls."),
    .tp_new = layout_new_vc,
};

/* ------------------------------------------------------------------ cut */

static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }
static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

#define SIZE_PREFIX 4
#define FIXED_CLIENT 10   /* api_key int16, api_version int16, correlation_id int32, client_id length int16 */
#define SLOW 0xFF         /* table: this api key goes through the Python path */
#define NOT_FLEXIBLE 0xFE /* table: no version of this api key is flexible (header v1) */

PyDoc_STRVAR(cut_doc,
"cut(buffer, pos, max_count, budget, max_receive, table, header, request, owner, first_token, now, pool)\n"
"    -> (requests, pos, used, correlation_ids)\n\n"
"The whole frames at ``buffer[pos:]`` (4-byte big-endian size, then the body; Kafka\n"
"NetworkReceive), in order, as ``request(owner, header(api_key, api_version, correlation_id,\n"
"client_id, header_version, body_offset), body, token, now, size, pool)``, tokens counting\n"
"from first_token (``header`` and ``request`` are Layouts). At most max_count frames of at most\n"
"budget body bytes in all. It stops before the first frame that is incomplete, whose size is\n"
"negative, above max_receive or above what is left of budget, or whose header does not take\n"
"parse_request_header's fast path: shorter than 10 bytes, an api key outside table or marked\n"
"0xFF there, a null client id or one that is not UTF-8 or reaches the frame's end, or tagged\n"
"fields in a v2 header. table (a bytearray)[api_key] is the api key's first flexible version, 0xFE for none.\n"
"Returns the requests, the position after the last one, their body bytes in all, and their\n"
"correlation ids in order.");

static PyObject *cut(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "cut() takes 12 arguments");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_count = PyLong_AsSsize_t(args[2]);
    long long budget = PyLong_AsLongLong(args[3]);
    long long max_receive = PyLong_AsLongLong(args[4]);
    long long token = PyLong_AsLongLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    if (!PyByteArray_Check(args[5]) || !Py_IS_TYPE(args[6], &LayoutType) || !Py_IS_TYPE(args[7], &LayoutType)) {
        PyErr_SetString(PyExc_TypeError, "cut(): table must be a bytearray, header and request Layouts");
        return NULL;
    }
    const uint8_t *table = (const uint8_t *)PyByteArray_AS_STRING(args[5]);
    Py_ssize_t table_len = PyByteArray_GET_SIZE(args[5]);
    Layout *header_layout = (Layout *)args[6], *request_layout = (Layout *)args[7];
    PyObject *owner = args[8], *now = args[10], *pool = args[11];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *requests = PyList_New(0), *correlation_ids = PyList_New(0);
    PyObject *client_id = NULL; /* the last client id decoded, reused while the bytes repeat */
    const uint8_t *client_at = NULL;
    Py_ssize_t client_len = -1;
    long long used = 0;
    if (requests == NULL || correlation_ids == NULL) goto error;
    if (pos < 0 || pos > view.len) {
        PyErr_SetString(PyExc_ValueError, "cut(): pos outside the buffer");
        goto error;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    while (PyList_GET_SIZE(requests) < max_count) {
        Py_ssize_t left = view.len - pos;
        if (left < SIZE_PREFIX) break;
        const uint8_t *p = base + pos;
        int32_t size = be32(p);
        if (size < 0 || size > max_receive || size > budget - used || size > left - SIZE_PREFIX) break;
        const uint8_t *f = p + SIZE_PREFIX;
        if (size < FIXED_CLIENT) break;
        int16_t api_key = be16(f);
        if (api_key < 0 || api_key >= table_len || table[api_key] == SLOW) break;
        int first_flexible = table[api_key];
        int16_t api_version = be16(f + 2);
        int32_t correlation_id = be32(f + 4);
        int16_t length = be16(f + 8);
        if (length < 0 || FIXED_CLIENT + length >= size) break;
        const uint8_t *text = f + FIXED_CLIENT;
        if (client_id == NULL || length != client_len || memcmp(text, client_at, length) != 0) {
            PyObject *decoded = PyUnicode_DecodeUTF8((const char *)text, length, "strict");
            if (decoded == NULL) {
                PyErr_Clear(); /* the Python path raises with its message */
                break;
            }
            Py_XSETREF(client_id, decoded);
        }
        client_at = text;
        client_len = length;
        Py_ssize_t body_offset = FIXED_CLIENT + length;
        int header_version = 1;
        if (first_flexible != NOT_FLEXIBLE && api_version >= first_flexible) {
            if (f[body_offset] != 0) break; /* tagged fields: the Python path skips them */
            header_version = 2;
            body_offset += 1;
        }
        PyObject *values[7] = {NULL};
        values[0] = PyLong_FromLong(api_key);
        values[1] = PyLong_FromLong(api_version);
        values[2] = PyLong_FromLong(correlation_id);
        values[3] = PyLong_FromLong(header_version);
        values[4] = PyLong_FromSsize_t(body_offset);
        values[5] = PyBytes_FromStringAndSize((const char *)f, size);
        values[6] = PyLong_FromLongLong(token);
        PyObject *size_obj = PyLong_FromLong(size);
        PyObject *header = NULL, *request = NULL;
        if (values[0] && values[1] && values[2] && values[3] && values[4] && values[5] && values[6] && size_obj) {
            PyObject *fields[6] = {values[0], values[1], values[2], client_id, values[3], values[4]};
            header = layout_make(header_layout, fields, 6);
            if (header != NULL) {
                PyObject *request_fields[7] = {owner, header, values[5], values[6], now, size_obj, pool};
                request = layout_make(request_layout, request_fields, 7);
            }
        }
        int appended = request == NULL ? -1 : PyList_Append(requests, request);
        if (appended == 0) appended = PyList_Append(correlation_ids, values[2]);
        for (int i = 0; i < 7; i++) Py_XDECREF(values[i]);
        Py_XDECREF(size_obj);
        Py_XDECREF(header);
        Py_XDECREF(request);
        if (appended < 0) goto error;
        pos += SIZE_PREFIX + size;
        used += size;
        token++;
    }
    Py_XDECREF(client_id);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnLN)", requests, pos, used, correlation_ids);
error:
    Py_XDECREF(client_id);
    Py_XDECREF(requests);
    Py_XDECREF(correlation_ids);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"cut", (PyCFunction)(void (*)(void))cut, METH_FASTCALL, cut_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeline._frames",
    "The Processor's per-frame read path in one call per read (see pipeline/_frames.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__frames(void) {
    if (PyType_Ready(&LayoutType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Layout", (PyObject *)&LayoutType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
