// The operator of the adjoint equation w = g + J^T w on float64 rows, and
// the conversions between the solve's tensors and those rows (internal to
// the adjoint solvers).
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <functional>
#include <vector>

#include "framework/tensor.h"
#include "solvers/adjoint.h"

namespace stillpoint::adjoint {

// Samples are rows; the Krylov solvers keep their vectors in float64 whatever
// the state's dtype (orthogonality is lost quickly in float32).
using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void TensorToMatrix(const Tensor& tensor, RowMatrix* matrix);
void MatrixToTensor(const RowMatrix& matrix, Tensor* tensor);

// Whether ids are 0, 1, ..., batch - 1.
bool IsWholeBatch(const std::vector<int64_t>& ids, int64_t batch);

// Calls the VJP with *out as its preallocated output and returns the tensor
// that holds the result: *out, or the tensor the VJP rebound its output to
// (BatchedVjp). *out itself keeps its own storage, so it is never shared with
// whatever the VJP returned.
Tensor CallVjp(const BatchedVjp& vjp, const Tensor& v, const Tensor& out);

// fn(b) for every sample b, spread over threads.
void ParallelOverSamples(int64_t batch, const std::function<void(int64_t)>& fn);

// The operator of (*) on float64 rows: ApplyTransposedJacobian gives J^T v,
// Apply gives (I - J^T) v. Owns the dtype-converted buffers handed to the
// VJP, so applying it allocates nothing after construction.
class AdjointOperator {
 public:
  AdjointOperator(const BatchedVjp& vjp, int64_t batch_size, int64_t state_size, DType dtype);

  void ApplyTransposedJacobian(const RowMatrix& v, RowMatrix* out);
  void Apply(const RowMatrix& v, RowMatrix* out);

  int64_t calls() const { return calls_; }

 private:
  const BatchedVjp& vjp_;
  Tensor input_;
  Tensor output_;
  int64_t calls_ = 0;
};

}  // namespace stillpoint::adjoint
