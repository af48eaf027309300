/* The model runner: weights, the paged KV cache, scratch sized once, and one step of a flat batch.
 *
 *   decode step (every sequence 1 token, <= 32 sequences): one CUDA graph per padded batch size, captured the
 *   first time that size is seen and replayed after; the step's inputs are copied into fixed device buffers
 *   first (one copy), and the graph ends by writing the sampled tokens and the next positions there too.
 *       embed -> for each layer:
 *           gemv(rmsnorm(x) @ Wqkv) -> rope + KV write -> split-KV attention -> merge
 *           x += gemv(attn @ Wo) -> h = gemv_swiglu(rmsnorm(x) @ Wgate|Wup) -> x += gemv(h @ Wdown)
 *       -> logits = gemv(rmsnorm(x) @ Wout) -> sample
 *   any other step (prefill chunks, mixed batches, speculative rows): the same layer order run eagerly, with
 *   the flash prefill attention kernel, and bf16 tensor-core GEMMs (weights dequantised to bf16 on the fly when
 *   stored quantized) once the batch has more than gemv_max_tokens tokens.
 *
 * Padded graph rows decode token 0 at position 0 into a KV block of their own (the extra block at index
 * num_kv_blocks), with greedy sampling; their outputs are dropped.
 *
 * Grammar masks: the sampler reads the step's packed allowed-token bitmasks from mask_d, a fixed device buffer of
 * max_logits_rows rows (so a captured graph's sampler always points at it); a step copies its masks there before
 * the graph replays, and each row's params say whether it has one (has_mask, zero in padded rows) and which. A
 * step without masks copies nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "common.cuh"

namespace {

const int GRAPH_SIZES[] = {1, 2, 4, 8, 16, 32};
constexpr int NUM_GRAPHS = 6;
constexpr size_t STAGING_BYTES = 64u << 20;
constexpr size_t CUBLAS_WS_BYTES = 32u << 20;

struct Layer {
    icu_mat qkv, o, gu, down;
    float *attn_norm, *ffn_norm, *qkv_bias;
    uint16_t *kc, *vc;   /* (num_kv_blocks + 1, n_kv, 64, hd) */
};

int graph_index(int n) {
    for (int i = 0; i < NUM_GRAPHS; ++i)
        if (n <= GRAPH_SIZES[i]) return i;
    return -1;
}

template <typename T> T *offset_ptr(void *base, size_t off) { return reinterpret_cast<T *>((char *)base + off); }

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

struct icu_model {
    icu_model_config c;
    int q_dim, kv_dim, qkv_dim, max_blocks, Tcap, Scap, Rcap;
    std::vector<Layer> layers;
    icu_mat emb, out;
    float *out_norm;
    double *inv_freq;
    cudaStream_t stream;
    void *cublas, *cublas_ws;
    Launch L;
    /* activations */
    float *x, *qkv, *attn, *h, *gu, *xs, *logits, *part_o, *part_ml;
    uint16_t *xb, *wscratch;
    size_t wscratch_elems;
    uint16_t *kv;
    size_t kv_bytes;
    /* per-step inputs: one device buffer and its pinned mirror */
    void *io_d, *io_h;
    size_t io_bytes, off_tokens, off_positions, off_token_seq, off_out_rows, off_qstart, off_pos0, off_adj_offset,
        off_params, off_bt;
    icu_adj *adj_d, *adj_h;
    uint32_t *mask_d, *mask_h;   /* (Rcap, mask_words) */
    int mask_words;
    int32_t *out_tok_d, *out_tok_h;
    float *out_lp_d, *out_lp_h;
    cudaGraphExec_t graphs[NUM_GRAPHS];
    void *staging;
    size_t weight_bytes;
    std::vector<void *> allocations;

    int32_t *d_i32(size_t off) { return offset_ptr<int32_t>(io_d, off); }
    int32_t *h_i32(size_t off) { return offset_ptr<int32_t>(io_h, off); }
};

namespace {

int dmalloc(icu_model *m, void **p, size_t n) {
    *p = nullptr;
    ICU_CHECK(cudaMalloc(p, n ? n : 16));
    m->allocations.push_back(*p);
    return 0;
}

icu_mat *model_mat(icu_model *m, int which, int layer) {
    if (which == ICU_W_EMB) return &m->emb;
    if (which == ICU_W_OUT) return &m->out;
    if (layer < 0 || layer >= m->c.n_layers) return nullptr;
    Layer &l = m->layers[layer];
    switch (which) {
        case ICU_W_QKV: return &l.qkv;
        case ICU_W_O: return &l.o;
        case ICU_W_GU: return &l.gu;
        case ICU_W_DOWN: return &l.down;
    }
    return nullptr;
}

float **model_vec(icu_model *m, int which, int layer, int *len) {
    if (which == ICU_W_OUT_NORM) { *len = m->c.dim; return &m->out_norm; }
    if (layer < 0 || layer >= m->c.n_layers) return nullptr;
    Layer &l = m->layers[layer];
    if (which == ICU_W_ATTN_NORM) { *len = m->c.dim; return &l.attn_norm; }
    if (which == ICU_W_FFN_NORM) { *len = m->c.dim; return &l.ffn_norm; }
    if (which == ICU_W_QKV_BIAS) { *len = m->qkv_dim; return &l.qkv_bias; }
    return nullptr;
}

/* the expected shape of each matrix */
bool mat_shape(const icu_model *m, int which, int *rows, int *cols) {
    const icu_model_config &c = m->c;
    switch (which) {
        case ICU_W_EMB: case ICU_W_OUT: *rows = c.vocab; *cols = c.dim; return true;
        case ICU_W_QKV: *rows = m->qkv_dim; *cols = c.dim; return true;
        case ICU_W_O: *rows = c.dim; *cols = m->q_dim; return true;
        case ICU_W_GU: *rows = 2 * c.hidden; *cols = c.dim; return true;
        case ICU_W_DOWN: *rows = c.dim; *cols = c.hidden; return true;
    }
    return false;
}

/* x (T, K) bf16 @ W^T -> C (T, N) float, through a bf16 copy of W when it is stored quantized */
int gemm(icu_model *m, const icu_mat &w, const uint16_t *xb, float *C, int T, float beta) {
    const void *wb = w.q;
    if (w.fmt != ICU_BF16) {
        ICU_TRY(icu_mat_dequant_bf16_launch(m->L, &w, m->wscratch));
        wb = m->wscratch;
    }
    return icu_gemm_bf16_launch(m->L, m->cublas, xb, wb, C, T, w.rows, w.cols, beta, m->c.gemm_kind);
}

float attn_scale(const icu_model *m) { return 1.0f / sqrtf((float)m->c.head_dim); }

/* the decode step for bs rows whose inputs are in io_d (graph body) */
int run_decode(icu_model *m, int bs) {
    const icu_model_config &c = m->c;
    const Launch &L = m->L;
    int32_t *tokens = m->d_i32(m->off_tokens), *positions = m->d_i32(m->off_positions);
    int32_t *token_seq = m->d_i32(m->off_token_seq), *bt = m->d_i32(m->off_bt), *bt_width = m->d_i32(0);
    ICU_TRY(icu_embed_launch(L, &m->emb, tokens, bs, m->x));
    for (int i = 0; i < c.n_layers; ++i) {
        Layer &l = m->layers[i];
        ICU_TRY(icu_gemv_launch(L, &l.qkv, m->x, c.dim, l.attn_norm, c.norm_eps, nullptr, 0, m->qkv, m->qkv_dim, bs, 0));
        ICU_TRY(icu_rope_kv_launch(L, m->qkv, m->qkv_dim, l.qkv_bias, positions, token_seq, bt, bt_width, m->inv_freq,
                                   c.n_heads, c.n_kv_heads, c.head_dim, c.rope_neox, c.kv_dtype, l.kc, l.vc, bs));
        ICU_TRY(icu_attn_decode_launch(L, m->qkv, m->qkv_dim, l.kc, l.vc, c.kv_dtype, bt, bt_width, positions, bs,
                                       c.n_heads, c.n_kv_heads, c.head_dim, attn_scale(m), c.split_blocks,
                                       c.max_splits, m->part_o, m->part_ml, m->attn, m->q_dim));
        ICU_TRY(icu_gemv_launch(L, &l.o, m->attn, m->q_dim, nullptr, 0.0f, m->x, c.dim, m->x, c.dim, bs, 0));
        ICU_TRY(icu_gemv_launch(L, &l.gu, m->x, c.dim, l.ffn_norm, c.norm_eps, nullptr, 0, m->h, c.hidden, bs, 1));
        ICU_TRY(icu_gemv_launch(L, &l.down, m->h, c.hidden, nullptr, 0.0f, m->x, c.dim, m->x, c.dim, bs, 0));
    }
    ICU_TRY(icu_gemv_launch(L, &m->out, m->x, c.dim, m->out_norm, c.norm_eps, nullptr, 0, m->logits, c.vocab, bs, 0));
    ICU_TRY(icu_sample_launch(L, m->logits, c.vocab, bs, offset_ptr<icu_sample_params>(m->io_d, m->off_params),
                              m->d_i32(m->off_adj_offset), m->adj_d, m->mask_d, m->out_tok_d, m->out_lp_d, tokens,
                              positions));
    return icu_launch_status();
}

/* any batch, eagerly */
int run_eager(icu_model *m, int T, int S, int R, int max_T) {
    const icu_model_config &c = m->c;
    const Launch &L = m->L;
    int32_t *tokens = m->d_i32(m->off_tokens), *positions = m->d_i32(m->off_positions);
    int32_t *token_seq = m->d_i32(m->off_token_seq), *bt = m->d_i32(m->off_bt), *bt_width = m->d_i32(0);
    const bool small = T <= c.gemv_max_tokens;
    ICU_TRY(icu_embed_launch(L, &m->emb, tokens, T, m->x));
    for (int i = 0; i < c.n_layers; ++i) {
        Layer &l = m->layers[i];
        if (small) {
            ICU_TRY(icu_gemv_launch(L, &l.qkv, m->x, c.dim, l.attn_norm, c.norm_eps, nullptr, 0, m->qkv, m->qkv_dim, T, 0));
        } else {
            ICU_TRY(icu_rmsnorm_bf16_launch(L, m->x, l.attn_norm, c.norm_eps, T, c.dim, m->xb));
            ICU_TRY(gemm(m, l.qkv, m->xb, m->qkv, T, 0.0f));
        }
        ICU_TRY(icu_rope_kv_launch(L, m->qkv, m->qkv_dim, l.qkv_bias, positions, token_seq, bt, bt_width, m->inv_freq,
                                   c.n_heads, c.n_kv_heads, c.head_dim, c.rope_neox, c.kv_dtype, l.kc, l.vc, T));
        ICU_TRY(icu_attn_prefill_launch(L, m->qkv, m->qkv_dim, l.kc, l.vc, c.kv_dtype, bt, bt_width,
                                        m->d_i32(m->off_qstart), m->d_i32(m->off_pos0), S, max_T, c.n_heads,
                                        c.n_kv_heads, c.head_dim, attn_scale(m), m->attn, m->q_dim));
        if (small) {
            ICU_TRY(icu_gemv_launch(L, &l.o, m->attn, m->q_dim, nullptr, 0.0f, m->x, c.dim, m->x, c.dim, T, 0));
            ICU_TRY(icu_gemv_launch(L, &l.gu, m->x, c.dim, l.ffn_norm, c.norm_eps, nullptr, 0, m->h, c.hidden, T, 1));
            ICU_TRY(icu_gemv_launch(L, &l.down, m->h, c.hidden, nullptr, 0.0f, m->x, c.dim, m->x, c.dim, T, 0));
        } else {
            ICU_TRY(icu_cast_bf16_launch(L, m->attn, T * m->q_dim, m->xb));
            ICU_TRY(gemm(m, l.o, m->xb, m->x, T, 1.0f));
            ICU_TRY(icu_rmsnorm_bf16_launch(L, m->x, l.ffn_norm, c.norm_eps, T, c.dim, m->xb));
            ICU_TRY(gemm(m, l.gu, m->xb, m->gu, T, 0.0f));
            ICU_TRY(icu_swiglu_bf16_launch(L, m->gu, T, c.hidden, m->xb));
            ICU_TRY(gemm(m, l.down, m->xb, m->x, T, 1.0f));
        }
    }
    if (R == 0) return icu_launch_status();
    ICU_TRY(icu_gather_rows_launch(L, m->x, c.dim, m->d_i32(m->off_out_rows), R, m->xs));
    ICU_TRY(icu_gemv_launch(L, &m->out, m->xs, c.dim, m->out_norm, c.norm_eps, nullptr, 0, m->logits, c.vocab, R, 0));
    ICU_TRY(icu_sample_launch(L, m->logits, c.vocab, R, offset_ptr<icu_sample_params>(m->io_d, m->off_params),
                              m->d_i32(m->off_adj_offset), m->adj_d, m->mask_d, m->out_tok_d, m->out_lp_d, nullptr,
                              nullptr));
    return icu_launch_status();
}

/* run the decode step for bs rows: replay its graph, or run it eagerly and capture the graph for next time */
int decode_step(icu_model *m, int bs, int *used_graph) {
    const int gi = graph_index(bs);
    *used_graph = 0;
    if (!m->c.use_graphs || gi < 0) return run_decode(m, bs);
    if (m->graphs[gi]) {
        ICU_CHECK(cudaGraphLaunch(m->graphs[gi], m->stream));
        *used_graph = 1;
        return 0;
    }
    ICU_TRY(run_decode(m, bs));   /* this step's result; also sets every kernel's attributes before capture */
    cudaGraph_t graph;
    ICU_CHECK(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal));
    int r = run_decode(m, bs);
    cudaError_t e = cudaStreamEndCapture(m->stream, &graph);
    if (r) { if (e == cudaSuccess) cudaGraphDestroy(graph); return r; }
    ICU_CHECK(e);
    e = cudaGraphInstantiate(&m->graphs[gi], graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) { m->graphs[gi] = nullptr; return (int)e; }
    return 0;
}

/* device bytes of the io buffer that a step with S block-table rows uses */
size_t io_used(const icu_model *m, int S, int width) { return m->off_bt + (size_t)S * width * sizeof(int32_t); }

}  // namespace

extern "C" int icu_model_create(const icu_model_config *cfg, const double *inv_freq, icu_model **out) {
    *out = nullptr;
    const icu_model_config &c0 = *cfg;
    if (c0.vocab <= 0 || c0.dim <= 0 || c0.n_layers <= 0 || c0.n_heads <= 0 || c0.n_kv_heads <= 0 ||
        c0.n_heads % c0.n_kv_heads || c0.hidden <= 0 || c0.context_length <= 0 || c0.num_kv_blocks <= 0)
        return ICU_ERR_ARG;
    if (c0.head_dim != 64 && c0.head_dim != 96 && c0.head_dim != 128) return ICU_ERR_UNSUPPORTED;
    if (c0.dim % 32 || c0.hidden % 32) return ICU_ERR_SHAPE;
    if (c0.kv_dtype != ICU_KV_F16 && c0.kv_dtype != ICU_KV_BF16) return ICU_ERR_UNSUPPORTED;
    icu_model *m = new icu_model();
    memset(m->graphs, 0, sizeof(m->graphs));
    m->c = c0;
    icu_model_config &c = m->c;
    if (c.split_blocks <= 0) c.split_blocks = 2;
    if (c.max_splits <= 0) c.max_splits = 32;
    if (c.gemv_max_tokens <= 0) c.gemv_max_tokens = 8;
    m->q_dim = c.n_heads * c.head_dim;
    m->kv_dim = c.n_kv_heads * c.head_dim;
    m->qkv_dim = m->q_dim + 2 * m->kv_dim;
    m->max_blocks = ceil_div(c.context_length, ICU_BLOCK);
    m->Tcap = std::max(c.max_batch_tokens, ICU_MAX_GRAPH_BATCH);
    m->Scap = std::max(c.max_seqs, ICU_MAX_GRAPH_BATCH);
    m->Rcap = std::max(c.max_logits_rows, ICU_MAX_GRAPH_BATCH);
    if (c.max_adj <= 0) c.max_adj = 1 << 16;
    m->mask_words = ceil_div(c.vocab, 32);
    m->layers.resize(c.n_layers);
    int r = 0;
    auto fail = [&](int err) { icu_model_destroy(m); return err; };

    if ((r = (int)cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking))) return fail(r);
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    m->L.stream = m->stream;
    m->L.pdl = c.use_pdl && major >= 9;

    const size_t T = m->Tcap, wide = (size_t)std::max(std::max(c.dim, m->q_dim), c.hidden);
    struct { void **p; size_t n; } bufs[] = {
        {(void **)&m->x, T * c.dim * 4}, {(void **)&m->qkv, T * m->qkv_dim * 4}, {(void **)&m->attn, T * m->q_dim * 4},
        {(void **)&m->h, T * c.hidden * 4}, {(void **)&m->gu, T * 2 * c.hidden * 4}, {(void **)&m->xb, T * wide * 2},
        {(void **)&m->xs, (size_t)m->Rcap * c.dim * 4}, {(void **)&m->logits, (size_t)m->Rcap * c.vocab * 4},
        {(void **)&m->part_o, (size_t)ICU_MAX_GRAPH_BATCH * c.n_heads * c.max_splits * c.head_dim * 4},
        {(void **)&m->part_ml, (size_t)ICU_MAX_GRAPH_BATCH * c.n_heads * c.max_splits * 2 * 4},
        {(void **)&m->inv_freq, (size_t)c.head_dim / 2 * sizeof(double)},
        {(void **)&m->adj_d, (size_t)c.max_adj * sizeof(icu_adj)},
        {(void **)&m->mask_d, (size_t)m->Rcap * m->mask_words * 4},
        {(void **)&m->out_tok_d, (size_t)m->Rcap * 4}, {(void **)&m->out_lp_d, (size_t)m->Rcap * 4},
    };
    for (auto &b : bufs)
        if ((r = dmalloc(m, b.p, b.n))) return fail(r);
    if ((r = (int)cudaMemcpy(m->inv_freq, inv_freq, (size_t)c.head_dim / 2 * sizeof(double), cudaMemcpyHostToDevice)))
        return fail(r);

    /* KV cache: every layer's K then V, num_kv_blocks + 1 blocks each (the last serves padded graph rows) */
    const size_t per = (size_t)(c.num_kv_blocks + 1) * c.n_kv_heads * ICU_BLOCK * c.head_dim;
    m->kv_bytes = per * 2 * 2 * c.n_layers;
    if ((r = dmalloc(m, (void **)&m->kv, m->kv_bytes))) return fail(r);
    if ((r = (int)cudaMemset(m->kv, 0, m->kv_bytes))) return fail(r);
    for (int i = 0; i < c.n_layers; ++i) {
        m->layers[i].kc = m->kv + per * (2 * (size_t)i);
        m->layers[i].vc = m->kv + per * (2 * (size_t)i + 1);
    }

    /* io: header (bt_width) | tokens | positions | token_seq | out_rows | qstart | pos0 | adj_offset | params | bt */
    size_t off = 16;
    m->off_tokens = off; off += 4 * (size_t)m->Tcap;
    m->off_positions = off; off += 4 * (size_t)m->Tcap;
    m->off_token_seq = off; off += 4 * (size_t)m->Tcap;
    m->off_out_rows = off; off += 4 * (size_t)m->Rcap;
    m->off_qstart = off; off += 4 * (size_t)(m->Scap + 1);
    m->off_pos0 = off; off += 4 * (size_t)m->Scap;
    m->off_adj_offset = off; off += 4 * (size_t)(m->Rcap + 1);
    off = align_up(off, 16);
    m->off_params = off; off += sizeof(icu_sample_params) * (size_t)m->Rcap;
    off = align_up(off, 16);
    m->off_bt = off; off += 4 * (size_t)m->Scap * m->max_blocks;
    m->io_bytes = off;
    if ((r = dmalloc(m, &m->io_d, m->io_bytes))) return fail(r);
    if ((r = (int)cudaMemset(m->io_d, 0, m->io_bytes))) return fail(r);
    if ((r = (int)cudaMallocHost(&m->io_h, m->io_bytes))) return fail(r);
    memset(m->io_h, 0, m->io_bytes);
    if ((r = (int)cudaMallocHost((void **)&m->adj_h, (size_t)c.max_adj * sizeof(icu_adj)))) return fail(r);
    if ((r = (int)cudaMallocHost((void **)&m->mask_h, (size_t)m->Rcap * m->mask_words * 4))) return fail(r);
    if ((r = (int)cudaMallocHost((void **)&m->out_tok_h, (size_t)m->Rcap * 4))) return fail(r);
    if ((r = (int)cudaMallocHost((void **)&m->out_lp_h, (size_t)m->Rcap * 4))) return fail(r);

    if (icu_have_cublas() && c.gemm_kind == 0) {
        if ((r = dmalloc(m, &m->cublas_ws, CUBLAS_WS_BYTES))) return fail(r);
        if ((r = icu_cublas_create(&m->cublas, m->stream, m->cublas_ws, CUBLAS_WS_BYTES))) return fail(r);
    }
    *out = m;
    return 0;
}

extern "C" void icu_model_destroy(icu_model *m) {
    if (!m) return;
    if (m->stream) cudaStreamSynchronize(m->stream);
    for (int i = 0; i < NUM_GRAPHS; ++i)
        if (m->graphs[i]) cudaGraphExecDestroy(m->graphs[i]);
    icu_cublas_destroy(m->cublas);
    for (void *p : m->allocations) cudaFree(p);
    if (m->staging) cudaFree(m->staging);
    if (m->io_h) cudaFreeHost(m->io_h);
    if (m->adj_h) cudaFreeHost(m->adj_h);
    if (m->mask_h) cudaFreeHost(m->mask_h);
    if (m->out_tok_h) cudaFreeHost(m->out_tok_h);
    if (m->out_lp_h) cudaFreeHost(m->out_lp_h);
    if (m->stream) cudaStreamDestroy(m->stream);
    delete m;
}

extern "C" int icu_model_alloc_weight(icu_model *m, int which, int layer, int fmt, int rows, int cols) {
    int len = 0;
    if (float **v = model_vec(m, which, layer, &len)) {
        if (*v) return ICU_ERR_STATE;
        ICU_TRY(dmalloc(m, (void **)v, (size_t)len * 4));
        m->weight_bytes += (size_t)len * 4;
        return 0;
    }
    icu_mat *w = model_mat(m, which, layer);
    int er, ec;
    if (!w || !mat_shape(m, which, &er, &ec)) return ICU_ERR_ARG;
    if (rows != er || cols != ec) return ICU_ERR_SHAPE;
    if (w->q) return ICU_ERR_STATE;
    if (fmt < ICU_BF16 || fmt > ICU_Q41) return ICU_ERR_UNSUPPORTED;
    if (fmt != ICU_BF16 && cols % 32) return ICU_ERR_SHAPE;
    w->fmt = fmt;
    w->rows = rows;
    w->cols = cols;
    const size_t qb = icu_mat_q_bytes(fmt, rows, cols), sb = icu_mat_s_bytes(fmt, rows, cols);
    ICU_TRY(dmalloc(m, &w->q, qb));
    if (sb) ICU_TRY(dmalloc(m, &w->s, sb));
    m->weight_bytes += qb + sb;
    if (which == ICU_W_EMB && m->c.tie_embeddings) m->out = *w;
    /* the GEMM path's bf16 copy of a quantized layer matrix */
    if (fmt != ICU_BF16 && which != ICU_W_EMB && which != ICU_W_OUT && (size_t)rows * cols > m->wscratch_elems) {
        if (m->wscratch) {
            cudaFree(m->wscratch);
            m->allocations.erase(std::find(m->allocations.begin(), m->allocations.end(), (void *)m->wscratch));
        }
        m->wscratch_elems = (size_t)rows * cols;
        ICU_TRY(dmalloc(m, (void **)&m->wscratch, m->wscratch_elems * 2));
    }
    return 0;
}

extern "C" int icu_model_load_weight(icu_model *m, int which, int layer, int row0, int nrows, int src_type,
                                     const void *host, size_t src_row_bytes) {
    int len = 0;
    if (float **v = model_vec(m, which, layer, &len)) {
        if (!*v) return ICU_ERR_STATE;
        if (src_type != ICU_SRC_F32 || row0 != 0 || nrows != 1 || src_row_bytes != (size_t)len * 4) return ICU_ERR_ARG;
        ICU_CHECK(cudaMemcpy(*v, host, (size_t)len * 4, cudaMemcpyHostToDevice));
        return 0;
    }
    icu_mat *w = model_mat(m, which, layer);
    if (!w || !w->q) return ICU_ERR_STATE;
    if (row0 < 0 || nrows < 0 || row0 + nrows > w->rows || src_row_bytes == 0) return ICU_ERR_SHAPE;
    if (!m->staging) ICU_CHECK(cudaMalloc(&m->staging, STAGING_BYTES));
    const int chunk = (int)std::max<size_t>(1, STAGING_BYTES / src_row_bytes);
    if ((size_t)chunk * src_row_bytes > STAGING_BYTES) return ICU_ERR_SHAPE;
    Launch L = {0, false};
    for (int r = 0; r < nrows; r += chunk) {
        const int n = std::min(chunk, nrows - r);
        ICU_CHECK(cudaMemcpy(m->staging, (const char *)host + (size_t)r * src_row_bytes, (size_t)n * src_row_bytes,
                             cudaMemcpyHostToDevice));
        ICU_TRY(icu_mat_convert_launch(L, w, row0 + r, n, src_type, m->staging, src_row_bytes, 0, 0.0f));
        ICU_CHECK(cudaGetLastError());
        ICU_CHECK(cudaDeviceSynchronize());
    }
    return 0;
}

extern "C" int icu_model_random_weight(icu_model *m, int which, int layer, uint64_t seed, float scale) {
    icu_mat *w = model_mat(m, which, layer);
    if (!w || !w->q) return ICU_ERR_STATE;
    Launch L = {0, false};
    ICU_TRY(icu_mat_convert_launch(L, w, 0, w->rows, ICU_SRC_RANDOM, nullptr, 0, seed, scale));
    ICU_CHECK(cudaGetLastError());
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int icu_model_finish_load(icu_model *m) {
    if (!m->emb.q || !m->out.q || !m->out_norm) return ICU_ERR_STATE;
    for (int i = 0; i < m->c.n_layers; ++i) {
        const Layer &l = m->layers[i];
        if (!l.qkv.q || !l.o.q || !l.gu.q || !l.down.q || !l.attn_norm || !l.ffn_norm) return ICU_ERR_STATE;
        if (m->c.qkv_bias && !l.qkv_bias) return ICU_ERR_STATE;
    }
    if (m->staging) { cudaFree(m->staging); m->staging = nullptr; }
    ICU_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" size_t icu_model_weight_bytes(const icu_model *m) { return m->weight_bytes; }
extern "C" size_t icu_model_kv_bytes(const icu_model *m) { return m->kv_bytes; }

extern "C" int icu_model_step(icu_model *m, icu_batch *b) {
    const icu_model_config &c = m->c;
    const int T = b->num_tokens, S = b->num_seqs, R = b->num_rows;
    b->used_graph = 0;
    if (T <= 0 || S <= 0 || R < 0 || b->bt_width <= 0 || b->num_adj < 0 || b->num_masks < 0) return ICU_ERR_ARG;
    if (T > m->Tcap || S > m->Scap || R > m->Rcap || b->bt_width > m->max_blocks || b->num_adj > c.max_adj ||
        b->num_masks > m->Rcap)
        return ICU_ERR_CAPACITY;
    if (b->num_masks && !b->masks) return ICU_ERR_ARG;
    for (int i = 0; i < R; ++i)   /* a masked row must name one of the step's masks */
        if (b->params[i].has_mask && (b->params[i].mask_row < 0 || b->params[i].mask_row >= b->num_masks))
            return ICU_ERR_ARG;
    bool decode = T == S && R == T && T <= ICU_MAX_GRAPH_BATCH;
    for (int i = 0; decode && i < T; ++i) decode = b->seq_of_token[i] == i && b->out_rows[i] == i;
    const int n = decode ? (c.use_graphs ? GRAPH_SIZES[graph_index(T)] : T) : T;   /* rows incl. padding */
    const int nS = decode ? n : S;
    const int width = b->bt_width;

    /* inputs -> the pinned mirror */
    int32_t *tokens = m->h_i32(m->off_tokens), *positions = m->h_i32(m->off_positions);
    int32_t *token_seq = m->h_i32(m->off_token_seq), *out_rows = m->h_i32(m->off_out_rows);
    int32_t *qstart = m->h_i32(m->off_qstart), *pos0 = m->h_i32(m->off_pos0), *adj_off = m->h_i32(m->off_adj_offset);
    int32_t *bt = m->h_i32(m->off_bt);
    icu_sample_params *params = offset_ptr<icu_sample_params>(m->io_h, m->off_params);
    m->h_i32(0)[0] = width;
    memcpy(tokens, b->tokens, (size_t)T * 4);
    memcpy(positions, b->positions, (size_t)T * 4);
    memcpy(token_seq, b->seq_of_token, (size_t)T * 4);
    memcpy(out_rows, b->out_rows, (size_t)R * 4);
    memcpy(params, b->params, (size_t)R * sizeof(icu_sample_params));
    memcpy(adj_off, b->adj_offset, (size_t)(R + 1) * 4);
    memcpy(bt, b->block_tables, (size_t)S * b->bt_width * 4);
    for (int i = T; i < n; ++i) {   /* padded graph rows */
        tokens[i] = 0;
        positions[i] = 0;
        token_seq[i] = i;
        out_rows[i] = i;
        memset(&params[i], 0, sizeof(icu_sample_params));
        adj_off[i + 1] = adj_off[T];
        for (int k = 0; k < width; ++k) bt[(size_t)i * width + k] = c.num_kv_blocks;
    }
    int max_T = 0;
    if (!decode) {
        /* chunks: each sequence's tokens are contiguous */
        for (int s = 0; s <= S; ++s) qstart[s] = -1;
        for (int t = 0; t < T; ++t) {
            const int s = b->seq_of_token[t];
            if (s < 0 || s >= S) return ICU_ERR_ARG;
            if (qstart[s] < 0) { qstart[s] = t; pos0[s] = b->positions[t]; }
        }
        qstart[S] = T;
        for (int s = S - 1; s >= 0; --s) {
            if (qstart[s] < 0) return ICU_ERR_ARG;   /* a sequence without tokens */
            if (qstart[s] > qstart[s + 1]) return ICU_ERR_ARG;
            max_T = std::max(max_T, qstart[s + 1] - qstart[s]);
        }
    }
    if (b->num_adj) memcpy(m->adj_h, b->adj, (size_t)b->num_adj * sizeof(icu_adj));
    const size_t mask_bytes = (size_t)b->num_masks * m->mask_words * 4;
    if (mask_bytes) memcpy(m->mask_h, b->masks, mask_bytes);

    ICU_CHECK(cudaMemcpyAsync(m->io_d, m->io_h, io_used(m, nS, width), cudaMemcpyHostToDevice, m->stream));
    if (b->num_adj)
        ICU_CHECK(cudaMemcpyAsync(m->adj_d, m->adj_h, (size_t)b->num_adj * sizeof(icu_adj), cudaMemcpyHostToDevice,
                                  m->stream));
    if (mask_bytes)   /* before the replay: the graph's sampler reads mask_d */
        ICU_CHECK(cudaMemcpyAsync(m->mask_d, m->mask_h, mask_bytes, cudaMemcpyHostToDevice, m->stream));
    int r = decode ? decode_step(m, n, &b->used_graph) : run_eager(m, T, S, R, max_T);
    if (r) { cudaStreamSynchronize(m->stream); return r; }
    if (R) {
        ICU_CHECK(cudaMemcpyAsync(m->out_tok_h, m->out_tok_d, (size_t)R * 4, cudaMemcpyDeviceToHost, m->stream));
        ICU_CHECK(cudaMemcpyAsync(m->out_lp_h, m->out_lp_d, (size_t)R * 4, cudaMemcpyDeviceToHost, m->stream));
        if (b->out_logits)
            ICU_CHECK(cudaMemcpyAsync(b->out_logits, m->logits, (size_t)R * c.vocab * 4, cudaMemcpyDeviceToHost,
                                      m->stream));
    }
    ICU_CHECK(cudaStreamSynchronize(m->stream));
    ICU_CHECK(cudaGetLastError());
    memcpy(b->out_tokens, m->out_tok_h, (size_t)R * 4);
    memcpy(b->out_logprobs, m->out_lp_h, (size_t)R * 4);
    return 0;
}

extern "C" int icu_model_time_decode(icu_model *m, int bs, int context, int iters, double *seconds) {
    const icu_model_config &c = m->c;
    /* each replay advances every position by one: the block tables cover context + iters + 2 positions */
    if (bs <= 0 || bs > ICU_MAX_GRAPH_BATCH || context <= 0 || context + iters + 2 > c.context_length || iters <= 0)
        return ICU_ERR_ARG;
    const int nb = ceil_div(context + iters + 2, ICU_BLOCK);
    std::vector<int32_t> tokens(bs), positions(bs), seq(bs), rows(bs), bt((size_t)bs * nb), adj_off(bs + 1, 0);
    std::vector<icu_sample_params> params(bs);
    for (int i = 0; i < bs; ++i) {
        tokens[i] = (i * 7919) % c.vocab;
        positions[i] = context - 1;
        seq[i] = rows[i] = i;
        memset(&params[i], 0, sizeof(icu_sample_params));
        for (int k = 0; k < nb; ++k) bt[(size_t)i * nb + k] = (int32_t)(((size_t)i * nb + k) % c.num_kv_blocks);
    }
    std::vector<int32_t> out_tok(bs);
    std::vector<float> out_lp(bs);
    icu_batch b = {};
    b.num_tokens = b.num_seqs = b.num_rows = bs;
    b.bt_width = nb;
    b.tokens = tokens.data(); b.positions = positions.data(); b.seq_of_token = seq.data();
    b.block_tables = bt.data(); b.out_rows = rows.data(); b.params = params.data(); b.adj_offset = adj_off.data();
    b.out_tokens = out_tok.data(); b.out_logprobs = out_lp.data();
    ICU_TRY(icu_model_step(m, &b));   /* uploads the inputs, captures the graph */
    ICU_TRY(icu_model_step(m, &b));
    const int n = c.use_graphs ? GRAPH_SIZES[graph_index(bs)] : bs;
    int used = 0;
    cudaEvent_t t0, t1;
    ICU_CHECK(cudaEventCreate(&t0));
    ICU_CHECK(cudaEventCreate(&t1));
    ICU_CHECK(cudaEventRecord(t0, m->stream));
    for (int i = 0; i < iters; ++i) ICU_TRY(decode_step(m, n, &used));   /* positions advance by one per replay */
    ICU_CHECK(cudaEventRecord(t1, m->stream));
    ICU_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, t0, t1);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    ICU_CHECK(cudaGetLastError());
    *seconds = ms * 1e-3 / iters;
    return 0;
}

extern "C" int icu_bench_gemv(const icu_mat *mats, int n_mats, int B, int swiglu, int iters, double *seconds) {
    if (n_mats <= 0 || B <= 0 || iters <= 0) return ICU_ERR_ARG;
    const int K = mats[0].cols, N = swiglu ? mats[0].rows / 2 : mats[0].rows;
    float *x = nullptr, *out = nullptr;
    ICU_CHECK(cudaMalloc(&x, (size_t)B * K * 4));
    cudaError_t e = cudaMalloc(&out, (size_t)B * N * 4);
    if (e != cudaSuccess) { cudaFree(x); return (int)e; }
    cudaMemset(x, 0x3f, (size_t)B * K * 4);   /* 0.747 everywhere: not zeros */
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    Launch L = {s, false};
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    int r = 0;
    for (int i = 0; i < n_mats && !r; ++i) r = icu_gemv_launch(L, &mats[i], x, K, nullptr, 0.0f, nullptr, 0, out, N, B, swiglu);
    cudaEventRecord(t0, s);
    for (int i = 0; i < iters && !r; ++i)
        r = icu_gemv_launch(L, &mats[i % n_mats], x, K, nullptr, 0.0f, nullptr, 0, out, N, B, swiglu);
    cudaEventRecord(t1, s);
    cudaEventSynchronize(t1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, t0, t1);
    if (!r) r = (int)cudaGetLastError();
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaStreamDestroy(s);
    cudaFree(x);
    cudaFree(out);
    *seconds = ms * 1e-3 / iters;
    return r;
}
