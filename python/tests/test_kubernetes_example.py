"""The Kubernetes sketch (examples/kubernetes/coloader.yaml) parses and keeps the properties
docs/DISTRIBUTED.md says a deployment needs. No cluster: a YAML parse and structural checks."""

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "coloader.yaml"


def _docs():
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


def _pod(doc):
    return doc["spec"]["template"]["spec"]


def test_one_producer_per_node_and_ranks_share_its_ipc_namespace_and_run_dir():
    docs = _docs()
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "DaemonSet", "Job"], kinds
    for doc in docs[1:]:
        pod = _pod(doc)
        assert pod["hostIPC"] is True, doc["metadata"]["name"]
        env = {e["name"]: e for c in pod["containers"] for e in c.get("env", [])}
        assert env["COLOADER_RUN_DIR"]["value"] == "/run/coloader"
        mounts = {m["name"]: m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert mounts["dshm"] == "/dev/shm" and mounts["rundir"] == "/run/coloader"
        volumes = {v["name"]: v for v in pod["volumes"]}
        # The same tmpfs in both pods (the node's): a per-pod emptyDir would hide the ring.
        assert volumes["dshm"]["hostPath"]["path"] == "/dev/shm"
        assert volumes["rundir"]["hostPath"]["path"] == "/run/coloader"


def test_the_producer_serves_its_nodes_shard_with_the_flags_serve_takes():
    nodes_map, daemon, job = _docs()
    container = _pod(daemon)["containers"][0]
    script = container["args"][0]
    # The rank comes from the node's line in the ConfigMap (the downward API has no node labels).
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod(daemon)["volumes"]}
    assert volumes["nodes"]["configMap"]["name"] == nodes_map["metadata"]["name"]
    assert mounts["nodes"] + "/nodes" in script and "nodes" in nodes_map["data"]
    # The Job's pod runs on the node of its --node-rank line.
    node_names = nodes_map["data"]["nodes"].split()
    command = _pod(job)["containers"][0]["command"]
    job_rank = int(next(a for a in command if a.startswith("--node-rank=")).split("=")[1])
    assert _pod(job)["nodeSelector"]["kubernetes.io/hostname"] == node_names[job_rank]
    assert f"--nnodes={len(node_names)}" in command
    serve = script[script.index("exec coloader serve"):]
    args = shlex.split(serve.replace('"$NODE_RANK"', "NODE_RANK").replace('"$NNODES"', "NNODES"))
    assert args[:3] == ["exec", "coloader", "serve"]
    flags, rest = {}, args[3:]
    while rest:  # --flag [value]
        flag = rest.pop(0)
        flags[flag] = rest.pop(0) if rest and not rest[0].startswith("--") else None
    assert flags["--rank"] == "NODE_RANK" and flags["--world-size"] == "NNODES"
    assert flags["--name"] == "imagenet"
    # The flags are serve's own: every one appears in the README's flag table.
    readme = (EXAMPLE.parents[2] / "README.md").read_text()
    for flag in flags:
        assert re.search(r"(?<![\w-])" + re.escape(flag) + r"\b", readme), flag
