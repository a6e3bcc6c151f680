/* What the two C ABIs of coloader share (client/c_api.h, the consumer; producer/c_api.h, the
 * producer fed by the caller): the export macro, the error codes and the tensor vocabulary.
 * The dtype and layout codes are the wire protocol's (DType, TensorLayout in
 * common/protocol.h; c_abi.cc checks that they agree), and the libraries export their names
 * (coloader_dtype_name, coloader_layout_name) so that bindings read them instead of repeating
 * them. */
#ifndef COLOADER_C_ABI_H_
#define COLOADER_C_ABI_H_

#include <stddef.h>
#include <stdint.h>

/* The libraries are built with hidden visibility; only what is marked is exported. */
#if defined(__GNUC__) || defined(__clang__)
#define COLOADER_C_EXPORT __attribute__((visibility("default")))
#else
#define COLOADER_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum coloader_error {
  COLOADER_OK = 0,
  COLOADER_END = 1, /* not an error: end of epoch (next_batch) or of the stream (next_epoch); a producer
                     * whose consumers all left (coloader_producer_wait, _publish, _close) */
  COLOADER_AGAIN = 2, /* not an error: a call given a wait_ms returned before anything came; call again */
  COLOADER_E_INVALID = -1,
  COLOADER_E_NOT_FOUND = -2,
  COLOADER_E_IO = -3,
  COLOADER_E_PROTOCOL = -4,
  COLOADER_E_TIMEOUT = -5,
  /* The producer stopped (asked to, killed or crashed) or cannot be reached: its stream ended
   * before its epochs were served. The message names it, how it ended and where the stream stopped. */
  COLOADER_E_DISCONNECTED = -6,
  COLOADER_E_INTERNAL = -7,
  /* A member of the consumer's group left (died, was detached or closed): the group is over. */
  COLOADER_E_GROUP_BROKEN = -8,
  /* The producer detached this consumer: it held the others back (stopped reading, kept its
   * batches), broke the protocol or came after the last epoch; the message says which and the fix. */
  COLOADER_E_DETACHED = -9,
};

enum coloader_dtype {
  COLOADER_UINT8 = 0,
  COLOADER_FLOAT32 = 1,
  COLOADER_BFLOAT16 = 2,
  COLOADER_FLOAT16 = 3,
  /* The image pipeline produces the four above; a caller-fed producer's fields any of these. */
  COLOADER_BOOL = 4,
  COLOADER_INT8 = 5,
  COLOADER_INT16 = 6,
  COLOADER_INT32 = 7,
  COLOADER_INT64 = 8,
  COLOADER_FLOAT64 = 9,
  COLOADER_COMPLEX64 = 10,
};

/* One tensor of a caller-fed producer's batches (its schema): where it sits in the batch's
 * structure, its dtype, and the most one sample holds, its room in a slot (ndim 0: a scalar per
 * sample). Where shapes vary (coloader.Producer), a sample may hold less: its shape is in the
 * last field, "#shapes" (int32, one row per sample, a column per dimension of each shaped field,
 * flagged COLOADER_FIELD_ON_HOST), as the structure text says (python/coloader/_structure.py).
 * The flags member was added with protocol 10: a caller built against an older header passes
 * arrays of a shorter stride (coloader_struct_size("field") says the library's). */
#define COLOADER_MAX_FIELD_DIMS 8
typedef struct coloader_field {
  const char* path;  /* as the user writes it: ["input_ids"], [1]["mask"]; "" for a lone tensor */
  uint32_t dtype;    /* enum coloader_dtype */
  uint32_t ndim;
  int64_t shape[COLOADER_MAX_FIELD_DIMS]; /* the most one sample holds */
  uint32_t flags;                         /* COLOADER_FIELD_ON_HOST, or 0 */
} coloader_field;
/* A field also readable in host memory on the device path (coloader_batch_host_field): small
 * per-sample facts a binding needs before it touches the device, such as the samples' shapes. */
#define COLOADER_FIELD_ON_HOST 1u

enum coloader_layout {
  COLOADER_NHWC = 0,
  COLOADER_NCHW = 1,
};

/* Where a library's messages that are not errors go (coloader_set_log_handler,
 * coloader_producer_set_log_handler): `handler(level, message, user)`, level as Python logging's
 * (20 info, 30 warning, 40 error), message without a newline, from any of the library's threads;
 * it must not call back into the library. */
typedef void (*coloader_log_handler)(int level, const char* message, void* user);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* COLOADER_C_ABI_H_ */
