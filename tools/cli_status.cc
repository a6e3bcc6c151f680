#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/curve.h"
#include "common/endpoint.h"
#include "common/protocol.h"
#include "common/socket.h"
#include "toolbox/json.h"
#include "tools/cli.h"

namespace coloader::cli {

namespace {

constexpr const char* kStatusSynopsis = "coloader status [--name NAME | --endpoint EP] [options]";

Result<StatusReply> Query(const std::string& name, std::string endpoint, int timeout_ms, const std::string& key_file,
                          const std::string& server_key) {
  if (endpoint.empty()) {
    COLOADER_ASSIGN_OR_RETURN(ProducerPaths paths, PathsFor(name));
    if (!NameLock::IsHeld(paths.lock)) {
      // A dead one of that name may have left its ring behind: say so, and how to remove it.
      size_t left = 0;
      if (auto l = FindLeftovers(); l.ok())
        left = static_cast<size_t>(std::count_if(l->begin(), l->end(), [&](const Leftover& x) { return x.name == name; }));
      return Status::NotFound("no producer named '" + name + "' is running" + WhatRunsInstead(name) +
                              "; start one with: coloader serve --name " + name + " --data DIR" +
                              (left ? " (a dead one left " + std::to_string(left) +
                                          " file(s): `coloader status` lists them, `coloader clean --yes` removes them)"
                                    : ""));
    }
    endpoint = paths.endpoint;
  }
  zmq::context_t ctx(1);
  COLOADER_ASSIGN_OR_RETURN(Socket sock, Socket::Open(ctx, zmq::socket_type::dealer));
  COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::linger, 0));
  COLOADER_RETURN_NOT_OK(sock.Set(zmq::sockopt::maxmsgsize, kMaxLocalReplyBytes));
  if (!key_file.empty() || !server_key.empty()) COLOADER_RETURN_NOT_OK(UseCurveClientKeys(sock, key_file, server_key).status());
  if (Status st = sock.Connect(endpoint); !st.ok())
    return Status::Invalid(st.message() + " (an endpoint looks like tcp://HOST:PORT or ipc://PATH)");
  std::vector<uint8_t> req = Encode(StatusRequest{});
  // A new connection's first message goes into its empty queue; a connection already refused
  // (a producer that wants CURVE keys) takes none, which the timeout below then explains.
  COLOADER_RETURN_NOT_OK(sock.Send(zmq::buffer(req), zmq::send_flags::dontwait).status());
  std::vector<zmq::pollitem_t> items = {{sock.handle(), 0, ZMQ_POLLIN, 0}};
  COLOADER_RETURN_NOT_OK(Poll(items, std::chrono::milliseconds(timeout_ms)).status());
  zmq::message_t reply;
  bool got = false;
  if (items[0].revents & ZMQ_POLLIN) {
    COLOADER_ASSIGN_OR_RETURN(got, sock.Recv(&reply, zmq::recv_flags::dontwait));
  }
  if (!got) {
    std::string why = "producer at " + endpoint + " did not answer within " + std::to_string(timeout_ms) + " ms";
    if (endpoint.rfind("tcp://", 0) == 0) {
      // A refused CURVE handshake is silent on the client's side, like a host that is down.
      why += key_file.empty() ? ": is it running there, and without CURVE keys (--insecure)? Otherwise give "
                                "--curve-key and --server-key (coloader keygen)"
                              : ": is it running there, and does its --authorized-keys list this --curve-key?";
    }
    return Status::Timeout(why);
  }
  COLOADER_ASSIGN_OR_RETURN(Message m, Decode(reply.data<uint8_t>(), reply.size()));
  if (auto* r = std::get_if<StatusReply>(&m)) return *r;
  if (auto* reject = std::get_if<Reject>(&m)) return Status::Protocol("the producer refused the request: " + reject->reason);
  return Status::Protocol(std::string("expected StatusReply, got ") + MessageTypeName(m));
}

std::string PathName(uint8_t path) { return path == 0 ? "host" : "cuda:" + std::to_string(path - 1); }

struct Running {
  std::string name;
  Result<StatusReply> reply;
};

// The producers running in this run directory, each asked for its state for at most `timeout_ms`.
Result<std::vector<Running>> AskRunning(int timeout_ms) {
  COLOADER_ASSIGN_OR_RETURN(std::vector<std::string> names, RunningProducers());
  std::vector<Running> out;
  for (std::string& n : names) {
    Result<StatusReply> r = Query(n, "", timeout_ms, "", "");
    out.push_back({std::move(n), std::move(r)});
  }
  return out;
}

// One line per producer running here: its name, pid, state, epoch, consumers and rate.
void ListRunning(const Result<std::vector<Running>>& running) {
  if (!running.ok() || running->empty()) {
    std::printf("no producer is running here%s\n", running.ok() ? "" : (": " + running.status().message()).c_str());
    return;
  }
  std::printf("%-24s %-8s %-22s %-6s %-10s %s\n", "running", "pid", "state", "epoch", "consumers", "images/s");
  for (const Running& p : *running) {
    if (!p.reply.ok()) {
      std::printf("%-24s (did not answer: %s)\n", p.name.c_str(), p.reply.status().message().c_str());
      continue;
    }
    const StatusReply& r = *p.reply;
    std::printf("%-24s %-8u %-22s %-6llu %-10zu %.0f\n", p.name.c_str(), r.pid, ProducerStateName(r.state),
                static_cast<unsigned long long>(r.epoch), r.consumers.size(), r.images_per_s);
  }
  std::printf("(`coloader status --name NAME` shows one in full)\n");
}

// The same as a JSON array field "running" of an open object (a producer that did not answer
// has its "error").
void RunningJson(JsonWriter& w, const std::vector<Running>& running) {
  w.BeginArray("running");
  for (const Running& p : running) {
    w.BeginObject().Field("name", p.name);
    if (p.reply.ok()) {
      const StatusReply& r = *p.reply;
      w.Field("pid", r.pid)
          .Field("state", ProducerStateName(r.state))
          .Field("epoch", r.epoch)
          .Field("consumers", static_cast<uint64_t>(r.consumers.size()))
          .Field("images_per_s", r.images_per_s);
    } else {
      w.Field("error", p.reply.status().message());
    }
    w.EndObject();
  }
  w.EndArray();
}

}  // namespace

int StatusCommand(const std::vector<std::string>& args) {
  std::string name, endpoint, key_file, server_key;
  bool json = false;
  int timeout_ms = 3000;
  Command cmd("status", kStatusSynopsis,
              "Show a producer's live state: epoch, throughput, slots and consumers. Without --name or --endpoint: "
              "the producers running here, then what dead ones left behind (`coloader clean` removes it).");
  cmd.Add("--name", &name, "the producer's name")->type_name("NAME");
  cmd.Add("--endpoint", &endpoint, "or its ZeroMQ endpoint (tcp://HOST:PORT for a producer elsewhere)")
      ->type_name("EP");
  cmd.Add("--json", &json, "one JSON object instead of the table");
  cmd.Add("--curve-key", &key_file, "a key pair the producer accepts, for a tcp:// endpoint")->type_name("FILE");
  cmd.Add("--server-key", &server_key, "the producer's public key (Z85 text or its .pub file)")
      ->type_name("KEY|FILE");
  cmd.Add("--timeout-ms", &timeout_ms, "how long to wait for the answer")->check(AtLeast(1));
  if (std::optional<int> exit = cmd.Parse(args)) return *exit;
  if (name.empty() && endpoint.empty()) {
    // No producer named: those running now, then what dead ones left (the listing `coloader
    // clean` works from).
    const Result<std::vector<Running>> running = AskRunning(timeout_ms);
    size_t foreign = 0;
    Result<std::vector<Leftover>> left = FindLeftovers(&foreign);
    if (!left.ok() || (json && !running.ok())) {
      std::fprintf(stderr, "coloader status: %s\n",
                   (left.ok() ? running.status() : left.status()).message().c_str());
      return 1;
    }
    if (json) {
      JsonWriter w;
      w.BeginObject();
      RunningJson(w, *running);
      LeftoversJson(w, *left, foreign);
      w.EndObject();
      std::printf("%s\n", w.str().c_str());
      return 0;
    }
    ListRunning(running);
    if (left->empty()) std::printf("no leftovers of dead producers\n");
    PrintLeftovers(*left, foreign, "found");
    if (!left->empty()) std::printf("run `coloader clean --yes` to remove them\n");
    return 0;
  }
  Result<StatusReply> r = Query(name, endpoint, timeout_ms, key_file, server_key);
  if (!r.ok()) {
    std::fprintf(stderr, "coloader status: %s\n", r.status().message().c_str());
    return 1;
  }
  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("name", r->name)
        .Field("pid", r->pid)
        .Field("state", ProducerStateName(r->state))
        .Field("epoch", r->epoch)
        .Field("position", r->position)
        .Field("epoch_samples", r->epoch_samples)
        .Field("batches_published", r->batches_published)
        .Field("samples_published", r->samples_published)
        .Field("batches_per_s", r->batches_per_s)
        .Field("images_per_s", r->images_per_s)
        .Field("cpu_seconds", r->cpu_seconds)
        .Field("uptime_seconds", r->uptime_seconds)
        .Field("slots", r->num_slots)
        .Field("slots_in_use", r->slots_in_use)
        .Field("bad_files", r->bad_files)
        .Field("rejected_messages", r->rejected_messages)
        .Field("dropped_clients", r->dropped_clients);
    if (!r->decode.empty()) w.Field("decode", r->decode);
    w.BeginArray("consumers");
    for (const ConsumerStatus& c : r->consumers) {
      w.BeginObject()
          .Field("id", c.id)
          .Field("pid", c.pid)
          .Field("name", c.name)
          .Field("batch_size", c.batch_size)
          .Field("received", c.received)
          .Field("acked", c.acked)
          .Field("held", c.held)
          .Field("lag", c.lag)
          .Field("unread", c.unread)
          .Field("idle_ms", c.idle_ms)
          .Field("path", PathName(c.path));
      if (!c.group.empty()) {
        w.Field("group", c.group).Field("rank", c.rank).Field("world_size", c.world_size)
            .Field("waiting_for_group", c.waiting != 0);
      }
      w.EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return 0;
  }
  std::printf("producer %s (pid %u): %s\n", r->name.c_str(), r->pid, ProducerStateName(r->state));
  std::printf("  epoch %llu, %llu of %llu samples\n", static_cast<unsigned long long>(r->epoch),
              static_cast<unsigned long long>(r->position), static_cast<unsigned long long>(r->epoch_samples));
  std::printf("  throughput %.1f batches/s, %.0f images/s; published %llu batches, %llu samples\n",
              r->batches_per_s, r->images_per_s, static_cast<unsigned long long>(r->batches_published),
              static_cast<unsigned long long>(r->samples_published));
  std::printf("  CPU %.1f s over %.1f s; slots %u/%u in use; bad files %llu; rejected messages %llu; "
              "clients dropped for misbehaving %llu\n",
              r->cpu_seconds, r->uptime_seconds, r->slots_in_use, r->num_slots,
              static_cast<unsigned long long>(r->bad_files), static_cast<unsigned long long>(r->rejected_messages),
              static_cast<unsigned long long>(r->dropped_clients));
  if (!r->decode.empty()) std::printf("  decode: %s\n", r->decode.c_str());
  std::printf("  %-4s %-8s %-6s %-10s %-10s %-5s %-5s %-6s %-8s %s\n", "id", "pid", "batch", "received", "acked",
              "held", "lag", "unread", "idle s", "path");
  for (const ConsumerStatus& c : r->consumers) {
    std::printf("  %-4llu %-8u %-6u %-10llu %-10llu %-5u %-5llu %-6llu %-8.1f %s\n", static_cast<unsigned long long>(c.id),
                c.pid, c.batch_size, static_cast<unsigned long long>(c.received),
                static_cast<unsigned long long>(c.acked), c.held, static_cast<unsigned long long>(c.lag),
                static_cast<unsigned long long>(c.unread), static_cast<double>(c.idle_ms) / 1000.0,
                PathName(c.path).c_str());
    if (!c.group.empty())
      std::printf("       rank %u of %u in group %s%s\n", c.rank, c.world_size, c.group.c_str(),
                  c.waiting ? ": waiting for the rest of its group" : "");
  }
  return 0;
}

}  // namespace coloader::cli
