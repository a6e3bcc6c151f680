// The placement planner: which GPU each job runs on, in which mode (a GPU of its own, MPS with
// limits, or a MIG instance), and which jobs share one producer. Incremental, so that `plan`
// (place a whole jobs file), `launch` (place as GPUs free up, replace after an OOM) and
// `simulate` (replay a trace) all run this same code.
//
// What it respects (the collocation studies this project builds on, see docs/PLACEMENT.md):
// the memory of everything on a GPU must fit; under the sharing-aware policy the combined SM
// activity of collocated jobs stays within sm_limit (by default the collocation model's
// saturation point plus a slack, kAutoSmSlack); CPU cores for loading are a
// packed resource like memory. With data sharing, jobs of one pipeline share one producer:
// its ring is counted once per GPU it lives on, its CPU cores once; while the producer runs,
// its jobs are kept on its GPU (zero-copy under MPS). Jobs that need isolation get a MIG
// instance (reading the producer's host-memory ring) or a GPU of their own.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "placement/jobs.h"

namespace coloader {

enum class Policy {
  kFifoExclusive,   // one job per GPU, strictly in queue order
  kMostMemory,      // the GPU with the most free memory where the job fits
  kLeastUtilised,   // the GPU with the least combined SM activity where the job fits
  kSharingAware,    // coloader's: SM cap, CPU cores, producers shared and kept on one GPU
};
const char* PolicyName(Policy p);
Result<Policy> ParsePolicy(const std::string& name);
std::vector<Policy> AllPolicies();

// What happens to a job that ran out of GPU memory (the launcher and the simulator both apply it
// through Planner::Recover). kGrow requeues the job in its place with its estimate times
// `growth`, collocated as before. kAlone: a recovery queue served before every other job, whose
// jobs each run on a GPU of their own, with no memory limit but the GPU's. kGrowThenAlone is
// CARMA's: the first OOM is kGrow's (where the grown estimate still fits a GPU beside others),
// the second, or a grown estimate no GPU holds, kAlone's.
enum class Recovery { kAlone, kGrow, kGrowThenAlone };
const char* RecoveryName(Recovery r);
Result<Recovery> ParseRecovery(const std::string& name);

struct OomRecovery {
  Recovery rule = Recovery::kGrowThenAlone;  // docs/PLACEMENT.md, "A default for families of workloads"
  int max_ooms = 3;      // restarts per job; one more OOM and it has failed
  double growth = 1.5;   // kGrow: the estimate after an OOM, times this
};

// How collocated jobs slow each other down, which the sharing-aware policy's "auto" SM limit
// and the simulator share. Calibrated (benchmarks/calibrate_collocation.py) on ResNet-18/50
// copies under MPS on an H200, a job's SM activity being its share of the GPU's throughput
// alone; docs/PLACEMENT.md.
struct CollocationModel {
  double interference = 0.003;  // per extra job on a GPU, fractional slowdown (caches, memory bandwidth)
  double sm_saturation = 1.0;   // combined SM activity beyond which collocated jobs share SMs in proportion

  // The slowdown factor (>= 1) of each of `n` jobs on a GPU with combined SM activity `sm`.
  double Slowdown(int n, double sm) const;
  // The speed of a job of activity `job_sm` alone on a MIG instance holding `share` of the GPU's
  // SMs: it keeps its speed while its need fits the slice, and slows in proportion beyond it
  // (activity being the job's share of the whole GPU's throughput alone).
  double MigSpeed(double share, double job_sm) const { return job_sm <= share ? 1.0 : share / job_sm; }
};

struct PlannerOptions {
  Policy policy = Policy::kSharingAware;
  bool sharing = true;          // jobs of one pipeline share a producer
  // Combined SM activity allowed on one GPU (sharing-aware policy). 0, "auto": the model's
  // saturation point plus kAutoSmSlack. Past saturation the jobs share the SMs, which the model
  // (calibrated up to 8 copies) says costs 0.3% per neighbour; held at saturation exactly, a GPU
  // within a light job's share of it idles that share until a job small enough comes. Over the
  // trace families (docs/PLACEMENT.md) 1.15 gave the best worst case (1.12 of the best makespan
  // and 1.02 of the best JCT, against 1.18 and 1.19 at saturation), 0 OOMs either way.
  double sm_limit = 0;
  static constexpr double kAutoSmSlack = 0.15;
  CollocationModel model;
  double default_sm = 0.5;      // SM activity assumed for a job that does not state it
  // Fraction added to every estimate: the estimator's worst underestimate on its 154 measured
  // configurations is 5% (docs/ESTIMATOR.md), and a job's estimate is its MPS memory limit.
  double memory_margin = 0.05;
  // A job on a GPU it may share gets, beyond its reservation, its share of the memory that no
  // reservation holds when it is placed (Planner::LimitWhenPlaced): an estimate's error is an OOM
  // only where the GPU is really short. false: the limit is the reservation.
  bool memory_headroom = true;
  double cpu_cores = 64;        // cores for loading on this machine
  std::string cpu_cores_from = "the default";  // where that figure came from, for the plan's report
  bool host_path = false;       // producers keep rings in host memory (no GPU cost): no CUDA here
  OomRecovery recovery;
};

enum class Mode { kExclusive, kMps, kMig };
const char* ModeName(Mode m);

struct Placement {
  int job = -1;
  int gpu = -1;             // index into the planner's GPU list
  Mode mode = Mode::kMps;   // final mode is known once collocation is (see Planner::ModeOf)
  std::string mig_profile;  // for kMig
  double reserved_mib = 0;  // held on that GPU: the job's estimate (plus margin) and client_mib
  double client_mib = 0;    // of which the coloader consumer's own device buffers (JobPipeline::ConsumerMiB)
  double limit_mib = 0;     // the memory it may use there, fixed when placed (Planner::LimitWhenPlaced)
  int producer = -1;        // the pipeline whose shared producer it reads; -1: its own loader
  bool host_path = false;   // reads the producer's host-memory ring (MIG, or no CUDA)
};

// Where a running producer decodes JPEGs. A pipeline whose jobs read the producer's ring on the
// device path decodes as it asks on the ring's GPUs (serve's --decode). One whose jobs read host
// memory (MIG instances, isolation) has no GPU of its own: unless it asks for cpu, the planner
// reserves a MIG instance with a JPEG engine for it when its first job is placed, and else it
// decodes on the CPU, `why` saying so.
struct ProducerDecode {
  std::string decode = "cpu";  // what `coloader serve --decode` gets: cpu, gpu or auto
  int gpu = -1;                // the planner's index of the GPU it decodes on; -1: the CPU
  std::string mig_profile;     // the MIG instance reserved for it, when it has one
  double reserved_mib = 0;     // that instance's memory, counted on its GPU with the producers
  std::string why;             // one line for the plan
};

// One run of a job where the planner put it, as the launcher and the simulator report it.
struct Attempt {
  int gpu = -1;             // the GPU's index
  Mode mode = Mode::kMps;   // as placed: kMps for a GPU it may share (alone or not)
  std::string mig_profile;
  double limit_mib = 0;     // Planner::MemoryLimitMiB
  double start_s = 0, end_s = 0;
  bool oom = false;
};

// Seed 003's co-location speedup, per GPU: the seconds its finished jobs would have taken
// alone, over the seconds it was busy (sum t_j / max t'_j for jobs started together). 1 for
// jobs run one after another; above 1 where collocation pays.
double CollocationSpeedup(double alone_s, double busy_s);

// Per-GPU state, exposed for reports and the simulator.
struct GpuLoad {
  double used_mib = 0;      // jobs' reservations + producer rings
  double producer_mib = 0;      // of which producers (ring + context, once per producer)
  double sm = 0;            // combined expected SM activity
  std::vector<int> jobs;
  std::map<std::string, int> mig_used;  // profile -> instances in use
  bool exclusive = false;   // holds a job that may not share it
};

class Planner {
 public:
  Planner(PlannerOptions opts, std::vector<Gpu> gpus, const JobSet* set);

  // Places job `j` now if the policy finds room; nullopt when it must wait. The planner keeps
  // the job's resources until Release(j).
  std::optional<Placement> TryPlace(int j);
  void Release(int j);
  // Fixes a running producer's GPUs: its later jobs go only there (the launcher calls this once
  // the producer process runs, since a running producer cannot add a ring on another GPU).
  // Until UnlockProducer (the launcher stopped that process), even while none of its jobs runs;
  // so is its MIG decode instance (DecodeOf), which the process holds.
  void LockProducer(int pipeline);
  void UnlockProducer(int pipeline);
  // True if the job could be placed on an empty machine (otherwise it never can).
  bool FitsEmpty(int j) const;
  // Jobs' order of consideration: the recovery queue (jobs that run alone after an OOM), then
  // priority (higher first), then arrival, then file order.
  std::vector<int> QueueOrder(std::vector<int> jobs) const;
  // True when nothing behind job j in QueueOrder may be placed while j waits: FIFO's rule for
  // every job, the recovery queue's for a job that runs alone (else it could wait for ever for
  // an empty GPU).
  bool HoldsTheQueue(int j) const;
  // One round of placement, the launcher's and the simulator's both: the jobs of `queue`, in
  // QueueOrder, each placed where TryPlace finds room (and taken off the queue) until one that
  // HoldsTheQueue must wait. Returns what was placed, in that order.
  std::vector<Placement> PlaceRound(std::vector<int>* queue);

  // Job j (released) ran out of memory, its `ooms`-th time, in attempt `run`: applies the
  // recovery rule and says whether it is to be queued again; false when it has failed (more
  // than max_ooms; out of memory with all a GPU can give it, as on a GPU of its own or with a
  // limit as large, where no restart can help; or no GPU here can hold it any more). kGrow
  // raises `*estimate_mib`, the job's estimate in the JobSet this planner reads. An OOM from
  // real pressure (a neighbour using its headroom) looks the same to the launcher as one past
  // the job's own limit, so it is recovered the same way.
  bool Recover(int j, int ooms, const Attempt& run, double* estimate_mib);
  // The most memory job j could be given: the largest GPU (not MIG) less its producer's ring
  // and context where it shares one.
  double AloneLimitMiB(int j) const;
  bool RunsAlone(int j) const { return alone_.count(j) > 0; }
  // The device memory a job may use where it is placed (Placement::limit_mib, fixed by
  // LimitWhenPlaced as TryPlace places it); past it, it gets an out-of-memory error while its
  // neighbours run on.
  double MemoryLimitMiB(const Placement& p) const { return p.limit_mib; }
  // The rule, the launcher's and the simulator's both, for `p` just counted on its GPU: a MIG
  // instance's memory; on a GPU of its own, the GPU less its producer's ring; on a GPU it may
  // share (alone there or not), its reservation (estimate x (1 + margin) and client_mib) plus,
  // with memory_headroom, its headroom: an equal share among the GPU's jobs of what no
  // reservation or ring holds now, up to kHeadroomShare of its reservation. The packing is by
  // reservations, so a later job may be placed in memory an earlier one was given as headroom;
  // if that one uses it, the later job's allocations fail (real pressure), which the recovery
  // rule then handles. The cap bounds what one job's underestimate can take from its
  // neighbours. (Counting the headroom already given as taken gave ten times the OOMs over the
  // tuning families: later jobs got none; docs/PLACEMENT.md.)
  double LimitWhenPlaced(const Placement& p) const;
  static constexpr double kHeadroomShare = 0.5;
  // The headroom job j would get by that rule if placed on GPU g now with reservation
  // `need_mib` (its estimate, margin and client_mib). Sharing-aware, with memory_headroom, does
  // not place a job beside others where this is below kHeadroomFloor of its reservation (half
  // the cap: an estimate up to ~24% low stays within its limit), and of the GPUs it may use
  // prefers those where it comes closest to the cap: placed where earlier jobs had taken the
  // unreserved memory, a job a little over its estimate ran out of memory on a GPU whose memory
  // its neighbours did not use (3 of the 120 tuning traces; docs/PLACEMENT.md).
  double HeadroomOn(int j, int g, double need_mib) const;
  static constexpr double kHeadroomFloor = 0.25;
  // How far candidate `p`'s headroom falls short of its cap, 0 (none) to 1 (no headroom): on a
  // GPU it may share, HeadroomOn; in a MIG instance, what the instance holds beyond the
  // estimate; on a GPU of its own, 0.
  double HeadroomShortOfCap(const Placement& p) const;
  // What CUDA_MPS_PINNED_DEVICE_MEM_LIMIT says for a job on a GPU it may share: its limit plus,
  // when it maps its producer's ring through CUDA IPC, the ring, which MPS charges to every
  // client that maps it (the replay on an H100 saw jobs within their estimates fail at a limit
  // without it, docs/PLACEMENT.md). The ring is counted once on the GPU, with the producer.
  double MpsLimitMiB(const Placement& p) const;

  // What no reservation or ring holds on GPU g, shared equally among its jobs, once `adding_mib`
  // and `adding_jobs` more are counted there.
  double UnreservedShare(int g, double adding_mib, size_t adding_jobs) const;
  double SmOf(int j) const;
  double ReservationOf(int j) const;
  int MigSlicesUsed(int gpu) const;  // the compute slices of the MIG instances handed out on it
  // What job j's coloader consumer allocates on the GPU beyond its estimate: its batch copies
  // when it reads a shared producer's device ring (not on the host path, MIG, or its own loader).
  double ClientMiBOf(int j, bool host_path) const;
  // Cores a job adds when placed now: its own loader's, or what its producer needs beyond what it has.
  double CoresToAdd(int j) const;
  // Whether job j reads its pipeline's producer when placed now: with sharing on, unless its
  // reservation with the producer's device ring and its consumer's copies fits no whole GPU
  // while the job alone fits one; then it runs with its own loader, as without sharing, rather
  // than never (a large job of a pipeline with a large window). Placement::producer says what
  // was decided for a placed job.
  bool SharesProducer(int j) const;
  double cores_used() const { return cores_used_; }
  const std::vector<Gpu>& gpus() const { return gpus_; }
  const std::vector<GpuLoad>& loads() const { return loads_; }
  const PlannerOptions& options() const { return opts_; }
  const std::map<int, Placement>& placed() const { return placed_; }
  // GPUs on which a pipeline's producer currently keeps a ring (empty: producer not running).
  std::set<int> ProducerGpus(int pipeline) const;
  bool ProducerRunning(int pipeline) const { return producer_members_.count(pipeline) > 0; }
  double ProducerCores(int pipeline) const;
  // Where the producer of a running pipeline decodes (ProducerDecode).
  ProducerDecode DecodeOf(int pipeline) const;
  // Exclusive when alone on its GPU, MPS when sharing it, MIG for a MIG instance.
  Mode ModeOf(const Placement& p) const;
  // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a job under MPS: its share of the SM budget, a stated
  // --sm-limit, or under "auto" the saturation point without the slack (each job may use its own
  // activity's worth of SMs; past saturation they share, as the model has it).
  int MpsThreadPercentage(const Placement& p) const;
  // Whether the sharing-aware policy lets job j join GPU g's jobs.
  bool SmAdmits(int j, int g) const;

 private:
  // An empty planner with this one's options, GPUs and per-pipeline facts (FitsEmpty).
  Planner(const Planner& like, std::vector<Gpu> gpus);
  bool PipelineOnHostPath(int pipeline) const;
  std::optional<Placement> PlaceOnGpu(int j, int g) const;
  // Whether one more instance of profile m fits GPU g now: its count, the GPU's memory and its
  // compute slices.
  bool MigInstanceFree(int g, const MigProfile& m) const;
  // After a job of `pipeline` was placed on GPU `near`: a producer with no GPU for its ring (its
  // jobs read host memory) that is to decode on a GPU gets a MIG instance with a JPEG engine, or
  // the CPU with the reason, once (the process keeps what it started with); one that now has a
  // ring GPU decodes there instead.
  void UpdateDecoder(int pipeline, int near);
  void FreeDecoder(int pipeline);
  double DecoderMiBOn(int g) const;  // the producers' MIG decode instances on GPU g
  double RingCostOn(int j, int g) const;

  PlannerOptions opts_;
  std::vector<Gpu> gpus_;
  const JobSet* set_;
  std::vector<GpuLoad> loads_;
  std::map<int, Placement> placed_;
  double cores_used_ = 0;
  std::map<int, std::map<int, int>> producer_members_;  // pipeline -> gpu -> running members
  std::map<int, double> producer_cores_;                  // pipeline -> cores charged for its producer
  std::map<int, std::set<int>> locked_;                   // pipeline -> GPUs of its running process
  std::map<int, ProducerDecode> decoders_;                // host-path pipeline -> where its producer decodes
  std::set<int> decoder_locked_;                          // pipelines whose process holds its decoders_ entry
  std::set<int> alone_;                                   // jobs in the recovery queue: run alone
  std::vector<char> host_path_pipeline_;                  // per pipeline: PipelineOnHostPath, fixed at construction
};

// A whole-file plan: place every job in queue order; what does not fit now is listed as queued.
struct Plan {
  std::vector<Placement> placements;
  std::vector<int> queued;      // fit an empty machine, but not next to the others
  std::vector<int> impossible;  // larger than any GPU (or MIG profile, with isolation)
  std::vector<std::string> impossible_why;  // for each of `impossible`: why, and what to do
  double cpu_cores_used = 0;
  double cpu_cores_without_sharing = 0;
};
Plan MakePlan(const JobSet& set, const std::vector<Gpu>& gpus, const PlannerOptions& opts, Planner* planner_out = nullptr);
// Why job `j` fits on no empty GPU: beside its producer's ring (when that is what tips it), or
// too large; and what to do.
std::string WhyItCannotRun(const JobSet& set, const std::vector<Gpu>& gpus, const PlannerOptions& opts, int j);

// The plan as one JSON object, and as a table a person reads.
std::string PlanJson(const JobSet& set, const Planner& planner, const Plan& plan);
std::string PlanTable(const JobSet& set, const Planner& planner, const Plan& plan);

// The environment a planned job runs with (CUDA_VISIBLE_DEVICES, MPS limits, COLOADER_NAME).
std::map<std::string, std::string> JobEnvironment(const JobSet& set, const Planner& planner, const Placement& p);
// The producer's name for a pipeline (what consumers connect to).
std::string ProducerName(const JobSet& set, int pipeline);

}  // namespace coloader
