#include "producer/ring.h"

#include <algorithm>
#include <cassert>

namespace coloader {

RingAccounting::RingAccounting(uint32_t num_slots) : slots_(num_slots) {
  for (uint32_t i = num_slots; i > 0; --i) free_.push_back(i - 1);
}

std::optional<uint32_t> RingAccounting::Acquire() {
  if (free_.empty()) return std::nullopt;
  uint32_t s = free_.back();
  free_.pop_back();
  slots_[s].state = Slot::State::kFilling;
  return s;
}

void RingAccounting::Free(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.state == Slot::State::kPublished) slot_of_seq_.erase(s.seq);
  s.state = Slot::State::kFree;
  s.holders.clear();
  // Lowest index first keeps the hot slots few and warm in cache when consumers keep up.
  free_.insert(std::upper_bound(free_.begin(), free_.end(), slot, std::greater<uint32_t>()), slot);
}

void RingAccounting::Abandon(uint32_t slot) {
  assert(slots_[slot].state == Slot::State::kFilling);
  Free(slot);
}

void RingAccounting::Publish(uint32_t slot, uint64_t seq, const std::vector<uint64_t>& holders) {
  Slot& s = slots_[slot];
  assert(s.state == Slot::State::kFilling);
  s.state = Slot::State::kPublished;
  s.seq = seq;
  s.holders = holders;
  slot_of_seq_[seq] = slot;
  if (s.holders.empty()) Free(slot);
}

bool RingAccounting::Release(uint64_t consumer, uint64_t seq) {
  auto it = slot_of_seq_.find(seq);
  if (it == slot_of_seq_.end()) return false;
  uint32_t slot = it->second;
  auto& h = slots_[slot].holders;
  auto pos = std::find(h.begin(), h.end(), consumer);
  if (pos == h.end()) return false;
  h.erase(pos);
  if (h.empty()) Free(slot);
  return true;
}

uint32_t RingAccounting::DropConsumer(uint64_t consumer) {
  uint32_t dropped = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state != Slot::State::kPublished) continue;
    auto& h = slots_[i].holders;
    auto pos = std::find(h.begin(), h.end(), consumer);
    if (pos == h.end()) continue;
    h.erase(pos);
    ++dropped;
    if (h.empty()) Free(i);
  }
  return dropped;
}

uint32_t RingAccounting::HeldBy(uint64_t consumer) const {
  uint32_t n = 0;
  for (const Slot& s : slots_) {
    if (s.state == Slot::State::kPublished &&
        std::find(s.holders.begin(), s.holders.end(), consumer) != s.holders.end())
      ++n;
  }
  return n;
}

std::optional<uint64_t> RingAccounting::OldestHeldBy(uint64_t consumer) const {
  std::optional<uint64_t> oldest;
  for (const Slot& s : slots_) {
    if (s.state == Slot::State::kPublished &&
        std::find(s.holders.begin(), s.holders.end(), consumer) != s.holders.end() &&
        (!oldest || s.seq < *oldest))
      oldest = s.seq;
  }
  return oldest;
}

std::vector<RingAccounting::Held> RingAccounting::Published() const {
  std::vector<Held> out;
  for (const Slot& s : slots_)
    if (s.state == Slot::State::kPublished) out.push_back({s.seq, s.holders});
  std::sort(out.begin(), out.end(), [](const Held& a, const Held& b) { return a.seq < b.seq; });
  return out;
}

}  // namespace coloader
