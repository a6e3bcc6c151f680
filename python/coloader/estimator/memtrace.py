"""Tracing a training step's GPU memory without a GPU: live tensor storages on the meta device,
autocast and fused attention emulated above autograd, and a replay through a model of
PyTorch's caching allocator.

Three pieces, each small enough to check by hand:

- StorageTracker (a TorchDispatchMode) sees every operator's outputs. An output whose storage
  is new is an allocation; each tensor that refers to a storage holds one count on it, released
  by a weakref finalizer, and the storage is freed when the last count goes. Autograd keeps
  what it saves for backward through saved_tensors_hooks that return the tensor itself, so a
  saved activation stays counted until backward has used it (without the hooks autograd would
  keep a shallow copy that no finalizer sees, and activations would vanish from the count).
- Autocast: the meta device has no autocast of its own (autocast is tied to the CUDA and CPU
  dispatch keys), so StepEmulation (a TorchFunctionMode) applies CUDA autocast's rules itself:
  matrix products and convolutions cast their floating inputs to the low-precision type, a
  leaf parameter's cast cached for the step as autocast caches it; normalisations, softmax and
  losses run in float32. The casts are ordinary autograd operations, as autocast's are, so
  backward sees them and the tracker counts them. The same mode stands in fused attention
  (what torch 2.x runs on a GPU for scaled_dot_product_attention and nn.MultiheadAttention) for
  the written-out attention that the meta device, or torch 1.13, would trace.
- AllocatorModel replays the allocations and frees in order through the rules of PyTorch's
  CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, without expandable segments):
  sizes rounded up to 512 bytes; requests up to 1 MiB served from 2 MiB segments, up to 10 MiB
  from 20 MiB segments, larger ones from segments rounded up to 2 MiB; best fit among cached
  free blocks, split when the rest is at least 512 bytes (small pool) or more than 1 MiB
  (large pool), and merged with free neighbours on free. Its peak of reserved bytes is what
  torch.cuda.max_memory_reserved reports, fragmentation included.
"""

import bisect
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

try:
    from torch.overrides import TorchFunctionMode
except ImportError:  # torch < 1.13
    TorchFunctionMode = None

MiB = 1 << 20
_SMALL_SIZE = 1 * MiB
_SMALL_BUFFER = 2 * MiB
_LARGE_BUFFER = 20 * MiB
_MIN_LARGE_ALLOC = 10 * MiB
_ROUND_LARGE = 2 * MiB
_MIN_BLOCK = 512


def round_size(nbytes):
    """The caching allocator's block size for a request of `nbytes`."""
    return _MIN_BLOCK if nbytes < _MIN_BLOCK else _MIN_BLOCK * -(-nbytes // _MIN_BLOCK)


class AllocatorModel:
    """Segments and blocks as PyTorch's CUDA caching allocator keeps them (one stream)."""

    class _Block:
        __slots__ = ("seg", "off", "size", "free", "prev", "next", "small")

        def __init__(self, seg, off, size, small):
            self.seg, self.off, self.size, self.small = seg, off, size, small
            self.free, self.prev, self.next = True, None, None

    def __init__(self):
        self.pools = {True: [], False: []}  # small? -> sorted [(size, seg, off, block)]
        self.blocks = {}  # handle -> block
        self.segments = 0
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def _insert(self, b):
        bisect.insort(self.pools[b.small], (b.size, b.seg, b.off, id(b), b))

    def _remove(self, b):
        pool = self.pools[b.small]
        i = bisect.bisect_left(pool, (b.size, b.seg, b.off, id(b)))
        assert pool[i][4] is b
        pool.pop(i)

    def malloc(self, handle, nbytes):
        size = round_size(nbytes)
        small = size <= _SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size,))
        if i < len(pool):
            b = pool.pop(i)[4]
        else:
            seg_size = _SMALL_BUFFER if small else (_LARGE_BUFFER if size < _MIN_LARGE_ALLOC
                                                    else _ROUND_LARGE * -(-size // _ROUND_LARGE))
            self.segments += 1
            b = self._Block(self.segments, 0, seg_size, small)
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = b.size - size
        if rest >= _MIN_BLOCK if small else rest > _SMALL_SIZE:
            r = self._Block(b.seg, b.off + size, rest, small)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._insert(r)
        b.free = False
        self.blocks[handle] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, handle):
        b = self.blocks.pop(handle)
        self.allocated -= b.size
        b.free = True
        for nb in (b.prev, b.next):
            if nb is not None and nb.free:
                self._remove(nb)
                if nb is b.prev:
                    nb.size += b.size
                    nb.next = b.next
                    if b.next is not None:
                        b.next.prev = nb
                    b = nb
                else:
                    b.size += nb.size
                    b.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = b
        self._insert(b)


def _storage_key(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    cdata = getattr(s, "_cdata", None)
    if cdata is None:
        cdata = s._storage._cdata
    nbytes = s.nbytes() if callable(getattr(s, "nbytes", None)) else s.size() * s.element_size()
    return cdata, nbytes


class StorageTracker(TorchDispatchMode):
    """Records allocations and frees of tensor storages as operators run.

    events: a list of ("alloc", key, nbytes, tag) and ("free", key) in the order they happened;
    tag is what `phase` was when the storage appeared. `live_bytes` and `peak_bytes` count
    unrounded storage bytes; `peak_live` is {tag: bytes} at the peak."""

    def __init__(self):
        super().__init__()
        self.live = {}  # key -> [count, nbytes, tag]
        self.events = []
        self.phase = "activations"
        self.live_bytes = self.peak_bytes = 0
        self.peak_live = {}
        self.ops = set()  # operator names seen (which CUDA libraries the step would load)
        # Callables (func, args, kwargs, out) that see every operator as it runs, and
        # (name, inputs, outputs) for work that runs as no operator of its own (the fused
        # attention stand-in): coloader.estimator.activity counts the step's FLOPs and bytes so.
        self.observers = []
        # Operators whose place in the sequence matters to what the GPU's libraries add
        # (coloader.estimator.workspaces): {name: describe(name, args) -> info}; each call is
        # noted in `windows` as (name, info, first event, end event, phase), its outputs'
        # allocations being events[first:end].
        self.watch = {}
        self.windows = []

    def __enter__(self):
        global _active
        self._outer, _active = _active, self
        return super().__enter__()

    def __exit__(self, *exc):
        global _active
        _active = self._outer
        return super().__exit__(*exc)

    def note(self, name, inputs, outputs):
        """Tells the observers about work that no operator shows (see _FusedAttention)."""
        for ob in self.observers:
            ob(name, inputs, {}, outputs)

    def hold(self, t, tag):
        """Count an existing tensor (a parameter, the input batch) as live from now on; it
        stays live for as long as the tracker (`t` is referenced, not weakly)."""
        key, nbytes = _storage_key(t)
        if key not in self.live:
            self._alloc(key, nbytes, tag)
        self.live[key][0] += 1 << 40

    def _alloc(self, key, nbytes, tag):
        self.live[key] = [0, nbytes, tag]
        self.events.append(("alloc", key, nbytes, tag))
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            by = {}
            for _, n, tg in self.live.values():
                by[tg] = by.get(tg, 0) + n
            self.peak_live = by

    def _release(self, key):
        e = self.live.get(key)
        if e is None:
            return
        e[0] -= 1
        if e[0] == 0:
            del self.live[key]
            self.live_bytes -= e[1]
            self.events.append(("free", key))

    def retag(self, t, tag):
        """Change the tag of a live tensor's storage (a gradient found after backward)."""
        key, _ = _storage_key(t)
        if key in self.live:
            self.live[key][2] = tag
            for i in range(len(self.events) - 1, -1, -1):
                ev = self.events[i]
                if ev[0] == "alloc" and ev[1] == key:
                    self.events[i] = (ev[0], ev[1], ev[2], tag)
                    break

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.add(name)
        try:
            out = func(*args, **(kwargs or {}))
        except NotImplementedError:
            # Older torch (1.13) lacks meta kernels for some backward operators; their outputs
            # have the shapes of their inputs, so we make them here.
            impl = _META_FALLBACKS.get(func.overloadpacket.__name__)
            if impl is None:
                raise
            out = impl(*args, **(kwargs or {}))
        if not isinstance(out, torch.Tensor) and isinstance(out, (int, float)) and args \
                and isinstance(args[0], torch.Tensor):
            # torch 1.13 hands a Python scalar's 0-dim tensor (a "wrapped number", e.g. the
            # 0.5 of x * 0.5, which autograd saves) to the mode as a number when detaching it.
            out = torch.tensor(out, dtype=args[0].dtype)
        for ob in self.observers:
            ob(func, args, kwargs or {}, out)
        first = len(self.events)
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            # Only meta tensors are the GPU's: CPU scalars stay on the host there too.
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                key, nbytes = _storage_key(t)
                if key not in self.live:
                    self._alloc(key, nbytes, self.phase)
                self.live[key][0] += 1
                weakref.finalize(t, self._release, key)
        describe = self.watch.get(name)
        if describe is not None:
            self.windows.append((name, describe(name, args), first, len(self.events), self.phase))
        return out


_active = None  # the StorageTracker whose `with` block is running, for StorageTracker.note


def _conv_backward(grad_out, inp, weight, bias_sizes, *rest, **kw):
    mask = kw.get("output_mask", rest[-1] if rest else (True, True, True))
    outs = (inp.new_empty(inp.shape) if mask[0] else None,
            weight.new_empty(weight.shape) if mask[1] else None,
            grad_out.new_empty((grad_out.shape[1],)) if mask[2] else None)
    return outs


def _like(i):
    return lambda *a, **kw: a[i].new_empty(a[i].shape)


_META_FALLBACKS = {
    "convolution_backward": _conv_backward,
    "convolution_backward_overrideable": _conv_backward,
    "max_pool2d_with_indices_backward": _like(1),
    "avg_pool2d_backward": _like(1),
    "adaptive_avg_pool2d_backward": _like(1),
    "_adaptive_avg_pool2d_backward": _like(1),
}


def keep_saved_tensors():
    """saved_tensors_hooks that hand autograd the tensor object itself (see the module doc)."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


# CUDA autocast's lists (aten/src/ATen/autocast_mode.cpp), as Python-level functions.
def _amp_tables():
    F = torch.nn.functional
    T = torch.Tensor
    low = [F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d,
           F.linear, F.prelu, torch.conv1d, torch.conv2d, torch.conv3d, torch.matmul, torch.mm, torch.bmm,
           torch.addmm, torch.baddbmm, torch.addbmm, torch.einsum, torch.mv, torch.addmv, torch.chain_matmul,
           T.matmul, T.__matmul__, T.__rmatmul__, T.mm, T.bmm, T.addmm, T.baddbmm, T.mv]
    if hasattr(F, "scaled_dot_product_attention"):
        low.append(F.scaled_dot_product_attention)
    fp32 = [F.layer_norm, F.group_norm, F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
            T.softmax, T.log_softmax, F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss,
            F.binary_cross_entropy_with_logits, F.kl_div, torch.layer_norm, torch.group_norm, F.normalize,
            torch.cumsum, torch.logsumexp, torch.exp, torch.log, torch.pow, torch.rsqrt]
    return set(low), set(fp32)


class _FusedAttention(torch.autograd.Function):
    """What fused attention (flash or memory-efficient, as torch 2.x picks on a GPU) holds:
    forward keeps q, k, v, the output and a float32 log-sum-exp per row, never the L x S
    matrix of scores; backward makes the three input gradients."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        if _active is not None:
            _active.note("fused_attention", (q, k, v), (out, lse))
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        grads = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        if _active is not None:
            _active.note("fused_attention_backward", (q, k, v, out, lse, grad), grads)
        return grads


class StepEmulation(TorchFunctionMode or object):
    """What the GPU step does that the meta device would not: CUDA autocast's casting rules
    (when `dtype` is a low precision; see the module doc), and fused attention where torch 2.x
    uses it on a GPU (scaled_dot_product_attention, and nn.MultiheadAttention's self-attention
    in training, which torch 1.13 writes out as bmm-softmax-bmm)."""

    def __init__(self, dtype=None):
        super().__init__()
        self.dtype = dtype
        self.low, self.fp32 = _amp_tables()
        F = torch.nn.functional
        self.sdpa = getattr(F, "scaled_dot_product_attention", None)
        self.mha = F.multi_head_attention_forward
        self.cache = {}  # id(leaf) -> (leaf, cast): autocast's per-region cache of weight casts

    def _cast(self, x, dtype):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64
                and x.dtype != dtype):
            return x
        if dtype != torch.float32 and x.is_leaf and x.requires_grad:
            hit = self.cache.get(id(x))
            if hit is None:
                hit = self.cache[id(x)] = (x, x.to(dtype))
            return hit[1]
        return x.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self._run(func, args, kwargs or {})

    def _run(self, func, args, kwargs):
        """Calls `func` as the GPU step would; nested calls come back here, since a mode is
        switched off while its handler runs."""
        if func is self.mha:
            out = self._self_attention(*args, **kwargs)
            if out is not None:
                return out
        target = None
        if self.dtype is not None:
            target = self.dtype if func in self.low else torch.float32 if func in self.fp32 else None
        if target is not None:
            cast = lambda a: [self._cast(x, target) for x in a] if isinstance(a, (list, tuple)) \
                else self._cast(a, target)
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        if func is self.sdpa and len(args) == 3 and kwargs.get("attn_mask") is None and not kwargs.get("dropout_p"):
            return _FusedAttention.apply(*args)  # causal or not, fused attention holds the same
        return func(*args, **kwargs)

    def _self_attention(self, query, key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias,
                        bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True,
                        key_padding_mask=None, need_weights=True, attn_mask=None, use_separate_proj_weight=False,
                        **rest):
        """nn.MultiheadAttention's self-attention as torch 2.x runs it in training: the packed
        projection, made contiguous as (3, L, N, E), fused attention, the output projection.
        None for the cases it does not cover (those run as written)."""
        if not (query is key is value) or need_weights or bias_k is not None or add_zero_attn \
                or key_padding_mask is not None or attn_mask is not None or use_separate_proj_weight \
                or rest.get("is_causal") or dropout_p:
            return None
        F = torch.nn.functional
        L, N, E = query.shape
        H = num_heads
        proj = self._run(F.linear, (query, in_proj_weight, in_proj_bias), {})
        proj = proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
        q, k, v = (proj[i].view(L, N * H, E // H).transpose(0, 1) for i in range(3))
        out = _FusedAttention.apply(q, k, v)  # (N*H, L, E/H)
        out = out.view(N, H, L, E // H).permute(2, 0, 1, 3).contiguous().view(L * N, E)
        out = self._run(F.linear, (out, out_proj_weight, out_proj_bias), {})
        return out.view(L, N, E), None
