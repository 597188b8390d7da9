/* cudnn_sdpa.c — the causal attention forward of cudnn_sdpa.h as a cuDNN
 * operation graph: backend descriptors, one engine from the heuristics,
 * one execution plan. */
#include "cudnn_sdpa.h"

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SDPA_MAX_DESC 64

/* The variant pack's ids of the graph's real tensors; virtual ones count
 * up from U_VIRTUAL. */
enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF, U_VIRTUAL = 100 };

struct sdpa_fwd {
    cudnnHandle_t handle;
    cudnnBackendDescriptor_t desc[SDPA_MAX_DESC]; /* every descriptor made, freed in reverse */
    int ndesc;
    cudnnBackendDescriptor_t plan;
    void *workspace;
    int64_t workspace_bytes;
    int NH, KVH, HS;
    float scale, neg_inf; /* the by-value scalars' values */
};

/* Building the graph: the first refusal is kept (and named), the calls
 * after it do nothing. */
typedef struct {
    sdpa_fwd *p;
    char *why;
    size_t len;
    bool failed;
    int64_t next_uid;
} builder;

static void fail(builder *b, cudnnStatus_t s, const char *what)
{
    if (b->failed)
        return;
    b->failed = true;
    char last[512] = "";
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(b->why, b->len, "cuDNN %s: %s%s%s", what, cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

static cudnnBackendDescriptor_t create(builder *b, cudnnBackendDescriptorType_t type, const char *what)
{
    cudnnBackendDescriptor_t d = NULL;
    if (b->failed)
        return NULL;
    if (b->p->ndesc == SDPA_MAX_DESC) {
        fail(b, CUDNN_STATUS_ALLOC_FAILED, "more descriptors than SDPA_MAX_DESC");
        return NULL;
    }
    cudnnStatus_t s = cudnnBackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        fail(b, s, what);
        return NULL;
    }
    b->p->desc[b->p->ndesc++] = d;
    return d;
}

static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *value, const char *what)
{
    if (b->failed)
        return;
    cudnnStatus_t s = cudnnBackendSetAttribute(d, name, type, n, value);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(b, s, what);
}

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what)
{
    if (b->failed)
        return;
    cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(b, s, what);
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
 * GEN_INDEX), computed in fp32 but for the mask's index and comparison
 * ops, in int32 and boolean, as cuDNN's attention pattern has them. */
static cudnnBackendDescriptor_t pointwise(builder *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t with, cudnnBackendDescriptor_t t,
                                          cudnnBackendDescriptor_t y, int64_t axis, const char *what)
{
    cudnnDataType_t prec = mode == CUDNN_POINTWISE_GEN_INDEX ? CUDNN_DATA_INT32
                           : mode == CUDNN_POINTWISE_CMP_GE  ? CUDNN_DATA_BOOLEAN
                                                             : CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = create(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
    if (axis >= 0)
        set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    finalize(b, pw, what);
    cudnnBackendDescriptor_t op = create(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    if (with)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &with, what);
    if (t)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, what);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    finalize(b, op, what);
    return op;
}

/* c = a·b over the last two dimensions, accumulated in fp32. */
static cudnnBackendDescriptor_t matmul(builder *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                                       cudnnBackendDescriptor_t c, const char *what)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t md = create(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
    set(b, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    finalize(b, md, what);
    cudnnBackendDescriptor_t op = create(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, what);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md, what);
    finalize(b, op, what);
    return op;
}

/* y = the reduction of x over the dimensions where y has 1. */
static cudnnBackendDescriptor_t reduction(builder *b, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y, const char *what)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = create(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
    set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
    set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, what);
    finalize(b, rd, what);
    cudnnBackendDescriptor_t op = create(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, what);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, what);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what);
    finalize(b, op, what);
    return op;
}

/* The first engine configuration the heuristics give that makes a plan. */
static void make_plan(builder *b, cudnnBackendDescriptor_t graph)
{
    sdpa_fwd *p = b->p;
    cudnnBackendDescriptor_t heur = create(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics");
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    finalize(b, heur, "heuristics: the graph");
    if (b->failed)
        return;
    int64_t count = 0;
    cudnnStatus_t s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                               &count, NULL);
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
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) != CUDNN_STATUS_SUCCESS)
            break;
    s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got, cfg);
    cudnnStatus_t last = s;
    for (int64_t i = 0; s == CUDNN_STATUS_SUCCESS && i < got && !p->plan; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
            break;
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &p->handle);
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &cfg[i]);
        last = cudnnBackendFinalize(plan);
        if (last == CUDNN_STATUS_SUCCESS)
            p->plan = plan;
        else
            cudnnBackendDestroyDescriptor(plan);
    }
    for (int64_t i = 0; i < made; i++)
        cudnnBackendDestroyDescriptor(cfg[i]);
    free(cfg);
    if (!p->plan) {
        fail(b, last != CUDNN_STATUS_SUCCESS ? last : CUDNN_STATUS_NOT_SUPPORTED, "execution plan: no engine made one");
        return;
    }
    int64_t n = 0;
    s = cudnnBackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                 &p->workspace_bytes);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(b, s, "execution plan: workspace size");
    else if (p->workspace_bytes > 0 && cudaMalloc(&p->workspace, (size_t)p->workspace_bytes) != cudaSuccess)
        fail(b, CUDNN_STATUS_ALLOC_FAILED, "execution plan: workspace");
}

sdpa_fwd *sdpa_fwd_plan(void *stream, bool bf16, int B, int T, int NH, int KVH, int HS, char *why, size_t why_len)
{
    sdpa_fwd *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    builder b = {p, why, why_len, false, U_VIRTUAL};
    cudnnStatus_t s = cudnnCreate(&p->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
        fail(&b, s, "cudnnCreate");
        free(p);
        return NULL;
    }
    s = cudnnSetStream(p->handle, (cudaStream_t)stream);
    if (s != CUDNN_STATUS_SUCCESS)
        fail(&b, s, "cudnnSetStream");
    p->NH = NH, p->KVH = KVH, p->HS = HS;
    p->scale = 1.0f / sqrtf((float)HS);
    p->neg_inf = -INFINITY;
    const int64_t W = (int64_t)(NH + 2 * KVH) * HS, C = (int64_t)NH * HS;
    const cudnnDataType_t e = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const int64_t qd[4] = {B, NH, T, HS}, qs[4] = {T * W, HS, W, 1};
    const int64_t kd[4] = {B, KVH, HS, T}, ks[4] = {T * W, HS, 1, W}; /* Kᵀ: a transposed view */
    const int64_t vd[4] = {B, KVH, T, HS}, vs[4] = {T * W, HS, W, 1};
    const int64_t od[4] = {B, NH, T, HS}, os[4] = {T * C, HS, C, 1};
    const int64_t sd[4] = {B, NH, T, T}, rd[4] = {B, NH, T, 1}, rs[4] = {(int64_t)NH * T, T, 1, 1};

    cudnnBackendDescriptor_t q = tensor(&b, U_Q, e, qd, qs, "Q"), k = tensor(&b, U_K, e, kd, ks, "K");
    cudnnBackendDescriptor_t v = tensor(&b, U_V, e, vd, vs, "V"), o = tensor(&b, U_O, e, od, os, "O");
    cudnnBackendDescriptor_t stats = tensor(&b, U_STATS, CUDNN_DATA_FLOAT, rd, rs, "stats");
    cudnnBackendDescriptor_t scale = scalar(&b, U_SCALE, "scale"), neg_inf = scalar(&b, U_NEG_INF, "-inf");
    cudnnBackendDescriptor_t ops[16];
    int n = 0;
    cudnnBackendDescriptor_t s0 = tensor(&b, 0, CUDNN_DATA_FLOAT, sd, NULL, "S");
    ops[n++] = matmul(&b, q, k, s0, "S = Q·Kᵀ");
    cudnnBackendDescriptor_t s1 = tensor(&b, 0, CUDNN_DATA_FLOAT, sd, NULL, "S scaled");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_MUL, s0, scale, NULL, s1, -1, "S · scale");
    cudnnBackendDescriptor_t row = tensor(&b, 0, CUDNN_DATA_INT32, sd, NULL, "row index");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_GEN_INDEX, s1, NULL, NULL, row, 2, "row index");
    cudnnBackendDescriptor_t col = tensor(&b, 0, CUDNN_DATA_INT32, sd, NULL, "column index");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_GEN_INDEX, s1, NULL, NULL, col, 3, "column index");
    cudnnBackendDescriptor_t keep = tensor(&b, 0, CUDNN_DATA_BOOLEAN, sd, NULL, "causal mask");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, -1, "row >= column");
    cudnnBackendDescriptor_t s2 = tensor(&b, 0, CUDNN_DATA_FLOAT, sd, NULL, "S masked");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_BINARY_SELECT, s1, neg_inf, keep, s2, -1, "mask");
    cudnnBackendDescriptor_t mx = tensor(&b, 0, CUDNN_DATA_FLOAT, rd, NULL, "row max");
    ops[n++] = reduction(&b, CUDNN_REDUCE_TENSOR_MAX, s2, mx, "row max");
    cudnnBackendDescriptor_t s3 = tensor(&b, 0, CUDNN_DATA_FLOAT, sd, NULL, "S - max");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_SUB, s2, mx, NULL, s3, -1, "S - max");
    cudnnBackendDescriptor_t ex = tensor(&b, 0, CUDNN_DATA_FLOAT, sd, NULL, "exp");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_EXP, s3, NULL, NULL, ex, -1, "exp");
    cudnnBackendDescriptor_t sum = tensor(&b, 0, CUDNN_DATA_FLOAT, rd, NULL, "row sum");
    ops[n++] = reduction(&b, CUDNN_REDUCE_TENSOR_ADD, ex, sum, "row sum");
    cudnnBackendDescriptor_t lsum = tensor(&b, 0, CUDNN_DATA_FLOAT, rd, NULL, "log sum");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_LOG, sum, NULL, NULL, lsum, -1, "log sum");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_ADD, lsum, mx, NULL, stats, -1, "stats = log sum + max");
    cudnnBackendDescriptor_t prob = tensor(&b, 0, e, sd, NULL, "softmax");
    ops[n++] = pointwise(&b, CUDNN_POINTWISE_DIV, ex, sum, NULL, prob, -1, "exp / sum");
    ops[n++] = matmul(&b, prob, v, o, "O = P·V");

    cudnnBackendDescriptor_t graph = create(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &p->handle, "graph");
    set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ops, "graph");
    finalize(&b, graph, "graph");
    if (!b.failed)
        make_plan(&b, graph);
    if (b.failed) {
        sdpa_fwd_free(p);
        return NULL;
    }
    return p;
}

int sdpa_fwd_run(sdpa_fwd *p, const uint16_t *qkv16, uint16_t *out16, float *stats, char *why, size_t why_len)
{
    int64_t uids[7] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF};
    void *ptrs[7] = {(void *)qkv16, (void *)(qkv16 + (size_t)p->NH * p->HS),
                     (void *)(qkv16 + (size_t)(p->NH + p->KVH) * p->HS), out16, stats, &p->scale, &p->neg_inf};
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                     &p->workspace);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendFinalize(pack);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendExecute(p->handle, p->plan, pack);
    if (pack)
        cudnnBackendDestroyDescriptor(pack);
    if (s != CUDNN_STATUS_SUCCESS) {
        char last[512] = "";
        cudnnGetLastErrorString(last, sizeof last);
        snprintf(why, why_len, "cuDNN execute: %s%s%s", cudnnGetErrorString(s), last[0] ? ": " : "", last);
        return -1;
    }
    return 0;
}

void sdpa_fwd_free(sdpa_fwd *p)
{
    if (!p)
        return;
    if (p->plan)
        cudnnBackendDestroyDescriptor(p->plan);
    while (p->ndesc > 0)
        cudnnBackendDestroyDescriptor(p->desc[--p->ndesc]);
    cudaFree(p->workspace);
    if (p->handle)
        cudnnDestroy(p->handle);
    free(p);
}
