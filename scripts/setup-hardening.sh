#!/usr/bin/env bash
# Installs (apt, Debian 12) what the hardening builds need on top of scripts/setup.sh:
# clang with its sanitizer and libFuzzer runtimes (scripts/fuzz.sh). The gcc sanitizer
# runtimes that scripts/sanitize.sh links (libasan, libubsan, libtsan) come with g++.
# Installs nothing when everything is present.
set -euo pipefail

sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
updated=0
install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "setup-hardening: installing ${missing[*]}"
  if ((!updated)); then "${sudo_cmd[@]}" apt-get update -qq; updated=1; fi
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install clang
# The runtimes (libclang_rt.fuzzer, .asan, .ubsan) are a Recommends of clang, which
# --no-install-recommends leaves out: name the package of the installed clang's version.
version=$(clang++ --version | sed -n 's/.*clang version \([0-9]*\)\..*/\1/p' | head -n 1)
install "libclang-rt-${version}-dev"

# The check that matters: clang links a libFuzzer target with ASan and UBSan.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cc"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" 2>"$probe/err"; then
  echo "setup-hardening: clang++ cannot link -fsanitize=fuzzer,address,undefined:" >&2
  cat "$probe/err" >&2
  exit 1
fi
