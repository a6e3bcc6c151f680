// The layout of one ring slot in host shared memory: dataset indices, labels, then the tensor
// on its own page; with a device ring, the workers' uint8 NHWC staging area follows (uploaded
// from there), and the tensor area is filled only for consumers on the host path. A caller-fed
// producer's slot holds its fields instead of the tensor (FieldOffsets), which a device ring
// copies as they are: no staging, and host-path consumers read them where the caller wrote them.
//
// What /dev/shm must hold is decided here too. Without a device ring every byte of the ring is
// reserved at start. With one, only what the producer itself writes is: each slot's indices,
// labels and uint8 staging; the tensor areas (for host-path consumers of a GPU producer: tcp://
// peers, consumers without a GPU or across MIG) are reserved when the first of them attaches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/protocol.h"
#include "common/shm.h"
#include "producer/options.h"

namespace coloader {

struct SlotLayouts {
  SlotTable table;    // what consumers map
  SlotTable staging;  // what the workers write: the same slots, uint8 NHWC at the staging offset
};
SlotLayouts MakeSlotLayouts(const ProducerOptions& o, const std::string& shm_name);

// The ranges of the host ring reserved at start, and (with a device ring) the host-path tensor
// areas reserved later; the second is empty without a device ring.
SharedMemory::Ranges StartReservation(const SlotLayouts& l, bool device);
SharedMemory::Ranges HostTensorReservation(const SlotLayouts& l, bool device);
uint64_t TotalBytes(const SharedMemory::Ranges& r);

// Entries per consumer mailbox for a ring of `num_slots`.
uint32_t MailboxCapacity(uint32_t num_slots);
constexpr uint32_t kMailboxes = 256;  // local consumers served through shared-memory mailboxes
constexpr uint32_t kMaxSessionsPerProcess = 64;  // consumers of one producer in one process

// The bytes of /dev/shm the producer reserves at start with these options: ring and mailboxes.
uint64_t ShmBytesAtStart(const ProducerOptions& o);

// /dev/shm is memory: a ring that takes more than half of the machine's `ram` starts, but the
// jobs beside it (and the page cache the decoders read through) find little left. What to say
// then, or nothing.
std::optional<std::string> LargeRingWarning(uint64_t ring_bytes, uint64_t ram);

// The one message for a /dev/shm that cannot hold the ring: what the filesystem has, what the
// ring needs (slots x slot bytes, and of what), and every way out with its figure.
std::string ShmTooSmallMessage(const ProducerOptions& o, const ShmSpace& space);

}  // namespace coloader
