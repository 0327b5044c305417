/* The hopper_mma weight transforms (hopper_np.weight_forward's bytes, every bit order), compiled.

   Optional: mxfp4conv.shuffle.hopper_native uses it when it is built and falls back to numpy
   otherwise. One call transforms whole 16-row slabs with the GIL released, so convert's worker
   threads run in parallel.

   Per slab (rows 8h + g, h = 0, 1; kb bytes a row), a stored word (block b, lane 4g + t, word
   kt) holds the codes of rows g and 8 + g at bytes 32b + 8kt + 4c + t (c = 0, 1), bits re-encoded
   (hopper.py). Each uint64 lane of row g, and the same lane of row 8 + g, give the words of t = 0..3
   for one (b, kt) with a few delta swaps and a fixed shift/mask re-encoding: no table lookup,
   so the compiler vectorises the loop over lanes. A second pass puts the words in stored order.
   Little-endian only (hopper_native checks). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* x86-64 with glibc: also compile AVX2 and AVX-512 copies of the lane loop, picked at load time */
#if defined(__x86_64__) && defined(__GLIBC__) && (defined(__GNUC__) || defined(__clang__))
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

#define EACH16(m) ((uint64_t)(m) * 0x0001000100010001ull) /* a 16-bit mask in every quarter */

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline void store32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
}

static inline uint64_t delta_swap(uint64_t x, int shift, uint64_t mask) {
    uint64_t d = ((x >> shift) ^ x) & mask;
    return x ^ d ^ (d << shift);
}

/* Each 16-bit quarter holds one half of a word, its 4 nibbles being the low (or high) nibbles of
   the bytes of rows (g, c = 0), (g, c = 1), (8 + g, c = 0), (8 + g, c = 1): move their bits to
   hopper_np.BITS's positions (the same for both halves). */
static inline uint64_t encode(uint64_t u) {
    return ((u & EACH16(0x0007)) << 6) | ((u & EACH16(0x0008)) << 12) | ((u & EACH16(0xC070)) >> 1)
         | ((u & EACH16(0x0080)) << 5) | ((u & EACH16(0x0700)) >> 8) | ((u & EACH16(0x3800)) >> 2);
}

/* rotl32(w, k) of both 32-bit words of u, keeping the bits that land in m (a 32-bit mask): bits at
   k and above come from the left shift, the wrapped ones below k from the right shift. */
#define ROTL_MASKED(u, k, m) \
    ((((u) << (k)) & ((uint64_t)((m) & ~((1u << (k)) - 1)) * 0x100000001ull)) \
     | (((u) >> (32 - (k))) & ((uint64_t)((m) & ((1u << (k)) - 1)) * 0x100000001ull)))

/* Both words of u from the BITS order to the BITS_ROT order (hopper_mma_w -> hopper_mma_w_rot):
   each bit moves left by one of seven rotations (the identity for R0's bits). */
static inline uint64_t to_rot(uint64_t u) {
    return (u & 0x81C081C081C081C0ull) | ROTL_MASKED(u, 13, 0x04000400u) | ROTL_MASKED(u, 14, 0x02000200u)
         | ROTL_MASKED(u, 19, 0x00020002u) | ROTL_MASKED(u, 22, 0x00010001u) | ROTL_MASKED(u, 28, 0x70207020u)
         | ROTL_MASKED(u, 31, 0x081C081Cu);
}

/* Both words of u from the BITS order to the xor order (hopper_mma_w -> hopper_mma_w_xor), a linear map over
   GF(2): the xor of eleven masked rotations (hopper_np.order_matrix("xor") times the inverse of BITS's; the tests
   check the bytes against the numpy path's). */
static inline uint64_t to_xor(uint64_t u) {
    return (u & 0x81C081C081C081C0ull) ^ ROTL_MASKED(u, 1, 0x40004000u) ^ ROTL_MASKED(u, 7, 0x00000020u)
         ^ ROTL_MASKED(u, 8, 0x40004000u) ^ ROTL_MASKED(u, 10, 0x00000020u) ^ ROTL_MASKED(u, 15, 0x00002000u)
         ^ ROTL_MASKED(u, 18, 0x00102010u) ^ ROTL_MASKED(u, 23, 0x00200020u) ^ ROTL_MASKED(u, 26, 0x1C381C38u)
         ^ ROTL_MASKED(u, 29, 0x02070207u) ^ ROTL_MASKED(u, 31, 0x20002000u);
}

static inline uint64_t to_order(uint64_t u, int order) {
    return order == 1 ? to_rot(u) : order == 2 ? to_xor(u) : u;
}

/* lanes: the slab's uint64 lanes of rows 0..7 (h = 0); the same lane of rows 8..15 follows 8 kb
   bytes later. even[i], odd[i]: the words (t = 0, 2) and (t = 1, 3) of lane i; order: 0 the BITS
   order, 1 BITS_ROT, 2 the xor order (hopper_np.ORDERS). */
CLONES
static void encode_lanes(const uint8_t *restrict lanes, Py_ssize_t kb, uint64_t *restrict even,
                         uint64_t *restrict odd, int order) {
    for (Py_ssize_t i = 0; i < kb; i++) {
        /* bytes t of the low half: low nibbles (c = 0, then c = 1); of the high half: high nibbles */
        uint64_t a = delta_swap(load64(lanes + 8 * i), 28, 0x00000000F0F0F0F0ull);
        uint64_t c = delta_swap(load64(lanes + 8 * kb + 8 * i), 28, 0x00000000F0F0F0F0ull);
        /* 16-bit quarters (row g byte, row 8 + g byte): t = 0, 2 low, t = 0, 2 high; odd: t = 1, 3 */
        uint64_t p = (a & EACH16(0x00FF)) | ((c & EACH16(0x00FF)) << 8);
        uint64_t q = ((a >> 8) & EACH16(0x00FF)) | (c & EACH16(0xFF00));
        /* swap the middle quarters: whole words (t = 0 | t = 2), (t = 1 | t = 3) */
        uint64_t ev = encode(delta_swap(p, 16, 0x00000000FFFF0000ull));
        uint64_t od = encode(delta_swap(q, 16, 0x00000000FFFF0000ull));
        even[i] = to_order(ev, order); /* loop-invariant: the compiler splits the loop */
        odd[i] = to_order(od, order);
    }
}

/* Lane i = (g, b, kt) -> stored word ((b, g, t, kt)): byte 512b + 64g + 16t + 4kt. */
static void place_words(const uint64_t *restrict even, const uint64_t *restrict odd, Py_ssize_t kb,
                        uint8_t *restrict out) {
    Py_ssize_t nb = kb / 32;
    for (Py_ssize_t b = 0; b < nb; b++)
        for (Py_ssize_t g = 0; g < 8; g++) {
            const uint64_t *restrict e = even + (g * nb + b) * 4, *restrict o = odd + (g * nb + b) * 4;
            uint8_t *w = out + 512 * b + 64 * g; /* words (t, kt) */
            for (int kt = 0; kt < 4; kt++) {
                store32(w + 4 * kt, (uint32_t)e[kt]);
                store32(w + 16 + 4 * kt, (uint32_t)o[kt]);
                store32(w + 32 + 4 * kt, (uint32_t)(e[kt] >> 32));
                store32(w + 48 + 4 * kt, (uint32_t)(o[kt] >> 32));
            }
        }
}

PyDoc_STRVAR(weight_forward_doc,
"weight_forward(x, out, kb, order=0)\n\n"
"Write the hopper_mma_w (order 1: hopper_mma_w_rot, 2: hopper_mma_w_xor) bytes of x (C-contiguous\n"
"bytes: 16-row slabs of kb bytes a row, kb a multiple of 32) into out (writable, C-contiguous, the\n"
"same size, not overlapping x).");

static PyObject *weight_forward(PyObject *self, PyObject *args) {
    Py_buffer x, y;
    Py_ssize_t kb;
    int order = 0;
    if (!PyArg_ParseTuple(args, "y*w*n|i", &x, &y, &kb, &order))
        return NULL;
    const uint8_t *in = x.buf;
    uint8_t *out = y.buf;
    uint64_t *lanes = NULL;
    if (order < 0 || order > 2)
        PyErr_Format(PyExc_ValueError, "weight_forward: bit order %d, expected 0, 1 or 2", order);
    else if (kb <= 0 || kb % 32 || x.len % (16 * kb) || y.len != x.len)
        PyErr_Format(PyExc_ValueError, "weight_forward: %zd input bytes, %zd output bytes, rows of %zd bytes: "
                     "need equal sizes, whole 16-row slabs and rows a positive multiple of 32 bytes",
                     x.len, y.len, kb);
    else if (x.len && in < out + y.len && out < in + x.len)
        PyErr_SetString(PyExc_ValueError, "weight_forward: the output overlaps the input");
    else if (!(lanes = malloc(16 * (size_t)kb)))
        PyErr_NoMemory();
    else {
        Py_ssize_t slab = 16 * kb, slabs = x.len / slab;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t s = 0; s < slabs; s++) {
            encode_lanes(in + s * slab, kb, lanes, lanes + kb, order);
            place_words(lanes, lanes + kb, kb, out + s * slab);
        }
        Py_END_ALLOW_THREADS
    }
    free(lanes);
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"weight_forward", weight_forward, METH_VARARGS, weight_forward_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hopper_native", "The hopper_mma weight transform, compiled.", -1, methods,
};

PyMODINIT_FUNC PyInit__hopper_native(void) {
    return PyModule_Create(&module);
}
