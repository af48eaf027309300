# Declarations of the C engine (ext/cpu/inferd.h) for the Cython wrapper.
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "inferd.h" nogil:
    enum:
        QK
        QK_K
        MAX_SEGMENTS
        TILE_ROWS
        KV_BLOCK
        MAX_TOP_LOGPROBS
    enum:
        NUM_WEIGHT_TYPES   # the types themselves: weight_type_name (the type-traits table)
    enum:
        PATH_SCALAR, PATH_AVX2, PATH_AVX512VNNI, PATH_AVXVNNI
    ctypedef struct block_q8x:
        float d
        int32_t isum
        int16_t hsum[2]
        signed char qs[32]
    ctypedef struct weight_t:
        int type
        int rows, cols, padded_rows
        size_t nbytes
        uint8_t *data
        int owned
        int nseg
        int path
    size_t weight_layout_bytes(int type, int rows, int cols)
    size_t weight_layout_bytes_seg(int nseg, const int *types, const int *rows, int cols)
    int weight_init_seg(weight_t *w, int nseg, const int *types, const int *rows, int cols, uint8_t *dst)
    int weight_init(weight_t *w, int type, int rows, int cols, const void *src, size_t src_bytes, uint8_t *dst)
    void weight_free(weight_t *w)
    void weight_dequant_row(const weight_t *w, int row, float *out)
    int weight_is_quantized(int type)
    const char *weight_type_name(int type)
    size_t gguf_row_bytes(int type, int cols)
    int quantize_rows_gguf(const float *x, int rows, int cols, int type, uint8_t *out)
    float f16_to_f32(uint16_t h)
    uint16_t f32_to_f16(float f)

    int cpu_best_path()
    int cpu_path()
    int cpu_set_path(int path)
    const char *cpu_path_name(int path)

    ctypedef struct pool_t:
        pass
    int weight_fill(weight_t *w, const void *src, int src_rows, int dst_row0, int group, int group_stride,
                    pool_t *pool)
    ctypedef struct weight_fill_job_t:
        weight_t *w
        const void *src
        int src_rows, dst_row0, group, group_stride
        void *drop
        size_t drop_bytes
    size_t weight_fill_jobs(const weight_fill_job_t *jobs, size_t n, pool_t *pool, double seconds, int *failed)
    pool_t *pool_create(int nthreads)
    void pool_destroy(pool_t *p)
    double read_bandwidth(size_t nbytes, int threads, int repeats)
    void *huge_alloc(size_t n)
    void huge_free(void *p, size_t n)
    enum:
        HUGE_PAGES_COLLAPSING, HUGE_PAGES_ALL, HUGE_PAGES_PARTLY, HUGE_PAGES_NONE
    ctypedef struct huge_collapser_t:
        pass
    huge_collapser_t *huge_collapse_start(void *p, size_t n)
    int huge_collapse_state(huge_collapser_t *c)
    int huge_collapse_wait(huge_collapser_t *c)
    void huge_collapse_end(huge_collapser_t *c)

    void quantize_act(const float *x, int n, block_q8x *out)
    enum:
        PREFILL_TILES, PREFILL_AVX512, PREFILL_AMX
    ctypedef struct kernel_config_t:
        int prefill
        int decode_group
        int decode_zmm
        size_t decode_prefetch_bytes
    void kernel_config_default(kernel_config_t *kc)
    int matmul_prefill_kernels(const kernel_config_t *kc)
    int matmul_decode_kernels(const kernel_config_t *kc)
    void matmul_tiles(const kernel_config_t *kc, const weight_t *w, int tile_begin, int tile_end, int ntok,
                      const float *x, const block_q8x *xq, float *y, int ldy, int accumulate)
    int matmul_num_tiles(const weight_t *w)
    void weight_bind_kernels(weight_t *w, int path)
    void rmsnorm(const float *x, const float *gamma, int n, float eps, float *out)
    void swiglu(const float *g, const float *u, float *h, int n)
    void geglu(const float *g, const float *u, float *h, int n)
    enum:
        ATTN_MAX_TOKENS
        ATTN_SEGMENT_BLOCKS
    ctypedef struct attn_span_t:
        int pos0, seq_len, causal, window
        float scale
        const float *sinks
        int bf16
    size_t attention_scratch_floats(int n_heads, int head_dim)
    void kv_store_key(const float *k, uint16_t *block_slice, int slot, int head_dim)
    void kv_store_key_bf16(const float *k, uint16_t *slice, int slot, int head_dim)
    void kv_store_value_bf16(const float *v, uint16_t *slice, int slot, int head_dim)
    void kv_load_bf16(const uint16_t *slice, int head_dim, int slot, int is_k, float *out)
    int attention_bf16_native()
    int attention_num_segments(const attn_span_t *span, int ntok)
    size_t attention_part_floats(int rows, int head_dim)
    int attention_segment(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads,
                          int head_dim, const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                          const attn_span_t *span, int seg, float *part, float *scratch)
    void attention_merge(const float *parts, size_t part_stride, int nseg, int ntok, int group, int kv_heads,
                         int head_dim, float *out, int out_stride, const float *sinks)
    enum:
        KV_F16, KV_Q8_0, KV_BF16
    size_t kvq8_slice_bytes(int head_dim)
    void kvq8_store(const float *x, int head_dim, uint8_t *slice, int pos, int is_k)
    void kvq8_load(const uint8_t *slice, int head_dim, int pos, int is_k, float *out)
    size_t attention_q8_scratch_floats(int n_heads, int head_dim)
    void attention_tokens_q8(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads,
                             int head_dim, const uint8_t *k_head, const uint8_t *v_head, const int32_t *block_table,
                             const attn_span_t *span, float *out, int out_stride, float *scratch,
                             const uint8_t *next_k, const uint8_t *next_v)
    void attention_tokens(const float *q, int q_stride, int ntok, int group, int n_kv_heads, int kv_heads,
                          int head_dim, const uint16_t *k_head, const uint16_t *v_head, const int32_t *block_table,
                          const attn_span_t *span, float *out, int out_stride, float *scratch,
                          const uint16_t *next_k, const uint16_t *next_v)

    ctypedef struct sample_params_t:
        float temperature, top_p, min_p
        int top_k
        float repetition_penalty, presence_penalty, frequency_penalty
        uint64_t seed
        int num_logprobs
        int64_t history_offset
        int history_len, num_prompt
        int64_t bias_offset
        int bias_len
        int mask_row
    ctypedef struct sample_out_t:
        int32_t token
        float logprob
        int32_t top_ids[20]
        float top_logprobs[20]
    void sample_row(float *logits, int vocab, const sample_params_t *sp, int position, const int32_t *history,
                    const int32_t *bias_ids, const float *bias_values, const uint32_t *allowed, void *scratch,
                    sample_out_t *out)

    ctypedef struct model_config_t:
        int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden
        int context_length
        float norm_eps, rope_theta
        float rope_factor, rope_low_freq_factor, rope_high_freq_factor
        int rope_original_ctx
        float rope_freq_scale, rope_theta_local, embed_scale, logit_softcap
        int rope_dims
        float yarn_factor, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow
        int yarn_original_ctx
    enum:
        BLOCK_ATTENTION
        BLOCK_FFN_GATED
        BLOCK_FFN_MOE
        BLOCK_RECURRENT
        ACT_SILU
        ACT_GELU_TANH
        ACT_SWIGLU_OAI
        MOE_GATING_SOFTMAX
        MOE_GATING_TOPK_SOFTMAX
        MAX_LAYER_BLOCKS
        MOE_MAX_EXPERTS
        MOE_MAX_USED
    ctypedef struct attention_block_t:
        weight_t wqkv, wo
        float *qkv_bias
        float *o_bias
        float *sinks
        float *q_norm
        float *k_norm
        int qk_norm_full
        int rope_neox, window
        float scale
        weight_t wgate
        int gated
    ctypedef struct ffn_gated_block_t:
        weight_t wgu, wdown
        int act
    ctypedef struct ffn_moe_block_t:
        weight_t router
        weight_t *wgu
        weight_t *wdown
        int n_experts, n_used, hidden, norm_topk, gating
        float *router_bias
        float *gate_bias
        float *up_bias
        float *down_bias
        float weights_scale
        int act
        float *shared_gate
        weight_t shared_gu, shared_down
        int shared_hidden
    ctypedef struct gdn_block_t:
        weight_t win, wba, wout
        float *conv
        float *dt_bias
        float *a_log
        float *norm_out
        int n_k_heads, n_v_heads, head_k, head_v, conv_kernel, index, grouped_heads
    size_t gdn_state_floats(const gdn_block_t *G)
    ctypedef struct block_t:
        int kind
        float *norm
        float *post_norm
        attention_block_t attn
        ffn_gated_block_t ffn
        ffn_moe_block_t moe
        gdn_block_t gdn
    ctypedef struct layer_t:
        int n_blocks
        block_t blocks[4]
    ctypedef struct model_t:
        model_config_t cfg
        weight_t tok_embd, output
        int output_tied
        float *output_norm
        layer_t *layers
        float *rope_cos_sin
        float *rope_cos_sin_local
        int n_recurrent
        size_t state_floats
    int model_init_rope(model_t *m)
    void rope_frequencies_c "rope_frequencies"(const model_config_t *c, double theta, int llama3, double *freqs)

    enum:
        LORA_Q
        LORA_K
        LORA_V
        LORA_O
        LORA_GATE
        LORA_UP
        LORA_DOWN
        LORA_TARGETS
    ctypedef struct lora_matrix_t:
        const float *a
        const float *bt
        int rank, out
        float scale
    ctypedef struct lora_adapter_t:
        int n_layers
        int max_rank
        const lora_matrix_t *m

    ctypedef struct batch_t:
        int num_tokens, num_seqs
        const int32_t *token_ids
        const int32_t *positions
        const int32_t *seq_of_token
        const int32_t *block_tables
        int max_blocks_per_seq
        int num_out
        const int32_t *out_rows
        const int32_t *sample_mask
        const sample_params_t *params
        const int32_t *history
        const int32_t *bias_ids
        const float *bias_values
        int64_t num_history
        int64_t num_bias
        const uint32_t *token_masks
        int num_masks
        float *logits_out
        sample_out_t *samples
        float *hidden_out
        float *final_out
        const lora_adapter_t *loras
        int num_loras
        const int32_t *lora_of_seq
        const float *lora_scale_of_seq
        const int32_t *state_slots
    enum:
        NUM_STAGES
    ctypedef struct context_t:
        int profile_on
        double profile[NUM_STAGES]
        int num_kv_blocks
        uint16_t *k_cache
        uint16_t *v_cache
        int kv_dtype
        uint8_t *k_q8
        uint8_t *v_q8
        kernel_config_t kernels
        int num_state_slots
    context_t *context_create(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads)
    context_t *context_create_kv(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                                 int kv_dtype)
    context_t *context_create_state(const model_t *m, int max_tokens, int max_out, int num_kv_blocks, int threads,
                                    int kv_dtype, int num_state_slots)
    void context_free(context_t *c)
    int context_reserve_lora(context_t *c, int max_rank)
    int state_slot_read(const context_t *c, int slot, float *out, int32_t *next_pos)
    int state_slot_write(context_t *c, int slot, const float *in_, int32_t next_pos)
    ctypedef enum forward_status_t:
        FORWARD_OK
        FORWARD_BAD_SIZE
        FORWARD_BAD_TOKEN
        FORWARD_BAD_POSITION
        FORWARD_BAD_SEQUENCE
        FORWARD_BAD_BLOCK
        FORWARD_BAD_OUT_ROW
        FORWARD_BAD_SAMPLE_PARAMS
        FORWARD_BAD_MASK_ROW
        FORWARD_BAD_BLOCK_KIND
        FORWARD_BAD_LORA
        FORWARD_BAD_STATE
    int forward(context_t *c, const batch_t *b)
    enum:
        KV_IO_OK
        KV_IO_BAD_BLOCK
        KV_IO_BAD_LENGTH
    size_t kv_block_bytes(const context_t *c)
    int kv_block_read(const context_t *c, int block, uint8_t *out, size_t out_len)
    int kv_block_write(context_t *c, int block, const uint8_t *in_, size_t in_len)
    int kv_block_copy(context_t *c, int src, int dst)
