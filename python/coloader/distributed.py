"""The distributed side of coloader.Loader: which rank of which consumer group a process is
(from arguments, torch.distributed, torchrun or Slurm), and checkpoint/resume of a Loader's
position (state_dict / load_state_dict). docs/DISTRIBUTED.md states the rules.
"""

import os
from typing import Any, Dict

from . import _lib


class ResumeWarning(RuntimeWarning):
    """load_state_dict() could not resume exactly: the producer had moved past the saved point."""


def _env_int(name):
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise _lib.InvalidArgument("environment variable %s=%r is not an integer" % (name, value),
                                   _lib.E_INVALID) from None


def _topology(torch, rank, world_size, group, node_rank, num_nodes):
    """(rank, world_size, group, node_rank, num_nodes, local_rank, source) of this process.

    Explicit rank/world_size are the group's own (ranks of this producer's consumers). Found
    from torch.distributed, torchrun or Slurm, the group is the ranks on this node (one
    producer per node serves that node's share: docs/DISTRIBUTED.md), and the node index and
    count are stated for the producer to check.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise _lib.InvalidArgument("give both rank and world_size (or neither, to read them from "
                                       "torch.distributed or the environment)", _lib.E_INVALID)
        rank, world_size = int(rank), int(world_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise _lib.InvalidArgument("rank %d is outside a world of %d" % (rank, world_size), _lib.E_INVALID)
        return rank, world_size, group, node_rank, num_nodes, None, "arguments"
    env = os.environ
    dist = getattr(torch, "distributed", None)
    local_size = local_rank = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        g, size, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
        local_size, local_rank = _env_int("LOCAL_WORLD_SIZE"), _env_int("LOCAL_RANK")
    elif _env_int("RANK") is not None and _env_int("WORLD_SIZE") is not None:
        g, size, source = _env_int("RANK"), _env_int("WORLD_SIZE"), "RANK/WORLD_SIZE"
        local_size, local_rank = _env_int("LOCAL_WORLD_SIZE"), _env_int("LOCAL_RANK")
    elif _env_int("SLURM_PROCID") is not None and _env_int("SLURM_NTASKS") is not None:
        g, size, source = _env_int("SLURM_PROCID"), _env_int("SLURM_NTASKS"), "SLURM_PROCID/SLURM_NTASKS"
        nodes = _env_int("SLURM_NNODES") or 1
        local_size = size // nodes if size % nodes == 0 else None
        local_rank = _env_int("SLURM_LOCALID")
    else:
        return 0, 1, group, node_rank, num_nodes, None, "none found (a plain consumer)"
    if local_size is None:
        local_size = size  # one node
    if local_rank is None:
        local_rank = g % local_size
    if size % local_size != 0 or not 0 <= local_rank < local_size:
        raise _lib.InvalidArgument("%s gives rank %d of %d with %d per node (local rank %d): not a whole number "
                                   "of nodes" % (source, g, size, local_size, local_rank), _lib.E_INVALID)
    if node_rank is None and num_nodes is None:
        node_rank, num_nodes = g // local_size, size // local_size
    if group is None and local_size > 1:
        run_id = env.get("TORCHELASTIC_RUN_ID")
        if run_id and run_id != "none":
            group = "torchelastic-" + run_id
        elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
            group = "torch-%s:%s-w%d" % (env["MASTER_ADDR"], env["MASTER_PORT"], size)
        elif env.get("SLURM_JOB_ID"):
            group = "slurm-%s.%s" % (env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID", "0"))
    return local_rank, local_size, group, node_rank, num_nodes, local_rank, source


class _Stateful:
    """state_dict()/load_state_dict() of coloader.Loader (mixed into it)."""

    def _producer_identity(self):
        ptr = self._require_open()
        lib = _lib.lib()
        return int(lib.coloader_consumer_seed(ptr)), lib.coloader_consumer_data_key(ptr).decode()

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank stands, to save with the model: the epoch, the samples this rank has
        taken in it, and what a resume checks (seed, data key, group and topology)."""
        seed, data_key = self._producer_identity()
        ptr = self._require_open()
        return {
            "epoch": int(_lib.lib().coloader_consumer_epoch(ptr)),
            "samples_seen_in_epoch": int(self._seen),
            "seed": seed,
            "data_key": data_key,
            "group": self.group,
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "drop_last": bool(self._opts_args[3]),
            "split_begin": int(_lib.lib().coloader_consumer_split_begin(ptr)),
            # A group's epoch it was caught up on runs from here round the epoch's end.
            "split_origin": int(_lib.lib().coloader_consumer_split_origin(ptr)),
            "node_rank": int(_lib.lib().coloader_consumer_node_rank(ptr)),
            "num_nodes": int(_lib.lib().coloader_consumer_num_nodes(ptr)),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes `state` (from state_dict()): call it before iterating. The next iter() gives the
        rest of the saved epoch exactly: the producer serves it (decoded again while the others
        read on; to a group's ranks together, each its share from where it stopped), then whole
        epochs. A producer without catch-up serves it only when it is still at or before the
        resume point (serve --resume); else a ResumeWarning and the next whole epoch. A state of another
        seed, data key, world size, rank, batch size or drop_last raises InvalidArgument, and
        changes nothing: this consumer has not attached yet, so the producer has not moved."""
        required = ("epoch", "samples_seen_in_epoch", "seed", "data_key", "rank", "world_size")
        missing = [k for k in required if k not in state]
        if missing:
            raise _lib.InvalidArgument("not a coloader.Loader state (missing %s)" % ", ".join(missing), _lib.E_INVALID)
        seed, data_key = self._producer_identity()
        # What a position means: the data, the seed, the split (world size, rank, batch size).
        # Not the group's name, which torchrun derives from its rendezvous (a restart on another
        # port is the same job).
        mismatches = []
        for what, saved, here in (("seed", state["seed"], seed), ("data key", state["data_key"], data_key),
                                  ("world size", state["world_size"], self.world_size),
                                  ("rank", state["rank"], self.rank),
                                  ("batch size", state.get("batch_size", self.batch_size), self.batch_size),
                                  ("drop_last", bool(state.get("drop_last", self.drop_last)), self.drop_last)):
            if saved != here:
                mismatches.append("%s %r in the state, %r here" % (what, saved, here))
        position = (state["samples_seen_in_epoch"], state["epoch"], state.get("split_begin", 0),
                    state.get("split_origin", 0))
        if any(not isinstance(v, int) or v < 0 for v in position):
            mismatches.append("a negative or non-integer position (epoch %r, samples %r, split_begin %r, split_origin %r)"
                              % (state["epoch"], state["samples_seen_in_epoch"], state.get("split_begin", 0),
                                 state.get("split_origin", 0)))
        if mismatches:
            raise _lib.InvalidArgument("coloader.Loader(%r) cannot resume this state: %s" % (self.name, "; ".join(mismatches)),
                                       _lib.E_INVALID)
        if not self._started:
            # Nothing read yet: resume on this connection (what was published meanwhile waits).
            _lib.check(_lib.lib().coloader_consumer_resume_origin(self._require_open(), int(state["epoch"]),
                                                                 int(state.get("split_begin", 0)),
                                                                 int(state["samples_seen_in_epoch"]),
                                                                 int(state.get("split_origin", 0))))
        else:
            # Mid-run: leave and come back asking for the saved point.
            self._discard_ahead()
            self._session = None
            self._connect(self._options(resume=state))
        self._resume_warned = False
        self._resumed = True
        self._first, self._pass_yielded = None, 0  # the next iter() is the saved epoch's rest, not a peek's
        self._generation += 1  # iterators made before end
