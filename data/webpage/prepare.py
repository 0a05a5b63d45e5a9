"""Make the web-page splits (like nanoGPT's prepare.py), or check and normalise your own JSONL.

    python data/webpage/prepare.py                                  # data/webpage/{train,val,test}.jsonl
    python data/webpage/prepare.py --out_dir=/tmp/web --n_train=5000 --seed=1
    python data/webpage/prepare.py --import=my_trajectories.jsonl --out=data/mine/train.jsonl
    python data/webpage/prepare.py --cover                          # coverage splits -> data/webpage/cover/

Generated splits come from data/webpage/simulator.py (seeded; val and test use their own random streams
and pages that train never shows, see its docstring). Files are written atomically (a .tmp file, then a
rename), so an interrupted run never leaves a half-written split behind.

Your own data. Each line is {"observation": tree text, "action": "click [12]", "next_observation":
tree text} with an optional "site" (see data/webpage/task.py); WebArena trajectories become this by
pairing each step's accessibility tree with the next step's. `--import` reads such a file with the
same checks as training (a clear error naming the file and line), normalises it (missing site -> "web",
Windows line ends, blank lines and trailing spaces removed from the trees, runs of spaces in the action
made single) and writes it to --out. Put your train.jsonl, val.jsonl and test.jsonl in one folder and
pass it as --data_dir to train_lang.py (one file of it as --data to eval.py); its files are used as they
are, and a folder lacking one of them is an error (only data/webpage and data/webpage/cover are generated).

Coverage splits (`--cover`, or `--data_dir=data/webpage/cover` in train_lang.py, which makes them when
the folder holds none). On each page of the scripted episodes, random *valid* actions (simulator.valid_actions, the
planner's candidates, with a text of the kind the page's fields take) other than the one the episode takes
there, with their true outcomes, marked "source": "offscript" (load_records keeps extra keys).
cover/train.jsonl is the scripted train.jsonl, record for record, followed by --per_state off-script
records on each of its pages; cover/val.jsonl and cover/test.jsonl hold only off-script records, one on
each page of the scripted val and test records.
"""
import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from checkpoint import write_jsonl  # noqa: E402
from data.webpage.simulator import generate_cover, generate_split  # noqa: E402
from data.webpage.task import DEFAULT_SITE, is_changed, load_records, prompt_text, target_text  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent
COVER_DIR = DATA_DIR / "cover"
SPLITS = ("train", "val", "test")
DEFAULT_SIZES = {"train": 20000, "val": 500, "test": 2000}  # test: resolves a 2-point paired difference


def summary(records: list[dict]) -> str:
    """One line of statistics: count, unchanged share, mean prompt / target characters, lines per page."""
    unchanged = 1 - sum(map(is_changed, records)) / len(records)
    prompt = statistics.mean(len(prompt_text(r)) for r in records)
    target = statistics.mean(len(target_text(r)) for r in records)
    lines = [len(r["observation"].splitlines()) for r in records]
    return (f"{len(records)} records, {unchanged:.1%} unchanged, mean prompt {prompt:.0f} chars, "
            f"mean target {target:.0f} chars, {statistics.mean(lines):.1f} lines per page (max {max(lines)})")


def make_splits(out_dir, n_train: int = DEFAULT_SIZES["train"], n_val: int = DEFAULT_SIZES["val"],
                n_test: int = DEFAULT_SIZES["test"], seed: int = 0, verbose: bool = True) -> dict[str, Path]:
    """Generate all three splits, then write them into out_dir (a run killed while generating leaves
    none); -> {split: path}."""
    paths = {}
    made = {split: generate_split(split, n, seed) for split, n in zip(SPLITS, (n_train, n_val, n_test))}
    for split, records in made.items():
        paths[split] = Path(out_dir) / f"{split}.jsonl"
        write_jsonl(paths[split], records)
        if verbose:
            print(f"{split}: {summary(records)} -> {paths[split]}")
    return paths


def make_cover(out_dir, n_train: int = DEFAULT_SIZES["train"], n_val: int = DEFAULT_SIZES["val"],
               n_test: int = DEFAULT_SIZES["test"], seed: int = 0, per_state: int = 1,
               verbose: bool = True) -> dict[str, Path]:
    """Write the coverage splits into out_dir (see the docstring); -> {split: path}."""
    paths = {}
    for split, n in zip(SPLITS, (n_train, n_val, n_test)):
        scripted, offscript = generate_cover(split, n, seed, per_state if split == "train" else 1)
        records = scripted + offscript if split == "train" else offscript
        paths[split] = Path(out_dir) / f"{split}.jsonl"
        write_jsonl(paths[split], records)
        if verbose:
            extra = f"; off-script: {summary(offscript)}" if split == "train" else " (all off-script)"
            print(f"{split}: {summary(records)} -> {paths[split]}{extra}")
    return paths


def ensure_splits(data_dir=DATA_DIR, n_train: int = DEFAULT_SIZES["train"], n_val: int = DEFAULT_SIZES["val"],
                  n_test: int = DEFAULT_SIZES["test"], seed: int = 0, verbose: bool = True) -> dict[str, Path]:
    """The split files of data_dir, all three generated if none exists; -> {split: path}.

    A folder with some but not all of the three files is a ValueError rather than topped up with
    simulator data, so a folder of your own records is never silently mixed with ours. COVER_DIR gets the
    coverage splits (make_cover) instead of the scripted ones.
    """
    paths = {split: Path(data_dir) / f"{split}.jsonl" for split in SPLITS}
    present = [s for s in SPLITS if paths[s].is_file()]
    if len(present) == len(SPLITS):
        return paths
    if present:
        missing = [str(paths[s]) for s in SPLITS if s not in present]
        raise ValueError(f"{data_dir}: has {present} but not {missing}; add them or use another folder")
    make = make_cover if Path(data_dir).resolve() == COVER_DIR.resolve() else make_splits
    return make(data_dir, n_train, n_val, n_test, seed, verbose=verbose)


def normalise_tree(tree: str) -> str:
    """Unix line ends, no blank lines, no trailing spaces (leading indentation is kept)."""
    return "\n".join(line.rstrip() for line in tree.splitlines() if line.strip())


def import_file(src, dst) -> list[dict]:
    """Check a user's JSONL (ValueError naming file and line), normalise it, write it to dst."""
    records = [{"site": r["site"].strip() or DEFAULT_SITE,
                "observation": normalise_tree(r["observation"]),
                "action": " ".join(r["action"].split()),
                "next_observation": normalise_tree(r["next_observation"]),
                **({"prompt": r["prompt"]} if "prompt" in r else {})}   # the paper's, kept as is
               for r in load_records(src)]
    write_jsonl(Path(dst), records)
    return records


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--out_dir", default=str(DATA_DIR), help="where the splits go")
    for split in SPLITS:
        p.add_argument(f"--n_{split}", type=int, default=DEFAULT_SIZES[split], help=f"records in {split}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--import", dest="src", default=None, help="a JSONL of your own records to check")
    p.add_argument("--out", default=None, help="with --import: where the normalised copy goes")
    p.add_argument("--cover", action="store_true", help="write the coverage splits to <out_dir>/cover/")
    p.add_argument("--per_state", type=int, default=1, help="with --cover: off-script train records per page")
    args = p.parse_args(argv)
    if args.per_state < 1:
        p.error("--per_state must be at least 1")
    if args.src is not None:
        if args.out is None:
            p.error("--import needs --out")
        try:
            records = import_file(args.src, args.out)
        except (OSError, ValueError) as e:
            sys.exit(f"error: {e}")
        print(f"imported {summary(records)} -> {args.out}")
        return
    if args.cover:
        make_cover(Path(args.out_dir) / "cover", args.n_train, args.n_val, args.n_test, args.seed, args.per_state)
        return
    make_splits(args.out_dir, args.n_train, args.n_val, args.n_test, args.seed)


if __name__ == "__main__":
    main()
