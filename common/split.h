// The split rule of a consumer group: which positions of an epoch each of W members takes,
// batch by batch. A pure function of (range, W, rank, batch size, drop_last): every member
// computes its own share from the same numbers, so the members agree without talking, and a
// restarted member computes the same share again.
//
// Positions are those of the producer's per-epoch order (a function of seed and epoch only).
// A group that starts at the epoch's beginning splits [0, N); one that joins mid-epoch at
// position P splits the rest, [P, N). With n = end - begin samples in the range:
//
//   T = ceil(n / W) per member (DistributedSampler's padding), or floor(n / W) with drop_last.
//   Virtual positions v in [0, W*T) are dealt out: R = floor(T / b) full rounds, block k of b
//   to member k % W (so each member batch is contiguous in the stream), then a tail round
//   where member r takes [R*W*b + r*t, R*W*b + (r+1)*t), t = T - R*b < b. Without drop_last
//   the last batch is the short tail: batches = ceil(T / b); drop_last drops it: floor(T / b).
//   v < n is position begin + v. The W*T - n < W virtual positions past the range wrap into
//   the last round, [F, end) with F = begin + (batches - 1)*W*b: samples every member passes
//   at the epoch's end anyway and keeps a copy of as it does, and that a group resumed at any
//   round is served again. (DistributedSampler repeats the permutation's first samples; here
//   they would be long gone when the tail comes, and after a restart.)
//
// Every member gets T samples (drop_last: floor(T/b)*b) and the same number of batches; over
// all members every position of the range is taken once, plus fewer than W repeats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace coloader {

struct SplitSpec {
  uint64_t begin = 0;  // the first position of the range this group splits
  uint64_t end = 0;    // one past the last (the epoch's sample count)
  uint32_t world_size = 1;
  uint32_t rank = 0;
  uint32_t batch_size = 1;
  bool drop_last = false;
};

// A run of consecutive positions [begin, end).
struct Segment {
  uint64_t begin = 0, end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const Segment& o) const { return begin == o.begin && end == o.end; }
};

struct SplitPlan {
  uint64_t per_rank = 0;     // T: samples each member gets
  uint64_t rounds = 0;       // R: full rounds of W blocks of b
  uint64_t tail = 0;         // t: samples in each member's tail batch (0 with drop_last)
  uint64_t batches = 0;      // batches each member gets
  uint64_t wrap_begin = 0;   // F: wrapped positions fall in [F, end), the last round
};

// Checks the spec (W >= 1, rank < W, b >= 1, begin <= end) and computes the plan.
Result<SplitPlan> PlanSplit(const SplitSpec& spec);

// The plan of a saved position (a Loader's state: its split of epoch `epoch` and the `samples`
// a rank had taken of it), refused when it cannot be a position in this epoch of `spec.end`
// samples: its split beginning at or past the end, or more samples taken than a rank's share.
// Both `serve --resume` and a Loader's load_state_dict check a state so.
Result<SplitPlan> PlanSavedPosition(const SplitSpec& spec, uint64_t epoch, uint64_t samples);

// The positions of batch k (< plan.batches) of spec.rank, in the order the batch holds them.
// Every segment lies within [spec.begin, spec.end). A segment that starts before an earlier
// one of the same batch is a wrapped (padding) run.
std::vector<Segment> BatchSegments(const SplitSpec& spec, const SplitPlan& plan, uint64_t k);

// The positions spec.rank takes a second time as padding, in [wrap_begin, end): the member
// keeps a copy of each as the stream passes it. Empty with drop_last or no padding. Only the
// member's last batch holds them, after its positions from the stream.
std::vector<Segment> PaddingSegments(const SplitSpec& spec, const SplitPlan& plan);

// How many batches a member has taken when it has taken `samples` samples of its share: whole
// batches, and all of them once it has its share (the tail batch is short).
uint64_t BatchesTaken(const SplitSpec& spec, const SplitPlan& plan, uint64_t samples);

// The first position of the round holding each member's batch k: where a group resumes after
// its members have each taken k batches. Positions before it are never needed again.
uint64_t ResumePosition(const SplitSpec& spec, const SplitPlan& plan, uint64_t k);

}  // namespace coloader
