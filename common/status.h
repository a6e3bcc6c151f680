// The one error model of coloader: Status for operations that can fail, Result<T> for
// operations that produce a value or fail. Errors carry a code and a message that says what
// was wrong (with the path or value) and what to do. A Status is always an error or OK:
// outcomes that are not errors are values (a call bounded by a wait gives Waited<T>; an end of
// epoch, stream or run is a false or an empty optional).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace coloader {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a flag, value or file that the user can fix
  kNotFound,         // a path, producer name or file that does not exist
  kIOError,          // a read, write, mmap or socket call failed
  kProtocolError,    // a malformed or unexpected message
  kTimeout,          // a peer did not answer in time
  kDisconnected,     // the peer went away (the producer stopped, was killed or crashed)
  kDetached,         // the producer detached this consumer (it stopped reading, or broke a rule)
  kAlreadyExists,    // a producer of this name is already running
  kCancelled,        // stopped on request (a signal)
  kGroupBroken,      // a member of this consumer's group left: the group's run is over
  kInternal,
  kUnavailable,      // the machine, not the input: out of descriptors or memory, a failing device
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status Invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status Protocol(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status Disconnected(std::string m) { return {StatusCode::kDisconnected, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status GroupBroken(std::string m) { return {StatusCode::kGroupBroken, std::move(m)}; }
  static Status Detached(std::string m) { return {StatusCode::kDetached, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  // errno-based I/O error: "<what>: <strerror(errno)>".
  static Status FromErrno(const std::string& what, int err);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// "Not yet": a wait bounded by the caller's wait_ms ended before an outcome. Not an error: the
// caller calls again (checking for Ctrl-C between), and the work goes on where it stopped.
struct NotYet {};
inline constexpr NotYet kNotYet{};

// The outcome of a call that waits at most as long as its caller said: the value, or kNotYet.
//   COLOADER_ASSIGN_OR_RETURN(Waited<bool> began, consumer->NextEpoch(100));
//   if (!began.ready()) continue;  // 100 ms passed: check for Ctrl-C, call again
//   if (!*began) break;            // the stream is over
template <typename T>
class [[nodiscard]] Waited {
 public:
  Waited(T value) : value_(std::move(value)) {}  // NOLINT: implicit, as Result's
  Waited(NotYet) {}                               // NOLINT
  bool ready() const { return value_.has_value(); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return *std::move(value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
};

template <typename T>
struct IsWaited : std::false_type {};
template <typename T>
struct IsWaited<Waited<T>> : std::true_type {};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, as Arrow's Result
  // A Result<Waited<U>> takes what its Waited takes: `return kNotYet;`, `return false;`.
  template <typename V, typename W = T,
            std::enable_if_t<IsWaited<W>::value && !std::is_same_v<std::decay_t<V>, W> &&
                                 !std::is_same_v<std::decay_t<V>, Status> && std::is_constructible_v<W, V&&>,
                             int> = 0>
  Result(V&& value) : v_(W(std::forward<V>(value))) {}  // NOLINT
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status has no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& operator*() & { return std::get<T>(v_); }
  const T& operator*() const& { return std::get<T>(v_); }
  T&& operator*() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace coloader

#define COLOADER_CONCAT_INNER(a, b) a##b
#define COLOADER_CONCAT(a, b) COLOADER_CONCAT_INNER(a, b)

#define COLOADER_RETURN_NOT_OK(expr) \
  do {                               \
    ::coloader::Status _st = (expr); \
    if (!_st.ok()) return _st;       \
  } while (false)

#define COLOADER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                   \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(*tmp)

#define COLOADER_ASSIGN_OR_RETURN(lhs, rexpr) \
  COLOADER_ASSIGN_OR_RETURN_IMPL(COLOADER_CONCAT(_result_, __LINE__), lhs, rexpr)
