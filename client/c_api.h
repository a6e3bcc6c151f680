/* The C ABI of the coloader consumer, for languages other than C++ (Python uses it through
 * ctypes). Nothing throws across it: every function returns 0 on success or a negative
 * coloader_error code, and coloader_last_error() gives this thread's last message.
 *
 * Lifetimes: a coloader_consumer* is owned by the caller until coloader_consumer_close().
 * A coloader_batch* is a lease on producer memory, owned by the caller until
 * coloader_batch_release(), which never blocks and may be called from any thread (a garbage
 * collector's) and after the consumer was closed. */
#ifndef COLOADER_C_API_H_
#define COLOADER_C_API_H_

#include <stdint.h>

/* The library is built with hidden visibility; only what is marked here is exported. */
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
  COLOADER_END = 1, /* not an error: end of epoch (next_batch) or of the stream (next_epoch) */
  COLOADER_E_INVALID = -1,
  COLOADER_E_NOT_FOUND = -2,
  COLOADER_E_IO = -3,
  COLOADER_E_PROTOCOL = -4,
  COLOADER_E_TIMEOUT = -5,
  COLOADER_E_DISCONNECTED = -6,
  COLOADER_E_INTERNAL = -7,
};

typedef struct coloader_consumer coloader_consumer;
typedef struct coloader_batch coloader_batch;

typedef struct coloader_consumer_options {
  const char* name;       /* producer name, or NULL when endpoint is given */
  const char* endpoint;   /* explicit ZeroMQ endpoint, or NULL */
  uint32_t batch_size;    /* 0: the producer's */
  int32_t drop_last;
  int32_t wait_for_epoch;
  int32_t connect_timeout_ms; /* 0: default (5000) */
  int32_t timeout_ms;         /* 0: wait as long as the producer lives */
  const char* client_name;    /* shown by `coloader status`, may be NULL */
  /* Appended after the fields above, which keep their offsets. Nonzero: ask for the device
   * path, i.e. batches in the producer's GPU memory, mapped through CUDA IPC (zero-copy).
   * It is a request: when the producer has no device ring or this process cannot map it, the
   * consumer uses the host path and says why in coloader_consumer_fallback_reason(). 0: the
   * host path. Zero-initialise the struct (memset or `= {0}`) so that a caller that does not
   * know this field gets the host path. */
  int32_t device;
  /* Appended after `device`. A producer not (yet) running: wait this many ms for it to come
   * up (jobs started together with it); 0 fails at once with COLOADER_E_NOT_FOUND. */
  int32_t wait_for_producer_ms;
  /* Appended after `wait_for_producer_ms`. A tcp:// endpoint whose producer takes CURVE keys:
   * the path of this consumer's key pair file and the producer's public key (Z85 text or a
   * .pub file), both from `coloader keygen`; NULL for a local or --insecure producer. */
  const char* curve_key_file;
  const char* curve_server_key;
} coloader_consumer_options;

/* Describes a batch; pointers stay valid until the batch is released. */
typedef struct coloader_batch_info {
  const void* data;      /* the tensor: host memory, or device memory of `device` when >= 0 */
  const int64_t* indices; /* host memory: the dataset index of each sample */
  const int64_t* labels;  /* host memory (on both paths) */
  uint32_t size;         /* samples */
  uint32_t dtype;        /* 0 uint8, 1 float32, 2 bfloat16, 3 float16 */
  uint32_t layout;       /* 0 NHWC, 1 NCHW */
  uint32_t ndim;         /* 4 */
  int64_t shape[4];
  uint64_t bytes;
  uint64_t epoch;
  int32_t device;        /* -1: host memory; >= 0: CUDA device ordinal */
  int32_t gathered;      /* 1 when copied because it straddled producer slots */
  /* Appended after the fields above, which keep their offsets. The labels in device memory
   * of `device` (int64, `size` of them) on the device path; NULL on the host path. */
  const int64_t* device_labels;
} coloader_batch_info;

COLOADER_C_EXPORT const char* coloader_last_error(void);
COLOADER_C_EXPORT const char* coloader_version(void);

COLOADER_C_EXPORT int coloader_consumer_open(const coloader_consumer_options* options, coloader_consumer** out);
/* 0 when an epoch began; COLOADER_END when the producer has no more epochs. */
COLOADER_C_EXPORT int coloader_consumer_next_epoch(coloader_consumer* c);
/* 0 with *out set, or COLOADER_END at the end of the epoch. The same as
 * coloader_consumer_next_batch_on_stream(c, NULL, out). */
COLOADER_C_EXPORT int coloader_consumer_next_batch(coloader_consumer* c, coloader_batch** out);
/* The next batch, for work on `stream` (a cudaStream_t; NULL is the default stream). On the
 * device path `stream` is made to wait for the producer's work on the batch (no host
 * synchronisation): the batch is ready for work enqueued on `stream` after this call; work on
 * another stream must first wait for `stream`. The batch's release is ordered after the work
 * enqueued on `stream` by the time coloader_batch_release() is called: the producer gets the
 * memory back only once that work has finished. A batch gathered across slots is copied on
 * `stream`. On the host path `stream` is ignored. Every stream that reads a slot is made to
 * wait for it; a slot's release is ordered after the last stream that read it, so keep to one
 * stream per consumer, or make the others finish before releasing. */
COLOADER_C_EXPORT int coloader_consumer_next_batch_on_stream(coloader_consumer* c, void* stream,
                                                             coloader_batch** out);
COLOADER_C_EXPORT uint64_t coloader_consumer_epoch(const coloader_consumer* c);
COLOADER_C_EXPORT int32_t coloader_consumer_partial(const coloader_consumer* c);
COLOADER_C_EXPORT uint64_t coloader_consumer_len(const coloader_consumer* c);        /* batches per whole epoch */
COLOADER_C_EXPORT uint64_t coloader_consumer_dataset_size(const coloader_consumer* c);
COLOADER_C_EXPORT uint64_t coloader_consumer_epoch_samples(const coloader_consumer* c);
COLOADER_C_EXPORT uint32_t coloader_consumer_batch_size(const coloader_consumer* c);
/* 1 when batches come in device memory (the device path), 0 on the host path or for NULL. */
COLOADER_C_EXPORT int32_t coloader_consumer_on_device(const coloader_consumer* c);
/* Why the device path was asked for but is not used ("" when it is, or was not asked for).
 * Owned by the consumer, valid until coloader_consumer_close(); never NULL. */
COLOADER_C_EXPORT const char* coloader_consumer_fallback_reason(const coloader_consumer* c);
COLOADER_C_EXPORT void coloader_consumer_close(coloader_consumer* c);               /* NULL is fine */

COLOADER_C_EXPORT int coloader_batch_info_get(const coloader_batch* b, coloader_batch_info* out);
COLOADER_C_EXPORT void coloader_batch_release(coloader_batch* b);                   /* NULL is fine */

/* ---- A producer fed by the caller (the Python-fed producer) ---------------------------------
 * The caller publishes batches it made itself (e.g. from a torch DataLoader): each sample is a
 * tensor of one fixed shape and dtype plus an int64 label. The producer serves them through
 * the same ring, protocol and semantics as `coloader serve`: consumers of any batch size see
 * exact epochs. The session loop runs on a thread of its own; publish blocks while the ring is
 * full (back-pressure) and is for one thread. */
typedef struct coloader_producer coloader_producer;

typedef struct coloader_producer_options {
  const char* name;          /* consumers connect by it */
  uint32_t batch_size;       /* the most samples one publish carries */
  uint32_t ndim;             /* of one sample, 1 to 3 */
  int64_t sample_shape[3];   /* e.g. {3, 224, 224} */
  uint32_t dtype;            /* 0 uint8, 1 float32, 2 bfloat16, 3 float16 */
  uint32_t window;           /* ring slots; 0: 4 */
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
} coloader_producer_options;

COLOADER_C_EXPORT int coloader_producer_open(const coloader_producer_options* options,
                                             coloader_producer** out);
/* The tcp:// endpoint it listens on, port resolved ("" without one); valid until close. */
COLOADER_C_EXPORT const char* coloader_producer_tcp_endpoint(const coloader_producer* p);
/* Copies `count` samples (count * sample bytes from `data`, `count` labels) into a free slot
 * and publishes them as the next batch of the current epoch. Blocks while every slot is in use
 * and no consumer releases one; COLOADER_E_DISCONNECTED if the producer stopped. `indices`
 * may be NULL: the samples' positions in the epoch are used as their indices. */
COLOADER_C_EXPORT int coloader_producer_publish(coloader_producer* p, const void* data, uint32_t count,
                                                const int64_t* labels, const int64_t* indices);
/* Ends the current epoch: its last published batch is marked last-in-epoch. */
COLOADER_C_EXPORT int coloader_producer_end_epoch(coloader_producer* p);
/* Waits until consumers have released every published batch (or timeout_ms passes; 0 waits
 * as long as any consumer lives), says goodbye to them, and frees the producer. */
COLOADER_C_EXPORT int coloader_producer_close(coloader_producer* p, int32_t timeout_ms);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* COLOADER_C_API_H_ */
