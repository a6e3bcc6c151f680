#!/usr/bin/env bash
# The layers run one way (docs/DESIGN.md): tools -> {producer, client, placement} ->
# pipeline -> toolbox -> common (the client: common only), and the consumer's library loads
# no decoder. Checked on the sources' #include lines and on the built library's dynamic
# dependencies. What decodes images (the coloader binary, the producer's library) links light
# decoders only: never GDAL, GDCM, poppler or HDF5, which a general image library (Debian's
# OpenCV imgcodecs) drags in.
#   tests/build/layers_test.sh SOURCE_DIR CONSUMER_LIBRARY [PRODUCER_BINARY_OR_LIBRARY...]
set -euo pipefail
src=$1 lib=$2
shift 2
producers=("$@")
fail=0

# What each folder may include besides itself.
declare -A allowed=(
  [common]=""
  [toolbox]="common"
  [pipeline]="common toolbox"
  [producer]="common toolbox pipeline"
  [client]="common"
  [placement]="common toolbox"
  [tools]="common toolbox pipeline producer client placement"
)
for dir in "${!allowed[@]}"; do
  ok="$dir ${allowed[$dir]}"
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")
    if [[ " $ok " != *" $target "* ]]; then
      echo "layers: $file includes from $target/, which $dir/ must not depend on: ${line#*:}"
      fail=1
    fi
  done < <(grep -rHE --include='*.h' --include='*.cc' --include='*.cu' '^#include "[a-z_]+/' "$src/$dir" || true)
done

# Inside pipeline/, the stage rooms (pipeline/CMakeLists.txt): what each may include besides
# itself, common/ and the rooms' shared instruments at pipeline/'s top (stage_times, random,
# substitution). A room's arrows run to the rooms before it, never back.
declare -A rooms=(
  [source]=""
  [transform]=""
  [decode]="transform"
  [assemble]="source decode transform"
)
for room in "${!rooms[@]}"; do
  ok="$room ${rooms[$room]}"
  while IFS= read -r line; do
    file=${line%%:*}
    target=$(sed -E 's/.*#include "pipeline\/([a-z_]+)\/.*/\1/' <<<"$line")
    if [[ " $ok " != *" $target "* ]]; then
      echo "layers: $file includes from pipeline/$target/, which pipeline/$room/ must not depend on: ${line#*:}"
      fail=1
    fi
  done < <(grep -HE '^#include "pipeline/[a-z_]+/' "$src/pipeline/$room"/*.{h,cc,cu} 2>/dev/null || true)
done
# pipeline/'s top holds only what every room shares: it includes no room.
if top=$(grep -HE '^#include "pipeline/[a-z_]+/' "$src/pipeline"/*.{h,cc} 2>/dev/null); then
  echo "layers: pipeline/'s shared files include a stage room: $top"
  fail=1
fi

# Inside client/, producer/ and each stage room, no file includes back up (scripts/include_graph.py draws them).
if ! python3 "$src/scripts/include_graph.py" --root "$src" --check client producer \
     pipeline pipeline/source pipeline/decode pipeline/transform pipeline/assemble; then
  fail=1
fi

# The consumer's library: what a training job loads. No OpenCV, no libjpeg/TurboJPEG.
if deps=$(ldd "$lib"); then
  bad=$(grep -iE 'opencv|turbojpeg|libjpeg|libpng|libwebp|libtiff|gdal' <<<"$deps" || true)
  if [[ -n "$bad" ]]; then
    echo "layers: $lib links decoders it must not load:"
    echo "$bad"
    fail=1
  fi
else
  echo "layers: ldd $lib failed"
  fail=1
fi
for bin in "${producers[@]}"; do
  if deps=$(ldd "$bin"); then
    heavy=$(grep -iE 'gdal|gdcm|poppler|hdf5|opencv_imgcodecs' <<<"$deps" || true)
    if [[ -n "$heavy" ]]; then
      echo "layers: $bin links what no image decoder needs:"
      echo "$heavy"
      fail=1
    fi
  else
    echo "layers: ldd $bin failed"
    fail=1
  fi
done
if ((fail)); then exit 1; fi
echo "layers: one-way includes in ${!allowed[*]} and pipeline's rooms ${!rooms[*]}; $(basename "$lib") loads no decoder;" \
  "no GDAL/GDCM/poppler/HDF5 in ${producers[*]##*/}"
