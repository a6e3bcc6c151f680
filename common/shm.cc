#include "common/shm.h"

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

namespace bip = boost::interprocess;

namespace coloader {

struct SharedMemory::Impl {
  bip::mapped_region region;
};

SharedMemory::SharedMemory() = default;
SharedMemory::SharedMemory(SharedMemory&&) noexcept = default;
SharedMemory& SharedMemory::operator=(SharedMemory&&) noexcept = default;
SharedMemory::~SharedMemory() = default;

uint8_t* SharedMemory::data() const {
  return impl_ ? static_cast<uint8_t*>(impl_->region.get_address()) : nullptr;
}
size_t SharedMemory::size() const { return impl_ ? impl_->region.get_size() : 0; }

Result<SharedMemory> SharedMemory::Create(const std::string& name, size_t bytes) {
  try {
    bip::shared_memory_object::remove(name.c_str());
    bip::permissions perm;
    perm.set_permissions(0600);
    bip::shared_memory_object obj(bip::create_only, name.c_str(), bip::read_write, perm);
    obj.truncate(static_cast<bip::offset_t>(bytes));
    SharedMemory shm;
    shm.impl_ = std::make_unique<Impl>();
    shm.impl_->region = bip::mapped_region(obj, bip::read_write, 0, bytes);
    shm.name_ = name;
    return shm;
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return Status::IOError("cannot create shared memory /dev/shm/" + name + " of " +
                           std::to_string(bytes >> 20) + " MiB: " + e.what() +
                           " (is /dev/shm large enough? lower --window or --batch-size)");
  }
}

Result<SharedMemory> SharedMemory::Open(const std::string& name, size_t expected_bytes,
                                        bool writable) {
  try {
    auto mode = writable ? bip::read_write : bip::read_only;
    bip::shared_memory_object obj(bip::open_only, name.c_str(), mode);
    bip::offset_t size = 0;
    if (!obj.get_size(size) || static_cast<size_t>(size) < expected_bytes) {
      return Status::Protocol("shared memory /dev/shm/" + name + " holds " + std::to_string(size) +
                              " bytes, the producer announced " + std::to_string(expected_bytes));
    }
    SharedMemory shm;
    shm.impl_ = std::make_unique<Impl>();
    shm.impl_->region = bip::mapped_region(obj, mode, 0, expected_bytes);
    shm.name_ = name;
    return shm;
  } catch (const bip::interprocess_exception& e) {
    return Status::IOError("cannot map the producer's shared memory /dev/shm/" + name + ": " +
                           e.what());
  }
}

bool SharedMemory::Remove(const std::string& name) {
  return bip::shared_memory_object::remove(name.c_str());
}

}  // namespace coloader
