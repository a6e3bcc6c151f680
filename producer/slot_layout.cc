#include "producer/slot_layout.h"

#include <cstdio>

#include "common/align.h"
#include "common/mailbox.h"

namespace coloader {

namespace {
constexpr uint64_t kPageBytes = 4096;

// Where the options are spelled as `serve` flags and where as coloader.Producer arguments.
struct Words {
  const char* window;
  const char* batch;
};
Words WordsFor(const ProducerOptions& o) {
  return o.external ? Words{"window=", "batch_size="} : Words{"--window ", "--batch-size "};
}

std::string Plural(uint64_t n, const char* one) { return std::to_string(n) + " " + one + (n == 1 ? "" : "s"); }

// The largest value in [lo, hi] for which `fits` holds (it is monotone), or 0 if none does.
template <typename Fits>
uint64_t LargestFitting(uint64_t lo, uint64_t hi, Fits fits) {
  if (lo > hi || !fits(lo)) return 0;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid; else hi = mid - 1;
  }
  return lo;
}
}  // namespace

SlotLayouts MakeSlotLayouts(const ProducerOptions& o, const std::string& shm_name) {
  SlotTable t;
  t.shm_name = shm_name;
  // K slots bound every consumer's lag; the spares let one keep old batches (tensors it
  // holds on to) while it goes on reading, without stalling the others.
  t.num_slots = o.window + static_cast<uint32_t>(o.spare_slots);
  t.batch_size = o.batch_size;
  t.height = static_cast<uint32_t>(o.dataset.image_size);
  t.width = static_cast<uint32_t>(o.dataset.image_size);
  t.channels = 3;
  t.dtype = o.dataset.output;
  t.layout = o.dataset.layout;
  if (o.external) {
    // The caller's fields, as they are: the GPU ring takes a copy of them, no staging.
    t.height = t.width = t.channels = 1;
    t.dtype = DType::kUInt8;
    t.fields = o.external->fields;
    t.structure = o.external->structure;
  }
  t.indices_offset = 0;
  t.labels_offset = 8ull * o.batch_size;
  t.data_offset = RoundUp(16ull * o.batch_size, kPageBytes);
  uint64_t end = t.data_offset + t.data_bytes(o.batch_size);
  SlotTable staging = t;
  if (!o.devices.empty() && !o.external) {
    staging.dtype = DType::kUInt8;
    staging.layout = TensorLayout::kNHWC;
    staging.data_offset = RoundUp(end, kPageBytes);
    end = staging.data_offset + uint64_t{o.batch_size} * staging.sample_bytes();
  }
  t.slot_bytes = staging.slot_bytes = RoundUp(end, kPageBytes);
  return {t, staging};
}

SharedMemory::Ranges StartReservation(const SlotLayouts& l, bool device) {
  const SlotTable& t = l.table;
  if (!device) return {{0, t.slot_bytes * t.num_slots}};
  SharedMemory::Ranges r;
  auto add = [&r](uint64_t offset, uint64_t length) {
    // A slot's staging ends where the next slot's indices begin: one range (one fallocate,
    // one cudaHostRegister) for the two.
    if (!r.empty() && r.back().first + r.back().second == offset) r.back().second += length;
    else r.emplace_back(offset, length);
  };
  for (uint64_t s = 0; s < t.num_slots; ++s) {
    const uint64_t base = s * t.slot_bytes;
    add(base, t.data_offset);                                                  // indices, labels
    add(base + l.staging.data_offset, t.slot_bytes - l.staging.data_offset);  // uint8 staging
  }
  return r;
}

SharedMemory::Ranges HostTensorReservation(const SlotLayouts& l, bool device) {
  const SlotTable& t = l.table;
  if (!device || l.staging.data_offset == t.data_offset) return {};  // a caller's fields: read where they are
  SharedMemory::Ranges r;
  for (uint64_t s = 0; s < t.num_slots; ++s)
    r.emplace_back(s * t.slot_bytes + t.data_offset, l.staging.data_offset - t.data_offset);
  return r;
}

uint64_t TotalBytes(const SharedMemory::Ranges& r) {
  uint64_t sum = 0;
  for (const auto& [offset, length] : r) sum += length;
  return sum;
}

uint32_t MailboxCapacity(uint32_t num_slots) {
  // A consumer never has more than `window` announcements outstanding; twice the ring is slack.
  uint32_t capacity = 8;
  while (capacity < 2 * num_slots) capacity *= 2;
  return capacity;
}

uint64_t ShmBytesAtStart(const ProducerOptions& o) {
  const SlotLayouts l = MakeSlotLayouts(o, "");
  return TotalBytes(StartReservation(l, !o.devices.empty())) +
         MailboxArea::BytesFor(kMailboxes, MailboxCapacity(l.table.num_slots));
}

std::string ShmTooSmallMessage(const ProducerOptions& o, const ShmSpace& space) {
  const SlotLayouts l = MakeSlotLayouts(o, "");
  const SlotTable& t = l.table;
  const bool device = !o.devices.empty();
  const uint64_t need = ShmBytesAtStart(o);
  const uint64_t slot_reserved = TotalBytes(StartReservation(l, device)) / t.num_slots;
  const uint64_t mailboxes = need - slot_reserved * t.num_slots;
  const Words w = WordsFor(o);
  const std::string sides = std::to_string(t.channels) + "x" + std::to_string(t.height) + "x" + std::to_string(t.width);
  const std::string shape = o.external ? Plural(t.fields.size(), "field") + " of " + HumanBytes(t.sample_bytes()) + " a sample"
                                       : sides + " " + DTypeName(t.dtype);

  std::string m = std::string(kShmDir) + " has " + HumanBytes(space.free_bytes) + " free (of " +
                  HumanBytes(space.total_bytes) + "), and this producer needs " + HumanBytes(need) + ": " +
                  Plural(t.num_slots, "slot") + " (" + w.window + std::to_string(o.window) + " + " +
                  std::to_string(o.spare_slots) + " spare) x " + HumanBytes(slot_reserved) + " per slot (" +
                  std::to_string(t.batch_size) + " samples of ";
  if (device && !o.external) m += sides + " uint8 staging for the GPU";
  else m += shape;
  m += ", with their indices and labels) + " + HumanBytes(mailboxes) + " of consumer mailboxes. Ways out:\n";
  // What is used already plus the ring, and a quarter more: other programs use /dev/shm too
  // (NCCL, PyTorch's DataLoader workers).
  const uint64_t used = space.total_bytes > space.free_bytes ? space.total_bytes - space.free_bytes : 0;
  const std::string room = std::to_string(((used + need) * 5 / 4 >> 20) + 1);
  m += "  - give " + std::string(kShmDir) + " room for it: `docker run --shm-size=" + room +
       "m` (or --ipc=host), or in Kubernetes an emptyDir volume with `medium: Memory` and `sizeLimit: " + room +
       "Mi` mounted at /dev/shm;\n";

  // Smaller rings, each with its figure, found by trying: the formula is not linear in all of
  // them (page rounding, the mailboxes).
  auto fits = [&](ProducerOptions x) { return ShmBytesAtStart(x) <= space.free_bytes; };
  std::string smaller;
  auto add = [&](const std::string& what) { smaller += (smaller.empty() ? "" : ", ") + what; };
  if (uint64_t k = LargestFitting(2, o.window, [&](uint64_t k) {
        ProducerOptions x = o;
        x.window = static_cast<uint32_t>(k);
        x.spare_slots = 1;
        return fits(x);
      }); k > 0) {
    add(std::string(w.window) + std::to_string(k) + (o.external ? "" : " --spare-slots 1"));
  }
  if (uint64_t b = LargestFitting(1, o.batch_size, [&](uint64_t b) {
        ProducerOptions x = o;
        x.batch_size = static_cast<uint32_t>(b);
        return fits(x);
      }); b > 0) {
    add(std::string(w.batch) + std::to_string(b) + " or less");
  }
  if (!o.external) {
    if (uint64_t s = LargestFitting(8, static_cast<uint64_t>(o.dataset.image_size), [&](uint64_t s) {
          ProducerOptions x = o;
          x.dataset.image_size = static_cast<int>(s);
          return fits(x);
        }); s > 0) {
      add("--image-size " + std::to_string(s) + " or less");
    }
    ProducerOptions x = o;
    x.dataset.output = DType::kUInt8;
    if (!device && o.dataset.output != DType::kUInt8 && fits(x)) add("--output uint8 (normalise on the GPU)");
  }
  m += std::string("  - or a smaller ring: lower ") +
       (o.external ? "window= or batch_size=" : "--window (the lag window), --batch-size or --image-size") + (smaller.empty() ? " (no one of them alone fits: combine them)"
                                                                 : " (each alone fits at: " + smaller + ")") + ";\n";
  ProducerOptions on_gpu = o;
  on_gpu.devices = {0};
  if (!device && !o.external && ShmBytesAtStart(on_gpu) < need) {
    const ProducerOptions& x = on_gpu;
    m += "  - or --device cuda:N: the ring lives in GPU memory and " + std::string(kShmDir) +
         " holds only the uint8 staging, " + HumanBytes(ShmBytesAtStart(x)) + " (" + Plural(t.num_slots, "slot") +
         " x " + HumanBytes(TotalBytes(StartReservation(MakeSlotLayouts(x, ""), true)) / t.num_slots) + ").";
  } else if (device && !o.external) {
    m += "  - host-path consumers of this GPU ring will need " + HumanBytes(TotalBytes(HostTensorReservation(l, true))) +
         " more, reserved when the first attaches.";
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ';')) m.pop_back();
  return m;
}

std::optional<std::string> LargeRingWarning(uint64_t ring_bytes, uint64_t ram) {
  if (ram == 0 || ring_bytes * 2 <= ram) return std::nullopt;
  char share[16];
  std::snprintf(share, sizeof(share), "%.0f%%", 100.0 * static_cast<double>(ring_bytes) / static_cast<double>(ram));
  return "the ring and mailboxes take " + HumanBytes(ring_bytes) + " in /dev/shm, " + share + " of this machine's " +
         HumanBytes(ram) + " of memory, and the training jobs beside it need theirs: a smaller --window, "
         "--batch-size or --image-size, or --device cuda:N (the ring in GPU memory), make it smaller";
}

}  // namespace coloader
