#include "solvers/adjoint/operator.h"

#include "framework/check.h"
#include "framework/parallel.h"

namespace stillpoint::adjoint {

void TensorToMatrix(const Tensor& tensor, RowMatrix* matrix) {
  DispatchDType(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* data = tensor.data<T>();
    double* out = matrix->data();
    const int64_t n = tensor.numel();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(data[i]);
  });
}

void MatrixToTensor(const RowMatrix& matrix, Tensor* tensor) {
  DispatchDType(tensor->dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* data = tensor->data<T>();
    const double* in = matrix.data();
    const int64_t n = tensor->numel();
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(in[i]);
  });
}

bool IsWholeBatch(const std::vector<int64_t>& ids, int64_t batch) {
  if (static_cast<int64_t>(ids.size()) != batch) return false;
  for (int64_t i = 0; i < batch; ++i) {
    if (ids[i] != i) return false;
  }
  return true;
}

Tensor CallVjp(const BatchedVjp& vjp, const Tensor& v, const Tensor& out) {
  Tensor result = out;
  vjp(v, &result);
  SP_CHECK(result.shape() == out.shape() && result.dtype() == out.dtype(),
           "SolveAdjoint: the VJP gave a ", ToString(result.dtype()), " tensor of shape ",
           result.shape(), " but ", ToString(out.dtype()), " ", out.shape(), " was expected");
  return result;
}

void ParallelOverSamples(int64_t batch, const std::function<void(int64_t)>& fn) {
  ParallelFor(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) fn(b);
  });
}

AdjointOperator::AdjointOperator(const BatchedVjp& vjp,
                                 int64_t batch_size,
                                 int64_t state_size,
                                 DType dtype)
    : vjp_(vjp),
      input_(Shape{batch_size, state_size}, dtype),
      output_(Shape{batch_size, state_size}, dtype) {}

void AdjointOperator::ApplyTransposedJacobian(const RowMatrix& v, RowMatrix* out) {
  MatrixToTensor(v, &input_);
  const Tensor jt_v = CallVjp(vjp_, input_, output_);
  ++calls_;
  TensorToMatrix(jt_v, out);
}

void AdjointOperator::Apply(const RowMatrix& v, RowMatrix* out) {
  ApplyTransposedJacobian(v, out);
  *out = v - *out;
}

}  // namespace stillpoint::adjoint
