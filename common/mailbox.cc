#include "common/mailbox.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace coloader {

namespace {

// Shared (not FUTEX_PRIVATE): the word lives in memory mapped by two processes.
void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace

void Mailbox::Reset(uint64_t owner) {
  // Owner first, then a head of the next generation: an old owner that reads the new head reads
  // the new owner after it (all sequentially consistent), and one that read the old head fails
  // its swap. The ring looks non-empty between the two stores below, but nobody may pop then:
  // the old owner is refused, and the new one has not been told of the mailbox yet.
  h_->owner.store(owner);
  const uint64_t generation = (h_->head.load() >> kHeadBits) + 1;
  h_->head.store(generation << kHeadBits);
  h_->tail.store(0);
  Wake();  // a previous owner still waiting here re-checks, sees it is no longer its own
}

bool Mailbox::Push(const BatchAnnouncement& a) {
  const uint64_t tail = h_->tail.load();
  if (tail - (h_->head.load() & kHeadMask) >= capacity_) return false;
  entries_[tail % capacity_].Store(a);
  h_->tail.store(tail + 1);
  h_->doorbell.fetch_add(1);
  if (h_->sleeping.load()) FutexWake(&h_->doorbell);
  return true;
}

std::optional<uint64_t> Mailbox::TakeBack() {
  // Only the producer writes `tail`, so it stands still here; the consumer may be inside Pop,
  // and one of the two swaps below and in Pop fails: the loser reads the head again.
  const uint64_t tail = h_->tail.load();
  uint64_t head = h_->head.load();
  for (;;) {
    const uint64_t taken = head & kHeadMask;
    if (taken == tail) return std::nullopt;
    if (h_->head.compare_exchange_strong(head, (head & ~kHeadMask) | tail)) return taken;
  }
}

void Mailbox::Wake() {
  h_->doorbell.fetch_add(1);
  FutexWake(&h_->doorbell);
}

std::optional<BatchAnnouncement> Mailbox::Pop(uint64_t owner) {
  uint64_t head = h_->head.load();
  if (h_->owner.load() != owner) return std::nullopt;  // read after head: see Reset
  const uint64_t taken = head & kHeadMask;
  if (taken == h_->tail.load()) return std::nullopt;
  const BatchAnnouncement a = entries_[taken % capacity_].Load();
  // Only if nothing was handed over meanwhile (the generation): else the entry read may be
  // the next owner's, and it is left to it.
  if (!h_->head.compare_exchange_strong(head, head + 1)) return std::nullopt;
  return a;
}

bool Mailbox::Empty() const { return (h_->head.load() & kHeadMask) == h_->tail.load(); }

void Mailbox::Wait(uint32_t seen, int timeout_ms) {
  h_->sleeping.store(1);
  if (Empty() && h_->doorbell.load() == seen) FutexWait(&h_->doorbell, seen, timeout_ms);
  h_->sleeping.store(0);
}

uint64_t MailboxArea::BytesFor(uint32_t count, uint32_t capacity) {
  return uint64_t{count} * (sizeof(MailboxHeader) + uint64_t{capacity} * sizeof(MailboxEntry));
}

Result<MailboxArea> MailboxArea::Create(const std::string& name, uint32_t count, uint32_t capacity,
                                        bool* no_space) {
  MailboxArea a;
  COLOADER_ASSIGN_OR_RETURN(a.shm_, SharedMemory::Create(name, BytesFor(count, capacity), {}, no_space));
  a.count_ = count;
  a.capacity_ = capacity;
  return a;  // fresh shared memory is zero: every mailbox is free and empty
}

Result<MailboxArea> MailboxArea::Open(const std::string& name, uint32_t count, uint32_t capacity) {
  MailboxArea a;
  COLOADER_ASSIGN_OR_RETURN(a.shm_, SharedMemory::Open(name, BytesFor(count, capacity), true));
  a.count_ = count;
  a.capacity_ = capacity;
  return a;
}

Mailbox MailboxArea::at(uint32_t i) const {
  uint8_t* base = shm_.data() + uint64_t{i} * (sizeof(MailboxHeader) + uint64_t{capacity_} * sizeof(MailboxEntry));
  return Mailbox(reinterpret_cast<MailboxHeader*>(base), reinterpret_cast<MailboxEntry*>(base + sizeof(MailboxHeader)),
                 capacity_);
}

}  // namespace coloader
