// The producer: one process that reads, decodes and augments every batch once and serves it
// to any number of consumers through a ring of shared-memory slots and one ZeroMQ ROUTER.
//
// Threads: the caller's thread runs the session loop (socket, consumer liveness, ring
// accounting, publishing in order); a BatchSource fills slots (batch_source.h: the decode
// pipeline's workers, or the caller's thread). Nothing else touches the socket.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "producer/options.h"

namespace coloader {

class ExternalSource;

class Producer {
 public:
  // Validates the options, opens the dataset, claims the name, creates the ring and binds
  // the socket. Every failure is a Status naming the value or path at fault.
  static Result<std::unique_ptr<Producer>> Make(ProducerOptions opts);
  ~Producer();

  // How a run that was not stopped and did not fail ended.
  enum class RunEnd {
    kDelivered,      // every epoch delivered (and released), or the caller's Finish() reached
    kConsumersLeft,  // every consumer left and none came back within alone_timeout_ms
  };
  // Serves until every epoch is delivered and released, or Stop() is called (kCancelled).
  // Returns an error when --on-bad-file fail met a bad file, the caller's data failed, ...
  Result<RunEnd> Run();
  // Async-signal-safe: asks Run() to tell the consumers and return. `why` (a string literal,
  // e.g. "SIGTERM") is what the consumers are told the stop came from.
  void Stop(const char* why = "a request");

  const std::string& endpoint() const;
  // The tcp:// endpoint as bound (a port of 0 or * resolved); empty without one.
  const std::string& tcp_endpoint() const;
  // With options.external: where the caller publishes batches (owned by the producer).
  ExternalSource* external_source() const;

 private:
  struct Impl;
  explicit Producer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace coloader
