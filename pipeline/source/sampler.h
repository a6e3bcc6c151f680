// Which dataset indices an epoch visits, in which order: a seeded permutation per epoch (or
// sequential), optionally sharded by rank/world_size with the semantics of torch's
// DistributedSampler (pad by wrapping around so every rank gets the same count, or with
// drop_last cut the tail so that no index repeats).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace coloader {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool drop_last = false;  // DistributedSampler's drop_last (only matters for world_size > 1)
  // Streamed shards: the sizes of the consecutive index blocks (one per shard, summing to the
  // dataset's size) that are read as wholes. Shuffling then permutes the blocks and the indices
  // within each block, so an epoch reads each shard once, in one stretch; with world_size > 1,
  // each rank takes a contiguous stretch of that order, so it reads about 1/world_size of them.
  std::vector<uint64_t> blocks;
};

class Sampler {
 public:
  // Errors: empty dataset, rank outside [0, world_size), world_size < 1.
  static Result<Sampler> Make(size_t dataset_size, SamplerOptions opts);

  // Samples this rank visits per epoch.
  size_t epoch_size() const { return epoch_size_; }
  // The dataset indices of `epoch`, in order. The same (seed, epoch) gives the same list on
  // every run and platform (our own Fisher-Yates over a fixed generator, not std::shuffle).
  std::vector<int64_t> EpochIndices(uint64_t epoch) const;

 private:
  Sampler(size_t n, SamplerOptions o, size_t epoch_size)
      : dataset_size_(n), opts_(o), epoch_size_(epoch_size) {}
  size_t dataset_size_;
  SamplerOptions opts_;
  size_t epoch_size_;
};

}  // namespace coloader
