/* embedding.c: token plus position embedding, and its backward. */
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct { float *out; const int *tokens; const float *wte, *wpe; int B, T, C; } EmbeddingArgs;

static void embedding_forward_task(void *p) {
    EmbeddingArgs *a = p;
    int B = a->B, T = a->T, C = a->C;
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *tok = a->wte + (size_t)a->tokens[bt] * C;
        const float *pos = a->wpe + (size_t)(bt % T) * C;
        float *o = a->out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
    }
}

void cpu_embedding_forward(Stream *s, float *out, const int *tokens, const float *wte,
                       const float *wpe, int B, int T, int C) {
    EmbeddingArgs a = { out, tokens, wte, wpe, B, T, C };
    stream_launch(s, embedding_forward_task, &a, sizeof a);
}

typedef struct { float *dwte, *dwpe; const float *dout; const int *tokens; int B, T, C; } EmbeddingBackwardArgs;

/* In blocks of columns (COLUMN_BLOCK): repeated tokens need no atomics. */
static void embedding_backward_task(void *p) {
    EmbeddingBackwardArgs *a = p;
    int B = a->B, T = a->T, C = a->C;
    int nblocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    #pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COLUMN_BLOCK, width = C - c0 < COLUMN_BLOCK ? C - c0 : COLUMN_BLOCK;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = a->dout + (size_t)bt * C + c0;
            float *dtok = a->dwte + (size_t)a->tokens[bt] * C + c0;
            float *dpos = a->dwpe + (size_t)(bt % T) * C + c0;
            for (int c = 0; c < width; c++) {
                dtok[c] += d[c];
                dpos[c] += d[c];
            }
        }
    }
}

void cpu_embedding_backward(Stream *s, float *dwte, float *dwpe, const float *dout,
                            const int *tokens, int B, int T, int C, int V) {
    (void)V;  /* rows are found by token */
    EmbeddingBackwardArgs a = { dwte, dwpe, dout, tokens, B, T, C };
    stream_launch(s, embedding_backward_task, &a, sizeof a);
}
