// What a producer is asked to do: the options `serve` spells as flags and coloader.Producer as
// arguments (tools/cli_serve.cc, producer/c_api.cc), in three parts: what every producer
// needs, what one reading a dataset needs, what one fed by its caller needs. Apart from producer.h so that the ring's
// layout (slot_layout.h) reads them without depending on the producer itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "pipeline/transform/augment.h"
#include "pipeline/transform/recipe.h"
#include "pipeline/decode/gpu_decode.h"
#include "pipeline/transform/normalize.h"

namespace coloader {

enum class OnBadFile { kSkip, kFail };

// What a producer that reads a dataset needs (`coloader serve`, DatasetSource): where the data
// is, how it is decoded and augmented, and which share of it this producer serves.
struct DatasetOptions {
  std::string data;         // ImageFolder directory, file list or WebDataset shards
  std::string label_field;  // shards: the label from this integer field of KEY.json ("": KEY.cls)
  // Shards read whole (http(s)://, pipe:, .tar.gz): the cap on one shard's bytes (0: the
  // default, DefaultMaxShardBytes) and the deadline of one shard's fetch, every attempt together.
  uint64_t max_shard_bytes = 0;
  double shard_timeout_s = 900;
  int image_size = 224;
  int workers = 0;          // 0: one per online CPU
  uint64_t seed = 0;
  bool shuffle = true;
  AugmentMode augment = AugmentMode::kTrain;
  // `--transform FILE`: the recipe (its size is image_size); unset: --augment's named recipe.
  std::shared_ptr<const Recipe> recipe;
  DType output = DType::kFloat32;  // bfloat16 and float16 need a device
  TensorLayout layout = TensorLayout::kNCHW;
  bool dct_scaling = true;
  bool crop_decode = true;  // JPEG: decode only the crop's region (TransformOptions::crop_decode)
  DecodeMode decode = DecodeMode::kCpu;  // gpu: nvJPEG + GPU augmentation, each device its share
  int gpu_lanes = 1;  // batches each decoding GPU works on at once (GpuDecodeOptions::lanes)
  // With GPU decoding, what the CPU workers decode of each batch (DecodeSplit). Unset: the
  // mode's own (auto: follows demand; gpu: only what the GPU cannot decode).
  std::optional<CpuShare> cpu_share;
  OnBadFile on_bad_file = OnBadFile::kSkip;
  int rank = 0;       // the node shard: --rank of --world-size
  int world_size = 1;
  // `serve --resume STATE`: start where a checkpointed consumer (group) resumes, rather than
  // at epoch 0: the round of its split holding its next batch (common/split.h).
  struct ResumePoint {
    bool set = false;
    uint64_t epoch = 0;
    uint64_t begin = 0;    // where that epoch's split began (a late group: its join point)
    uint64_t origin = 0;   // a group caught up in that epoch: where its order began (0: not)
    uint64_t samples = 0;  // samples each rank had taken in it
    uint32_t world_size = 1, batch_size = 1;
    bool drop_last = false;
    std::string data_key;  // the producer's data key when the state was saved ("": unchecked)
  } resume;
};

// What a producer fed by its caller needs (ExternalSource, coloader.Producer): the schema of its
// batches (each field's dtype and per-sample shape; `structure`, how they nest, for the
// bindings) and, if the caller knows it, the samples of an epoch (for len() on consumers).
// With `devices`, every field is copied to the GPU ring as it is.
struct ExternalOptions {
  std::vector<FieldSpec> fields;
  std::string structure;
  uint64_t epoch_samples = 0;
};

// What every producer needs: its name, batch size and ring, its run, its consumers' liveness,
// where it serves; then what its source needs, a dataset's or the caller's.
struct ProducerOptions {
  std::string name;
  uint32_t batch_size = 256;  // a caller-fed producer: the most one batch carries
  uint32_t window = 4;      // K: how many batches the producer may run ahead of how far the
                            // slowest consumer has read (WithinWindow); the ring has K + spare slots
  int spare_slots = -1;     // ring slots beyond K, for batches a consumer keeps while it reads
                            // on (a held tensor): -1 means K / 2, at least 1
  uint64_t epochs = 1;      // 0 with forever
  bool forever = false;
  std::vector<int> devices;        // CUDA devices with a ring (--device cuda:N[,cuda:M...]); empty: host only
  uint32_t min_consumers = 1;
  uint32_t heartbeat_ms = 500;
  uint32_t heartbeat_timeout_ms = 5000;
  // A consumer that holds the others back this long (it took no batch while the producer
  // waited on it, or its kept batches filled the ring and could not be copied away) is
  // detached, with a message saying so. Only while someone else waits; 0: never.
  uint32_t stall_timeout_ms = 60000;
  // A consumer that holds the others back this long without taking a batch (and longer than 4
  // of its own steps: a pause, not a slow pace) while another waits is caught up instead of
  // waited for (LagCatchUp): the batches it has not taken go back, the rest of its epoch is
  // decoded again for it alone, then it reads the shared stream like a late joiner. Only where
  // it may be caught up (a plain local consumer); others wait for stall_timeout_ms. 0: never.
  uint32_t lag_timeout_ms = 2000;
  // Once the first epoch has started, end the run when no consumer has been attached this
  // long (Run() returns RunEnd::kConsumersLeft and logs how far it got). 0: wait for consumers
  // forever, as `serve --forever` does (a consumer may come back).
  uint32_t alone_timeout_ms = 0;
  int progress_interval_ms = 1000;  // 0: no progress lines
  // A consumer that joins mid-epoch reads the rest of it with the others, then the samples it
  // missed, decoded again for it alone, so that its epoch is whole (catch_up.cc).
  // Off: its first epoch is partial (the rest of the one it joined).
  bool catch_up = true;

  // Also serve consumers on other machines at this tcp:// endpoint (host path, batches sent as
  // message payload). It takes CURVE keys: the producer's key pair and the consumers' public
  // keys it accepts; without them it refuses to start unless `insecure`.
  std::string tcp_endpoint;
  std::string curve_key_file;
  std::string authorized_keys_file;
  bool insecure = false;

  DatasetOptions dataset;                   // what `serve` reads (unused when `external` is set)
  std::optional<ExternalOptions> external;  // set: the caller feeds the batches, no dataset
};

}  // namespace coloader
