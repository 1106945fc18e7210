// The configuration reference in the forms `stillpoint config` prints: a
// plain-text list for the terminal, a JSON Schema for editors' YAML support
// (e.g. yaml-language-server: `# yaml-language-server: $schema=FILE`), and
// the key paths alone (for shell completion). The Markdown form is
// ConfigSchema::ToMarkdown (docs/config.md).
#pragma once

#include <string>

#include "training/config/config.h"

namespace stillpoint {

// One key a line: "model.kind = implicit  (explicit | tied | implicit |
// energy)  Model kind ..." grouped by section.
std::string ConfigReferenceText(const ConfigSchema& schema);

// A JSON Schema (draft-07) of a config file: nested objects per dotted
// path, with types, enums, bounds, defaults and descriptions; unknown keys
// are not allowed (additionalProperties: false), as the loader refuses them.
std::string ConfigJsonSchema(const ConfigSchema& schema);

// Every key path, one a line.
std::string ConfigKeyList(const ConfigSchema& schema);

}  // namespace stillpoint
