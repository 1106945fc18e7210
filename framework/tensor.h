// Tensor: a contiguous, row-major block of float32 or float64 numbers with up
// to four dimensions. Copying a Tensor is cheap and shares storage (like a
// shared_ptr); use Clone() for a deep copy. Reshape and leading-axis slices
// are views that share storage; every other op writes a fresh tensor.
//
// Storage comes from a process-wide pool of aligned buffers (see
// buffer_pool.h), so a training step that frees and re-creates tensors of the
// same sizes does not go back to the system allocator.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "framework/check.h"

namespace stillpoint {

enum class DType { kFloat32, kFloat64 };

const char* ToString(DType dtype);
// Parses "float32"/"f32" or "float64"/"f64"; returns false on anything else.
bool StringToDType(const std::string& text, DType* dtype);
std::size_t SizeOf(DType dtype);

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kFloat64;
}

// The extents of a tensor, outermost first. Rank 0 is a scalar (one element).
class Shape {
 public:
  static constexpr int kMaxRank = 4;
  // The most elements of any shape: 8-byte elements then need at most 2^63
  // bytes, so numel() * SizeOf(dtype) never overflows. A constructor given
  // more throws.
  static constexpr int64_t kMaxElements = int64_t{1} << 60;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int rank() const { return rank_; }
  // Negative axes count from the end: dim(-1) is the last extent.
  int64_t dim(int axis) const;
  int64_t operator[](int axis) const { return dim(axis); }
  // Inline: kernels call it in loop conditions.
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Resolves a possibly negative axis against this rank; throws if out of range.
  int Axis(int axis) const;
  std::vector<int64_t> dims() const;

  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }
  std::string ToString() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

class Buffer;

class Tensor {
 public:
  // An empty tensor: defined() is false. Most functions reject it.
  Tensor() = default;
  // Uninitialised storage of the given shape and dtype (from the pool).
  Tensor(const Shape& shape, DType dtype);

  static Tensor Zeros(const Shape& shape, DType dtype);
  static Tensor Ones(const Shape& shape, DType dtype);
  static Tensor Full(const Shape& shape, double value, DType dtype);
  static Tensor Scalar(double value, DType dtype);
  // Row-major values; values.size() must equal shape.numel().
  static Tensor FromVector(const Shape& shape, const std::vector<double>& values,
                           DType dtype);
  // 0, 1, ..., n-1 as a 1-D tensor.
  static Tensor Arange(int64_t n, DType dtype);
  // A tensor over memory it does not own (a NumPy array's, for the Python
  // bindings), without a copy: `data` holds shape.numel() contiguous
  // row-major values of `dtype` and stays valid while `owner` lives; the
  // tensor and every view of it keep `owner` alive. Writes through either
  // side are seen by the other. Such storage is never handed over to another
  // tensor (HoldsStorageAlone() is false), since its owner shares it.
  static Tensor FromExternal(void* data, const Shape& shape, DType dtype,
                             std::shared_ptr<const void> owner);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int axis) const { return shape_.dim(axis); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  std::size_t nbytes() const { return numel() * SizeOf(dtype_); }

  // Typed access. Throws if T does not match dtype().
  template <typename T>
  T* data();
  template <typename T>
  const T* data() const;

  // Element access by flat row-major index, converting to/from double. For
  // tests and I/O, not for inner loops.
  double at(int64_t flat_index) const;
  void set(int64_t flat_index, double value);
  // The single value of a one-element tensor.
  double item() const;
  std::vector<double> ToVector() const;

  // A view with a new shape of the same numel (no copy).
  Tensor Reshape(const Shape& shape) const;
  // A view of rows [begin, end) along axis 0 (no copy).
  Tensor SliceRows(int64_t begin, int64_t end) const;
  // A deep copy, optionally converting dtype.
  Tensor Clone() const;
  Tensor To(DType dtype) const;
  // Copies other's values into this tensor (same numel; converts dtype).
  void CopyFrom(const Tensor& other);
  void Fill(double value);

  // True if both share storage and offset (the same view).
  bool SameStorage(const Tensor& other) const;
  // True if no other tensor shares this one's storage, so it can be handed
  // over (moved into another tensor) without any other view seeing changes.
  // False for external storage (FromExternal).
  bool HoldsStorageAlone() const;

  std::string ToString(int max_entries = 16) const;

 private:
  std::shared_ptr<Buffer> buffer_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::kFloat32;

  void* raw_data() const;
  friend bool BitwiseEqual(const Tensor& a, const Tensor& b);
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// True if any element is NaN or +-Inf.
bool HasNonFinite(const Tensor& tensor);

// The largest |a - b| over all elements (same shape required).
double MaxAbsDiff(const Tensor& a, const Tensor& b);

// True if a and b have the same shape and dtype and every element's bytes
// are equal (so -0 differs from +0, and a NaN equals the same NaN); two
// undefined tensors are equal.
bool BitwiseEqual(const Tensor& a, const Tensor& b);

// Calls fn with a typed zero (float or double) matching dtype, so generic
// kernels are written once: DispatchDType(t.dtype(), [&](auto zero) {
// using T = decltype(zero); ... }).
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat64) return fn(double{0});
  return fn(float{0});
}

// ---- implementation of the templates ----

template <typename T>
T* Tensor::data() {
  SP_CHECK(defined(), "Tensor::data: tensor is empty");
  SP_CHECK(dtype_ == DTypeOf<T>(), "Tensor::data: tensor is ", stillpoint::ToString(dtype_),
           " but ", stillpoint::ToString(DTypeOf<T>()), " was requested");
  return static_cast<T*>(raw_data());
}

template <typename T>
const T* Tensor::data() const {
  SP_CHECK(defined(), "Tensor::data: tensor is empty");
  SP_CHECK(dtype_ == DTypeOf<T>(), "Tensor::data: tensor is ", stillpoint::ToString(dtype_),
           " but ", stillpoint::ToString(DTypeOf<T>()), " was requested");
  return static_cast<const T*>(raw_data());
}

}  // namespace stillpoint
