/*
 * pipeline._stages: one response's six request stage times into Kafka's per-api histograms.
 *
 * The body of pipeline.network.request_metrics.RequestMetrics.record, which runs once per
 * response written: its Python loop (six subtractions, six bisects, twelve list updates) was
 * ~1.4 us per request, 5-8 % of the event loop at acks=0 (issue 23). Same rules, same lists:
 * the histograms stay plain Python lists of ints and floats that the metrics endpoint copies.
 * No state, no I/O, no allocation beyond the new int and float objects stored in the lists.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define STAGES 6

/* Add times to buckets[stage]'s bucket of ms and ms * times to sums[stage]; -1 with an exception set on failure. */
static int add(PyObject *bucket_list, PyObject *sums, Py_ssize_t stage, PyObject *bounds, double ms, long long times) {
    Py_ssize_t n = PyTuple_GET_SIZE(bounds);
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) { /* bisect_left: the first bound >= ms */
        Py_ssize_t mid = (lo + hi) / 2;
        if (PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(bounds, mid)) < ms) lo = mid + 1;
        else hi = mid;
    }
    PyObject *buckets = PyList_GET_ITEM(bucket_list, stage);
    if (!PyList_Check(buckets) || PyList_GET_SIZE(buckets) != n + 1) {
        PyErr_SetString(PyExc_ValueError, "a stage's buckets must be a list of len(bounds) + 1 ints");
        return -1;
    }
    long long count = PyLong_AsLongLong(PyList_GET_ITEM(buckets, lo));
    if (count == -1 && PyErr_Occurred()) return -1;
    PyObject *new_count = PyLong_FromLongLong(count + times);
    if (new_count == NULL) return -1;
    PyList_SetItem(buckets, lo, new_count); /* steals the reference, drops the old int */
    double sum = PyFloat_AsDouble(PyList_GET_ITEM(sums, stage));
    if (sum == -1.0 && PyErr_Occurred()) return -1;
    PyObject *new_sum = PyFloat_FromDouble(sum + ms * (double)times);
    if (new_sum == NULL) return -1;
    PyList_SetItem(sums, stage, new_sum);
    return 0;
}

PyDoc_STRVAR(record_doc,
"record(buckets, sums_ms, bounds_ms, received, dequeued, local_done, response_complete,\n"
"       response_dequeued, sent, count=1, /) -> None\n\n"
"RequestMetrics.record's stage times (seconds, any monotonic clock) into ``buckets`` (six lists of\n"
"len(bounds_ms) + 1 ints) and ``sums_ms`` (six floats), in STAGES order: a negative ``dequeued`` is\n"
"``received``, a negative ``response_complete`` is ``response_dequeued``, a negative\n"
"``local_done`` or one after ``response_complete`` is ``response_complete``; a negative stage\n"
"counts as 0 ms. ``bounds_ms`` is a tuple of floats, ascending (bucket i holds times <= bound i).\n"
"``count`` (>= 1): that many responses with these same times, recorded at once.");

static PyObject *record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "record() takes 9 or 10 arguments");
        return NULL;
    }
    long long times = 1;
    if (nargs == 10) {
        times = PyLong_AsLongLong(args[9]);
        if (times == -1 && PyErr_Occurred()) return NULL;
        if (times < 1) {
            PyErr_SetString(PyExc_ValueError, "record(): count must be >= 1");
            return NULL;
        }
    }
    PyObject *buckets = args[0], *sums = args[1], *bounds = args[2];
    if (!PyList_Check(buckets) || PyList_GET_SIZE(buckets) != STAGES || !PyList_Check(sums)
            || PyList_GET_SIZE(sums) != STAGES || !PyTuple_Check(bounds)) {
        PyErr_SetString(PyExc_TypeError, "record() needs six bucket lists, six sums and a tuple of bounds");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bounds); i++) {
        if (!PyFloat_CheckExact(PyTuple_GET_ITEM(bounds, i))) {
            PyErr_SetString(PyExc_TypeError, "bounds_ms must be floats");
            return NULL;
        }
    }
    double t[6];
    for (int i = 0; i < 6; i++) {
        t[i] = PyFloat_AsDouble(args[3 + i]);
        if (t[i] == -1.0 && PyErr_Occurred()) return NULL;
    }
    double received = t[0], dequeued = t[1], local_done = t[2], response_complete = t[3];
    double response_dequeued = t[4], sent = t[5];
    if (dequeued < 0) dequeued = received; /* not taken by a RequestHandler */
    if (response_complete < 0) response_complete = response_dequeued;
    if (local_done < 0 || response_complete < local_done) local_done = response_complete;
    double stages[STAGES] = {dequeued - received, local_done - dequeued, response_complete - local_done,
                             response_dequeued - response_complete, sent - response_dequeued, sent - received};
    for (Py_ssize_t i = 0; i < STAGES; i++) {
        double ms = stages[i] > 0 ? stages[i] * 1000.0 : 0.0;
        if (add(buckets, sums, i, bounds, ms, times) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL, record_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pipeline._stages",
    "Request stage times into Kafka's per-api histograms (see pipeline/_stages.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__stages(void) { return PyModule_Create(&module); }
