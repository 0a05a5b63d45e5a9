"""Write the embedded robot-pushing data set: one .npz per episode, in the format RT-1 converters write.

    python data/robot/prepare.py                      # data/robot/{train,val,test}/*.npz + action_stats.json
    python data/robot/prepare.py --train=200 --out=/tmp/robot

Each file holds `image` (T, 64, 64, 3) uint8 and `action` (T, 2) float32 — exactly the keys of the official
RLVR-World/iVideoGPT converter for RT-1 and other Open X-Embodiment datasets, so a directory of converted RT-1
episodes trains with the same code — plus three keys only our generator writes: `background` (the scene without
gripper and blocks, used by the object-preservation check), `success` and `noise` (the policy's action noise).

Splits are generated from separate random streams (seed, split), so test episodes are held out: no scene of the
test split is ever trained on. Policy quality is graded: episode i uses action noise NOISE_LEVELS[i % 4], so every
split mixes expert, slightly noisy, noisy and near-random behaviour (diverse actions teach action conditioning).
`action_stats.json` (per-dimension min and max over the train split) fixes the 256 action bins, as for RT-1.
"""
import argparse
import copy
import itertools
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.robot import sim  # noqa: E402
from data.robot.task import write_action_stats  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent
DEFAULT_SIZES = {"train": 1000, "val": 32, "test": 64}
SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
LENGTH = 16


def split_episodes(split, seed=0, length=LENGTH):
    """The episodes of one split in order, each drawn from the split's one random stream -> an
    endless generator of (a copy of the stream where the episode begins, the episode). The copy
    replays the episode's scene (sim.replay), so any action can be tried from any of its frames."""
    rng = np.random.default_rng([seed, SPLIT_IDS[split]])
    for i in itertools.count():
        start = copy.deepcopy(rng)
        yield start, sim.episode(rng, length, sim.NOISE_LEVELS[i % len(sim.NOISE_LEVELS)])


def generate_split(out_dir, split, n, seed=0, length=LENGTH):
    """Write n episodes of one split to out_dir/split/00000.npz ... -> success rate."""
    folder = Path(out_dir) / split
    folder.mkdir(parents=True, exist_ok=True)
    wins = 0
    for i, (_, ep) in zip(range(n), split_episodes(split, seed, length)):
        np.savez_compressed(folder / f"{i:05d}.npz", **ep)
        wins += bool(ep["success"])
    return wins / max(n, 1)


def remove_stale_partials(data_dir, min_age=600):
    """Delete the `.partial-<pid>` folders that runs killed while generating left in data_dir:
    those whose process is gone and in which nothing changed for min_age seconds. A live run's
    folder is never touched (POSIX only: elsewhere nothing is deleted)."""
    if os.name != "posix":
        return
    for folder in Path(data_dir).glob(".partial-*"):
        pid = folder.name.removeprefix(".partial-")
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:   # newest change: the folder itself or a split being written in it
            changed = max(f.stat().st_mtime for f in [folder, *folder.iterdir()])
            os.kill(int(pid), 0)           # signal 0 only asks whether the process exists
        except ProcessLookupError:         # its process is gone
            if time.time() - changed >= min_age:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:                    # vanished meanwhile, or alive under another user
            continue


def ensure_splits(data_dir=DATA_DIR, sizes=None, seed=0, verbose=True):
    """Generate every split and action_stats.json when data_dir holds no split (all in a temporary folder, moved into
    place once complete, so a killed run leaves no partial split that a re-run would trust); a folder of splits without
    action_stats.json gets one. A folder with some split folders but not all is a ValueError naming the missing ones:
    it is never topped up."""
    data_dir = Path(data_dir)
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    remove_stale_partials(data_dir)       # left by runs killed while generating
    present = [split for split in sizes if (data_dir / split).is_dir()]
    if present and len(present) < len(sizes):
        missing = [f"{split}/" for split in sizes if split not in present]
        raise ValueError(f"{data_dir}: has {', '.join(f'{s}/' for s in present)} but not {', '.join(missing)}; "
                         f"delete the others to have all generated again")
    if not present:
        # written in a folder of this process's own, then moved: a killed run leaves no half split, and
        # two runs started at once on a fresh checkout do not write into each other's files
        partial = data_dir / f".partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        for split, n in sizes.items():
            t0 = time.time()
            rate = generate_split(partial, split, n, seed)
            if verbose:
                print(f"wrote {n} {split} episodes to {data_dir / split} ({rate:.0%} reach the goal, "
                      f"{time.time() - t0:.0f}s)")
        # the action bins first (replacing a file is atomic, and a twin's are the same): splits in
        # place always have their bins beside them
        write_action_stats(partial)
        os.replace(partial / "action_stats.json", data_dir / "action_stats.json")
        for split in sizes:
            try:
                os.replace(partial / split, data_dir / split)
            except OSError:   # another run moved its copy (the same seeded episodes) there first
                if not (data_dir / split).is_dir():
                    raise
        shutil.rmtree(partial, ignore_errors=True)
    if not (data_dir / "action_stats.json").is_file():
        write_action_stats(data_dir)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--out", default=str(DATA_DIR))
    for split, n in DEFAULT_SIZES.items():
        p.add_argument(f"--{split}", type=int, default=n, help=f"{split} episodes")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if min(a.train, a.val, a.test) < 1:
        p.error("--train, --val and --test must be >= 1")
    try:
        ensure_splits(a.out, {"train": a.train, "val": a.val, "test": a.test}, a.seed)
    except ValueError as e:   # a folder with some splits: one line
        sys.exit(f"error: {e}")
