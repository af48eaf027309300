/* The dense gated FFN block: x += post_norm(Wdown act(Wgate xn) * (Wup xn)), xn = rmsnorm(x), act SiLU (SwiGLU)
 * or tanh GELU (GeGLU). Gate and up are one fused matrix, computed with the activation and the down projection's
 * input quantization in one stage. */
#include <string.h>
#include "forward_stage.h"

/* One item = 32 hidden units: the 8 tiles of Wgu holding their gate rows then their up rows (weights.py orders
 * them so) give gate and up for every token; h = act(gate) * up is then quantized as the down projection's
 * input block right away, while it is in cache, instead of in a pass of its own over the whole (tokens, 2 hidden)
 * result. h is copied out in floats only for a float-weight down projection or the adapters, its readers in
 * c->h. The adapters' gate and up rows are added before the activation, from A xn computed before this stage. */
static void gate_up_act_fn(void *arg, int64_t begin, int64_t end, int thread) {
    stage_t *s = arg;
    context_t *c = s->c;
    const ffn_gated_block_t *F = &s->block->ffn;
    int hidden = c->model->cfg.hidden, nb = hidden / QK, half = QK / TILE_ROWS, T = s->ntok;
    int float_down = !weight_is_quantized(F->wdown.type) || s->lora;
    float *g = c->gu + (size_t)thread * c->max_tokens * 2 * QK, *u = g + (size_t)c->max_tokens * QK;  /* (T, 32) */
    for (int64_t j = begin; j < end; j++) {
        int tile = (int)j * 2 * half;
        matmul_tiles(&c->kernels, s->w, tile, tile + half, T, s->out, s->xq, g, QK, 0);
        matmul_tiles(&c->kernels, s->w, tile + half, tile + 2 * half, T, s->out, s->xq, u, QK, 0);
        if (s->lora_job) {
            lora_add_rows(s, s->lora_job, 0, (int)j * QK, (int)j * QK + QK, g, QK);
            lora_add_rows(s, s->lora_job, 1, (int)j * QK, (int)j * QK + QK, u, QK);
        }
        if (F->act == ACT_GELU_TANH) geglu(g, u, g, T * QK);                  /* h, in place of gate */
        else swiglu(g, u, g, T * QK);
        quantize_act_strided(g, T * QK, c->xq_h + j, nb);                     /* token t's block j */
        if (float_down)
            for (int t = 0; t < T; t++)
                memcpy(c->h + (size_t)t * hidden + j * QK, g + (size_t)t * QK, QK * sizeof(float));
    }
}

void ffn_gated_block(context_t *c, stage_t *s, const block_t *B) {
    const model_config_t *cfg = &c->model->cfg;
    const ffn_gated_block_t *F = &B->ffn;
    s->block = B;
    stage_prepare_input(c, s, c->x, cfg->dim, B->norm, &F->wgu);                            /* rmsnorm(x) */
    lora_job_t job;
    if (s->lora) {                                              /* A xn of the adapted tokens' gate and up */
        lora_job_init(&job, c->xn, cfg->dim, NULL, 0);
        lora_job_add(&job, LORA_GATE, 0, cfg->hidden);
        lora_job_add(&job, LORA_UP, 0, cfg->hidden);
        stage_lora_down(c, s, &job);
    }
    s->w = &F->wgu;                                                     /* h = act(Wgate xn) * (Wup xn) */
    stage_run(c, STAGE_GATE_UP_SWIGLU, cfg->hidden / QK, 1, gate_up_act_fn, s);
    s->lora_job = NULL;
    stage_set_input(s, c->h, cfg->hidden, c->xq_h);                     /* gate|up quantized h into xq_h */
    stage_matmul_residual(c, STAGE_DOWN, s, &F->wdown, NULL, B->post_norm, LORA_DOWN);              /* x += Wdown h */
}
