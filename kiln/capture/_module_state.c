/* Has an nn.Module tree changed since a snapshot? One C call, no dict lookups.
 *
 * CPython gives every dict a version number that changes whenever the dict changes
 * (``ma_version_tag``: a counter shared by all dicts, so a number names one dict in one
 * state), and every class a version number that changes whenever the class or a base
 * class changes (``tp_version_tag``). ``snapshot(root, plan)`` walks the objects that
 * ``plan`` names, from ``root``, and records each one with its version(s), holding it
 * (the root weakly).
 * ``unchanged(root, snap)`` then compares: the same root, every recorded dict at its
 * version, every recorded object of its class (at its version) with its instance dict
 * still the recorded one. Then every value read from those dicts is the same object again:
 * a dict that kept its version maps its keys to the objects it mapped. ``module_state.py``
 * builds the plans and decides which guards that covers.
 *
 * A plan is nested tuples:
 *   (0, type, items)   an object whose type is exactly ``type`` and its instance dict;
 *                      ``items``: (attribute name, plan or None) read from that dict (or,
 *                      for a plain value, from the class when the dict does not have it)
 *   (1, items)         a dict (exact, or an empty subclass: a hook OrderedDict);
 *                      ``items``: (key, plan or None)
 * ``snapshot`` returns None when the objects do not have that shape, or when an attribute's
 * class defines a data descriptor of that name (a read would call it instead of using the
 * instance dict; the class's version stands for that answer afterwards).
 *
 * Only for Python 3.11 and 3.12 (3.13 changed how instance attributes are stored; 3.14
 * removed dict versions): elsewhere the module does not build and kiln checks every guard.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030D0000
#error "kiln._module_state supports CPython 3.11 and 3.12 only"
#endif

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

enum { OBJ = 0, DICT = 1 };

typedef struct {
    PyObject *objects;   /* list: per OBJ: object, type, dict; per DICT: dict */
    uint64_t *nums;      /* per OBJ: OBJ, class version, dict version; per DICT: DICT, version */
    Py_ssize_t len, cap;
} Snap;

static int push(Snap *s, uint64_t v) {
    if (s->len == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 256;
        uint64_t *d = PyMem_Realloc(s->nums, (size_t)cap * sizeof(uint64_t));
        if (d == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->nums = d;
        s->cap = cap;
    }
    s->nums[s->len++] = v;
    return 0;
}

static int hold(Snap *s, PyObject *o) { return PyList_Append(s->objects, o); }

static int has_version(PyTypeObject *type) {
    return (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && type->tp_version_tag != 0;
}

/* 1: recorded; 0: the objects do not have the plan's shape; -1: an error is set */
static int walk(PyObject *obj, PyObject *plan, Snap *s, int depth);

static int walk_items(PyObject *container, PyObject *items, Snap *s, int depth, PyTypeObject *type) {
    if (!PyTuple_Check(items))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
            return 0;
        PyObject *key = PyTuple_GET_ITEM(item, 0);
        if (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key))
            return 0;   /* (hashing anything else could run Python code) */
        PyObject *sub = PyTuple_GET_ITEM(item, 1);
        PyObject *descr = NULL;
        if (type != NULL) {
            if (!PyUnicode_CheckExact(key))
                return 0;
            descr = _PyType_Lookup(type, key);   /* borrowed */
            if (descr != NULL && Py_TYPE(descr)->tp_descr_set != NULL)
                return 0;
        }
        PyObject *value = PyDict_GetItemWithError(container, key);   /* borrowed */
        if (value == NULL) {
            if (PyErr_Occurred())
                return -1;
            /* not in the instance dict: a plain class attribute answers the read (the class's
               version and the dict's, which says it is still absent, stand for it) */
            if (descr != NULL && Py_TYPE(descr)->tp_descr_get == NULL && sub == Py_None)
                continue;
            return 0;
        }
        int r = walk(value, sub, s, depth + 1);
        if (r != 1)
            return r;
    }
    return 1;
}

static int walk(PyObject *obj, PyObject *plan, Snap *s, int depth) {
    /* (the root itself is not held: the snapshot's first object is a weak reference to it) */
    PyObject *held = depth == 0 ? Py_None : obj;
    if (plan == Py_None)
        return 1;
    if (depth > 200 || !PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) < 2)
        return 0;
    PyObject *k = PyTuple_GET_ITEM(plan, 0);
    if (!PyLong_CheckExact(k))
        return 0;
    long kind = PyLong_AsLong(k);
    if (kind == OBJ && PyTuple_GET_SIZE(plan) == 3) {
        PyTypeObject *type = Py_TYPE(obj);
        if ((PyObject *)type != PyTuple_GET_ITEM(plan, 1))
            return 0;
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr == NULL || *dictptr == NULL || !PyDict_CheckExact(*dictptr))
            return 0;
        PyObject *dict = *dictptr;
        Py_ssize_t at = s->len;
        if (push(s, OBJ) < 0 || push(s, 0) < 0 || push(s, ((PyDictObject *)dict)->ma_version_tag) < 0 ||
                hold(s, held) < 0 || hold(s, (PyObject *)type) < 0 || hold(s, dict) < 0)
            return -1;
        int r = walk_items(dict, PyTuple_GET_ITEM(plan, 2), s, depth, type);
        if (r != 1)
            return r;
        /* read after the walk: a lookup above may have given the class its version */
        if (!has_version(type))
            return 0;   /* (none given out yet, or none left for this class) */
        s->nums[at + 1] = type->tp_version_tag;
        return 1;
    }
    if (kind == DICT && PyTuple_GET_SIZE(plan) == 2) {
        if (!PyDict_Check(obj))
            return 0;
        if (!PyDict_CheckExact(obj) && PyDict_GET_SIZE(obj) != 0)
            return 0;   /* a subclass may reorder its items without a new version */
        if (depth == 0)
            return 0;   /* (a root is an object) */
        if (push(s, DICT) < 0 || push(s, ((PyDictObject *)obj)->ma_version_tag) < 0 || hold(s, obj) < 0)
            return -1;
        return walk_items(obj, PyTuple_GET_ITEM(plan, 1), s, depth, NULL);
    }
    return 0;
}

static PyObject *snapshot(PyObject *self, PyObject *args) {
    PyObject *root, *plan, *callback = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O:snapshot", &root, &plan, &callback))
        return NULL;
    Snap s = {PyList_New(0), NULL, 0, 0};
    if (s.objects == NULL)
        return NULL;
    /* the root is held weakly (``callback``: called when it dies); what it holds, strongly:
       while the root lives it holds them too */
    PyObject *ref = PyWeakref_NewRef(root, callback);
    if (ref == NULL) {
        Py_DECREF(s.objects);
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();   /* (a root that cannot be referenced weakly: no snapshot) */
        Py_RETURN_NONE;
    }
    int r = hold(&s, ref) < 0 ? -1 : walk(root, plan, &s, 0);
    Py_DECREF(ref);
    PyObject *out = NULL;
    if (r == 1) {
        PyObject *objects = PyList_AsTuple(s.objects);
        PyObject *nums = PyBytes_FromStringAndSize((const char *)s.nums, s.len * (Py_ssize_t)sizeof(uint64_t));
        if (objects != NULL && nums != NULL)
            out = PyTuple_Pack(2, objects, nums);
        Py_XDECREF(objects);
        Py_XDECREF(nums);
    } else if (r == 0) {
        out = Py_NewRef(Py_None);
    }
    Py_DECREF(s.objects);
    PyMem_Free(s.nums);
    return out;
}

static PyObject *unchanged(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(args[1]) || PyTuple_GET_SIZE(args[1]) != 2) {
        PyErr_SetString(PyExc_TypeError, "unchanged(root, snapshot)");
        return NULL;
    }
    PyObject *objects = PyTuple_GET_ITEM(args[1], 0), *nums_obj = PyTuple_GET_ITEM(args[1], 1);
    if (!PyTuple_CheckExact(objects) || !PyBytes_CheckExact(nums_obj)) {
        PyErr_SetString(PyExc_TypeError, "unchanged(root, snapshot): not a snapshot");
        return NULL;
    }
    PyObject **o = &PyTuple_GET_ITEM(objects, 0), **o_end = o + PyTuple_GET_SIZE(objects);
    const uint64_t *n = (const uint64_t *)PyBytes_AS_STRING(nums_obj);
    const uint64_t *n_end = n + PyBytes_GET_SIZE(nums_obj) / (Py_ssize_t)sizeof(uint64_t);
    PyObject *root = args[0];
    if (o == o_end || !PyWeakref_CheckRef(*o) || PyWeakref_GET_OBJECT(*o) != root)
        Py_RETURN_FALSE;   /* another root */
    o++;
    while (n < n_end) {
        if (n[0] == OBJ) {
            if (n + 3 > n_end || o + 3 > o_end)
                Py_RETURN_FALSE;
            PyObject *obj = o[0] == Py_None ? root : o[0];
            PyTypeObject *type = (PyTypeObject *)o[1];
            if (Py_TYPE(obj) != type || !has_version(type) || type->tp_version_tag != n[1])
                Py_RETURN_FALSE;
            PyObject **dictptr = _PyObject_GetDictPtr(obj);
            if (dictptr == NULL || *dictptr != o[2] || ((PyDictObject *)o[2])->ma_version_tag != n[2])
                Py_RETURN_FALSE;
            n += 3;
            o += 3;
        } else {
            if (n + 2 > n_end || o + 1 > o_end || ((PyDictObject *)o[0])->ma_version_tag != n[1])
                Py_RETURN_FALSE;
            n += 2;
            o += 1;
        }
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"snapshot", snapshot, METH_VARARGS,
     "snapshot(root, plan, callback=None) -> (objects, versions) | None: the objects plan names "
     "from root, with their versions; root held by a weak reference with callback (see "
     "kiln/capture/module_state.py)."},
    {"unchanged", (PyCFunction)(void (*)(void))unchanged, METH_FASTCALL,
     "unchanged(root, snapshot) -> bool: root is the snapshot's root and nothing it recorded "
     "has changed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kiln.capture._module_state",
    "Has an nn.Module tree changed since a snapshot? (dict and class versions)", -1, methods,
};

PyMODINIT_FUNC PyInit__module_state(void) { return PyModule_Create(&module); }
