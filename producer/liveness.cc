// Liveness: consumers that are gone (pidfd, heartbeat), who took batches since the last look,
// and consumers that hold the others back too long (stalls). Catching up a consumer that stopped
// instead of waiting for it is catch_up.cc's (LagCatchUp).
#include <algorithm>
#include <string>
#include <vector>

#include "producer/producer_internal.h"

namespace coloader {

namespace {
constexpr uint64_t kExitGraceNs = 200'000'000;
}  // namespace

void Producer::Impl::CheckLiveness(uint64_t now) {
  std::vector<std::pair<std::string, const char*>> dead;
  for (auto& [identity, s] : sessions) {
    if (s.exited_ns == 0 && s.watch.valid() && s.watch.Exited()) s.exited_ns = now;
    if (s.exited_ns != 0) {
      // What it sent just before it went (a group member's goodbye after its share, acks) may
      // still be on its way through libzmq: its messages are read for a moment before it is
      // dropped as gone without a word.
      if (now - s.exited_ns > kExitGraceNs) dead.emplace_back(identity, "exited");
    } else if (now - s.last_heard_ns > uint64_t{opts.heartbeat_timeout_ms} * 1000000) {
      dead.emplace_back(identity, "went silent (heartbeat timeout)");
    } else if (now - s.last_sent_ns > uint64_t{opts.heartbeat_ms} * 1000000) {
      SendToSession(s, Heartbeat{});
    }
  }
  for (auto& [identity, why] : dead) {
    const bool silent = why[0] == 'w';
    DropSession(identity, why,
                silent ? std::optional<Bye>(
                             Bye{ByeReason::kDetached, "no heartbeat for " + std::to_string(opts.heartbeat_timeout_ms) +
                                                           " ms; you were detached and your slots reclaimed"})
                       : std::nullopt);
  }
}

void Producer::Impl::NoteReads(uint64_t now) {
  for (auto& [identity, s] : sessions) {
    if (s.pending) continue;
    const uint64_t r = ReadUpto(s);
    const uint64_t taken = s.mailbox >= 0 ? mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken() : s.acked;
    // (A consumer reading its own batches has read every shared batch: its ReadUpto follows the
    // shared stream, and says nothing of it.)
    if ((s.reads_shared() && r != s.read_upto) || taken != s.taken_seen) {
      // Its pace: the time per batch taken while batches waited for it (not while it waited).
      // One long step (a first one that compiles, a pause nobody was held back by) moves it by
      // at most its double: the lag limit follows the pace, not the pauses it is to tell apart.
      if (s.unread_since_ns != 0 && taken > s.taken_seen) {
        const uint64_t per = IdleNs(s, now) / (taken - s.taken_seen);
        const uint64_t most = s.step_ns ? 2 * s.step_ns : uint64_t{opts.lag_timeout_ms} * 1000000 / 4;
        s.step_ns = s.step_ns == 0 ? std::min(per, most) : (7 * s.step_ns + std::min(per, most)) / 8;
      }
      s.taken_seen = taken;
      s.last_read_ns = now;
    }
    // Parked while it should rejoin the shared stream: it does once it waits for a batch again.
    if (s.parked && s.reads_shared() && Waits(s)) s.parked = false;
    s.read_upto = r;
    if (Unread(s) == 0)
      s.unread_since_ns = 0;
    else if (s.unread_since_ns == 0)
      s.unread_since_ns = now;
  }
}

void Producer::Impl::DetachStalled(uint64_t now) {
  if (last_release_ns == 0) last_release_ns = now;
  const bool producing = !source->exhausted() || CatchUpOwed();  // catch-up goes on after the shared stream
  if (opts.stall_timeout_ms == 0 || !started || !producing) return;
  const uint64_t limit = uint64_t{opts.stall_timeout_ms} * 1000000;
  const std::string seconds = SecondsText(opts.stall_timeout_ms);
  auto who = [](const Session& s) {
    return "consumer " + std::to_string(s.id) + " (pid " + std::to_string(s.pid) +
           (s.name.empty() ? std::string() : ", '" + s.name + "'") + ")";
  };
  // Who holds the others back, and what it is told.
  struct Stalled {
    std::string identity, why;
    bool kept;  // its kept batches filled the ring (else: it stopped reading)
    // Whom it held back: the shared stream's other readers (counted below), those waiting to be
    // caught up (named in `why`), or the run's end.
    enum class Held { kShared, kCatchUp, kRunEnd };
    Held held;
  };
  std::vector<Stalled> stalled;
  for (const auto& [identity, s] : sessions) {
    if (!HoldsBackWindow(s) || IdleNs(s, now) < limit) continue;
    stalled.push_back({identity,
                       who(s) + " took no batch for " + seconds + " while the producer, " +
                           std::to_string(opts.window) + " batches ahead of it (--window), waited for it",
                       false, Stalled::Held::kShared});
  }
  // Catch-up batches take a few slots, one consumer at a time: one that takes none of those
  // decoded for it, and cannot be parked (LagCatchUp: a group, or batches of two ranges unread),
  // holds back every other consumer waiting to be caught up.
  for (const auto& [identity, s] : sessions) {
    // Catch-up batches made for it and published (not those still with the source), unread or
    // held, and batches waiting for it all that time.
    if (PrivateFootprint(s) == s.private_jobs.size() || IdleNs(s, now) < limit) continue;
    const Session& held = s;  // (a lambda may not name a structured binding before C++20)
    const bool another = std::any_of(sessions.begin(), sessions.end(), [&](const auto& kv) {
      const Session& t = kv.second;
      return t.id != held.id && (held.group.empty() || t.group != held.group) && WaitsForCatchUp(t);
    });
    if (another)
      stalled.push_back({identity,
                         who(s) + " took none of the batches decoded for it for " + seconds +
                             " while another consumer waited to be caught up",
                         false, Stalled::Held::kCatchUp});
  }
  // A parked one (taken off the shared stream when it stopped reading) costs nobody anything while
  // the run goes on; once every epoch is published, the run's end waits for it alone.
  const bool published = all_submitted && done.empty() && next_publish_seq == next_submit_seq;
  for (const auto& [identity, s] : sessions) {
    if (!s.parked || !published || now - s.last_read_ns < limit || Waits(s)) continue;
    stalled.push_back({identity,
                       who(s) + " took no batch for " + seconds +
                           " after it stopped reading and was taken off the shared stream, and every other epoch "
                           "is delivered: the run's end waited for it",
                       false, Stalled::Held::kRunEnd});
  }
  if (stalled.empty() && WithinWindow() && ring.free_slots() == 0 && now - last_release_ns >= limit) {
    // The ring is full of batches kept past their reading, and the keeper could not copy them
    // away when asked (Reclaim): zero-copy views, or a tcp:// consumer.
    const Session* keeper = nullptr;
    uint32_t most = 0;
    for (const auto& [identity, s] : sessions) {
      const uint32_t held = ring.HeldBy(s.id);
      if (!s.pending && held > most) {
        most = held;
        keeper = &s;
      }
    }
    if (keeper != nullptr)
      stalled.push_back({keeper->identity,
                         who(*keeper) + " kept " + std::to_string(most) + " batches (tensors still alive) for " +
                             seconds + " while the ring had no free slot, and could not copy them away (it reads " +
                             "zero-copy, or over tcp://)",
                         true, Stalled::Held::kShared});
  }
  const size_t shared = static_cast<size_t>(std::count_if(
      stalled.begin(), stalled.end(), [](const Stalled& st) { return st.held == Stalled::Held::kShared; }));
  const bool held_back = Receivers() > shared;  // anyone else reading the shared stream waits
  for (const Stalled& st : stalled) {
    if (st.held == Stalled::Held::kShared && !held_back) continue;  // nobody else is held back
    const std::string outcome = st.held == Stalled::Held::kShared
                                    ? ", and " + std::to_string(Receivers() - shared) +
                                          " other consumer(s) waited: it was detached so they could go on. "
                                : st.held == Stalled::Held::kCatchUp ? ": it was detached so they could go on. "
                                                                     : ": it was detached so that the run could end. ";
    DropSession(st.identity,
                st.kept ? "kept batches the ring needed (stall timeout)" : "stopped reading (stall timeout)",
                Bye{ByeReason::kDetached,
                    st.why + outcome +
                        (st.kept ? "clone() the batches you keep (or read without zero-copy)"
                                 : "Keep reading, or close the Loader while the job does something else") +
                        "; to wait longer, start the producer with a larger --stall-timeout-ms (0: never)"});
  }
}

}  // namespace coloader
