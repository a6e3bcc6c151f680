#include "pipeline/decode/decode_split.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace coloader {

namespace {

// The weight of a new batch in the smoothed rates and load: about the last four batches count.
constexpr double kSmoothing = 0.25;

double Smooth(double old_value, double sample, bool first) {
  return first ? sample : old_value + kSmoothing * (sample - old_value);
}

std::string Percent(double share) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * share);
  return buf;
}

}  // namespace

Result<CpuShare> ParseCpuShare(const std::string& s) {
  if (s == "auto") return CpuShare{};
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v < 0 || v > 1) {
    return Status::Invalid("--cpu-share must be auto or a share of each batch between 0 and 1 (0: the JPEG engines "
                           "only, 1: the CPU workers only), got '" + s + "'");
  }
  return CpuShare{false, v};
}

std::string CpuShareName(const CpuShare& s) {
  if (s.adaptive) return "auto";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s.fixed);
  return buf;
}

DecodeSplit::DecodeSplit(Options o) : o_(o), share_(o.share.adaptive ? 0.0 : o.share.fixed) {}

uint32_t DecodeSplit::CpuCount(uint32_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  const double c = std::floor(share_ * n + 0.5);
  return static_cast<uint32_t>(std::min<double>(c, n));
}

double DecodeSplit::BalanceShare() const {
  // Batches go to the D decoding GPUs in turn and every worker serves them all. At a split f the
  // stage's L lanes finish L / ((1 - f) n t_e) batches a second, so the D stages together D
  // times that; the W workers W / (((1 - f) t_r + f t_c) n). Equal at this f.
  if (engine_s_ <= 0 || cpu_s_ <= 0) return 1.0;  // no rates measured yet: no cap
  const double lanes = double(o_.stages) * o_.lanes;
  const double engines = double(o_.workers) * engine_s_ - lanes * other_s_;
  if (engines <= 0) return 0.0;  // the workers cannot even read what the engines decode
  return std::clamp(engines / (engines + lanes * cpu_s_), 0.0, 1.0);
}

void DecodeSplit::Observe(const SplitMeasure& m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m.samples == 0) return;
  const double batch_share = double(m.cpu) / m.samples;
  share_sum_ += batch_share;
  ++batches_;
  if (!o_.share.adaptive) return;
  const double cycle = m.lane_busy_s + m.lane_idle_s;
  if (cycle <= 0) return;
  const double load = m.lane_busy_s / cycle;

  if (m.engine > 0) engine_s_ = Smooth(engine_s_, m.lane_busy_s / m.engine, engine_s_ <= 0);
  if (m.cpu > 0) cpu_s_ = Smooth(cpu_s_, m.cpu_s / m.cpu, cpu_s_ <= 0);
  if (m.samples > m.cpu) other_s_ = Smooth(other_s_, m.other_s / (m.samples - m.cpu), other_s_ <= 0);

  // load_ is what the lanes' load would be with every sample on the engines: how far demand
  // reaches, in units of the engines' capacity. Not measurable from a batch the CPU took nearly
  // whole.
  const bool measurable = batch_share < 0.95;
  double next;
  if (load >= o_.saturated_load) {
    // Batches wait for the lane: consumers wait for batches. Demand is at least this load
    // says (the lane could not show more), so the CPU takes a step more.
    if (measurable) load_ = std::max(load_, load / (1.0 - batch_share));
    next = share_ + o_.step;
  } else {
    // The lane had idle time, so demand is what it shows. The CPU takes what the engines
    // cannot at the target load: nothing while they can take it all.
    if (measurable) load_ = Smooth(load_, load / (1.0 - batch_share), load_ <= 0);
    next = load_ > 0 ? 1.0 - o_.target_load / load_ : 0.0;
  }
  share_ = std::clamp(next, 0.0, BalanceShare());
}

double DecodeSplit::share() const {
  std::lock_guard<std::mutex> lock(mu_);
  return share_;
}

double DecodeSplit::mean_share() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_ ? share_sum_ / batches_ : share_;
}

uint64_t DecodeSplit::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

std::string DecodeSplit::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!o_.share.adaptive) {
    if (share_ == 0) return "the JPEG engines only (--cpu-share 0)";
    return "cpu " + Percent(share_) + " of each batch (--cpu-share " + CpuShareName(o_.share) + ")";
  }
  std::string s = "cpu " + Percent(share_) + " of each batch (--cpu-share auto";
  if (engine_s_ > 0) {
    s += ": demand at " + Percent(load_) + " of the engines";
    if (cpu_s_ > 0) {
      const double cap = BalanceShare();
      s += ", cpu at most " + Percent(cap);
    }
  }
  return s + ")";
}

}  // namespace coloader
