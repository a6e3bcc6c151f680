// The C ABI over coloader::Consumer. Every exported function runs its body inside Guard()
// (common/c_abi_internal.h): nothing unwinds into C or Python.
#include "client/c_api.h"

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>


#include "client/consumer.h"
#include "common/c_abi_internal.h"
#include "common/log.h"

#ifndef COLOADER_VERSION
#define COLOADER_VERSION "unknown"
#endif

struct coloader_consumer {
  std::unique_ptr<coloader::Connecting> connecting;  // until open_wait has connected
  std::unique_ptr<coloader::Consumer> impl;
};

struct coloader_batch {
  explicit coloader_batch(coloader::Batch b) : batch(std::move(b)) {}
  coloader::Batch batch;  // the lease; destroying it acks the producer (never blocks)
};

using coloader::c_abi::Fail;
using coloader::c_abi::Guard;
using coloader::c_abi::NullArgument;
using coloader::c_abi::SetError;

extern "C" {

const char* coloader_last_error(void) { return coloader::c_abi::LastError().c_str(); }

const char* coloader_version(void) { return COLOADER_VERSION; }

void coloader_set_log_handler(coloader_log_handler handler, void* user) { coloader::SetLogHandler(handler, user); }

size_t coloader_struct_size(const char* name) {
  if (name == nullptr) return 0;
  if (std::strcmp(name, "consumer_options") == 0) return sizeof(coloader_consumer_options);
  if (std::strcmp(name, "batch_info") == 0) return sizeof(coloader_batch_info);
  if (std::strcmp(name, "field") == 0) return sizeof(coloader_field);
  return 0;
}

const char* coloader_dtype_name(uint32_t code) {
  return code <= static_cast<uint32_t>(coloader::kLastDType) ? coloader::DTypeName(static_cast<coloader::DType>(code))
                                                             : nullptr;
}

const char* coloader_layout_name(uint32_t code) {
  return code <= COLOADER_NCHW ? coloader::TensorLayoutName(static_cast<coloader::TensorLayout>(code)) : nullptr;
}

namespace {

// The C options as C++ ones, or an error code (set as the last error).
int ToOptions(const char* what, const coloader_consumer_options* options, coloader::ConsumerOptions* o) {
  if (options == nullptr) return NullArgument(what, "options");
  const bool has_name = options->name != nullptr && options->name[0] != '\0';
  const bool has_endpoint = options->endpoint != nullptr && options->endpoint[0] != '\0';
  if (!has_name && !has_endpoint) {
    return SetError(COLOADER_E_INVALID, "give a producer name or an endpoint to connect to");
  }
  if (options->connect_timeout_ms < 0 || options->timeout_ms < 0 || options->group_wait_ms < 0) {
    return SetError(COLOADER_E_INVALID, "timeouts must be >= 0 ms (connect_timeout_ms " +
                                            std::to_string(options->connect_timeout_ms) + ", timeout_ms " +
                                            std::to_string(options->timeout_ms) + ", group_wait_ms " +
                                            std::to_string(options->group_wait_ms) + ")");
  }
  if (has_name) o->name = options->name;
  if (has_endpoint) o->endpoint = options->endpoint;
  o->batch_size = options->batch_size;
  o->drop_last = options->drop_last != 0;
  o->wait_for_epoch = options->wait_for_epoch != 0;
  if (options->connect_timeout_ms > 0) o->connect_timeout_ms = options->connect_timeout_ms;
  o->timeout_ms = options->timeout_ms;
  if (options->client_name != nullptr) o->client_name = options->client_name;
  o->device = options->device != 0;
  o->wait_for_producer_ms = options->wait_for_producer_ms < 0 ? coloader::kDefaultWaitForProducerMs
                                                              : options->wait_for_producer_ms;
  if (options->curve_key_file != nullptr) o->curve_key_file = options->curve_key_file;
  if (options->curve_server_key != nullptr) o->curve_server_key = options->curve_server_key;
  if (options->group != nullptr) o->group = options->group;
  o->rank = options->rank;
  o->world_size = options->world_size == 0 ? 1 : options->world_size;
  o->node_rank = options->node_rank;
  o->num_nodes = options->num_nodes;
  if (options->has_expect_seed != 0) o->expect_seed = options->expect_seed;
  if (options->expect_data_key != nullptr) o->expect_data_key = options->expect_data_key;
  o->resume = options->resume != 0;
  o->resume_epoch = options->resume_epoch;
  o->resume_begin = options->resume_begin;
  o->resume_samples = options->resume_samples;
  o->resume_origin = options->resume_origin;
  o->zero_copy = options->zero_copy != 0;
  if (options->group_wait_ms > 0) o->group_wait_ms = options->group_wait_ms;
  return COLOADER_OK;
}

}  // namespace

int coloader_consumer_open(const coloader_consumer_options* options, coloader_consumer** out) {
  constexpr const char* kWhat = "coloader_consumer_open";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    *out = nullptr;
    coloader::ConsumerOptions o;
    if (int rc = ToOptions(kWhat, options, &o); rc != COLOADER_OK) return rc;
    auto consumer = std::make_unique<coloader_consumer>();
    auto connected = coloader::Consumer::Connect(std::move(o));
    if (!connected.ok()) return Fail(connected.status());
    consumer->impl = std::move(*connected);
    *out = consumer.release();
    return COLOADER_OK;
  });
}

int coloader_consumer_open_start(const coloader_consumer_options* options, coloader_consumer** out) {
  constexpr const char* kWhat = "coloader_consumer_open_start";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    *out = nullptr;
    coloader::ConsumerOptions o;
    if (int rc = ToOptions(kWhat, options, &o); rc != COLOADER_OK) return rc;
    auto consumer = std::make_unique<coloader_consumer>();
    auto started = coloader::Consumer::Start(std::move(o));
    if (!started.ok()) return Fail(started.status());
    consumer->connecting = std::move(*started);
    *out = consumer.release();
    return COLOADER_OK;
  });
}

int coloader_consumer_open_wait(coloader_consumer* c, int32_t wait_ms) {
  constexpr const char* kWhat = "coloader_consumer_open_wait";
  return Guard(kWhat, [&]() -> int {
    if (c == nullptr) return NullArgument(kWhat, "consumer");
    if (c->impl) return COLOADER_OK;
    if (!c->connecting) return SetError(COLOADER_E_INVALID, "this consumer's connection attempt has ended in an error");
    auto done = c->connecting->Finish(std::max(wait_ms, 0));
    if (done.ok() && !done->ready()) return COLOADER_AGAIN;
    c->connecting.reset();  // over, either way
    if (!done.ok()) return Fail(done.status());
    c->impl = **std::move(done);
    return COLOADER_OK;
  });
}

namespace {

int NextEpoch(const char* what, coloader_consumer* c, int wait_ms) {
  return Guard(what, [&]() -> int {
    if (c == nullptr || !c->impl) return NullArgument(what, "consumer");
    auto more = c->impl->NextEpoch(wait_ms);  // < 0: no bound
    if (!more.ok()) return Fail(more.status());
    if (!more->ready()) return COLOADER_AGAIN;
    return **more ? COLOADER_OK : COLOADER_END;
  });
}

int NextBatch(const char* what, coloader_consumer* c, void* stream, int wait_ms, coloader_batch** out) {
  return Guard(what, [&]() -> int {
    if (out == nullptr) return NullArgument(what, "out");
    *out = nullptr;
    if (c == nullptr || !c->impl) return NullArgument(what, "consumer");
    auto next = c->impl->Next(stream, wait_ms);  // < 0: no bound
    if (!next.ok()) return Fail(next.status());
    if (!next->ready()) return COLOADER_AGAIN;
    std::optional<coloader::Batch> batch = **std::move(next);
    if (!batch) return COLOADER_END;
    // If this allocation throws, the Batch is destroyed on unwinding: its lease is acked.
    *out = new coloader_batch(std::move(*batch));
    return COLOADER_OK;
  });
}

}  // namespace

int coloader_consumer_next_epoch(coloader_consumer* c) { return NextEpoch("coloader_consumer_next_epoch", c, -1); }

int coloader_consumer_next_epoch_wait(coloader_consumer* c, int32_t wait_ms) {
  return NextEpoch("coloader_consumer_next_epoch_wait", c, wait_ms < 0 ? 0 : wait_ms);
}

int coloader_consumer_next_batch(coloader_consumer* c, coloader_batch** out) {
  return NextBatch("coloader_consumer_next_batch", c, nullptr, -1, out);
}

int coloader_consumer_next_batch_on_stream(coloader_consumer* c, void* stream, coloader_batch** out) {
  return NextBatch("coloader_consumer_next_batch_on_stream", c, stream, -1, out);
}

int coloader_consumer_next_batch_wait(coloader_consumer* c, void* stream, int32_t wait_ms, coloader_batch** out) {
  return NextBatch("coloader_consumer_next_batch_wait", c, stream, wait_ms < 0 ? 0 : wait_ms, out);
}

int32_t coloader_consumer_finished(const coloader_consumer* c) {
  return c != nullptr && c->impl && c->impl->finished() ? 1 : 0;
}

uint64_t coloader_consumer_epoch(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->epoch() : 0;
}

int32_t coloader_consumer_partial(const coloader_consumer* c) {
  return c != nullptr && c->impl && c->impl->partial() ? 1 : 0;
}

uint64_t coloader_consumer_len(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->size() : 0;
}

uint64_t coloader_consumer_dataset_size(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().dataset_size : 0;
}

uint64_t coloader_consumer_epoch_samples(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().epoch_samples : 0;
}

uint32_t coloader_consumer_batch_size(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->batch_size() : 0;
}

int32_t coloader_consumer_on_device(const coloader_consumer* c) {
  return c != nullptr && c->impl && c->impl->on_device() ? 1 : 0;
}

const char* coloader_consumer_fallback_reason(const coloader_consumer* c) {
  // The string lives in the consumer's state; returning its buffer neither allocates nor throws.
  return c != nullptr && c->impl ? c->impl->fallback_reason().c_str() : "";
}

uint64_t coloader_consumer_seed(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().seed : 0;
}

const char* coloader_consumer_data_key(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().data_key.c_str() : "";
}

int32_t coloader_consumer_node_rank(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().node_rank : 0;
}

int32_t coloader_consumer_num_nodes(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().num_nodes : 0;
}

uint32_t coloader_consumer_num_classes(const coloader_consumer* c) {
  return c != nullptr && c->impl ? static_cast<uint32_t>(c->impl->producer().classes.size()) : 0;
}

const char* coloader_consumer_no_catch_up(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->producer().no_catch_up.c_str() : "";
}

const char* coloader_consumer_class_name(const coloader_consumer* c, uint32_t i) {
  if (c == nullptr || !c->impl || i >= c->impl->producer().classes.size()) return nullptr;
  return c->impl->producer().classes[i].c_str();
}

uint64_t coloader_consumer_split_begin(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->split_begin() : 0;
}

uint64_t coloader_consumer_split_origin(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->split_origin() : 0;
}

uint64_t coloader_consumer_samples_seen(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->samples_seen() : 0;
}

int coloader_consumer_resume(coloader_consumer* c, uint64_t epoch, uint64_t begin, uint64_t samples) {
  return coloader_consumer_resume_origin(c, epoch, begin, samples, 0);
}

int coloader_consumer_resume_origin(coloader_consumer* c, uint64_t epoch, uint64_t begin, uint64_t samples,
                                    uint64_t origin) {
  constexpr const char* kWhat = "coloader_consumer_resume";
  return Guard(kWhat, [&]() -> int {
    if (c == nullptr || !c->impl) return NullArgument(kWhat, "consumer");
    coloader::Status st = c->impl->Resume(epoch, begin, samples, origin);
    return st.ok() ? COLOADER_OK : Fail(st);
  });
}

const char* coloader_consumer_resume_note(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->resume_note().c_str() : "";
}

uint32_t coloader_consumer_num_fields(const coloader_consumer* c) {
  return c != nullptr && c->impl ? static_cast<uint32_t>(c->impl->slots().fields.size()) : 0;
}

int coloader_consumer_field(const coloader_consumer* c, uint32_t i, coloader_field* out) {
  constexpr const char* kWhat = "coloader_consumer_field";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    if (c == nullptr || !c->impl) return NullArgument(kWhat, "consumer");
    const std::vector<coloader::FieldSpec>& fields = c->impl->slots().fields;
    if (i >= fields.size())
      return SetError(COLOADER_E_INVALID, std::string(kWhat) + ": field " + std::to_string(i) + " of " +
                                              std::to_string(fields.size()));
    std::memset(out, 0, sizeof(*out));
    const coloader::FieldSpec& f = fields[i];
    out->path = f.path.c_str();
    out->dtype = static_cast<uint32_t>(f.dtype);
    out->ndim = static_cast<uint32_t>(f.shape.size());  // at most kMaxFieldDims: the decoder checked
    for (size_t d = 0; d < f.shape.size(); ++d) out->shape[d] = f.shape[d];
    out->flags = f.flags;
    return COLOADER_OK;
  });
}

const char* coloader_consumer_structure(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->slots().structure.c_str() : "";
}

void coloader_consumer_close(coloader_consumer* c) {
  if (c == nullptr) return;
  (void)Guard("coloader_consumer_close", [&]() -> int {
    if (c->impl) c->impl->Close();  // says goodbye; leases still alive keep their mapping
    return COLOADER_OK;
  });
  delete c;  // ~Consumer only repeats Close(), which is idempotent
}

int coloader_batch_info_get(const coloader_batch* b, coloader_batch_info* out) {
  constexpr const char* kWhat = "coloader_batch_info_get";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    if (b == nullptr) return NullArgument(kWhat, "batch");
    std::memset(out, 0, sizeof(*out));
    const coloader::Batch& batch = b->batch;
    out->data = batch.data();
    out->indices = batch.indices();
    out->labels = batch.labels();
    out->size = batch.size();
    out->dtype = static_cast<uint32_t>(batch.dtype());
    out->layout = static_cast<uint32_t>(batch.layout());
    const std::vector<int64_t> shape = batch.shape();
    out->ndim = static_cast<uint32_t>(shape.size());
    for (size_t i = 0; i < shape.size() && i < 4; ++i) out->shape[i] = shape[i];
    out->bytes = batch.bytes();
    out->epoch = batch.epoch();
    out->device = batch.device();  // -1: host memory
    out->gathered = batch.gathered() ? 1 : 0;
    out->device_labels = batch.device_labels();  // nullptr on the host path
    return COLOADER_OK;
  });
}

const void* coloader_batch_field(const coloader_batch* b, uint32_t i) {
  return b == nullptr ? nullptr : b->batch.field(i);
}

int coloader_batch_fields(const coloader_batch* b, uint32_t n, const void** out) {
  constexpr const char* kWhat = "coloader_batch_fields";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    if (b == nullptr) return NullArgument(kWhat, "batch");
    const size_t fields = b->batch.num_fields();
    if (n != fields)
      return SetError(COLOADER_E_INVALID, std::string(kWhat) + ": asked for " + std::to_string(n) +
                                              " fields; the batch has " + std::to_string(fields));
    b->batch.field_pointers(out);
    return COLOADER_OK;
  });
}

const void* coloader_batch_host_field(const coloader_batch* b, uint32_t i) {
  return b == nullptr ? nullptr : b->batch.host_field(i);
}

void coloader_batch_release(coloader_batch* b) {
  if (b == nullptr) return;
  // ~Batch queues the ack for the I/O thread (an eventfd write) and never blocks.
  delete b;
}

}  // extern "C"
