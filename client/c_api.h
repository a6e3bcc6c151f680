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

#include <stddef.h>
#include <stdint.h>

#include "common/c_abi.h"

#ifdef __cplusplus
extern "C" {
#endif


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
   * up (jobs started together with it; said once on stderr); 0 fails at once with
   * COLOADER_E_NOT_FOUND; negative: the default wait (60 s). */
  int32_t wait_for_producer_ms;
  /* Appended after `wait_for_producer_ms`. A tcp:// endpoint whose producer takes CURVE keys:
   * the path of this consumer's key pair file and the producer's public key (Z85 text or a
   * .pub file), both from `coloader keygen`; NULL for a local or --insecure producer. */
  const char* curve_key_file;
  const char* curve_server_key;
  /* Appended after `curve_server_key`: consumer groups (docs/DISTRIBUTED.md). Rank `rank` of
   * the `world_size` ranks of one data-parallel job, all giving the same `group` name; each
   * rank gets its share of every epoch (common/split.h), all the same number of batches.
   * NULL or "" group: a plain consumer (rank and world_size must then be 0/0 or 0/1). A
   * world_size of 0 is taken as 1, so a zeroed struct is a plain consumer. */
  const char* group;
  uint32_t rank;
  uint32_t world_size;
  /* The node share this job expects the producer to serve (its --rank of --world-size);
   * num_nodes 0: not stated, not checked. */
  int32_t node_rank;
  int32_t num_nodes;
  /* What a saved state expects: nonzero has_expect_seed checks expect_seed; a non-empty
   * expect_data_key checks the producer's data key. The producer refuses a mismatch
   * (COLOADER_E_INVALID, naming both sides). */
  int32_t has_expect_seed;
  uint64_t expect_seed;
  const char* expect_data_key;
  /* Nonzero: resume a saved state: in epoch resume_epoch, whose split began at position
   * resume_begin, this rank had taken resume_samples samples (coloader_consumer_resume_note()
   * says what could not be resumed exactly). */
  int32_t resume;
  uint64_t resume_epoch;
  uint64_t resume_begin;
  uint64_t resume_samples;
  /* Appended after `resume_samples`. Nonzero: batches are views of the producer's memory
   * itself, for a job that promises never to write them (host: the ring mapped read-only, a
   * write faults; device: the IPC mapping, a write changes what every other consumer reads).
   * 0 (the default): each batch is the job's own (host: a private copy-on-write view; device:
   * a private copy), and kept batches are copied away when the producer needs their slots. */
  int32_t zero_copy;
  /* A group member without a batch yet checks after this many ms that its group is complete
   * and fails naming the ranks that came and those that did not; 0: the default (20000). */
  int32_t group_wait_ms;
  /* Appended after `group_wait_ms`. With `resume`: a group's state saved in an epoch it was
   * caught up on, where that epoch's order began (coloader_consumer_split_origin()); 0 otherwise. */
  uint64_t resume_origin;
} coloader_consumer_options;

/* Describes a batch; pointers stay valid until the batch is released. */
typedef struct coloader_batch_info {
  const void* data;      /* the tensor: host memory, or device memory of `device` when >= 0 */
  const int64_t* indices; /* host memory: the dataset index of each sample */
  const int64_t* labels;  /* host memory (on both paths) */
  uint32_t size;         /* samples */
  uint32_t dtype;        /* enum coloader_dtype */
  uint32_t layout;       /* enum coloader_layout */
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
/* Where the consumer library's messages that are not errors go (waiting for a producer, a
 * resume that could not be exact, ...; coloader_log_handler in common/c_abi.h); NULL: stderr,
 * one line "coloader: MESSAGE" each (the default). */
COLOADER_C_EXPORT void coloader_set_log_handler(coloader_log_handler handler, void* user);
/* sizeof the named struct as this library was built ("consumer_options", "batch_info"), 0 for
 * an unknown name: bindings that lay the structs out themselves check theirs against it. */
COLOADER_C_EXPORT size_t coloader_struct_size(const char* name);
/* The names of the codes of enum coloader_dtype and coloader_layout ("uint8", "nchw"), NULL
 * past the last one: bindings read the vocabulary from here. */
COLOADER_C_EXPORT const char* coloader_dtype_name(uint32_t code);
COLOADER_C_EXPORT const char* coloader_layout_name(uint32_t code);

COLOADER_C_EXPORT int coloader_consumer_open(const coloader_consumer_options* options, coloader_consumer** out);
/* The same in bounded steps, so that a caller can check for a signal (Ctrl-C) between them:
 * open_start checks the options and gives a consumer that is still connecting (only
 * open_wait and close take it then); open_wait goes on for at most wait_ms and returns
 * COLOADER_OK once connected, COLOADER_AGAIN while not yet, or the error of open (after which
 * only close takes it). The options' own deadlines (wait_for_producer_ms, connect_timeout_ms)
 * run across the calls. */
COLOADER_C_EXPORT int coloader_consumer_open_start(const coloader_consumer_options* options, coloader_consumer** out);
COLOADER_C_EXPORT int coloader_consumer_open_wait(coloader_consumer* c, int32_t wait_ms);
/* 0 when an epoch began; COLOADER_END when the producer has served every epoch (see
 * coloader_consumer_finished). The first call attaches the consumer: until then the producer
 * neither counts it nor waits for it. COLOADER_E_DISCONNECTED: the producer stopped, was
 * killed or crashed before serving its epochs (the message says how, and where the stream
 * stopped); COLOADER_E_DETACHED: it detached this consumer (the message says why). */
COLOADER_C_EXPORT int coloader_consumer_next_epoch(coloader_consumer* c);
/* next_epoch and next_batch_on_stream waiting at most wait_ms: COLOADER_AGAIN when nothing
 * came in that time (call again: it goes on where it stopped; timeout_ms runs across calls). */
COLOADER_C_EXPORT int coloader_consumer_next_epoch_wait(coloader_consumer* c, int32_t wait_ms);
COLOADER_C_EXPORT int coloader_consumer_next_batch_wait(coloader_consumer* c, void* stream, int32_t wait_ms,
                                                        coloader_batch** out);
/* 1 once the stream has ended because the producer served every epoch it was started for. */
COLOADER_C_EXPORT int32_t coloader_consumer_finished(const coloader_consumer* c);
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
/* The producer's sampler seed and data key (a hex string owned by the consumer, valid until
 * close; "" for NULL): what a saved state records and a resumed one checks. */
COLOADER_C_EXPORT uint64_t coloader_consumer_seed(const coloader_consumer* c);
COLOADER_C_EXPORT const char* coloader_consumer_data_key(const coloader_consumer* c);
/* The producer's node shard: its --rank and --world-size. */
COLOADER_C_EXPORT int32_t coloader_consumer_node_rank(const coloader_consumer* c);
COLOADER_C_EXPORT int32_t coloader_consumer_num_nodes(const coloader_consumer* c);
/* The producer's class names in label order (an ImageFolder's folders): how many (0: it has
 * none, e.g. a file list or shards), and the i-th (owned by the consumer, valid until close;
 * NULL past the last). */
COLOADER_C_EXPORT uint32_t coloader_consumer_num_classes(const coloader_consumer* c);
COLOADER_C_EXPORT const char* coloader_consumer_class_name(const coloader_consumer* c, uint32_t i);
/* Why an epoch this consumer joins mid-way is partial (the producer does not serve it the
 * samples it missed); "" when the producer catches it up. Owned by the consumer; never NULL. */
COLOADER_C_EXPORT const char* coloader_consumer_no_catch_up(const coloader_consumer* c);
/* Where the current epoch's positions began (in a group: its split; alone: its first batch's,
 * the positions running on modulo the epoch when it was caught up), and the samples this
 * consumer has taken in it (a resumed one counts those of its saved state). */
COLOADER_C_EXPORT uint64_t coloader_consumer_split_begin(const coloader_consumer* c);
/* A group member in an epoch it was caught up on: the position the epoch's order starts at (its
 * split's positions count from there round the epoch's end); 0 otherwise. */
COLOADER_C_EXPORT uint64_t coloader_consumer_split_origin(const coloader_consumer* c);
COLOADER_C_EXPORT uint64_t coloader_consumer_samples_seen(const coloader_consumer* c);
/* Resumes a saved state on this connection (as the resume fields of the options would): only
 * before the first coloader_consumer_next_epoch(), else COLOADER_E_INVALID. */
COLOADER_C_EXPORT int coloader_consumer_resume(coloader_consumer* c, uint64_t epoch, uint64_t begin, uint64_t samples);
/* The same with the state's split origin (a group's caught-up epoch; 0 is coloader_consumer_resume). */
COLOADER_C_EXPORT int coloader_consumer_resume_origin(coloader_consumer* c, uint64_t epoch, uint64_t begin,
                                                      uint64_t samples, uint64_t origin);
/* What a resume could not give exactly ("" when it did, or none was asked); owned by the
 * consumer, valid until close; never NULL. */
COLOADER_C_EXPORT const char* coloader_consumer_resume_note(const coloader_consumer* c);
COLOADER_C_EXPORT void coloader_consumer_close(coloader_consumer* c);               /* NULL is fine */

/* A caller-fed producer's schema (coloader.Producer): its batches are a structure of fields
 * rather than one tensor and labels. num_fields is 0 for a producer of images (`serve`);
 * field i describes the i-th (its path is owned by the consumer, valid until close);
 * structure is how they nest, as the producer's binding wrote it ("" without a schema). */
COLOADER_C_EXPORT uint32_t coloader_consumer_num_fields(const coloader_consumer* c);
COLOADER_C_EXPORT int coloader_consumer_field(const coloader_consumer* c, uint32_t i, coloader_field* out);
COLOADER_C_EXPORT const char* coloader_consumer_structure(const coloader_consumer* c);

COLOADER_C_EXPORT int coloader_batch_info_get(const coloader_batch* b, coloader_batch_info* out);
/* Field i of a batch with a schema: its `size` samples, contiguous, in the memory the info's
 * `device` says (host, or device memory on the device path); NULL without a schema, past the
 * last field, or for NULL. The info's data is NULL for such a batch. */
COLOADER_C_EXPORT const void* coloader_batch_field(const coloader_batch* b, uint32_t i);
/* Every field's pointer in one call: out[i] as coloader_batch_field(b, i) would give, for the
 * `n` fields of the schema (n must be coloader_consumer_num_fields; COLOADER_E_INVALID else). */
COLOADER_C_EXPORT int coloader_batch_fields(const coloader_batch* b, uint32_t n, const void** out);
/* The same field in host memory, on either path: on the host path what coloader_batch_field
 * gives; on the device path a host copy, for a field flagged COLOADER_FIELD_ON_HOST only (NULL
 * for the others). Valid while the batch is. */
COLOADER_C_EXPORT const void* coloader_batch_host_field(const coloader_batch* b, uint32_t i);
COLOADER_C_EXPORT void coloader_batch_release(coloader_batch* b);                   /* NULL is fine */

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* COLOADER_C_API_H_ */
