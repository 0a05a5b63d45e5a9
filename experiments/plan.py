"""
Planning with a language world model: model-predictive control (MPC) in the text game and on the web site.

    python experiments/plan.py --task=textgame --planners=random,sim,checkpoints/textgame/mle.safetensors,out/textgame/rlvr.safetensors
    python experiments/plan.py --task=webpage --planners=random,sim,checkpoints/webpage/mle.safetensors,out/webpage/rlvr.safetensors
    python experiments/plan.py --task=textgame --planners=random,checkpoints/textgame/mle.safetensors --act=sim   (decisions only)
    python experiments/plan.py --task=textgame --planners=sim --episodes=20 --split=val --json=plan.json      (a quick look)
    python experiments/plan.py --task=webpage --planners=out/webpage/rlvr.safetensors --device=cuda --batch_size=256
    python experiments/plan.py --task=webpage --planners=policy,checkpoints/webpage/mle.safetensors --propose=3

A world model is worth what it lets an agent do. At every step the agent lists the environment's valid actions,
predicts each one's next state with the world model (all candidates of all running episodes in one batched greedy
generate call), scores each predicted state with a fixed value function, takes the best (ties broken at random,
seeded) in the *real* simulator, and repeats until the goal is reached, the game is lost or the step cap.
A planner is `random` (a uniformly random valid action: the floor), `sim` (the true simulator as the planner's
model: the ceiling, which is the value function's own limit), or a world-model checkpoint (ours or an HF dir).
Design: one-step lookahead over every valid action, with a fixed hand-written value function. Deeper search costs
|actions|^depth predictions (12-25 candidates a step here), and a fixed value function makes the world model the
only thing that differs between the rows of the table.

Text game (data/textgame/simulator.py): win the room's game (`gameWon`; eating the egg or bread loses) within 20
steps, from initial rooms with the test split's room layouts (held-out egg+fridge rooms included), never train's.
Valid actions: `valid_actions` (each verb on the objects it applies to). The model reads the state and the action
and writes a diff; rewards.parse_diff + apply_diff turn it into the predicted next state. Value function:
    V(s) = +100 if s is won, -100 if lost (gameOver without gameWon, or a core object of the game gone),
           else -(estimated actions from s to the win),
the estimate summed from the state alone, per game: for each object the goal needs somewhere, 1 to take it unless
held, +1 if a closed fridge/box encloses it, 1 to put it, +1 if the destination is closed; +1 per appliance to
switch on; plus the world ticks the goal still needs (heating 20 degrees, cooling 10, growing 1 per tick; see
`steps_to_win`). It falls by at least 1 at each step of a working solution, so the `sim` planner never stalls (it
wins all 100 test episodes). Objects are identified by uuid, as the reward does (a predicted "pot (ID: 2)" that
carries the knife's uuid is read as the knife). An unreadable prediction is worth -inf.

Web page (data/webpage/simulator.py): a fresh test-split page and a goal (open a section from a menu, show a tab,
read a tooltip, search the catalog, go to its next page, save a customer with two given fields, upvote a post or
comment on it), within 8 steps. A goal is a list of conditions, each a set of accessibility-tree lines that show
after one step of a working solution; the last condition is the goal (`make_goal`). Valid actions:
`valid_actions` (click anything interactive, hover links, type the goal's texts into fields, scroll, back,
Enter). The model writes the changed lines; task.apply_changes merges them into the page. Value function (graded):
    V(page) = (sum over milestone conditions of the share of their lines shown) + 10 * (share of the goal's lines),
so a prediction that gets one of two goal lines right is worth more than one that gets none (`--web_value=exact`
counts a condition only when all its lines show, which left all candidates tied in most steps).
As in the paper's web-agent setup, a policy can propose the candidates (`--propose=K`): every planner then chooses
among the K best actions of a word-overlap policy (`web_policy_score`: the instruction's words found in the line of
the element an action acts on and in the text it types), and `--planners=policy` is that policy alone.

How the model planner uses a prediction (each choice made on `--split=val`, see docs/downstream.md):
    V(candidate) = p * V(predicted state) + (1 - p) * V(now)                       (--conf)
p is the model's probability of its own answer, from the greedy answer's token log-probs (exp of their sum, or of
their mean); a prediction counts only as far as the model believes it. A predicted win counts +100 only if
p >= --trust_win, else the predicted state is valued by what it shows. With --memory, a (state, action) whose
prediction reality contradicted (the executed action's real next state differed from the predicted one) is not
chosen again in the episode (block) or is worth V(now) (now). --noop=c: a candidate whose predicted state equals the
current one is worth c less: it spends a step, and if the model is wrong about it its effect is unforeseen (the
text model predicts "nothing happens" for eating the egg it holds, at p > 0.9). --explore=b adds b * (1 - p).

Reported per planner: success rate with its Wilson 95% interval, mean steps of the successful episodes and of all
(capped ones count the cap), lost rate, `agree` (share of steps whose action is among the true simulator's best under
the same value function: decision accuracy; `random` gives its chance level), `wm_acc` (the world model's score on
the actions it took: exact next state for the text game, F1 of the changed lines for the web), `cand_acc` (the same
over every candidate it scored), `cand_exact` (the share of the candidate predictions that are exactly the
simulator's next state, per step, averaged over steps: the world model's accuracy on the planner's own questions),
`tie` (steps where every candidate had the same value: a random choice), `repeat` (steps that took a (state, action)
already contradicted), and per game or site success. The JSON has every episode (success, steps, per-step scores),
so any interval can be recomputed. `--act=sim` lets the true-simulator planner act while every planner still
decides (success is then the simulator's): decisions scored on the states a perfect planner visits, without the
compounding of a model's own mistakes. `--split=val` draws episodes from validation layouts, for development.
Seeded and deterministic on CPU.
"""
import argparse
import copy
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from data.textgame import simulator as tg_sim, task as tg_task  # noqa: E402
from tasks import crop, load_lang_model  # noqa: E402
from engine import generate  # noqa: E402
from data.webpage import simulator as web_sim, task as web_task  # noqa: E402
from rewards import apply_diff, parse_diff, parse_sections, textgame_reward, web_prf  # noqa: E402

# -----------------------------------------------------------------------------
# text game: value function

WIN, LOSE = 100.0, -100.0
_ID = re.compile(r"\(ID: (\d+)\)")


def _num(value, default):
    """A number of plain size from a prediction (not a bool, nan, inf or 10**400), else default."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e9
    return value if ok else default


class Room:
    """A text-game state read by object kind; tolerant of anything a world model may have written. Objects are
    identified by uuid, as the reward does: `kinds` (uuid -> kind, from the current true state) names the known
    ones, so a predicted "pot (ID: 2)" with the knife's uuid 2 is read as the knife; new uuids go by their name."""

    def __init__(self, state, kinds=None):
        kinds, state = kinds or {}, state if isinstance(state, dict) else {}

        def kind_of(name, uuid=None):
            m = _ID.search(name) if uuid is None else None
            uuid = int(m.group(1)) if m else uuid
            return (kinds.get(uuid) if isinstance(uuid, int) else None) or name.split(" (ID")[0]
        objects = state.get("objects") if isinstance(state.get("objects"), list) else []
        self.objects = {kind_of(o["name"], o.get("uuid")): o for o in objects
                        if isinstance(o, dict) and isinstance(o.get("name"), str)}
        self.parents = {}
        for kind, o in self.objects.items():
            for name in o.get("contains") if isinstance(o.get("contains"), list) else []:
                if isinstance(name, str):
                    self.parents[kind_of(name)] = kind
        self.score = state.get("score") if isinstance(state.get("score"), dict) else {}

    def prop(self, kind, key, default):
        props = self.objects.get(kind, {}).get("properties")
        value = props.get(key) if isinstance(props, dict) else None
        if isinstance(default, bool):
            return value if isinstance(value, bool) else default
        return _num(value, default)

    def ancestors(self, kind):
        chain = []
        while kind in self.parents and len(chain) <= len(self.objects):  # a predicted cycle ends too
            kind = self.parents[kind]
            chain.append(kind)
        return chain

    def closed(self, kind):
        return kind in tg_sim.OPENABLE and not self.prop(kind, "isOpen", False)

    def fetch(self, x, dest):
        """Actions to get x into dest ("agent": to hold it): open what encloses it, take it, open dest, put it."""
        where = self.parents.get(x)
        if where == dest:
            return 0
        steps = 0 if where == "agent" else 1 + any(self.closed(a) for a in self.ancestors(x))
        if dest != "agent":
            steps += 1 + any(self.closed(a) for a in [dest] + self.ancestors(dest))
        return steps


def steps_to_win(game, r):
    """Estimated actions from Room r to the win of `game` (see the module docstring)."""
    def off(kind):
        return not r.prop(kind, "isOn", False)

    def ticks(kind, target, step):  # world ticks to bring kind's temperature to target
        return max(0, math.ceil((target - r.prop(kind, "temp", tg_sim.ROOM_TEMP)) / step))

    def fill():  # water appears at the first tick with the cup in a running sink
        return max(1, r.fetch("cup", "sink") + off("sink"))

    if game == "cook-egg":
        heat = 0 if r.prop("egg", "isCooked", False) else ticks("egg", tg_sim.COOKED_AT, tg_sim.HEAT_STEP)
        return r.fetch("egg", "pot") + r.fetch("pot", "stove") + off("stove") + heat
    if game == "water-plant":  # watering gives 2 water, then each tick turns 1 water into 1 growth; won at 2
        need = max(0, 2 - r.prop("plant", "growth", 0))
        if r.prop("plant", "water", 0) >= need:
            return need
        return (r.fetch("cup", "agent") if "water" in r.objects else fill() + 1) + need
    if game == "chill-milk":
        return r.fetch("milk", "fridge") + ticks("milk", tg_sim.MIN_TEMP, -tg_sim.COOL_STEP)
    if game == "pack-box":  # take what is not packed, open the box once, put each in, close the box
        todo = [k for k in ("knife", "bread") if r.parents.get(k) != "box"]
        box_open = r.prop("box", "isOpen", False)
        return sum(r.fetch(k, "agent") + 1 for k in todo) + (bool(todo) and not box_open) + bool(todo or box_open)
    # boil-water: fill the cup at the sink, then cup on the running stove until the water reaches 100
    boil = tg_sim.MAX_TEMP - tg_sim.ROOM_TEMP
    water = (r.fetch("cup", "stove") + ticks("water", tg_sim.MAX_TEMP, tg_sim.HEAT_STEP) if "water" in r.objects
             else fill() + 2 + math.ceil(boil / tg_sim.HEAT_STEP))
    return water + off("stove")


def textgame_value(game, state, kinds=None, trust_win=True):
    """V(s): +100 won, -100 lost, else -steps_to_win; -inf for an unreadable prediction (None). kinds: see Room.
    trust_win=False: a claimed win (the gameWon flag, with the gameOver that comes with it) is ignored and the state
    is valued by what it shows, so an unconfident predicted win is worth at most about 0, not +100."""
    if state is None:
        return -math.inf
    r = Room(state, kinds)
    claims_win = r.score.get("gameWon") is True
    if claims_win and trust_win:
        return WIN
    if (r.score.get("gameOver") is True and not claims_win) or any(k not in r.objects for k in tg_sim.GAMES[game][0]):
        return LOSE
    return -float(steps_to_win(game, r))


def web_shown(goal, page):
    """The share of each goal condition's lines that show on the page (whitespace-normalized), in goal order."""
    lines = {" ".join(line.split()) for line in page.splitlines()}
    return [sum(" ".join(c.split()) in lines for c in cond) / len(cond) for cond in goal["conditions"]]


STOP = {"a", "an", "and", "for", "from", "of", "on", "the", "to", "with"}


def words(text):
    """The lower-case words of a text, without the few function words an instruction is made with."""
    return set(re.findall(r"[a-z0-9]+", text.lower())) - STOP


def web_policy_score(instruction, lines, action):
    """The word-overlap policy's score of an action: the instruction's words found in the line of the element it
    acts on (`lines`: id -> accessibility-tree line) and in the text it types; 0 for scroll, back and Enter."""
    want = words(instruction)
    on = lines.get(action[1], "") if len(action) > 1 else ""
    return len(want & words(on)) + (len(want & words(action[2])) if action[0] == "type" else 0)


def web_value(goal, page, graded=True):
    """V(page) = milestones shown + 10 * goal shown. graded: each condition counts the share of its lines that show
    (partial credit per line: fewer candidates tie); else a condition counts only when all its lines show."""
    shown = [x if graded else float(x == 1) for x in web_shown(goal, page)]
    return sum(shown[:-1]) + 10.0 * shown[-1]

# -----------------------------------------------------------------------------
# environments: one episode each, the same interface for both tasks


class TextGame:
    max_steps, max_new_tokens = 20, 200

    def __init__(self, world):
        self.w = world

    @staticmethod
    def episodes(n, seed, split="test"):
        return [TextGame(w) for w in tg_sim.planning_rooms(n, seed, split)]

    def label(self):
        return self.w.game

    def observe(self):
        return self.w.snapshot()

    def candidates(self):
        return tg_sim.valid_actions(self.w)

    def prompt(self, obs, action):
        return tg_task.prompt_text({"game": self.w.game, "state": obs, "action": tg_sim.action_text(action)})

    def action_text(self, action):
        return tg_sim.action_text(action)

    def simulate(self, action):
        w = copy.deepcopy(self.w)
        w.act(action)
        w.tick()
        return w.snapshot()

    def from_text(self, obs, text):
        diff = parse_diff(text)
        return None if diff is None else apply_diff(obs, diff)

    def value(self, state, trust_win=True):
        return textgame_value(self.w.game, state, {o["uuid"]: k for k, o in self.w.by_kind.items()}, trust_win)

    def step(self, action):
        self.w.act(action)
        self.w.tick()

    def won(self):
        return self.w.score["gameWon"]

    def lost(self):
        return self.w.score["gameOver"] and not self.w.score["gameWon"]

    def accuracy(self, text, obs, next_obs):
        return textgame_reward(text, obs, next_obs, "binary")


class WebPage:
    max_steps, max_new_tokens = 8, 160

    def __init__(self, page, goal, graded=True):
        self.page, self.goal, self.graded = page, goal, graded

    @staticmethod
    def episodes(n, seed, split="test", graded=True):
        return [WebPage(p, g, graded) for p, g in web_sim.planning_episodes(n, seed, split)]

    def label(self):
        return self.page.site

    def observe(self):
        return self.page.render()

    def candidates(self):
        return web_sim.valid_actions(self.page, self.goal["texts"])

    def propose(self, actions, k, rng):
        """Indices of the policy's k best actions, best first (ties in random order): a stand-in for the paper's
        web agent, which proposes the candidates the world model then judges (web_policy_score)."""
        lines = {n.id: n.line() for n in self.page.visible()}
        score = {j: web_policy_score(self.goal["instruction"], lines, a) for j, a in enumerate(actions)}
        return sorted(score, key=lambda j: (-score[j], rng.random()))[:k]

    def prompt(self, obs, action):
        return web_task.prompt_text({"site": self.page.site, "observation": obs,
                                     "action": web_sim.action_text(action)})

    def action_text(self, action):
        return web_sim.action_text(action)

    def simulate(self, action):
        page = copy.deepcopy(self.page, {id(self.page.rng): self.page.rng})  # acting never draws from rng
        page.act(action)
        return page.render()

    def from_text(self, obs, text):
        return web_task.apply_changes(obs, parse_sections(text))

    def value(self, page, trust_win=True):  # the goal's bonus is graded by its lines shown; no flag to distrust
        return web_value(self.goal, page, self.graded)

    def step(self, action):
        self.page.act(action)

    def won(self):
        return web_shown(self.goal, self.page.render())[-1] == 1

    def lost(self):
        return False

    def accuracy(self, text, obs, next_obs):
        return web_prf(text, web_task.diff_text(obs, next_obs))[2]


ENVS = {"textgame": TextGame, "webpage": WebPage}
BUILTIN = ("random", "sim", "policy")  # the planners that need no world-model checkpoint

# -----------------------------------------------------------------------------
# the planner


def lm_predictor(path, device="cpu", batch_size=64):
    """A world-model checkpoint -> predict(prompts, max_new_tokens) -> one (greedy completion, its tokens' log-probs)
    per prompt. The batching is generate_texts' (sorted by length, cropped alike); a prompt longer than the model's
    context gets ("", None): no prediction. Answers are cached by prompt: a planner that stays in a state asks the
    same questions again (a batch's answer room is set by its longest prompt, so a cached answer is the one its
    first batch allowed)."""
    model, tok, _ = load_lang_model(path, device)
    model.eval()
    cache = {}  # (prompt, max_new_tokens) -> (text, log-probs)

    def predict(prompts, max_new_tokens):
        new = list(dict.fromkeys(p for p in prompts if (p, max_new_tokens) not in cache))  # unseen, once each
        ids = [tok.encode(p) for p in new]
        for i, x in enumerate(ids):
            if len(x) >= model.config.block_size:  # too long: no prediction
                cache[new[i], max_new_tokens] = ("", None)
        fits = [i for i, x in enumerate(ids) if len(x) < model.config.block_size]
        cropped = crop([ids[i] for i in fits], model.config.block_size, max_new_tokens)[0]
        order = sorted(range(len(fits)), key=lambda k: len(cropped[k]))  # shortest first: less padding
        with torch.no_grad():
            for s in range(0, len(order), batch_size):
                batch = order[s:s + batch_size]
                room = model.config.block_size - max(len(cropped[k]) for k in batch)
                tokens, logps = generate(model, [cropped[k] for k in batch], min(max_new_tokens, room),
                                         temperature=0.0, eos_id=tok.eos_id)  # (B, N) each; -1 after eos
                for k, row, lp in zip(batch, tokens.tolist(), logps.tolist()):
                    text = tok.decode([t for t in row if t >= 0 and t != tok.eos_id])
                    cache[new[fits[k]], max_new_tokens] = (text, [x for t, x in zip(row, lp) if t >= 0])  # with eos
        return [cache[p, max_new_tokens] for p in prompts]
    return predict


def confidence(logps, mode):
    """The world model's probability of its own answer, from its tokens' log-probs. mode "sum": exp(sum), the whole
    answer's probability; "mean": exp(mean), the per-token geometric mean (long answers are not punished for their
    length); "none": 1, every prediction trusted. No prediction (logps None) is worth nothing: 0."""
    if mode == "none":
        return 1.0
    if logps is None:
        return 0.0
    total = sum(logps)
    return math.exp(total if mode == "sum" else total / max(1, len(logps)))


def weighted_value(p, v_pred, v_now):
    """V = p * V(predicted) + (1 - p) * V(now): the predicted change counts as far as the model believes it."""
    if p == 0 or v_pred == v_now:  # no information, or no change (and 0 * -inf would be nan)
        return v_now
    return p * v_pred + (1 - p) * v_now


def plan(envs, planner, predict=None, seed=0, max_steps=None, max_new_tokens=None, act="planner",
         conf="none", memory="none", trust_win=0.0, explore=0.0, noop=0.0, propose=0):
    """Run every episode to its end with `planner` ("random", "sim", "model", which uses `predict`, or "policy",
    the web policy's best action; see WebPage.propose).
    propose=k (web page): every planner chooses among the policy's k best actions instead of every valid action;
    agree is still measured against the best of every valid action.
    act="sim": the true-simulator planner acts instead, so a model's decisions are scored on the states a perfect
    planner visits (no compounding of its own mistakes).
    The model planner values candidate k by weighted_value(p_k, V(predicted_k), V(now)), p_k = confidence(.., conf);
    a predicted win counts as won only when p_k >= trust_win (else by what its state shows: see textgame_value);
    explore adds explore * (1 - p_k): of two candidates valued alike, the one whose outcome the model is less sure of.
    noop subtracts noop from a candidate predicted to change nothing: it spends a step, and if the model is wrong
    about it, its effect is unknown.
    memory: once the real next state of an executed (state, action) differs from the model's prediction, that pair
    is worth -inf for the rest of the episode ("block": chosen only if every candidate is as bad) or V(now) ("now").
    -> list of per-episode dicts: label, success, lost, steps, and per step: actions (the one executed), agree (the
    action is among the true simulator's best), acc (the taken action's prediction score), conf (its p), cand_acc
    and cand_exact (mean score and exact share over every candidate), tie (all candidates valued alike), repeat
    (the pair taken had been contradicted before). The per-step lists are empty for random and sim, except agree."""
    E = type(envs[0])
    max_steps, max_new_tokens = max_steps or E.max_steps, max_new_tokens or E.max_new_tokens
    rngs = [random.Random(f"plan:{seed}:{i}") for i in range(len(envs))]
    out = [dict(label=e.label(), success=False, lost=False, steps=0, actions=[], agree=[], acc=[], conf=[],
                cand_acc=[], cand_exact=[], tie=[], repeat=[]) for e in envs]
    wrong = [set() for _ in envs]  # per episode: the (state key, action) pairs whose prediction reality contradicted
    k = propose or (1 if planner == "policy" else 0)  # candidates narrowed to the policy's k best (0: all of them)

    def best(values, rng):  # index of the best value, ties broken at random
        top = max(values)
        return rng.choice([j for j, v in enumerate(values) if v == top])

    for _ in range(max_steps):
        live = [i for i, e in enumerate(envs) if not (e.won() or e.lost())]
        if not live:
            break
        obs = {i: envs[i].observe() for i in live}
        keys = {i: json.dumps(obs[i], sort_keys=True) for i in live}  # the state, hashable, for the memory
        cands = {i: envs[i].candidates() for i in live}
        truth = {i: [envs[i].simulate(a) for a in cands[i]] for i in live}
        true_values = {i: [envs[i].value(s) for s in truth[i]] for i in live}
        true_best = {i: max(true_values[i]) for i in live}  # over every valid action, for agree
        if k:  # only the policy's k best, best first
            for i in live:
                keep = envs[i].propose(cands[i], k, rngs[i])
                cands[i], truth[i], true_values[i] = ([xs[j] for j in keep]
                                                      for xs in (cands[i], truth[i], true_values[i]))
        if planner == "model":
            pairs = [(i, a) for i in live for a in cands[i]]
            preds = predict([envs[i].prompt(obs[i], a) for i, a in pairs], max_new_tokens)
            by_env = {i: [] for i in live}
            for (i, _), pred in zip(pairs, preds):
                by_env[i].append(pred)  # (text, log-probs) per candidate, in candidate order
        for i in live:
            e, rng, r = envs[i], rngs[i], out[i]
            if planner == "policy":
                j = 0
            elif planner == "random":
                j = rng.randrange(len(cands[i]))
            elif planner == "sim":
                j = best(true_values[i], rng)
            else:
                v_now, values, ps = e.value(obs[i]), [], []
                for a, (text, logps) in zip(cands[i], by_env[i]):
                    p = confidence(logps, conf)
                    ps.append(p)
                    if memory != "none" and (keys[i], a) in wrong[i]:  # reality contradicted this prediction
                        values.append(-math.inf if memory == "block" else v_now)
                        continue
                    pred = e.from_text(obs[i], text)
                    v_pred = e.value(pred, trust_win=p >= trust_win)
                    values.append(weighted_value(p, v_pred, v_now) + explore * (1 - p) - noop * (pred == obs[i]))
                j = best(values, rng)
                acc = [e.accuracy(t, obs[i], s) for (t, _), s in zip(by_env[i], truth[i])]
                r["acc"].append(acc[j])
                r["conf"].append(ps[j])
                r["cand_acc"].append(sum(acc) / len(acc))
                r["cand_exact"].append(sum(a == 1 for a in acc) / len(acc))
                r["tie"].append(all(v == values[0] for v in values))
                r["repeat"].append((keys[i], cands[i][j]) in wrong[i])
            r["agree"].append(true_values[i][j] == true_best[i])
            x = best(true_values[i], rng) if act == "sim" else j  # the action executed
            if planner == "model" and acc[x] < 1:  # its prediction was not the real next state: remember
                wrong[i].add((keys[i], cands[i][x]))
            r["actions"].append(e.action_text(cands[i][x]))
            e.step(cands[i][x])
            r["steps"] += 1
    for e, r in zip(envs, out):
        r["success"], r["lost"] = bool(e.won()), bool(e.lost())
    return out


def wilson(k, n, z=1.96):
    """The Wilson 95% interval of a success rate k / n."""
    centre, half = k + z * z / 2, z * math.sqrt(k * (n - k) / n + z * z / 4)
    return (centre - half) / (n + z * z), (centre + half) / (n + z * z)


def paired(a, b, resamples=10000, seed=0):
    """Success of episodes a minus that of episodes b (the same start states, in order) with its bootstrap 95%
    interval over the episodes. a may be a list of several seeds' episodes, averaged per start state first.
    -> (difference, low, high)."""
    runs = a if isinstance(a[0], list) else [a]
    x = [sum(float(r[i]["success"]) for r in runs) / len(runs) - float(q["success"]) for i, q in enumerate(b)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(x) for _ in x) / len(x) for _ in range(resamples))
    return sum(x) / len(x), means[int(0.025 * resamples) - 1], means[int(0.975 * resamples) - 1]


def summarize(results, max_steps):
    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    def steps(key):  # a per-step list pooled over all episodes
        return mean([x for r in results for x in r[key]])
    wins = [r for r in results if r["success"]]
    s = dict(episodes=len(results), success=mean([r["success"] for r in results]),
             success_ci=wilson(len(wins), len(results)),
             steps_success=mean([r["steps"] for r in wins]), steps_all=mean([r["steps"] for r in results]),
             lost=mean([r["lost"] for r in results]), agree=steps("agree"), wm_acc=steps("acc"),
             cand_acc=steps("cand_acc"), cand_exact=steps("cand_exact"), tie=steps("tie"), repeat=steps("repeat"),
             max_steps=max_steps)
    labels = sorted({r["label"] for r in results})
    s["success_by"] = {k: mean([r["success"] for r in results if r["label"] == k]) for k in labels}
    return s


def pct(x):
    return "     -" if x is None else f"{100 * x:6.2f}"


def num(x):
    return "    -" if x is None else f"{x:5.2f}"


def print_planners(rows):
    print(f"{'planner':<40} {'success%':>8} {'95% CI':>15} {'steps(won)':>10} {'steps(all)':>10} {'lost%':>6} "
          f"{'agree%':>7} {'wm_acc%':>7} {'cand_acc%':>9} {'cand_exact%':>11} {'tie%':>6} {'repeat%':>7} {'min':>5}")
    for name, s in rows.items():
        ci = "[{:.1f}, {:.1f}]".format(*(100 * x for x in s["success_ci"]))
        print(f"{name:<40} {pct(s['success']):>8} {ci:>15} {num(s['steps_success']):>10} {num(s['steps_all']):>10} "
              f"{pct(s['lost']):>6} {pct(s['agree']):>7} {pct(s['wm_acc']):>7} {pct(s['cand_acc']):>9} "
              f"{pct(s['cand_exact']):>11} {pct(s['tie']):>6} {pct(s['repeat']):>7} {s['minutes']:5.1f}")
    labels = list(next(iter(rows.values()))["success_by"])
    print(f"\nsuccess % by {'game' if 'cook-egg' in labels else 'site'}:")
    print(f"{'planner':<40} " + " ".join(f"{k:>11}" for k in labels))
    for name, s in rows.items():
        print(f"{name:<40} " + " ".join(f"{pct(s['success_by'][k]):>11}" for k in labels))

# -----------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # what to plan
    p.add_argument("--task", default="textgame", choices=sorted(ENVS))
    p.add_argument("--planners", default="random,sim",
                   help="comma-separated: random, sim (the true simulator), policy (web page: the word-overlap "
                        "policy's best action), or world-model checkpoints / HF dirs")
    p.add_argument("--episodes", type=int, default=100, help="held-out episodes (test-split rooms or sites)")
    p.add_argument("--split", default="test", choices=("test", "val"),
                   help="whose room layouts / sites (val: for development)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_steps", type=int, default=0, help="step cap (0 = task default: textgame 20, webpage 8)")
    p.add_argument("--act", default="planner", choices=("planner", "sim"),
                   help="sim: the true-simulator planner acts; each planner's decisions are scored on its states")
    # how the model planner uses its predictions (chosen on --split=val)
    p.add_argument("--conf", default="sum", choices=("none", "sum", "mean"),
                   help="confidence p of a prediction: exp(sum) or exp(mean) of its tokens' log-probs; none: p = 1")
    p.add_argument("--memory", default="block", choices=("none", "block", "now"),
                   help="a (state, action) whose prediction reality contradicted: never again (block), "
                        "worth V(now) (now), or forgotten (none)")
    p.add_argument("--trust_win", type=float, default=0.0,
                   help="text game: a predicted win counts +100 only when p >= this (0: always, discounted by --conf "
                        "alone; > 1: never)")
    p.add_argument("--explore", type=float, default=0.0,
                   help="bonus explore * (1 - p) per candidate: small values break ties toward unconfident predictions")
    p.add_argument("--noop", type=float, default=0.0,
                   help="penalty on a candidate predicted to change nothing (a wasted step, or an unforeseen effect)")
    p.add_argument("--propose", type=int, default=0,
                   help="web page: every planner chooses among the word-overlap policy's K best actions "
                        "(0: among every valid action)")
    p.add_argument("--web_value", default="graded", choices=("graded", "exact"),
                   help="web page: credit per goal line shown (graded), or per whole condition (exact)")
    # world model
    p.add_argument("--max_new_tokens", type=int, default=0, help="0 = task default: textgame 200, webpage 160")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for tiny models)")
    # output
    p.add_argument("--json", default=None, help="write the summaries and per-episode results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.episodes < 1:
        sys.exit(f"error: --episodes must be >= 1 (got {args.episodes})")
    names = [x.strip() for x in args.planners.split(",") if x.strip()]
    for name in names:
        if name not in BUILTIN and not Path(name).exists():
            sys.exit(f"error: --planners: {name!r} is neither random, sim, policy nor an existing checkpoint")
    if args.task != "webpage" and ("policy" in names or args.propose):
        sys.exit("error: --planners=policy and --propose are for --task=webpage (the text game has no policy)")
    if args.propose < 0:
        sys.exit(f"error: --propose must be >= 0 (got {args.propose})")
    E = ENVS[args.task]
    env_args = {"graded": args.web_value == "graded"} if args.task == "webpage" else {}
    max_steps = args.max_steps or E.max_steps
    rows, episodes = {}, {}
    for name in names:
        t0 = time.time()
        predict = None
        if name not in BUILTIN:
            try:
                predict = lm_predictor(name, args.device, args.batch_size)
            except ValueError as e:
                sys.exit(f"error: --planners: {e}")
        results = plan(E.episodes(args.episodes, args.seed, args.split, **env_args),
                       name if predict is None else "model", predict, args.seed, max_steps, args.max_new_tokens,
                       args.act, args.conf, args.memory, args.trust_win, args.explore, args.noop, args.propose)
        rows[name] = dict(summarize(results, max_steps), minutes=(time.time() - t0) / 60)
        episodes[name] = results
        print(f"{name}: success {pct(rows[name]['success']).strip()}% in {rows[name]['minutes']:.1f} min", flush=True)
    print()
    print_planners(rows)
    for name in names[1:]:  # every other planner against the first, over the same start states
        rows[name]["paired_vs_first"] = paired(episodes[name], episodes[names[0]])
        print(f"{name} - {names[0]}: " + "{:+.1f} [{:+.1f}, {:+.1f}] points, paired bootstrap 95%".format(
            *(100 * x for x in rows[name]["paired_vs_first"])))
    if args.json:
        write_json(args.json, {"args": vars(args), "summary": rows, "episodes": episodes})


if __name__ == "__main__":
    main()
