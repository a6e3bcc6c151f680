// The C ABI over coloader::Consumer. Every exported function runs its body inside Guard(),
// which catches everything (nothing may unwind into C or Python), maps a Status or exception
// to a coloader_error code and keeps the message in this thread's last-error string.
#include "client/c_api.h"

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include <chrono>
#include <future>
#include <thread>

#include "client/consumer.h"
#include "server/external_source.h"
#include "server/producer.h"

#ifndef COLOADER_VERSION
#define COLOADER_VERSION "unknown"
#endif

struct coloader_producer {
  std::unique_ptr<coloader::Producer> producer;
  std::future<coloader::Status> loop;  // the session loop, on a thread of its own
};

struct coloader_consumer {
  std::unique_ptr<coloader::Consumer> impl;
};

struct coloader_batch {
  explicit coloader_batch(coloader::Batch b) : batch(std::move(b)) {}
  coloader::Batch batch;  // the lease; destroying it acks the producer (never blocks)
};

namespace {

thread_local std::string t_last_error;

int SetError(int code, std::string message) {
  // Assigning may allocate; if even that fails, the old message stays. Never throws out.
  try {
    t_last_error = std::move(message);
  } catch (...) {
  }
  return code;
}

int CodeFor(coloader::StatusCode code) {
  using coloader::StatusCode;
  switch (code) {
    case StatusCode::kOk:
      return COLOADER_OK;
    case StatusCode::kInvalidArgument:
    case StatusCode::kAlreadyExists:
      return COLOADER_E_INVALID;
    case StatusCode::kNotFound:
      return COLOADER_E_NOT_FOUND;
    case StatusCode::kIOError:
      return COLOADER_E_IO;
    case StatusCode::kProtocolError:
      return COLOADER_E_PROTOCOL;
    case StatusCode::kTimeout:
      return COLOADER_E_TIMEOUT;
    case StatusCode::kDisconnected:
    case StatusCode::kCancelled:
      return COLOADER_E_DISCONNECTED;
    case StatusCode::kInternal:
      return COLOADER_E_INTERNAL;
  }
  return COLOADER_E_INTERNAL;
}

int Fail(const coloader::Status& st) { return SetError(CodeFor(st.code()), st.message()); }

// Runs `body` (which returns a coloader_error code) and turns any exception into one.
template <typename Fn>
int Guard(const char* what, Fn&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return SetError(COLOADER_E_INTERNAL, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return SetError(COLOADER_E_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return SetError(COLOADER_E_INTERNAL, std::string(what) + ": unknown exception");
  }
}

int NullArgument(const char* what, const char* arg) {
  return SetError(COLOADER_E_INVALID, std::string(what) + ": " + arg + " is NULL");
}

}  // namespace

extern "C" {

const char* coloader_last_error(void) { return t_last_error.c_str(); }

const char* coloader_version(void) { return COLOADER_VERSION; }

int coloader_consumer_open(const coloader_consumer_options* options, coloader_consumer** out) {
  constexpr const char* kWhat = "coloader_consumer_open";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    *out = nullptr;
    if (options == nullptr) return NullArgument(kWhat, "options");
    const bool has_name = options->name != nullptr && options->name[0] != '\0';
    const bool has_endpoint = options->endpoint != nullptr && options->endpoint[0] != '\0';
    if (!has_name && !has_endpoint) {
      return SetError(COLOADER_E_INVALID, "give a producer name or an endpoint to connect to");
    }
    if (options->connect_timeout_ms < 0 || options->timeout_ms < 0) {
      return SetError(COLOADER_E_INVALID, "timeouts must be >= 0 ms (connect_timeout_ms " +
                                              std::to_string(options->connect_timeout_ms) +
                                              ", timeout_ms " + std::to_string(options->timeout_ms) + ")");
    }
    coloader::ConsumerOptions o;
    if (has_name) o.name = options->name;
    if (has_endpoint) o.endpoint = options->endpoint;
    o.batch_size = options->batch_size;
    o.drop_last = options->drop_last != 0;
    o.wait_for_epoch = options->wait_for_epoch != 0;
    if (options->connect_timeout_ms > 0) o.connect_timeout_ms = options->connect_timeout_ms;
    o.timeout_ms = options->timeout_ms;
    if (options->client_name != nullptr) o.client_name = options->client_name;
    o.device = options->device != 0;
    o.wait_for_producer_ms = options->wait_for_producer_ms > 0 ? options->wait_for_producer_ms : 0;
    if (options->curve_key_file != nullptr) o.curve_key_file = options->curve_key_file;
    if (options->curve_server_key != nullptr) o.curve_server_key = options->curve_server_key;

    auto consumer = std::make_unique<coloader_consumer>();
    auto connected = coloader::Consumer::Connect(std::move(o));
    if (!connected.ok()) return Fail(connected.status());
    consumer->impl = std::move(*connected);
    *out = consumer.release();
    return COLOADER_OK;
  });
}

int coloader_consumer_next_epoch(coloader_consumer* c) {
  constexpr const char* kWhat = "coloader_consumer_next_epoch";
  return Guard(kWhat, [&]() -> int {
    if (c == nullptr || !c->impl) return NullArgument(kWhat, "consumer");
    auto more = c->impl->NextEpoch();
    if (!more.ok()) return Fail(more.status());
    return *more ? COLOADER_OK : COLOADER_END;
  });
}

namespace {

int NextBatch(const char* what, coloader_consumer* c, void* stream, coloader_batch** out) {
  return Guard(what, [&]() -> int {
    if (out == nullptr) return NullArgument(what, "out");
    *out = nullptr;
    if (c == nullptr || !c->impl) return NullArgument(what, "consumer");
    auto next = c->impl->Next(stream);
    if (!next.ok()) return Fail(next.status());
    if (!next->has_value()) return COLOADER_END;
    // If this allocation throws, the Batch is destroyed on unwinding: its lease is acked.
    *out = new coloader_batch(std::move(**next));
    return COLOADER_OK;
  });
}

}  // namespace

int coloader_consumer_next_batch(coloader_consumer* c, coloader_batch** out) {
  return NextBatch("coloader_consumer_next_batch", c, nullptr, out);
}

int coloader_consumer_next_batch_on_stream(coloader_consumer* c, void* stream, coloader_batch** out) {
  return NextBatch("coloader_consumer_next_batch_on_stream", c, stream, out);
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
  return c != nullptr && c->impl ? c->impl->welcome().dataset_size : 0;
}

uint64_t coloader_consumer_epoch_samples(const coloader_consumer* c) {
  return c != nullptr && c->impl ? c->impl->welcome().epoch_samples : 0;
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

void coloader_batch_release(coloader_batch* b) {
  if (b == nullptr) return;
  // ~Batch queues the ack for the I/O thread (an eventfd write) and never blocks.
  delete b;
}

// ---- producer fed by the caller --------------------------------------------------------------

int coloader_producer_open(const coloader_producer_options* options, coloader_producer** out) {
  constexpr const char* kWhat = "coloader_producer_open";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    *out = nullptr;
    if (options == nullptr) return NullArgument(kWhat, "options");
    if (options->name == nullptr) return NullArgument(kWhat, "options->name");
    if (options->ndim < 1 || options->ndim > 3) {
      return SetError(COLOADER_E_INVALID, std::string(kWhat) + ": a sample has 1 to 3 dimensions, got " +
                                              std::to_string(options->ndim));
    }
    if (options->dtype > 3) {
      return SetError(COLOADER_E_INVALID, std::string(kWhat) + ": unknown dtype code " + std::to_string(options->dtype));
    }
    coloader::ProducerOptions o;
    o.name = options->name;
    o.external = true;
    o.batch_size = options->batch_size;
    o.sample_shape.assign(options->sample_shape, options->sample_shape + options->ndim);
    o.output = static_cast<coloader::DType>(options->dtype);
    o.layout = coloader::TensorLayout::kNCHW;  // samples go in as given: C,H,W order
    o.window = options->window ? options->window : 4;
    o.min_consumers = options->min_consumers ? options->min_consumers : 1;
    o.epoch_samples = options->epoch_samples;
    o.forever = true;  // the caller decides when it is over (coloader_producer_close)
    o.workers = 1;
    if (options->heartbeat_ms > 0) o.heartbeat_ms = static_cast<uint32_t>(options->heartbeat_ms);
    if (options->heartbeat_timeout_ms > 0) o.heartbeat_timeout_ms = static_cast<uint32_t>(options->heartbeat_timeout_ms);
    o.progress_interval_ms = 0;
    if (options->tcp_endpoint != nullptr) o.tcp_endpoint = options->tcp_endpoint;
    if (options->curve_key_file != nullptr) o.curve_key_file = options->curve_key_file;
    if (options->authorized_keys_file != nullptr) o.authorized_keys_file = options->authorized_keys_file;
    o.insecure = options->insecure != 0;
    auto producer = coloader::Producer::Make(o);
    if (!producer.ok()) return Fail(producer.status());
    auto p = std::make_unique<coloader_producer>();
    p->producer = std::move(*producer);
    coloader::Producer* raw = p->producer.get();
    p->loop = std::async(std::launch::async, [raw] { return raw->Run(); });
    *out = p.release();
    return COLOADER_OK;
  });
}

const char* coloader_producer_tcp_endpoint(const coloader_producer* p) {
  return p == nullptr ? "" : p->producer->tcp_endpoint().c_str();
}

int coloader_producer_publish(coloader_producer* p, const void* data, uint32_t count, const int64_t* labels,
                              const int64_t* indices) {
  constexpr const char* kWhat = "coloader_producer_publish";
  return Guard(kWhat, [&]() -> int {
    if (p == nullptr) return NullArgument(kWhat, "producer");
    coloader::Status st = p->producer->external_source()->Publish(data, count, labels, indices);
    return st.ok() ? COLOADER_OK : Fail(st);
  });
}

int coloader_producer_end_epoch(coloader_producer* p) {
  constexpr const char* kWhat = "coloader_producer_end_epoch";
  return Guard(kWhat, [&]() -> int {
    if (p == nullptr) return NullArgument(kWhat, "producer");
    coloader::Status st = p->producer->external_source()->EndEpoch();
    return st.ok() ? COLOADER_OK : Fail(st);
  });
}

int coloader_producer_close(coloader_producer* p, int32_t timeout_ms) {
  constexpr const char* kWhat = "coloader_producer_close";
  if (p == nullptr) return COLOADER_OK;
  std::unique_ptr<coloader_producer> owned(p);
  return Guard(kWhat, [&]() -> int {
    // No more batches: the loop ends once consumers have released every published one.
    owned->producer->external_source()->Finish();
    if (timeout_ms > 0 &&
        owned->loop.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
      owned->producer->Stop();  // consumers are told; the loop returns at once
    }
    coloader::Status st = owned->loop.get();
    owned->producer.reset();
    if (st.ok() || st.code() == coloader::StatusCode::kCancelled) return COLOADER_OK;
    return Fail(st);
  });
}

}  // extern "C"
