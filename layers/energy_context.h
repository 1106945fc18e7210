// The context of an energy layer: the inputs its energy reads besides the
// state (keys, stored patterns, queries, masks), as a struct of Vars that
// lists its members once, in the spirit of framework/option_fields.h:
//
//   struct LseContext {
//     Var keys;    // [B, S, d], per sample
//     Var mask{};  // [B, S], per sample; optional
//     Var beta;    // [1], shared by every sample
//     static const ContextFields<LseContext>& Fields() {
//       static const auto fields = ContextFields<LseContext>("LseContext")
//                                      .PerSample("keys", &LseContext::keys)
//                                      .PerSample("mask", &LseContext::mask)
//                                      .Shared("beta", &LseContext::beta);
//       return fields;
//     }
//   };
//
// A per-sample member has the sample on axis 0 (every per-sample member the
// same extent B), so a solver that iterates only the unconverged samples can
// select their rows (Select); a shared member is used by every sample as it
// is. A member left undefined is absent (an optional mask, a field that only
// some options read) and is skipped by everything below; such a member is
// declared with {}, so that LseContext{.keys = k, .beta = b} may leave it
// out without a -Wmissing-field-initializers warning. What the solve
// needs of any context comes from the declaration: the samples (BatchSize),
// the rows of a subset of samples (Select, a differentiable gather, so
// gradients still reach the full members), every defined Var in declaration
// order (Values: the solve's explicit inputs) and a printout (Describe).
// The layer itself reads the members by name: ctx.keys.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "framework/autograd.h"
#include "framework/ops.h"

namespace stillpoint {

// One defined member of a context, as the generic code sees it.
struct ContextEntry {
  const char* name;
  const Var* value;
  bool per_sample;
};

// The samples of the per-sample entries (their common extent on axis 0), or
// -1 when there are none. Throws an Error naming `who` when they disagree
// or one has no sample axis.
int64_t ContextBatchSize(const std::vector<ContextEntry>& entries, const std::string& who);
// "keys [2, 3, 4], beta (shared) [3]", or "no entries".
std::string DescribeContextEntries(const std::vector<ContextEntry>& entries);
// True when ids are 0..batch-1 in order (Select then returns the context).
bool SelectsEverySample(const std::vector<int64_t>& ids, int64_t batch);
// Throws an Error naming `who` unless every id is in [0, batch).
void CheckSampleIds(const std::vector<int64_t>& ids, int64_t batch, const std::string& who);

template <typename Context>
class ContextFields {
 public:
  // name: the struct's name, for messages ("HopfieldContext").
  explicit ContextFields(std::string name) : name_(std::move(name)) {}

  ContextFields& PerSample(const char* name, Var Context::*member) {
    members_.push_back({name, member, true});
    return *this;
  }
  ContextFields& Shared(const char* name, Var Context::*member) {
    members_.push_back({name, member, false});
    return *this;
  }

  const std::string& name() const { return name_; }

  // The defined members, in declaration order.
  std::vector<ContextEntry> Entries(const Context& ctx) const {
    std::vector<ContextEntry> entries;
    for (const Member& m : members_) {
      if ((ctx.*m.member).defined()) entries.push_back({m.name, &(ctx.*m.member), m.per_sample});
    }
    return entries;
  }
  // See ContextBatchSize; `who` names the layer reading the context.
  int64_t BatchSize(const Context& ctx, const std::string& who) const {
    return ContextBatchSize(Entries(ctx), who + " (" + name_ + ")");
  }
  // The context of the samples `ids` (each in [0, batch), batch =
  // BatchSize(ctx)): the per-sample members' rows gather(member, 0, ids),
  // the shared members unchanged. All of 0..B-1 in order, or a context
  // without per-sample members (batch -1), returns ctx itself.
  Context Select(const Context& ctx, const std::vector<int64_t>& ids, int64_t batch) const {
    if (batch < 0 || SelectsEverySample(ids, batch)) return ctx;
    Context selected = ctx;
    for (const Member& m : members_) {
      if (m.per_sample && (ctx.*m.member).defined()) {
        selected.*m.member = gather(ctx.*m.member, 0, ids);
      }
    }
    return selected;
  }
  // Every defined member's Var, per-sample and shared, in declaration order.
  VarList Values(const Context& ctx) const {
    VarList values;
    for (const ContextEntry& entry : Entries(ctx)) values.push_back(*entry.value);
    return values;
  }
  std::string Describe(const Context& ctx) const {
    return name_ + " {" + DescribeContextEntries(Entries(ctx)) + "}";
  }

 private:
  struct Member {
    const char* name;
    Var Context::*member;
    bool per_sample;
  };
  std::string name_;
  std::vector<Member> members_;
};

// A struct usable as an energy layer's context: copyable, with its members
// declared by a static Fields().
template <typename C>
concept EnergyContextType = std::copyable<C> && requires {
  { C::Fields() } -> std::same_as<const ContextFields<C>&>;
};

// The context of an energy that reads nothing besides the state.
struct NoContext {
  static const ContextFields<NoContext>& Fields();
};

}  // namespace stillpoint
