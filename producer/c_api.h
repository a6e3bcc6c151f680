/* The C ABI of the producer fed by the caller (what Python's coloader.Producer loads, as
 * libcoloader_producer_c.so). A library of its own, next to the producer: the consumer's
 * library (client/c_api.h) links neither the decoders nor OpenCV. Nothing throws across it:
 * every function returns 0 or a negative coloader_error code, and
 * coloader_producer_last_error() gives this thread's last message. */
#ifndef COLOADER_PRODUCER_C_API_H_
#define COLOADER_PRODUCER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "common/c_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The caller publishes batches it made itself (e.g. from a torch DataLoader): each batch is
 * the fields of one schema, stated at open (each field a tensor of a fixed dtype and per-sample
 * shape, the batch's samples along its first dimension). The producer serves them through
 * the same ring, protocol and semantics as `coloader serve`: consumers of any batch size see
 * exact epochs. The session loop runs on a thread of its own; publish blocks while the ring is
 * full (back-pressure) and is for one thread. */
typedef struct coloader_producer coloader_producer;

typedef struct coloader_producer_options {
  const char* name;          /* consumers connect by it */
  uint32_t batch_size;       /* the most samples one publish carries */
  /* The schema: num_fields fields (1 to 256), and how they nest as the binding writes it
   * (carried to the consumers' bindings as it is; may be NULL). */
  const coloader_field* fields;
  uint32_t num_fields;
  const char* structure;
  /* Nonzero: the ring also lives in the memory of CUDA device `device`, and consumers on it
   * get device tensors (CUDA IPC); 0 (a zeroed struct): host memory only. */
  int32_t on_device;
  int32_t device;
  uint32_t window;           /* batches the producer may run ahead of the slowest reader; 0: 4 */
  uint32_t min_consumers;    /* 0: 1 */
  uint64_t epoch_samples;    /* samples per epoch if known (for len() on the consumers), else 0 */
  int32_t heartbeat_ms;      /* 0: 500 */
  int32_t heartbeat_timeout_ms; /* 0: 5000 */
  /* Consumers on other machines (host path, batches sent over the network): NULL for local
   * consumers only, else "tcp://HOST:PORT" (port * picks a free one). It needs CURVE keys, a
   * key pair from `coloader keygen` and the consumers' public keys, or `insecure`. */
  const char* tcp_endpoint;
  const char* curve_key_file;        /* this producer's key pair (NAME.key) */
  const char* authorized_keys_file;  /* the consumers' public keys it accepts, one per line */
  int32_t insecure;                  /* nonzero: tcp without authentication (trusted networks only) */
  /* Once the first epoch has started (min_consumers attached), the run ends when no consumer
   * has been attached this long: publish, wait and close then return COLOADER_END. 0: wait for
   * consumers forever. */
  int32_t alone_timeout_ms;
} coloader_producer_options;

COLOADER_C_EXPORT int coloader_producer_open(const coloader_producer_options* options,
                                             coloader_producer** out);
/* The tcp:// endpoint it listens on, port resolved ("" without one); valid until close. */
COLOADER_C_EXPORT const char* coloader_producer_tcp_endpoint(const coloader_producer* p);
/* Waits at most `timeout_ms` until a publish would not block: 0 when it would, COLOADER_AGAIN
 * when the time passed (call again: a caller that must stay responsive to signals waits in
 * short steps), COLOADER_END when the run ended because its consumers all left (the producer's
 * log says how far it got), COLOADER_E_DISCONNECTED when the producer stopped otherwise. */
COLOADER_C_EXPORT int coloader_producer_wait(coloader_producer* p, int32_t timeout_ms);
/* Copies `count` samples of every field (fields[i]: count x field i's sample bytes, contiguous
 * host memory) into a free slot and publishes them as the next batch of the current epoch.
 * Blocks while every slot is in use and no consumer releases one; COLOADER_END if its
 * consumers all left (nothing published), COLOADER_E_DISCONNECTED if the producer stopped
 * otherwise. `indices` may be NULL: the samples' positions in the epoch are used as their
 * indices. */
COLOADER_C_EXPORT int coloader_producer_publish(coloader_producer* p, const void* const* fields, uint32_t count,
                                                const int64_t* indices);
/* Ends the current epoch: its last published batch is marked last-in-epoch. */
COLOADER_C_EXPORT int coloader_producer_end_epoch(coloader_producer* p);
/* The caller's data failed (its DataLoader raised, a batch broke the schema): no more batches;
 * what was published is served, the epoch under way stays cut, and every consumer ends with
 * COLOADER_E_DISCONNECTED naming `why` (e.g. "its DataLoader raised ValueError: ..."). Then
 * finish and close as after the last batch; close returns 0. */
COLOADER_C_EXPORT int coloader_producer_fail(coloader_producer* p, const char* why);
/* No more batches: waits at most timeout_ms (0: not at all) for the run to end (the consumers
 * released every batch, or all left): 0 when it has, COLOADER_AGAIN when not yet (call again,
 * or close). A caller that must stay responsive to signals waits here in short steps before
 * close. */
COLOADER_C_EXPORT int coloader_producer_finish(coloader_producer* p, int32_t timeout_ms);
/* Waits until consumers have released every published batch (or timeout_ms passes; 0 waits
 * as long as any consumer lives, and alone_timeout_ms once none does), says goodbye to them,
 * and frees the producer. 0; COLOADER_END when the run ended because its consumers left;
 * COLOADER_E_TIMEOUT when timeout_ms passed first and the run was stopped (freed all the same). */
COLOADER_C_EXPORT int coloader_producer_close(coloader_producer* p, int32_t timeout_ms);

/* Recipes (`serve --transform`), for inspecting them and testing them against torchvision on the
 * same pixels. `recipe` is the recipe's JSON text (a list of ops, as a recipe file holds it).
 * coloader_recipe_image_size gives the output's side; coloader_recipe_apply runs the recipe on one
 * image already decoded (`rgb`: height x width x 3 uint8), with the random draws of sample
 * (seed, epoch, index), into `out`: size x size x 3, NHWC, uint8 (the pixels before the tensor
 * ops) or float32 (normalised, erased), as `out_dtype` (COLOADER_UINT8 or _FLOAT32) says. */
COLOADER_C_EXPORT int coloader_recipe_image_size(const char* recipe, int32_t* size);
COLOADER_C_EXPORT int coloader_recipe_apply(const char* recipe, const uint8_t* rgb, int32_t height, int32_t width,
                                            uint64_t seed, uint64_t epoch, uint64_t index, int32_t out_dtype,
                                            void* out);
/* One op of the automatic augmentations ("ShearX", "Color", "Posterize", ... as torchvision's
 * _apply_op names them) at a fixed magnitude, in place on `rgb` (height x width x 3 uint8); fill:
 * three values on 0..255, or NULL for black. */
COLOADER_C_EXPORT int coloader_augment_op(const char* name, double magnitude, uint8_t* rgb, int32_t height,
                                          int32_t width, const float* fill);

COLOADER_C_EXPORT const char* coloader_producer_last_error(void);
/* Where the producer's log lines go (consumers coming and going, decode choices, skipped files,
 * how the run ended; coloader_log_handler in common/c_abi.h): a failed run at 40, warnings at 30,
 * the rest at 20;
 * NULL: stderr, each after the local date and time (the default). Returns once no call of the
 * previous handler is under way (2 s at most). */
COLOADER_C_EXPORT void coloader_producer_set_log_handler(coloader_log_handler handler, void* user);
/* sizeof the named struct as this library was built ("producer_options"), 0 if unknown. */
COLOADER_C_EXPORT size_t coloader_producer_struct_size(const char* name);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* COLOADER_PRODUCER_C_API_H_ */
