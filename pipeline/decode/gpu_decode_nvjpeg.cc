// --decode gpu with nvJPEG (see gpu_decode.h). libnvjpeg is opened at run time; its header
// only gives the types and signatures.
#include <cuda_runtime_api.h>
#include <glob.h>
#include <nvjpeg.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <mutex>
#include <utility>

#include "common/align.h"
#include "common/cuda_internal.h"
#include "common/log.h"
#include "pipeline/decode/gpu_decode.h"
#include "pipeline/stage_times.h"
#include "pipeline/substitution.h"
#include "pipeline/transform/augment_device.h"
#include "toolbox/shared_library.h"

namespace coloader {

namespace {

// The few entry points used, resolved once from the first libnvjpeg that opens.
struct NvjpegApi {
  decltype(&nvjpegCreateEx) CreateEx = nullptr;
  decltype(&nvjpegDestroy) Destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) StateCreate = nullptr;
  decltype(&nvjpegJpegStateDestroy) StateDestroy = nullptr;
  decltype(&nvjpegJpegStreamCreate) StreamCreate = nullptr;
  decltype(&nvjpegJpegStreamDestroy) StreamDestroy = nullptr;
  decltype(&nvjpegJpegStreamParseHeader) ParseHeader = nullptr;
  decltype(&nvjpegDecodeBatchedSupported) BatchedSupported = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) BatchedInitialize = nullptr;
  decltype(&nvjpegDecodeBatched) DecodeBatched = nullptr;
  // Optional: the engine count, for the banner (a GPU shared under MPS may show fewer).
  decltype(&nvjpegGetHardwareDecoderInfo) HardwareInfo = nullptr;
  std::string where;  // the library opened, or what was tried
  bool ok = false;
};

const NvjpegApi& Nvjpeg() {
  static NvjpegApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("COLOADER_NVJPEG_LIBRARY"); env && *env) candidates.push_back(env);
    candidates.push_back("libnvjpeg.so.13");  // LD_LIBRARY_PATH, the loader cache
    candidates.push_back("/usr/local/cuda/lib64/libnvjpeg.so.13");
    candidates.push_back("/usr/local/cuda/targets/x86_64-linux/lib/libnvjpeg.so.13");
    // A versioned install without the /usr/local/cuda link (the H200 machine's is cuda-13.0).
    glob_t g{};
    if (::glob("/usr/local/cuda-13*/targets/*/lib/libnvjpeg.so.13", 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) candidates.push_back(g.gl_pathv[i]);
    ::globfree(&g);
    char exe[PATH_MAX] = {};
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      std::string dir(exe, static_cast<size_t>(n));
      dir = dir.substr(0, dir.rfind('/'));
      candidates.push_back(dir + "/libnvjpeg.so.13");
      candidates.push_back(dir + "/../lib/libnvjpeg.so.13");
      // PyPI's nvidia-nvjpeg wheel (what PyTorch environments carry) in the site-packages that
      // holds the installed wheel's binary, <site-packages>/coloader/bin/coloader.
      candidates.push_back(dir + "/../../nvidia/cu13/lib/libnvjpeg.so.13");
    }
    // The same wheel found by the Python entry point (coloader/__main__.py) in any site-packages
    // on its sys.path. Internal: set by the launcher, not meant to be set by users.
    if (const char* py = std::getenv("_COLOADER_NVJPEG_WHEEL"); py && *py) candidates.push_back(py);
    std::string tried;
    for (const std::string& c : candidates) {
      Result<SharedLibrary> lib = SharedLibrary::Open({c});
      if (!lib.ok()) {
        tried += (tried.empty() ? "" : ", ") + c;
        continue;
      }
      lib->Bind(api.CreateEx, "nvjpegCreateEx");
      lib->Bind(api.Destroy, "nvjpegDestroy");
      lib->Bind(api.StateCreate, "nvjpegJpegStateCreate");
      lib->Bind(api.StateDestroy, "nvjpegJpegStateDestroy");
      lib->Bind(api.StreamCreate, "nvjpegJpegStreamCreate");
      lib->Bind(api.StreamDestroy, "nvjpegJpegStreamDestroy");
      lib->Bind(api.ParseHeader, "nvjpegJpegStreamParseHeader");
      lib->Bind(api.BatchedSupported, "nvjpegDecodeBatchedSupported");
      lib->Bind(api.BatchedInitialize, "nvjpegDecodeBatchedInitialize");
      lib->Bind(api.DecodeBatched, "nvjpegDecodeBatched");
      lib->BindOptional(api.HardwareInfo, "nvjpegGetHardwareDecoderInfo");
      if (lib->complete()) {
        api.ok = true;
        api.where = lib->path();  // the file the loader opened (a bare soname says nothing), for the banner
        lib->Keep();
        return;
      }
      tried += (tried.empty() ? "" : ", ") + c + " (lacks " + lib->missing() + ")";
    }
    api = NvjpegApi{};  // no entry point of a library closed again may stay behind
    api.where = tried;
  });
  return api;
}

const char* NvjpegStatusName(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "no such backend on this GPU";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
  }
  return "unknown status";
}

#define NVJPEG_RETURN_NOT_OK(expr)                                                                        \
  do {                                                                                                    \
    nvjpegStatus_t _s = (expr);                                                                           \
    if (_s != NVJPEG_STATUS_SUCCESS)                                                                      \
      return Status::IOError(std::string("nvJPEG: ") + #expr + " failed: " + NvjpegStatusName(_s));       \
  } while (false)

constexpr uint64_t kAlign = 256;

// One nvJPEG backend's handle and batched-decode state, destroyed with it.
struct Backend {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  int initialized_for = -1;  // the batch size nvjpegDecodeBatchedInitialize was last called with

  Backend() = default;
  Backend(Backend&& o) noexcept
      : handle(std::exchange(o.handle, nullptr)), state(std::exchange(o.state, nullptr)),
        initialized_for(o.initialized_for) {}
  Backend& operator=(Backend&&) = delete;
  ~Backend() { Destroy(); }

  // Default flags: memory pools, padding and no-pipelining changed nothing measurable on the
  // H200 (docs/results/gpu_decode_profile_h200), so they are not offered.
  Status Create(nvjpegBackend_t which) {
    const NvjpegApi& api = Nvjpeg();
    NVJPEG_RETURN_NOT_OK(api.CreateEx(which, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &handle));
    NVJPEG_RETURN_NOT_OK(api.StateCreate(handle, &state));
    return Status::OK();
  }
  void Destroy() {
    if (state) Nvjpeg().StateDestroy(state);
    if (handle) Nvjpeg().Destroy(handle);
    state = nullptr;
    handle = nullptr;
  }
  // Decodes `samples` to interleaved RGB at their `dest`. One status for the batch: a file
  // either backend refuses fails the whole call, and the caller retries them elsewhere.
  Status Decode(const std::vector<GpuSample*>& samples, std::vector<nvjpegImage_t>& dest, cudaStream_t stream) {
    if (samples.empty()) return Status::OK();
    const NvjpegApi& api = Nvjpeg();
    const int n = static_cast<int>(samples.size());
    if (initialized_for != n) {
      ScopedStage timer(Stage::kLaneDecodeInit, samples.size());
      NVJPEG_RETURN_NOT_OK(api.BatchedInitialize(handle, state, n, 1, NVJPEG_OUTPUT_RGBI));
      initialized_for = n;
    }
    std::vector<const unsigned char*> data(samples.size());
    std::vector<size_t> lengths(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      data[i] = samples[i]->bytes.data();
      lengths[i] = samples[i]->bytes.size();
    }
    const nvjpegStatus_t s = api.DecodeBatched(handle, state, data.data(), lengths.data(), dest.data(), stream);
    if (s != NVJPEG_STATUS_SUCCESS) {
      initialized_for = -1;  // "also use to reset failed batches"
      return Status::IOError(std::string("nvJPEG batched decode: ") + NvjpegStatusName(s));
    }
    return Status::OK();
  }
};

}  // namespace

// A parsed-stream handle of nvJPEG (for the per-file hardware check), destroyed with it.
struct NvjpegStreamDestroy {
  void operator()(nvjpegJpegStream_t s) const noexcept { Nvjpeg().StreamDestroy(s); }
};
using ParsedStream = std::unique_ptr<std::remove_pointer_t<nvjpegJpegStream_t>, NvjpegStreamDestroy>;

struct GpuDecodeStage::Impl {
  // Members go in reverse order (each lane's parsed stream before its backends, its memory,
  // then its stream; the lanes before the staging), after the destructor has let the streams
  // finish on this device.
  GpuDecodeOptions opts;
  CudaDeviceMemory<uint8_t> staging;  // num_slots batches of uint8 NHWC
  uint64_t slot_bytes = 0;
  struct Lane {
    CudaStream stream;
    CudaPinnedMemory<ResizeCropTask> tasks_host;
    CudaDeviceMemory<ResizeCropTask> tasks_device;
    CudaDeviceMemory<uint8_t> arena;  // decoded full-size images of one batch
    uint64_t arena_bytes = 0;
    Backend hybrid, hardware;
    ParsedStream parsed;
  };
  std::vector<Lane> lanes;
  bool hardware = false;
  std::string hardware_error;  // why the hardware backend was asked for and not used
  std::string engines;         // "N engines x M cores", when nvJPEG says
  std::atomic<uint64_t> n_hardware{0}, n_hybrid{0}, n_cpu{0};

  ~Impl() {
    cudaSetDevice(opts.device);
    for (Lane& l : lanes)
      if (l.stream) cudaStreamSynchronize(l.stream.get());
  }

  // Room for every decoded image of a batch; on failure the caller decodes them on the CPU.
  Status Reserve(Lane& l, uint64_t bytes) {
    if (bytes <= l.arena_bytes) return Status::OK();
    CUDA_RETURN_NOT_OK(cudaStreamSynchronize(l.stream.get()));
    l.arena.reset();
    l.arena_bytes = 0;
    const uint64_t want = RoundUp(bytes + bytes / 4, 1 << 20);
    CUDA_RETURN_NOT_OK(CudaMalloc(&l.arena, want));
    l.arena_bytes = want;
    return Status::OK();
  }
};

GpuDecodeStage::GpuDecodeStage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GpuDecodeStage::~GpuDecodeStage() {
  if (!impl_) return;
  const GpuDecodeCounts c = counts();
  if (c.hardware + c.hybrid + c.cpu > 0) {
    LogLine("[coloader] decode gpu: %llu images by the hardware backend, %llu by the GPU hybrid backend, %llu on the CPU (cuda:%d)\n",
                 static_cast<unsigned long long>(c.hardware), static_cast<unsigned long long>(c.hybrid),
                 static_cast<unsigned long long>(c.cpu), impl_->opts.device);
  }
}

bool GpuDecodeStage::HardwareAvailable(int device, std::string* why) {
  const NvjpegApi& api = Nvjpeg();
  if (!api.ok) {
    *why = "libnvjpeg.so.13 not found (tried " + api.where + "; set COLOADER_NVJPEG_LIBRARY)";
    return false;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    *why = "no CUDA device cuda:" + std::to_string(device);
    return false;
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    *why = "cannot use cuda:" + std::to_string(device);
    return false;
  }
  nvjpegHandle_t h = nullptr;
  const nvjpegStatus_t s = api.CreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT, &h);
  if (s != NVJPEG_STATUS_SUCCESS) {
    *why = std::string("cuda:") + std::to_string(device) + " has no nvJPEG hardware backend (" + NvjpegStatusName(s) + ")";
    return false;
  }
  api.Destroy(h);
  *why = "nvJPEG hardware backend on cuda:" + std::to_string(device) + " (" + api.where + ")";
  return true;
}

Result<std::unique_ptr<GpuDecodeStage>> GpuDecodeStage::Make(const GpuDecodeOptions& o) {
  const NvjpegApi& api = Nvjpeg();
  if (!api.ok) {
    return Status::Invalid("--decode gpu: libnvjpeg.so.13 was not found (tried " + api.where +
                           "): install CUDA 13's nvJPEG or point COLOADER_NVJPEG_LIBRARY at it, or use --decode cpu");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || o.device < 0 || o.device >= count)
    return Status::Invalid("--decode gpu: no CUDA device cuda:" + std::to_string(o.device));
  CUDA_RETURN_NOT_OK(cudaSetDevice(o.device));
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  Impl& r = *impl;
  const uint64_t s = static_cast<uint64_t>(o.augment.size);
  r.slot_bytes = RoundUp(uint64_t{o.batch_size} * s * s * 3, kAlign);
  CUDA_RETURN_NOT_OK(CudaMalloc(&r.staging, r.slot_bytes * o.num_slots));
  r.lanes.resize(static_cast<size_t>(std::max(1, o.lanes)));
  r.hardware = o.use_hardware;
  for (Impl::Lane& l : r.lanes) {
    CUDA_RETURN_NOT_OK(CudaStreamCreate(&l.stream, cudaStreamNonBlocking));
    if (Status hw = r.hardware ? l.hardware.Create(NVJPEG_BACKEND_HARDWARE) : Status::OK(); !hw.ok()) {
      r.hardware_error = hw.message();
      l.hardware.Destroy();
      r.hardware = false;  // no engine on this GPU: the hybrid backend decodes everything
    }
    if (r.hardware) {
      nvjpegJpegStream_t parsed = nullptr;
      NVJPEG_RETURN_NOT_OK(api.StreamCreate(l.hardware.handle, &parsed));
      l.parsed.reset(parsed);
    }
    COLOADER_RETURN_NOT_OK(l.hybrid.Create(NVJPEG_BACKEND_GPU_HYBRID));
    CUDA_RETURN_NOT_OK(CudaMallocHost(&l.tasks_host, sizeof(ResizeCropTask) * o.batch_size));
    CUDA_RETURN_NOT_OK(CudaMalloc(&l.tasks_device, sizeof(ResizeCropTask) * o.batch_size));
  }
  unsigned engines = 0, cores = 0;
  if (r.hardware && api.HardwareInfo &&
      api.HardwareInfo(r.lanes[0].hardware.handle, &engines, &cores) == NVJPEG_STATUS_SUCCESS)
    r.engines = std::to_string(engines) + " engines x " + std::to_string(cores) + " cores";
  if (!r.hardware) {
    for (Impl::Lane& l : r.lanes) {
      l.parsed.reset();
      l.hardware.Destroy();
    }
  }
  return std::unique_ptr<GpuDecodeStage>(new GpuDecodeStage(std::move(impl)));
}

namespace {

// Which decoder takes each of a batch's samples.
struct Routes {
  std::vector<uint32_t> hw, hybrid, on_cpu;  // positions, by decoder
  std::vector<uint64_t> offset;              // each GPU sample's place in the lane's arena
  uint64_t arena = 0;                        // the bytes of every decoded image
};

// Finish, step 1: the hardware backend where nvJPEG says it can (its header parse and
// batched-support check), the hybrid backend for the other GPU files; all on the CPU when
// the lane's arena cannot hold them.
Routes RouteSamples(GpuDecodeStage::Impl& r, GpuDecodeStage::Impl::Lane& l, const std::vector<GpuSample>& samples,
                    const std::vector<bool>& failed) {
  const NvjpegApi& api = Nvjpeg();
  const uint32_t n = static_cast<uint32_t>(samples.size());
  Routes routes;
  routes.offset.assign(n, 0);
  auto hardware_takes = [&](const GpuSample& g) {
    int unsupported = 1;
    return api.ParseHeader(l.hardware.handle, g.bytes.data(), g.bytes.size(), l.parsed.get()) == NVJPEG_STATUS_SUCCESS &&
           api.BatchedSupported(l.hardware.handle, l.parsed.get(), &unsupported) == NVJPEG_STATUS_SUCCESS &&
           unsupported == 0;
  };
  {
    ScopedStage timer(Stage::kLaneRoute, 0);
    for (uint32_t i = 0; i < n; ++i) {
      const GpuSample& g = samples[i];
      if (failed[i] || !g.on_gpu) continue;
      routes.offset[i] = routes.arena;
      routes.arena += RoundUp(uint64_t(g.width) * g.height * 3, kAlign);
      (r.hardware && hardware_takes(g) ? routes.hw : routes.hybrid).push_back(i);
    }
    timer.set_images(routes.hw.size() + routes.hybrid.size());
  }
  Status reserved;
  {
    ScopedStage timer(Stage::kLaneReserve, routes.hw.size() + routes.hybrid.size());
    reserved = r.Reserve(l, routes.arena);
  }
  if (!reserved.ok()) {
    // Not enough device memory for this batch's images: the CPU decodes them.
    routes.on_cpu.insert(routes.on_cpu.end(), routes.hw.begin(), routes.hw.end());
    routes.on_cpu.insert(routes.on_cpu.end(), routes.hybrid.begin(), routes.hybrid.end());
    routes.hw.clear();
    routes.hybrid.clear();
  }
  return routes;
}

// Finish, step 2: each backend decodes its files into the arena; what one refuses goes to
// the next (hardware, hybrid, CPU), and a file the CPU cannot decode either is a failure.
void DecodeSamples(GpuDecodeStage::Impl::Lane& l, GpuBatch& batch, Routes& routes, uint64_t sample_bytes,
                   std::vector<bool>& failed) {
  std::vector<GpuSample>& samples = *batch.samples;
  auto decode = [&](Backend& b, const std::vector<uint32_t>& which) -> Status {
    std::vector<GpuSample*> chosen;
    std::vector<nvjpegImage_t> dest(which.size());
    for (size_t k = 0; k < which.size(); ++k) {
      GpuSample& g = samples[which[k]];
      chosen.push_back(&g);
      dest[k] = nvjpegImage_t{};
      dest[k].channel[0] = l.arena.get() + routes.offset[which[k]];
      dest[k].pitch[0] = static_cast<size_t>(g.width) * 3;
    }
    return b.Decode(chosen, dest, l.stream.get());
  };
  if (!routes.hw.empty()) {
    ScopedStage timer(Stage::kLaneDecodeHardware, routes.hw.size());
    if (!decode(l.hardware, routes.hw).ok()) {
      // One file it refused fails its batch: the hybrid backend takes them all.
      routes.hybrid.insert(routes.hybrid.end(), routes.hw.begin(), routes.hw.end());
      routes.hw.clear();
    }
  }
  if (!routes.hybrid.empty()) {
    ScopedStage timer(Stage::kLaneDecodeHybrid, routes.hybrid.size());
    if (!decode(l.hybrid, routes.hybrid).ok()) {
      routes.on_cpu.insert(routes.on_cpu.end(), routes.hybrid.begin(), routes.hybrid.end());
      routes.hybrid.clear();
    }
  }
  if (!routes.on_cpu.empty()) {
    ScopedStage timer(Stage::kLaneCpuFallback, routes.on_cpu.size());
    for (uint32_t i : routes.on_cpu) {
      GpuSample& g = samples[i];
      const Status st = batch.cpu(i, g.bytes.data(), g.bytes.size(), batch.host_staging + i * sample_bytes);
      g.on_gpu = false;
      if (!st.ok()) {
        failed[i] = true;
        batch.failures->emplace_back(i, st.message());
      }
    }
  }
}

// Finish, step 3: every sample at its own position of the slot's device staging (the GPU's
// resized from the arena by one kernel, the CPU's copied up); a failed one then takes its
// replacement's, as the pool does on the host. Returns the samples placed.
Result<uint32_t> AssembleSlot(GpuDecodeStage::Impl::Lane& l, const std::vector<GpuSample>& samples,
                              const Routes& routes, const uint8_t* host_staging, uint8_t* dst, uint64_t sample_bytes,
                              int out_size, Interpolation interpolation, bool exact, uint64_t cpu_count, const std::vector<bool>& failed) {
  const uint32_t n = static_cast<uint32_t>(samples.size());
  uint32_t tasks = 0, out = 0;
  {
    ScopedStage timer(Stage::kLaneCopyCpuSamples, cpu_count);
    for (uint32_t i = 0; i < n; ++i) {
      if (failed[i]) continue;
      const GpuSample& g = samples[i];
      if (g.on_gpu) {
        ResizeCropTask& t = l.tasks_host.get()[tasks++];
        t = TaskFor(g.box, g.width, g.height, out_size, interpolation, exact);
        t.src = l.arena.get() + routes.offset[i];
        t.pitch = g.width * 3;
        t.dst_index = i;
      } else {
        CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dst + i * sample_bytes, host_staging + i * sample_bytes, sample_bytes,
                                           cudaMemcpyHostToDevice, l.stream.get()));
      }
      ++out;
    }
  }
  if (tasks > 0) {
    ScopedStage timer(Stage::kLaneResize, tasks);
    CUDA_RETURN_NOT_OK(cudaMemcpyAsync(l.tasks_device.get(), l.tasks_host.get(), sizeof(ResizeCropTask) * tasks,
                                       cudaMemcpyHostToDevice, l.stream.get()));
    COLOADER_RETURN_NOT_OK(ResizeCropBatchOnDevice(l.tasks_device.get(), tasks, out_size, dst, l.stream.get()));
  }
  for (uint32_t i = 0; i < n && out > 0; ++i) {
    if (!failed[i]) continue;
    const uint32_t from = *ReplacementFor(i, failed);  // one exists: out > 0 samples decoded
    CUDA_RETURN_NOT_OK(cudaMemcpyAsync(dst + i * sample_bytes, dst + from * sample_bytes, sample_bytes,
                                       cudaMemcpyDeviceToDevice, l.stream.get()));
  }
  return out;
}

}  // namespace

Result<uint32_t> GpuDecodeStage::Finish(int lane_index, GpuBatch& batch) {
  Impl& r = *impl_;
  Impl::Lane& l = r.lanes[static_cast<size_t>(lane_index)];
  CUDA_RETURN_NOT_OK(cudaSetDevice(r.opts.device));
  std::vector<GpuSample>& samples = *batch.samples;
  const uint32_t n = static_cast<uint32_t>(samples.size());
  const uint64_t s = static_cast<uint64_t>(r.opts.augment.size);
  const uint64_t sample_bytes = s * s * 3;
  std::vector<bool> failed(n, false);
  for (const auto& f : *batch.failures) failed[f.first] = true;

  Routes routes = RouteSamples(r, l, samples, failed);
  DecodeSamples(l, batch, routes, sample_bytes, failed);
  uint64_t cpu_count = 0;
  for (uint32_t i = 0; i < n; ++i) cpu_count += !failed[i] && !samples[i].on_gpu;
  r.n_hardware += routes.hw.size();
  r.n_hybrid += routes.hybrid.size();
  const auto gpu_decoded = static_cast<uint32_t>(routes.hw.size() + routes.hybrid.size());
  r.n_cpu += cpu_count;

  uint8_t* dst = r.staging.get() + batch.slot * r.slot_bytes;
  COLOADER_ASSIGN_OR_RETURN(const uint32_t out, AssembleSlot(l, samples, routes, batch.host_staging, dst, sample_bytes,
                                                             r.opts.augment.size,
                                                             r.opts.augment.interpolation, r.opts.augment.exact_resize, cpu_count,
                                                             failed));
  // The producer publishes once this returns: the slot's device staging must be complete.
  // This wait sleeps (serve sets cudaDeviceScheduleBlockingSync; phase 1 measured 0.2 µs of
  // CPU per image here against up to 35 µs of wall): the lane's CPU is inside nvJPEG.
  {
    ScopedStage timer(Stage::kLaneSync, out);
    CUDA_RETURN_NOT_OK(cudaStreamSynchronize(l.stream.get()));
  }
  for (uint32_t i = 0; i < n; ++i) std::vector<uint8_t>().swap(samples[i].bytes);
  return gpu_decoded;
}

const uint8_t* GpuDecodeStage::device_staging(uint32_t slot) const { return impl_->staging.get() + slot * impl_->slot_bytes; }
int GpuDecodeStage::device() const { return impl_->opts.device; }
int GpuDecodeStage::lanes() const { return static_cast<int>(impl_->lanes.size()); }
bool GpuDecodeStage::hardware() const { return impl_->hardware; }
const AugmentOptions& GpuDecodeStage::augment() const { return impl_->opts.augment; }
GpuDecodeCounts GpuDecodeStage::counts() const {
  return {impl_->n_hardware.load(), impl_->n_hybrid.load(), impl_->n_cpu.load()};
}
std::string GpuDecodeStage::description() const {
  const std::string unused =
      impl_->hardware_error.empty() ? "" : " (no hardware backend: " + impl_->hardware_error + ")";
  const std::string engines = impl_->engines.empty() ? "" : " (" + impl_->engines + ")";
  return std::string(impl_->hardware ? "nvJPEG hardware backend" : "nvJPEG GPU hybrid backend") + engines + unused +
         " on cuda:" + std::to_string(impl_->opts.device) + ", " + std::to_string(impl_->lanes.size()) +
         (impl_->lanes.size() == 1 ? " lane" : " lanes") + "; " + Nvjpeg().where;
}

}  // namespace coloader
