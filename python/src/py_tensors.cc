// stillpoint.Tensor and the conversions between tensors and ndarrays. Both
// directions share memory: an ndarray becomes a tensor over its buffer
// (Tensor::FromExternal, the tensor keeping the array alive), and a tensor
// becomes an ndarray over its storage (the array keeping a reference to the
// tensor's storage in a capsule).
#include <pybind11/stl.h>

#include <sstream>

#include "python/src/py_bindings.h"

namespace stillpoint::python {
namespace {

// Keeps a Python object alive from C++ for as long as a tensor uses its
// memory. The last view of a tensor may go on any thread, with or without
// the GIL, so the release takes it.
std::shared_ptr<const void> PythonOwner(py::object object) {
  auto* held = new py::object(std::move(object));
  return std::shared_ptr<const void>(held, [](const void* pointer) {
    py::gil_scoped_acquire gil;
    delete static_cast<const py::object*>(pointer);
  });
}

std::string ShapeText(const py::array& array) {
  std::ostringstream out;
  out << "(";
  for (py::ssize_t axis = 0; axis < array.ndim(); ++axis) {
    out << (axis ? ", " : "") << array.shape(axis);
  }
  out << (array.ndim() == 1 ? ",)" : ")");
  return out.str();
}

bool ShapeMatches(const py::array& array, const ExpectedShape& expected) {
  if (array.ndim() != static_cast<py::ssize_t>(expected.dims.size())) return false;
  for (std::size_t axis = 0; axis < expected.dims.size(); ++axis) {
    if (expected.dims[axis] >= 0 && array.shape(axis) != expected.dims[axis]) return false;
  }
  return true;
}

std::string PythonTypeName(const py::handle& object) {
  return py::str(py::type::handle_of(object).attr("__name__"));
}

}  // namespace

const char* NumpyDTypeName(DType dtype) { return dtype == DType::kFloat64 ? "float64" : "float32"; }

Tensor TensorFromArray(const py::handle& object,
                       const std::string& argument,
                       const ExpectedShape& expected,
                       const DType* dtype) {
  const std::string wanted =
      dtype != nullptr ? std::string(NumpyDTypeName(*dtype)) : std::string("float32 or float64");
  if (!py::isinstance<py::array>(object)) {
    throw py::type_error(argument + ": expected a " + wanted + " numpy.ndarray of shape " +
                         expected.text + ", got " + PythonTypeName(object));
  }
  py::array array = py::reinterpret_borrow<py::array>(object);
  DType found;
  if (array.dtype().equal(py::dtype::of<float>())) {
    found = DType::kFloat32;
  } else if (array.dtype().equal(py::dtype::of<double>())) {
    found = DType::kFloat64;
  } else {
    throw py::type_error(argument + ": expected a " + wanted + " array, got dtype " +
                         std::string(py::str(array.dtype())));
  }
  if (dtype != nullptr && found != *dtype) {
    throw py::type_error(argument + ": expected a " + wanted + " array, got dtype " +
                         NumpyDTypeName(found));
  }
  if (array.ndim() > Shape::kMaxRank) {
    throw py::value_error(argument + ": expected shape " + expected.text + ", got " +
                          ShapeText(array) + " (tensors have at most 4 dimensions)");
  }
  if (!expected.any_rank && !ShapeMatches(array, expected)) {
    throw py::value_error(argument + ": expected shape " + expected.text + ", got " +
                          ShapeText(array));
  }
  const int flags = array.flags();
  if (!(flags & py::array::c_style) || !(flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) {
    throw py::value_error(argument + ": the array of shape " + ShapeText(array) +
                          " is not C-contiguous and aligned (stillpoint reads arrays without "
                          "copying them; numpy.ascontiguousarray(" +
                          argument + ") makes a contiguous copy)");
  }
  std::vector<int64_t> dims;
  for (py::ssize_t axis = 0; axis < array.ndim(); ++axis) dims.push_back(array.shape(axis));
  return Tensor::FromExternal(const_cast<void*>(array.data()), Shape(dims), found,
                              PythonOwner(array));
}

py::array ArrayFromTensor(const Tensor& tensor) {
  SP_CHECK(tensor.defined(), "ArrayFromTensor: the tensor is empty");
  std::vector<py::ssize_t> shape;
  for (int axis = 0; axis < tensor.rank(); ++axis) shape.push_back(tensor.dim(axis));
  auto* keep = new Tensor(tensor);
  py::capsule base(keep, [](void* pointer) { delete static_cast<Tensor*>(pointer); });
  if (tensor.dtype() == DType::kFloat64) {
    return py::array_t<double>(shape, const_cast<double*>(keep->data<double>()), base);
  }
  return py::array_t<float>(shape, const_cast<float*>(keep->data<float>()), base);
}

void RegisterTensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(), R"doc(
A stillpoint tensor: contiguous, row-major, float32 or float64, up to 4 dimensions.

Tensor(array) shares the memory of a C-contiguous float32/float64 ndarray (no
copy): a write through either is seen by the other. numpy.asarray(tensor) and
tensor.numpy() share the tensor's memory the same way.)doc")
      .def(py::init([](const py::handle& array) {
             if (py::isinstance<py::array>(array) &&
                 !py::reinterpret_borrow<py::array>(array).writeable()) {
               throw py::value_error(
                   "array: the array is read-only; a Tensor shares (and may write) its "
                   "memory (pass array.copy())");
             }
             return TensorFromArray(array, "array",
                                    ExpectedShape{{},
                                                  "of up to 4 dimensions",
                                                  /*any_rank=*/true});
           }),
           py::arg("array"))
      .def_static(
          "zeros",
          [](const std::vector<int64_t>& shape, const std::string& dtype) {
            DType parsed;
            if (!StringToDType(dtype, &parsed)) {
              throw py::value_error("dtype: expected 'float32' or 'float64', got '" + dtype + "'");
            }
            if (shape.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
              throw py::value_error("shape: at most 4 dimensions, got " +
                                    std::to_string(shape.size()));
            }
            for (int64_t extent : shape) {
              if (extent < 0) throw py::value_error("shape: extents must be >= 0");
            }
            Shape checked;
            try {
              checked = Shape(shape);  // refuses a product beyond Shape::kMaxElements
            } catch (const Error& error) {
              throw py::value_error(std::string("shape: ") + error.what());
            }
            return Tensor::Zeros(checked, parsed);
          },
          py::arg("shape"), py::arg("dtype") = "float32", "A new tensor of zeros.")
      .def_property_readonly("shape",
                             [](const Tensor& t) {
                               py::tuple shape(t.rank());
                               for (int axis = 0; axis < t.rank(); ++axis)
                                 shape[axis] = t.dim(axis);
                               return shape;
                             })
      .def_property_readonly("dtype", [](const Tensor& t) { return NumpyDTypeName(t.dtype()); })
      .def("numpy", &ArrayFromTensor, "An ndarray over the tensor's memory (no copy).")
      .def("fill", &Tensor::Fill, py::arg("value"), "Sets every element (in C++).")
      .def(
          "tolist", [](const Tensor& t) { return t.ToVector(); },
          "The values in row-major order, read in C++ (a flat list of floats).")
      .def("__repr__", [](const Tensor& t) { return t.ToString(); })
      .def_buffer([](Tensor& t) {
        std::vector<py::ssize_t> shape, strides;
        py::ssize_t stride = static_cast<py::ssize_t>(SizeOf(t.dtype()));
        for (int axis = t.rank() - 1; axis >= 0; --axis) {
          shape.insert(shape.begin(), t.dim(axis));
          strides.insert(strides.begin(), stride);
          stride *= t.dim(axis);
        }
        if (t.dtype() == DType::kFloat64) {
          return py::buffer_info(t.data<double>(), shape, strides);
        }
        return py::buffer_info(t.data<float>(), shape, strides);
      });
}

}  // namespace stillpoint::python
