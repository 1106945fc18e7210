#include "framework/module.h"

#include <cctype>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

namespace stillpoint {
namespace {

std::string JoinName(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// Visits every parameter once, in the documented order, with its dotted name.
// Iterative (an explicit stack) so very deep stacks of modules are fine.
template <typename Fn>
void ForEachUniqueParameter(const Module& root, Fn&& fn) {
  std::set<const detail::Node*> seen_parameters;
  std::set<const Module*> seen_modules;
  // Each frame is a module and its dotted prefix; children are pushed in
  // reverse so they pop in registration order.
  std::vector<std::pair<const Module*, std::string>> stack = {{&root, ""}};
  while (!stack.empty()) {
    auto [module, prefix] = std::move(stack.back());
    stack.pop_back();
    if (!seen_modules.insert(module).second) continue;
    for (const auto& [name, parameter] : module->own_parameters()) {
      if (seen_parameters.insert(parameter.node()).second) {
        fn(JoinName(prefix, name), parameter);
      }
    }
    const auto& children = module->children();
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      stack.emplace_back(it->second.get(), JoinName(prefix, it->first));
    }
  }
}

std::string JoinNames(const std::vector<std::string>& names, std::size_t max_shown) {
  std::ostringstream out;
  for (std::size_t i = 0; i < names.size() && i < max_shown; ++i) {
    out << (i ? ", " : "") << "'" << names[i] << "'";
  }
  if (names.size() > max_shown) out << " and " << names.size() - max_shown << " more";
  return out.str();
}

}  // namespace

// ---------------------------------------------------------------- registration

void Module::CheckNewName(const std::string& name, const char* what) const {
  SP_CHECK(!name.empty(), what, ": the name must not be empty (in ", Name(), ")");
  for (const char c : name) {
    SP_CHECK(c != '.' && !std::isspace(static_cast<unsigned char>(c)) &&
                 !std::iscntrl(static_cast<unsigned char>(c)),
             what, ": name '", name,
             "' must not contain '.', whitespace or control characters (in ", Name(), ")");
  }
  for (const auto& [existing, parameter] : own_parameters_) {
    SP_CHECK(existing != name, what, ": '", name, "' is already a parameter of ", Name());
  }
  for (const auto& [existing, child] : children_) {
    SP_CHECK(existing != name, what, ": '", name, "' is already a child module of ", Name());
  }
}

Var Module::RegisterParameter(const std::string& name, Tensor value, bool requires_grad) {
  SP_CHECK(value.defined(), "RegisterParameter: '", name, "' has an empty tensor (in ", Name(),
           ")");
  CheckNewName(name, "RegisterParameter");
  Var parameter(std::move(value), requires_grad);
  own_parameters_.emplace_back(name, parameter);
  return parameter;
}

Var Module::RegisterParameter(const std::string& name, const Var& parameter) {
  SP_CHECK(parameter.defined(), "RegisterParameter: '", name, "' is an undefined Var (in ", Name(),
           ")");
  SP_CHECK(parameter.is_leaf(), "RegisterParameter: '", name,
           "' must be a leaf Var, but it is the result of op '", parameter.op_name(), "' (in ",
           Name(), ")");
  CheckNewName(name, "RegisterParameter");
  own_parameters_.emplace_back(name, parameter);
  return parameter;
}

void Module::AddChild(const std::string& name, std::shared_ptr<Module> module) {
  SP_CHECK(module != nullptr, "RegisterModule: '", name, "' is null (in ", Name(), ")");
  SP_CHECK(module.get() != this, "RegisterModule: a module cannot be its own child ('", name,
           "' in ", Name(), ")");
  CheckNewName(name, "RegisterModule");
  children_.emplace_back(name, std::move(module));
}

// ---------------------------------------------------------------- parameters

VarList Module::parameters() const {
  VarList result;
  ForEachUniqueParameter(*this, [&](const std::string&, const Var& p) { result.push_back(p); });
  return result;
}

NamedVars Module::named_parameters() const {
  NamedVars result;
  ForEachUniqueParameter(
      *this, [&](const std::string& name, const Var& p) { result.emplace_back(name, p); });
  return result;
}

NamedTensors Module::NamedValues() const {
  NamedTensors result;
  ForEachUniqueParameter(
      *this, [&](const std::string& name, const Var& p) { result.emplace_back(name, p.value()); });
  return result;
}

int64_t Module::NumParameters() const {
  int64_t total = 0;
  ForEachUniqueParameter(*this, [&](const std::string&, const Var& p) { total += p.numel(); });
  return total;
}

void Module::ZeroGrad() {
  ForEachUniqueParameter(*this, [](const std::string&, const Var& p) {
    Var handle = p;  // zero_grad is non-const on the handle; it acts on the shared node
    handle.zero_grad();
  });
}

// ---------------------------------------------------------------- lookup

const Module* Module::FindModule(const std::string& dotted_path, std::string* error) const {
  const Module* module = this;
  std::string walked;
  std::size_t begin = 0;
  while (begin < dotted_path.size()) {
    std::size_t end = dotted_path.find('.', begin);
    if (end == std::string::npos) end = dotted_path.size();
    const std::string segment = dotted_path.substr(begin, end - begin);
    const Module* next = nullptr;
    for (const auto& [name, child] : module->children()) {
      if (name == segment) {
        next = child.get();
        break;
      }
    }
    if (next == nullptr) {
      if (error != nullptr) {
        std::vector<std::string> names;
        for (const auto& [name, child] : module->children()) names.push_back(name);
        *error =
            detail::StrCat(walked.empty() ? std::string("the root module") : "'" + walked + "'",
                           " (a ", module->Name(), ") has no child module '", segment, "'",
                           names.empty() ? std::string(" (it has no children)")
                                         : " (children: " + JoinNames(names, 8) + ")");
      }
      return nullptr;
    }
    walked = JoinName(walked, segment);
    module = next;
    begin = end + 1;
  }
  return module;
}

namespace {
// Splits "a.b.c" into ("a.b", "c").
std::pair<std::string, std::string> SplitLast(const std::string& dotted_name) {
  const std::size_t dot = dotted_name.rfind('.');
  if (dot == std::string::npos) return {"", dotted_name};
  return {dotted_name.substr(0, dot), dotted_name.substr(dot + 1)};
}
}  // namespace

Var Module::parameter(const std::string& dotted_name) const {
  const auto [path, leaf] = SplitLast(dotted_name);
  std::string error;
  const Module* owner = FindModule(path, &error);
  SP_CHECK(owner != nullptr, "Module::parameter: no parameter '", dotted_name, "': ", error);
  std::vector<std::string> names;
  for (const auto& [name, p] : owner->own_parameters()) {
    if (name == leaf) return p;
    names.push_back(name);
  }
  SP_CHECK(false, "Module::parameter: no parameter '", dotted_name,
           "': ", path.empty() ? std::string("the root module") : "'" + path + "'", " (a ",
           owner->Name(), ") has ",
           names.empty() ? std::string("no parameters") : "parameters " + JoinNames(names, 8));
  return Var();
}

bool Module::HasParameter(const std::string& dotted_name) const {
  const auto [path, leaf] = SplitLast(dotted_name);
  const Module* owner = FindModule(path, nullptr);
  if (owner == nullptr) return false;
  for (const auto& [name, p] : owner->own_parameters()) {
    if (name == leaf) return true;
  }
  return false;
}

std::shared_ptr<Module> Module::submodule(const std::string& dotted_name) const {
  SP_CHECK(!dotted_name.empty(), "Module::submodule: empty name");
  const auto [path, leaf] = SplitLast(dotted_name);
  std::string error;
  const Module* owner = FindModule(path, &error);
  if (owner != nullptr) {
    for (const auto& [name, child] : owner->children()) {
      if (name == leaf) return child;
    }
    // Let FindModule phrase the error for the last segment.
    FindModule(dotted_name, &error);
  }
  SP_CHECK(false, "Module::submodule: no module '", dotted_name, "': ", error);
  return nullptr;
}

bool Module::HasSubmodule(const std::string& dotted_name) const {
  return !dotted_name.empty() && FindModule(dotted_name, nullptr) != nullptr;
}

// ---------------------------------------------------------------- loading

void Module::LoadParameters(const NamedTensors& source, const LoadParametersOptions& options) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, tensor] : source) {
    SP_CHECK(tensor.defined(), "LoadParameters: source tensor '", name, "' is empty");
    SP_CHECK(by_name.emplace(name, &tensor).second, "LoadParameters: the source names '", name,
             "' twice");
  }

  // Check everything first, so a failed load leaves the module untouched.
  const NamedVars targets = named_parameters();
  std::vector<std::pair<Var, const Tensor*>> copies;
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (const auto& [name, parameter] : targets) {
    auto found = by_name.find(name);
    if (found == by_name.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& value = *found->second;
    SP_CHECK(value.shape() == parameter.shape(), "LoadParameters: parameter '", name,
             "' has shape ", parameter.shape(), " in the module (", Name(), ") but shape ",
             value.shape(), " in the source");
    used.insert(name);
    copies.emplace_back(parameter, found->second);
  }
  if (options.strict) {
    std::vector<std::string> unexpected;
    for (const auto& [name, tensor] : source) {
      if (used.count(name) == 0) unexpected.push_back(name);
    }
    if (!missing.empty() || !unexpected.empty()) {
      std::string problems;
      if (!missing.empty()) problems = "missing parameters " + JoinNames(missing, 10);
      if (!unexpected.empty()) {
        problems += (problems.empty() ? "" : "; ");
        problems += "unexpected tensors " + JoinNames(unexpected, 10);
      }
      SP_CHECK(false, "LoadParameters: the source does not match ", Name(), ": ", problems,
               " (the module has ", targets.size(), " parameter tensors, the source ",
               source.size(), ")");
    }
  }

  for (auto& [parameter, value] : copies) {
    // A source tensor that already is the parameter's storage needs no copy.
    if (!parameter.value().SameStorage(*value)) parameter.mutable_value().CopyFrom(*value);
  }
}

// ---------------------------------------------------------------- modes

void Module::Train(bool training) {
  std::vector<Module*> stack = {this};
  std::set<const Module*> seen;
  while (!stack.empty()) {
    Module* module = stack.back();
    stack.pop_back();
    if (!seen.insert(module).second) continue;
    module->training_ = training;
    for (auto& [name, child] : module->children_) stack.push_back(child.get());
  }
}

// ---------------------------------------------------------------- printing

namespace {

void PrintTree(const Module& module,
               const std::string& label,
               int depth,
               std::map<const Module*, std::string>* first_path,
               const std::string& path,
               std::ostream& out) {
  const std::string indent(2 * depth, ' ');
  auto [it, inserted] = first_path->emplace(&module, path);
  if (!inserted) {
    out << indent << label << module.Name() << " (shared with '" << it->second << "')\n";
    return;
  }
  out << indent << label << module.Name() << " (" << module.NumParameters() << " parameters)\n";
  for (const auto& [name, p] : module.own_parameters()) {
    out << indent << "  " << name << ": " << ToString(p.dtype()) << " " << p.shape();
    if (!p.requires_grad()) out << " (frozen)";
    out << "\n";
  }
  for (const auto& [name, child] : module.children()) {
    PrintTree(*child, name + ": ", depth + 1, first_path, JoinName(path, name), out);
  }
}

}  // namespace

std::string Module::ToString() const {
  std::ostringstream out;
  std::map<const Module*, std::string> first_path;
  PrintTree(*this, "", 0, &first_path, "", out);
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Module& module) {
  return out << module.ToString();
}

// ---------------------------------------------------------------- ModuleList

const std::shared_ptr<Module>& ModuleList::at(int64_t index) const {
  SP_CHECK(index >= 0 && index < size(), "ModuleList::at: index ", index,
           " is out of range for a list of ", size(), " modules");
  return children()[index].second;
}

}  // namespace stillpoint
