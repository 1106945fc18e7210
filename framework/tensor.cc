#include "framework/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "framework/kernels/buffer.h"

namespace stillpoint {

const char* ToString(DType dtype) {
  return dtype == DType::kFloat64 ? "float64" : "float32";
}

bool StringToDType(const std::string& text, DType* dtype) {
  if (text == "float32" || text == "f32") {
    *dtype = DType::kFloat32;
    return true;
  }
  if (text == "float64" || text == "f64") {
    *dtype = DType::kFloat64;
    return true;
  }
  return false;
}

std::size_t SizeOf(DType dtype) { return dtype == DType::kFloat64 ? 8 : 4; }

// ---------------------------------------------------------------- Shape

namespace {

// "[a, b, c]" of extents not yet a Shape (for the constructor's errors).
std::string ShapeText(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(const std::vector<int64_t>& dims) {
  SP_CHECK(static_cast<int>(dims.size()) <= kMaxRank, "Shape: rank ", dims.size(),
           " exceeds the maximum of ", kMaxRank);
  rank_ = static_cast<int>(dims.size());
  int64_t elements = 1;
  for (int i = 0; i < rank_; ++i) {
    SP_CHECK(dims[i] >= 0, "Shape: negative extent ", dims[i], " at axis ", i);
    dims_[i] = dims[i];
    // Checked, so numel() and the byte counts built on it never wrap: a
    // product beyond kMaxElements used to overflow into a small or negative
    // count ([2^31, 2^31] was accepted).
    SP_CHECK(!__builtin_mul_overflow(elements, dims[i], &elements) && elements <= kMaxElements,
             "Shape ", ShapeText(dims), ": more than ", kMaxElements,
             " (2^60) elements; its size does not fit in 64-bit byte counts");
  }
}

int Shape::Axis(int axis) const {
  const int resolved = axis < 0 ? axis + rank_ : axis;
  SP_CHECK(resolved >= 0 && resolved < rank_, "axis ", axis,
           " is out of range for shape ", ToString());
  return resolved;
}

int64_t Shape::dim(int axis) const { return dims_[Axis(axis)]; }

std::vector<int64_t> Shape::dims() const {
  return std::vector<int64_t>(dims_.begin(), dims_.begin() + rank_);
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[i] != other.dims_[i]) return false;
  }
  return true;
}

std::string Shape::ToString() const {
  std::ostringstream out;
  out << '[';
  for (int i = 0; i < rank_; ++i) out << (i ? ", " : "") << dims_[i];
  out << ']';
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  return out << shape.ToString();
}

// ---------------------------------------------------------------- Tensor

Tensor::Tensor(const Shape& shape, DType dtype)
    : buffer_(std::make_shared<Buffer>(shape.numel() * SizeOf(dtype))),
      shape_(shape),
      dtype_(dtype) {}

Tensor Tensor::FromExternal(void* data,
                            const Shape& shape,
                            DType dtype,
                            std::shared_ptr<const void> owner) {
  SP_CHECK(data != nullptr || shape.numel() == 0, "Tensor::FromExternal: null data for shape ",
           shape);
  Tensor t;
  t.buffer_ = std::make_shared<Buffer>(data, shape.numel() * SizeOf(dtype), std::move(owner));
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype) {
  Tensor t(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::Ones(const Shape& shape, DType dtype) { return Full(shape, 1.0, dtype); }

Tensor Tensor::Full(const Shape& shape, double value, DType dtype) {
  Tensor t(shape, dtype);
  t.Fill(value);
  return t;
}

Tensor Tensor::Scalar(double value, DType dtype) { return Full(Shape{}, value, dtype); }

Tensor Tensor::FromVector(const Shape& shape, const std::vector<double>& values,
                          DType dtype) {
  SP_CHECK(static_cast<int64_t>(values.size()) == shape.numel(),
           "Tensor::FromVector: ", values.size(), " values for shape ", shape,
           " (", shape.numel(), " elements)");
  Tensor t(shape, dtype);
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* out = t.data<T>();
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<T>(values[i]);
  });
  return t;
}

Tensor Tensor::Arange(int64_t n, DType dtype) {
  Tensor t(Shape{n}, dtype);
  for (int64_t i = 0; i < n; ++i) t.set(i, static_cast<double>(i));
  return t;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(buffer_->data()) + offset_ * SizeOf(dtype_);
}

double Tensor::at(int64_t flat_index) const {
  SP_CHECK(flat_index >= 0 && flat_index < numel(), "Tensor::at: index ", flat_index,
           " out of range for shape ", shape_);
  return DispatchDType(dtype_, [&](auto zero) -> double {
    using T = decltype(zero);
    return static_cast<double>(data<T>()[flat_index]);
  });
}

void Tensor::set(int64_t flat_index, double value) {
  SP_CHECK(flat_index >= 0 && flat_index < numel(), "Tensor::set: index ", flat_index,
           " out of range for shape ", shape_);
  DispatchDType(dtype_, [&](auto zero) {
    using T = decltype(zero);
    data<T>()[flat_index] = static_cast<T>(value);
  });
}

double Tensor::item() const {
  SP_CHECK(numel() == 1, "Tensor::item: tensor of shape ", shape_,
           " has ", numel(), " elements, not one");
  return at(0);
}

std::vector<double> Tensor::ToVector() const {
  std::vector<double> values(numel());
  DispatchDType(dtype_, [&](auto zero) {
    using T = decltype(zero);
    const T* in = data<T>();
    for (int64_t i = 0; i < numel(); ++i) values[i] = static_cast<double>(in[i]);
  });
  return values;
}

Tensor Tensor::Reshape(const Shape& shape) const {
  SP_CHECK(defined(), "Tensor::Reshape: tensor is empty");
  SP_CHECK(shape.numel() == numel(), "Tensor::Reshape: cannot view shape ", shape_,
           " as ", shape);
  Tensor view = *this;
  view.shape_ = shape;
  return view;
}

Tensor Tensor::SliceRows(int64_t begin, int64_t end) const {
  SP_CHECK(defined() && rank() >= 1, "Tensor::SliceRows: needs rank >= 1, got ", shape_);
  SP_CHECK(0 <= begin && begin <= end && end <= dim(0), "Tensor::SliceRows: rows [",
           begin, ", ", end, ") out of range for shape ", shape_);
  std::vector<int64_t> dims = shape_.dims();
  const int64_t row = numel() / std::max<int64_t>(dims[0], 1);
  dims[0] = end - begin;
  Tensor view = *this;
  view.shape_ = Shape(dims);
  view.offset_ = offset_ + begin * row;
  return view;
}

Tensor Tensor::Clone() const { return To(dtype_); }

Tensor Tensor::To(DType dtype) const {
  SP_CHECK(defined(), "Tensor::To: tensor is empty");
  Tensor out(shape_, dtype);
  out.CopyFrom(*this);
  return out;
}

void Tensor::CopyFrom(const Tensor& other) {
  SP_CHECK(defined() && other.defined(), "Tensor::CopyFrom: empty tensor");
  SP_CHECK(numel() == other.numel(), "Tensor::CopyFrom: shape ", other.shape_,
           " does not fit into ", shape_);
  if (dtype_ == other.dtype_) {
    std::memmove(raw_data(), other.raw_data(), nbytes());
    return;
  }
  DispatchDType(dtype_, [&](auto zero) {
    using T = decltype(zero);
    T* out = data<T>();
    DispatchDType(other.dtype_, [&](auto zero_in) {
      using U = decltype(zero_in);
      const U* in = other.data<U>();
      for (int64_t i = 0; i < numel(); ++i) out[i] = static_cast<T>(in[i]);
    });
  });
}

void Tensor::Fill(double value) {
  DispatchDType(dtype_, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(data<T>(), numel(), static_cast<T>(value));
  });
}

bool Tensor::SameStorage(const Tensor& other) const {
  return buffer_ == other.buffer_ && offset_ == other.offset_;
}

bool Tensor::HoldsStorageAlone() const {
  return buffer_ && buffer_.use_count() == 1 && !buffer_->external();
}

std::string Tensor::ToString(int max_entries) const {
  std::ostringstream out;
  if (!defined()) return "Tensor(empty)";
  out << "Tensor(" << stillpoint::ToString(dtype_) << ", " << shape_ << ", [";
  const int64_t shown = std::min<int64_t>(numel(), max_entries);
  out << std::setprecision(6);
  for (int64_t i = 0; i < shown; ++i) out << (i ? ", " : "") << at(i);
  if (shown < numel()) out << ", ...";
  out << "])";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.ToString();
}

bool HasNonFinite(const Tensor& tensor) {
  return DispatchDType(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = tensor.data<T>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      if (!std::isfinite(in[i])) return true;
    }
    return false;
  });
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  SP_CHECK(a.shape() == b.shape(), "MaxAbsDiff: shapes ", a.shape(), " and ", b.shape(),
           " differ");
  double worst = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(a.at(i) - b.at(i)));
  }
  return worst;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace stillpoint
