// The producer's state, shared by the files that implement it (private to producer/):
//   producer.cc  options, set-up, the session loop, shutdown
//   sessions.cc  handshakes, messages, flood control
//   liveness.cc  liveness (pidfd and heartbeat), who read what since the last look, stalls
//   publish.cc   back-pressure, handing slots to the source, publishing in order with the device fan-out
//   catch_up.cc  catch-up: what a late, resumed or rejoining consumer (or group) missed, served to it alone
//   report.cc    `coloader status` replies and the progress line
//   tcp.cc       the tcp:// endpoint: CURVE/ZAP, batches sent as payload
// Only the session loop's thread touches it (a source's workers see their BatchJobs).
#pragma once

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/endpoint.h"
#include "common/mailbox.h"
#include "common/process.h"
#include "common/protocol.h"
#include "common/shm.h"
#include "common/socket.h"
#include "common/unique_fd.h"
#include "pipeline/assemble/pool.h"
#include "producer/batch_source.h"
#include "producer/descriptor_guard.h"
#include "producer/device_ring.h"
#include "producer/producer.h"
#include "producer/ring.h"
#include "producer/slot_layout.h"
#include "producer/zap.h"

namespace coloader {

constexpr uint64_t kStrangerMessagesPerSecond = 1000;
// A consumer still holding a batch it was asked back this long ago is asked again (Reclaim):
// the first may have come before its client opened the batch, and found nothing to give back.
constexpr uint64_t kReclaimAgainNs = 500'000'000;

// A duration set in milliseconds, as the producer's messages say it ("60 s", "0.5 s").
inline std::string SecondsText(uint32_t ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", ms / 1000.0);
  return text;
}

// Messages counted over one-second windows: how a flood is told from a busy consumer.
struct RateWindow {
  uint64_t start_ns = 0;
  uint64_t count = 0;
  // Counts one message at `now`; the count within the current second.
  uint64_t Add(uint64_t now) {
    if (now - start_ns >= 1'000'000'000) {
      start_ns = now;
      count = 0;
    }
    return ++count;
  }
};

struct Session {
  uint64_t id = 0;
  std::string identity;  // the ROUTER's routing id of this consumer's connection
  uint32_t pid = 0;
  uint32_t batch_size = 0;
  std::string name;
  bool waiting_for_epoch = false;
  bool device = false;  // reads the device ring (CUDA IPC); otherwise the host slots
  bool pending = false; // offered the device ring, has not said (Attach) which path it takes
  int mailbox = -1;     // its shared-memory mailbox, or -1: announcements go as Batch messages
  bool remote = false;  // came over tcp://: batches go as message payload, liveness by heartbeat
  size_t ring = 0;      // with `device`: which of the device rings it maps
  ProcessWatch watch;  // pidfd: readable when the consumer's process is gone
  uint64_t exited_ns = 0;  // when the pidfd said so: its last messages get a moment to arrive
  uint64_t last_heard_ns = 0;
  uint64_t last_sent_ns = 0;
  uint64_t received = 0;
  uint64_t pid_ns = 0;  // the inode of its PID namespace, as its Hello said (0: not said)
  uint64_t acked = 0;
  uint64_t first_seq = 0;   // the first batch announced to it
  uint64_t acked_upto = 0;  // one past the newest batch it has released: how far it has read
  uint64_t read_upto = 0;   // how far it had read when last looked at (Impl::ReadUpto)
  uint64_t last_read_ns = 0;     // when that (or `taken_seen`) last moved, or it attached: what a stall is timed by
  uint64_t taken_seen = 0;       // the entries it had taken from its mailbox then (without one: acks)
  uint64_t step_ns = 0;          // its pace: the time it takes per batch while batches wait for it (averaged)
  uint64_t unread_since_ns = 0;  // since when batches have waited for it (0: none did when last looked)
  uint64_t reclaim_asked = 0;  // one past the newest batch it was asked to give back (Reclaim)
  uint64_t reclaim_asked_private = 0;  // the same among its catch-up batches (numbered apart)
  uint64_t reclaim_sent_ns = 0;        // when it was last asked (0: not since ReclaimAgainIfDue)
  bool end_sent = false;    // told that every epoch is published (End)
  RateWindow rate;              // its messages this second
  uint64_t received_at_rate = 0;  // `received` when that second began
  // Consumer group membership (empty group: a plain consumer). A member gets no batches
  // until every rank of its group is attached (`group_waiting`), so that all start together.
  std::string group;
  uint32_t rank = 0, world_size = 1;
  bool group_waiting = false;
  // It walks its epoch by positions (kAttachNoCatchUp: a group member, or a resumed state the
  // producer does not serve), or reads a resumed epoch's rest from the shared stream: no catch-up.
  bool resuming = false;
  // Its mailbox's entries not yet known to be taken, oldest first: the `pushed` entries' last
  // unread.size() (what ReadUpto reads, now that its batches need not be consecutive), and
  // where each batch lies (where its epoch goes on when they are taken back: LagCatchUp).
  struct Pushed {
    uint64_t seq, epoch, first;
  };
  std::deque<Pushed> unread;
  uint64_t pushed = 0;
  // Catch-up (catch_up.cc): a consumer that joins mid-epoch reads the shared stream's rest of it
  // (kTail), then the positions it missed, [0, owed_end) of owed_epoch, decoded again for it
  // alone (kPrivate), then the shared stream again from wherever it is (kRejoin: owed_epoch
  // is the next epoch it reads), caught up the same way if that is mid-epoch. kDone: a
  // finite run has nothing more for it.
  enum class CatchUp : uint8_t { kNone, kTail, kPrivate, kRejoin, kDone };
  CatchUp catch_up = CatchUp::kNone;
  uint64_t owed_epoch = 0;
  uint64_t owed_next = 0, owed_end = 0;  // kPrivate: positions still to hand the source
  bool owed_whole = true;                // its epoch is whole once caught up (not a resumed run's rest)
  // A group's: where its epoch's order (and the rounds of its split) begins, so that no catch-up
  // batch straddles two of its rounds (a step then needs GroupSpan() of them at once, no more).
  uint64_t owed_anchor = 0;
  std::deque<uint64_t> private_jobs;     // its batches with the source, not yet published, in order
  // It stopped reading while others waited (LagCatchUp): its unread batches were taken back, and
  // nothing more is made or sent for it until it waits for a batch again; then it rejoins the
  // shared stream, or is caught up once nobody else waits for that (one at a time).
  bool parked = false;
  // Takes shared batches now (a consumer catching up reads its own).
  bool reads_shared() const { return catch_up != CatchUp::kPrivate && catch_up != CatchUp::kDone; }
};

// The ranks of one consumer group attached to this producer, by routing id (empty: free).
struct Group {
  uint32_t world_size = 1;
  std::vector<std::string> members;
  // Every rank attached: they were started together. While it runs, an empty member is a
  // rank that took its whole share and said so (Bye kFinished): the others read on without
  // it, and no new process may take its place.
  bool running = false;
};

struct Producer::Impl {
  ProducerOptions opts;
  ProducerPaths paths;
  std::optional<NameLock> lock;
  // Where the batches come from: the dataset and its decode pipeline, or the caller.
  std::unique_ptr<BatchSource> source;
  SlotTable table;
  SlotTable staging;
  SharedMemory shm;
  SharedMemory::Ranges host_tensors;  // with a GPU ring: host tensor areas not reserved yet
  std::vector<std::unique_ptr<DeviceRing>> device_rings;  // one per --device GPU
  MailboxArea mailboxes;
  std::vector<bool> mailbox_used;
  zmq::context_t ctx{1};
  Socket router;  // opened by Bind()
  std::unique_ptr<ZapHandler> zap;  // with a tcp:// endpoint: who may connect
  std::string tcp_bound;
  std::unique_ptr<DescriptorGuard> descriptor_guard;  // with a tcp:// endpoint: floods stay below the limit
  EventFd stop_fd;  // Stop() signals it; the loop polls it
  std::atomic<bool> stop_requested{false};
  std::atomic<const char*> stop_why{"a request"};  // what asked (Stop's argument)

  RingAccounting ring{1};
  std::map<uint64_t, std::unique_ptr<BatchJob>> done;  // completed, waiting to publish in order
  // Catch-up batches (one consumer's alone, or every member's of one group): completed ones,
  // and whose each is (session ids).
  std::map<uint64_t, std::unique_ptr<BatchJob>> done_private;
  std::unordered_map<uint64_t, std::vector<uint64_t>> private_owner;
  uint64_t next_private_seq = kPrivateSeq;
  uint64_t private_batches = 0, private_samples = 0;   // published, for the progress line and status
  std::unordered_map<std::string, Session> sessions;   // by routing id
  std::map<std::string, Group> groups;                 // by group name
  uint64_t next_consumer_id = 1;
  // A stable hash of the dataset (paths relative to its root, labels) and of the settings that
  // shape each sample: what a resumed consumer checks that it reads the same data.
  std::string data_key;

  // Where production stands.
  bool started = false;       // min_consumers reached once
  // The source fills no more slots, as SubmitWork last saw it: a snapshot taken after the slots
  // a finished caller gave back were abandoned, not source->exhausted() read live (a caller
  // finishing between two passes must not end the run before its slots are back).
  bool all_submitted = false;
  uint64_t next_submit_seq = 0;
  uint64_t next_publish_seq = 0;
  // A catch-up waits for a slot that the shared stream's finished batches hold while every
  // reader reads its own batches: the next one is published to nobody (its slot freed). Whoever
  // reads that epoch later is caught up on it, decoded again.
  bool let_go_shared = false;
  uint64_t published_epoch = 0, published_position = 0;

  // Statistics.
  uint64_t start_ns = 0;
  uint64_t batches_published = 0, samples_published = 0;
  std::unordered_set<int64_t> bad_indices;
  uint64_t bad_events = 0;
  uint64_t rejected_messages = 0;
  // Hellos refused for want of room (SessionRoom): more consumers than one process may have,
  // or than the descriptor limit allows in all. Each session costs a connection and a pidfd.
  uint64_t refused_full = 0;
  uint32_t max_sessions = 0;  // in all (Setup: from the descriptor limit)
  // Churn since the heap was last trimmed: the most sessions held, and the refusals counted then.
  size_t sessions_high = 0;
  uint64_t refused_at_trim = 0, trimmed_ns = 0;
  // Sessions ended with Bye(rejected): a malformed message, an ack for a batch it does not
  // hold, a second Hello or Attach, a producer's message, a flood, or a full mailbox. Not
  // counted: consumers that left, exited, were detached by the heartbeat or came too late.
  uint64_t dropped_clients = 0;
  // Messages this second from each peer without a session (forgotten every second).
  std::unordered_map<std::string, RateWindow> stranger_rates;
  uint64_t strangers_since_ns = 0;
  double rate_batches = 0, rate_images = 0;
  uint64_t rate_mark_ns = 0, rate_mark_batches = 0, rate_mark_samples = 0;
  uint64_t last_progress_ns = 0;
  bool progress_tty = false;
  Status fatal;  // set when --on-bad-file fail hits
  uint64_t last_release_ns = 0;  // when a slot last came back (stalls of a full ring are timed by it)
  uint64_t alone_since_ns = 0;   // since when no consumer has been attached (0: one is)

  uint64_t epoch_samples() const { return source->epoch_samples(); }
  uint64_t dataset_size() const { return source->dataset_size(); }
  size_t InFlight() const { return source->in_flight(); }

  Status Setup();
  // Setup's steps, in order.
  Status MakeSource();
  // Whether the recipe fits the options (its log line; RandomErasing needs a float output).
  Status CheckRecipeFits(const Recipe& recipe) const;
  Status ClaimName();
  Status CreateRing(const SlotLayouts& layouts);
  Status MakeDeviceRings(const SlotLayouts& layouts, const NormalizeParams& normalize, const EraseOptions& erase,
                         bool pixel_ops);
  Status Bind();
  // Says so when the ring takes more than half of the machine's memory (it still starts).
  void WarnOfALargeRing(uint64_t bytes) const;
  Result<Producer::RunEnd> Loop();
  // The class names fit a Welcome (kMaxClasses, kMaxClassNameBytes).
  Status CheckClassNames() const;
  Status ReadMessages();
  // Reserves the host tensor areas of a GPU ring in /dev/shm before the first host-path reader
  // (they are reserved at start without a GPU ring); a clear error when it does not fit.
  Status ReserveHostTensors();
  void Shutdown(ByeReason reason, const std::string& message);
  // opts.alone_timeout_ms: the run's end once every consumer has been gone that long, else OK.
  // Why the run ends because its consumers left (alone_timeout_ms); nullopt while it goes on.
  std::optional<std::string> AloneTooLong(uint64_t now);

  // The back-pressure rule: the producer runs at most `window` batches ahead of how far each
  // live consumer has read: the announcements it has taken from its mailbox (batches go to a
  // session with consecutive numbers from its first), or for one without a mailbox the newest
  // batch it has released. A consumer that keeps an old batch (a tensor it holds on to) but
  // reads on is not behind and does not hold back the others: the kept slot is one of the
  // spares. One that stops reading stays behind, and the producer waits for it.
  bool WithinWindow() const {
    const uint64_t on_the_way = next_submit_seq - next_publish_seq;  // the shared stream's
    for (const auto& [id, s] : sessions)
      if (HoldsBackWindow(s)) return false;
    return on_the_way < opts.window;
  }
  // How far `s` has read: one past the newest batch it took from its mailbox (batches go to a
  // session with consecutive numbers from its first), or without a mailbox, one past the newest
  // it released.
  // Counted in the shared stream's numbers: catch-up batches are not in it.
  uint64_t ReadUpto(const Session& s) const {
    if (s.mailbox < 0) return std::max(s.acked_upto, s.first_seq);
    const uint64_t taken = mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken();
    const uint64_t base = s.pushed - s.unread.size();
    for (size_t i = taken > base ? taken - base : 0; i < s.unread.size(); ++i)
      if (!IsPrivateSeq(s.unread[i].seq)) return s.unread[i].seq;  // the oldest shared one unread
    // It has read every shared batch given to it.
    return next_publish_seq;
  }
  // Entries of its mailbox it has not taken (without one: announced and not released).
  uint64_t Unread(const Session& s) const {
    if (s.mailbox < 0) return s.received - std::min(s.received, s.acked);
    return s.pushed - std::min(s.pushed, mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken());
  }
  // `s` is `window` batches behind: the producer may not go further ahead of it.
  bool HoldsBackWindow(const Session& s) const {
    if (s.pending || s.received == 0 || !s.reads_shared()) return false;
    // One waiting to rejoin, with every shared batch it was given read, takes none until it
    // rejoins (it may be an epoch ahead of the shared stream).
    if (s.catch_up == Session::CatchUp::kRejoin &&
        (s.mailbox >= 0 ? ReadUpto(s) == next_publish_seq : s.acked_upto >= s.first_seq))
      return false;
    return next_publish_seq - ReadUpto(s) + (next_submit_seq - next_publish_seq) >= opts.window;
  }
  // Attached consumer processes (what --min-consumers counts: each rank of a group is one).
  size_t ActiveSessions() const {
    return static_cast<size_t>(std::count_if(sessions.begin(), sessions.end(),
                                             [](const auto& kv) { return !kv.second.pending; }));
  }
  // Those that take batches now: not still choosing a path, not waiting for their group, not
  // parked (LagCatchUp).
  size_t Receivers() const {
    return static_cast<size_t>(std::count_if(sessions.begin(), sessions.end(), [](const auto& kv) {
      return !kv.second.pending && !kv.second.group_waiting && !kv.second.parked && kv.second.reads_shared();
    }));
  }
  std::string ComputeDataKey() const;
  // With --resume: the epoch and position to start from (checked against the data).
  Status CheckStart();
  uint64_t start_epoch = 0, start_position = 0;
  // Why `hello` cannot be served (topology, seed, data key, group), or nullopt.
  std::optional<std::string> Refusal(const Hello& hello) const;
  // Starts `name` when every rank is attached and has chosen its path.
  void MaybeStartGroup(const std::string& name);
  // A member of a group left: the others are told (Bye kGroupBroken) and dropped.
  void BreakGroup(const Session& gone, const char* why);
  // A member finished its share and said goodbye: the others go on (see Group::running).
  void FinishInGroup(const Session& gone);
  void SubmitWork();
  // A free slot whose previous uploads are done (nullopt: none free, or the GPU failed: fatal).
  std::optional<uint32_t> AcquireSlot();
  void PublishReady();
  // Catch-up (catch_up.cc): whether `s` may be caught up (nothing it says rules it out, the
  // source can refill, --no-catch-up not given); what the shared batch `job` means for `s`
  // (false: not announced to it); catch-up batches handed to the source and published.
  bool CanCatchUp(const Session& s) const;
  // Why `s` is not caught up whatever it says ("" when it may be): --no-catch-up, a source that
  // cannot read a sample again, or a group's step needing more catch-up batches at once than the
  // ring has spare slots.
  std::string WhyNoCatchUp(const Session& s) const;
  // The catch-up batches a step of `s`'s group needs at once (its ranks' blocks of one round, each
  // batch within a round: RoundLeft); 1 for a consumer alone.
  uint64_t GroupSpan(const Session& s) const;
  uint64_t RoundLeft(const Session& s, uint64_t position) const;
  // A resumed consumer (or group) whose rest the shared stream is exactly at reads on from it
  // (true); else it stays set up to be served its rest alone.
  bool ReadOnWhereThere(Session& s);
  // A consumer attaching with a saved state's rest to serve (kAttachResume): why not, or OK
  // and `s` set to read it (decoded for it alone) before the shared stream.
  Status ServeResume(Session& s, const Attach& attach);
  bool TakesShared(Session& s, const BatchJob& job);
  // Hands the source catch-up batches: with `first_only`, one to each catching-up consumer with
  // nothing on the way or unread; else more, within the ring's spare slots for all together.
  void SubmitCatchUp(bool first_only);
  // Its catch-up batches on the way or unread; how many catching-up consumers have none (each
  // is kept a free slot).
  uint64_t PrivateOutstanding(const Session& s) const;
  uint32_t CatchUpWaiting() const;
  // Its catch-up batches that take a slot (with the source, or published and held); the slots all
  // of them may take; the consumer served now (one at a time).
  uint64_t PrivateFootprint(const Session& s) const;
  // Catch-up batches that take a slot, each counted once (a group's are every member's); those of
  // `s` and the members catching up with it.
  uint64_t PrivateSlotsInUse() const;
  uint64_t UnitFootprint(const Session& s) const;
  // The slots all catch-up batches may take: the ring's spare slots, two at least.
  uint64_t CatchUpBudget() const;
  const Session* CatchingUp() const;
  // Who reads the catch-up batches made for `s`: `s` alone, or every member of its group still
  // here and catching up with it (a group is caught up as one: every rank reads every batch).
  std::vector<Session*> CatchUpReaders(const Session& s);
  // `t` is `s`, or a member of its group at the same point of the same catch-up.
  static bool CatchesUpWith(const Session& s, const Session& t) {
    return t.id == s.id || (!s.group.empty() && t.group == s.group && t.catch_up == s.catch_up &&
                            t.owed_epoch == s.owed_epoch && t.owed_next == s.owed_next);
  }
  // `s` has read past batch `seq` (it took a later one): a Reclaim may ask for it back.
  bool ReadPast(const Session& s, uint64_t seq) const {
    // A shared batch: it took a later one; or, reading its own batches now, it took this one and
    // takes no other shared batch before its own (a job that keeps its last batch of the shared
    // stream's part would otherwise keep the slot its own first batch needs).
    if (!IsPrivateSeq(seq)) return ReadUpto(s) > seq + 1 || (s.mailbox >= 0 && !s.reads_shared() && ReadUpto(s) > seq);
    if (s.mailbox < 0) return false;  // without a mailbox it cannot copy what it keeps anyway
    const uint64_t taken = mailboxes.at(static_cast<uint32_t>(s.mailbox)).taken();
    const uint64_t base = s.pushed - s.unread.size();
    for (size_t i = 0; i < s.unread.size(); ++i)
      if (s.unread[i].seq == seq) return taken > base + i + 1;
    return true;  // forgotten: taken long ago
  }
  // Every epoch is handed out and every consumer caught up (the run's end, once published).
  bool AllSubmitted() const { return all_submitted && !CatchUpOwed(); }
  void PublishCatchUp();
  // Any consumer still owed a catch-up batch (the run is not over while one is).
  bool CatchUpOwed() const;
  // A completed job's count once its failed samples are dealt with; nullopt when it is not
  // published now (the run failed, or it went back to be filled again).
  std::optional<uint32_t> Settle(std::unique_ptr<BatchJob>& job);
  // Uploads `job` to each GPU ring with a reader among `readers` (and the host copy for a host reader).
  Status Upload(const BatchJob& job, uint32_t count, const std::vector<const Session*>& readers);
  // Uploads `job` for `readers` and says it (its flags those of the shared stream); nullopt when
  // the upload failed (the run's fatal error, the slot given back).
  std::optional<BatchAnnouncement> Ready(const BatchJob& job, uint32_t count, const std::vector<const Session*>& readers);
  // Puts `a` in s's mailbox (false: full), or sends it.
  bool Announce(Session& s, const BatchAnnouncement& a);
  // Every epoch is published: tells each reading consumer once (End), whatever it still holds.
  void AnnounceEnd();
  // The ring has no free slot: asks the consumers that keep the oldest batch, read past, for it
  // back (Reclaim); they copy what they keep and ack.
  void ReclaimOldest();
  // Every epoch is published and the run waits only for slots kept by consumers: asks each
  // keeper for all of them back (a job that holds its last batch, or closed its Loader holding
  // one, would otherwise keep the producer alive until its tensors die).
  void ReclaimAtEnd();
  // Each batch is asked for, and again every kReclaimAgainNs while it is still held: the
  // producer asks as soon as a consumer has taken the batch from its mailbox, a moment before the
  // client opens it, and a Reclaim that comes first finds no lease there and is dropped.
  void ReclaimAgainIfDue(Session& s, uint64_t now);
  void SendReclaim(Session& s, uint64_t seq, uint64_t now);
  // Notes who took batches since the last look: each session's read_upto, last_read_ns and pace.
  void NoteReads(uint64_t now);
  // A consumer that holds the others back without taking a batch for --lag-timeout-ms (and 4 of
  // its steps) is caught up instead of waited for (TakeBackUnread), where it may be (CaughtUpWhenBehind).
  void LagCatchUp(uint64_t now);
  bool CaughtUpWhenBehind(const Session& s) const;
  void TakeBackUnread(Session& s, uint64_t now);
  // The same for the consumer served a catch-up that takes none of its batches while another
  // waits to be caught up: its unread catch-up batches are owed again, and it waits its turn.
  void Park(Session& s, uint64_t now);
  // Every batch in s's mailbox that it has not taken is a catch-up batch of the epoch it is
  // served now (`catch_up_batches`), or every one is a shared batch; false with none unread.
  bool OnlyUnread(const Session& s, bool catch_up_batches) const;
  // After entries were taken back from s's mailbox: what NoteReads compares with starts again.
  void NotTaken(Session& s, uint64_t now);
  // t is owed a catch-up, has none of its batches to read, and waits for them.
  bool WaitsForCatchUp(const Session& t) const;
  // How long batches have waited for s without its taking one (0: none waits); how long that may
  // last before it is taken back or parked (--lag-timeout-ms, and 4 of its steps).
  uint64_t IdleNs(const Session& s, uint64_t now) const;
  uint64_t LagLimitNs(const Session& s) const;
  // t waits for a batch now: it sleeps on its mailbox (one that stopped reading does not); without
  // a mailbox, taken to.
  bool Waits(const Session& t) const;
  // Detaches consumers that have held the others back for --stall-timeout-ms (see the option).
  void DetachStalled(uint64_t now);
  void HandleMessage(const std::string& identity, const uint8_t* data, size_t size, bool remote);
  bool Flooding(Session& s, uint64_t now);
  void HandleHello(const std::string& identity, const Hello& hello, bool remote);
  // Why there is no room for another consumer (nullopt: there is): per process, and in all.
  std::optional<std::string> SessionRoom(const Hello& hello, bool remote) const;
  // After many sessions went (a flood, a loop of Loaders), gives the heap's free pages back to
  // the system: glibc keeps them otherwise, and a producer's memory would stay at its peak.
  void TrimAfterChurn();
  // HandleHello's steps: the session a Hello asks for, how its process is watched, what the
  // Welcome says, and a mailbox for a local process.
  Session SessionFor(const std::string& identity, const Hello& hello, bool remote);
  void WatchProcess(Session& s, const Hello& hello);
  Welcome WelcomeFor(const Session& s) const;
  void GiveMailbox(Session& s, Welcome& w);
  void HandleAttach(const std::string& identity, const Attach& attach);
  Status BindTcp();
  void SendWithPayload(Session& s, const BatchAnnouncement& a);
  // `finished`: the consumer said goodbye after its share (Bye kFinished); its group goes on.
  void DropSession(const std::string& identity, const char* why, std::optional<Bye> bye, bool finished = false);
  bool Send(const std::string& identity, const Message& m);
  void SendToSession(Session& s, const Message& m);
  void CheckLiveness(uint64_t now);
  StatusReply MakeStatus() const;
  void ReportProgress(uint64_t now, bool final_line);
};

}  // namespace coloader
