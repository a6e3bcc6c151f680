// The C ABI of the producer fed by the caller (producer/c_api.h) over coloader::Producer with
// an ExternalSource. Every exported function runs its body inside Guard()
// (common/c_abi_internal.h): nothing unwinds into C or Python.
#include "producer/c_api.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <utility>

#include "common/c_abi_internal.h"
#include "common/log.h"
#include "producer/external_source.h"
#include "producer/producer.h"

struct coloader_producer {
  std::unique_ptr<coloader::Producer> producer;
  std::future<coloader::Result<coloader::Producer::RunEnd>> loop;  // the session loop, on a thread of its own
};

using coloader::c_abi::Fail;
using coloader::c_abi::Guard;
using coloader::c_abi::NullArgument;
using coloader::c_abi::SetError;

extern "C" {

const char* coloader_producer_last_error(void) { return coloader::c_abi::LastError().c_str(); }

void coloader_producer_set_log_handler(coloader_log_handler handler, void* user) {
  coloader::SetLogHandler(handler, user);
}

size_t coloader_producer_struct_size(const char* name) {
  if (name == nullptr) return 0;
  if (std::strcmp(name, "producer_options") == 0) return sizeof(coloader_producer_options);
  if (std::strcmp(name, "field") == 0) return sizeof(coloader_field);
  return 0;
}

int coloader_producer_open(const coloader_producer_options* options, coloader_producer** out) {
  constexpr const char* kWhat = "coloader_producer_open";
  return Guard(kWhat, [&]() -> int {
    if (out == nullptr) return NullArgument(kWhat, "out");
    *out = nullptr;
    if (options == nullptr) return NullArgument(kWhat, "options");
    if (options->name == nullptr) return NullArgument(kWhat, "options->name");
    if (options->fields == nullptr && options->num_fields > 0) return NullArgument(kWhat, "options->fields");
    coloader::ProducerOptions o;
    o.name = options->name;
    coloader::ExternalOptions& e = o.external.emplace();
    o.batch_size = options->batch_size;
    if (options->num_fields > coloader::kMaxFields) {
      return SetError(COLOADER_E_INVALID, std::string(kWhat) + ": a batch of " + std::to_string(options->num_fields) +
                                              " tensors (at most " + std::to_string(coloader::kMaxFields) + ")");
    }
    for (uint32_t i = 0; i < options->num_fields; ++i) {
      const coloader_field& f = options->fields[i];
      const std::string field = std::string(kWhat) + ": field " + std::to_string(i) + " (" + (f.path ? f.path : "") + ")";
      if (f.ndim > COLOADER_MAX_FIELD_DIMS)
        return SetError(COLOADER_E_INVALID, field + " has " + std::to_string(f.ndim) + " dimensions per sample (at most 8)");
      if (f.dtype > static_cast<uint32_t>(coloader::kLastDType))
        return SetError(COLOADER_E_INVALID, field + " has an unknown dtype code " + std::to_string(f.dtype));
      if (f.flags & ~static_cast<uint32_t>(coloader::kKnownFieldFlags))
        return SetError(COLOADER_E_INVALID, field + " has unknown flags " + std::to_string(f.flags));
      coloader::FieldSpec spec;
      spec.flags = static_cast<uint8_t>(f.flags);
      spec.path = f.path != nullptr ? f.path : "";
      spec.dtype = static_cast<coloader::DType>(f.dtype);
      spec.shape.assign(f.shape, f.shape + f.ndim);
      e.fields.push_back(std::move(spec));
    }
    if (options->structure != nullptr) e.structure = options->structure;
    if (options->on_device != 0) {
      if (options->device < 0)
        return SetError(COLOADER_E_INVALID, std::string(kWhat) + ": CUDA device " + std::to_string(options->device));
      o.devices = {options->device};
    }
    o.window = options->window ? options->window : 4;
    o.min_consumers = options->min_consumers ? options->min_consumers : 1;
    e.epoch_samples = options->epoch_samples;
    o.forever = true;  // the caller decides when it is over (coloader_producer_close)
    if (options->heartbeat_ms > 0) o.heartbeat_ms = static_cast<uint32_t>(options->heartbeat_ms);
    if (options->heartbeat_timeout_ms > 0) o.heartbeat_timeout_ms = static_cast<uint32_t>(options->heartbeat_timeout_ms);
    o.progress_interval_ms = 0;
    if (options->tcp_endpoint != nullptr) o.tcp_endpoint = options->tcp_endpoint;
    if (options->curve_key_file != nullptr) o.curve_key_file = options->curve_key_file;
    if (options->authorized_keys_file != nullptr) o.authorized_keys_file = options->authorized_keys_file;
    o.insecure = options->insecure != 0;
    o.alone_timeout_ms = options->alone_timeout_ms > 0 ? static_cast<uint32_t>(options->alone_timeout_ms) : 0;
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

int coloader_producer_wait(coloader_producer* p, int32_t timeout_ms) {
  constexpr const char* kWhat = "coloader_producer_wait";
  return Guard(kWhat, [&]() -> int {
    if (p == nullptr) return NullArgument(kWhat, "producer");
    auto slot = p->producer->external_source()->WaitForSlot(std::max(0, timeout_ms));
    if (!slot.ok()) return Fail(slot.status());
    if (!slot->ready()) return COLOADER_AGAIN;
    return **slot ? COLOADER_OK : COLOADER_END;  // false: the consumers all left
  });
}

int coloader_producer_publish(coloader_producer* p, const void* const* fields, uint32_t count, const int64_t* indices) {
  constexpr const char* kWhat = "coloader_producer_publish";
  return Guard(kWhat, [&]() -> int {
    if (p == nullptr) return NullArgument(kWhat, "producer");
    coloader::Result<bool> published = p->producer->external_source()->Publish(fields, count, indices);
    if (!published.ok()) return Fail(published.status());
    return *published ? COLOADER_OK : COLOADER_END;  // false: the consumers all left
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

int coloader_producer_fail(coloader_producer* p, const char* why) {
  constexpr const char* kWhat = "coloader_producer_fail";
  return Guard(kWhat, [&]() -> int {
    if (p == nullptr) return NullArgument(kWhat, "producer");
    const std::string reason = why != nullptr && *why ? why : "its caller gave no reason";
    p->producer->external_source()->Fail("the producer's data failed: " + reason);
    return COLOADER_OK;
  });
}

int coloader_producer_finish(coloader_producer* p, int32_t timeout_ms) {
  constexpr const char* kWhat = "coloader_producer_finish";
  return Guard(kWhat, [&]() -> int {
    if (p == nullptr) return NullArgument(kWhat, "producer");
    p->producer->external_source()->Finish();
    const auto ready = p->loop.wait_for(std::chrono::milliseconds(std::max(0, timeout_ms)));
    return ready == std::future_status::ready ? COLOADER_OK : COLOADER_AGAIN;
  });
}

int coloader_producer_close(coloader_producer* p, int32_t timeout_ms) {
  constexpr const char* kWhat = "coloader_producer_close";
  if (p == nullptr) return COLOADER_OK;
  std::unique_ptr<coloader_producer> owned(p);
  return Guard(kWhat, [&]() -> int {
    // No more batches: the loop ends once consumers have released every published one.
    owned->producer->external_source()->Finish();
    bool cut = false;
    if (timeout_ms > 0 &&
        owned->loop.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
      owned->producer->Stop();  // consumers are told; the loop returns at once
      cut = true;
    }
    coloader::Result<coloader::Producer::RunEnd> end = owned->loop.get();
    owned->producer.reset();
    const coloader::StatusCode code = end.status().code();
    if (cut && code == coloader::StatusCode::kCancelled)
      return SetError(COLOADER_E_TIMEOUT, std::string(kWhat) + ": the consumers had not released every batch after " +
                                              std::to_string(timeout_ms) + " ms; they were told the producer stopped");
    if (code == coloader::StatusCode::kCancelled) return COLOADER_OK;
    if (!end.ok()) return Fail(end.status());
    // The consumers all left (the producer's log says how far the run got).
    return *end == coloader::Producer::RunEnd::kConsumersLeft ? COLOADER_END : COLOADER_OK;
  });
}

}  // extern "C"
