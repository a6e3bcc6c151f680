#include "pipeline/transform/recipe.h"

#include <cctype>
#include <cmath>
#include <set>
#include <sstream>

#include "toolbox/json_reader.h"

namespace coloader {

namespace {

constexpr const char* kAnyway =
    "; to train with this recipe anyway, serve your own DataLoader through coloader.Producer (README: "
    "'Any DataLoader')";

// Phases in the order a recipe must state them.
enum class Phase { kGeometry, kPixels, kTensor, kErased };

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// One op's arguments: read by name, every one the op has not read is an error at the end.
class Args {
 public:
  Args(const JsonValue& op, std::string name) : op_(op), name_(std::move(name)) {}

  Status Error(const JsonValue& at, const std::string& what) const {
    return at.ErrorAt(name_ + ": " + what);
  }
  const JsonValue* Get(const std::string& key) {
    read_.insert(key);
    const JsonValue* v = op_.Find(key);
    return v && !v->is_null() ? v : nullptr;
  }
  Result<double> Number(const std::string& key, double fallback, double lo, double hi) {
    const JsonValue* v = Get(key);
    if (!v) return fallback;
    if (!v->is_number()) return Error(*v, "'" + key + "' must be a number");
    if (!(v->number() >= lo && v->number() <= hi))
      return Error(*v, "'" + key + "' must be in [" + Num(lo) + ", " + Num(hi) + "], got " + Num(v->number()));
    return v->number();
  }
  Result<int> Int(const std::string& key, int fallback, int lo, int hi) {
    COLOADER_ASSIGN_OR_RETURN(const double d, Number(key, fallback, lo, hi));
    if (d != std::floor(d)) return Error(*Get(key), "'" + key + "' must be a whole number");
    return static_cast<int>(d);
  }
  // A pair [lo, hi] (or one number x when `symmetric`: [-x, x]... see callers), lo <= hi.
  Result<std::pair<double, double>> Pair(const std::string& key, std::pair<double, double> fallback) {
    const JsonValue* v = Get(key);
    if (!v) return fallback;
    if (!v->is_array() || v->items().size() != 2 || !v->items()[0].is_number() || !v->items()[1].is_number())
      return Error(*v, "'" + key + "' must be a pair of numbers [lo, hi]");
    const double lo = v->items()[0].number(), hi = v->items()[1].number();
    if (!(lo <= hi) || lo < 0) return Error(*v, "'" + key + "' must have 0 <= lo <= hi, got [" + Num(lo) + ", " + Num(hi) + "]");
    return std::make_pair(lo, hi);
  }
  // A square size: an int, [s] or [s, s].
  Result<int> Size(const std::string& key, bool required) {
    const JsonValue* v = Get(key);
    if (!v) {
      if (required) return op_.ErrorAt(name_ + ": needs '" + key + "'");
      return 0;
    }
    std::vector<double> sides;
    if (v->is_number()) sides = {v->number()};
    if (v->is_array())
      for (const JsonValue& i : v->items()) sides.push_back(i.is_number() ? i.number() : -1);
    if (sides.empty() || sides.size() > 2) return Error(*v, "'" + key + "' must be an int, [s] or [s, s]");
    for (double s : sides)
      if (!(s >= 1 && s <= 16384 && s == std::floor(s)))
        return Error(*v, "'" + key + "' must be whole numbers of pixels in [1, 16384]");
    if (sides.size() == 2 && sides[0] != sides[1])
      return Error(*v, "'" + key + "' (" + Num(sides[0]) + ", " + Num(sides[1]) +
                           ") is not square: coloader's native recipes make square images (size or [s, s])" + kAnyway);
    size_list_ = sides.size() == 2;  // [s] is an int's meaning: the shorter side
    return static_cast<int>(sides[0]);
  }
  bool size_was_list() const { return size_list_; }
  Result<Interpolation> Interp(Interpolation fallback) {
    const JsonValue* v = Get("interpolation");
    if (!v) return fallback;
    if (!v->is_string()) return Error(*v, "'interpolation' must be a name (bilinear, bicubic, nearest)");
    Result<Interpolation> i = ParseInterpolation(v->string());
    if (!i.ok()) return Error(*v, i.status().message());
    return i;
  }
  // fill: a number or three, on the 0..255 scale.
  Status Fill(float out[3]) {
    const JsonValue* v = Get("fill");
    if (!v) return Status::OK();
    std::vector<double> f;
    if (v->is_number()) f = {v->number(), v->number(), v->number()};
    if (v->is_array())
      for (const JsonValue& i : v->items()) f.push_back(i.is_number() ? i.number() : -1);
    if (f.size() == 1) f = {f[0], f[0], f[0]};
    if (f.size() != 3) return Error(*v, "'fill' must be a number or three (R, G, B on 0..255)");
    for (int c = 0; c < 3; ++c) {
      if (!(f[c] >= 0 && f[c] <= 255)) return Error(*v, "'fill' values must be in [0, 255]");
      out[c] = static_cast<float>(f[c]);
    }
    return Status::OK();
  }
  // Every member the op did not read: an argument coloader does not know.
  Status CheckAllRead() const {
    for (const auto& [key, value] : op_.members()) {
      if (key == "op" || read_.count(key)) continue;
      return value.ErrorAt(name_ + ": has no argument '" + key + "' that coloader honours" + kAnyway);
    }
    return Status::OK();
  }

 private:
  const JsonValue& op_;
  std::string name_;
  std::set<std::string> read_;
  bool size_list_ = false;
};

Result<std::vector<float>> Triple(Args& a, const std::string& key, std::vector<float> fallback, bool positive) {
  const JsonValue* v = a.Get(key);
  if (!v) return fallback;
  std::vector<float> out;
  if (v->is_number()) out = {static_cast<float>(v->number())};
  if (v->is_array())
    for (const JsonValue& i : v->items()) {
      if (!i.is_number()) return a.Error(i, "'" + key + "' must be numbers");
      out.push_back(static_cast<float>(i.number()));
    }
  if (out.size() == 1) out = {out[0], out[0], out[0]};
  if (out.size() != 3) return a.Error(*v, "'" + key + "' must be one number or three (R, G, B)");
  for (float f : out)
    if (positive && !(f > 0)) return a.Error(*v, "'" + key + "' must be positive");
  return out;
}

struct Parser {
  Recipe r;
  Phase phase = Phase::kGeometry;
  bool have_box = false;      // RandomResizedCrop, or Resize (then CenterCrop when an int)
  bool need_center = false;   // Resize(int) seen: a CenterCrop must follow
  int resize_shorter = 0;
  // The pixel ops so far are RandomCrops only, each padded alike left and right (x) or top and
  // bottom (y): a flip after them is native (below).
  bool only_crops_since_geometry = true;
  bool crops_symmetric_x = true, crops_symmetric_y = true;
  std::set<std::string> once;  // the ops a recipe may state once

  Status Op(const JsonValue& op) {
    if (!op.is_object()) return op.ErrorAt("each op must be an object with 'op' naming it, e.g. {op: Normalize, mean: [...]}");
    const JsonValue* name_v = op.Find("op");
    if (!name_v || !name_v->is_string()) return op.ErrorAt("each op needs 'op': its torchvision name");
    const std::string name = name_v->string();
    Args a(op, name);
    auto order = [&](Phase need, const std::string& what) -> Status {
      if (phase > need) return op.ErrorAt(name + ": " + what);
      phase = need;
      return Status::OK();
    };
    std::ostringstream line;
    line << name;
    bool record = true;
    // An op that would compose with itself in torchvision (two flips cancel, two Normalizes
    // apply in turn) is refused rather than overwritten.
    if ((name == "RandomHorizontalFlip" || name == "RandomVerticalFlip" || name == "Normalize" ||
         name == "RandomErasing") && !once.insert(name).second)
      return op.ErrorAt(name + ": the recipe has it already; coloader runs each of these once (combine them into one)");
    if (name == "RandomResizedCrop") {
      if (have_box) return op.ErrorAt(name + ": the recipe has its crop already (one RandomResizedCrop or Resize)");
      COLOADER_RETURN_NOT_OK(order(Phase::kGeometry, "must come before the pixel ops and ToTensor/Normalize"));
      COLOADER_ASSIGN_OR_RETURN(const int size, a.Size("size", true));
      COLOADER_ASSIGN_OR_RETURN(const auto scale, a.Pair("scale", {0.08, 1.0}));
      COLOADER_ASSIGN_OR_RETURN(const auto ratio, a.Pair("ratio", {3.0 / 4.0, 4.0 / 3.0}));
      if (scale.second > 1 || scale.second <= 0) return op.ErrorAt(name + ": 'scale' must lie in (0, 1]");
      if (ratio.first <= 0) return op.ErrorAt(name + ": 'ratio' must be positive");
      COLOADER_ASSIGN_OR_RETURN(r.geometry.interpolation, a.Interp(Interpolation::kBilinear));
      COLOADER_RETURN_NOT_OK(Antialias(a));
      r.geometry.mode = AugmentMode::kTrain;
      r.geometry.size = size;
      r.geometry.scale_min = scale.first, r.geometry.scale_max = scale.second;
      r.geometry.ratio_min = ratio.first, r.geometry.ratio_max = ratio.second;
      have_box = true;
      line << "(size=" << size << ", scale=(" << scale.first << ", " << scale.second << "), ratio=(" << ratio.first
           << ", " << ratio.second << "), interpolation=" << InterpolationName(r.geometry.interpolation) << ")";
    } else if (name == "Resize") {
      if (have_box) return op.ErrorAt(name + ": the recipe has its crop already (one RandomResizedCrop or Resize)");
      COLOADER_RETURN_NOT_OK(order(Phase::kGeometry, "must come before the pixel ops and ToTensor/Normalize"));
      COLOADER_ASSIGN_OR_RETURN(const int size, a.Size("size", true));
      if (const JsonValue* m = a.Get("max_size")) return a.Error(*m, "'max_size' is not supported natively" + std::string(kAnyway));
      COLOADER_ASSIGN_OR_RETURN(r.geometry.interpolation, a.Interp(Interpolation::kBilinear));
      COLOADER_RETURN_NOT_OK(Antialias(a));
      if (a.size_was_list()) {
        r.geometry.mode = AugmentMode::kNone;  // the whole image to size x size
        r.geometry.size = size;
      } else {
        need_center = true;  // the shorter side to `size`: a CenterCrop makes it square
        resize_shorter = size;
      }
      have_box = true;
      line << "(size=" << (a.size_was_list() ? "[" + std::to_string(size) + ", " + std::to_string(size) + "]"
                                             : std::to_string(size))
           << ", interpolation=" << InterpolationName(r.geometry.interpolation) << ")";
    } else if (name == "CenterCrop") {
      COLOADER_RETURN_NOT_OK(order(Phase::kGeometry, "sets the crop, so it comes before the pixel ops"));
      if (!need_center)
        return op.ErrorAt(name + ": natively, CenterCrop follows Resize(int) (the eval recipe: Resize(256), "
                                 "CenterCrop(224))" + std::string(kAnyway));
      COLOADER_ASSIGN_OR_RETURN(const int size, a.Size("size", true));
      COLOADER_RETURN_NOT_OK(CropAfterResize(op, name, size, false));
      line << "(size=" << size << ")";
    } else if (name == "RandomCrop") {
      COLOADER_RETURN_NOT_OK(RandomCrop(op, a, line));
    } else if (name == "RandomHorizontalFlip" || name == "RandomVerticalFlip") {
      // A flip after RandomCrops padded alike on both sides of its axis is native: flipping the
      // window of a mirror-symmetric padding is the window at the mirrored offset, which is
      // drawn as often, so coloader flips first (as it resizes) with the same distribution.
      const bool after_crops = phase == Phase::kPixels && only_crops_since_geometry &&
                               (name == "RandomHorizontalFlip" ? crops_symmetric_x : crops_symmetric_y);
      if (!after_crops)
        COLOADER_RETURN_NOT_OK(order(Phase::kGeometry, "must come before the pixel ops (coloader flips as it resizes)"));
      COLOADER_ASSIGN_OR_RETURN(const double p, a.Number("p", 0.5, 0, 1));
      (name == "RandomHorizontalFlip" ? r.geometry.flip_probability : r.geometry.vflip_probability) = p;
      line << "(p=" << p << ")";
    } else if (name == "ColorJitter") {
      COLOADER_RETURN_NOT_OK(order(Phase::kPixels, "must come before ToTensor/Normalize"));
      // Each a number x (the factor from [max(0, 1 - x), 1 + x], hue's shift from [-x, x]) or a
      // range [lo, hi]; absent or 0: left alone.
      JitterRange f[4];
      const char* keys[4] = {"brightness", "contrast", "saturation", "hue"};
      for (int i = 0; i < 4; ++i) {
        const bool hue = i == 3;
        const JsonValue* v = a.Get(keys[i]);
        if (!v) continue;
        if (v->is_number()) {
          const double x = v->number();
          if (!(x >= 0 && x <= (hue ? 0.5 : 1e6))) return a.Error(*v, std::string("'") + keys[i] + "' must be in [0, " + (hue ? "0.5" : "inf") + "]");
          f[i] = hue ? JitterRange{-x, x, x > 0} : JitterRange{std::max(0.0, 1 - x), 1 + x, x > 0};
          continue;
        }
        if (!v->is_array() || v->items().size() != 2 || !v->items()[0].is_number() || !v->items()[1].is_number())
          return a.Error(*v, std::string("'") + keys[i] + "' must be a number or a range [lo, hi]");
        const double lo = v->items()[0].number(), hi = v->items()[1].number();
        if (!(lo <= hi) || (hue ? (lo < -0.5 || hi > 0.5) : lo < 0))
          return a.Error(*v, std::string("'") + keys[i] + "' must be a range lo <= hi" + (hue ? " inside [-0.5, 0.5]" : " of non-negative factors"));
        // torchvision leaves a factor whose range is its identity alone ([1, 1], hue [0, 0]): no
        // round trip through HSV that could move a value by a level.
        if (lo == hi && lo == (hue ? 0.0 : 1.0)) continue;
        f[i] = JitterRange{lo, hi, true};
      }
      r.pixel_ops.push_back(MakeColorJitter(f[0], f[1], f[2], f[3]));
      only_crops_since_geometry = false;
      line << "(";
      for (int i = 0; i < 4; ++i)
        line << (i ? ", " : "") << keys[i] << "=" << (f[i].set ? "(" + Num(f[i].lo) + ", " + Num(f[i].hi) + ")" : "None");
      line << ")";
    } else if (name == "RandomGrayscale") {
      COLOADER_RETURN_NOT_OK(order(Phase::kPixels, "must come before ToTensor/Normalize"));
      COLOADER_ASSIGN_OR_RETURN(const double p, a.Number("p", 0.1, 0, 1));
      r.pixel_ops.push_back(MakeRandomGrayscale(p));
      only_crops_since_geometry = false;
      line << "(p=" << p << ")";
    } else if (name == "GaussianBlur") {
      COLOADER_RETURN_NOT_OK(order(Phase::kPixels, "must come before ToTensor/Normalize (natively it blurs the uint8 image)"));
      const JsonValue* k = a.Get("kernel_size");
      std::vector<double> ks;
      if (k && k->is_number()) ks = {k->number(), k->number()};
      if (k && k->is_array())
        for (const JsonValue& i : k->items()) ks.push_back(i.is_number() ? i.number() : 0);
      if (ks.size() == 1) ks = {ks[0], ks[0]};
      if (!k) return op.ErrorAt(name + ": needs 'kernel_size'");
      if (ks.size() != 2 || ks[0] < 1 || ks[1] < 1 || std::fmod(ks[0], 2) != 1 || std::fmod(ks[1], 2) != 1 || ks[0] > 255 || ks[1] > 255)
        return a.Error(*k, "'kernel_size' must be odd positive integers (one or [kx, ky])");
      std::pair<double, double> sigma{0.1, 2.0};
      const JsonValue* sv = a.Get("sigma");
      if (sv && sv->is_number()) {
        if (!(sv->number() > 0)) return a.Error(*sv, "'sigma' must be positive");
        sigma = {sv->number(), sv->number()};
      } else if (sv) {
        COLOADER_ASSIGN_OR_RETURN(sigma, a.Pair("sigma", sigma));
        if (!(sigma.first > 0)) return a.Error(*sv, "'sigma' must be positive");
      }
      r.pixel_ops.push_back(MakeGaussianBlur(static_cast<int>(ks[0]), static_cast<int>(ks[1]), sigma.first, sigma.second));
      only_crops_since_geometry = false;
      line << "(kernel_size=(" << ks[0] << ", " << ks[1] << "), sigma=(" << sigma.first << ", " << sigma.second << "))";
    } else if (name == "TrivialAugmentWide" || name == "RandAugment" || name == "AutoAugment") {
      COLOADER_RETURN_NOT_OK(order(Phase::kPixels, "must come before ToTensor/Normalize"));
      AutoAugmentOptions o;
      o.kind = name == "TrivialAugmentWide" ? AutoAugmentKind::kTrivialAugmentWide
               : name == "RandAugment"      ? AutoAugmentKind::kRandAugment
                                            : AutoAugmentKind::kAutoAugmentImageNet;
      if (o.kind != AutoAugmentKind::kAutoAugmentImageNet) {
        COLOADER_ASSIGN_OR_RETURN(o.num_magnitude_bins, a.Int("num_magnitude_bins", 31, 2, 1000));
      }
      if (o.kind == AutoAugmentKind::kRandAugment) {
        COLOADER_ASSIGN_OR_RETURN(o.num_ops, a.Int("num_ops", 2, 0, 16));
        COLOADER_ASSIGN_OR_RETURN(o.magnitude, a.Int("magnitude", 9, 0, o.num_magnitude_bins - 1));
        if (o.magnitude > o.num_magnitude_bins - 1)
          return op.ErrorAt(name + ": 'magnitude' " + std::to_string(o.magnitude) + " is past the last of " +
                            std::to_string(o.num_magnitude_bins) + " magnitude bins");
      }
      if (o.kind == AutoAugmentKind::kAutoAugmentImageNet) {
        if (const JsonValue* p = a.Get("policy")) {
          std::string s = p->is_string() ? p->string() : "";
          for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          if (s.rfind("autoaugmentpolicy.", 0) == 0) s = s.substr(18);
          if (s != "imagenet")
            return a.Error(*p, "'policy' must be imagenet (the CIFAR10 and SVHN policies have no native twin)" +
                                   std::string(kAnyway));
        }
      }
      COLOADER_ASSIGN_OR_RETURN(o.interpolation, a.Interp(Interpolation::kNearest));
      if (o.interpolation != Interpolation::kNearest)
        return op.ErrorAt(name + ": natively its rotations and shears sample the nearest pixel (interpolation "
                                 "nearest, torchvision's default)" + std::string(kAnyway));
      COLOADER_RETURN_NOT_OK(a.Fill(o.fill));
      r.pixel_ops.push_back(MakeAutoAugment(o));
      only_crops_since_geometry = false;
      // The fill too: the line is part of the producer's data key, and a different fill is other data.
      const std::string fill = "fill=(" + Num(o.fill[0]) + ", " + Num(o.fill[1]) + ", " + Num(o.fill[2]) + ")";
      if (o.kind == AutoAugmentKind::kTrivialAugmentWide)
        line << "(num_magnitude_bins=" << o.num_magnitude_bins << ", " << fill << ")";
      if (o.kind == AutoAugmentKind::kRandAugment)
        line << "(num_ops=" << o.num_ops << ", magnitude=" << o.magnitude << ", num_magnitude_bins=" << o.num_magnitude_bins
             << ", " << fill << ")";
      if (o.kind == AutoAugmentKind::kAutoAugmentImageNet) line << "(policy=imagenet, " << fill << ")";
    } else if (name == "ToTensor" || name == "PILToTensor" || name == "ConvertImageDtype" || name == "ToImage" ||
               name == "ToDtype" || name == "ToImageTensor" || name == "ConvertDtype") {
      // The output dtype is --output's; the conversion is implied.
      COLOADER_RETURN_NOT_OK(order(Phase::kTensor, "comes after Normalize"));
      a.Get("dtype");
      if (name == "ToDtype") {
        // v2's ToDtype scales to [0, 1] only with scale=True; unscaled floats are not native.
        const JsonValue* scale = a.Get("scale");
        if (!scale || scale->type() != JsonValue::Type::kBool || !scale->bool_value())
          return op.ErrorAt(name + ": natively the float tensor is scaled to [0, 1] (ToDtype(..., scale=True)); "
                                   "without scale the floats stay 0..255" + std::string(kAnyway));
      }
      record = false;
    } else if (name == "Normalize") {
      COLOADER_RETURN_NOT_OK(order(Phase::kTensor, "must come before RandomErasing"));
      COLOADER_ASSIGN_OR_RETURN(const std::vector<float> mean, Triple(a, "mean", {}, false));
      COLOADER_ASSIGN_OR_RETURN(const std::vector<float> std, Triple(a, "std", {}, true));
      if (mean.empty() || std.empty()) return op.ErrorAt(name + ": needs 'mean' and 'std'");
      a.Get("inplace");
      for (int c = 0; c < 3; ++c) {
        r.normalize.mean[c] = mean[static_cast<size_t>(c)] * 255.f;
        r.normalize.std[c] = std[static_cast<size_t>(c)] * 255.f;
      }
      phase = Phase::kTensor;
      normalized = true;
      line << "(mean=(" << mean[0] << ", " << mean[1] << ", " << mean[2] << "), std=(" << std[0] << ", " << std[1]
           << ", " << std[2] << "))";
    } else if (name == "RandomErasing") {
      COLOADER_RETURN_NOT_OK(order(Phase::kErased, "comes last"));
      EraseOptions& e = r.erase;
      COLOADER_ASSIGN_OR_RETURN(e.p, a.Number("p", 0.5, 0, 1));
      COLOADER_ASSIGN_OR_RETURN(const auto scale, a.Pair("scale", {0.02, 0.33}));
      COLOADER_ASSIGN_OR_RETURN(const auto ratio, a.Pair("ratio", {0.3, 3.3}));
      if (scale.second > 1) return op.ErrorAt(name + ": 'scale' must lie in [0, 1]");
      if (!(ratio.first > 0)) return op.ErrorAt(name + ": 'ratio' must be positive");
      e.scale_min = scale.first, e.scale_max = scale.second, e.ratio_min = ratio.first, e.ratio_max = ratio.second;
      const JsonValue* v = a.Get("value");
      if (v && v->is_string()) {
        if (v->string() != "random") return a.Error(*v, "'value' must be a number, three numbers or \"random\"");
        e.random_value = true;
      } else if (v) {
        COLOADER_ASSIGN_OR_RETURN(const std::vector<float> val, Triple(a, "value", {0, 0, 0}, false));
        for (int c = 0; c < 3; ++c) e.value[c] = val[static_cast<size_t>(c)];
      }
      a.Get("inplace");
      line << "(p=" << e.p << ", scale=(" << scale.first << ", " << scale.second << "), ratio=(" << ratio.first << ", "
           << ratio.second << "), value="
           << (e.random_value ? "random" : "(" + Num(e.value[0]) + ", " + Num(e.value[1]) + ", " + Num(e.value[2]) + ")")
           << ")";
    } else {
      return name_v->ErrorAt("'" + name + "' has no native twin in coloader (it has: RandomResizedCrop, Resize, "
                             "CenterCrop, RandomCrop, RandomHorizontalFlip, RandomVerticalFlip, ColorJitter, RandomGrayscale, "
                             "GaussianBlur, TrivialAugmentWide, RandAugment, AutoAugment, ToTensor, Normalize, "
                             "RandomErasing)" + std::string(kAnyway));
    }
    COLOADER_RETURN_NOT_OK(a.CheckAllRead());
    if (record) r.ops.push_back(line.str());
    return Status::OK();
  }

  // CenterCrop(size) (or RandomCrop(size) where `random`) after Resize(int): the eval geometry.
  Status CropAfterResize(const JsonValue& op, const std::string& name, int size, bool random) {
    if (size > resize_shorter)
      return op.ErrorAt(name + ": size " + std::to_string(size) + " is larger than the Resize's " +
                        std::to_string(resize_shorter) + " (torchvision would pad)" + kAnyway);
    r.geometry.mode = AugmentMode::kEval;
    r.geometry.size = size;
    r.geometry.eval_resize_ratio = static_cast<double>(resize_shorter) / size;
    r.geometry.eval_random_position = random;
    need_center = false;
    return Status::OK();
  }

  // RandomCrop(size, padding, pad_if_needed, fill, padding_mode): after Resize(int), the window
  // of the resized image (a random CenterCrop: geometry, fused with decoding); after an op that
  // made the image size x size, a window of the padded image (a pixel op).
  Status RandomCrop(const JsonValue& op, Args& a, std::ostringstream& line) {
    const std::string name = "RandomCrop";
    if (!have_box)
      return op.ErrorAt(name + ": natively RandomCrop follows the op that sets the image's size: Resize(256) then "
                               "RandomCrop(224); or, for images already s x s (CIFAR's 32 x 32), Resize([s, s]) then "
                               "RandomCrop(s, padding=...) (the Resize is then a copy)" + std::string(kAnyway));
    COLOADER_ASSIGN_OR_RETURN(const int size, a.Size("size", true));
    PadSides pad;
    if (const JsonValue* v = a.Get("padding")) {
      std::vector<double> p;
      if (v->is_number()) p = {v->number()};
      if (v->is_array())
        for (const JsonValue& i : v->items()) p.push_back(i.is_number() ? i.number() : -1);
      for (double x : p)
        if (!(x >= 0 && x <= 16384 && x == std::floor(x)))
          return a.Error(*v, "'padding' must be whole numbers of pixels, at least 0");
      if (p.size() == 1) p = {p[0], p[0], p[0], p[0]};
      if (p.size() == 2) p = {p[0], p[1], p[0], p[1]};
      if (p.size() != 4) return a.Error(*v, "'padding' must be an int, [left/right, top/bottom] or [left, top, right, bottom]");
      pad = PadSides{static_cast<int>(p[0]), static_cast<int>(p[1]), static_cast<int>(p[2]), static_cast<int>(p[3])};
    }
    if (const JsonValue* v = a.Get("pad_if_needed"); v && v->type() != JsonValue::Type::kBool)
      return a.Error(*v, "'pad_if_needed' must be true or false");
    float fill[3] = {0, 0, 0};
    COLOADER_RETURN_NOT_OK(a.Fill(fill));
    PadMode mode = PadMode::kConstant;
    constexpr const char* kModes[] = {"constant", "edge", "reflect", "symmetric"};
    if (const JsonValue* v = a.Get("padding_mode")) {
      const std::string m = v->is_string() ? v->string() : "";
      if (m == "constant") mode = PadMode::kConstant;
      else if (m == "edge") mode = PadMode::kEdge;
      else if (m == "reflect") mode = PadMode::kReflect;
      else if (m == "symmetric") mode = PadMode::kSymmetric;
      else return a.Error(*v, "'padding_mode' must be constant, edge, reflect or symmetric");
    }
    const bool padded = pad.left + pad.top + pad.right + pad.bottom > 0;
    line << "(size=" << size << ", padding=(" << pad.left << ", " << pad.top << ", " << pad.right << ", " << pad.bottom
         << "), padding_mode=" << kModes[static_cast<int>(mode)] << ", fill=(" << fill[0] << ", " << fill[1] << ", " << fill[2] << "))";
    if (need_center) {
      // Resize(int) then RandomCrop(size): the eval geometry at a random position.
      if (phase > Phase::kGeometry)
        return op.ErrorAt(name + ": after Resize(int) it sets the crop, so it comes before the pixel ops");
      if (padded)
        return op.ErrorAt(name + ": after Resize(int), natively RandomCrop takes no padding" + std::string(kAnyway));
      return CropAfterResize(op, name, size, true);
    }
    if (size != r.geometry.size)
      return op.ErrorAt(name + ": natively RandomCrop keeps the size the ops before it made (" +
                        std::to_string(r.geometry.size) + "), got " + std::to_string(size) + std::string(kAnyway));
    if ((mode == PadMode::kReflect || mode == PadMode::kSymmetric) &&
        std::max({pad.left, pad.top, pad.right, pad.bottom}) >= size + (mode == PadMode::kSymmetric ? 1 : 0))
      return op.ErrorAt(name + ": " + (mode == PadMode::kReflect ? "reflect" : "symmetric") +
                        " padding must be smaller than the image's " + std::to_string(size) + " pixels");
    if (phase > Phase::kPixels) return op.ErrorAt(name + ": must come before ToTensor/Normalize");
    phase = Phase::kPixels;
    if (padded) {
      r.pixel_ops.push_back(MakeRandomCrop(pad, mode, fill));
      crops_symmetric_x = crops_symmetric_x && pad.left == pad.right;
      crops_symmetric_y = crops_symmetric_y && pad.top == pad.bottom;
    }
    return Status::OK();
  }

  Status Antialias(Args& a) {
    const JsonValue* v = a.Get("antialias");
    if (v && !(v->type() == JsonValue::Type::kBool && v->bool_value()))
      return a.Error(*v, "'antialias' false is not supported natively: coloader always antialiases shrinks" +
                             std::string(kAnyway));
    return Status::OK();
  }

  bool normalized = false;
};

}  // namespace

std::string Recipe::Describe() const {
  std::string out;
  for (const std::string& op : ops) out += (out.empty() ? "" : ", ") + op;
  return out;
}

Recipe NamedRecipe(AugmentMode mode, int size) {
  Recipe r;
  r.geometry.mode = mode;
  r.geometry.size = size;
  r.geometry.exact_resize = false;  // the named recipes keep OpenCV's fast resize
  r.geometry.flip_probability = mode == AugmentMode::kTrain ? 0.5 : 0.0;
  const std::string s = std::to_string(size);
  switch (mode) {
    case AugmentMode::kTrain:
      r.ops = {"RandomResizedCrop(size=" + s + ", scale=(0.08, 1), ratio=(0.75, 1.33333), interpolation=bilinear)",
               "RandomHorizontalFlip(p=0.5)"};
      break;
    case AugmentMode::kEval:
      r.ops = {"Resize(size=" + std::to_string(std::lround(size * r.geometry.eval_resize_ratio)) +
                   ", interpolation=bilinear)",
               "CenterCrop(size=" + s + ")"};
      break;
    case AugmentMode::kNone: r.ops = {"Resize(size=[" + s + ", " + s + "], interpolation=bilinear)"}; break;
  }
  r.ops.push_back("Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))");
  return r;
}

Result<Recipe> ParseRecipe(const JsonValue& doc) {
  const JsonValue* list = &doc;
  if (doc.is_object()) {
    list = doc.Find("ops");
    if (!list) return doc.ErrorAt("a recipe is a list of ops, or an object with the list under 'ops'");
  }
  if (!list->is_array() || list->items().empty())
    return list->ErrorAt("a recipe is a non-empty list of ops, e.g. [{op: RandomResizedCrop, size: 224}, ...]");
  Parser p;
  p.r.geometry.flip_probability = 0;  // flips only where the recipe states them
  for (const JsonValue& op : list->items()) COLOADER_RETURN_NOT_OK(p.Op(op));
  if (!p.have_box)
    return list->ErrorAt("the recipe states no output size: begin it with RandomResizedCrop(size) or Resize(size) "
                         "(and CenterCrop(size) after Resize(int)), as every batch needs one shape");
  if (p.need_center)
    return list->ErrorAt("Resize(int) makes images of different shapes: follow it with CenterCrop(size), or give "
                         "Resize a square size [s, s]");
  if (!p.normalized) {
    // ToTensor's x / 255.
    for (int c = 0; c < 3; ++c) p.r.normalize.mean[c] = 0.f, p.r.normalize.std[c] = 255.f;
  }
  int steps = 0;
  for (const auto& op : p.r.pixel_ops) steps += op->max_steps();
  if (steps > kMaxPixelSteps)
    return list->ErrorAt("the recipe's pixel ops may apply " + std::to_string(steps) + " kernels to one image; coloader "
                         "runs at most " + std::to_string(kMaxPixelSteps) + " (fewer RandAugment num_ops, or fewer ops)" +
                         kAnyway);
  return std::move(p.r);
}

Result<Recipe> ReadRecipeFile(const std::string& path) {
  auto ends = [&](const char* s) {
    const std::string e(s);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".py"))
    return Status::Invalid("--transform " + path + ": a Python recipe is translated by the Python package: run "
                           "`python -m coloader serve --transform " + path + " ...` (or the wheel's `coloader` "
                           "command), or write the ops as JSON/YAML (coloader.transforms.translate prints them)");
  // .yaml and .yml are YAML, anything else JSON (the Python launcher hands a translated .py over
  // as /proc/self/fd/N).
  COLOADER_ASSIGN_OR_RETURN(const JsonValue doc, ReadJsonOrYamlFile(path));
  return ParseRecipe(doc);
}

}  // namespace coloader
