// Slot accounting of the producer's ring: which slots are free, being filled, or published
// and held by which consumers. No memory, no sockets: the rules alone, so they can be tested
// one by one.
//
// A slot is reused only when every consumer it was announced to has acked it or has been
// dropped. The producer can therefore never be more than num_slots batches ahead of the
// slowest live consumer, and never overwrites what a live consumer still reads.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace coloader {

class RingAccounting {
 public:
  explicit RingAccounting(uint32_t num_slots);

  uint32_t num_slots() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t free_slots() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t in_use() const { return num_slots() - free_slots(); }

  // Takes a free slot to fill, lowest index first; nullopt when all are in use.
  std::optional<uint32_t> Acquire();
  // Gives back a slot taken by Acquire but never published (e.g. on shutdown).
  void Abandon(uint32_t slot);
  // Marks `slot` as holding batch `seq`, announced to `holders`. With no holders the slot is
  // free again at once.
  void Publish(uint32_t slot, uint64_t seq, const std::vector<uint64_t>& holders);
  // A consumer is done with batch `seq`. False if it did not hold it (unknown seq, or acked
  // twice): the caller treats that as a protocol violation.
  bool Release(uint64_t consumer, uint64_t seq);
  // Releases everything `consumer` holds (it died or was detached). Returns how many.
  uint32_t DropConsumer(uint64_t consumer);

  // Batches `consumer` holds now, and the oldest of them.
  uint32_t HeldBy(uint64_t consumer) const;
  std::optional<uint64_t> OldestHeldBy(uint64_t consumer) const;
  // The published batches, oldest first, with who holds each.
  struct Held {
    uint64_t seq;
    std::vector<uint64_t> holders;
  };
  std::vector<Held> Published() const;

 private:
  struct Slot {
    enum class State { kFree, kFilling, kPublished } state = State::kFree;
    uint64_t seq = 0;
    std::vector<uint64_t> holders;
  };
  void Free(uint32_t slot);

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;  // kept sorted descending; back() is the lowest index
  std::unordered_map<uint64_t, uint32_t> slot_of_seq_;
};

}  // namespace coloader
