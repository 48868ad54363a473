/* seqserve.service.scheduling._beam_kernel: the per-step update of the vectorised beam search
 * (seqserve/service/scheduling/beam_search.py) as two compiled calls, and its membership
 * changes (beam_state.py) as one call each.
 *
 *   select(...)  = Beams._masked (EOS before min_length, n-gram bans given as a mask) +
 *                  Beams._select + top_k_rows
 *   advance(...) = Beams._advance with _finish, _score, _extend, _hopeful, _stopped (with
 *                  the hopeless dropped: none left) and FinishedStore.merge / _append
 *   join(...)    = BeamState.join's arrays (FinishedStore.extend) with _reshape
 *   keep(...)    = BeamState.keep's arrays (FinishedStore.take) with _reshape where it runs
 *   plan(...)    = plan.py's plan_batch: which rows of a batcher's queue go together (not
 *                  the beam search's: the scheduling layer's other Python loop per batch,
 *                  docs/performance.md section 40)
 *   bank_add(...), bank_free(...) = group.py's MemoryBank.add / free: a decode group's
 *                  encoder memories joining and leaving (docs/performance.md section 41)
 *
 * Same values as the numpy code, bit for bit (see beam_native.py for the calling side; the
 * coverage term of the score is computed with numpy there, so that its pairwise sum and log
 * are numpy's own). The arrays are small: the GIL is kept. Built by native/beam/build.sh.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* columns of Requests.ints (beam_state._COLUMNS) */
enum { C_KEY, C_BEAM, C_NBEST, C_MINLEN, C_NGRAM, C_KBASE, C_MAXSTEPS, C_SRCLEN, C_STEPS,
       C_ALPHA, C_SAMPLING, C_COVERAGE, C_ATTENTION, N_COLUMNS };

/* ---- argument helpers ------------------------------------------------------------------ */

/* A read-only input as a C-contiguous aligned array of `type` (a new reference), or NULL with
 * TypeError (wrong kind: no unsafe casts) / ValueError (wrong number of axes). */
static PyArrayObject *in_array(PyObject *o, int type, int ndim, const char *name) {
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(o, type, NPY_ARRAY_IN_ARRAY);
    if (a == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: expected an array convertible to %s safely", name,
                     type == NPY_FLOAT64 ? "float64" : type == NPY_FLOAT32 ? "float32"
                     : type == NPY_BOOL ? "bool" : "int64");
        return NULL;
    }
    if (PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d axes, got %d", name, ndim,
                     PyArray_NDIM(a));
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

/* A float input kept as float32 when it is one, else converted to float64 (new reference). */
static PyArrayObject *in_float(PyObject *o, int ndim, const char *name) {
    int type = (PyArray_Check(o) && PyArray_TYPE((PyArrayObject *)o) == NPY_FLOAT32)
        ? NPY_FLOAT32 : NPY_FLOAT64;
    return in_array(o, type, ndim, name);
}

/* An array written in place: exactly `type`, `ndim` axes, C-contiguous, aligned, writeable
 * (a borrowed reference), or NULL with TypeError / ValueError. */
static PyArrayObject *out_array(PyObject *o, int type, int ndim, const char *name) {
    if (!PyArray_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a numpy array", name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_TYPE(a) != type) {
        PyErr_Format(PyExc_TypeError, "%s: wrong dtype (type number %d, expected %d)", name,
                     PyArray_TYPE(a), type);
        return NULL;
    }
    if (PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d axes, got %d", name, ndim,
                     PyArray_NDIM(a));
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s: must be C-contiguous, aligned and writeable", name);
        return NULL;
    }
    return a;
}

#define DIM(a, i) ((npy_intp)PyArray_DIM((a), (i)))
#define F64(a) ((double *)PyArray_DATA(a))
#define F32(a) ((float *)PyArray_DATA(a))
#define I64(a) ((int64_t *)PyArray_DATA(a))
#define I32(a) ((int32_t *)PyArray_DATA(a))
#define I16(a) ((int16_t *)PyArray_DATA(a))
#define BOOLS(a) ((npy_bool *)PyArray_DATA(a))

static int bad(PyObject *kind, const char *message) {
    PyErr_SetString(kind, message);
    return -1;
}

/* ---- select ---------------------------------------------------------------------------- */

/* numpy's sort order of float64 (NaN last), then the index: a strict "a before b". */
static inline int before(double a, npy_intp ia, double b, npy_intp ib) {
    if (isnan(a)) return isnan(b) && ia < ib;
    if (isnan(b) || a < b) return 1;
    return a == b && ia < ib;
}

static PyObject *k_select(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_logp, *o_lp, *o_ids, *o_req, *o_ints, *o_ban;
    Py_ssize_t k;
    long long eos;
    if (!PyArg_ParseTuple(args, "OOOOOnLO:select", &o_logp, &o_lp, &o_ids, &o_req, &o_ints,
                          &k, &eos, &o_ban))
        return NULL;
    PyArrayObject *logp = NULL, *lp = NULL, *ids = NULL, *req = NULL, *ints = NULL,
                  *ban = NULL;
    PyArrayObject *neg = NULL, *row = NULL, *tok = NULL, *val = NULL, *valid = NULL,
                  *starts = NULL;
    npy_intp *counts = NULL;
    double *bv = NULL;
    npy_intp *bi = NULL;
    PyObject *result = NULL;

    if (!(logp = in_array(o_logp, NPY_FLOAT64, 1, "row logp"))) goto done;
    if (!(lp = in_float(o_lp, 2, "logprobs"))) goto done;
    if (!(ids = in_array(o_ids, NPY_INT64, 2, "ids"))) goto done;
    if (!(req = in_array(o_req, NPY_INT64, 1, "row request"))) goto done;
    if (!(ints = in_array(o_ints, NPY_INT64, 2, "request ints"))) goto done;
    npy_intp R = DIM(logp, 0), Q = DIM(ints, 0), KW = DIM(lp, 1);
    if (DIM(ints, 1) != N_COLUMNS) { bad(PyExc_ValueError, "request ints: wrong columns"); goto done; }
    if (DIM(lp, 0) != R || DIM(ids, 0) != R || DIM(req, 0) != R || DIM(ids, 1) != KW) {
        bad(PyExc_ValueError, "logprobs, ids, row logp and row request disagree in shape");
        goto done;
    }
    if (k < 1 || k > KW) { bad(PyExc_ValueError, "k out of range of the logprobs' width"); goto done; }
    if (o_ban != Py_None) {
        if (!(ban = in_array(o_ban, NPY_BOOL, 2, "ban"))) goto done;
        if (DIM(ban, 0) != R || DIM(ban, 1) != k) { bad(PyExc_ValueError, "ban: shape (R, k) expected"); goto done; }
    }
    const int64_t *iv = I64(ints), *rq = I64(req), *idv = I64(ids);
    const double *lg = F64(logp);
    int64_t maxbeam = 0;
    for (npy_intp q = 0; q < Q; q++)
        if (iv[q * N_COLUMNS + C_BEAM] > maxbeam) maxbeam = iv[q * N_COLUMNS + C_BEAM];
    npy_intp C = 2 * (npy_intp)maxbeam;
    if (Q == 0 || C < 1) { bad(PyExc_ValueError, "no requests, or no beam"); goto done; }
    if (R == 0) { bad(PyExc_ValueError, "no rows"); goto done; }

    /* neg = -(logp + lp), masked */
    npy_intp dims2[2] = {R, k};
    if (!(neg = (PyArrayObject *)PyArray_SimpleNew(2, dims2, NPY_FLOAT64))) goto done;
    double *nv = F64(neg);
    counts = calloc((size_t)Q + 1, sizeof(npy_intp));
    if (!counts) { PyErr_NoMemory(); goto done; }
    for (npy_intp r = 0; r < R; r++) {
        int64_t q = rq[r];
        if (q < 0 || q >= Q || (r && q < rq[r - 1])) {
            bad(PyExc_ValueError, "row request: out of range or not ascending");
            goto done;
        }
        counts[q]++;
        int early = iv[q * N_COLUMNS + C_STEPS] < iv[q * N_COLUMNS + C_MINLEN];
        double m = -lg[r];
        const int64_t *idr = idv + r * KW;
        const npy_bool *br = ban ? BOOLS(ban) + r * k : NULL;
        double *out = nv + r * k;
        if (PyArray_TYPE(lp) == NPY_FLOAT32) {
            const float *src = F32(lp) + r * KW;
            for (npy_intp j = 0; j < k; j++) out[j] = m - (double)src[j];
        } else {
            const double *src = F64(lp) + r * KW;
            for (npy_intp j = 0; j < k; j++) out[j] = m - src[j];
        }
        for (npy_intp j = 0; j < k; j++)
            if ((early && idr[j] == eos) || (br && br[j])) out[j] = INFINITY;
    }
    npy_intp width = 0;
    for (npy_intp q = 0; q < Q; q++) if (counts[q] > width) width = counts[q];

    npy_intp dimsq[2] = {Q, C}, dim1[1] = {Q};
    if (!(row = (PyArrayObject *)PyArray_SimpleNew(2, dimsq, NPY_INT64))) goto done;
    if (!(tok = (PyArrayObject *)PyArray_SimpleNew(2, dimsq, NPY_INT64))) goto done;
    if (!(val = (PyArrayObject *)PyArray_SimpleNew(2, dimsq, NPY_FLOAT64))) goto done;
    if (!(valid = (PyArrayObject *)PyArray_SimpleNew(2, dimsq, NPY_BOOL))) goto done;
    if (!(starts = (PyArrayObject *)PyArray_SimpleNew(1, dim1, NPY_INT64))) goto done;
    bv = malloc((size_t)C * sizeof(double));
    bi = malloc((size_t)C * sizeof(npy_intp));
    if (!bv || !bi) { PyErr_NoMemory(); goto done; }
    int64_t *rowv = I64(row), *tokv = I64(tok), *st = I64(starts);
    double *valv = F64(val);
    npy_bool *vv = BOOLS(valid);
    npy_intp start = 0;
    for (npy_intp q = 0; q < Q; q++) {
        st[q] = start;
        npy_intp real = counts[q] * k;  /* its candidates; then +inf padding to max(W k, C) */
        npy_intp pad = (width * k > C ? width * k : C) - real;
        npy_intp n = 0;  /* filled, sorted best first */
        const double *cand = nv + start * k;
        for (npy_intp i = 0; i < real + (pad < C ? pad : C); i++) {
            double x = i < real ? cand[i] : INFINITY;
            if (n == C && !before(x, i, bv[C - 1], bi[C - 1])) continue;
            npy_intp p = n < C ? n++ : C - 1;
            while (p > 0 && before(x, i, bv[p - 1], bi[p - 1])) {
                bv[p] = bv[p - 1]; bi[p] = bi[p - 1]; p--;
            }
            bv[p] = x; bi[p] = i;
        }
        int64_t twice = 2 * iv[q * N_COLUMNS + C_BEAM];
        for (npy_intp j = 0; j < C; j++) {
            npy_intp o = q * C + j;
            npy_intp r = start + bi[j] / k;
            if (r > R - 1) r = R - 1;
            npy_intp col = bi[j] % k;
            rowv[o] = r;
            tokv[o] = idv[r * KW + col];
            valv[o] = -bv[j];
            vv[o] = isfinite(valv[o]) && j < twice;
        }
        start += counts[q];
    }
    result = Py_BuildValue("(OOOOOO)", neg, row, tok, val, valid, starts);
done:
    free(counts); free(bv); free(bi);
    Py_XDECREF(logp); Py_XDECREF(lp); Py_XDECREF(ids); Py_XDECREF(req); Py_XDECREF(ints);
    Py_XDECREF(ban);
    Py_XDECREF(neg); Py_XDECREF(row); Py_XDECREF(tok); Py_XDECREF(val); Py_XDECREF(valid);
    Py_XDECREF(starts);
    return result;
}

/* ---- advance --------------------------------------------------------------------------- */

typedef struct {
    /* live rows */
    npy_intp R, W, Sc, Wa, Sa, S;
    const int64_t *request;
    const double *logp;
    const void *tokens;  /* (R, W) int16 or int32 */
    int tok32;
    const double *coverage;  /* (R, Sc) */
    const float *history;  /* (R, Wa, Sa) */
    const void *att;  /* (R, S) float32 or float64 */
    int att32;
} Live;

static inline double att_at(const Live *L, npy_intp r, npy_intp j) {
    return L->att32 ? (double)((const float *)L->att)[r * L->S + j]
                    : ((const double *)L->att)[r * L->S + j];
}

static inline int64_t token_at(const Live *L, npy_intp r, npy_intp j) {
    return L->tok32 ? (int64_t)((const int32_t *)L->tokens)[r * L->W + j]
                    : (int64_t)((const int16_t *)L->tokens)[r * L->W + j];
}

/* Row `r` extended by `tok` at position `pos` (pos < 0: as it is) into the histories
 * tokens (W, in the rows' type when `as32` is 0, else int32), coverage (Sc), history (Wa, Sa). */
static void extend_into(const Live *L, npy_intp r, npy_intp pos, int64_t tok, void *tokens,
                        int as32, double *coverage, float *history) {
    for (npy_intp j = 0; j < L->W; j++) {
        int64_t t = token_at(L, r, j);
        if (j == pos) t = L->tok32 ? (int64_t)(int32_t)tok : (int64_t)(int16_t)tok;
        if (as32 || L->tok32) ((int32_t *)tokens)[j] = (int32_t)t;
        else ((int16_t *)tokens)[j] = (int16_t)t;
    }
    if (L->Sc) {
        const double *c = L->coverage + r * L->Sc;
        for (npy_intp j = 0; j < L->Sc; j++) coverage[j] = c[j];
        if (pos >= 0)
            for (npy_intp j = 0; j < L->S; j++) coverage[j] = coverage[j] + att_at(L, r, j);
    }
    if (L->Wa) {
        npy_intp n = L->Wa * L->Sa;
        memcpy(history, L->history + r * n, (size_t)n * sizeof(float));
        if (pos >= 0)
            for (npy_intp j = 0; j < L->S; j++) history[pos * L->Sa + j] = (float)att_at(L, r, j);
    }
}

typedef struct { double score; int64_t index; } Slot;

static PyObject *k_advance(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_row, *o_tok, *o_val, *o_valid, *o_ints, *o_req, *o_logp, *o_tokens, *o_cov,
             *o_hist, *o_att, *o_lpt, *o_findex, *o_fscore, *o_pscore, *o_plogp, *o_plen,
             *o_pended, *o_ptok, *o_pcov, *o_patt, *o_text, *o_tstuck;
    long long eos;
    Py_ssize_t used;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOLOOOOOOOOOnOO:advance", &o_row, &o_tok, &o_val,
                          &o_valid, &o_ints, &o_req, &o_logp, &o_tokens, &o_cov, &o_hist,
                          &o_att, &o_lpt, &eos, &o_findex, &o_fscore, &o_pscore, &o_plogp,
                          &o_plen, &o_pended, &o_ptok, &o_pcov, &o_patt, &used, &o_text,
                          &o_tstuck))
        return NULL;
    PyArrayObject *row = NULL, *tok = NULL, *val = NULL, *valid = NULL, *req = NULL,
                  *logp = NULL, *tokens = NULL, *cov = NULL, *hist = NULL, *att = NULL,
                  *lpt = NULL, *text = NULL, *tstuck = NULL;
    PyArrayObject *ints, *findex, *fscore, *pscore, *plogp, *plen, *pended, *ptok, *pcov, *patt;
    PyArrayObject *parents = NULL, *n_req = NULL, *n_logp = NULL, *n_last = NULL,
                  *n_tok = NULL, *n_cov = NULL, *n_hist = NULL, *done_a = NULL;
    unsigned char *flags = NULL;
    npy_intp *rstart = NULL;
    Slot *slots = NULL;
    PyObject *result = NULL;
    Live L;

    if (!(row = in_array(o_row, NPY_INT64, 2, "row"))) goto fail;
    if (!(tok = in_array(o_tok, NPY_INT64, 2, "tok"))) goto fail;
    if (!(val = in_array(o_val, NPY_FLOAT64, 2, "val"))) goto fail;
    if (!(valid = in_array(o_valid, NPY_BOOL, 2, "valid"))) goto fail;
    if (!(req = in_array(o_req, NPY_INT64, 1, "row request"))) goto fail;
    if (!(logp = in_array(o_logp, NPY_FLOAT64, 1, "row logp"))) goto fail;
    if (!(cov = in_array(o_cov, NPY_FLOAT64, 2, "row coverage"))) goto fail;
    if (!(hist = in_array(o_hist, NPY_FLOAT32, 3, "row attention"))) goto fail;
    if (!(lpt = in_array(o_lpt, NPY_FLOAT64, 2, "length-penalty table"))) goto fail;
    if (!PyArray_Check(o_tokens) || (PyArray_TYPE((PyArrayObject *)o_tokens) != NPY_INT16
                                     && PyArray_TYPE((PyArrayObject *)o_tokens) != NPY_INT32)) {
        bad(PyExc_TypeError, "row tokens: an int16 or int32 array expected");
        goto fail;
    }
    if (!(tokens = in_array(o_tokens, PyArray_TYPE((PyArrayObject *)o_tokens), 2, "row tokens")))
        goto fail;
    if (!(ints = out_array(o_ints, NPY_INT64, 2, "request ints"))) goto fail;
    if (!(findex = out_array(o_findex, NPY_INT64, 2, "finished index"))) goto fail;
    if (!(fscore = out_array(o_fscore, NPY_FLOAT64, 2, "finished score"))) goto fail;
    if (!(pscore = out_array(o_pscore, NPY_FLOAT64, 1, "pool score"))) goto fail;
    if (!(plogp = out_array(o_plogp, NPY_FLOAT64, 1, "pool logp"))) goto fail;
    if (!(plen = out_array(o_plen, NPY_INT64, 1, "pool length"))) goto fail;
    if (!(pended = out_array(o_pended, NPY_BOOL, 1, "pool ended"))) goto fail;
    if (!(ptok = out_array(o_ptok, NPY_INT32, 2, "pool tokens"))) goto fail;
    if (!(pcov = out_array(o_pcov, NPY_FLOAT64, 2, "pool coverage"))) goto fail;
    if (!(patt = out_array(o_patt, NPY_FLOAT32, 3, "pool attention"))) goto fail;

    npy_intp Q = DIM(row, 0), C = DIM(row, 1), R = DIM(req, 0), N = DIM(findex, 1);
    npy_intp P = DIM(pscore, 0);
    L.R = R; L.W = DIM(tokens, 1); L.Sc = DIM(cov, 1); L.Wa = DIM(hist, 1); L.Sa = DIM(hist, 2);
    L.request = I64(req); L.logp = F64(logp); L.tokens = PyArray_DATA(tokens);
    L.tok32 = PyArray_TYPE(tokens) == NPY_INT32; L.coverage = F64(cov); L.history = F32(hist);
    L.att = NULL; L.att32 = 0; L.S = 0;
    if (DIM(ints, 0) != Q || DIM(ints, 1) != N_COLUMNS || DIM(tok, 0) != Q || DIM(tok, 1) != C
        || DIM(val, 0) != Q || DIM(val, 1) != C || DIM(valid, 0) != Q || DIM(valid, 1) != C) {
        bad(PyExc_ValueError, "selection arrays and request ints disagree in shape");
        goto fail;
    }
    if (DIM(logp, 0) != R || DIM(tokens, 0) != R || DIM(cov, 0) != R || DIM(hist, 0) != R) {
        bad(PyExc_ValueError, "row arrays disagree in length");
        goto fail;
    }
    if (DIM(findex, 0) != Q || DIM(fscore, 0) != Q || DIM(fscore, 1) != N) {
        bad(PyExc_ValueError, "finished slots: (Q, N) expected");
        goto fail;
    }
    if (DIM(plogp, 0) != P || DIM(plen, 0) != P || DIM(pended, 0) != P || DIM(ptok, 0) != P
        || DIM(pcov, 0) != P || DIM(patt, 0) != P || DIM(ptok, 1) != L.W
        || DIM(pcov, 1) != L.Sc || DIM(patt, 1) != L.Wa || DIM(patt, 2) != L.Sa) {
        bad(PyExc_ValueError, "pool arrays disagree with each other or with the rows' widths");
        goto fail;
    }
    if (L.Sc || L.Wa) {
        if (!(att = in_float(o_att, 2, "attention"))) goto fail;
        L.S = DIM(att, 1); L.att = PyArray_DATA(att); L.att32 = PyArray_TYPE(att) == NPY_FLOAT32;
        if (DIM(att, 0) != R || (L.Sc && L.S > L.Sc) || (L.Wa && L.S > L.Sa)) {
            bad(PyExc_ValueError, "attention: (R, S) with S within the histories expected");
            goto fail;
        }
    }
    if (L.Sc) {
        if (o_text == Py_None) { bad(PyExc_ValueError, "coverage: terms needed"); goto fail; }
        if (!(text = in_array(o_text, NPY_FLOAT64, 1, "coverage terms"))) goto fail;
        if (DIM(text, 0) != R) { bad(PyExc_ValueError, "coverage terms: (R,) expected"); goto fail; }
        if (o_tstuck != Py_None) {
            if (!(tstuck = in_array(o_tstuck, NPY_FLOAT64, 1, "stuck coverage terms"))) goto fail;
            if (DIM(tstuck, 0) != R) { bad(PyExc_ValueError, "stuck coverage terms: (R,) expected"); goto fail; }
        }
    }
    if (used < 0 || used > P) { bad(PyExc_ValueError, "used: out of the pool"); goto fail; }
    npy_intp A = DIM(lpt, 0), LW = DIM(lpt, 1);

    int64_t *iv = I64(ints), *fi = I64(findex);
    double *fs = F64(fscore);
    const int64_t *rowv = I64(row), *tokv = I64(tok);
    const double *valv = F64(val), *lpv = F64(lpt);
    const npy_bool *vv = BOOLS(valid);
    const double *te = text ? F64(text) : NULL, *ts = tstuck ? F64(tstuck) : NULL;

    /* each request's first row */
    rstart = malloc(((size_t)Q + 1) * sizeof(npy_intp));
    flags = malloc((size_t)(Q * C + Q + 1));
    slots = malloc(((size_t)N + (size_t)R + 2 * (size_t)C + 1) * sizeof(Slot));
    if (!rstart || !flags || !slots) { PyErr_NoMemory(); goto fail; }
    {
        npy_intp r = 0;
        for (npy_intp q = 0; q <= Q; q++) {
            while (r < R && L.request[r] < q) r++;
            rstart[q] = r;
        }
        for (npy_intp i = 0; i < R; i++)
            if (L.request[i] < 0 || L.request[i] >= Q || (i && L.request[i] < L.request[i - 1])) {
                bad(PyExc_ValueError, "row request: out of range or not ascending");
                goto fail;
            }
        for (npy_intp i = 0; i < Q * C; i++)
            if (vv[i] && (rowv[i] < 0 || rowv[i] >= R)) {
                bad(PyExc_ValueError, "row: a valid candidate's row is out of range");
                goto fail;
            }
    }
    for (npy_intp q = 0; q < Q; q++) {
        const int64_t *iq = iv + q * N_COLUMNS;
        if (iq[C_NBEST] < 1 || iq[C_NBEST] > N || iq[C_ALPHA] < 0 || iq[C_ALPHA] >= A
            || iq[C_STEPS] + 1 >= LW || iq[C_MAXSTEPS] < 0 || iq[C_MAXSTEPS] >= LW
            || iq[C_STEPS] >= L.W || (L.Wa && iq[C_STEPS] >= L.Wa)) {
            bad(PyExc_ValueError, "request ints: n_best, alpha, steps or max_steps out of range");
            goto fail;
        }
    }
    /* the pool's room: the most a step can finish (Python grows it before the call) */
    {
        npy_intp most = 0;
        for (npy_intp q = 0; q < Q; q++) {
            int any = 0;
            for (npy_intp j = 0; j < C; j++) any |= vv[q * C + j] != 0;
            most += any ? C : rstart[q + 1] - rstart[q];  /* ended + capped <= 2B <= C */
        }
        if (used + most > P) { bad(PyExc_ValueError, "pool: no room for a step's finished"); goto fail; }
    }

    /* pass 1, per request: count the step, finish, merge, stop. flags: 1 going */
    npy_bool *donev = flags + Q * C;  /* reused as bytes: 0 / 1 */
    npy_intp live = 0;
    for (npy_intp q = 0; q < Q; q++) {
        int64_t *iq = iv + q * N_COLUMNS;
        int64_t beam = iq[C_BEAM], s = ++iq[C_STEPS], nb = iq[C_NBEST];
        const double *lpa = lpv + iq[C_ALPHA] * LW;
        const npy_intp o = q * C;
        double worst = fs[q * N + nb - 1];
        npy_intp m = 0, cont_seen = 0, any_valid = 0, any_going = 0;
        Slot *fresh = slots + N;
        unsigned char *fl = flags + o;
        /* stuck: nothing allowed, its rows end as they are */
        for (npy_intp j = 0; j < C; j++) any_valid |= vv[o + j] != 0;
        if (!any_valid) {
            for (npy_intp r = rstart[q]; r < rstart[q + 1]; r++) {
                double score = L.logp[r] / lpa[s - 1];
                if (L.Sc) {
                    if (!ts) { bad(PyExc_ValueError, "stuck rows: coverage terms needed"); goto fail; }
                    score = score + ts[r];
                }
                if (!(score > worst)) continue;
                npy_intp at = used;
                extend_into(&L, r, -1, 0, I32(ptok) + at * L.W, 1, F64(pcov) + at * L.Sc,
                            F32(patt) + at * L.Wa * L.Sa);
                F64(pscore)[at] = score; F64(plogp)[at] = L.logp[r];
                I64(plen)[at] = s - 1; BOOLS(pended)[at] = 0;
                fresh[m].score = score; fresh[m].index = at; m++; used++;
            }
        }
        /* eos among the first B end; the first B others continue (or reach the cap) */
        for (npy_intp j = 0; j < C; j++) {
            fl[j] = 0;
            if (!vv[o + j]) continue;
            if (tokv[o + j] == eos) {
                if (j < beam) fl[j] = 2;  /* ended */
            } else if (++cont_seen <= beam) {
                fl[j] = s < iq[C_MAXSTEPS] ? 1 : 3;  /* going, capped */
            }
        }
        for (int pass = 2; pass <= 3; pass++) {
            for (npy_intp j = 0; j < C; j++) {
                if (fl[j] != pass) continue;
                double head = valv[o + j] / lpa[s];
                if (!(head > worst)) continue;  /* hope: the coverage term is <= 0 */
                npy_intp r = rowv[o + j];
                double score = head;
                if (L.Sc) score = score + te[r];
                if (!(score > worst)) continue;
                npy_intp at = used;
                extend_into(&L, r, s - 1, tokv[o + j], I32(ptok) + at * L.W, 1,
                            F64(pcov) + at * L.Sc, F32(patt) + at * L.Wa * L.Sa);
                F64(pscore)[at] = score; F64(plogp)[at] = valv[o + j];
                I64(plen)[at] = s; BOOLS(pended)[at] = pass == 2;
                fresh[m].score = score; fresh[m].index = at; m++; used++;
            }
        }
        if (m) {  /* merge: stable by score, best first, the old ones first on ties */
            for (npy_intp i = 0; i < N; i++) { slots[i].score = fs[q * N + i]; slots[i].index = fi[q * N + i]; }
            for (npy_intp i = 1; i < N + m; i++) {
                Slot x = slots[i];
                npy_intp p = i;
                while (p > 0 && -x.score < -slots[p - 1].score) { slots[p] = slots[p - 1]; p--; }
                slots[p] = x;
            }
            for (npy_intp i = 0; i < N; i++) {
                int kept = i < nb;
                fs[q * N + i] = kept ? slots[i].score : -INFINITY;
                fi[q * N + i] = kept ? slots[i].index : -1;
            }
        }
        /* hopeless: a candidate whose bound does not beat the n-th finished one is dropped
         * (Beams._hopeful; sampling requests keep theirs) */
        const double nth = fs[q * N + nb - 1], lpmax = lpa[iq[C_MAXSTEPS]];
        for (npy_intp j = 0; j < C; j++) {
            if (fl[j] != 1) continue;
            double v = valv[o + j];
            if (!iq[C_SAMPLING] && (v <= 0.0 || isnan(v) ? v : 0.0) / lpmax <= nth) fl[j] = 0;
            else any_going++;
        }
        donev[q] = !any_going;  /* Beams._stopped: its bound test is the one just made */
        if (!donev[q]) live += any_going;
    }

    /* pass 2: the new rows */
    npy_intp d1[1] = {live}, dq[1] = {Q}, dt[2] = {live, L.W}, dc[2] = {live, L.Sc},
             dh[3] = {live, L.Wa, L.Sa};
    if (!(parents = (PyArrayObject *)PyArray_SimpleNew(1, d1, NPY_INT64))) goto fail;
    if (!(n_req = (PyArrayObject *)PyArray_SimpleNew(1, d1, NPY_INT64))) goto fail;
    if (!(n_logp = (PyArrayObject *)PyArray_SimpleNew(1, d1, NPY_FLOAT64))) goto fail;
    if (!(n_last = (PyArrayObject *)PyArray_SimpleNew(1, d1, NPY_INT64))) goto fail;
    if (!(n_tok = (PyArrayObject *)PyArray_SimpleNew(2, dt, PyArray_TYPE(tokens)))) goto fail;
    if (!(n_cov = (PyArrayObject *)PyArray_SimpleNew(2, dc, NPY_FLOAT64))) goto fail;
    if (!(n_hist = (PyArrayObject *)PyArray_SimpleNew(3, dh, NPY_FLOAT32))) goto fail;
    if (!(done_a = (PyArrayObject *)PyArray_SimpleNew(1, dq, NPY_BOOL))) goto fail;
    {
        npy_intp e = 0;
        size_t tsize = L.tok32 ? 4 : 2;
        for (npy_intp q = 0; q < Q; q++) {
            BOOLS(done_a)[q] = donev[q] != 0;
            if (donev[q]) continue;
            int64_t s = iv[q * N_COLUMNS + C_STEPS];
            for (npy_intp j = 0; j < C; j++) {
                npy_intp o = q * C + j;
                if (flags[o] != 1) continue;
                npy_intp r = rowv[o];
                I64(parents)[e] = r;
                I64(n_req)[e] = L.request[r];
                F64(n_logp)[e] = valv[o];
                I64(n_last)[e] = tokv[o];
                extend_into(&L, r, s - 1, tokv[o], (char *)PyArray_DATA(n_tok) + (size_t)(e * L.W) * tsize,
                            0, F64(n_cov) + e * L.Sc, F32(n_hist) + e * L.Wa * L.Sa);
                e++;
            }
        }
    }
    result = Py_BuildValue("(OOOOOOOOn)", parents, n_req, n_logp, n_last, n_tok, n_cov, n_hist,
                           done_a, used);
fail:
    free(rstart); free(flags); free(slots);
    Py_XDECREF(row); Py_XDECREF(tok); Py_XDECREF(val); Py_XDECREF(valid); Py_XDECREF(req);
    Py_XDECREF(logp); Py_XDECREF(tokens); Py_XDECREF(cov); Py_XDECREF(hist); Py_XDECREF(att);
    Py_XDECREF(lpt); Py_XDECREF(text); Py_XDECREF(tstuck);
    Py_XDECREF(parents); Py_XDECREF(n_req); Py_XDECREF(n_logp); Py_XDECREF(n_last);
    Py_XDECREF(n_tok); Py_XDECREF(n_cov); Py_XDECREF(n_hist); Py_XDECREF(done_a);
    return result;
}

/* ---- join / keep: the membership changes (BeamState.join / keep with _reshape) ------- */

/* The arrays of a group's state, as given (new references), with their sizes. */
typedef struct {
    PyArrayObject *ints, *beta, *request, *logp, *last, *tokens, *cov, *hist, *findex,
                  *fscore, *done;
    npy_intp Q, R, W, Sc, Wa, Sa, N;
} State;

static void state_clear(State *s) {
    Py_XDECREF(s->ints); Py_XDECREF(s->beta); Py_XDECREF(s->request); Py_XDECREF(s->logp);
    Py_XDECREF(s->last); Py_XDECREF(s->tokens); Py_XDECREF(s->cov); Py_XDECREF(s->hist);
    Py_XDECREF(s->findex); Py_XDECREF(s->fscore); Py_XDECREF(s->done);
    memset(s, 0, sizeof(*s));
}

/* Read and check the state's 11 arrays (request ints, beta, row request, logp, last, tokens,
 * coverage, attention, finished index, score, done); -1 with TypeError / ValueError. */
static int state_read(State *s, PyObject *const *o) {
    memset(s, 0, sizeof(*s));
    if (!(s->ints = in_array(o[0], NPY_INT64, 2, "request ints"))) return -1;
    if (!(s->beta = in_array(o[1], NPY_FLOAT64, 1, "request beta"))) return -1;
    if (!(s->request = in_array(o[2], NPY_INT64, 1, "row request"))) return -1;
    if (!(s->logp = in_array(o[3], NPY_FLOAT64, 1, "row logp"))) return -1;
    if (!(s->last = in_array(o[4], NPY_INT64, 1, "row last"))) return -1;
    if (!PyArray_Check(o[5]) || (PyArray_TYPE((PyArrayObject *)o[5]) != NPY_INT16
                                 && PyArray_TYPE((PyArrayObject *)o[5]) != NPY_INT32))
        return bad(PyExc_TypeError, "row tokens: an int16 or int32 array expected");
    if (!(s->tokens = in_array(o[5], PyArray_TYPE((PyArrayObject *)o[5]), 2, "row tokens")))
        return -1;
    if (!(s->cov = in_array(o[6], NPY_FLOAT64, 2, "row coverage"))) return -1;
    if (!(s->hist = in_array(o[7], NPY_FLOAT32, 3, "row attention"))) return -1;
    if (!(s->findex = in_array(o[8], NPY_INT64, 2, "finished index"))) return -1;
    if (!(s->fscore = in_array(o[9], NPY_FLOAT64, 2, "finished score"))) return -1;
    if (!(s->done = in_array(o[10], NPY_BOOL, 1, "done"))) return -1;
    s->Q = DIM(s->ints, 0); s->R = DIM(s->request, 0); s->W = DIM(s->tokens, 1);
    s->Sc = DIM(s->cov, 1); s->Wa = DIM(s->hist, 1); s->Sa = DIM(s->hist, 2);
    s->N = DIM(s->findex, 1);
    if (DIM(s->ints, 1) != N_COLUMNS) return bad(PyExc_ValueError, "request ints: wrong columns");
    if (DIM(s->beta, 0) != s->Q || DIM(s->findex, 0) != s->Q || DIM(s->fscore, 0) != s->Q
        || DIM(s->fscore, 1) != s->N || DIM(s->done, 0) != s->Q)
        return bad(PyExc_ValueError, "request beta, finished slots and done: (Q,) / (Q, N) expected");
    if (DIM(s->logp, 0) != s->R || DIM(s->last, 0) != s->R || DIM(s->tokens, 0) != s->R
        || DIM(s->cov, 0) != s->R || DIM(s->hist, 0) != s->R)
        return bad(PyExc_ValueError, "row arrays disagree in length");
    const int64_t *rq = I64(s->request);
    for (npy_intp r = 0; r < s->R; r++)
        if (rq[r] < 0 || rq[r] >= s->Q || (r && rq[r] < rq[r - 1]))
            return bad(PyExc_ValueError, "row request: out of range or not ascending");
    return 0;
}

/* What _reshape fits to: the history widths and the n-best slots. */
typedef struct { int64_t steps, nbest; int cov, attn; } Needs;

static void needs_add(Needs *n, const int64_t *iv, npy_intp count, const npy_bool *mask) {
    for (npy_intp q = 0; q < count; q++) {
        if (mask && !mask[q]) continue;
        const int64_t *iq = iv + q * N_COLUMNS;
        if (iq[C_MAXSTEPS] > n->steps) n->steps = iq[C_MAXSTEPS];
        if (iq[C_NBEST] > n->nbest) n->nbest = iq[C_NBEST];
        n->cov |= iq[C_COVERAGE] != 0;
        n->attn |= iq[C_ATTENTION] != 0;
    }
}

/* The widths after _reshape (the tokens only grow, coverage and attention follow the source
 * width while some request needs them) into w[0..4] = W, Sc, Wa, Sa, N. */
static void reshaped(const State *s, const Needs *n, npy_intp source, npy_intp *w) {
    npy_intp width = s->W > n->steps ? s->W : (npy_intp)n->steps;
    npy_intp src = s->Sc > s->Sa ? s->Sc : s->Sa;
    if (source > src) src = source;
    w[0] = width;
    w[1] = n->cov ? src : 0;
    w[2] = n->attn ? width : 0;
    w[3] = n->attn ? src : 0;
    w[4] = s->N > n->nbest ? s->N : (npy_intp)n->nbest;
}

/* Rows from .. from+count-1 of a C-contiguous (., a1, a2) array into rows to .. of a zeroed
 * (., b1, b2) one: their common block (arrays.fit); one copy where the widths agree. */
static void copy_fit(const PyArrayObject *src, npy_intp a1, npy_intp a2, PyArrayObject *dst,
                     npy_intp b1, npy_intp b2, npy_intp from, npy_intp to, npy_intp count) {
    size_t item = (size_t)PyArray_ITEMSIZE(src);
    npy_intp n1 = a1 < b1 ? a1 : b1, n2 = a2 < b2 ? a2 : b2;
    if (n1 <= 0 || n2 <= 0 || count <= 0) return;
    const char *s = (const char *)PyArray_DATA((PyArrayObject *)src) + (size_t)(from * a1 * a2) * item;
    char *d = (char *)PyArray_DATA(dst) + (size_t)(to * b1 * b2) * item;
    if (a1 == b1 && a2 == b2) { memcpy(d, s, (size_t)(count * a1 * a2) * item); return; }
    for (npy_intp r = 0; r < count; r++) {
        const char *sr = s + (size_t)(r * a1 * a2) * item;
        char *dr = d + (size_t)(r * b1 * b2) * item;
        if (n2 == a2 && n2 == b2) { memcpy(dr, sr, (size_t)(n1 * n2) * item); continue; }
        for (npy_intp i = 0; i < n1; i++)
            memcpy(dr + (size_t)(i * b2) * item, sr + (size_t)(i * a2) * item, (size_t)n2 * item);
    }
}

/* The new state: Q requests, R rows, widths w (W, Sc, Wa, Sa, N), zeroed but for the slots
 * (-1 / -inf); 0, or -1 with the error set (what was made is cleared by the caller). */
static int state_new(State *o, const State *s, npy_intp Q, npy_intp R, const npy_intp *w) {
    npy_intp dq[2] = {Q, N_COLUMNS}, dr[1] = {R}, dt[2] = {R, w[0]}, dc[2] = {R, w[1]},
             dh[3] = {R, w[2], w[3]}, dn[2] = {Q, w[4]};
    memset(o, 0, sizeof(*o));
    o->Q = Q; o->R = R; o->W = w[0]; o->Sc = w[1]; o->Wa = w[2]; o->Sa = w[3]; o->N = w[4];
    if (!(o->ints = (PyArrayObject *)PyArray_ZEROS(2, dq, NPY_INT64, 0))) return -1;
    if (!(o->beta = (PyArrayObject *)PyArray_ZEROS(1, dq, NPY_FLOAT64, 0))) return -1;
    if (!(o->request = (PyArrayObject *)PyArray_SimpleNew(1, dr, NPY_INT64))) return -1;
    if (!(o->logp = (PyArrayObject *)PyArray_ZEROS(1, dr, NPY_FLOAT64, 0))) return -1;
    if (!(o->last = (PyArrayObject *)PyArray_SimpleNew(1, dr, NPY_INT64))) return -1;
    if (!(o->tokens = (PyArrayObject *)PyArray_ZEROS(2, dt, PyArray_TYPE(s->tokens), 0))) return -1;
    if (!(o->cov = (PyArrayObject *)PyArray_ZEROS(2, dc, NPY_FLOAT64, 0))) return -1;
    if (!(o->hist = (PyArrayObject *)PyArray_ZEROS(3, dh, NPY_FLOAT32, 0))) return -1;
    if (!(o->findex = (PyArrayObject *)PyArray_SimpleNew(2, dn, NPY_INT64))) return -1;
    if (!(o->fscore = (PyArrayObject *)PyArray_SimpleNew(2, dn, NPY_FLOAT64))) return -1;
    if (!(o->done = (PyArrayObject *)PyArray_ZEROS(1, dq, NPY_BOOL, 0))) return -1;
    int64_t *fi = I64(o->findex);
    double *fs = F64(o->fscore);
    for (npy_intp i = 0; i < Q * w[4]; i++) { fi[i] = -1; fs[i] = -INFINITY; }
    return 0;
}

/* Request `from` of s into request `to` of o (ints, beta, slots, done). */
static void copy_request(const State *s, State *o, npy_intp from, npy_intp to) {
    memcpy(I64(o->ints) + to * N_COLUMNS, I64(s->ints) + from * N_COLUMNS,
           N_COLUMNS * sizeof(int64_t));
    F64(o->beta)[to] = F64(s->beta)[from];
    npy_intp n = s->N < o->N ? s->N : o->N;
    memcpy(I64(o->findex) + to * o->N, I64(s->findex) + from * s->N, (size_t)n * sizeof(int64_t));
    memcpy(F64(o->fscore) + to * o->N, F64(s->fscore) + from * s->N, (size_t)n * sizeof(double));
    BOOLS(o->done)[to] = BOOLS(s->done)[from];
}

/* Rows from .. from+count-1 of s into rows to .. of o (their request: the caller's). */
static void copy_rows(const State *s, State *o, npy_intp from, npy_intp to, npy_intp count) {
    memcpy(F64(o->logp) + to, F64(s->logp) + from, (size_t)count * sizeof(double));
    memcpy(I64(o->last) + to, I64(s->last) + from, (size_t)count * sizeof(int64_t));
    copy_fit(s->tokens, s->W, 1, o->tokens, o->W, 1, from, to, count);
    copy_fit(s->cov, s->Sc, 1, o->cov, o->Sc, 1, from, to, count);
    copy_fit(s->hist, s->Wa, s->Sa, o->hist, o->Wa, o->Sa, from, to, count);
}

static PyObject *state_tuple(State *o) {
    return Py_BuildValue("(OOOOOOOOOOO)", o->ints, o->beta, o->request, o->logp, o->last,
                         o->tokens, o->cov, o->hist, o->findex, o->fscore, o->done);
}

static PyObject *k_join(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[11], *o_new, *o_nbeta;
    long long bos;
    Py_ssize_t source;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOLn:join", &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o_new, &o_nbeta, &bos,
                          &source))
        return NULL;
    State s, out;
    PyArrayObject *fresh = NULL, *fbeta = NULL;
    PyObject *result = NULL;
    memset(&out, 0, sizeof(out));
    if (state_read(&s, o) < 0) goto fail;
    if (!(fresh = in_array(o_new, NPY_INT64, 2, "new request ints"))) goto fail;
    if (!(fbeta = in_array(o_nbeta, NPY_FLOAT64, 1, "new request beta"))) goto fail;
    npy_intp n = DIM(fresh, 0);
    if (DIM(fresh, 1) != N_COLUMNS || DIM(fbeta, 0) != n) {
        bad(PyExc_ValueError, "new requests: ints (n, 13) and beta (n,) expected");
        goto fail;
    }
    if (source < 0) { bad(PyExc_ValueError, "source width: negative"); goto fail; }
    Needs need = {0, 0, 0, 0};
    needs_add(&need, I64(s.ints), s.Q, NULL);
    needs_add(&need, I64(fresh), n, NULL);
    npy_intp w[5];
    reshaped(&s, &need, source, w);
    if (state_new(&out, &s, s.Q + n, s.R + n, w) < 0) goto fail;
    for (npy_intp q = 0; q < s.Q; q++) copy_request(&s, &out, q, q);
    memcpy(I64(out.ints) + s.Q * N_COLUMNS, I64(fresh), (size_t)(n * N_COLUMNS) * sizeof(int64_t));
    memcpy(F64(out.beta) + s.Q, F64(fbeta), (size_t)n * sizeof(double));
    memcpy(I64(out.request), I64(s.request), (size_t)s.R * sizeof(int64_t));
    copy_rows(&s, &out, 0, 0, s.R);
    for (npy_intp i = 0; i < n; i++) {  /* one BOS row each */
        I64(out.request)[s.R + i] = s.Q + i;
        I64(out.last)[s.R + i] = bos;
    }
    result = state_tuple(&out);
fail:
    state_clear(&s); state_clear(&out);
    Py_XDECREF(fresh); Py_XDECREF(fbeta);
    return result;
}

static PyObject *k_keep(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[11], *o_mask;
    Py_ssize_t source;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOn:keep", &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o_mask, &source))
        return NULL;
    State s, out;
    PyArrayObject *mask = NULL;
    npy_intp *moved = NULL;
    PyObject *result = NULL;
    memset(&out, 0, sizeof(out));
    if (state_read(&s, o) < 0) goto fail;
    if (!(mask = in_array(o_mask, NPY_BOOL, 1, "mask"))) goto fail;
    if (DIM(mask, 0) != s.Q) { bad(PyExc_ValueError, "mask: (Q,) expected"); goto fail; }
    if (source < 0) { bad(PyExc_ValueError, "source width: negative"); goto fail; }
    const npy_bool *m = BOOLS(mask);
    moved = malloc(((size_t)s.Q + 1) * sizeof(npy_intp));
    if (!moved) { PyErr_NoMemory(); goto fail; }
    npy_intp kept = 0, rows = 0;
    for (npy_intp q = 0; q < s.Q; q++) { moved[q] = kept; kept += m[q] != 0; }
    for (npy_intp r = 0; r < s.R; r++) rows += m[I64(s.request)[r]] != 0;
    npy_intp w[5] = {s.W, s.Sc, s.Wa, s.Sa, s.N};
    if (s.Sc || s.Wa) {  /* as _membership_changed: only histories that may drop */
        Needs need = {0, 0, 0, 0};
        needs_add(&need, I64(s.ints), s.Q, m);
        reshaped(&s, &need, source, w);
    }
    if (state_new(&out, &s, kept, rows, w) < 0) goto fail;
    for (npy_intp q = 0; q < s.Q; q++) if (m[q]) copy_request(&s, &out, q, moved[q]);
    const int64_t *rq = I64(s.request);
    for (npy_intp r = 0, e = 0; r < s.R;) {  /* runs of rows whose requests stay */
        npy_intp end = r;
        while (end < s.R && m[rq[end]]) { I64(out.request)[e + end - r] = moved[rq[end]]; end++; }
        copy_rows(&s, &out, r, e, end - r);
        e += end - r;
        for (r = end; r < s.R && !m[rq[r]]; r++) {}
    }
    result = state_tuple(&out);
fail:
    free(moved);
    state_clear(&s); state_clear(&out);
    Py_XDECREF(mask);
    return result;
}

/* ---- the batch plan (plan.py `plan_batch`) ------------------------------------------------
 *
 * The group [i, j) of sorted `lengths` (a list of ints) holding `anchor` in the cheapest split
 * of all rows into contiguous groups, a group costing `fixed + rows x lengths[j-1]` (fixed =
 * max(overhead, min_overhead)), each within `max_rows` and `max_tokens`. The same dynamic
 * programme as plan.py's Python, in the same order: the same doubles (`best + fixed` first,
 * then the group's padded tokens as an exact integer), the first (fewest rows) of equal
 * costs. No arrays: the GIL is kept. */
static PyObject *k_plan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *list;
    Py_ssize_t anchor, max_rows;
    long long max_tokens;
    double overhead, min_overhead;
    if (!PyArg_ParseTuple(args, "O!nnLdd", &PyList_Type, &list, &anchor, &max_rows,
                          &max_tokens, &overhead, &min_overhead))
        return NULL;
    if (max_rows < 1 || max_tokens < 1) {
        PyErr_SetString(PyExc_ValueError, "plan: max_rows and max_tokens must be >= 1");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    long long *len = malloc(sizeof(long long) * (size_t)(n > 0 ? n : 1));
    double *best = malloc(sizeof(double) * (size_t)(n + 1));
    Py_ssize_t *start = malloc(sizeof(Py_ssize_t) * (size_t)(n + 1));
    PyObject *result = NULL;
    if (len == NULL || best == NULL || start == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        len[i] = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
        if (len[i] == -1 && PyErr_Occurred())
            goto done;
        if (len[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "plan: a length is negative");
            goto done;
        }
    }
    double fixed = min_overhead > overhead ? min_overhead : overhead;  /* Python's max() */
    best[0] = 0.0;
    start[0] = 0;
    for (Py_ssize_t j = 1; j <= n; j++) {
        long long longest = len[j - 1];
        long long most = longest > 0 ? max_tokens / longest : (long long)max_rows;
        if (most < 1)
            most = 1;
        Py_ssize_t lo = j - max_rows;
        if ((long long)j - most > (long long)lo)
            lo = (Py_ssize_t)((long long)j - most);
        if (lo < 0)
            lo = 0;
        double low = 0.0;
        Py_ssize_t low_rows = 0;
        for (Py_ssize_t rows = 1; rows <= j - lo; rows++) {
            double cost = (best[j - rows] + fixed) + (double)(rows * longest);
            if (low_rows == 0 || cost < low) {
                low = cost;
                low_rows = rows;
            }
        }
        best[j] = low;
        start[j] = j - low_rows;
    }
    Py_ssize_t j = n;
    while (start[j] > anchor)
        j = start[j];
    result = Py_BuildValue("(nn)", start[j], j);
done:
    free(len);
    free(best);
    free(start);
    return result;
}

/* ---- the decode group's memory bank (group.py `MemoryBank`) --------------------------------
 *
 * The bank's planes (memory (C, S, D) and, when the encoder returns them, keys (C, S, A)),
 * its mask (C, S) and lengths (C,) are written in place; the caller has sized them (its
 * `_resize`). `bank_add` fills slots used .. used+n-1 as MemoryBank.add's numpy does: a
 * position t of memory i is copied where t < min(S, S_i) and t < lengths[i], else zero; the
 * mask is t < lengths[i]. `bank_free` moves the last used slots that stay into the freed
 * slots below `used - len(slots)` (the i-th hole, in slot order, gets the i-th such slot),
 * zeroes the lengths of the slots past the new end, and returns (moved (C,): the new slot of
 * every slot, the longest length left). Rows past the end keep their bytes, as numpy's do.
 * Copies of a few KB: the GIL is kept. */
typedef struct {
    PyArrayObject *memory, *keys, *mask, *lengths;
    npy_intp C, S, D, A;
} Bank;

static int bank_read(Bank *b, PyObject *memory, PyObject *keys, PyObject *mask,
                     PyObject *lengths) {
    memset(b, 0, sizeof(*b));
    if (!(b->memory = out_array(memory, NPY_FLOAT32, 3, "memory"))) return -1;
    if (keys != Py_None && !(b->keys = out_array(keys, NPY_FLOAT32, 3, "keys"))) return -1;
    if (!(b->mask = out_array(mask, NPY_BOOL, 2, "mask"))) return -1;
    if (!(b->lengths = out_array(lengths, NPY_INT64, 1, "lengths"))) return -1;
    b->C = DIM(b->memory, 0); b->S = DIM(b->memory, 1); b->D = DIM(b->memory, 2);
    b->A = b->keys ? DIM(b->keys, 2) : 0;
    if (b->keys && (DIM(b->keys, 0) != b->C || DIM(b->keys, 1) != b->S))
        return bad(PyExc_ValueError, "keys: (C, S, A) expected, as memory's (C, S)");
    if (DIM(b->mask, 0) != b->C || DIM(b->mask, 1) != b->S)
        return bad(PyExc_ValueError, "mask: (C, S) expected");
    if (DIM(b->lengths, 0) != b->C) return bad(PyExc_ValueError, "lengths: (C,) expected");
    return 0;
}

/* plane[slot, t] = values[i, t] for t < min(S, S_i) and t < length, else zeros */
static void bank_fill(float *plane, npy_intp S, npy_intp D, npy_intp slot, const float *values,
                      npy_intp Si, npy_intp i, int64_t length) {
    float *row = plane + (size_t)slot * (size_t)S * (size_t)D;
    const float *src = values + (size_t)i * (size_t)Si * (size_t)D;
    for (npy_intp t = 0; t < S; t++) {
        if (t < Si && (int64_t)t < length)
            memcpy(row + (size_t)t * (size_t)D, src + (size_t)t * (size_t)D,
                   sizeof(float) * (size_t)D);
        else
            memset(row + (size_t)t * (size_t)D, 0, sizeof(float) * (size_t)D);
    }
}

static PyObject *k_bank_add(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_mem, *o_keys, *o_mask, *o_len, *o_values, *o_new_keys, *o_new_len;
    Py_ssize_t used;
    if (!PyArg_ParseTuple(args, "OOOOnOOO:bank_add", &o_mem, &o_keys, &o_mask, &o_len, &used,
                          &o_values, &o_new_keys, &o_new_len))
        return NULL;
    Bank b;
    PyArrayObject *values = NULL, *new_keys = NULL, *new_len = NULL;
    PyObject *result = NULL;
    if (bank_read(&b, o_mem, o_keys, o_mask, o_len) < 0) goto done;
    if (!(values = in_array(o_values, NPY_FLOAT32, 3, "values"))) goto done;
    if (!(new_len = in_array(o_new_len, NPY_INT64, 1, "new lengths"))) goto done;
    if ((o_new_keys == Py_None) != (b.keys == NULL)) {
        bad(PyExc_ValueError, "new keys: given exactly where the bank holds keys");
        goto done;
    }
    if (b.keys && !(new_keys = in_array(o_new_keys, NPY_FLOAT32, 3, "new keys"))) goto done;
    npy_intp n = DIM(new_len, 0), Si = DIM(values, 1);
    if (DIM(values, 0) != n || DIM(values, 2) != b.D) {
        bad(PyExc_ValueError, "values: (n, S_n, D) expected, D as the bank's");
        goto done;
    }
    if (new_keys && (DIM(new_keys, 0) != n || DIM(new_keys, 1) != Si || DIM(new_keys, 2) != b.A)) {
        bad(PyExc_ValueError, "new keys: (n, S_n, A) expected, as values' and the bank's");
        goto done;
    }
    if (used < 0 || used + n > b.C) {
        bad(PyExc_ValueError, "used + n: past the bank's capacity");
        goto done;
    }
    const int64_t *L = I64(new_len);
    for (npy_intp i = 0; i < n; i++) {
        npy_intp slot = used + i;
        bank_fill(F32(b.memory), b.S, b.D, slot, F32(values), Si, i, L[i]);
        if (new_keys) bank_fill(F32(b.keys), b.S, b.A, slot, F32(new_keys), Si, i, L[i]);
        npy_bool *m = BOOLS(b.mask) + (size_t)slot * (size_t)b.S;
        for (npy_intp t = 0; t < b.S; t++) m[t] = (int64_t)t < L[i];
        I64(b.lengths)[slot] = L[i];
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(values); Py_XDECREF(new_keys); Py_XDECREF(new_len);
    return result;
}

static PyObject *k_bank_free(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_mem, *o_keys, *o_mask, *o_len, *o_slots;
    Py_ssize_t used;
    if (!PyArg_ParseTuple(args, "OOOOnO:bank_free", &o_mem, &o_keys, &o_mask, &o_len, &used,
                          &o_slots))
        return NULL;
    Bank b;
    PyArrayObject *slots = NULL, *moved = NULL;
    char *gone = NULL;
    PyObject *result = NULL;
    if (bank_read(&b, o_mem, o_keys, o_mask, o_len) < 0) goto done;
    if (!(slots = in_array(o_slots, NPY_INT64, 1, "slots"))) goto done;
    if (used < 0 || used > b.C) { bad(PyExc_ValueError, "used: past the capacity"); goto done; }
    npy_intp k = DIM(slots, 0), left = used - k;
    gone = calloc((size_t)used + 1, 1);
    if (!gone) { PyErr_NoMemory(); goto done; }
    for (npy_intp i = 0; i < k; i++) {
        int64_t s = I64(slots)[i];
        if (s < 0 || s >= used || gone[s]) {
            bad(PyExc_ValueError, "slots: each a distinct used slot");
            goto done;
        }
        gone[s] = 1;
    }
    npy_intp dims[1] = {b.C};
    if (!(moved = (PyArrayObject *)PyArray_SimpleNew(1, dims, NPY_INT64))) goto done;
    int64_t *mv = I64(moved), *len = I64(b.lengths);
    for (npy_intp c = 0; c < b.C; c++) mv[c] = c;
    size_t row = (size_t)b.S * (size_t)b.D, krow = (size_t)b.S * (size_t)b.A;
    npy_intp tail = left;
    for (npy_intp h = 0; h < left; h++) {
        if (!gone[h]) continue;
        while (gone[tail]) tail++;  /* the next used slot past the end that stays */
        memcpy(F32(b.memory) + (size_t)h * row, F32(b.memory) + (size_t)tail * row,
               sizeof(float) * row);
        if (b.keys)
            memcpy(F32(b.keys) + (size_t)h * krow, F32(b.keys) + (size_t)tail * krow,
                   sizeof(float) * krow);
        memcpy(BOOLS(b.mask) + (size_t)h * (size_t)b.S, BOOLS(b.mask) + (size_t)tail * (size_t)b.S,
               sizeof(npy_bool) * (size_t)b.S);
        len[h] = len[tail];
        mv[tail] = h;
        tail++;
    }
    int64_t longest = 0;
    for (npy_intp c = left; c < used; c++) len[c] = 0;
    for (npy_intp c = 0; c < left; c++) if (len[c] > longest) longest = len[c];
    result = Py_BuildValue("(OL)", (PyObject *)moved, (long long)longest);
done:
    free(gone);
    Py_XDECREF(slots); Py_XDECREF(moved);
    return result;
}

static PyMethodDef methods[] = {
    {"select", k_select, METH_VARARGS,
     "select(row_logp, logprobs, ids, row_request, request_ints, k, eos_id, ban_or_None)\n"
     "-> (neg (R, k), row, tok, val, valid (Q, C), starts (Q,))"},
    {"advance", k_advance, METH_VARARGS,
     "advance(row, tok, val, valid, request_ints, row_request, row_logp, row_tokens,\n"
     " row_coverage, row_attention, attention, lp_table, eos_id, finished_index,\n"
     " finished_score, pool score, logp, length, ended, tokens, coverage, attention, used,\n"
     " coverage_terms_or_None, stuck_coverage_terms_or_None)\n"
     "-> (parents, request, logp, last, tokens, coverage, attention, done, used)"},
    {"join", k_join, METH_VARARGS,
     "join(request_ints, request_beta, row_request, row_logp, row_last, row_tokens,\n"
     " row_coverage, row_attention, finished_index, finished_score, done, new_ints,\n"
     " new_beta, bos_id, source_width)\n"
     "-> (ints, beta, request, logp, last, tokens, coverage, attention, index, score, done)"},
    {"keep", k_keep, METH_VARARGS,
     "keep(request_ints, request_beta, row_request, row_logp, row_last, row_tokens,\n"
     " row_coverage, row_attention, finished_index, finished_score, done, mask,\n"
     " source_width)\n"
     "-> (ints, beta, request, logp, last, tokens, coverage, attention, index, score, done)"},
    {"plan", k_plan, METH_VARARGS,
     "plan(lengths (a list of ints, sorted), anchor, max_rows, max_tokens, overhead,\n"
     " min_overhead) -> (i, j): plan.py's plan_batch"},
    {"bank_add", k_bank_add, METH_VARARGS,
     "bank_add(memory, keys_or_None, mask, lengths, used, values, new_keys_or_None,\n"
     " new_lengths) -> None: group.py's MemoryBank.add, in place"},
    {"bank_free", k_bank_free, METH_VARARGS,
     "bank_free(memory, keys_or_None, mask, lengths, used, slots)\n"
     "-> (moved (C,), longest left): group.py's MemoryBank.free, in place"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_beam_kernel",
    "The per-step update of seqserve's vectorised beam search and the batcher's plan, "
    "compiled (native/beam).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__beam_kernel(void) {
    import_array();
    return PyModule_Create(&module);
}
