"""A small procedural text-game world in the spirit of ByteSized32, to make world-model training data.

Why our own world? ByteSized32-State-Prediction states are 1-4k characters long (a dozen objects with
five to ten properties each), far too much for a GPT of a few million parameters trained on a CPU. This
world keeps the same record schema and the same kinds of dynamics (containment, appliances, heat, plants,
objects created and destroyed, a score), but its states are short: 4-7 objects with 0-2 properties each,
a prompt of about 600 characters and an answer of about 135.

The world. One room holds the agent (uuid 0, whose `contains` is the inventory) and 3-5 objects
(one more while water exists):
    stove, sink      appliances: isOn; things are put "in" them (a pot or cup on the stove, in the sink)
    fridge, box      containers: isOpen (must be open to put in or take out); immovable
    pot, cup         movable containers: a pot holds food, a cup holds water; pot has a temperature
    egg, bread       food: temp, isCooked; can be eaten
    milk, water      temp; water exists only in the cup: a running sink fills an empty cup in it
                     (a NEW object, uuid = largest + 1), and "water plant" pours it away (REMOVED)
    plant            water, growth
    knife            a tool without properties
Actions: look, inventory, wait, examine X, take X, put X in Y, open X, close X, turn on X, turn off X,
eat X, water plant, and nonsense. An impossible action (take the stove, open an open box, put an egg in a
cup) changes nothing, as in ByteSized32.

The tick. After every action the world updates itself, so some changes happen without the action:
temperatures move in steps of 10 (+20 per tick for anything in or under a running stove, up to 100;
-10 per tick inside the fridge, down to 0; otherwise 10 toward room temperature 20), food is cooked once
it reaches 80, a running sink fills an empty cup in it, and a plant with water drinks 1 and grows 1 (up to
3). Then the score is recomputed.

Games (goal, score = milestones reached, won at the goal; the episode ends when the game is over):
    cook-egg     egg in pot +1, egg cooked +1 and won; eating the egg loses
    water-plant  score = plant growth; won at growth 2
    chill-milk   milk in fridge +1, milk at 0 degrees +1 and won
    pack-box     +1 per item (knife, bread) in the box, +1 and won when both are in and the box is closed;
                 eating the bread loses
    boil-water   water in the cup +1, water at 100 degrees +1 and won
Each room is a game's core objects plus 0-3 distractors, in a random order (which fixes names and uuids).

Episodes. A scripted-ish agent plays from a random initial room (movable things sometimes start inside
containers, containers open or closed; games taken in turn): with probability 0.45 it takes the next step
of a scripted solution, otherwise a random action (mostly impossible ones), for at most 20 steps. Every
transition is recorded. The 0.45 makes about 45% of the transitions unchanged, as in ByteSized32.

Splits (`generate_split`). Each split has its own random stream (seeded by split name and seed), and each
room layout (game + ordered object list, which fixes every name and uuid) belongs to exactly one split by
a stable hash (80% train, 10% val, 10% test), so no state text is shared between splits. Held out: the
combination of an EGG and a FRIDGE in the same room never occurs in train or val; 40% of the test episodes
of the games that can have it do (cook-egg with a fridge, chill-milk with an egg, pack-box with both),
about a fifth of the test records, to test whether learned rules (the fridge cools what is in it, an egg
cooks, eggs can be taken out of and put into things) compose.

Composition split (`generate_compose`, prepare.py --compose). Records whose pattern (`pattern`: the game,
the sorted object types of the room, the action; no IDs) never occurs in train, from a random stream of
their own: episodes in rooms that hold the held-out egg+fridge combination where the game allows it, and in
rooms of any layout otherwise; every record whose pattern occurs in train is dropped.

Statistics (prepare.py defaults: seed 0, 20000 / 500 / 1000 records; "changed" = task.is_changed):
    train 20000 records, 10957 changed (54.8%), 724 create an object, 361 remove one, 1658 win
    val     500 records,   284 changed (56.8%)
    test   1000 records,   567 changed (56.7%), 209 of them in held-out egg+fridge rooms
    prompt (task.prompt_text) 588 characters on average (max 797); target 134 (max 474)
"""
import copy
import random
import re
import zlib

ROOM_TEMP, HEAT_STEP, COOL_STEP, MAX_TEMP, MIN_TEMP, COOKED_AT = 20, 20, 10, 100, 0, 80

# kind -> (type, initial properties)
KINDS = {
    "agent": ("Agent", {}), "stove": ("Stove", {"isOn": False}), "sink": ("Sink", {"isOn": False}),
    "fridge": ("Fridge", {"isOpen": False}), "box": ("Box", {"isOpen": False}),
    "pot": ("Pot", {"temp": ROOM_TEMP}), "cup": ("Cup", {}),
    "egg": ("Egg", {"temp": ROOM_TEMP, "isCooked": False}),
    "bread": ("Bread", {"temp": ROOM_TEMP, "isCooked": False}),
    "milk": ("Milk", {"temp": ROOM_TEMP}), "water": ("Water", {"temp": ROOM_TEMP}),
    "plant": ("Plant", {"water": 0, "growth": 0}), "knife": ("Knife", {}),
}
MOVABLE = {"pot", "cup", "egg", "bread", "milk", "knife"}
FOOD = {"egg", "bread"}
OPENABLE = {"fridge", "box"}
SWITCHABLE = {"stove", "sink"}
ACCEPTS = {  # container -> what can be put in it ("agent" takes anything movable, via "take")
    "stove": {"pot", "cup"}, "sink": {"pot", "cup"}, "pot": {"egg", "bread"},
    "fridge": {"egg", "bread", "milk", "pot", "cup"}, "box": {"egg", "bread", "milk", "knife", "cup", "pot"},
}
# game -> (core objects, distractor pool, how many distractors)
GAMES = {
    "cook-egg": (("stove", "pot", "egg"), ("bread", "box", "knife", "milk", "fridge"), (0, 2)),
    "water-plant": (("sink", "cup", "plant"), ("box", "knife", "bread", "stove", "pot"), (0, 2)),
    "chill-milk": (("fridge", "milk"), ("box", "bread", "knife", "pot", "egg", "cup"), (1, 3)),
    "pack-box": (("box", "knife", "bread"), ("egg", "milk", "pot", "fridge", "cup"), (0, 2)),
    "boil-water": (("sink", "cup", "stove"), ("pot", "box", "knife", "plant", "egg"), (0, 2)),
}
HELD_OUT = frozenset({"egg", "fridge"})   # never together in train/val rooms
SPLIT_BUCKETS = {"train": range(0, 8), "val": range(8, 9), "test": range(9, 10)}
P_USEFUL, P_HELD_OUT_TEST, MAX_STEPS = 0.45, 0.4, 20
NONSENSE = ("dance", "fly", "sing a song", "take spoon", "open door", "jump")


class World:
    """One room. Objects are kept as ByteSized32-style dicts; each kind occurs at most once."""

    def __init__(self, game: str, kinds: list[str]):
        self.game, self.objects, self.by_kind = game, [], {}
        for kind in kinds:
            self.add(kind)
        self.score = {"score": 0, "gameOver": False, "gameWon": False}

    def add(self, kind: str, container: str | None = None) -> None:
        uuid = max((o["uuid"] for o in self.objects), default=-1) + 1
        type_, properties = KINDS[kind]
        obj = {"name": f"{kind} (ID: {uuid})", "uuid": uuid, "type": type_,
               "properties": dict(properties), "contains": []}
        self.objects.append(obj)
        self.by_kind[kind] = obj
        if container is not None:
            self.by_kind[container]["contains"].append(obj["name"])

    def remove(self, kind: str) -> None:
        parent = self.parent(kind)
        obj = self.by_kind.pop(kind)
        if parent is not None:
            self.by_kind[parent]["contains"].remove(obj["name"])
        self.objects.remove(obj)

    def props(self, kind: str) -> dict:
        return self.by_kind[kind]["properties"]

    def parent(self, kind: str) -> str | None:
        name = self.by_kind[kind]["name"]
        return next((k for k, o in self.by_kind.items() if name in o["contains"]), None)

    def ancestors(self, kind: str) -> list[str]:
        chain, parent = [], self.parent(kind)
        while parent is not None:
            chain.append(parent)
            parent = self.parent(parent)
        return chain

    def closed_ancestor(self, kind: str) -> str | None:
        return next((a for a in self.ancestors(kind) if a in OPENABLE and not self.props(a)["isOpen"]), None)

    def move(self, kind: str, container: str) -> None:
        name = self.by_kind[kind]["name"]
        if self.parent(kind) is not None:
            self.by_kind[self.parent(kind)]["contains"].remove(name)
        self.by_kind[container]["contains"].append(name)

    def snapshot(self) -> dict:
        objects = [{"name": o["name"], "uuid": o["uuid"], "type": o["type"],
                    "properties": dict(o["properties"]), "contains": list(o["contains"])}
                   for o in self.objects]
        return {"objects": objects, "score": dict(self.score)}

    # ------------------------------------------------------------------ actions
    def act(self, action: tuple) -> None:
        """Apply an action; an impossible one changes nothing."""
        verb, args = action[0], [a for a in action[1:] if a in self.by_kind]
        if len(args) != len(action) - 1:
            return  # an object that is not in the room
        if verb == "take":
            x, = args
            if x in MOVABLE and self.parent(x) != "agent" and self.closed_ancestor(x) is None:
                self.move(x, "agent")
        elif verb == "put":
            x, y = args
            if (self.parent(x) == "agent" and x in ACCEPTS.get(y, ()) and x not in self.ancestors(y)
                    and self.closed_ancestor(y) is None and self.props(y).get("isOpen", True)):
                self.move(x, y)
        elif verb in ("open", "close"):
            x, = args
            if x in OPENABLE and self.props(x)["isOpen"] != (verb == "open"):
                self.props(x)["isOpen"] = verb == "open"
        elif verb in ("turn on", "turn off"):
            x, = args
            if x in SWITCHABLE and self.props(x)["isOn"] != (verb == "turn on"):
                self.props(x)["isOn"] = verb == "turn on"
        elif verb == "eat":
            x, = args
            if x in FOOD and self.parent(x) == "agent":
                self.remove(x)
        elif verb == "water":
            if "water" in self.by_kind and self.parent("cup") == "agent":
                self.remove("water")
                self.props("plant")["water"] = min(3, self.props("plant")["water"] + 2)
        # look, inventory, wait, examine and nonsense change nothing

    def tick(self) -> None:
        """The world's own update after every action, then the score."""
        for kind, obj in self.by_kind.items():
            if "temp" not in obj["properties"]:
                continue
            chain, temp = self.ancestors(kind), obj["properties"]["temp"]
            if "stove" in chain and self.props("stove")["isOn"]:
                temp = min(MAX_TEMP, temp + HEAT_STEP)
            elif "fridge" in chain:
                temp = max(MIN_TEMP, temp - COOL_STEP)
            elif temp != ROOM_TEMP:
                temp += COOL_STEP if temp < ROOM_TEMP else -COOL_STEP
            obj["properties"]["temp"] = temp
            if "isCooked" in obj["properties"] and temp >= COOKED_AT:
                obj["properties"]["isCooked"] = True
        if ("sink" in self.by_kind and self.props("sink")["isOn"] and "cup" in self.by_kind
                and self.parent("cup") == "sink" and "water" not in self.by_kind):
            self.add("water", container="cup")
        if "plant" in self.by_kind and self.props("plant")["water"] > 0:
            plant = self.props("plant")
            plant["water"], plant["growth"] = plant["water"] - 1, min(3, plant["growth"] + 1)
        self.update_score()

    def update_score(self) -> None:
        has, props = self.by_kind.__contains__, self.props
        lost, won = False, False
        if self.game == "cook-egg":
            lost = not has("egg")
            won = not lost and props("egg")["isCooked"]
            score = 0 if lost else (self.parent("egg") == "pot") + won
        elif self.game == "water-plant":
            score = props("plant")["growth"]
            won = score >= 2
        elif self.game == "chill-milk":
            won = props("milk")["temp"] == MIN_TEMP
            score = (self.parent("milk") == "fridge") + won
        elif self.game == "pack-box":
            lost = not has("bread")
            packed = 0 if lost else sum(self.parent(k) == "box" for k in ("knife", "bread"))
            won = packed == 2 and not props("box")["isOpen"]
            score = packed + won
        else:  # boil-water
            won = has("water") and props("water")["temp"] == MAX_TEMP
            score = has("water") + won
        self.score = {"score": int(score), "gameOver": lost or won, "gameWon": won}


# ---------------------------------------------------------------------- the agent
def _fetch(w: World, x: str, dest: str) -> tuple | None:
    """Next step to get x into dest (dest "agent" = hold it), None if it is there already."""
    if w.parent(x) == dest:
        return None
    if w.parent(x) != "agent":
        blocked = w.closed_ancestor(x)
        return ("open", blocked) if blocked else ("take", x)
    blocked = w.closed_ancestor(dest) or (dest if dest in OPENABLE and not w.props(dest)["isOpen"] else None)
    return ("open", blocked) if blocked else ("put", x, dest)


def scripted_step(w: World) -> tuple:
    """One step of a working solution of the room's game (possibly 'wait' for the tick to act)."""
    def on(kind: str) -> bool:
        return w.props(kind)["isOn"]

    if w.game == "cook-egg":
        step = _fetch(w, "egg", "pot") or _fetch(w, "pot", "stove")
        return step or (("wait",) if on("stove") else ("turn on", "stove"))
    if w.game == "chill-milk":
        step = _fetch(w, "milk", "fridge")
        return step or (("close", "fridge") if w.props("fridge")["isOpen"] else ("wait",))
    if w.game == "pack-box":
        step = _fetch(w, "knife", "box") or _fetch(w, "bread", "box")
        return step or (("close", "box") if w.props("box")["isOpen"] else ("wait",))
    if "water" not in w.by_kind:
        if w.game == "water-plant" and w.props("plant")["water"] > 0:
            return ("wait",)
        return _fetch(w, "cup", "sink") or (("wait",) if on("sink") else ("turn on", "sink"))
    if on("sink"):
        return ("turn off", "sink")
    if w.game == "water-plant":
        return _fetch(w, "cup", "agent") or ("water", "plant")
    step = _fetch(w, "cup", "stove")  # boil-water
    return step or (("wait",) if on("stove") else ("turn on", "stove"))


def random_action(w: World, rng: random.Random) -> tuple:
    """A random action, mostly impossible or without effect."""
    kinds = list(w.by_kind)
    verb = rng.choice(("look", "inventory", "wait", "examine", "take", "put", "open", "close",
                       "turn on", "turn off", "eat", "water", "nonsense"))
    if verb in ("look", "inventory", "wait"):
        return (verb,)
    if verb == "nonsense":
        return ("nonsense", rng.choice(NONSENSE))
    if verb == "water":
        return ("water", "plant")
    if verb == "put":
        return ("put", rng.choice(kinds), rng.choice(kinds))
    return (verb, rng.choice(kinds))


def action_text(action: tuple) -> str:
    verb = action[0]
    if verb in ("look", "inventory", "wait"):
        return verb
    if verb == "nonsense":
        return action[1]
    if verb == "put":
        return f"put {action[1]} in {action[2]}"
    return f"{verb} {action[1]}"


# ---------------------------------------------------------------------- rooms, episodes, splits
def layout_bucket(game: str, kinds: list[str]) -> int:
    """Stable hash bucket 0-9 of a room layout (game + ordered objects)."""
    return zlib.crc32(f"{game}:{','.join(kinds)}".encode()) % 10


def sample_room(split: str, game: str, held_out: bool, rng: random.Random) -> World:
    """A random initial room of `game` whose layout belongs to `split`; with held_out, a test room that
    has the held-out combination instead."""
    core, pool, (lo, hi) = GAMES[game]
    while True:
        kinds = list(core) + rng.sample(pool, rng.randint(lo, hi))
        rng.shuffle(kinds)
        if held_out:
            if HELD_OUT <= set(kinds):
                break
        elif not HELD_OUT <= set(kinds) and layout_bucket(game, kinds) in SPLIT_BUCKETS[split]:
            break
    return initial_room(game, kinds, rng)


def initial_room(game: str, kinds: list[str], rng: random.Random) -> World:
    """A random initial room of `game` with the objects `kinds` in this order (which fixes names and uuids)."""
    while True:  # random doors and starting places, at rest (fridge contents cold), game not yet over
        w = World(game, ["agent"] + kinds)
        for kind in kinds:
            if kind in OPENABLE:
                w.props(kind)["isOpen"] = rng.random() < 0.5
        for kind in kinds:
            homes = [c for c in ACCEPTS if c in w.by_kind and kind in ACCEPTS[c] and kind not in w.ancestors(c)]
            if kind in MOVABLE and homes and rng.random() < 0.3:
                w.move(kind, rng.choice(homes))
        for kind in kinds:
            if "temp" in w.props(kind) and "fridge" in w.ancestors(kind):
                w.props(kind)["temp"] = MIN_TEMP
        w.update_score()
        if not w.score["gameOver"]:
            return w


def run_episode(w: World, rng: random.Random, visit=None) -> list[dict]:
    """Play one episode, recording every transition. visit(w, action), if given, sees each state and the
    action about to be taken there (it must not change w or draw from rng)."""
    records = []
    for _ in range(MAX_STEPS):
        action = scripted_step(w) if rng.random() < P_USEFUL else random_action(w, rng)
        if visit is not None:
            visit(w, action)
        before = w.snapshot()
        w.act(action)
        w.tick()
        records.append({"game": w.game, "state": before, "action": action_text(action),
                        "next_state": w.snapshot()})
        if w.score["gameOver"]:
            break
    return records


def generate_split(split: str, n: int, seed: int = 0, visit=None) -> list[dict]:
    """n records of `split` ("train", "val" or "test"); the same arguments give the same records.
    visit: passed to run_episode (it also sees the states of the last episode's records cut off at n)."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_BUCKETS)}")
    rng = random.Random(f"textgame:{split}:{seed}")
    games, records, episode = sorted(GAMES), [], 0
    while len(records) < n:
        game = games[episode % len(games)]  # round robin, so every split has every game
        episode += 1
        core, pool, _ = GAMES[game]
        held_out = split == "test" and HELD_OUT <= set(core + pool) and rng.random() < P_HELD_OUT_TEST
        records.extend(run_episode(sample_room(split, game, held_out, rng), rng, visit))
    return records[:n]


# ---------------------------------------------------------------------- planning (plan.py)
def valid_actions(w: World) -> list[tuple]:
    """The admissible commands of a state, as a text-game environment lists them for an agent: each verb
    applied to the objects whose kind takes it, given what the state shows (what the agent holds, what is
    open, what is on). They may still do nothing (take from a closed fridge, put into a closed box), which
    a world model has to predict. look, inventory and examine never change the state: "wait" stands for them."""
    actions = [("wait",)]
    for kind in w.by_kind:
        if kind in MOVABLE and w.parent(kind) != "agent":
            actions.append(("take", kind))
        if kind in OPENABLE:
            actions.append(("close" if w.props(kind)["isOpen"] else "open", kind))
        if kind in SWITCHABLE:
            actions.append(("turn off" if w.props(kind)["isOn"] else "turn on", kind))
    for kind in w.by_kind:
        if kind in MOVABLE and w.parent(kind) == "agent":
            actions += [("put", kind, dest) for dest in w.by_kind if kind in ACCEPTS.get(dest, ())]
            if kind in FOOD:
                actions.append(("eat", kind))
    if "plant" in w.by_kind:
        actions.append(("water", "plant"))
    return actions


def planning_rooms(n: int, seed: int = 0, split: str = "test") -> list[World]:
    """n initial rooms for planning episodes: the games in turn, room layouts of `split` (in test, held-out
    egg+fridge rooms as often as in its records), drawn from a random stream of their own, so the data
    splits are untouched."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_BUCKETS)}")
    rng, games, rooms = random.Random(f"textgame-plan:{split}:{seed}"), sorted(GAMES), []
    for i in range(n):
        core, pool, _ = GAMES[games[i % len(games)]]
        held_out = split == "test" and HELD_OUT <= set(core + pool) and rng.random() < P_HELD_OUT_TEST
        rooms.append(sample_room(split, games[i % len(games)], held_out, rng))
    return rooms


# ---------------------------------------------------------------------- coverage (prepare.py --cover)
def offscript_records(w: World, taken: tuple, k: int, rng: random.Random) -> list[dict]:
    """Up to k transitions from the state of w by random valid actions other than `taken` (the one the
    episode takes there), each played on a copy of w (action, then tick); w itself is left as it is."""
    options = [a for a in valid_actions(w) if action_text(a) != action_text(taken)]
    records = []
    for action in rng.sample(options, min(k, len(options))):
        sim = copy.deepcopy(w)
        sim.act(action)
        sim.tick()
        records.append({"game": w.game, "state": w.snapshot(), "action": action_text(action),
                        "next_state": sim.snapshot(), "source": "offscript"})
    return records


def generate_cover(split: str, n: int, seed: int = 0, per_state: int = 1) -> tuple[list[dict], list[dict]]:
    """(scripted, offscript): scripted = generate_split(split, n, seed), the very same records, and at the
    state of each of them, in order, `per_state` off-script records (fewer where the state has fewer other
    valid actions). Their choices come from a random stream of their own, so the scripted records and the
    states are untouched, and the first states' off-script records do not depend on n."""
    rng, at_state = random.Random(f"textgame-cover:{split}:{seed}"), []
    scripted = generate_split(split, n, seed,
                              visit=lambda w, taken: at_state.append(offscript_records(w, taken, per_state, rng)))
    return scripted, [r for records in at_state[:n] for r in records]


# ---------------------------------------------------------------------- composition (prepare.py --compose)
def pattern(record: dict) -> tuple:
    """What a transition composes, object IDs stripped: (game, the sorted types of the objects in the room
    before the action, the action). The simulator's actions name objects by kind, never by ID, and a room
    holds at most one object of a kind, so the action text is the verb with its object types."""
    types = tuple(sorted(o["type"] for o in record["state"]["objects"]))
    return record["game"], types, re.sub(r" \(ID: \d+\)", "", record["action"])


def compose_room(game: str, rng: random.Random) -> World:
    """A random initial room of `game` for the composition split: one that holds the held-out egg+fridge
    combination (never in a train room) where the game's objects allow it, else a room of any layout."""
    core, pool, (lo, hi) = GAMES[game]
    held_out = HELD_OUT <= set(core + pool)
    while True:
        kinds = list(core) + rng.sample(pool, rng.randint(lo, hi))
        rng.shuffle(kinds)
        if not held_out or HELD_OUT <= set(kinds):
            return initial_room(game, kinds, rng)


def generate_compose(n: int, seen: set, seed: int = 0) -> tuple[list[dict], int]:
    """(records, dropped): n records whose pattern is not in `seen` (the train split's patterns), from
    episodes of compose_room rooms, the games in turn, on a random stream of their own (the data splits
    are untouched); dropped counts the generated records left out because their pattern is in `seen`,
    up to the n-th kept one."""
    rng = random.Random(f"textgame-compose:{seed}")
    games, records, dropped, episode = sorted(GAMES), [], 0, 0
    while len(records) < n:
        game = games[episode % len(games)]
        episode += 1
        for record in run_episode(compose_room(game, rng), rng):
            if pattern(record) not in seen:
                records.append(record)
            elif len(records) < n:   # a seen pattern before the split is full
                dropped += 1
    return records[:n], dropped
