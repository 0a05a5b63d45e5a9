"""Prepare text-game data (like nanoGPT's data/*/prepare.py).

    python data/textgame/prepare.py                      # simulator splits -> data/textgame/{train,val,test}.jsonl
    python data/textgame/prepare.py --n_train 5000 --seed 1 --out_dir /tmp/tg
    python data/textgame/prepare.py --bytesized32=IN.jsonl --out=OUT.jsonl   # convert real ByteSized32 records
    python data/textgame/prepare.py --cover                  # coverage splits -> data/textgame/cover/
    python data/textgame/prepare.py --compose                # composition split -> data/textgame/compose.jsonl

Coverage splits (`--cover`, or `--data_dir=data/textgame/cover` in train_lang.py, which makes them when
the folder holds none). At each state of the scripted trajectories, random *valid* actions
(simulator.valid_actions, the planner's candidates) other than the one the episode takes there, with their
true outcomes, marked
"source": "offscript" (the loaders keep extra keys). cover/train.jsonl is the scripted train.jsonl, record
for record, followed by --per_state off-script records at each of its states; cover/val.jsonl and
cover/test.jsonl hold only off-script records, one at each state of the scripted val and test records.

Composition split (`--compose`, or eval.py `--data=data/textgame/compose.jsonl`, which makes it when it is
missing): 1,000 simulator records whose pattern (simulator.pattern: the game, the multiset of object types in
the room, the action, IDs stripped) never occurs in <out_dir>/train.jsonl (generated first if missing). Its
episodes come from a random stream of their own, in rooms that hold the egg+fridge combination held out of
train where the game allows it (cook-egg, chill-milk, pack-box) and rooms of any layout otherwise; every
generated record whose pattern occurs in train is dropped. With the default train split (seed 0): 789
generated records dropped, 1000 kept, 509 of them changed (50.9%), 872 in egg+fridge rooms (490 changed)
and 128 in other rooms (19 changed; actions those rooms never saw in train, mostly impossible ones).

Simulator splits come from data/textgame/simulator.py (see its docstring for the world, the held-out
combination and the statistics). Files are written atomically (a temporary file, then os.replace), so an
interrupted run never leaves a half-written split that `ensure_splits` would then trust.

ByteSized32 conversion follows RLVR-World's "full" state-prediction task: the input is the state before the
action (`current_state.objects` + `current_score_state`) and the action (`tick_state.lastAction`); the target
is the state after the action AND the world's tick (`tick_state.objects` + `next_score_state`). Objects
keep only name, uuid, type, properties and contains; the text fields (observation, look, ...) are dropped.
"""
import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from checkpoint import write_jsonl  # noqa: E402
from data.jsonl import load_jsonl  # noqa: E402
from data.textgame.simulator import generate_compose, generate_cover, generate_split, pattern  # noqa: E402
from data.textgame.task import is_changed, load_records  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent
COVER_DIR = DATA_DIR / "cover"
DEFAULT_SIZES = {"train": 20000, "val": 500, "test": 2000}  # test: resolves a 2-point paired difference
COMPOSE_PATH = DATA_DIR / "compose.jsonl"
COMPOSE_N = 1000   # the composition split's records
OBJECT_KEYS = ("name", "uuid", "type", "properties", "contains")
SCORE_KEYS = ("score", "gameOver", "gameWon")


def summary(name: str, records: list[dict]) -> str:
    changed = sum(map(is_changed, records))
    return f"{name}: {len(records)} records, {changed} changed ({changed / max(len(records), 1):.1%})"


def ensure_splits(data_dir=DATA_DIR, n_train: int = DEFAULT_SIZES["train"], n_val: int = DEFAULT_SIZES["val"],
                  n_test: int = DEFAULT_SIZES["test"], seed: int = 0, verbose: bool = True) -> dict[str, Path]:
    """Paths of train/val/test.jsonl in data_dir, generating the ones that are missing (in COVER_DIR: all
    three coverage splits, see make_cover)."""
    data_dir = Path(data_dir)
    if data_dir.resolve() == COVER_DIR.resolve():
        paths = {split: data_dir / f"{split}.jsonl" for split in DEFAULT_SIZES}
        if all(path.exists() for path in paths.values()):
            return paths
        return make_cover(data_dir, n_train, n_val, n_test, seed, verbose=verbose)
    paths = {split: data_dir / f"{split}.jsonl" for split in DEFAULT_SIZES}
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    # every missing split is generated before any is written: a run killed while generating leaves none
    made = {split: generate_split(split, sizes[split], seed) for split in paths if not paths[split].exists()}
    for split, records in made.items():
        write_jsonl(paths[split], records)
        if verbose:
            print(f"wrote {paths[split]}  " + summary(split, records))
    return paths


def make_cover(out_dir, n_train: int = DEFAULT_SIZES["train"], n_val: int = DEFAULT_SIZES["val"],
               n_test: int = DEFAULT_SIZES["test"], seed: int = 0, per_state: int = 1,
               verbose: bool = True) -> dict[str, Path]:
    """Write the coverage splits into out_dir (see the docstring); -> {split: path}."""
    paths = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        scripted, offscript = generate_cover(split, n, seed, per_state if split == "train" else 1)
        records = scripted + offscript if split == "train" else offscript
        paths[split] = Path(out_dir) / f"{split}.jsonl"
        write_jsonl(paths[split], records)
        if verbose:
            extra = "; " + summary("off-script", offscript) if split == "train" else " (all off-script)"
            print(f"wrote {paths[split]}  " + summary(split, records) + extra)
    return paths


def make_compose(out_dir=DATA_DIR, n: int = COMPOSE_N, seed: int = 0, verbose: bool = True, **sizes) -> Path:
    """Write <out_dir>/compose.jsonl: n records whose pattern never occurs in <out_dir>/train.jsonl
    (the splits are generated first where missing, sizes: ensure_splits' n_train, n_val, n_test)."""
    train = load_records(ensure_splits(out_dir, seed=seed, verbose=verbose, **sizes)["train"])
    records, dropped = generate_compose(n, {pattern(r) for r in train}, seed)
    path = Path(out_dir) / "compose.jsonl"
    write_jsonl(path, records)
    if verbose:
        print(f"wrote {path}  " + summary("compose", records)
              + f"; dropped {dropped} generated records whose pattern occurs in train")
    return path


def ensure_compose(data_dir=DATA_DIR, verbose: bool = True) -> Path:
    """The path of <data_dir>/compose.jsonl, made with make_compose's defaults if it is missing."""
    path = Path(data_dir) / "compose.jsonl"
    return path if path.exists() else make_compose(data_dir, verbose=verbose)


def _state(objects, score, where: str, key: str) -> dict:
    if not isinstance(objects, list) or not isinstance(score, dict):
        raise ValueError(f"{where}: '{key}' has no objects list or no score object")
    kept = []
    for obj in objects:
        if not isinstance(obj, dict) or any(k not in obj for k in OBJECT_KEYS):
            raise ValueError(f"{where}: an object in '{key}' lacks one of {list(OBJECT_KEYS)}")
        kept.append({k: obj[k] for k in OBJECT_KEYS})
    return {"objects": kept, "score": {k: score[k] for k in SCORE_KEYS}}


def convert_record(raw: dict, where: str = "record") -> dict:
    """One ByteSized32-State-Prediction record -> our record format ("full" task)."""
    try:
        return {"game": raw["game"],
                "state": _state(raw["current_state"]["objects"], raw["current_score_state"], where, "current_state"),
                "action": raw["tick_state"]["lastAction"],
                "next_state": _state(raw["tick_state"]["objects"], raw["next_score_state"], where, "tick_state")}
    except (KeyError, TypeError) as e:
        problem = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise ValueError(f"{where}: not a ByteSized32 state-prediction record ({problem})") from None


def convert_bytesized32(in_path, out_path) -> list[dict]:
    """Convert a ByteSized32-State-Prediction .jsonl file; ValueError naming the file and line."""
    in_path = Path(in_path)
    if not in_path.is_file():
        raise ValueError(f"{in_path}: no such file")
    records = load_jsonl(in_path, (), convert_record)   # malformed lines: named by file:line
    write_jsonl(out_path, records)
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--n_train", type=int, default=DEFAULT_SIZES["train"])
    parser.add_argument("--n_val", type=int, default=DEFAULT_SIZES["val"])
    parser.add_argument("--n_test", type=int, default=DEFAULT_SIZES["test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out_dir", default=str(DATA_DIR), help="where the simulator splits go")
    parser.add_argument("--bytesized32", help="convert this ByteSized32-State-Prediction .jsonl instead")
    parser.add_argument("--out", help="output .jsonl of the conversion (with --bytesized32)")
    parser.add_argument("--cover", action="store_true", help="write the coverage splits to <out_dir>/cover/")
    parser.add_argument("--per_state", type=int, default=1, help="with --cover: off-script train records per state")
    parser.add_argument("--compose", action="store_true",
                        help="write the composition split to <out_dir>/compose.jsonl (splits made if missing)")
    parser.add_argument("--n_compose", type=int, default=COMPOSE_N, help="with --compose: its records")
    args = parser.parse_args(argv)
    if args.per_state < 1:
        parser.error("--per_state must be at least 1")
    if args.n_compose < 1:
        parser.error("--n_compose must be at least 1")
    if args.bytesized32 is not None:   # given, even empty: convert, never generate
        if not args.bytesized32 or not args.out:
            parser.error("--bytesized32 needs a ByteSized32 .jsonl file and --out")
        try:   # a missing, unreadable or malformed file: one line naming it (and the line)
            records = convert_bytesized32(args.bytesized32, args.out)
        except (OSError, ValueError) as e:
            sys.exit(f"error: {e}")
        print(f"wrote {args.out}  " + summary("bytesized32", records))
        return
    if args.cover:
        make_cover(Path(args.out_dir) / "cover", args.n_train, args.n_val, args.n_test, args.seed, args.per_state)
        return
    if args.compose:
        make_compose(args.out_dir, args.n_compose, args.seed, n_train=args.n_train, n_val=args.n_val,
                     n_test=args.n_test)
        return
    for split, n in (("train", args.n_train), ("val", args.n_val), ("test", args.n_test)):
        records = generate_split(split, n, args.seed)
        path = Path(args.out_dir) / f"{split}.jsonl"
        write_jsonl(path, records)
        print(f"wrote {path}  " + summary(split, records))


if __name__ == "__main__":
    main()
