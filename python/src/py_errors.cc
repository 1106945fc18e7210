// Exceptions crossing into Python. Bad arguments are checked in the
// bindings themselves (TypeError / ValueError naming the argument); what the
// library throws past those checks is translated here.
#include <exception>

#include "python/src/py_bindings.h"
#include "training/config/config.h"

namespace stillpoint::python {

void RegisterErrors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const ConfigError& e) {
      // Bad input, as the CLI's exit code 2: the message names file:line:col.
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace stillpoint::python
