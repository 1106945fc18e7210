#include "framework/kernels/buffer.h"

#include <utility>

namespace stillpoint {

Buffer::Buffer(std::size_t bytes) : bytes_(bytes) {
  data_ = AcquirePooledBuffer(bytes == 0 ? 1 : bytes, &capacity_);
}

Buffer::Buffer(void* data, std::size_t bytes, std::shared_ptr<const void> owner)
    : data_(data), bytes_(bytes), external_(true), owner_(std::move(owner)) {}

Buffer::~Buffer() {
  if (!external_) ReleasePooledBuffer(data_, capacity_);
}

}  // namespace stillpoint
