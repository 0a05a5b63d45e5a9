"""
The planning environments of plan.py: one episode of the text game (TextGame) or of the web site
(WebPage), each with the same interface (observe, candidates, simulate, prompt, value, step, ...),
and the fixed hand-written value functions the planner scores predicted states with.

Text game: V(s) = +100 won, -100 lost (or a core object of the game gone), else minus the estimated
actions to the win (`steps_to_win`). Web page: V(page) = milestone conditions shown + 10 * the goal
shown (`web_value`). research/README.md explains both, with the planner's results.
"""
import copy
import math
import re

from data.textgame import simulator as tg_sim, task as tg_task
from data.webpage import simulator as web_sim, task as web_task
from rewards import apply_diff, parse_diff, parse_sections, textgame_reward, web_prf

# -----------------------------------------------------------------------------
# text game: value function

WIN, LOSE = 100.0, -100.0
_ID = re.compile(r"\(ID: (\d+)\)")


def _num(value, default):
    """A number of plain size from a prediction (not a bool, nan, inf or 10**400), else default."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e9
    return value if ok else default


class Room:
    """A text-game state read by object kind; tolerant of anything a world model may have written.
    Objects are identified by uuid, as the reward does: `kinds` (uuid -> kind, from the current true
    state) names the known ones, so a predicted "pot (ID: 2)" with the knife's uuid 2 is read as the
    knife; new uuids go by their name."""

    def __init__(self, state, kinds=None):
        kinds, state = kinds or {}, state if isinstance(state, dict) else {}

        def kind_of(name, uuid=None):
            # the uuid given, else the one in the name's "(ID: n)"; a known uuid names the kind
            m = _ID.search(name) if uuid is None else None
            uuid = int(m.group(1)) if m else uuid
            return (kinds.get(uuid) if isinstance(uuid, int) else None) or name.split(" (ID")[0]
        objects = state.get("objects") if isinstance(state.get("objects"), list) else []
        self.objects = {kind_of(o["name"], o.get("uuid")): o for o in objects
                        if isinstance(o, dict) and isinstance(o.get("name"), str)}
        # parents: kind -> the kind of what contains it (the agent holds what it carries)
        self.parents = {}
        for kind, o in self.objects.items():
            for name in o.get("contains") if isinstance(o.get("contains"), list) else []:
                if isinstance(name, str):
                    self.parents[kind_of(name)] = kind
        self.score = state.get("score") if isinstance(state.get("score"), dict) else {}

    def prop(self, kind, key, default):
        """A property of the object of this kind, of the default's type, else the default."""
        props = self.objects.get(kind, {}).get("properties")
        value = props.get(key) if isinstance(props, dict) else None
        if isinstance(default, bool):
            return value if isinstance(value, bool) else default
        return _num(value, default)

    def ancestors(self, kind):
        """What contains the object, innermost first."""
        chain = []
        # (a predicted cycle ends too: no chain is longer than the objects)
        while kind in self.parents and len(chain) <= len(self.objects):
            kind = self.parents[kind]
            chain.append(kind)
        return chain

    def closed(self, kind):
        return kind in tg_sim.OPENABLE and not self.prop(kind, "isOpen", False)

    def fetch(self, x, dest):
        """Actions to get x into dest ("agent": to hold it): open what encloses it, take it, open
        dest, put it."""
        where = self.parents.get(x)
        if where == dest:
            return 0
        steps = 0 if where == "agent" else 1 + any(self.closed(a) for a in self.ancestors(x))
        if dest != "agent":
            steps += 1 + any(self.closed(a) for a in [dest] + self.ancestors(dest))
        return steps


def steps_to_win(game, r):
    """Estimated actions from Room r to the win of `game`, from the state alone: per object the goal
    needs somewhere, its `fetch`; +1 per appliance to switch on; plus the world ticks the goal still
    needs (heating 20 degrees, cooling 10, growing 1 per tick). It falls by at least 1 at each step
    of a working solution, so the true-simulator planner never stalls."""
    def off(kind):
        return not r.prop(kind, "isOn", False)

    def ticks(kind, target, step):  # world ticks to bring kind's temperature to target
        return max(0, math.ceil((target - r.prop(kind, "temp", tg_sim.ROOM_TEMP)) / step))

    def fill():  # water appears at the first tick with the cup in a running sink
        return max(1, r.fetch("cup", "sink") + off("sink"))

    if game == "cook-egg":
        heat = (0 if r.prop("egg", "isCooked", False)
                else ticks("egg", tg_sim.COOKED_AT, tg_sim.HEAT_STEP))
        return r.fetch("egg", "pot") + r.fetch("pot", "stove") + off("stove") + heat
    if game == "water-plant":  # watering gives 2 water, then each tick turns 1 water into 1 growth
        need = max(0, 2 - r.prop("plant", "growth", 0))   # won at growth 2
        if r.prop("plant", "water", 0) >= need:
            return need
        return (r.fetch("cup", "agent") if "water" in r.objects else fill() + 1) + need
    if game == "chill-milk":
        return r.fetch("milk", "fridge") + ticks("milk", tg_sim.MIN_TEMP, -tg_sim.COOL_STEP)
    if game == "pack-box":  # take what is not packed, open the box once, put each in, close the box
        todo = [k for k in ("knife", "bread") if r.parents.get(k) != "box"]
        box_open = r.prop("box", "isOpen", False)
        return (sum(r.fetch(k, "agent") + 1 for k in todo) + (bool(todo) and not box_open)
                + bool(todo or box_open))
    # boil-water: fill the cup at the sink, then the cup on the running stove until the water is 100
    boil = tg_sim.MAX_TEMP - tg_sim.ROOM_TEMP
    water = (r.fetch("cup", "stove") + ticks("water", tg_sim.MAX_TEMP, tg_sim.HEAT_STEP)
             if "water" in r.objects else fill() + 2 + math.ceil(boil / tg_sim.HEAT_STEP))
    return water + off("stove")


def textgame_value(game, state, kinds=None, trust_win=True):
    """V(s): +100 won, -100 lost, else -steps_to_win; -inf for an unreadable prediction (None).
    kinds: see Room. trust_win=False: a claimed win (the gameWon flag, with the gameOver that comes
    with it) is ignored and the state is valued by what it shows, so an unconfident predicted win is
    worth at most about 0, not +100."""
    if state is None:
        return -math.inf
    r = Room(state, kinds)
    claims_win = r.score.get("gameWon") is True
    if claims_win and trust_win:
        return WIN
    # lost: the game says so without a win, or a core object of the game is gone (eaten)
    if ((r.score.get("gameOver") is True and not claims_win)
            or any(k not in r.objects for k in tg_sim.GAMES[game][0])):
        return LOSE
    return -float(steps_to_win(game, r))


# -----------------------------------------------------------------------------
# web page: value function and the word-overlap policy

def web_shown(goal, page):
    """The share of each goal condition's lines that show on the page (whitespace-normalized), in
    goal order."""
    lines = {" ".join(line.split()) for line in page.splitlines()}
    return [sum(" ".join(c.split()) in lines for c in cond) / len(cond)
            for cond in goal["conditions"]]


STOP = {"a", "an", "and", "for", "from", "of", "on", "the", "to", "with"}


def words(text):
    """The lower-case words of a text, without the few function words instructions are made with."""
    return set(re.findall(r"[a-z0-9]+", text.lower())) - STOP


def web_policy_score(instruction, lines, action):
    """The word-overlap policy's score of an action: the instruction's words found in the line of
    the element it acts on (`lines`: id -> accessibility-tree line) and in the text it types; 0 for
    scroll, back and Enter."""
    want = words(instruction)
    on = lines.get(action[1], "") if len(action) > 1 else ""
    return len(want & words(on)) + (len(want & words(action[2])) if action[0] == "type" else 0)


def web_value(goal, page, graded=True):
    """V(page) = milestones shown + 10 * goal shown. graded: each condition counts the share of its
    lines that show (partial credit per line: fewer candidates tie); else a condition counts only
    when all its lines show."""
    shown = [x if graded else float(x == 1) for x in web_shown(goal, page)]
    return sum(shown[:-1]) + 10.0 * shown[-1]


# -----------------------------------------------------------------------------
# environments: one episode each, the same interface for both tasks

class TextGame:
    """A text-game room and its game: won by `gameWon`, lost by eating the egg or bread."""
    max_steps, max_new_tokens = 20, 200

    def __init__(self, world):
        self.w = world

    @staticmethod
    def episodes(n, seed, split="test"):
        """n start rooms with the split's layouts (never train's)."""
        return [TextGame(w) for w in tg_sim.planning_rooms(n, seed, split)]

    def label(self):
        return self.w.game

    def observe(self):
        return self.w.snapshot()

    def candidates(self):
        return tg_sim.valid_actions(self.w)

    def prompt(self, obs, action):
        """The world model's prompt for this state and action."""
        return tg_task.prompt_text({"game": self.w.game, "state": obs,
                                    "action": tg_sim.action_text(action)})

    def action_text(self, action):
        return tg_sim.action_text(action)

    def simulate(self, action):
        """The true next state of an action, on a copy of the room."""
        w = copy.deepcopy(self.w)
        w.act(action)
        w.tick()
        return w.snapshot()

    def from_text(self, obs, text):
        """The predicted next state: the model's diff merged into obs (None: unreadable)."""
        diff = parse_diff(text)
        return None if diff is None else apply_diff(obs, diff)

    def value(self, state, trust_win=True):
        return textgame_value(self.w.game, state,
                              {o["uuid"]: k for k, o in self.w.by_kind.items()}, trust_win)

    def step(self, action):
        self.w.act(action)
        self.w.tick()

    def won(self):
        return self.w.score["gameWon"]

    def lost(self):
        return self.w.score["gameOver"] and not self.w.score["gameWon"]

    def accuracy(self, text, obs, next_obs):
        """The world model's score on one prediction: the exact next state (0/1)."""
        return textgame_reward(text, obs, next_obs, "binary")


class WebPage:
    """A fresh web page and a goal: conditions of accessibility-tree lines, the last the goal."""
    max_steps, max_new_tokens = 8, 160

    def __init__(self, page, goal, graded=True):
        self.page, self.goal, self.graded = page, goal, graded

    @staticmethod
    def episodes(n, seed, split="test", graded=True):
        """n start pages with goals, from the split's sites."""
        return [WebPage(p, g, graded) for p, g in web_sim.planning_episodes(n, seed, split)]

    def label(self):
        return self.page.site

    def observe(self):
        return self.page.render()

    def candidates(self):
        return web_sim.valid_actions(self.page, self.goal["texts"])

    def propose(self, actions, k, rng):
        """Indices of the policy's k best actions, best first (ties in random order): a stand-in for
        the paper's web agent, which proposes the candidates the world model then judges
        (web_policy_score)."""
        lines = {n.id: n.line() for n in self.page.visible()}
        score = {j: web_policy_score(self.goal["instruction"], lines, a)
                 for j, a in enumerate(actions)}
        return sorted(score, key=lambda j: (-score[j], rng.random()))[:k]

    def prompt(self, obs, action):
        """The world model's prompt for this page and action."""
        return web_task.prompt_text({"site": self.page.site, "observation": obs,
                                     "action": web_sim.action_text(action)})

    def action_text(self, action):
        return web_sim.action_text(action)

    def simulate(self, action):
        """The true next page of an action, on a copy of the page (acting never draws from rng)."""
        page = copy.deepcopy(self.page, {id(self.page.rng): self.page.rng})
        page.act(action)
        return page.render()

    def from_text(self, obs, text):
        """The predicted next page: the model's changed lines merged into obs."""
        return web_task.apply_changes(obs, parse_sections(text))

    def value(self, page, trust_win=True):
        """V(page); trust_win is ignored: the goal is graded by its lines shown, no win flag."""
        return web_value(self.goal, page, self.graded)

    def step(self, action):
        self.page.act(action)

    def won(self):
        return web_shown(self.goal, self.page.render())[-1] == 1

    def lost(self):
        return False

    def accuracy(self, text, obs, next_obs):
        """The world model's score on one prediction: F1 of the changed lines."""
        return web_prf(text, web_task.diff_text(obs, next_obs))[2]


ENVS = {"textgame": TextGame, "webpage": WebPage}
