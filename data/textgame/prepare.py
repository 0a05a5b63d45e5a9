"""Prepare text-game data (like nanoGPT's data/*/prepare.py).

    python data/textgame/prepare.py                      # simulator splits -> data/textgame/{train,val,test}.jsonl
    python data/textgame/prepare.py --n_train 5000 --seed 1 --out_dir /tmp/tg
    python data/textgame/prepare.py --bytesized32=IN.jsonl --out=OUT.jsonl   # convert real ByteSized32 records
    python data/textgame/prepare.py --bytesized32=IN.jsonl --out=OUT.jsonl --gpt_simulator=DIR
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
With --gpt_simulator=<a cognitiveailab/GPT-simulator checkout> each record also holds "prompt", the
paper's own prompt (`official_prompt`, the text RLVR-World's data pipeline builds; task.prompt_text
reads it), for its SFT models: train_lang.py renders it with the model's chat template.
"""
import argparse
import json
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


def convert_bytesized32(in_path, out_path, official=None) -> list[dict]:
    """Convert a ByteSized32-State-Prediction .jsonl file; ValueError naming the file and line.
    With `official` (load_official's dict) each record also holds the paper's prompt, "prompt"."""
    in_path = Path(in_path)
    if not in_path.is_file():
        raise ValueError(f"{in_path}: no such file")

    def convert(raw, where):
        record = convert_record(raw, where)
        try:
            if official is not None:
                record["prompt"] = official_prompt(raw, official)
        except KeyError as e:   # a key the prompt reads, or a game without rules
            raise ValueError(f"{where}: no {e} for the paper's prompt") from None
        return record

    records = load_jsonl(in_path, (), convert)   # malformed lines: named by file:line
    write_jsonl(out_path, records)
    return records


# -----------------------------------------------------------------------------
# the paper's prompt. RLVR-World's SFT and RLVR data (thuml/RLVR-World,
# lang_wm/data_process/text_game/process_jsonl.py and process_jsonl_train.py, which build the same
# prompt) use the "full" task with diff answers and the human-written rules of
# cognitiveailab/GPT-simulator: the task, one example game's rules and two worked examples (one
# action, one tick), the game's own rules, its state, UUID base and action. States are printed as
# Python prints a dict (str(): single quotes, True/None), exactly as there.

OFFICIAL_TASK = (
    "You are a simulator of a text game. Read the task description of a text game. Given the "
    "current game state in JSON, you need to decide the new game state after taking an action "
    "including the game score.\nYou may need to create new objects when you predict the new game "
    "state. You should assign the uuid of new objects starting from the UUID base given in the "
    "instructions.Your response should be in the JSON format. It should have three keys: "
    "'modified', 'removed', and 'score'. The 'modified' key stores a list of all the object states "
    "that are added or changed after taking the action. Keep it an empty list if no object is "
    "added or modified. The 'removed' key stores a list of uuids of the objects that are removed. "
    "Keep it an empty list if no object is removed. The 'score' key stores a JSON with three keys: "
    "'score', 'gameOver', and 'gameWon'. 'score' stores the current game score, 'gameOver' stores "
    "a bool value on whether the game is over, and 'gameWon' stores a bool value on whether the "
    "game is won. \nNote that while game states can be changed by actions, some game states may "
    "change over the time, which is described in the tick function of each object class. \n")
OFFICIAL_TWO = ("Here are two examples of both cases. Both examples are from the same example "
                "game.\n")
OFFICIAL_FIRST = "In the first example, the game state is changed by an action:\n"
OFFICIAL_SECOND = (
    "In the second example from the same example game, the game state is changed over the time. "
    "Note that while in this example the game state is changed by time only, it is possible that "
    "a game state is changed by both an action and time.\n")
OFFICIAL_END = ("\nPlease make sure to clearly indicate your answer by starting with 'The final "
                "answer is:'.\n")


def load_official(sim_dir) -> dict:
    """What official_prompt reads from a cognitiveailab/GPT-simulator checkout: the human-written
    rules of every game, the example game, its two examples (data/examples.json, "full") and
    whether the tick example is shown (the example game has states that only time changes)."""
    def read(rel):
        path = Path(sim_dir) / rel
        if not path.is_file():
            raise ValueError(f"{path}: no such file (--gpt_simulator: a GPT-simulator checkout)")
        return json.loads(path.read_text())
    rules = {k: read(f"rules/human_written_rules/{k}_rules.json") for k in ("object", "action",
                                                                             "score")}
    game = read("experiments/games.json")["example"]
    dyn = read("data/dynamic_states.json")[game]
    return {"rules": rules, "example_game": game, "examples": read("data/examples.json")["full"],
            "tick_example": any(s not in dyn["action_change"] for s in dyn["time_change"])}


def _game_state(objects, score) -> dict:
    return {"game_state": objects + [score]}


def _official_diff(raw) -> dict:
    """The worked example's answer, as GPT-simulator's make_game_state_partial writes it: objects
    whose listed properties or contents (in any order) changed, removed uuids, the next score
    when any of its values changed, else {}. (Its examples create no object, so the official
    code's handling of new objects is not needed here.)"""
    after = {o["uuid"]: o for o in raw["tick_state"]["objects"]}
    modified, removed = [], []
    for obj in raw["current_state"]["objects"]:
        new = after.get(obj["uuid"])
        if new is None:
            removed.append(obj["uuid"])
        elif (any(k not in new["properties"] or new["properties"][k] != v
                  for k, v in obj["properties"].items())
              or sorted(obj["contains"]) != sorted(new["contains"])):
            modified.append(new)
    score, next_score = raw["current_score_state"], raw["next_score_state"]
    changed = any(score[k] != next_score[k] for k in score)
    return {"modified": modified, "removed": removed, "score": next_score if changed else {}}


def _rules(official, game, suffix) -> str:
    """A game's object, action and score rules, with the prompt's headings (suffix: '' or
    ' in the example game'); object rules lose their last '=========='-separated part."""
    obj, act, score = (official["rules"][k][game] for k in ("object", "action", "score"))
    obj = "".join(obj.split("==========")[:-1])
    score_head = ("Here is a description of the score function of the example game:\n" if suffix
                  else "Here is a description of the game score function:\n")
    return (f"Here are the descriptions of all game objects properties{suffix}:\n{obj.strip()}\n"
            f"Here are the descriptions of all game actions{suffix}:\n{act.strip()}\n"
            f"{score_head}{score.strip()}\n")


def _state_text(raw) -> str:
    state = _game_state(raw["current_state"]["objects"], raw["current_score_state"])
    return (f"Here is the game state:\n{state}\n\n"
            f"The current game UUID base is {raw['current_state']['max_UUID']}\n")


def _example_text(raw) -> str:
    return (_state_text(raw) + f"The action to take is: {raw['tick_state']['lastAction']}\n"
            f"The expected response is:\n{_official_diff(raw)}\n\n")


def official_prompt(raw: dict, official: dict) -> str:
    """The user message RLVR-World's data pipeline builds for one raw ByteSized32 record."""
    ex, tick = official["examples"], official["tick_example"]
    text = OFFICIAL_TASK + (OFFICIAL_TWO if tick else "")
    text += f"Example game task description:\n{ex['action']['current_state']['taskDesc']}\n"
    text += _rules(official, official["example_game"], " in the example game")
    text += (OFFICIAL_FIRST if tick else "") + _example_text(ex["action"])
    if tick:
        text += OFFICIAL_SECOND + _example_text(ex["tick"])
    text += ("Here is the game that you need to simulate:\nTask Description:\n"
             f"{raw['current_state']['taskDesc']}\n" + _rules(official, raw["game"], ""))
    text += _state_text(raw) + f"The action to take is:\n{raw['tick_state']['lastAction']}\n"
    return text + OFFICIAL_END


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--n_train", type=int, default=DEFAULT_SIZES["train"])
    parser.add_argument("--n_val", type=int, default=DEFAULT_SIZES["val"])
    parser.add_argument("--n_test", type=int, default=DEFAULT_SIZES["test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out_dir", default=str(DATA_DIR), help="where the simulator splits go")
    parser.add_argument("--bytesized32", help="convert this ByteSized32-State-Prediction .jsonl instead")
    parser.add_argument("--out", help="output .jsonl of the conversion (with --bytesized32)")
    parser.add_argument("--gpt_simulator", help="with --bytesized32: a cognitiveailab/"
                        "GPT-simulator checkout; each record gets the paper's prompt")
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
            official = args.gpt_simulator and load_official(args.gpt_simulator)
            records = convert_bytesized32(args.bytesized32, args.out, official or None)
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
