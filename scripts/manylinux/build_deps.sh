#!/usr/bin/env bash
# The libraries the wheel links, as static -fPIC archives that need no glibc past 2.28 (issue 43):
# Debian 12's shared ones need glibc 2.34+, so a wheel that vendors them is manylinux_2_35 at
# best. The same upstream releases Debian 12 ships (its source packages' .orig tarballs, pinned by
# SHA-256), built with this machine's gcc 12; scripts/manylinux/glibc_floor.sh's flags then link
# them into the wheel's libraries and command (scripts/build_wheel.sh --glibc-floor).
#
#   scripts/manylinux/build_deps.sh        -> build-manylinux/deps (prefix: lib/, include/, cmake/pkg-config files)
#
# Built once per clone (a stamp per library); about 15 min on the 2-core dev box, most of it
# OpenCV's core and imgproc. Each archive's CPU paths stay on: libjpeg-turbo's SIMD (nasm),
# OpenCV's dispatched AVX2/AVX-512 kernels. What the wheel does not use is left out: OpenCV's
# other modules, codecs and threading back ends (coloader runs its own workers), libtiff's codecs
# beyond JPEG and deflate, libsodium (ZeroMQ's CURVE uses its bundled TweetNaCl).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)/build-manylinux
src=$root/src
prefix=$root/deps
mkdir -p "$src" "$prefix"
jobs=${JOBS:-$(nproc)}
pool=${DEBIAN_POOL:-http://deb.debian.org/debian/pool/main}

for tool in cmake nasm make curl; do
  command -v "$tool" >/dev/null || {
    echo "build_deps: $tool is missing (Debian: apt-get install $tool)" >&2
    exit 1
  }
done

# name | pool path | SHA-256 of Debian 12's .orig tarball
sources=(
  "zlib|z/zlib/zlib_1.2.13.dfsg.orig.tar.bz2|71feb7947e3c00ef125f83b79a4e529bde31171e5babe48b391f06758d1ab0a1"
  "libjpeg-turbo|libj/libjpeg-turbo/libjpeg-turbo_2.1.5.orig.tar.gz|254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c"
  "zeromq|z/zeromq3/zeromq3_4.3.4.orig.tar.gz|0ff5a531c9ffaf0dfdc7dc78d13d1383088f454896d252934c429b2554d10559"
  "libspng|libs/libspng/libspng_0.7.3.orig.tar.gz|a50cadbe808ffda1a7fab17d145f52a23b163f34b3eb3696c7ecb5a52340fc1d"
  "libwebp|libw/libwebp/libwebp_1.2.4.orig.tar.gz|7bf5a8a28cc69bcfa8cb214f2c3095703c6b73ac5fba4d5480c205331d9494df"
  "libtiff|t/tiff/tiff_4.5.0.orig.tar.bz2|638f43d7dea33948d5dee7f39572fc0194d9cc3c74195de9dd26a4388a1f880a"
  "libyaml|liby/libyaml/libyaml_0.2.5.orig.tar.gz|fa240dbf262be053f3898006d502d514936c818e422afdcf33921c63bed9bf2e"
  "yaml-cpp|y/yaml-cpp/yaml-cpp_0.7.0+dfsg.orig.tar.xz|dc63708605404e0b963e0ca3a9619d1c8270eda2839603e6fa0384e5e51e5312"
  "opencv|o/opencv/opencv_4.6.0+dfsg.orig.tar.xz|40a59ba7e5c18a43652de0a08733c9843a39bba619b1f3e26a5fac4a6f041423"
)

# Unpacks library $1's tarball into $src/$1 (its top folder stripped); prints the folder.
unpack() {
  local name=$1 entry path sum file
  for entry in "${sources[@]}"; do
    [[ ${entry%%|*} == "$name" ]] || continue
    IFS='|' read -r _ path sum <<<"$entry"
    file=$src/$(basename "$path")
    if [[ ! -f $file ]] || ! echo "$sum  $file" | sha256sum -c --quiet >/dev/null 2>&1; then
      curl -fsSL --retry 3 -o "$file.part" "$pool/$path" || {
        echo "build_deps: cannot fetch $pool/$path" >&2
        exit 1
      }
      echo "$sum  $file.part" | sha256sum -c --quiet || {
        echo "build_deps: $path does not have the pinned SHA-256" >&2
        exit 1
      }
      mv "$file.part" "$file"
    fi
    rm -rf "${src:?}/$name"
    mkdir -p "$src/$name"
    tar -xf "$file" -C "$src/$name" --strip-components=1
    echo "$src/$name"
    return
  done
  echo "build_deps: no source for $name" >&2
  exit 1
}

cmake_common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF
  "-DCMAKE_INSTALL_PREFIX=$prefix" "-DCMAKE_PREFIX_PATH=$prefix" -DCMAKE_INSTALL_LIBDIR=lib)

# Builds library $1 with function build_$1 unless its stamp says it is there.
step() {
  local name=$1 start=$SECONDS
  [[ -f $prefix/.built-$name ]] && return
  echo "build_deps: $name"
  "build_${name//-/_}" >"$root/build-$name.log" 2>&1 || {
    tail -30 "$root/build-$name.log" >&2
    echo "build_deps: $name failed (the whole log: $root/build-$name.log)" >&2
    exit 1
  }
  touch "$prefix/.built-$name"
  echo "build_deps: $name in $((SECONDS - start)) s"
}

build_zlib() {
  local d
  d=$(unpack zlib)
  (cd "$d" && CFLAGS="-O2 -fPIC" ./configure --static --prefix="$prefix" && make -j"$jobs" && make install)
}
build_libjpeg_turbo() {
  local d
  d=$(unpack libjpeg-turbo)
  # (Its CMake reads a relative CMAKE_INSTALL_LIBDIR against the current folder, not the prefix.)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" "-DCMAKE_INSTALL_LIBDIR=$prefix/lib" -DENABLE_SHARED=OFF \
    -DENABLE_STATIC=ON -DWITH_TURBOJPEG=ON -DREQUIRE_SIMD=ON
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
}
build_zeromq() {
  local d
  d=$(unpack zeromq)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -DBUILD_SHARED=OFF -DBUILD_STATIC=ON -DBUILD_TESTS=OFF \
    -DWITH_LIBSODIUM=OFF -DENABLE_CURVE=ON -DWITH_DOCS=OFF -DENABLE_DRAFTS=OFF
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
}
build_libspng() {
  local d
  d=$(unpack libspng)
  # (Its CMake needs the shared target defined; only the static archive is installed under the
  # name -lspng finds, with a pkg-config file that says what it needs.)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -DSPNG_SHARED=ON -DSPNG_STATIC=ON -DBUILD_EXAMPLES=OFF
  cmake --build "$d/b" -j"$jobs" --target spng_static
  install -D -m 644 "$d/spng/spng.h" "$prefix/include/spng.h"
  install -D -m 644 "$d/b/libspng_static.a" "$prefix/lib/libspng.a"
  printf 'prefix=%s\nlibdir=${prefix}/lib\nincludedir=${prefix}/include\n\nName: spng\nDescription: libspng (static)\nVersion: 0.7.3\nRequires: zlib\nLibs: -L${libdir} -lspng\nCflags: -I${includedir} -DSPNG_STATIC\n' \
    "$prefix" >"$prefix/lib/pkgconfig/spng.pc"
}
build_libwebp() {
  local d
  d=$(unpack libwebp)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -DWEBP_BUILD_ANIM_UTILS=OFF -DWEBP_BUILD_CWEBP=OFF \
    -DWEBP_BUILD_DWEBP=OFF -DWEBP_BUILD_GIF2WEBP=OFF -DWEBP_BUILD_IMG2WEBP=OFF -DWEBP_BUILD_VWEBP=OFF \
    -DWEBP_BUILD_WEBPINFO=OFF -DWEBP_BUILD_WEBPMUX=OFF -DWEBP_BUILD_EXTRAS=OFF
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
}
build_libtiff() {
  local d
  d=$(unpack libtiff)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -Dtiff-tools=OFF -Dtiff-tests=OFF -Dtiff-contrib=OFF \
    -Dtiff-docs=OFF -Djbig=OFF -Dlerc=OFF -Dlzma=OFF -Dzstd=OFF -Dwebp=OFF -Dlibdeflate=OFF -Djpeg=ON -Dzlib=ON \
    -Dcxx=OFF
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
  # Its pkg-config file names neither of the archives it needs.
  sed -i 's/^Libs: \(.*\) -ltiff$/Libs: \1 -ltiff -ljpeg -lz/' "$prefix/lib/pkgconfig/libtiff-4.pc"
}
build_libyaml() {
  local d
  d=$(unpack libyaml)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -DBUILD_TESTING=OFF
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
}
build_yaml_cpp() {
  local d
  d=$(unpack yaml-cpp)
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -DYAML_BUILD_SHARED_LIBS=OFF -DYAML_CPP_BUILD_TESTS=OFF \
    -DYAML_CPP_BUILD_TOOLS=OFF
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
}
build_opencv() {
  local d off=()
  d=$(unpack opencv)
  for w in IPP ITT OPENCL TBB OPENMP EIGEN LAPACK CUDA VA GTK QT PROTOBUF ADE OPENJPEG JASPER OPENEXR QUIRC \
    FFMPEG GSTREAMER V4L JPEG PNG TIFF WEBP 1394 GDAL GDCM VTK OPENVX CAROTENE; do
    off+=("-DWITH_$w=OFF")
  done
  cmake -S "$d" -B "$d/b" "${cmake_common[@]}" -DBUILD_LIST=core,imgproc "${off[@]}" -DWITH_PTHREADS_PF=ON \
    -DBUILD_TESTS=OFF -DBUILD_PERF_TESTS=OFF -DBUILD_EXAMPLES=OFF -DBUILD_opencv_apps=OFF -DBUILD_JAVA=OFF \
    -DBUILD_opencv_python3=OFF -DBUILD_ZLIB=OFF -DBUILD_PROTOBUF=OFF -DOPENCV_GENERATE_PKGCONFIG=OFF
  cmake --build "$d/b" -j"$jobs" && cmake --install "$d/b"
}

start=$SECONDS
for name in zlib libjpeg-turbo zeromq libspng libwebp libtiff libyaml yaml-cpp opencv; do
  step "$name"
done
# Every archive the wheel links must be here: a system library found in its place would bring
# glibc 2.34+ back in.
for lib in libz libjpeg libturbojpeg libzmq libspng libwebp libwebpdemux libtiff libyaml libyaml-cpp \
  libopencv_core libopencv_imgproc; do
  [[ -f $prefix/lib/$lib.a ]] || { echo "build_deps: $prefix/lib/$lib.a is missing" >&2; exit 1; }
done
echo "build_deps: $prefix ready ($((SECONDS - start)) s)"
