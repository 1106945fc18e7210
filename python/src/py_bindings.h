// The pieces of the extension module stillpoint._stillpoint, one Register
// function per file, and the NumPy conversions they share.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/tensor.h"

namespace stillpoint::python {

namespace py = pybind11;

// tensors.cc: stillpoint.Tensor and the ndarray conversions.
void RegisterTensor(py::module_& m);
// errors.cc: stillpoint::ConfigError -> ValueError, stillpoint::Error ->
// RuntimeError (bad arguments are checked before, with TypeError or
// ValueError naming the argument).
void RegisterErrors(py::module_& m);
// runs.cc: train, compare, evaluate and the readers behind load_run.
void RegisterRuns(py::module_& m);
// retrieve.cc: Hopfield retrieval.
void RegisterRetrieve(py::module_& m);
// energy_attention.cc: an energy attention block for stillpoint.torch.
void RegisterEnergyAttention(py::module_& m);

// The expected shape of an array argument: one extent per axis, -1 for any
// extent. Named extents print in errors: ExpectedShape{{-1, -1}, "[N, d]"}.
struct ExpectedShape {
  std::vector<int64_t> dims;
  std::string text;
  bool any_rank = false;  // any shape of up to 4 dimensions (dims unused)
};

// The float32/float64 ndarray `object` as a Tensor sharing its memory (no
// copy; the tensor keeps the array alive). TypeError naming `argument` when
// it is not an ndarray or not float32/float64 (or not `dtype` when given);
// ValueError when its shape does not match `expected` or it is not
// C-contiguous and aligned (the message names the expected shape and the way
// to get a contiguous copy).
Tensor TensorFromArray(const py::handle& object,
                       const std::string& argument,
                       const ExpectedShape& expected,
                       const DType* dtype = nullptr);

// An ndarray over the tensor's storage (no copy; the array keeps the storage
// alive), float32 or float64 as the tensor.
py::array ArrayFromTensor(const Tensor& tensor);

// A NumPy dtype name for a stillpoint dtype ("float32", "float64").
const char* NumpyDTypeName(DType dtype);

}  // namespace stillpoint::python
