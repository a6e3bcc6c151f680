// Single-thread cost of one training sample on the host path: read, decode, RandomResizedCrop,
// flip, normalise to float32 NCHW (SampleTransform): as shipped (DCT-domain scaling, and only
// the crop's region decoded), without the region decode, and with neither.
// Prints one JSON line per configuration; benchmarks/run_decode_bench.sh runs it next to the
// PIL + torchvision equivalent (pil_decode_bench.py) on the same files, pinned to one core.
//
//   decode_bench DATASET_DIR [--limit N] [--size 224] [--passes P] [--mode train|eval]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/assemble/sample_transform.h"

namespace fs = std::filesystem;
using coloader::SampleTransform;
using coloader::TransformOptions;

namespace {

struct Args {
  std::string root;
  size_t limit = 0;  // 0: all files
  int size = 224;
  int passes = 1;
  std::string mode = "train";
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "decode_bench: %s\nusage: decode_bench DATASET_DIR [--limit N] [--size 224] "
               "[--passes P] [--mode train|eval]\n",
               msg);
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    if (arg == "--limit") {
      a.limit = std::stoul(value());
    } else if (arg == "--size") {
      a.size = std::stoi(value());
    } else if (arg == "--passes") {
      a.passes = std::max(1, std::stoi(value()));
    } else if (arg == "--mode") {
      a.mode = value();
    } else if (!arg.empty() && arg[0] == '-') {
      Usage(("unknown flag " + arg).c_str());
    } else if (a.root.empty()) {
      a.root = arg;
    } else {
      Usage("more than one dataset directory");
    }
  }
  if (a.root.empty()) Usage("no dataset directory");
  return a;
}

// Every regular file under root, sorted: the same list pil_decode_bench.py builds, so both
// sides see the same images (odd and broken files included, as a real loader would).
std::vector<std::string> ListFiles(const std::string& root, size_t limit) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it); it.increment(ec)) {
    if (it->is_regular_file()) files.push_back(it->path().string());
  }
  if (ec) {
    std::fprintf(stderr, "decode_bench: cannot list %s: %s\n", root.c_str(), ec.message().c_str());
    std::exit(1);
  }
  std::sort(files.begin(), files.end());
  if (limit && files.size() > limit) files.resize(limit);
  return files;
}

void RunConfig(const std::string& name, TransformOptions opts, const std::vector<std::string>& files,
               int passes) {
  std::vector<uint8_t> out;
  // Warm up (page cache, allocator, decoder tables) on a separate instance, so the histogram
  // below counts the timed decodes only.
  {
    SampleTransform warm(opts);
    out.resize(warm.sample_bytes());
    for (size_t i = 0; i < std::min<size_t>(files.size(), 50); ++i) {
      (void)warm.Run(files[i], 0, 0, i, out.data());
    }
  }
  SampleTransform t(opts);
  size_t errors = 0, done = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < files.size(); ++i) {
      const coloader::Status st = t.Run(files[i], 0, static_cast<uint64_t>(pass), i, out.data());
      if (!st.ok()) {
        if (pass == 0 && errors < 5) std::fprintf(stderr, "decode_bench: %s\n", st.ToString().c_str());
        ++errors;
      }
      ++done;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t* h = t.scale_histogram();
  std::printf(
      "{\"bench\": \"decode\", \"impl\": \"coloader\", \"config\": \"%s\", \"mode\": \"%s\", "
      "\"size\": %d, \"images\": %zu, \"errors\": %zu, \"seconds\": %.4f, \"images_per_s\": %.1f, "
      "\"region_decodes\": %llu, \"scale_hist\": {\"1\": %llu, \"2\": %llu, \"4\": %llu, \"8\": %llu}}\n",
      name.c_str(), coloader::AugmentModeName(opts.augment.mode), opts.augment.size, done, errors, secs,
      static_cast<double>(done) / secs, static_cast<unsigned long long>(t.region_decodes()),
      static_cast<unsigned long long>(h[1]),
      static_cast<unsigned long long>(h[2]), static_cast<unsigned long long>(h[4]),
      static_cast<unsigned long long>(h[8]));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  auto mode = coloader::ParseAugmentMode(args.mode);
  if (!mode.ok()) Usage(mode.status().message().c_str());
  const std::vector<std::string> files = ListFiles(args.root, args.limit);
  if (files.empty()) Usage(("no files under " + args.root).c_str());

  TransformOptions opts;
  opts.augment.mode = *mode;
  opts.augment.size = args.size;
  opts.output = coloader::DType::kFloat32;
  opts.layout = coloader::TensorLayout::kNCHW;
  opts.dct_scaling = true;
  opts.crop_decode = true;
  RunConfig("dct_region", opts, files, args.passes);
  opts.crop_decode = false;
  RunConfig("dct", opts, files, args.passes);
  opts.dct_scaling = false;
  RunConfig("no_dct", opts, files, args.passes);
  return 0;
}
