// `coloader clean`: removes what dead producers left behind (a SIGKILL, an OOM kill, a
// container stopped under them): their rings and mailboxes in /dev/shm, their sockets and lock
// files in the run directory. A dry run unless --yes; a live producer's files are never listed
// nor touched (common/endpoint.h, FindLeftovers and CleanLeftovers, say how that is decided).
#include <cstdio>
#include <optional>

#include "common/endpoint.h"
#include "common/shm.h"
#include "toolbox/json.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {
constexpr const char* kCleanSynopsis = "coloader clean [--yes] [--json]";
}  // namespace

void PrintLeftovers(const std::vector<Leftover>& items, size_t foreign, const char* verb) {
  uint64_t shm_bytes = 0;
  for (const Leftover& l : items) {
    std::printf("  %-20s %-9s %s%s\n", l.name.c_str(), l.kind.c_str(), l.path.c_str(),
                l.bytes ? (" (" + HumanBytes(l.bytes) + ")").c_str() : "");
    shm_bytes += l.bytes;
  }
  if (!items.empty()) {
    std::printf("%zu leftover(s) of dead producers %s, %s of %s\n", items.size(), verb, HumanBytes(shm_bytes).c_str(),
                kShmDir);
  }
  if (foreign > 0) {
    std::printf("%zu more coloader object(s) of yours in %s belong to other run directories: run this with their "
                "COLOADER_RUN_DIR to judge them\n", foreign, kShmDir);
  }
}

void LeftoversJson(JsonWriter& w, const std::vector<Leftover>& items, size_t foreign) {
  w.BeginArray("leftovers");
  for (const Leftover& l : items)
    w.BeginObject().Field("name", l.name).Field("kind", l.kind).Field("path", l.path).Field("bytes", l.bytes).EndObject();
  w.EndArray().Field("other_run_dirs", static_cast<uint64_t>(foreign));
}

int Clean(const std::vector<std::string>& args) {
  bool yes = false, json = false;
  Command cmd("clean", kCleanSynopsis,
              "Remove what dead producers left behind in this run directory and /dev/shm (rings, mailboxes, sockets, "
              "lock files). Without --yes it only lists them; a live producer's files are never touched.");
  cmd.Add("--yes", &yes, "remove them (without it: only list what would be removed)");
  cmd.Add("--json", &json, "one JSON object instead of the listing");
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  size_t foreign = 0;
  Result<std::vector<Leftover>> r = yes ? CleanLeftovers() : FindLeftovers(&foreign);
  if (yes && r.ok()) (void)FindLeftovers(&foreign);
  if (!r.ok()) {
    std::fprintf(stderr, "coloader clean: %s\n", r.status().message().c_str());
    return 1;
  }
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("removed", yes);
    LeftoversJson(w, *r, foreign);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  if (r->empty()) std::printf("no leftovers of dead producers in this run directory or %s\n", kShmDir);
  PrintLeftovers(*r, foreign, yes ? "removed" : "found");
  if (!yes && !r->empty()) std::printf("run `coloader clean --yes` to remove them\n");
  return 0;
}

}  // namespace coloader::cli
