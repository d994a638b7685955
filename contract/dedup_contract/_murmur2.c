/*
 * Kafka's murmur2 in C: the hash behind the owner of an id (dedup_contract.ownership).
 *
 * 32-bit MurmurHash2 with Kafka's seed 0x9747b28c over the id's UTF-8 bytes, as Kafka's
 * default (Java) partitioner and librdkafka's murmur2_random partitioner compute it; the
 * owner is toPositive(hash) % workers. The Python function dedup_contract.ownership.
 * murmur2_reference is the reference this one is tested against (Kafka's own vectors
 * and random bytes, tests/unit/dedup_contract/test_ownership.py). Built by the venv setup and the
 * image's build stage (pyproject.toml, [tool.setuptools] ext-modules).
 *
 *   murmur2(data: bytes) -> int           the signed 32-bit hash (Java's int)
 *   owner(data: bytes, workers: int) -> int
 *   owners(ids: Sequence[bytes], workers: int) -> list[int]   one call per batch
 *   owners_unless_all(ids, workers, me) -> list[int] | None
 *       None when `me` owns every id (the common case: producers keyed by id), so the
 *       hot path builds no list and compares nothing in Python; else owners(ids, workers)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static uint32_t
kafka_murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t whole = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) |
                     ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static int
check_workers(long workers)
{
    if (workers < 1) {
        PyErr_Format(PyExc_ValueError, "workers must be positive, not %ld", workers);
        return -1;
    }
    return 0;
}

static PyObject *
murmur2(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t h = kafka_murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

static PyObject *
owner(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long workers;
    if (!PyArg_ParseTuple(args, "y*l:owner", &view, &workers))
        return NULL;
    if (check_workers(workers) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t h = kafka_murmur2((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)((h & 0x7fffffffu) % (uint32_t)workers));
}

/* The ids of a sequence as a fast sequence of bytes, or NULL with an error set. */
static PyObject *
bytes_sequence(PyObject *ids, const char *caller)
{
    PyObject *seq = PySequence_Fast(ids, "not a sequence");
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s() takes a sequence of bytes, not %.100s", caller,
                         Py_TYPE(ids)->tp_name);
        }
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s() takes bytes, not %.100s at %zd", caller,
                         Py_TYPE(items[i])->tp_name, i);
            Py_DECREF(seq);
            return NULL;
        }
    }
    return seq;
}

static inline uint32_t
owner_of(PyObject *item, uint32_t workers)
{
    uint32_t h = kafka_murmur2((const unsigned char *)PyBytes_AS_STRING(item),
                               PyBytes_GET_SIZE(item));
    return (h & 0x7fffffffu) % workers;
}

/* The owner of each id of `seq` as a new list; the first `mine` ids are known to be
 * `me`'s and are not hashed again. */
static PyObject *
owner_list(PyObject *seq, uint32_t workers, Py_ssize_t mine, long me)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *number = PyLong_FromLong(i < mine ? me : (long)owner_of(items[i], workers));
        if (number == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, number);
    }
    return out;
}

static PyObject *
owners(PyObject *module, PyObject *args)
{
    PyObject *ids;
    long workers;
    if (!PyArg_ParseTuple(args, "Ol:owners", &ids, &workers))
        return NULL;
    if (check_workers(workers) < 0)
        return NULL;
    PyObject *seq = bytes_sequence(ids, "owners");
    if (seq == NULL)
        return NULL;
    PyObject *out = owner_list(seq, (uint32_t)workers, 0, 0);
    Py_DECREF(seq);
    return out;
}

static PyObject *
owners_unless_all(PyObject *module, PyObject *args)
{
    PyObject *ids;
    long workers, me;
    if (!PyArg_ParseTuple(args, "Oll:owners_unless_all", &ids, &workers, &me))
        return NULL;
    if (check_workers(workers) < 0)
        return NULL;
    PyObject *seq = bytes_sequence(ids, "owners_unless_all");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t mine = 0;
    while (mine < n && (long)owner_of(items[mine], (uint32_t)workers) == me)
        mine++;
    PyObject *out = mine == n ? Py_NewRef(Py_None) : owner_list(seq, (uint32_t)workers, mine, me);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"murmur2", murmur2, METH_O, "Kafka's murmur2 of the bytes, as a signed 32-bit int."},
    {"owner", owner, METH_VARARGS, "toPositive(murmur2(data)) % workers."},
    {"owners", owners, METH_VARARGS, "owner() of each bytes of a sequence, as a list."},
    {"owners_unless_all", owners_unless_all, METH_VARARGS,
     "None when `me` owns every id of the sequence, else owners(ids, workers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_murmur2", "Kafka's murmur2 and the owner of an id, in C.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__murmur2(void)
{
    return PyModule_Create(&module);
}
