// A block of raw storage owned by a Tensor (shared between views), taken from
// and returned to the buffer pool (framework/buffer_pool.h: its statistics
// and limits are public; the buffer is not).
#pragma once

#include <cstddef>
#include <memory>

namespace stillpoint {

class Buffer {
 public:
  explicit Buffer(std::size_t bytes);
  // Storage the pool does not own (a NumPy array's, for the Python
  // bindings): `owner` keeps `data` alive and is released with the Buffer;
  // nothing goes back to the pool.
  Buffer(void* data, std::size_t bytes, std::shared_ptr<const void> owner);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // Whether the storage belongs to an outside owner (the second constructor).
  bool external() const { return external_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;     // requested
  std::size_t capacity_ = 0;  // size class
  bool external_ = false;
  std::shared_ptr<const void> owner_;
};

// The pool's two calls (kernels/buffer_pool.cc): a block of at least `bytes`
// (its size class in *capacity), and its return for reuse.
void* AcquirePooledBuffer(std::size_t bytes, std::size_t* capacity);
void ReleasePooledBuffer(void* data, std::size_t capacity);

}  // namespace stillpoint
