/* cudnn_sdpa.c — the causal attention forward and backward of
 * cudnn_sdpa.h as cuDNN operation graphs: backend descriptors, one engine
 * from the heuristics, one execution plan each.
 *
 * The backward follows the op sequence cuDNN's flash-attention backward
 * engine recognises (the one cuDNN's frontend builds for its SDPA backward
 * before cuDNN 9.21): the rows' Σ dO∘O into a real fp32 tensor, P
 * recomputed as exp(S·scale − stats) then masked, Pᵀ and dSᵀ as reshapes
 * to 16 bits, dK and dV per query head then summed over each group by a
 * reduction (GQA), dQ through a real fp32 accumulator and an identity op.
 *
 * cuDNN's functions are reached through a table filled by dlsym, so that
 * only its headers are needed to build (GRADD_HAVE_CUDNN); without them
 * every entry point says so. */
#include "cudnn_sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef GRADD_HAVE_CUDNN

struct sdpa_lib {
    int unused;
};

sdpa_lib *sdpa_open(void *stream, char *why, size_t why_len)
{
    (void)stream;
    snprintf(why, why_len, "gradd was built without cuDNN's headers");
    return NULL;
}

void sdpa_close(sdpa_lib *lib) { (void)lib; }

size_t sdpa_version(const sdpa_lib *lib)
{
    (void)lib;
    return 0;
}

sdpa_plan *sdpa_plan_make(sdpa_lib *lib, bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, char *why,
                          size_t why_len)
{
    (void)lib, (void)backward, (void)bf16, (void)B, (void)T, (void)NH, (void)KVH, (void)HS;
    snprintf(why, why_len, "gradd was built without cuDNN's headers");
    return NULL;
}

int sdpa_check_ops(bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len)
{
    (void)backward, (void)bf16, (void)B, (void)T, (void)NH, (void)KVH, (void)HS;
    snprintf(why, why_len, "gradd was built without cuDNN's headers");
    return -1;
}

void sdpa_plan_free(sdpa_plan *p) { (void)p; }

size_t sdpa_plan_scratch(const sdpa_plan *p)
{
    (void)p;
    return 0;
}

int sdpa_forward(sdpa_plan *p, const uint16_t *qkv16, uint16_t *out16, float *stats, void *scratch, char *why,
                 size_t why_len)
{
    (void)p, (void)qkv16, (void)out16, (void)stats, (void)scratch;
    snprintf(why, why_len, "gradd was built without cuDNN's headers");
    return -1;
}

int sdpa_backward(sdpa_plan *p, const uint16_t *qkv16, const uint16_t *out16, const uint16_t *dout16,
                  const float *stats, uint16_t *dqkv16, void *scratch, char *why, size_t why_len)
{
    (void)p, (void)qkv16, (void)out16, (void)dout16, (void)stats, (void)dqkv16, (void)scratch;
    snprintf(why, why_len, "gradd was built without cuDNN's headers");
    return -1;
}

#else

#include <cuda_runtime_api.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>

#define SDPA_MAX_DESC 128
#define SDPA_MAX_OPS 32

/* The functions of libcudnn used here, by their names less "cudnn". */
#define SDPA_FUNCS(X)                                                                                                 \
    X(GetVersion)                                                                                                     \
    X(GetErrorString)                                                                                                 \
    X(GetLastErrorString)                                                                                             \
    X(Create)                                                                                                         \
    X(Destroy)                                                                                                        \
    X(SetStream)                                                                                                      \
    X(BackendCreateDescriptor)                                                                                        \
    X(BackendDestroyDescriptor)                                                                                       \
    X(BackendSetAttribute)                                                                                            \
    X(BackendGetAttribute)                                                                                            \
    X(BackendFinalize)                                                                                                \
    X(BackendExecute)

typedef struct {
#define SDPA_PTR(name) __typeof__(&cudnn##name) name;
    SDPA_FUNCS(SDPA_PTR)
#undef SDPA_PTR
} sdpa_api;

struct sdpa_lib {
    sdpa_api f;
    cudnnHandle_t handle;
    cudaStream_t stream;
    size_t version;
};

/* The variant pack's ids of the graphs' real tensors; virtual ones count
 * up from U_VIRTUAL. */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF, U_ONE,
    U_DO, U_DQ, U_DK, U_DV, U_DOT, U_DQ_ACC,
    U_VIRTUAL = 100
};

struct sdpa_plan {
    sdpa_lib *lib;
    bool backward;
    cudnnBackendDescriptor_t desc[SDPA_MAX_DESC]; /* every descriptor made, freed in reverse */
    int ndesc;
    cudnnBackendDescriptor_t plan;
    int64_t workspace_bytes;
    int B, T, NH, KVH, HS;
    float scale, neg_inf, one; /* the by-value scalars' values */
    bool zero_dq_acc;          /* cuDNN before 9.6 adds into dQ's accumulator without clearing it first */
};

/* Building a graph: the first refusal is kept (and named), the calls
 * after it do nothing.  Ops are collected in ops, in the order made. */
typedef struct {
    sdpa_plan *g;
    const sdpa_api *f;
    char *why;
    size_t len;
    bool failed;
    int64_t next_uid;
    cudnnDataType_t e; /* the 16-bit type */
    cudnnBackendDescriptor_t ops[SDPA_MAX_OPS];
    int nops;
} builder;

/* The message of a failed call: what, cuDNN's status and its last error. */
static void describe(const sdpa_api *f, cudnnStatus_t s, const char *what, char *why, size_t len)
{
    char last[512] = "";
    f->GetLastErrorString(last, sizeof last);
    snprintf(why, len, "cuDNN %s: %s%s%s", what, f->GetErrorString(s), last[0] ? ": " : "", last);
}

static void fail(builder *b, cudnnStatus_t s, const char *what)
{
    if (b->failed)
        return;
    b->failed = true;
    describe(b->f, s, what, b->why, b->len);
}

static cudnnBackendDescriptor_t create(builder *b, cudnnBackendDescriptorType_t type, const char *what)
{
    cudnnBackendDescriptor_t d = NULL;
    if (b->failed)
        return NULL;
    if (b->g->ndesc == SDPA_MAX_DESC) {
        fail(b, CUDNN_STATUS_ALLOC_FAILED, "more descriptors than SDPA_MAX_DESC");
        return NULL;
    }
    cudnnStatus_t s = b->f->BackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        fail(b, s, what);
        return NULL;
    }
    b->g->desc[b->g->ndesc++] = d;
    return d;
}

static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *value, const char *what)
{
    if (b->failed)
        return;
    cudnnStatus_t s = b->f->BackendSetAttribute(d, name, type, n, value);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(b, s, what);
}

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what)
{
    if (b->failed)
        return;
    cudnnStatus_t s = b->f->BackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(b, s, what);
}

/* d's attribute name: the descriptor to. */
static void link(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendDescriptor_t to, const char *what)
{
    set(b, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &to, what);
}

/* An op descriptor of `type` whose attributes names[i] are the
 * descriptors ds[i] (a NULL one left unset), finalized and appended to
 * the graph's ops. */
static void add_op(builder *b, cudnnBackendDescriptorType_t type, int n, const cudnnBackendAttributeName_t *names,
                   const cudnnBackendDescriptor_t *ds, const char *what)
{
    cudnnBackendDescriptor_t op = create(b, type, what);
    for (int i = 0; i < n; i++)
        if (ds[i])
            link(b, op, names[i], ds[i], what);
    finalize(b, op, what);
    if (b->failed)
        return;
    if (b->nops == SDPA_MAX_OPS)
        fail(b, CUDNN_STATUS_ALLOC_FAILED, "more ops than SDPA_MAX_OPS");
    else
        b->ops[b->nops++] = op;
}

/* The descriptor of a matmul or reduction, computing in fp32 (and the
 * reduction's operator). */
static cudnnBackendDescriptor_t fp32_desc(builder *b, cudnnBackendDescriptorType_t type,
                                          cudnnBackendAttributeName_t comp_attr, const cudnnReduceTensorOp_t *mode,
                                          const char *what)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t d = create(b, type, what);
    set(b, d, comp_attr, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    if (mode)
        set(b, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, mode, what);
    finalize(b, d, what);
    return d;
}

/* A 4-d tensor: real (uid given, in the variant pack) or virtual (uid 0:
 * the next one; packed strides when strides is NULL). */
static cudnnBackendDescriptor_t tensor(builder *b, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                                       const int64_t *strides, const char *what)
{
    int64_t packed[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1}, align = 16;
    bool is_virtual = uid == 0;
    if (is_virtual)
        uid = b->next_uid++;
    cudnnBackendDescriptor_t d = create(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    set(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    set(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    set(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, what);
    set(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides ? strides : packed, what);
    set(b, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    finalize(b, d, what);
    return d;
}

/* A virtual tensor, packed. */
static cudnnBackendDescriptor_t virt(builder *b, cudnnDataType_t type, const int64_t dims[4], const char *what)
{
    return tensor(b, 0, type, dims, NULL, what);
}

/* H heads of HS values per token, side by side in rows of `width` values
 * (B,T,width): (B,H,T,HS), or with transposed (B,H,HS,T), as a matmul's
 * right operand Kᵀ or Vᵀ.  The heads' first column is the pointer's. */
static cudnnBackendDescriptor_t heads(builder *b, int64_t uid, cudnnDataType_t type, int H, int64_t width,
                                      bool transposed, const char *what)
{
    const sdpa_plan *g = b->g;
    const int64_t T = g->T, HS = g->HS;
    const int64_t dims[4] = {g->B, H, transposed ? HS : T, transposed ? T : HS};
    const int64_t strides[4] = {T * width, HS, transposed ? 1 : width, transposed ? width : 1};
    return tensor(b, uid, type, dims, strides, what);
}

/* A float passed by value (the variant pack points at host memory). */
static cudnnBackendDescriptor_t scalar(builder *b, int64_t uid, const char *what)
{
    int64_t one[4] = {1, 1, 1, 1}, align = 4;
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    bool by_value = true;
    cudnnBackendDescriptor_t d = create(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    set(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    set(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    set(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, one, what);
    set(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, one, what);
    set(b, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    finalize(b, d, what);
    return d;
}

/* y = mode(x, with, t) elementwise (with, t may be NULL; axis >= 0 for
 * GEN_INDEX), computed in fp32 but for the mask's comparison, in boolean:
 * the math precisions of cuDNN's frontend's attention graphs, whose op
 * sequences the fused engines recognise.  (GEN_INDEX computes in fp32 and
 * writes int32 there too.)  Returns y. */
static cudnnBackendDescriptor_t pointwise(builder *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t with, cudnnBackendDescriptor_t t,
                                          cudnnBackendDescriptor_t y, int64_t axis, const char *what)
{
    cudnnDataType_t prec = mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = create(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    if (axis >= 0)
        set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    finalize(b, pw, what);
    static const cudnnBackendAttributeName_t names[5] = {
        CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC};
    const cudnnBackendDescriptor_t ds[5] = {pw, x, with, t, y};
    add_op(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 5, names, ds, what);
    return y;
}

/* c = a·b over the last two dimensions, accumulated in fp32; a head
 * dimension of b (or a) that is 1/g of c's is broadcast over groups of g
 * (GQA).  Returns c. */
static cudnnBackendDescriptor_t matmul(builder *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                                       cudnnBackendDescriptor_t c, const char *what)
{
    static const cudnnBackendAttributeName_t names[4] = {
        CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
        CUDNN_ATTR_OPERATION_MATMUL_DESC};
    const cudnnBackendDescriptor_t ds[4] = {
        a, bm, c, fp32_desc(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, NULL, what)};
    add_op(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, names, ds, what);
    return c;
}

/* y = x reduced where y's dimension is smaller: to 1 (a row's max or
 * sum), or on the head dimension from NH to KVH (each group's query heads
 * summed, GQA).  Returns y. */
static cudnnBackendDescriptor_t reduction(builder *b, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y, const char *what)
{
    static const cudnnBackendAttributeName_t names[3] = {
        CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_ATTR_OPERATION_REDUCTION_DESC};
    const cudnnBackendDescriptor_t ds[3] = {
        x, y, fp32_desc(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, &mode, what)};
    add_op(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, names, ds, what);
    return y;
}

/* y = x seen through y's dims and strides (the patterns' transposes: the
 * same elements, the last two dimensions swapped).  Returns y. */
static cudnnBackendDescriptor_t reshape(builder *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                                        const char *what)
{
    static const cudnnBackendAttributeName_t names[2] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                                          CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
    const cudnnBackendDescriptor_t ds[2] = {x, y};
    add_op(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2, names, ds, what);
    return y;
}

/* The scores s (B,NH,T,T) with every key index > query index set to
 * neg_inf: index generation, comparison and select, the causal-mask
 * pattern the attention engines recognise, forward and backward. */
static cudnnBackendDescriptor_t causal_mask(builder *b, cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t neg_inf,
                                            const int64_t sd[4])
{
    cudnnBackendDescriptor_t row = virt(b, CUDNN_DATA_INT32, sd, "row index");
    pointwise(b, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, row, 2, "row index");
    cudnnBackendDescriptor_t col = virt(b, CUDNN_DATA_INT32, sd, "column index");
    pointwise(b, CUDNN_POINTWISE_GEN_INDEX, s, NULL, NULL, col, 3, "column index");
    cudnnBackendDescriptor_t keep = virt(b, CUDNN_DATA_BOOLEAN, sd, "causal mask");
    pointwise(b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, -1, "row >= column");
    return pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf, keep, virt(b, CUDNN_DATA_FLOAT, sd, "S masked"),
                     -1, "mask");
}

/* d (B,KVH,T,HS) = a·bm summed over the query heads of each group: a key
 * or value head's gradient has a term from each of the NH/KVH query heads
 * that read it.  cuDNN's pattern: the product per query head (B,NH,T,HS),
 * 16-bit, then a sum reduction to KVH heads; a plain matmul without GQA. */
static void grouped_matmul(builder *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                           cudnnBackendDescriptor_t d, const char *what)
{
    const sdpa_plan *g = b->g;
    if (g->NH == g->KVH) {
        matmul(b, a, bm, d, what);
        return;
    }
    const int64_t full[4] = {g->B, g->NH, g->T, g->HS};
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, matmul(b, a, bm, virt(b, b->e, full, what), what), d, what);
}


/* The first engine configuration the heuristics give that makes a plan. */
static void make_plan(builder *b, cudnnBackendDescriptor_t graph)
{
    sdpa_plan *g = b->g;
    const sdpa_api *f = b->f;
    cudnnBackendDescriptor_t heur = create(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    link(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics");
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    finalize(b, heur, "heuristics: the graph");
    if (b->failed)
        return;
    int64_t count = 0;
    cudnnStatus_t s =
        f->BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (s != CUDNN_STATUS_SUCCESS || count == 0) {
        fail(b, s != CUDNN_STATUS_SUCCESS ? s : CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no engine for the graph");
        return;
    }
    cudnnBackendDescriptor_t *cfg = calloc((size_t)count, sizeof *cfg);
    if (!cfg) {
        fail(b, CUDNN_STATUS_ALLOC_FAILED, "heuristics");
        return;
    }
    int64_t made = 0, got = 0;
    for (; made < count; made++)
        if (f->BackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) != CUDNN_STATUS_SUCCESS)
            break;
    s = f->BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got, cfg);
    cudnnStatus_t last = s;
    for (int64_t i = 0; s == CUDNN_STATUS_SUCCESS && i < got && !g->plan; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (f->BackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
            break;
        f->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->lib->handle);
        f->BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &cfg[i]);
        last = f->BackendFinalize(plan);
        if (last == CUDNN_STATUS_SUCCESS)
            g->plan = plan;
        else
            f->BackendDestroyDescriptor(plan);
    }
    for (int64_t i = 0; i < made; i++)
        f->BackendDestroyDescriptor(cfg[i]);
    free(cfg);
    if (!g->plan) {
        fail(b, last != CUDNN_STATUS_SUCCESS ? last : CUDNN_STATUS_NOT_SUPPORTED, "execution plan: no engine made one");
        return;
    }
    int64_t n = 0;
    s = f->BackendGetAttribute(g->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                               &g->workspace_bytes);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(b, s, "execution plan: workspace size");
}

/* The graph of the ops made, and its plan. */
static void finish(builder *b)
{
    cudnnBackendDescriptor_t graph = create(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &b->g->lib->handle, "graph");
    set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->nops, b->ops, "graph");
    finalize(b, graph, "graph");
    if (!b->failed)
        make_plan(b, graph);
}

static void build_forward(builder *b)
{
    const sdpa_plan *g = b->g;
    const int64_t B = g->B, T = g->T, NH = g->NH, KVH = g->KVH;
    const int64_t W = (NH + 2 * KVH) * g->HS, C = NH * g->HS;
    const cudnnDataType_t e = b->e, f = CUDNN_DATA_FLOAT;
    const int64_t sd[4] = {B, NH, T, T}, rd[4] = {B, NH, T, 1};

    cudnnBackendDescriptor_t q = heads(b, U_Q, e, NH, W, false, "Q"), kt = heads(b, U_K, e, KVH, W, true, "Kᵀ");
    cudnnBackendDescriptor_t v = heads(b, U_V, e, KVH, W, false, "V"), o = heads(b, U_O, e, NH, C, false, "O");
    cudnnBackendDescriptor_t stats = tensor(b, U_STATS, f, rd, NULL, "stats");
    cudnnBackendDescriptor_t scale = scalar(b, U_SCALE, "scale"), neg_inf = scalar(b, U_NEG_INF, "-inf");
    cudnnBackendDescriptor_t s = matmul(b, q, kt, virt(b, f, sd, "S"), "S = Q·Kᵀ");
    s = pointwise(b, CUDNN_POINTWISE_MUL, s, scale, NULL, virt(b, f, sd, "S scaled"), -1, "S · scale");
    s = causal_mask(b, s, neg_inf, sd);
    cudnnBackendDescriptor_t mx = reduction(b, CUDNN_REDUCE_TENSOR_MAX, s, virt(b, f, rd, "row max"), "row max");
    s = pointwise(b, CUDNN_POINTWISE_SUB, s, mx, NULL, virt(b, f, sd, "S - max"), -1, "S - max");
    cudnnBackendDescriptor_t ex = pointwise(b, CUDNN_POINTWISE_EXP, s, NULL, NULL, virt(b, f, sd, "exp"), -1, "exp");
    cudnnBackendDescriptor_t sum = reduction(b, CUDNN_REDUCE_TENSOR_ADD, ex, virt(b, f, rd, "row sum"), "row sum");
    cudnnBackendDescriptor_t lsum =
        pointwise(b, CUDNN_POINTWISE_LOG, sum, NULL, NULL, virt(b, f, rd, "log sum"), -1, "log sum");
    pointwise(b, CUDNN_POINTWISE_ADD, mx, lsum, NULL, stats, -1, "stats = max + log sum");
    cudnnBackendDescriptor_t prob =
        pointwise(b, CUDNN_POINTWISE_DIV, ex, sum, NULL, virt(b, e, sd, "softmax"), -1, "exp / sum");
    matmul(b, prob, v, o, "O = P·V");
}

static void build_backward(builder *b)
{
    const sdpa_plan *g = b->g;
    const int64_t B = g->B, T = g->T, NH = g->NH, KVH = g->KVH;
    const int64_t W = (NH + 2 * KVH) * g->HS, C = NH * g->HS;
    const cudnnDataType_t e = b->e, f = CUDNN_DATA_FLOAT;
    const int64_t sd[4] = {B, NH, T, T}, rd[4] = {B, NH, T, 1}, qd[4] = {B, NH, T, g->HS};
    /* strides of a (B,NH,T,T) transposed in place: key index, then query index */
    const int64_t ts[4] = {NH * T * T, T * T, 1, T};

    cudnnBackendDescriptor_t q = heads(b, U_Q, e, NH, W, false, "Q"), kt = heads(b, U_K, e, KVH, W, true, "Kᵀ");
    cudnnBackendDescriptor_t vt = heads(b, U_V, e, KVH, W, true, "Vᵀ"), o = heads(b, U_O, e, NH, C, false, "O");
    cudnnBackendDescriptor_t dout = heads(b, U_DO, e, NH, C, false, "dO");
    cudnnBackendDescriptor_t dq = heads(b, U_DQ, e, NH, W, false, "dQ"), dk = heads(b, U_DK, e, KVH, W, false, "dK");
    cudnnBackendDescriptor_t dv = heads(b, U_DV, e, KVH, W, false, "dV");
    cudnnBackendDescriptor_t stats = tensor(b, U_STATS, f, rd, NULL, "stats");
    cudnnBackendDescriptor_t dot = tensor(b, U_DOT, f, rd, NULL, "row sum of dO∘O");
    cudnnBackendDescriptor_t dq_acc = tensor(b, U_DQ_ACC, f, qd, NULL, "dQ accumulator");
    cudnnBackendDescriptor_t scale = scalar(b, U_SCALE, "scale"), neg_inf = scalar(b, U_NEG_INF, "-inf");
    cudnnBackendDescriptor_t one = scalar(b, U_ONE, "one");

    /* Σ_row dO∘O: what softmax's backward subtracts (P's rows sum to 1) */
    cudnnBackendDescriptor_t x =
        pointwise(b, CUDNN_POINTWISE_MUL, dout, o, NULL, heads(b, 0, f, NH, C, false, "dO∘O"), -1, "dO∘O");
    x = reduction(b, CUDNN_REDUCE_TENSOR_ADD, x, virt(b, f, rd, "row sum"), "row sum of dO∘O");
    pointwise(b, CUDNN_POINTWISE_MUL, x, one, NULL, dot, -1, "row sum · 1");
    /* P = exp(S·scale - stats), masked: the forward's softmax, from stats */
    cudnnBackendDescriptor_t s = matmul(b, q, kt, virt(b, f, sd, "S"), "S = Q·Kᵀ");
    s = pointwise(b, CUDNN_POINTWISE_MUL, s, scale, NULL, virt(b, f, sd, "S scaled"), -1, "S · scale");
    s = pointwise(b, CUDNN_POINTWISE_SUB, s, stats, NULL, virt(b, f, sd, "S - stats"), -1, "S - stats");
    s = causal_mask(b, s, neg_inf, sd);
    cudnnBackendDescriptor_t pr = pointwise(b, CUDNN_POINTWISE_EXP, s, NULL, NULL, virt(b, f, sd, "P"), -1, "P");
    /* dV = Pᵀ·dO */
    cudnnBackendDescriptor_t pt = reshape(b, pr, tensor(b, 0, e, sd, ts, "Pᵀ"), "Pᵀ");
    grouped_matmul(b, pt, dout, dv, "dV = Pᵀ·dO");
    /* dS = P ∘ (dO·Vᵀ - Σ_row dO∘O) · scale */
    cudnnBackendDescriptor_t ds = matmul(b, dout, vt, virt(b, f, sd, "dP"), "dP = dO·Vᵀ");
    ds = pointwise(b, CUDNN_POINTWISE_SUB, ds, dot, NULL, virt(b, f, sd, "dP - sum"), -1, "dP - row sum");
    ds = pointwise(b, CUDNN_POINTWISE_MUL, ds, pr, NULL, virt(b, f, sd, "P∘(dP - sum)"), -1, "P∘(dP - row sum)");
    ds = pointwise(b, CUDNN_POINTWISE_MUL, ds, scale, NULL, virt(b, f, sd, "dS"), -1, "dS · scale");
    /* dK = dSᵀ·Q */
    cudnnBackendDescriptor_t dst = reshape(b, ds, tensor(b, 0, e, sd, ts, "dSᵀ"), "dSᵀ");
    grouped_matmul(b, dst, q, dk, "dK = dSᵀ·Q");
    /* dQ = dS·K, through the fp32 accumulator */
    cudnnBackendDescriptor_t k = reshape(b, kt, heads(b, 0, e, KVH, W, false, "K"), "K from Kᵀ");
    matmul(b, ds, k, dq_acc, "dQ = dS·K");
    pointwise(b, CUDNN_POINTWISE_IDENTITY, dq_acc, NULL, NULL, dq, -1, "dQ to 16 bits");
}

/* libcudnn and its functions, without a handle (which needs a device). */
static sdpa_lib *load(char *why, size_t why_len)
{
    /* Never closed: cuDNN loads its engine libraries itself and is not
     * meant to be unloaded under them; a second open only counts up. */
    void *dl = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        snprintf(why, why_len, "cuDNN 9 cannot be loaded: %s", dlerror());
        return NULL;
    }
    sdpa_lib *lib = calloc(1, sizeof *lib);
    if (!lib) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
#define SDPA_SYM(name)                                                                                                \
    if (!(*(void **)&lib->f.name = dlsym(dl, "cudnn" #name))) {                                                       \
        snprintf(why, why_len, "libcudnn.so.9 has no cudnn" #name);                                                   \
        free(lib);                                                                                                    \
        return NULL;                                                                                                  \
    }
    SDPA_FUNCS(SDPA_SYM)
#undef SDPA_SYM
    lib->version = lib->f.GetVersion();
    return lib;
}

sdpa_lib *sdpa_open(void *stream, char *why, size_t why_len)
{
    sdpa_lib *lib = load(why, why_len);
    if (!lib)
        return NULL;
    cudnnStatus_t s = lib->f.Create(&lib->handle);
    if (s == CUDNN_STATUS_SUCCESS) {
        lib->stream = (cudaStream_t)stream;
        s = lib->f.SetStream(lib->handle, lib->stream);
        if (s != CUDNN_STATUS_SUCCESS) {
            describe(&lib->f, s, "cudnnSetStream", why, why_len);
            lib->f.Destroy(lib->handle);
            free(lib);
            return NULL;
        }
        return lib;
    }
    describe(&lib->f, s, "cudnnCreate", why, why_len);
    free(lib);
    return NULL;
}

void sdpa_close(sdpa_lib *lib)
{
    if (!lib)
        return;
    lib->f.Destroy(lib->handle);
    free(lib);
}

size_t sdpa_version(const sdpa_lib *lib)
{
    return lib ? lib->version : 0;
}

/* What the causal mask writes over the masked scores: -inf, but the
 * lowest float before cuDNN 9.10, whose softmax engines want that. */
static float neg_inf(size_t version)
{
    return version < 91000 ? -FLT_MAX : -INFINITY;
}

/* A plan with its shape and scalars, its graph's ops built into b (which
 * says whether cuDNN refused one); NULL when out of memory. */
static sdpa_plan *build(sdpa_lib *lib, bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, builder *b,
                        char *why, size_t why_len)
{
    sdpa_plan *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    *p = (sdpa_plan){.lib = lib, .backward = backward, .B = B, .T = T, .NH = NH, .KVH = KVH, .HS = HS,
                     .scale = 1.0f / sqrtf((float)HS), .neg_inf = neg_inf(lib->version), .one = 1.0f,
                     .zero_dq_acc = lib->version < 90600};
    *b = (builder){.g = p, .f = &lib->f, .why = why, .len = why_len, .next_uid = U_VIRTUAL,
                   .e = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF};
    if (backward)
        build_backward(b);
    else
        build_forward(b);
    return p;
}

sdpa_plan *sdpa_plan_make(sdpa_lib *lib, bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, char *why,
                          size_t why_len)
{
    builder b;
    sdpa_plan *p = build(lib, backward, bf16, B, T, NH, KVH, HS, &b, why, why_len);
    if (!p)
        return NULL;
    finish(&b);
    if (b.failed) {
        sdpa_plan_free(p);
        return NULL;
    }
    return p;
}

int sdpa_check_ops(bool backward, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len)
{
    sdpa_lib *lib = load(why, why_len);
    if (!lib)
        return -1;
    builder b;
    sdpa_plan *p = build(lib, backward, bf16, B, T, NH, KVH, HS, &b, why, why_len);
    if (!p) {
        free(lib);
        return -1;
    }
    /* The graph of them too, which cuDNN finalizes without a handle. */
    cudnnBackendDescriptor_t graph = create(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b.nops, b.ops, "graph");
    finalize(&b, graph, "graph (without a handle)");
    int n = b.failed ? -1 : b.nops;
    sdpa_plan_free(p);
    free(lib);
    return n;
}

void sdpa_plan_free(sdpa_plan *p)
{
    if (!p)
        return;
    if (p->plan)
        p->lib->f.BackendDestroyDescriptor(p->plan);
    while (p->ndesc > 0)
        p->lib->f.BackendDestroyDescriptor(p->desc[--p->ndesc]);
    free(p);
}

static size_t round256(size_t n)
{
    return (n + 255) / 256 * 256;
}

/* A backward's scratch: cuDNN's workspace, the row sums, dQ's accumulator. */
static size_t dot_offset(const sdpa_plan *p)
{
    return round256((size_t)p->workspace_bytes);
}

static size_t dq_acc_offset(const sdpa_plan *p)
{
    return dot_offset(p) + round256((size_t)p->B * p->NH * p->T * sizeof(float));
}

size_t sdpa_plan_scratch(const sdpa_plan *p)
{
    if (!p->backward)
        return round256((size_t)p->workspace_bytes);
    return dq_acc_offset(p) + round256((size_t)p->B * p->NH * p->T * p->HS * sizeof(float));
}

/* The Q, K and V views' first elements in a qkv-shaped base. */
static void qkv_views(const sdpa_plan *p, const uint16_t *base, void *views[3])
{
    views[0] = (void *)base;
    views[1] = (void *)(base + (size_t)p->NH * p->HS);
    views[2] = (void *)(base + (size_t)(p->NH + p->KVH) * p->HS);
}

/* Queue the plan with the n real tensors uids at ptrs. */
static int execute(sdpa_plan *p, int n, const int64_t *uids, void *const *ptrs, void *workspace, char *why,
                   size_t why_len)
{
    const sdpa_api *f = &p->lib->f;
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t s = f->BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (s == CUDNN_STATUS_SUCCESS)
        s = f->BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = f->BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = f->BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (s == CUDNN_STATUS_SUCCESS)
        s = f->BackendFinalize(pack);
    if (s == CUDNN_STATUS_SUCCESS)
        s = f->BackendExecute(p->lib->handle, p->plan, pack);
    if (pack)
        f->BackendDestroyDescriptor(pack);
    if (s != CUDNN_STATUS_SUCCESS) {
        describe(f, s, "execute", why, why_len);
        return -1;
    }
    return 0;
}

int sdpa_forward(sdpa_plan *p, const uint16_t *qkv16, uint16_t *out16, float *stats, void *scratch, char *why,
                 size_t why_len)
{
    const int64_t uids[7] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF};
    void *ptrs[7] = {NULL, NULL, NULL, out16, stats, &p->scale, &p->neg_inf};
    qkv_views(p, qkv16, ptrs);
    return execute(p, 7, uids, ptrs, scratch, why, why_len);
}

int sdpa_backward(sdpa_plan *p, const uint16_t *qkv16, const uint16_t *out16, const uint16_t *dout16,
                  const float *stats, uint16_t *dqkv16, void *scratch, char *why, size_t why_len)
{
    char *base = scratch;
    float *dot = (float *)(base + dot_offset(p)), *dq_acc = (float *)(base + dq_acc_offset(p));
    if (p->zero_dq_acc) {
        cudaError_t err =
            cudaMemsetAsync(dq_acc, 0, (size_t)p->B * p->NH * p->T * p->HS * sizeof(float), p->lib->stream);
        if (err != cudaSuccess) {
            snprintf(why, why_len, "CUDA memset of the dQ accumulator: %s", cudaGetErrorString(err));
            return -1;
        }
    }
    const int64_t uids[14] = {U_Q, U_K, U_V, U_DQ, U_DK, U_DV, U_O, U_DO, U_STATS, U_DOT, U_DQ_ACC,
                              U_SCALE, U_NEG_INF, U_ONE};
    void *ptrs[14] = {NULL, NULL, NULL, NULL, NULL, NULL, (void *)out16, (void *)dout16, (void *)stats,
                      dot, dq_acc, &p->scale, &p->neg_inf, &p->one};
    qkv_views(p, qkv16, ptrs);
    qkv_views(p, dqkv16, ptrs + 3);
    return execute(p, 14, uids, ptrs, base, why, why_len);
}

#endif
