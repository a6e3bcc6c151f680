"""What a coloader.Producer batch may be, and how it travels: a tensor, or tuples, lists and
dicts of them nested to any depth (what a torch DataLoader's collate yields). Private to the
package.

flatten() turns a batch into its leaves (the fields, in order), a structure that names how they
nest, and each leaf's path as its user writes it (`batch["input_ids"]`, `batch[1]["mask"]`).
The structure is JSON that the producer sends once with its schema and every consumer rebuilds
batches from (rebuild()):

    3                                   the field of index 3
    {"tuple": [ITEM, ...]}              a tuple (a namedtuple travels as a plain tuple)
    {"list": [ITEM, ...]}               a list
    {"dict": [[KEY, ITEM], ...]}        a dict with str keys, in its order (any Mapping, such
                                        as transformers' BatchEncoding, travels as a dict)

Schema checks the batches after the first against it, naming the field and the fix.
"""

import collections.abc
import json


def _path(prefix, key):
    return "%s[%s]" % (prefix, json.dumps(key) if isinstance(key, str) else key)


def flatten(batch, torch):
    """(leaves, structure as JSON text, paths) of `batch`; a TypeError names what cannot travel."""
    leaves, paths = [], []

    def walk(x, path):
        if isinstance(x, torch.Tensor):
            leaves.append(x)
            paths.append(path)
            return len(leaves) - 1
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
            return {kind: [walk(v, _path(path, i)) for i, v in enumerate(x)]}
        raise TypeError("batch%s is a %s: coloader carries tensors (and tuples, lists and dicts of them). "
                        "Make it a tensor in the Dataset or collate_fn (e.g. tokenise text), or leave it out "
                        "of the batch" % (path, type(x).__name__))

    structure = walk(batch, "")
    return leaves, json.dumps(structure, separators=(",", ":")), paths


def rebuild(structure, leaves):
    """The batch `structure` (parsed JSON) describes, with `leaves` as its fields."""
    if isinstance(structure, int):
        return leaves[structure]
    (kind, items), = structure.items()
    if kind == "dict":
        return {key: rebuild(item, leaves) for key, item in items}
    built = [rebuild(item, leaves) for item in items]
    return built if kind == "list" else tuple(built)


def check_structure(structure, count):
    """Raises ValueError unless `structure` (parsed) is one this module writes, over fields
    0..count-1 each used once."""
    seen = []

    def walk(s):
        if isinstance(s, int) and not isinstance(s, bool):
            seen.append(s)
            return
        if not (isinstance(s, dict) and len(s) == 1):
            raise ValueError("bad structure element %r" % (s,))
        (kind, items), = s.items()
        if kind not in ("dict", "tuple", "list") or not isinstance(items, list):
            raise ValueError("bad structure element %r" % (s,))
        for item in items:
            if kind == "dict":
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise ValueError("bad dict entry %r" % (item,))
                item = item[1]
            walk(item)

    walk(structure)
    if sorted(seen) != list(range(count)):
        raise ValueError("the structure names fields %s, the schema has %d" % (sorted(seen), count))


def pad_hint(path):
    return ("pad every batch to one fixed size (e.g. tokenizer(..., padding='max_length', max_length=N, "
            "truncation=True), or a collate_fn that pads batch%s to a fixed length)" % path)


class Schema:
    """The fields of the first batch: every later batch must have the same structure, and each
    field the same dtype and per-sample shape."""

    def __init__(self, leaves, structure, paths):
        self.structure = structure
        self.paths = paths
        self.dtypes = [t.dtype for t in leaves]
        self.shapes = [tuple(t.shape[1:]) for t in leaves]
        self.count = check_counts(leaves, paths)

    def check(self, leaves, structure, paths):
        """The batch's sample count; a ValueError names the first field that breaks the schema."""
        if structure != self.structure:
            missing = [p for p in self.paths if p not in paths]
            extra = [p for p in paths if p not in self.paths]
            raise ValueError("this batch's structure differs from the first batch's (%s%s%s): every batch "
                             "must have the same tensors, keys and nesting"
                             % ("missing " + ", ".join("batch" + p for p in missing) if missing else "",
                                "; " if missing and extra else "",
                                "new " + ", ".join("batch" + p for p in extra) if extra else "")
                             if missing or extra else "this batch's structure differs from the first batch's "
                             "(the same fields in another nesting or order): every batch must be built alike")
        for t, path, dtype, shape in zip(leaves, paths, self.dtypes, self.shapes):
            if t.dtype != dtype:
                raise ValueError("batch%s is %s in this batch, %s in the first: every batch must keep each "
                                 "tensor's dtype" % (path, t.dtype, dtype))
            if tuple(t.shape[1:]) != shape:
                raise ValueError("batch%s has per-sample shape %s in this batch, %s in the first: coloader "
                                 "carries fixed shapes; %s" % (path, tuple(t.shape[1:]), shape, pad_hint(path)))
        return check_counts(leaves, paths)


def check_counts(leaves, paths):
    """The number of samples every leaf has along its first dimension (ValueError otherwise)."""
    count = None
    for t, path in zip(leaves, paths):
        if t.dim() == 0:
            raise ValueError("batch%s is a scalar tensor: coloader needs each tensor to have the batch's samples "
                             "along its first dimension (a per-batch value can be repeated per sample)" % path)
        if count is None:
            count, first = int(t.shape[0]), path
        elif int(t.shape[0]) != count:
            raise ValueError("batch%s has %d samples, batch%s %d: every tensor must have the batch's samples "
                             "along its first dimension" % (path, int(t.shape[0]), first, count))
    return count


def batch_size(batch, torch):
    """The number of samples of `batch` (ValueError when its tensors disagree, or TypeError when
    a leaf cannot travel, as publish() says)."""
    leaves, _, paths = flatten(batch, torch)
    return check_counts(leaves, paths)
