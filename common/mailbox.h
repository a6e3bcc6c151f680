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
#include <optional>
#include <string>

#include "common/protocol.h"
#include "common/shm.h"
#include "common/status.h"

namespace coloader {

// An entry is an announcement packed into six atomic words, in the layout every build of
// protocol 4 shares: seq, epoch, first, ready_ns, then slot | count << 32, flags (the rest
// zero). A stale owner inside Pop may read an entry while the producer rewrites it for the
// next owner; atomic words make that read defined (it is then discarded: Pop's
// compare-and-swap fails), and the tail's store and load order the rest.
struct MailboxEntry {
  std::atomic<uint64_t> words[6];

  void Store(const BatchAnnouncement& a) {
    const uint64_t w[6] = {a.seq, a.epoch, a.first, a.ready_ns, a.slot | uint64_t{a.count} << 32, a.flags};
    for (size_t i = 0; i < 6; ++i) words[i].store(w[i], std::memory_order_relaxed);
  }
  BatchAnnouncement Load() const {
    uint64_t w[6];
    for (size_t i = 0; i < 6; ++i) w[i] = words[i].load(std::memory_order_relaxed);
    BatchAnnouncement a;
    a.seq = w[0];
    a.epoch = w[1];
    a.first = w[2];
    a.ready_ns = w[3];
    a.slot = static_cast<uint32_t>(w[4]);
    a.count = static_cast<uint32_t>(w[4] >> 32);
    a.flags = static_cast<uint8_t>(w[5]);
    return a;
  }
};
static_assert(sizeof(MailboxEntry) == 48, "the entry layout mailboxes of protocol 4 share");

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
  // Producer side: takes back every entry the consumer has not taken, by the same
  // compare-and-swap of `head` that Pop uses, so that each entry is either taken by the
  // consumer or given back here, never both. Returns how many entries the consumer had taken
  // (those from there to the tail are back), or nullopt when it had taken them all.
  std::optional<uint64_t> TakeBack();

  // Consumer side.
  std::optional<BatchAnnouncement> Pop(uint64_t owner);
  bool Empty() const;
  uint32_t doorbell() const { return h_->doorbell.load(); }
  // Sleeps until the doorbell moves from `seen`, or `timeout_ms` passes; re-checks first.
  void Wait(uint32_t seen, int timeout_ms);
  bool Owned(uint64_t owner) const { return h_->owner.load() == owner; }
  // The consumer waits on the doorbell now (its mailbox was empty when it looked).
  bool Sleeping() const { return h_->sleeping.load() != 0; }
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
