// Per-consumer announcement mailboxes in shared memory, with a futex doorbell.
//
// ZeroMQ carries the conversation (handshake, acks, heartbeats, goodbyes), but a message
// through it crosses four threads (the producer's, libzmq's I/O thread on each side, the
// consumer's I/O thread) before the waiting training thread wakes: ~150 us on the GPU machine.
// The announcement of a ready batch is on the critical path of every step, so it takes a
// shorter road: the producer writes it into the consumer's single-producer/single-consumer
// ring here and, if the consumer sleeps, wakes it with one FUTEX_WAKE. One hop.
//
// Lost wake-ups are excluded Dekker-style: the consumer raises `sleeping` then re-checks the
// ring before sleeping on `doorbell`; the producer publishes `tail` then rings `doorbell`
// and wakes if `sleeping`. All of it sequentially consistent.
//
// A mailbox is handed to a new owner while the old one (detached, but still running) may be
// inside Pop. `head` therefore carries the handover's generation in its top bits, and Pop takes
// an entry by a compare-and-swap of the whole word: after a Reset the old owner's swap fails,
// so it can neither take the new owner's entries nor write back a head from before it.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "common/protocol.h"
#include "common/shm.h"
#include "common/status.h"

namespace coloader {

// An entry holds the announcement's bytes (both sides are one build: the handshake checks the
// protocol version) as atomic words. A stale owner inside Pop may read an entry while the
// producer rewrites it for the next owner; the words make that read defined (it is then
// discarded: Pop's compare-and-swap fails), and the tail's store and load order the rest.
struct MailboxEntry {
  static constexpr size_t kWords = (sizeof(BatchAnnouncement) + 7) / 8;
  std::atomic<uint64_t> words[kWords];

  void Store(const BatchAnnouncement& a) {
    uint64_t w[kWords] = {};
    std::memcpy(w, &a, sizeof(a));
    for (size_t i = 0; i < kWords; ++i) words[i].store(w[i], std::memory_order_relaxed);
  }
  BatchAnnouncement Load() const {
    uint64_t w[kWords];
    for (size_t i = 0; i < kWords; ++i) w[i] = words[i].load(std::memory_order_relaxed);
    BatchAnnouncement a;
    std::memcpy(&a, w, sizeof(a));
    return a;
  }
};
static_assert(std::is_trivially_copyable_v<BatchAnnouncement>, "an announcement is copied through shared memory");

// The low bits of MailboxHeader::head count entries taken; the high ones are the generation,
// advanced by every Reset.
inline constexpr int kHeadBits = 48;
inline constexpr uint64_t kHeadMask = (uint64_t{1} << kHeadBits) - 1;

struct alignas(64) MailboxHeader {
  std::atomic<uint64_t> owner;     // consumer id this mailbox serves now (0: free)
  std::atomic<uint64_t> tail;      // written by the producer: entries pushed
  std::atomic<uint32_t> doorbell;  // futex word, bumped on every push and every Wake
  std::atomic<uint32_t> sleeping;  // the consumer is (about to be) waiting on `doorbell`
  char pad0[64 - 24];
  std::atomic<uint64_t> head;      // the consumer's: generation << kHeadBits | entries taken
  char pad1[64 - 8];
};
static_assert(sizeof(MailboxHeader) == 128, "one cache line each for the two writers");
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the mailbox is shared between processes: its atomics must be lock-free");

// One mailbox, a view into the shared area.
class Mailbox {
 public:
  Mailbox(MailboxHeader* h, MailboxEntry* entries, uint32_t capacity)
      : h_(h), entries_(entries), capacity_(capacity) {}

  // Producer side.
  void Reset(uint64_t owner);
  bool Push(const BatchAnnouncement& a);  // false if full (the consumer is not taking)
  // Either side: make a waiter re-check (the I/O thread does it for goodbyes and errors).
  void Wake();

  // Consumer side.
  std::optional<BatchAnnouncement> Pop(uint64_t owner);
  bool Empty() const;
  uint32_t doorbell() const { return h_->doorbell.load(); }
  // Sleeps until the doorbell moves from `seen`, or `timeout_ms` passes; re-checks first.
  void Wait(uint32_t seen, int timeout_ms);
  bool Owned(uint64_t owner) const { return h_->owner.load() == owner; }
  // Entries the consumer has taken since Reset: how far it has read (the producer reads it).
  uint64_t taken() const { return h_->head.load() & kHeadMask; }

 private:
  MailboxHeader* h_;
  MailboxEntry* entries_;
  uint32_t capacity_;
};

// All mailboxes of one producer: a shared-memory object next to the ring, read-write for
// both sides (the ring itself is read-only to consumers).
class MailboxArea {
 public:
  static uint64_t BytesFor(uint32_t count, uint32_t capacity);
  // Reserves all of its space (SharedMemory::Create); *no_space as there.
  static Result<MailboxArea> Create(const std::string& name, uint32_t count, uint32_t capacity,
                                    bool* no_space = nullptr);
  static Result<MailboxArea> Open(const std::string& name, uint32_t count, uint32_t capacity);
  MailboxArea() = default;

  Mailbox at(uint32_t i) const;
  uint32_t count() const { return count_; }
  uint32_t capacity() const { return capacity_; }
  const std::string& name() const { return shm_.name(); }

 private:
  SharedMemory shm_;
  uint32_t count_ = 0, capacity_ = 0;
};

}  // namespace coloader
