#include "common/split.h"

#include <algorithm>

namespace coloader {

Result<SplitPlan> PlanSavedPosition(const SplitSpec& spec, uint64_t epoch, uint64_t samples) {
  if (spec.begin >= spec.end) {
    return Status::Invalid("the state's epoch split begins at position " + std::to_string(spec.begin) +
                           " of an epoch of " + std::to_string(spec.end) +
                           " samples: it was saved from another dataset or shard");
  }
  Result<SplitPlan> plan = PlanSplit(spec);
  if (!plan.ok()) return Status::Invalid(plan.status().message());
  if (samples > plan->per_rank) {
    return Status::Invalid("the state has seen " + std::to_string(samples) + " samples of epoch " +
                           std::to_string(epoch) + ", but a rank's share of it is " + std::to_string(plan->per_rank) +
                           " (" + std::to_string(spec.end) + " samples, " + std::to_string(spec.world_size) +
                           " rank(s)): it was saved from another dataset or shard");
  }
  return plan;
}

Result<SplitPlan> PlanSplit(const SplitSpec& s) {
  if (s.world_size < 1) return Status::Invalid("a consumer group needs a world size of at least 1, got 0");
  if (s.rank >= s.world_size)
    return Status::Invalid("rank " + std::to_string(s.rank) + " is outside a group of " + std::to_string(s.world_size) +
                           " (ranks are 0.." + std::to_string(s.world_size - 1) + ")");
  if (s.batch_size < 1) return Status::Invalid("a consumer group needs a batch size of at least 1");
  if (s.begin > s.end)
    return Status::Invalid("split range [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ") is empty");
  const uint64_t n = s.end - s.begin, w = s.world_size, b = s.batch_size;
  SplitPlan p;
  p.per_rank = s.drop_last ? n / w : (n + w - 1) / w;
  p.rounds = p.per_rank / b;
  p.tail = s.drop_last ? 0 : p.per_rank - p.rounds * b;
  p.batches = p.rounds + (p.tail > 0 ? 1 : 0);
  if (s.drop_last) p.per_rank = p.rounds * b;  // the short last batch is dropped as well
  // (batches - 1) * W * b < W*T - W < n: the last round starts inside the range.
  p.wrap_begin = p.batches > 0 ? s.begin + (p.batches - 1) * w * b : s.begin;
  return p;
}

namespace {

// The member's virtual positions [v0, v1) as real segments, in the order they are taken:
// v < n is begin + v; past the range, they wrap into [wrap_begin, end).
void Resolve(const SplitSpec& s, const SplitPlan& p, uint64_t v0, uint64_t v1, bool wrapped_only,
             std::vector<Segment>* out) {
  const uint64_t n = s.end - s.begin;
  if (v0 < n && !wrapped_only) out->push_back({s.begin + v0, s.begin + std::min(v1, n)});
  uint64_t o = std::max(v0, n) - n;  // offset past the range
  const uint64_t o1 = v1 > n ? v1 - n : 0;
  const uint64_t len = s.end - p.wrap_begin;  // > 0 whenever anything wraps
  while (o < o1) {
    const uint64_t at = o % len;
    const uint64_t run = std::min(o1 - o, len - at);
    out->push_back({p.wrap_begin + at, p.wrap_begin + at + run});
    o += run;
  }
}

// Virtual positions of batch k.
std::pair<uint64_t, uint64_t> Virtual(const SplitSpec& s, const SplitPlan& p, uint64_t k) {
  const uint64_t w = s.world_size, b = s.batch_size;
  if (k < p.rounds) return {(k * w + s.rank) * b, (k * w + s.rank + 1) * b};
  const uint64_t v0 = p.rounds * w * b + s.rank * p.tail;
  return {v0, v0 + p.tail};
}

}  // namespace

std::vector<Segment> BatchSegments(const SplitSpec& s, const SplitPlan& p, uint64_t k) {
  std::vector<Segment> out;
  if (k >= p.batches) return out;
  auto [v0, v1] = Virtual(s, p, k);
  Resolve(s, p, v0, v1, false, &out);
  return out;
}

std::vector<Segment> PaddingSegments(const SplitSpec& s, const SplitPlan& p) {
  std::vector<Segment> out;
  for (uint64_t k = 0; k < p.batches; ++k) {
    auto [v0, v1] = Virtual(s, p, k);
    Resolve(s, p, v0, v1, true, &out);
  }
  return out;
}

uint64_t BatchesTaken(const SplitSpec& spec, const SplitPlan& plan, uint64_t samples) {
  const uint64_t share = plan.rounds * spec.batch_size + plan.tail;  // what the batches hold
  return samples >= share ? plan.batches : samples / spec.batch_size;
}

uint64_t ResumePosition(const SplitSpec& s, const SplitPlan& p, uint64_t k) {
  return s.begin + std::min(k, p.batches > 0 ? p.batches - 1 : 0) * uint64_t{s.world_size} * s.batch_size;
}

}  // namespace coloader
