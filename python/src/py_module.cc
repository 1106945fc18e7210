// The extension module stillpoint._stillpoint. The public API is the package
// python/stillpoint/ (docs/python.md); this module holds what it is built on.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "framework/parallel.h"
#include "layers/energy_block.h"
#include "layers/models.h"
#include "layers/positions.h"
#include "python/src/py_bindings.h"
#include "training/cli/cli_commands.h"

PYBIND11_MODULE(_stillpoint, m) {
  m.doc() = "stillpoint's C++ core (use the package stillpoint, not this module)";
  m.attr("__version__") = stillpoint::StillpointVersion();
  stillpoint::python::RegisterErrors(m);
  stillpoint::python::RegisterTensor(m);
  stillpoint::python::RegisterRuns(m);
  stillpoint::python::RegisterRetrieve(m);
  stillpoint::python::RegisterEnergyAttention(m);
  m.def(
      "set_num_threads",
      [](int threads) {
        if (threads < 1 || threads > 256) {
          throw pybind11::value_error("threads: expected an integer in [1, 256], got " +
                                      std::to_string(threads));
        }
        stillpoint::SetNumThreads(threads);
      },
      pybind11::arg("threads"),
      "Worker threads of stillpoint's parallel loops (default 1; train and compare set them "
      "from the config's threads key).");
  m.def("num_threads", &stillpoint::NumThreads, "Worker threads of stillpoint's parallel loops.");
  // The families' names, made from their lists (layers/energy_block_list.h,
  // SP_MODEL_KINDS and SP_POSITION_SCHEMES), so Python never copies them.
  m.def("energy_blocks", [] { return stillpoint::EnergyBlockRegistry().Names(); },
        "The registered energy blocks (model.energy.layer, EnergyAttention's kind).");
  m.def("attention_kinds", &stillpoint::AttentionKindNames,
        "The attentions of model.attention: softmax, then every energy block.");
  m.def("model_kinds", &stillpoint::ModelKindNames, "The model kinds of model.kind.");
  m.def(
      "position_schemes",
      [] {
        std::vector<std::string> names;
        for (auto scheme : stillpoint::AllPositionSchemes()) {
          names.push_back(stillpoint::ToString(scheme));
        }
        return names;
      },
      "The position schemes of model.positions.");
}
