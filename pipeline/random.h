// The project's one random generator: xoshiro256** (Blackman and Vigna, 2018) seeded through
// splitmix64. Sample orders and augmentations must be the same on every platform, compiler
// and standard library (std::shuffle and the std distributions are implementation-defined),
// so what they draw from is fixed here. Changing it changes every user's sample order and
// every augmented pixel: treat it as a file format.
#pragma once

#include <cstdint>

namespace coloader {

// One splitmix64 step: advances *state and returns a well-mixed 64-bit value. A bijection of
// the state, so distinct inputs give distinct first outputs.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Xoshiro256StarStar {
 public:
  // The caller seeds the four words (never all zero); see the sampler and SampleRng.
  Xoshiro256StarStar(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) : s_{s0, s1, s2, s3} {}

  uint64_t Next() {
    const uint64_t result = RotateLeft(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = RotateLeft(s_[3], 45);
    return result;
  }

 private:
  static uint64_t RotateLeft(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace coloader
