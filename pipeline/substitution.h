// Which sample stands in for one that failed to decode, so that every batch keeps its count:
// one rule for the host pool (assemble/pool.cc) and the GPU stage (decode/gpu_decode_nvjpeg.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace coloader {

// The position whose sample takes the place of failed position `i` of a batch: the next one
// that did not fail, wrapping around; nullopt when none did. A function of which positions
// failed only, so the CPU and GPU paths agree and an epoch replays alike.
std::optional<uint32_t> ReplacementFor(uint32_t i, const std::vector<bool>& failed);

}  // namespace coloader
