/* dtype.h: how numbers are held, one row of traits a dtype, as ggml's
 * type_traits: fp32, or bf16 (runtime/bf16.h rounds to it).
 *
 * Where a dtype is chosen: mixed precision's compute (--dtype), a bf16 copy
 * of the weights under torch.autocast(bfloat16) (model/gpt.h); the
 * gradients' reductions (--reduce-dtype, runtime/process_group.h); the
 * state the ZeRO paper counts in 16 bits (its fp16); and each op's rounding
 * (kernels/kernels.h). A third dtype (fp8's two) is a row here, its
 * conversions in bf16.h's number_at and number_put, and a case where a
 * kernel dispatches on the dtype.
 */
#ifndef ZF_DTYPE_H
#define ZF_DTYPE_H

#include <stddef.h>
#include <string.h>

typedef enum { DTYPE_FP32, DTYPE_BF16, DTYPES } DType;

typedef struct {
    const char *name;  /* --dtype's and --reduce-dtype's word */
    size_t bytes;      /* of one number */
} DTypeTraits;

/* One row a dtype, in DType's order. */
static const DTypeTraits DTYPE_TRAITS[DTYPES] = {
    { "fp32", 4 },
    { "bf16", 2 },
};

/* The bytes of one number held so. */
static inline size_t number_bytes(DType held) { return DTYPE_TRAITS[held].bytes; }

/* The dtype of that name, or -1. */
static inline int dtype_named(const char *name) {
    for (int d = 0; d < DTYPES; d++)
        if (strcmp(DTYPE_TRAITS[d].name, name) == 0) return d;
    return -1;
}

#endif
