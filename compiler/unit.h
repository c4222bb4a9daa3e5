#ifndef KFORGE_COMPILER_UNIT_H_
#define KFORGE_COMPILER_UNIT_H_

// A generated instantiation unit as the programs NVRTC compiles: a module's
// entries are compiled as several programs on parallel threads (one cubin
// image each, KernelArtifact.more_cubins), in groups that keep every
// entry's machine code what it is in the whole unit (BENCH.md, "Cold
// compile time: a module as several programs").

#include <string>
#include <utility>
#include <vector>

namespace kforge {

// One NVRTC program: the unit's preamble and some of its entries.
struct ProgramUnit {
  std::string source;
  std::vector<std::string> entries;  // the extern "C" names it exports
};

struct GeneratedUnit {
  struct Entry {
    std::string name;
    // Entries of one group are compiled as one program. NVVM's code for an
    // entry can depend on the other entries that share its inline code, so
    // the codegen puts together the entries that must stay together.
    std::string group;
    std::string text;  // the extern "C" definition
  };
  std::string preamble;  // includes and traits every program repeats
  std::vector<Entry> entries;

  void Add(std::string name, std::string group, std::string text) {
    entries.push_back({std::move(name), std::move(group), std::move(text)});
  }

  // The unit as one program (what `kforge compile --source` prints).
  std::string Whole() const {
    std::string out = preamble;
    for (const Entry& e : entries) out += e.text;
    return out;
  }

  // One program per group, in the order of each group's first entry (the
  // first holds the first entry: the module's main one). Each program's
  // entries keep the unit's order.
  std::vector<ProgramUnit> Programs() const {
    std::vector<std::string> groups;
    for (const Entry& e : entries) {
      bool seen = false;
      for (const std::string& g : groups) seen = seen || g == e.group;
      if (!seen) groups.push_back(e.group);
    }
    std::vector<ProgramUnit> programs;
    for (const std::string& g : groups) {
      ProgramUnit p;
      p.source = preamble;
      for (const Entry& e : entries) {
        if (e.group != g) continue;
        p.source += e.text;
        p.entries.push_back(e.name);
      }
      programs.push_back(std::move(p));
    }
    return programs;
  }
};

}  // namespace kforge

#endif  // KFORGE_COMPILER_UNIT_H_
