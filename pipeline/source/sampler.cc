#include "pipeline/source/sampler.h"

#include <string>
#include <utility>

#include "pipeline/random.h"

namespace coloader {

namespace {

// The permutation must be the same on every platform, compiler and standard library, so that
// a run can be reproduced from (seed, epoch) alone: std::shuffle and the std distributions
// are implementation-defined. Everything below is fixed and documented instead:
//
//   generator:  xoshiro256** (pipeline/random.h), a 64-bit generator with 256 bits of state and
//               good statistical quality;
//   seeding:    with a0, a1 the first two outputs of splitmix64 started at `seed` and b0, b1
//               those started at `epoch`, state = {a0, a1 ^ b1, b0, b1}. splitmix64's output is
//               a bijection of its input, so a0 and b0 alone already tell (seed, epoch) apart:
//               different pairs always give different states (unlike torch's seed + epoch,
//               where (0, 1) and (1, 0) coincide). The state is never all zero (a0 = b0 = 0
//               forces b1 != 0);
//   bounded:    Lemire's multiply-and-reject method ("Fast Random Integer Generation in an
//               Interval", 2019), exactly unbiased;
//   shuffle:    Fisher-Yates from the last position down: for i = n-1 .. 1, swap a[i] with
//               a[j], j uniform in [0, i].
//
// Changing any of these changes every user's sample order: treat them as a file format.

// See the seeding note above. s[0] and s[2] carry seed and epoch alone, which keeps the
// mapping injective; s[1] mixes both, because xoshiro256**'s first output is a function of
// s[1] only (with s[1] from the seed alone, the first Fisher-Yates draw, i.e. the last
// position of every epoch, would be the same in every epoch).
class EpochRng {
 public:
  EpochRng(uint64_t seed, uint64_t epoch) : gen_(Seeded(seed, epoch)) {}

  uint64_t Next() { return gen_.Next(); }

  // Uniform in [0, range), range > 0. The high half of Next() * range is the candidate; the
  // low half tells whether it fell into the few values that would over-represent some
  // results, and only then is it drawn again (rarely: with probability < range / 2^64).
  uint64_t Below(uint64_t range) {
    // GCC/Clang 128-bit integer; __extension__ keeps -Wpedantic quiet about it.
    __extension__ using Wide = unsigned __int128;
    Wide product = static_cast<Wide>(Next()) * range;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < range) {
      const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
      while (low < threshold) {
        product = static_cast<Wide>(Next()) * range;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  static Xoshiro256StarStar Seeded(uint64_t seed, uint64_t epoch) {
    const uint64_t a0 = SplitMix64(&seed);
    const uint64_t a1 = SplitMix64(&seed);
    const uint64_t b0 = SplitMix64(&epoch);
    const uint64_t b1 = SplitMix64(&epoch);
    return Xoshiro256StarStar(a0, a1 ^ b1, b0, b1);
  }
  Xoshiro256StarStar gen_;
};

// Fisher-Yates over [begin, end) of `v`, as described above.
template <typename T>
void Shuffle(std::vector<T>* v, size_t begin, size_t end, EpochRng* rng) {
  for (size_t i = end - 1; i > begin; --i) {
    const size_t j = begin + static_cast<size_t>(rng->Below(static_cast<uint64_t>(i - begin) + 1));
    std::swap((*v)[i], (*v)[j]);
  }
}

}  // namespace

Result<Sampler> Sampler::Make(size_t dataset_size, SamplerOptions opts) {
  if (dataset_size == 0) return Status::Invalid("dataset is empty: there is nothing to sample");
  if (opts.world_size < 1) {
    return Status::Invalid("world_size must be at least 1, got " +
                           std::to_string(opts.world_size));
  }
  if (opts.rank < 0 || opts.rank >= opts.world_size) {
    return Status::Invalid("rank " + std::to_string(opts.rank) + " is outside [0, " +
                           std::to_string(opts.world_size) + "); ranks count from 0 to " +
                           "world_size - 1");
  }
  // DistributedSampler: with drop_last and a tail that does not divide evenly, every rank
  // takes floor(N / W) and the tail is cut; otherwise ceil(N / W) and the shortfall is padded.
  const size_t world = static_cast<size_t>(opts.world_size);
  const size_t epoch_size = (opts.drop_last && dataset_size % world != 0)
                                ? dataset_size / world
                                : (dataset_size + world - 1) / world;
  if (epoch_size == 0) {
    // torch allows this and hands every rank an empty epoch; a producer with nothing to
    // produce would only leave its consumers waiting, so say so up front.
    return Status::Invalid("drop_last with " + std::to_string(dataset_size) +
                           " samples over world_size " + std::to_string(opts.world_size) +
                           " leaves every rank with no samples; turn drop_last off or use " +
                           "fewer ranks");
  }
  if (!opts.blocks.empty()) {
    uint64_t total = 0;
    for (uint64_t b : opts.blocks) total += b;
    if (total != dataset_size)
      return Status::Internal("sampler blocks sum to " + std::to_string(total) + ", not the dataset's " +
                              std::to_string(dataset_size));
  }
  return Sampler(dataset_size, opts, epoch_size);
}

std::vector<int64_t> Sampler::EpochIndices(uint64_t epoch) const {
  const size_t n = dataset_size_;
  std::vector<int64_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int64_t>(i);
  if (opts_.shuffle && opts_.blocks.empty()) {
    EpochRng rng(opts_.seed, epoch);
    Shuffle(&order, 0, n, &rng);
  } else if (opts_.shuffle) {
    // The blocks in a permutation, then each block's indices in one, from the same generator.
    EpochRng rng(opts_.seed, epoch);
    std::vector<size_t> blocks(opts_.blocks.size());
    std::vector<size_t> first(opts_.blocks.size() + 1, 0);
    for (size_t b = 0; b < blocks.size(); ++b) {
      blocks[b] = b;
      first[b + 1] = first[b] + opts_.blocks[b];
    }
    if (blocks.size() > 1) Shuffle(&blocks, 0, blocks.size(), &rng);
    size_t at = 0;
    for (size_t b : blocks) {
      const size_t start = at;
      for (size_t i = first[b]; i < first[b + 1]; ++i) order[at++] = static_cast<int64_t>(i);
      if (at - start > 1) Shuffle(&order, start, at, &rng);
    }
  }
  if (opts_.world_size == 1) return order;  // epoch_size_ == n: the whole permutation

  // DistributedSampler pads the order to total = epoch_size * world by repeating it from the
  // start (as many times as needed), or cuts it to total, and rank r takes positions
  // r, r + W, r + 2W, ... Position k of the padded order is order[k % n], so the padded list
  // never needs to be built. With blocks, rank r takes the stretch [r * E, (r + 1) * E) of the
  // padded order instead: the same counts and the same union, but each node then reads about
  // 1/W of the shards (whole, plus a part of at most two at its stretch's ends) where striding
  // would have every node fetch every shard.
  const size_t world = static_cast<size_t>(opts_.world_size);
  const size_t rank = static_cast<size_t>(opts_.rank);
  std::vector<int64_t> mine(epoch_size_);
  if (opts_.blocks.empty()) {
    for (size_t i = 0; i < epoch_size_; ++i) mine[i] = order[(rank + i * world) % n];
  } else {
    for (size_t i = 0; i < epoch_size_; ++i) mine[i] = order[(rank * epoch_size_ + i) % n];
  }
  return mine;
}

}  // namespace coloader
