/* yaml_emit.c: YAML emission through libyaml's event API.
 *
 * _core.emit_yaml(documents) writes each dict of `documents` the way
 * PyYAML's yaml.dump(doc, sort_keys=False, default_flow_style=False,
 * allow_unicode=False) does, followed by one blank line, with tuples in flow
 * style and lists and dicts in block style.  Layout, quoting of special
 * characters and line wrapping are libyaml's; what libyaml cannot know is
 * which plain strings PyYAML's YAML 1.1 resolvers would read back as another
 * type, so that check lives here (resolves_to_non_str) and such strings are
 * emitted with plain style disallowed, which makes libyaml single-quote them.
 *
 * Shared objects are written out in full each time (PyYAML would use &id
 * anchors); a recursive structure raises RecursionError.
 */
#include "leapp.h"
#include <yaml.h>
#include <math.h>
#include <string.h>

/* ---- output buffer -------------------------------------------------- */

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} out_buffer;

static int
out_reserve(out_buffer *out, size_t extra)
{
    size_t need, cap;
    char *data;

    if (extra > (size_t)PY_SSIZE_T_MAX - out->len) {
        PyErr_NoMemory();
        return -1;
    }
    need = out->len + extra;
    if (need <= out->cap) {
        return 0;
    }
    cap = out->cap ? out->cap : 4096;
    while (cap < need) {
        cap = cap > (size_t)PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    }
    data = PyMem_Realloc(out->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out->data = data;
    out->cap = cap;
    return 0;
}

/* libyaml write handler: 1 on success; on failure the Python exception is
 * already set and the emitter reports a writer error. */
static int
out_write(void *target, unsigned char *bytes, size_t size)
{
    out_buffer *out = target;

    if (out_reserve(out, size) < 0) {
        return 0;
    }
    memcpy(out->data + out->len, bytes, size);
    out->len += size;
    return 1;
}

/* ---- errors --------------------------------------------------------- */

/* The one bridge from libyaml to Python exceptions.  An exception raised by
 * the write handler (MemoryError) is kept; a failed event constructor leaves
 * no emitter error and only fails for lack of memory. */
static void
set_yaml_error(const yaml_emitter_t *emitter)
{
    if (PyErr_Occurred()) {
        return;
    }
    if (emitter->error == YAML_NO_ERROR
        || emitter->error == YAML_MEMORY_ERROR) {
        PyErr_NoMemory();
        return;
    }
    PyErr_Format(PyExc_RuntimeError, "libyaml emitter error: %s",
                 emitter->problem ? emitter->problem : "unknown problem");
}

/* Where a value sits, as a chain of stack frames from leaf to document. */
typedef struct path_seg {
    const struct path_seg *up;
    PyObject *key;     /* borrowed from the caller's frame; NULL for an index */
    Py_ssize_t index;  /* document or sequence index when key is NULL */
} path_seg;

/* "documents[0]['models']['x'][2]" for error messages. */
static PyObject *
path_str(const path_seg *at)
{
    PyObject *parts = PyList_New(0), *part = NULL, *sep = NULL, *res = NULL;
    const path_seg *seg;

    if (parts == NULL) {
        goto done;
    }
    for (seg = at; seg != NULL; seg = seg->up) {
        if (seg->up == NULL) {
            part = PyUnicode_FromFormat("documents[%zd]", seg->index);
        }
        else if (seg->key != NULL) {
            part = PyUnicode_FromFormat("[%R]", seg->key);
        }
        else {
            part = PyUnicode_FromFormat("[%zd]", seg->index);
        }
        if (part == NULL || PyList_Append(parts, part) < 0) {
            goto done;
        }
        Py_CLEAR(part);
    }
    if (PyList_Reverse(parts) < 0) {
        goto done;
    }
    sep = PyUnicode_FromStringAndSize(NULL, 0);
    if (sep == NULL) {
        goto done;
    }
    res = PyUnicode_Join(sep, parts);
done:
    Py_XDECREF(part);
    Py_XDECREF(sep);
    Py_XDECREF(parts);
    return res;
}

static void
type_error_at(const path_seg *at, const char *what, PyObject *obj,
              const char *why)
{
    PyObject *where = path_str(at);

    if (where != NULL) {
        PyErr_Format(PyExc_TypeError, "emit_yaml: %s %R of type '%s' at %U%s",
                     what, obj, Py_TYPE(obj)->tp_name, where, why);
        Py_DECREF(where);
    }
}

/* ---- YAML 1.1 implicit resolvers (PyYAML's Resolver) ----------------- */

/* Words the bool and null resolvers match exactly. */
static const char *const resolver_words[] = {
    "yes", "Yes", "YES", "no", "No", "NO",
    "true", "True", "TRUE", "false", "False", "FALSE",
    "on", "On", "ON", "off", "Off", "OFF",
    "", "~", "null", "Null", "NULL",
    "<<", "=",
};

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

static int
is_hex(char c)
{
    return IS_DIGIT(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Skip characters of [lo-hi_]*; returns the new position. */
static const char *
skip_range(const char *p, const char *end, char lo, char hi)
{
    while (p < end && ((*p >= lo && *p <= hi) || *p == '_')) {
        p++;
    }
    return p;
}

/* (?::[0-5]?[0-9])+ ; returns the position after it, or NULL. */
static const char *
skip_sexagesimal(const char *p, const char *end)
{
    const char *start = p;

    while (p < end && *p == ':') {
        if (p + 1 < end && IS_DIGIT(p[1])) {
            if (p + 2 < end && IS_DIGIT(p[2])) {
                if (p[1] > '5') {
                    return NULL;
                }
                p += 3;
            }
            else {
                p += 2;
            }
        }
        else {
            return NULL;
        }
    }
    return p == start ? NULL : p;
}

/* [eE][-+][0-9]+ to the end, or nothing at all. */
static int
exponent_to_end(const char *p, const char *end)
{
    if (p == end) {
        return 1;
    }
    if (end - p < 3 || (*p != 'e' && *p != 'E')
        || (p[1] != '-' && p[1] != '+')) {
        return 0;
    }
    for (p += 2; p < end && IS_DIGIT(*p); p++) {
    }
    return p == end;
}

static int
match_int(const char *p, const char *end)
{
    const char *q;

    if (p < end && (*p == '-' || *p == '+')) {
        p++;
    }
    if (p == end) {
        return 0;
    }
    if (*p == '0') {
        if (p + 1 == end) {
            return 1;                                   /* 0 */
        }
        if (p[1] == 'b') {                              /* 0b[0-1_]+ */
            q = skip_range(p + 2, end, '0', '1');
            return q > p + 2 && q == end;
        }
        if (p[1] == 'x') {                              /* 0x[0-9a-fA-F_]+ */
            for (q = p + 2; q < end && (is_hex(*q) || *q == '_'); q++) {
            }
            return q > p + 2 && q == end;
        }
        return skip_range(p + 1, end, '0', '7') == end; /* 0[0-7_]+ */
    }
    if (*p < '1' || *p > '9') {
        return 0;
    }
    q = skip_range(p + 1, end, '0', '9');
    if (q == end) {
        return 1;                                       /* [1-9][0-9_]* */
    }
    return skip_sexagesimal(q, end) == end;             /* base 60 */
}

static int
match_float(const char *p, const char *end)
{
    const char *q;

    if (p < end && *p == '.') {                         /* no sign here */
        if (end - p == 4 && (!memcmp(p, ".nan", 4) || !memcmp(p, ".NaN", 4)
                             || !memcmp(p, ".NAN", 4))) {
            return 1;
        }
        if (p + 1 < end && IS_DIGIT(p[1])) {            /* \.[0-9][0-9_]*exp? */
            return exponent_to_end(skip_range(p + 2, end, '0', '9'), end);
        }
    }
    if (p < end && (*p == '-' || *p == '+')) {
        p++;
    }
    if (end - p == 4 && (!memcmp(p, ".inf", 4) || !memcmp(p, ".Inf", 4)
                         || !memcmp(p, ".INF", 4))) {
        return 1;
    }
    if (p == end || !IS_DIGIT(*p)) {
        return 0;
    }
    q = skip_range(p + 1, end, '0', '9');
    if (q < end && *q == ':') {                         /* base 60 */
        q = skip_sexagesimal(q, end);
        return q != NULL && q < end && *q == '.'
               && skip_range(q + 1, end, '0', '9') == end;
    }
    if (q == end || *q != '.') {
        return 0;
    }
    return exponent_to_end(skip_range(q + 1, end, '0', '9'), end);
}

/* [0-9]{n} at p. */
static int
digits(const char *p, const char *end, int n)
{
    int i;

    if (end - p < n) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (!IS_DIGIT(p[i])) {
            return 0;
        }
    }
    return 1;
}

/* [0-9][0-9]? at *pp, advancing it. */
static int
one_or_two_digits(const char **pp, const char *end)
{
    const char *p = *pp;

    if (p == end || !IS_DIGIT(*p)) {
        return 0;
    }
    p++;
    if (p < end && IS_DIGIT(*p)) {
        p++;
    }
    *pp = p;
    return 1;
}

static int
match_timestamp(const char *p, const char *end)
{
    if (!digits(p, end, 4) || end - p < 5 || p[4] != '-') {
        return 0;
    }
    if (end - p == 10 && digits(p + 5, end, 2) && p[7] == '-'
        && digits(p + 8, end, 2)) {
        return 1;                                       /* 2001-12-14 */
    }
    p += 5;
    if (!one_or_two_digits(&p, end) || p == end || *p != '-') {
        return 0;
    }
    p++;
    if (!one_or_two_digits(&p, end) || p == end) {
        return 0;
    }
    if (*p == 'T' || *p == 't') {
        p++;
    }
    else if (*p == ' ' || *p == '\t') {
        while (p < end && (*p == ' ' || *p == '\t')) {
            p++;
        }
    }
    else {
        return 0;
    }
    if (!one_or_two_digits(&p, end) || p == end || *p != ':'
        || !digits(p + 1, end, 2) || end - p < 4 || p[3] != ':'
        || !digits(p + 4, end, 2)) {
        return 0;
    }
    p += 6;
    if (p < end && *p == '.') {
        for (p++; p < end && IS_DIGIT(*p); p++) {
        }
    }
    if (p == end) {
        return 1;
    }
    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }
    if (p < end && *p == 'Z') {
        return p + 1 == end;
    }
    if (p == end || (*p != '-' && *p != '+')) {
        return 0;
    }
    p++;
    if (!one_or_two_digits(&p, end)) {
        return 0;
    }
    if (p == end) {
        return 1;
    }
    return end - p == 3 && *p == ':' && digits(p + 1, end, 2);
}

/* Would a plain scalar with this text be resolved to something other than
 * a str (bool, int, float, null, timestamp, merge, value)? */
static int
resolves_to_non_str(const char *s, Py_ssize_t n)
{
    const char *end = s + n;
    size_t i;

    for (i = 0; i < sizeof(resolver_words) / sizeof(resolver_words[0]); i++) {
        if (strlen(resolver_words[i]) == (size_t)n
            && memcmp(resolver_words[i], s, (size_t)n) == 0) {
            return 1;
        }
    }
    return match_int(s, end) || match_float(s, end)
           || match_timestamp(s, end);
}

/* ---- events ---------------------------------------------------------- */

/* Hand an initialised event to the emitter, which owns it from then on. */
static int
emit(yaml_emitter_t *emitter, yaml_event_t *event)
{
    if (!yaml_emitter_emit(emitter, event)) {
        set_yaml_error(emitter);
        return -1;
    }
    return 0;
}

static int
emit_scalar(yaml_emitter_t *emitter, const char *text, Py_ssize_t len,
            int plain_ok)
{
    yaml_event_t event;

    if (len > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "emit_yaml: string too long");
        return -1;
    }
    /* No tag: plain_implicit decides whether plain style is allowed,
     * quoted_implicit lets libyaml quote without writing a tag. */
    if (!yaml_scalar_event_initialize(&event, NULL, NULL,
                                      (yaml_char_t *)text, (int)len,
                                      plain_ok, 1, YAML_ANY_SCALAR_STYLE)) {
        set_yaml_error(emitter);
        return -1;
    }
    return emit(emitter, &event);
}

static int
emit_str(yaml_emitter_t *emitter, PyObject *str)
{
    Py_ssize_t len;
    /* Borrowed: UTF-8 cache owned by str. */
    const char *text = PyUnicode_AsUTF8AndSize(str, &len);

    if (text == NULL) {
        return -1;
    }
    return emit_scalar(emitter, text, len, !resolves_to_non_str(text, len));
}

/* PyYAML's float representer: repr(), with a ".0" before an exponent when
 * repr has no dot, and .inf/-.inf/.nan. */
static int
emit_float(yaml_emitter_t *emitter, double value)
{
    char *repr = NULL, *text = NULL, *e;
    size_t len;
    int rc = -1;

    if (isnan(value)) {
        return emit_scalar(emitter, ".nan", 4, 1);
    }
    if (isinf(value)) {
        return value > 0 ? emit_scalar(emitter, ".inf", 4, 1)
                         : emit_scalar(emitter, "-.inf", 5, 1);
    }
    repr = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL) {
        goto done;
    }
    len = strlen(repr);
    e = strchr(repr, 'e');
    if (e != NULL && strchr(repr, '.') == NULL) {
        text = PyMem_Malloc(len + 3);
        if (text == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(text, repr, (size_t)(e - repr));
        memcpy(text + (e - repr), ".0", 2);
        memcpy(text + (e - repr) + 2, e, len - (size_t)(e - repr) + 1);
        len += 2;
    }
    rc = emit_scalar(emitter, text ? text : repr, (Py_ssize_t)len, 1);
done:
    PyMem_Free(text);
    PyMem_Free(repr);
    return rc;
}

static int emit_value(yaml_emitter_t *emitter, PyObject *value,
                      const path_seg *at);

static int
emit_mapping(yaml_emitter_t *emitter, PyObject *dict, const path_seg *at)
{
    yaml_event_t event;
    PyObject *key = NULL, *value = NULL;
    Py_ssize_t pos = 0;
    path_seg seg = {at, NULL, 0};
    int rc = -1;

    if (!yaml_mapping_start_event_initialize(&event, NULL, NULL, 1,
                                             YAML_BLOCK_MAPPING_STYLE)) {
        set_yaml_error(emitter);
        goto done;
    }
    if (emit(emitter, &event) < 0) {
        goto done;
    }
    while (PyDict_Next(dict, &pos, &key, &value)) {
        /* Borrowed from dict; held strongly while a nested error message
         * (which may run the GC) could still need them. */
        Py_INCREF(key);
        Py_INCREF(value);
        if (!PyUnicode_Check(key)) {
            type_error_at(at, "dict key", key, " is not a str");
            goto done;
        }
        seg.key = key;
        if (emit_str(emitter, key) < 0 || emit_value(emitter, value, &seg) < 0) {
            goto done;
        }
        Py_CLEAR(key);
        Py_CLEAR(value);
    }
    key = value = NULL;  /* PyDict_Next left borrowed pointers behind */
    if (!yaml_mapping_end_event_initialize(&event)) {
        set_yaml_error(emitter);
        goto done;
    }
    rc = emit(emitter, &event);
done:
    Py_XDECREF(key);
    Py_XDECREF(value);
    return rc;
}

static int
emit_sequence(yaml_emitter_t *emitter, PyObject *seq, yaml_sequence_style_t style,
              const path_seg *at)
{
    yaml_event_t event;
    PyObject *item = NULL;
    Py_ssize_t i;
    path_seg seg = {at, NULL, 0};
    int rc = -1;

    if (!yaml_sequence_start_event_initialize(&event, NULL, NULL, 1, style)) {
        set_yaml_error(emitter);
        goto done;
    }
    if (emit(emitter, &event) < 0) {
        goto done;
    }
    for (i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        /* Borrowed from seq, held strongly like the dict items above. */
        item = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(item);
        seg.index = i;
        if (emit_value(emitter, item, &seg) < 0) {
            goto done;
        }
        Py_CLEAR(item);
    }
    if (!yaml_sequence_end_event_initialize(&event)) {
        set_yaml_error(emitter);
        goto done;
    }
    rc = emit(emitter, &event);
done:
    Py_XDECREF(item);
    return rc;
}

static int
emit_value(yaml_emitter_t *emitter, PyObject *value, const path_seg *at)
{
    PyObject *digits_str = NULL;
    Py_ssize_t len;
    const char *text;
    int rc = -1;

    if (value == Py_None) {
        rc = emit_scalar(emitter, "null", 4, 1);
    }
    else if (PyBool_Check(value)) {
        rc = value == Py_True ? emit_scalar(emitter, "true", 4, 1)
                              : emit_scalar(emitter, "false", 5, 1);
    }
    else if (PyUnicode_Check(value)) {
        rc = emit_str(emitter, value);
    }
    else if (PyLong_Check(value)) {
        /* int's own repr, so that int subclasses (IntEnum) give digits. */
        digits_str = PyLong_Type.tp_repr(value);
        if (digits_str == NULL) {
            goto done;
        }
        text = PyUnicode_AsUTF8AndSize(digits_str, &len);  /* borrowed */
        if (text == NULL) {
            goto done;
        }
        rc = emit_scalar(emitter, text, len, 1);
    }
    else if (PyFloat_Check(value)) {
        rc = emit_float(emitter, PyFloat_AS_DOUBLE(value));
    }
    else if (PyDict_Check(value) || PyList_Check(value)
             || PyTuple_Check(value)) {
        /* Guards the C stack against deep nesting and cycles. */
        if (Py_EnterRecursiveCall(" while emitting YAML")) {
            goto done;
        }
        if (PyDict_Check(value)) {
            rc = emit_mapping(emitter, value, at);
        }
        else {
            rc = emit_sequence(emitter, value,
                               PyTuple_Check(value) ? YAML_FLOW_SEQUENCE_STYLE
                                                    : YAML_BLOCK_SEQUENCE_STYLE,
                               at);
        }
        Py_LeaveRecursiveCall();
    }
    else {
        type_error_at(at, "unsupported value", value,
                      " (expected dict, list, tuple, str, int, float, bool or None)");
    }
done:
    Py_XDECREF(digits_str);
    return rc;
}

/* One dict as one YAML stream (a stream per document avoids the "---" that
 * libyaml writes before every document but the first). */
static int
emit_document(out_buffer *out, PyObject *doc, Py_ssize_t index)
{
    yaml_emitter_t emitter;
    yaml_event_t event;
    path_seg root = {NULL, NULL, index};
    int initialised = 0, rc = -1;

    if (!yaml_emitter_initialize(&emitter)) {
        set_yaml_error(&emitter);
        goto done;
    }
    initialised = 1;
    yaml_emitter_set_output(&emitter, out_write, out);
    yaml_emitter_set_encoding(&emitter, YAML_UTF8_ENCODING);
    yaml_emitter_set_unicode(&emitter, 0);      /* allow_unicode=False */
    yaml_emitter_set_width(&emitter, 80);
    yaml_emitter_set_indent(&emitter, 2);
    yaml_emitter_set_break(&emitter, YAML_LN_BREAK);

    if (!yaml_stream_start_event_initialize(&event, YAML_UTF8_ENCODING)) {
        set_yaml_error(&emitter);
        goto done;
    }
    if (emit(&emitter, &event) < 0) {
        goto done;
    }
    if (!yaml_document_start_event_initialize(&event, NULL, NULL, NULL, 1)) {
        set_yaml_error(&emitter);
        goto done;
    }
    if (emit(&emitter, &event) < 0 || emit_value(&emitter, doc, &root) < 0) {
        goto done;
    }
    if (!yaml_document_end_event_initialize(&event, 1)) {
        set_yaml_error(&emitter);
        goto done;
    }
    if (emit(&emitter, &event) < 0) {
        goto done;
    }
    if (!yaml_stream_end_event_initialize(&event)) {
        set_yaml_error(&emitter);
        goto done;
    }
    if (emit(&emitter, &event) < 0) {  /* flushes the output */
        goto done;
    }
    rc = 0;
done:
    if (initialised) {
        yaml_emitter_delete(&emitter);
    }
    return rc;
}

static PyObject *
emit_yaml(PyObject *module, PyObject *documents)
{
    out_buffer out = {NULL, 0, 0};
    PyObject *doc = NULL, *res = NULL;
    Py_ssize_t i;

    (void)module;
    if (!PyList_Check(documents)) {
        PyErr_Format(PyExc_TypeError,
                     "emit_yaml: documents must be a list of dicts, not '%s'",
                     Py_TYPE(documents)->tp_name);
        goto done;
    }
    for (i = 0; i < PyList_GET_SIZE(documents); i++) {
        /* Borrowed from the list; held while emitting. */
        doc = PyList_GET_ITEM(documents, i);
        Py_INCREF(doc);
        if (!PyDict_Check(doc)) {
            PyErr_Format(PyExc_TypeError,
                         "emit_yaml: documents[%zd] must be a dict, not '%s'",
                         i, Py_TYPE(doc)->tp_name);
            goto done;
        }
        if (emit_document(&out, doc, i) < 0 || out_reserve(&out, 1) < 0) {
            goto done;
        }
        out.data[out.len++] = '\n';  /* the blank line after each document */
        Py_CLEAR(doc);
    }
    res = PyUnicode_DecodeUTF8(out.data, (Py_ssize_t)out.len, "strict");
done:
    Py_XDECREF(doc);
    PyMem_Free(out.data);
    return res;
}

static PyMethodDef yaml_functions[] = {
    {"emit_yaml", emit_yaml, METH_O,
     "emit_yaml(documents, /)\n--\n\n"
     "Emit each dict of the list `documents` as PyYAML's yaml.dump(doc,\n"
     "sort_keys=False) would, each followed by a blank line. Tuples are\n"
     "written in flow style, lists and dicts in block style."},
    {NULL, NULL, 0, NULL},
};

int
yaml_emit_init(PyObject *module, leapp_state *st)
{
    (void)st;
    return PyModule_AddFunctions(module, yaml_functions);
}
