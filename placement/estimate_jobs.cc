// Running helper commands (the estimator, the MPS control daemon) with their output captured,
// and filling the jobs' "auto" memory and SM activity from the estimator (placement/jobs.h).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/process.h"
#include "common/unique_fd.h"
#include "placement/jobs.h"

extern char** environ;

namespace coloader {

// ---- running helper commands ------------------------------------------------------------------

SpawnArgs::SpawnArgs(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : arg_strings_(argv) {
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    if (!env.count(kv.substr(0, kv.find('=')))) env_strings_.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings_.push_back(k + "=" + v);
  for (auto& a : arg_strings_) args_.push_back(a.data());
  args_.push_back(nullptr);
  for (auto& e : env_strings_) envp_.push_back(e.data());
  envp_.push_back(nullptr);
}

Result<CommandOutput> RunCommand(const std::vector<std::string>& argv, int timeout_ms,
                                 const std::map<std::string, std::string>& env) {
  if (argv.empty()) return Status::Invalid("empty command");
  COLOADER_ASSIGN_OR_RETURN(Pipe out_pipe, Pipe::Make());
  COLOADER_ASSIGN_OR_RETURN(Pipe err_pipe, Pipe::Make());
  SpawnArgs spawn(argv, env);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe.write.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe.write.get(), 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, spawn.argv(), spawn.envp());
  posix_spawn_file_actions_destroy(&fa);
  out_pipe.write.Reset();  // the child's copies are the only writers now
  err_pipe.write.Reset();
  if (rc != 0) return Status::NotFound("cannot run " + argv[0] + ": " + std::strerror(rc));
  CommandOutput result;
  UniqueFd* ends[2] = {&out_pipe.read, &err_pipe.read};
  pollfd fds[2] = {{out_pipe.read.get(), POLLIN, 0}, {err_pipe.read.get(), POLLIN, 0}};
  const uint64_t deadline = MonotonicNs() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  bool timed_out = false;
  int poll_errno = 0;
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    const uint64_t now = MonotonicNs();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    if (::poll(fds, 2, static_cast<int>((deadline - now) / 1000000ull) + 1) < 0) {
      if (errno == EINTR) continue;  // revents are stale: poll again
      // We can no longer watch the child, so it must not be left to run (and the waitpid below
      // has no timeout): stop it as if it had timed out.
      poll_errno = errno;
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        (k == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ends[k]->Reset();
        fds[k].fd = -1;  // poll skips it
      }
    }
  }
  if (timed_out || poll_errno != 0) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (poll_errno != 0) return Status::FromErrno("poll on the output of " + argv[0] + " (stopped it)", poll_errno);
  if (timed_out) return Status::Timeout(argv[0] + " did not finish within " + std::to_string(timeout_ms) + " ms");
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::vector<std::string> EstimatorCommand(const Job& job, const JobPipeline& pipeline, const std::string& python) {
  // A job that states no batch_size reads at the producer's (only a job whose memory is stated
  // can: "auto" needs the batch size).
  const uint32_t batch = job.batch_size > 0 ? job.batch_size : pipeline.producer_batch;
  std::vector<std::string> cmd = {python, "-m", "coloader.estimator", "--model", job.model, "--batch-size",
                                  std::to_string(batch), "--optimizer", job.optimizer, "--precision",
                                  job.precision, "--image-size", std::to_string(pipeline.image_size)};
  if (job.channels_last) cmd.push_back("--channels-last");
  cmd.push_back("--json");
  return cmd;
}

const char* SmSourceName(Job::SmSource source) {
  switch (source) {
    case Job::SmSource::kStated: return "stated";
    case Job::SmSource::kEstimated: return "estimated";
    case Job::SmSource::kDefault: break;
  }
  return "default";
}

namespace {

// One run of the estimator for one command line, or why it gave nothing: the jobs that share the
// command share this, so a reused run is judged exactly as a fresh one.
struct EstimatorRun {
  std::string failure;  // empty: it ran and printed a JSON object; else what went wrong
  std::string brief;    // failure in one line (the last line of what it printed), for sm_why
  std::string advice;   // what to do about the failure (a sentence without its full stop)
  double total_mib = -1;    // its "total_mib" when a positive number, else -1
  double sm_activity = -1;  // its "sm_activity" when in (0, 1], else -1
};

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t newline = text.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return text.substr(begin, end + 1 - begin);
}

EstimatorRun RunEstimator(const std::vector<std::string>& cmd, const std::string& job_name) {
  EstimatorRun run;
  const std::string name_python = "name a Python with torch and the coloader package (--python or $COLOADER_PYTHON)";
  Result<CommandOutput> r = RunCommand(cmd, 600000);
  if (!r.ok()) {
    run.failure = "could not run: " + r.status().message();
    run.brief = run.failure;
    run.advice = "Install Python with torch and the coloader package (pip install ./python), or " + name_python;
    return run;
  }
  if (r->exit_code != 0) {
    std::string tail = r->err.size() > 600 ? r->err.substr(r->err.size() - 600) : r->err;
    tail.erase(tail.find_last_not_of(" \t\r\n") + 1);  // npos + 1: all of it
    const std::string exit = "failed (exit " + std::to_string(r->exit_code) + ")";
    run.failure = tail.empty() ? exit + ", printing nothing on stderr" : exit + ": " + tail;
    run.brief = tail.empty() ? run.failure : exit + ": " + LastLine(tail);
    if (r->err.find("No module named") != std::string::npos) {
      // Python itself found no coloader (or one of its imports): the package is not installed there.
      run.advice = "Install the coloader Python package (pip install ./python) for " + cmd[0] + ", or " + name_python;
    } else if (r->exit_code == 2 && r->err.find("needs PyTorch") != std::string::npos) {
      run.advice = "Install torch for " + cmd[0] + ", or " + name_python;
    } else if (r->exit_code == 2) {
      // The estimator's own refusal (argparse, or EstimateError: an unknown model, optimizer,
      // precision, or an image size the model cannot take): its message says which field.
      run.advice = "The estimator refused the job's figures: check its model, batch_size, optimizer, precision, "
                   "channels_last and its pipeline's image_size";
    } else {
      run.advice = "See the estimator's error above; update the coloader Python package (pip install ./python)";
    }
    return run;
  }
  Result<JsonValue> doc = ParseJson(r->out, "estimator output for job \"" + job_name + "\"");
  if (!doc.ok() || !doc->is_object()) {
    run.failure = "printed something that is not a JSON object" + (doc.ok() ? std::string() : ": " + doc.status().message());
    run.brief = run.failure;
    run.advice = "Update the coloader Python package (pip install ./python)";
    return run;
  }
  const JsonValue* total = doc->Find("total_mib");
  if (total && total->is_number() && total->number() > 0 && std::isfinite(total->number())) run.total_mib = total->number();
  // An estimator from before the activity model prints none.
  const JsonValue* sm = doc->Find("sm_activity");
  if (sm && sm->is_number() && sm->number() > 0 && sm->number() <= 1) run.sm_activity = sm->number();
  return run;
}

}  // namespace

Status EstimateAutoJobs(JobSet* set, const std::string& python) {
  std::map<std::vector<std::string>, EstimatorRun> runs;  // by command: identical jobs run it once
  std::map<std::string, std::vector<std::string>> defaulted;  // sm_why -> the jobs that fell back for it
  std::map<std::string, std::string> advice_for;              // sm_why -> its advice
  for (Job& job : set->jobs) {
    const bool want_sm = !job.model.empty() && job.sm_source == Job::SmSource::kDefault;
    if (!job.memory_auto && !want_sm) continue;
    const std::vector<std::string> cmd = EstimatorCommand(job, set->pipelines[job.pipeline], python);
    auto it = runs.find(cmd);
    if (it == runs.end()) it = runs.emplace(cmd, RunEstimator(cmd, job.name)).first;
    const EstimatorRun& run = it->second;
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
    if (job.memory_auto) {  // its memory has no other source: any failure is an error
      const std::string what = "job \"" + job.name + "\": memory_mib is \"auto\" but the estimator (" + line + ")";
      if (!run.failure.empty())
        return Status::Invalid(what + " " + run.failure + "\n" + run.advice + ", or give memory_mib in MiB.");
      if (run.total_mib <= 0)
        return Status::Invalid(what + " printed no positive \"total_mib\": update the coloader Python package "
                               "(pip install ./python), or give memory_mib in MiB.");
      job.memory_mib = run.total_mib;
    }
    if (!want_sm) continue;
    if (run.failure.empty() && run.sm_activity > 0) {
      job.sm_activity = run.sm_activity;
      job.sm_source = Job::SmSource::kEstimated;
      job.sm_why.clear();
      continue;
    }
    // Its SM activity alone is wanted from here: it plans as before the estimator gave one.
    job.sm_why = run.failure.empty() ? "the estimator printed no \"sm_activity\" in (0, 1]" : "the estimator " + run.brief;
    defaulted[job.sm_why].push_back(job.name);
    advice_for[job.sm_why] = run.failure.empty() ? "Update the coloader Python package (pip install ./python)" : run.advice;
  }
  for (const auto& [why, jobs] : defaulted) {
    std::string names;
    for (const std::string& n : jobs) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "warning: no SM activity estimated for job%s %s (%s), so %s --default-sm. %s, or state "
                 "sm_activity (0..1).\n", jobs.size() > 1 ? "s" : "", names.c_str(), why.c_str(),
                 jobs.size() > 1 ? "they use" : "it uses", advice_for[why].c_str());
  }
  return Status::OK();
}

}  // namespace coloader
