// coloader: one producer decodes and augments every batch once; any number of training
// processes consume it. See `coloader help`.
#include <cstdio>
#include <string>
#include <vector>

#include "common/process.h"
#include "tools/cli.h"

namespace {

constexpr const char* kHelp =
    "coloader: a shared data loader for collocated training jobs\n"
    "\n"
    "usage:\n"
    "  coloader serve   --data DIR --name NAME [options]   run a producer\n"
    "  coloader consume --name NAME [options]              run the reference consumer\n"
    "  coloader status  --name NAME [--json]               show a producer's live state\n"
    "  coloader status                                     list the producers running, and what dead ones left\n"
    "  coloader clean   [--yes]                            remove it (a dry run without --yes)\n"
    "  coloader plan    JOBS.json [options]                place jobs on GPUs (MPS/MIG, shared producers)\n"
    "  coloader launch  JOBS.json [options]                run a plan: MPS daemon, producers, jobs\n"
    "  coloader simulate --trace TRACE.json [options]      replay a trace under each placement policy\n"
    "  coloader keygen  --out NAME                         a CURVE key pair for tcp:// endpoints\n"
    "  coloader shard   --data DIR --out 'train-%06d.tar'  write a dataset as WebDataset tar shards\n"
    "  coloader --version                                  this release (also -V, version)\n"
    "\n"
    "`coloader COMMAND --help` lists a command's options.\n";

int Run(std::vector<std::string> args);

}  // namespace

// Every command reports its failures as a Status; what still escapes as an exception (a
// resource failure deep in a library: memory, the thread limit) is said in one line here, after
// the command's objects were destroyed on the way out (a producer removes its ring and socket).
int main(int argc, char** argv) {
  try {
    return Run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coloader: %s\n", coloader::ResourceFailure(e).c_str());
  } catch (...) {
    std::fprintf(stderr, "coloader: an unknown exception ended the command\n");
  }
  return 1;
}

namespace {

int Run(std::vector<std::string> args) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kHelp, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "-V" || args[0] == "version") {
    // The one version of the release: the top CMakeLists.txt's project(), which the Python
    // package's metadata and coloader.__version__ read too.
    std::printf("coloader %s\n", COLOADER_VERSION);
    return 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "serve") return coloader::cli::Serve(args);
  if (command == "consume") return coloader::cli::Consume(args);
  if (command == "status") return coloader::cli::StatusCommand(args);
  if (command == "plan") return coloader::cli::PlanCommand(args);
  if (command == "launch") return coloader::cli::LaunchCommand(args);
  if (command == "simulate") return coloader::cli::SimulateCommand(args);
  if (command == "keygen") return coloader::cli::Keygen(args);
  if (command == "clean") return coloader::cli::Clean(args);
  if (command == "shard") return coloader::cli::Shard(args);
  std::fprintf(stderr, "coloader: unknown command '%s'\n\n%s", command.c_str(), kHelp);
  return 2;
}

}  // namespace
