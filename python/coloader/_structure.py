"""What a coloader.Producer batch may be, and how it travels: a tensor, or tuples, lists and dicts
of them nested to any depth (what a torch DataLoader's collate yields), whose shapes may vary from
batch to batch up to a maximum. Private to the package.

A batch's leaves are of two kinds:

  batched     a tensor with the batch's samples along its first dimension. Its per-sample shape
              may vary from batch to batch (a collate that pads to each batch's longest), up to
              its field's maximum: the slot holds it padded to the maximum with the field's pad
              value, and each sample's shape travels beside it.
  per-sample  a tensor of one sample, in a list (or tuple) of the batch's samples (a collate that
              keeps variable-length samples apart: `list(samples)`, torchvision's detection
              collate). Each sample lies at the start of its room in the slot, its shape beside.

flatten() turns a batch into its leaves, a structure that names how they nest, and each leaf's
path as its user writes it (`batch["input_ids"]`, `batch[1]["mask"]`, `batch[0][*]` for the
items of a list of samples). Schema (stated by the first batch) checks every later batch against
it, naming the field and the fix, packs a batch into the fields the library copies into a slot,
and writes the structure consumers rebuild batches from, as JSON:

    3                                   the field of index 3, one value per sample
    {"padded": [3, C]}                  field 3, each sample's shape in the shapes field's
                                        columns C.. (as many as the field has dimensions)
    {"samples": ["list", ITEM]}         a list (or "tuple") of the batch's samples, each ITEM
    {"sample": [3, C, D]}               within ITEM: one sample of field 3, of D dimensions,
                                        its shape in columns C..C+D-1
    {"tuple": [ITEM, ...]}              a tuple (a namedtuple travels as a plain tuple)
    {"list": [ITEM, ...]}               a list
    {"dict": [[KEY, ITEM], ...]}        a dict with str keys, in its order (any Mapping, such
                                        as transformers' BatchEncoding, travels as a dict)
    {"shaped": [ITEM, S]}               the whole batch, when any field has shapes: field S
                                        (int32, one row per sample) holds them

A consumer gets each batched field at the elementwise largest shape of its batch's samples: a
consumer at the producer's batch size gets the producer's batches exactly; one at another size
that mixes samples of two producer batches gets the shorter ones padded with the field's pad
value. Each per-sample item comes back at its own shape.
"""

import collections.abc
import json
import math

import numpy as np

SHAPES_PATH = "#shapes"  # the field of the samples' shapes: the package's own, not the user's


def _path(prefix, key):
    return "%s[%s]" % (prefix, json.dumps(key) if isinstance(key, str) else key)


def as_path(key):
    """A field's path from what a user may write for it: the path itself ('["input_ids"]',
    '[1]["boxes"]', '[0][*]'), a top-level dict key ("input_ids") or a tuple index (0)."""
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError("a field is named by its path ('[\"input_ids\"]', '[0][*]'), a top-level key or an index; "
                        "got %r" % (key,))
    if isinstance(key, int):
        return "[%d]" % key
    return key if key == "" or key.startswith("[") else _path("", key)


def _signature(x, torch):
    """What makes two samples of a list alike: the same nesting and keys, and tensors of the same
    dtype and number of dimensions at the same places."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, x.dim())
    if isinstance(x, collections.abc.Mapping):
        return ("dict", tuple((k, _signature(v, torch)) for k, v in x.items()))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_signature(v, torch) for v in x))
    return ("other", type(x).__name__)


def _tensors(x, torch):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, collections.abc.Mapping):
        for v in x.values():
            yield from _tensors(v, torch)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _tensors(v, torch)


def looks_like_samples(x, n, torch):
    """Whether the list or tuple `x` holds a batch's `n` samples rather than batched tensors: it has
    n alike items, and no tensor in them has n samples (its first dimension n, as a batched
    tensor has): a tuple of batched tensors as long as the batch, such as (input_ids [2, L],
    position_ids [1, L]) at a batch size of 2, reads as batched. A list of samples that fails
    this (one whose tensors have n along their first dimension), or one of a producer that does
    not know its batch size, is named in Producer(samples=...); one that a tuple of batched
    tensors passes by mistake (sequence-first tensors [T, 2] at a batch size of 2) is taken for
    samples, which the producer's log says."""
    if not n or len(x) != n:
        return False
    first = _signature(x[0], torch)
    if any(_signature(item, torch) != first for item in x[1:]):
        return False
    tensors = list(_tensors(x, torch))
    return bool(tensors) and not any(t.dim() and t.shape[0] == n for t in tensors)


class Flat:
    """A batch as leaves: `leaves[i]` a tensor (batched) or the list of one tensor per sample
    (per-sample); `structure` how they nest (plain field indices, {"samples": ...} for lists of
    samples); `paths`; `lists` the (path, length) of each list of samples."""

    __slots__ = ("leaves", "structure", "paths", "per_sample", "lists")


def flatten(batch, torch, sample_lists=(), guess=None):
    """The batch as a Flat; a TypeError names what cannot travel. `sample_lists`: the paths of
    the lists (or tuples) that hold samples; with `guess` (the batch size the producer expects),
    others that look like it are taken as such too (looks_like_samples)."""
    flat = Flat()
    flat.leaves, flat.paths, flat.per_sample, flat.lists = [], [], [], []

    def leaf(x, path, items=None):
        flat.leaves.append(x if items is None else items)
        flat.paths.append(path)
        flat.per_sample.append(items is not None)
        return len(flat.leaves) - 1

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            return leaf(x, path)
        if isinstance(x, collections.abc.Mapping):  # a dict, or e.g. transformers' BatchEncoding
            items = []
            for key, value in x.items():
                if not isinstance(key, str):
                    raise TypeError("batch%s is a dict with a %s key (%r): coloader carries dicts with str keys"
                                    % (path, type(key).__name__, key))
                items.append([key, walk(value, _path(path, key))])
            return {"dict": items}
        if isinstance(x, (tuple, list)):
            kind = "list" if isinstance(x, list) else "tuple"
            if path in sample_lists or (guess and looks_like_samples(x, guess, torch)):
                return {"samples": [kind, samples(x, path)]}
            return {kind: [walk(v, _path(path, i)) for i, v in enumerate(x)]}
        raise TypeError("batch%s is a %s: coloader carries tensors (and tuples, lists and dicts of them). "
                        "Make it a tensor in the Dataset or collate_fn (e.g. tokenise text), or leave it out "
                        "of the batch" % (path, type(x).__name__))

    def samples(x, path):
        """A list of samples: the first sample's structure, each of its tensors a per-sample leaf
        holding that tensor of every sample."""
        if not x:
            raise ValueError("batch%s is an empty list of samples: every batch holds at least one" % path)
        first = _signature(x[0], torch)
        for i, item in enumerate(x):
            if _signature(item, torch) != first:
                raise ValueError("batch%s[%d] is built unlike batch%s[0] (another nesting, key, dtype or number "
                                 "of dimensions): the samples of a list must be alike" % (path, i, path))
        flat.lists.append((path, len(x)))
        columns = [[] for _ in _tensors(x[0], torch)]
        for item in x:
            for column, t in zip(columns, _tensors(item, torch)):
                column.append(t)
        fields = iter(columns)

        def item_walk(s, where):
            if isinstance(s, torch.Tensor):
                return leaf(None, where, next(fields))
            if isinstance(s, collections.abc.Mapping):
                return {"dict": [[k, item_walk(v, _path(where, k))] for k, v in s.items()]}
            if isinstance(s, (tuple, list)):
                kind = "list" if isinstance(s, list) else "tuple"
                return {kind: [item_walk(v, _path(where, i)) for i, v in enumerate(s)]}
            raise TypeError("batch%s is a %s: coloader carries tensors (and tuples, lists and dicts of them)"
                            % (where, type(s).__name__))

        return item_walk(x[0], path + "[*]")

    flat.structure = walk(batch, "")
    return flat


def count_samples(flat):
    """The number of samples of the batch: what every batched tensor has along its first
    dimension, and every list of samples holds (ValueError otherwise)."""
    count = None
    for x, path, per_sample in zip(flat.leaves, flat.paths, flat.per_sample):
        if per_sample:
            continue
        if x.dim() == 0:
            raise ValueError("batch%s is a scalar tensor: coloader needs each tensor to have the batch's samples "
                             "along its first dimension (a per-batch value can be repeated per sample)" % path)
        if count is None:
            count, first = int(x.shape[0]), path
        elif int(x.shape[0]) != count:
            raise ValueError("batch%s has %d samples, batch%s %d: every tensor must have the batch's samples "
                             "along its first dimension (a list or tuple of one tensor per sample is named in "
                             "Producer(samples=[...]))" % (path, int(x.shape[0]), first, count))
    for path, n in flat.lists:
        if count is None:
            count, first = n, path
        elif n != count:
            raise ValueError("batch%s holds %d samples, batch%s %d: every list of samples must hold the batch's "
                             "samples" % (path, n, first, count))
    return count


def batch_size(batch, torch, sample_lists=()):
    """The number of samples of `batch` (ValueError when its tensors disagree, or TypeError when
    a leaf cannot travel, as publish() says)."""
    return count_samples(flatten(batch, torch, sample_lists))


def _shapes_of(flat, i):
    """The per-sample shapes of leaf i, one per sample (batched: all alike)."""
    x = flat.leaves[i]
    return [tuple(t.shape) for t in x] if flat.per_sample[i] else [tuple(x.shape[1:])]


class Schema:
    """The fields of the first batch and each one's maximum per-sample shape: every later batch
    must have the same structure, dtypes and numbers of dimensions, and shapes within the
    maxima.

    max_shapes: {path: shape} for fields whose batches may grow past the first batch's (a
    path as as_path() takes it); pad: the value a batched field is padded with (one for all,
    or {path: value}; default 0, False for bool)."""

    def __init__(self, flat, max_shapes=None, pad=0):
        self.structure = json.dumps(flat.structure, separators=(",", ":"))
        self.paths = list(flat.paths)
        self.per_sample = list(flat.per_sample)
        self.sample_lists = frozenset(path for path, _ in flat.lists)
        self.dtypes = [(x[0] if p else x).dtype for x, p in zip(flat.leaves, flat.per_sample)]
        self.count = count_samples(flat)
        given = {as_path(k): (int(v),) if isinstance(v, int) else tuple(int(d) for d in v)
                 for k, v in (max_shapes or {}).items()}
        unknown = sorted(set(given) - set(self.paths))
        if unknown:
            raise ValueError("max_shapes names %s, which the first batch does not have (its fields: %s)"
                             % (", ".join(unknown), ", ".join(self.paths)))
        pads = pad if isinstance(pad, collections.abc.Mapping) else None
        if pads is not None:
            pads = {as_path(k): v for k, v in pads.items()}
            unknown = sorted(set(pads) - set(self.paths))
            if unknown:
                raise ValueError("pad names %s, which the first batch does not have (its fields: %s)"
                                 % (", ".join(unknown), ", ".join(self.paths)))
        self.max_shapes, self.pads, self.given = [], [], []
        for i, path in enumerate(self.paths):
            shapes = _shapes_of(flat, i)
            seen = tuple(int(d) for d in np.max(np.array(shapes, dtype=np.int64), axis=0)) if shapes[0] else ()
            if path in given:
                if len(given[path]) != len(seen) or any(g < s for g, s in zip(given[path], seen)):
                    raise ValueError("max_shapes gives batch%s the maximum %s, but the first batch has %s: a maximum "
                                     "has one size per dimension of a sample, each at least the first batch's"
                                     % (path, given[path], seen))
                seen = given[path]
            self.max_shapes.append(seen)
            self.given.append(path in given)
            # One value for every field pads the others; a bool field pads with False unless
            # named (a label's -100 is no mask value).
            boolean = str(self.dtypes[i]) == "torch.bool"
            value = pads.get(path, False if boolean else 0) if pads is not None else (False if boolean else pad)
            self.pads.append(_pad_value(value, self.dtypes[i], path))
        # Which fields carry shapes, at which columns of the shapes field: every field with
        # dimensions per sample (a batched one's may shrink below its maximum) and every
        # per-sample one.
        self.columns, at = [], 0
        for shape, per_sample in zip(self.max_shapes, self.per_sample):
            if shape or per_sample:
                self.columns.append(at)
                at += len(shape)
            else:
                self.columns.append(None)
        # A list of samples needs its rows (one per sample) even if its tensors are scalars.
        self.width = max(at, 1) if any(self.per_sample) else at
        self.shapes_field = len(self.paths) if self.width else None
        self.wire_structure = json.dumps(self._wire(flat.structure), separators=(",", ":"))

    def _wire(self, structure):
        def walk(s, in_item):
            if isinstance(s, int):
                if in_item:
                    return {"sample": [s, self.columns[s], len(self.max_shapes[s])]}
                return s if self.columns[s] is None else {"padded": [s, self.columns[s]]}
            (kind, items), = s.items()
            if kind == "samples":
                return {"samples": [items[0], walk(items[1], True)]}
            if kind == "dict":
                return {"dict": [[k, walk(v, in_item)] for k, v in items]}
            return {kind: [walk(v, in_item) for v in items]}

        wire = walk(structure, False)
        return wire if self.shapes_field is None else {"shaped": [wire, self.shapes_field]}

    def storage_shape(self, i):
        """Field i's per-sample room in a slot: its maximum, each dimension at least 1."""
        return tuple(max(1, d) for d in self.max_shapes[i])

    def check(self, flat):
        """The batch's sample count; a ValueError names the first field that breaks the schema."""
        if json.dumps(flat.structure, separators=(",", ":")) != self.structure:
            missing = [p for p in self.paths if p not in flat.paths]
            extra = [p for p in flat.paths if p not in self.paths]
            raise ValueError("this batch's structure differs from the first batch's (%s%s%s): every batch "
                             "must have the same tensors, keys and nesting"
                             % ("missing " + ", ".join("batch" + p for p in missing) if missing else "",
                                "; " if missing and extra else "",
                                "new " + ", ".join("batch" + p for p in extra) if extra else "")
                             if missing or extra else "this batch's structure differs from the first batch's "
                             "(the same fields in another nesting or order): every batch must be built alike")
        for i, (path, dtype, most) in enumerate(zip(self.paths, self.dtypes, self.max_shapes)):
            x = flat.leaves[i]
            got = (x[0] if flat.per_sample[i] else x).dtype
            if got != dtype:
                raise ValueError("batch%s is %s in this batch, %s in the first: every batch must keep each "
                                 "tensor's dtype" % (path, got, dtype))
            for shape in _shapes_of(flat, i):
                if len(shape) != len(most):
                    raise ValueError("batch%s has per-sample shape %s in this batch, %s at most: every batch must "
                                     "keep each tensor's number of dimensions" % (path, shape, most))
                if any(s > m for s, m in zip(shape, most)):
                    raise ValueError(
                        "batch%s has per-sample shape %s, larger than its maximum %s (%s): state the most it can "
                        "hold, Producer(..., max_shapes={%r: %s}), or %s"
                        % (path, shape, most, "given in max_shapes" if self.given[i] else "the first batch's",
                           path, tuple(max(s, m) for s, m in zip(shape, most)), _bound_hint(path)))
        return count_samples(flat)

    def pack(self, flat, count, torch):
        """The batch's fields as the library copies them into a slot, in host memory, contiguous:
        each field in its room (padded with its pad value, or its samples at the start of their
        room), then the shapes field."""
        out, shapes = [], None
        if self.shapes_field is not None:
            shapes = np.zeros((count, self.width), dtype=np.int32)
        for i, x in enumerate(flat.leaves):
            room, column = self.storage_shape(i), self.columns[i]
            if flat.per_sample[i]:
                # Each sample at the start of its room, whatever its shape.
                packed = torch.zeros((count, math.prod(room)), dtype=self.dtypes[i])
                for j, t in enumerate(x):
                    t = _host(t)
                    if t.numel():
                        packed[j, :t.numel()] = t.reshape(-1)
                    shapes[j, column:column + t.dim()] = t.shape
                out.append(packed)
                continue
            t = _host(x)
            if column is not None:
                shapes[:, column:column + t.dim() - 1] = t.shape[1:]
            if tuple(t.shape[1:]) != room:
                padded = torch.full((count,) + room, self.pads[i], dtype=self.dtypes[i])
                padded[(slice(None),) + tuple(slice(0, d) for d in t.shape[1:])] = t
                t = padded
            out.append(t)
        if shapes is not None:
            out.append(torch.from_numpy(shapes))
        return out

    def fields(self):
        """[(path, dtype, per-sample room in the slot, flags)] of every field the slot holds."""
        rows = [(p, d, self.storage_shape(i), 0) for i, (p, d) in enumerate(zip(self.paths, self.dtypes))]
        if self.shapes_field is not None:
            rows.append((SHAPES_PATH, "int32", (self.width,), 1))
        return rows


def _pad_value(value, dtype, path):
    """`value` as a pad of `dtype` (checked now, not at the first batch that needs it)."""
    import torch

    try:
        torch.full((1,), value, dtype=dtype)
    except (TypeError, RuntimeError, ValueError) as e:
        raise ValueError("pad gives batch%s the value %r, which a %s tensor cannot hold (%s)"
                         % (path, value, dtype, str(e).splitlines()[0])) from None
    return value


def _host(t):
    # Host memory, contiguous: what the library copies into the slot (a no-op for the usual CPU
    # batch). resolve_conj/resolve_neg: a lazily conjugated or negated view's memory holds the
    # values before the flag, which the library would copy as they are.
    return t.detach().to("cpu").resolve_conj().resolve_neg().contiguous()


def _bound_hint(path):
    return ("bound it where the batch is made (e.g. tokenizer(..., max_length=N, truncation=True), or a collate_fn "
            "that cuts batch%s)" % path)


def check_structure(structure, fields):
    """Raises ValueError unless `structure` (parsed) is one this module writes over `fields`
    ([(path, dtype, shape, ...)]), each used once, columns within the shapes field."""
    seen = []
    shapes = None
    if isinstance(structure, dict) and len(structure) == 1 and "shaped" in structure:
        items = structure["shaped"]
        if not (isinstance(items, list) and len(items) == 2 and isinstance(items[1], int)
                and 0 <= items[1] < len(fields) and len(fields[items[1]][2]) == 1):
            raise ValueError("bad shaped batch %r" % (items,))
        structure, shapes = items
        seen.append(shapes)
        width = fields[shapes][2][0]

    def columns(items, kind):
        # padded: [field, column]; sample: [field, column, dimensions]
        size = 2 if kind == "padded" else 3
        if not (isinstance(items, list) and len(items) == size and
                all(isinstance(v, int) and not isinstance(v, bool) for v in items)):
            raise ValueError("bad %s element %r" % (kind, items))
        f, c = items[:2]
        nd = len(fields[f][2]) if 0 <= f < len(fields) else -1
        if shapes is None or nd < 0 or c < 0 or c + nd > width or (kind == "sample" and items[2] != nd):
            raise ValueError("%s element %r names no field's shapes" % (kind, items))
        seen.append(f)

    def walk(s, in_item):
        if isinstance(s, int) and not isinstance(s, bool):
            if in_item:
                raise ValueError("a plain field %d within a list of samples" % s)
            seen.append(s)
            return
        if not (isinstance(s, dict) and len(s) == 1):
            raise ValueError("bad structure element %r" % (s,))
        (kind, items), = s.items()
        if kind == "padded" and not in_item:
            return columns(items, kind)
        if kind == "sample" and in_item:
            return columns(items, kind)
        if kind == "samples" and not in_item:
            if shapes is None:
                raise ValueError("a list of samples without the shapes field")
            if not (isinstance(items, list) and len(items) == 2 and items[0] in ("list", "tuple")):
                raise ValueError("bad list of samples %r" % (items,))
            return walk(items[1], True)
        if kind not in ("dict", "tuple", "list") or not isinstance(items, list):
            raise ValueError("bad structure element %r" % (s,))
        for item in items:
            if kind == "dict":
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise ValueError("bad dict entry %r" % (item,))
                item = item[1]
            walk(item, in_item)

    walk(structure, False)
    if sorted(seen) != list(range(len(fields))):
        raise ValueError("the structure names fields %s, the schema has %d" % (sorted(seen), len(fields)))


def compile_rebuild(structure, fields, torch):
    """A function (leaves, shapes, copies, stream=None) -> batch for `structure` (parsed,
    checked): `leaves` the batch's fields as tensors of [n, *room], `shapes` the shapes field's
    rows (an int32 numpy array [n, width]) or None without one; the tensors it had to copy
    (fields cut to the batch's shapes) are appended to `copies`, and made on the CUDA `stream`
    (None: the current one). ValueError when the shapes are past the fields' rooms.
    Built once per Loader: next() runs it per batch."""
    shaped = isinstance(structure, dict) and "shaped" in structure
    if shaped:
        structure, shapes_field = structure["shaped"]
    rooms = [tuple(f[2]) for f in fields]

    def build(s):
        if isinstance(s, int):
            return lambda L, m, rows, copies: L[s]
        (kind, items), = s.items()
        if kind == "padded":
            f, c = items
            most, nd = rooms[f], len(rooms[f])

            def padded(L, m, rows, copies):
                shape = tuple(m[c:c + nd])
                if shape == most:
                    return L[f]
                # The batch's largest: a strided view of the room, made contiguous as a
                # DataLoader's tensors are. A view torch already counts as contiguous (one row,
                # or a dimension cut to 0) stays a view, and is no copy.
                cut = L[f][(slice(None),) + tuple(slice(0, d) for d in shape)]
                kept, stream = copies
                if stream is None or cut.is_contiguous():
                    t = cut.contiguous()
                else:
                    with torch.cuda.stream(stream):  # (entered only here: it costs tens of µs)
                        t = cut.contiguous()
                if t is not cut:
                    kept.append(t)
                return t
            return padded
        if kind == "samples":
            lists.append(items)
            container, item = items
            one = build_item(item)
            make = list if container == "list" else tuple
            return lambda L, m, rows, copies: make(one(L, rows, j) for j in range(len(rows)))
        if kind == "dict":
            parts = [(k, build(v)) for k, v in items]
            return lambda L, m, rows, copies: {k: b(L, m, rows, copies) for k, b in parts}
        parts = [build(v) for v in items]
        make = list if kind == "list" else tuple
        return lambda L, m, rows, copies: make(b(L, m, rows, copies) for b in parts)

    def build_item(s):
        (kind, items), = s.items()
        if kind == "sample":
            f, c, nd = items

            def sample(L, rows, j):
                # Sample j lies at the start of its room: a view of its own shape.
                shape = rows[j][c:c + nd]
                return L[f].reshape(len(rows), -1)[j, :math.prod(shape)].view(shape) if nd else L[f][j]
            return sample
        if kind == "dict":
            parts = [(k, build_item(v)) for k, v in items]
            return lambda L, rows, j: {k: b(L, rows, j) for k, b in parts}
        parts = [build_item(v) for v in items]
        make = list if kind == "list" else tuple
        return lambda L, rows, j: make(b(L, rows, j) for b in parts)

    lists = []  # the lists of samples build() met: their items need each sample's row
    fn = build(structure)
    if not shaped:
        return lambda leaves, shapes, copies, stream=None: fn(leaves, None, None, (copies, stream))
    per_sample = bool(lists)
    # The most each column may say: its field's room in that dimension.
    limits = np.zeros(fields[shapes_field][2][0], dtype=np.int64)

    def note(s):
        if isinstance(s, dict):
            (kind, items), = s.items()
            if kind in ("padded", "sample"):
                f, c = items[:2]
                limits[c:c + len(rooms[f])] = rooms[f]
                return
            for item in (items if kind != "samples" else items[1:]):
                note(item[1] if kind == "dict" else item)
    note(structure)

    def rebuild(leaves, shapes, copies, stream=None):
        # The batch's largest shape per column, and each sample's row where lists of samples
        # need them (a row per sample costs more than the maximum).
        most = shapes.max(axis=0)
        if (most > limits).any() or shapes.min() < 0:
            raise ValueError("the batch's shapes %s are past its fields' rooms %s"
                             % (most.tolist(), limits.tolist()))
        return fn(leaves, most.tolist(), shapes.tolist() if per_sample else None, (copies, stream))
    return rebuild
