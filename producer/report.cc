// What the producer says about itself: `coloader status` replies and the progress line.
#include "producer/producer_internal.h"

#include <unistd.h>

#include <cstdio>

namespace coloader {

StatusReply Producer::Impl::MakeStatus() const {
  StatusReply r;
  r.name = opts.name;
  r.pid = static_cast<uint32_t>(::getpid());
  const bool produced_all = AllSubmitted() && done.empty() && done_private.empty() && InFlight() == 0;
  r.state = stop_requested ? 3 : !started ? 0 : !produced_all ? 1 : ring.in_use() > 0 ? 4 : 2;
  r.epoch = published_epoch;
  r.position = published_position;
  r.epoch_samples = epoch_samples();
  r.batches_published = batches_published;
  r.samples_published = samples_published;
  r.batches_per_s = rate_batches;
  r.images_per_s = rate_images;
  r.cpu_seconds = ProcessCpuSeconds();
  r.uptime_seconds = start_ns ? static_cast<double>(MonotonicNs() - start_ns) * 1e-9 : 0.0;
  r.num_slots = ring.num_slots();
  r.slots_in_use = ring.in_use();
  r.bad_files = bad_indices.size();
  r.rejected_messages = rejected_messages;
  r.dropped_clients = dropped_clients;
  r.decode = source->DecodeSplitSummary();
  for (const auto& [identity, s] : sessions) {
    ConsumerStatus c;
    c.id = s.id;
    c.pid = s.pid;
    c.batch_size = s.batch_size;
    c.received = s.received;
    c.acked = s.acked;
    c.held = ring.HeldBy(s.id);
    auto oldest = ring.OldestHeldBy(s.id);
    c.lag = oldest && !IsPrivateSeq(*oldest) ? next_publish_seq - *oldest : 0;
    c.name = s.name;
    c.path = s.device ? static_cast<uint8_t>(1 + device_rings[s.ring]->device()) : 0;
    c.group = s.group;
    c.rank = s.rank;
    c.world_size = s.world_size;
    c.waiting = s.group_waiting ? 1 : 0;
    if (!s.pending && s.received > 0) c.unread = Unread(s);
    c.idle_ms = s.last_read_ns ? (MonotonicNs() - s.last_read_ns) / 1000000 : 0;
    r.consumers.push_back(std::move(c));
  }
  return r;
}

void Producer::Impl::ReportProgress(uint64_t now, bool final_line) {
  const double dt = static_cast<double>(now - rate_mark_ns) * 1e-9;
  if (final_line && start_ns > 0) {
    // The closing line reports the whole run, not its last moments.
    const double run = static_cast<double>(now - start_ns) * 1e-9;
    rate_batches = run > 0 ? static_cast<double>(batches_published) / run : 0;
    rate_images = run > 0 ? static_cast<double>(samples_published) / run : 0;
  } else if (dt >= 1.0) {
    rate_batches = dt > 0 ? static_cast<double>(batches_published - rate_mark_batches) / dt : 0;
    rate_images = dt > 0 ? static_cast<double>(samples_published - rate_mark_samples) / dt : 0;
    rate_mark_ns = now;
    rate_mark_batches = batches_published;
    rate_mark_samples = samples_published;
  }
  if (opts.progress_interval_ms <= 0) return;
  // On a terminal the line is redrawn every interval; in a log, one line every 10 intervals.
  const uint64_t interval = uint64_t(opts.progress_interval_ms) * 1000000 * (progress_tty ? 1 : 10);
  if (!final_line && now - last_progress_ns < interval) return;
  last_progress_ns = now;
  uint64_t slowest = 0;
  for (const auto& [id, s] : sessions) {
    auto oldest = ring.OldestHeldBy(s.id);
    if (oldest && !IsPrivateSeq(*oldest)) slowest = std::max<uint64_t>(slowest, next_publish_seq - *oldest);
  }
  // With GPU decoding, the CPU workers' share of each batch now (per decoding GPU).
  std::string split;
  for (double share : source->CpuShares()) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%s%.0f%%", split.empty() ? " | cpu share " : "/", 100.0 * share);
    split += buf;
  }
  if (private_samples > 0) split += " | caught up " + std::to_string(private_samples) + " samples";
  const double pct = epoch_samples() ? 100.0 * static_cast<double>(published_position) / static_cast<double>(epoch_samples()) : 0.0;
  std::fprintf(stderr,
               "%s[coloader %s] %s epoch %llu %5.1f%% | %6.1f batches/s %8.0f images/s | consumers %zu | "
               "slowest lag %llu | slots %u/%u | bad files %zu%s%s",
               progress_tty && !final_line ? "\r" : "", opts.name.c_str(),
               started ? "" : "waiting for consumers |", static_cast<unsigned long long>(published_epoch), pct,
               rate_batches, rate_images, sessions.size(), static_cast<unsigned long long>(slowest),
               ring.in_use(), ring.num_slots(), bad_indices.size(), split.c_str(), progress_tty && !final_line ? "   " : "\n");
  std::fflush(stderr);
}

}  // namespace coloader
