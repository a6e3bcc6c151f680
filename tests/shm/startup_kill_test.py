#!/usr/bin/env python3
"""Stale state from a crashed producer (issue 17): SIGKILL at each point of start-up and in
steady state, then `coloader status` lists what it left, `coloader clean` removes it (a dry run
first), or the next producer of the name reclaims it and says so in one line; a live
producer's files are never touched.

The kill points are deterministic: COLOADER_TEST_CRASH_AT=<point> makes `coloader serve`
SIGKILL itself right after that step of start-up (producer/producer.cc, CrashPointForTest):

  lock       the name's lock file is taken (nothing else made yet)
  ring       + the ring in /dev/shm
  mailboxes  + the consumers' mailboxes in /dev/shm
  bind       + the socket in the run directory
  serving    (steady state: killed from here while consumers read)

    tests/shm/startup_kill_test.py --coloader build/tools/coloader
Exit 0: pass; 1: a check failed.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stress"))
import harness  # noqa: E402

IMAGES = 97
# What a crash at each point leaves: kinds as `coloader status` names them.
LEFT = {
    "lock": {"lock"},
    "ring": {"lock", "ring"},
    "mailboxes": {"lock", "ring", "mailboxes"},
    "bind": {"lock", "ring", "mailboxes", "socket"},
    "serving": {"lock", "ring", "mailboxes", "socket"},
}
SERVE = ["--batch-size", "8", "--image-size", "32", "--workers", "2", "--window", "4", "--output", "uint8",
         "--heartbeat-ms", "100", "--heartbeat-timeout-ms", "2000"]

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def cli_json(s, *args):
    r = subprocess.run([s.binary, *args, "--json"], env=s.env, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None, r
    return json.loads(r.stdout.splitlines()[0]), r


def leftovers_of(s, name):
    """(kind set, listing) of `name` in `coloader status --json` (no name: the leftovers)."""
    doc, r = cli_json(s, "status")
    check(doc is not None, f"status lists leftovers (rc {r.returncode}: {r.stderr[-300:]!r})")
    items = [l for l in (doc or {}).get("leftovers", []) if l["name"] == name]
    return {l["kind"] for l in items}, items


def crash(s, name, data, point):
    """Starts a producer that dies at `point`; returns once it is dead."""
    if point == "serving":
        p = s.serve(name, data, SERVE + ["--forever"])
        c = s.spawn(["consume", "--name", name, "--json", "--batch-size", "5"], f"consume-{name}")
        # Wait for the consumer to be reading (it has released a batch): the steady state, not
        # start-up, and past its handshake (a Welcome still queued when the producer dies never
        # reaches it, and that is another story than this test's).
        deadline = time.monotonic() + 30
        reading = False
        while not reading and time.monotonic() < deadline and p.poll() is None:
            st = s.status(name)
            reading = bool(st and any(x["acked"] > 0 for x in st["consumers"]))
            if not reading:
                time.sleep(0.02)
        check(reading, f"{point}: a consumer was reading before the kill")
        p.signal(signal.SIGKILL)
        p.wait(10)
        rc = c.wait(30)
        check(rc == 1 and ("exited without saying goodbye" in c.stderr() or "went silent" in c.stderr()),
              f"{point}: the consumer reported the producer's death clearly (rc {rc}: {c.stderr()[-200:]!r})")
        return p
    env = dict(s.env, COLOADER_TEST_CRASH_AT=point)
    p = harness.Proc([s.binary, "serve", "--data", data, "--name", name, "--quiet"] + SERVE + ["--epochs", "1"],
                     env, s.logs, f"crash-{point}")
    s.pids.append(p.pid)
    rc = p.wait(60)
    check(rc == -signal.SIGKILL, f"{point}: the producer died by SIGKILL at the hook (rc {rc}: {p.stderr()[-300:]!r})")
    return p


def exact_epoch(s, name, data, tag):
    """A new producer of `name` serves one exact epoch to a consumer; returns its stderr."""
    p = s.serve(name, data, SERVE + ["--epochs", "1"])
    c = s.spawn(["consume", "--name", name, "--json", "--batch-size", "13"], f"consume-{name}")
    rc = c.wait(60)
    lines = [json.loads(l) for l in c.stdout().splitlines() if l.strip()]
    ok = rc == 0 and len(lines) == 1 and lines[0]["samples"] == IMAGES and lines[0]["unique_samples"] == IMAGES \
        and lines[0]["index_sum"] == IMAGES * (IMAGES - 1) // 2
    check(ok, f"{tag}: the next producer serves an exact epoch (rc {rc}: {lines} {c.stderr()[-200:]!r})")
    check(p.wait(30) == 0, f"{tag}: it exits 0")
    return p.stderr()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coloader", required=True)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    s = harness.Session(os.path.abspath(a.coloader), keep=a.keep)
    try:
        data = os.path.join(s.tmp, "data")
        harness.make_dataset(data, IMAGES, seed=5)
        # A live producer beside all of this: nothing of it may ever be listed or removed.
        live = s.serve("live", data, SERVE + ["--forever"])
        live_shm, live_run = s.leftovers("live")

        for i, point in enumerate(LEFT):
            name = f"crash-{point}"
            crash(s, name, data, point)
            kinds, items = leftovers_of(s, name)
            check(kinds == LEFT[point], f"{point}: status lists {sorted(kinds)}, wanted {sorted(LEFT[point])}")
            if any(l["name"] == "live" for l in leftovers_of(s, "live")[1]):
                check(False, f"{point}: the live producer is listed as a leftover")
            # The dry run removes nothing.
            doc, _ = cli_json(s, "clean")
            check(doc is not None and not doc["removed"], f"{point}: clean without --yes is a dry run")
            check(leftovers_of(s, name)[0] == LEFT[point], f"{point}: ...and everything is still there")
            if i % 2 == 0:
                # Taken back by the next producer of the name, in one line naming what.
                err = exact_epoch(s, name, data, point)
                lines = [l for l in err.splitlines() if "reclaimed" in l]
                shm_left = LEFT[point] & {"ring", "mailboxes", "socket"}
                if shm_left:
                    check(len(lines) == 1 and "(pid " in lines[0] and all(k in lines[0] for k in
                                                   ((".mbox",) if "mailboxes" in shm_left else ()) +
                                                   ((".sock",) if "socket" in shm_left else ())),
                          f"{point}: the next producer said in one line what it reclaimed: {lines}")
                else:
                    check(not lines, f"{point}: nothing to reclaim, nothing said: {lines}")
            else:
                doc, r = cli_json(s, "clean", "--yes")
                got = {l["kind"] for l in (doc or {}).get("leftovers", []) if l["name"] == name}
                check(doc is not None and doc["removed"] and got == LEFT[point],
                      f"{point}: clean --yes removed {sorted(got)} ({r.stderr[-200:]!r})")
            shm, run = s.leftovers(name)
            check(not shm and not run, f"{point}: nothing of it left afterwards ({shm}, {run})")

        # The live producer: untouched, and still serving exact epochs.
        check(s.leftovers("live") == (live_shm, live_run) and live.poll() is None,
              "the live producer's ring, mailboxes, socket and lock were never touched")
        c = s.spawn(["consume", "--name", "live", "--json", "--batch-size", "7", "--epochs", "1"], "consume-live")
        rc = c.wait(60)
        lines = [json.loads(l) for l in c.stdout().splitlines() if l.strip()]
        check(rc == 0 and lines and lines[-1]["unique_samples"] == lines[-1]["samples"],
              f"the live producer still serves ({rc}: {lines})")
        live.signal(signal.SIGTERM)
        check(live.wait(30) == 0, "the live producer stops cleanly")
        check(s.leftovers("live") == ([], []), "and leaves nothing")
    finally:
        for pid in s.pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        if a.keep:
            print("logs in", s.logs)
        s.close()
    print("startup kill:", "PASS" if not failures else f"FAIL ({len(failures)})", flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
