// Model parameters in the formats other tools read: safetensors (PyTorch,
// `safetensors.torch.load_file`) and .npz (NumPy, `numpy.load`). Written by
// `stillpoint export RUN --format safetensors|npz`, read back by
// `model.init_from`. Tensors keep their dtype (float32 or float64) and
// their dotted parameter names ("cell.attention.q.weight").
#pragma once

#include <string>

#include "framework/module.h"

namespace stillpoint {

// safetensors: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}},
// then the row-major little-endian data. Written atomically.
void WriteSafetensors(const std::string& path, const NamedTensors& tensors);

// .npz: a zip archive (stored, not compressed) of one NAME.npy per tensor
// (.npy format version 1.0, little-endian, C order). Written atomically.
void WriteNpz(const std::string& path, const NamedTensors& tensors);

// Reads a .safetensors or .npz file (by its extension; .npz entries may be
// stored or deflated, as numpy.savez and savez_compressed write them) with
// float32 or float64 tensors. ConfigError naming the file and what is wrong
// for anything else.
NamedTensors ReadWeightsFile(const std::string& path);

}  // namespace stillpoint
