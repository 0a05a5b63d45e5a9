"""research/plan.py (model-predictive control with a world model), research/envs.py (the environments
and their value functions) and the planning parts of the simulators: valid actions, held-out start states, web
goals, the value functions, and the planner loop with the true simulator, an oracle text model (the truth written
as a model would write it) and a tiny random GPT."""
import copy
import json
import math
import random
from pathlib import Path

import pytest

from research import envs, plan
from checkpoint import save_checkpoint
from data.textgame import simulator as tg_sim, task as tg_task
from data.webpage import simulator as web_sim, task as web_task
from model import GPT, GPTConfig
from rewards import apply_diff, parse_sections

TOKENIZER = Path(plan.__file__).parents[1] / "checkpoints" / "textgame" / "tokenizer.tiktoken"


# ----------------------------------------------------------------------------- text game

def test_planning_rooms_use_test_layouts_only():
    rooms = tg_sim.planning_rooms(60, seed=0)
    assert [w.game for w in rooms[:5]] == sorted(tg_sim.GAMES)
    held = 0
    for w in rooms:
        kinds = [o["name"].split(" (ID")[0] for o in w.objects[1:]]
        if tg_sim.HELD_OUT <= set(kinds):
            held += 1
        else:
            assert tg_sim.layout_bucket(w.game, kinds) in tg_sim.SPLIT_BUCKETS["test"]
        assert not w.score["gameOver"]
    assert held >= 5
    same = tg_sim.planning_rooms(60, seed=0)
    assert [w.snapshot() for w in rooms] == [w.snapshot() for w in same]
    assert [w.snapshot() for w in rooms] != [w.snapshot() for w in tg_sim.planning_rooms(60, seed=1)]
    with pytest.raises(ValueError, match="split"):
        tg_sim.planning_rooms(3, split="dev")


def test_valid_actions_include_every_scripted_step():
    for w in tg_sim.planning_rooms(25, seed=3, split="val"):
        for _ in range(tg_sim.MAX_STEPS):
            actions = tg_sim.valid_actions(w)
            assert len(actions) == len(set(actions)) and ("wait",) in actions
            step = tg_sim.scripted_step(w)
            assert step in actions, (w.game, step)
            w.act(step)
            w.tick()
            if w.score["gameOver"]:
                break
        assert w.score["gameWon"]


def test_value_of_won_lost_and_progress():
    w = tg_sim.World("cook-egg", ["agent", "stove", "pot", "egg"])
    assert envs.steps_to_win("cook-egg", envs.Room(w.snapshot())) == 2 + 2 + 1 + 3  # egg, pot, stove on, 3 ticks
    for action in [("take", "egg"), ("eat", "egg")]:
        w.act(action)
        w.tick()
    assert envs.textgame_value("cook-egg", w.snapshot()) == envs.LOSE
    won = tg_sim.World("chill-milk", ["agent", "fridge", "milk"])
    won.props("fridge")["isOpen"] = True
    for action in [("take", "milk"), ("put", "milk", "fridge"), ("wait",)]:
        won.act(action)
        won.tick()
    assert won.score["gameWon"] and envs.textgame_value("chill-milk", won.snapshot()) == envs.WIN
    assert envs.textgame_value("chill-milk", None) == -math.inf


def test_objects_are_read_by_uuid():
    """A predicted "pot (ID: 2)" carrying the knife's uuid is the knife, as the reward sees it."""
    w = tg_sim.World("cook-egg", ["agent", "pot", "knife", "egg", "stove"])
    kinds = {o["uuid"]: k for k, o in w.by_kind.items()}
    wrong = {"modified": [{"name": "pot (ID: 2)", "uuid": 2, "type": "Pot", "properties": {"temp": 20},
                           "contains": ["egg (ID: 3)"]}], "removed": [], "score": {}}
    right = {"modified": [{"name": "pot (ID: 1)", "uuid": 1, "type": "Pot", "properties": {"temp": 20},
                           "contains": ["egg (ID: 3)"]}], "removed": [], "score": {}}
    base = envs.textgame_value("cook-egg", w.snapshot(), kinds)
    assert envs.textgame_value("cook-egg", apply_diff(w.snapshot(), right), kinds) == base + 2  # egg in pot
    assert envs.textgame_value("cook-egg", apply_diff(w.snapshot(), wrong), kinds) == base  # the egg is in the knife
    assert envs.textgame_value("cook-egg", apply_diff(w.snapshot(), wrong)) == base + 2     # read by name instead


@pytest.mark.parametrize("state", [
    {}, {"objects": "x", "score": []}, {"objects": [1, None, {"name": 3}], "score": {"gameWon": "yes"}},
    {"objects": [{"name": "egg (ID: 4)", "uuid": [1], "properties": {"temp": float("nan"), "isCooked": "no"},
                  "contains": ["egg (ID: 4)", 7]},
                 {"name": "pot (ID: 9)", "uuid": 9, "properties": [], "contains": ["pot (ID: 9)"]},
                 {"name": "stove", "uuid": 1, "properties": {"isOn": 1}, "contains": None}], "score": {}},
    {"objects": [{"name": f"{k} (ID: {10**500})", "uuid": 10**400, "properties": {"temp": 10**400, "water": -1e308,
                  "growth": float("inf"), "isOpen": None}, "contains": [f"{k} (ID: 99)"]} for k in tg_sim.KINDS],
     "score": {"gameOver": 1}},
])
def test_value_never_raises_on_garbage(state):
    for game in tg_sim.GAMES:
        assert isinstance(envs.textgame_value(game, state, {1: "stove", 9: "pot"}), float)


# ----------------------------------------------------------------------------- web page

def test_apply_changes_inverts_the_diff():
    for r in web_sim.generate_split("val", 300, seed=1):
        obs, nxt = r["observation"], r["next_observation"]
        assert web_task.tree_lines(web_task.apply_changes(obs, web_task.diff_items(obs, nxt))) == \
            web_task.tree_lines(nxt)
        assert web_task.apply_changes(obs, parse_sections(web_task.diff_text(obs, nxt))) == "\n".join(
            web_task.tree_lines(nxt))
    obs = "[1] RootWebArea 'a'\n[2] link 'b'\n[5] button 'c'"
    items = {"new": ["[3] link 'x'", "None", "[9] link 'z'", "junk"], "deleted": ["[7] link 'q'", "None"],
             "updated": ["[5] button 'c' pressed: True"]}
    assert web_task.apply_changes(obs, items).splitlines() == [
        "[1] RootWebArea 'a'", "[2] link 'b'", "[3] link 'x'", "[5] button 'c' pressed: True", "[9] link 'z'", "junk"]


def test_web_goals_are_solvable_by_valid_actions_and_not_yet_met():
    episodes = web_sim.planning_episodes(40, seed=2, split="val")
    assert {p.site for p, _ in episodes} == set(web_sim.SITES)
    for page, goal in episodes:
        assert web_sim.bucket(page.site, page.owner, page.user) in web_sim.SPLIT_BUCKETS["val"]
        assert envs.web_value(goal, page.render()) < 10
        sim = copy.deepcopy(page)
        for i, action in enumerate(goal["solution"]):
            assert action in web_sim.valid_actions(sim, goal["texts"]), (goal["instruction"], action)
            sim.act(action)
            assert set(goal["conditions"][i]) <= set(sim.render().splitlines())
        assert envs.web_value(goal, sim.render()) >= 10
    with pytest.raises(ValueError, match="split"):
        web_sim.planning_episodes(3, split="dev")


# ----------------------------------------------------------------------------- the planner

def oracle(episodes):
    """A perfect text world model: the true answer for every (state, action) prompt of the running episodes."""
    def predict(prompts, max_new_tokens):
        table = {}
        for e in episodes:
            obs = e.observe()
            for a in e.candidates():
                nxt = e.simulate(a)
                table[e.prompt(obs, a)] = (tg_task.compact(tg_task.make_diff(obs, nxt)) if isinstance(e, envs.TextGame)
                                           else web_task.diff_text(obs, nxt))
        return [(table[p], [0.0]) for p in prompts]  # certain of every answer: p = exp(0) = 1
    return predict


@pytest.mark.parametrize("E,n", [(envs.TextGame, 30), (envs.WebPage, 30)])
def test_sim_planner_wins_random_does_not_and_an_oracle_model_equals_sim(E, n):
    sim = plan.plan(E.episodes(n, 0, "val"), "sim")
    rnd = plan.plan(E.episodes(n, 0, "val"), "random")
    s_sim, s_rnd = plan.summarize(sim, E.max_steps), plan.summarize(rnd, E.max_steps)
    assert s_sim["success"] == 1.0 and s_sim["agree"] == 1.0 and s_sim["lost"] == 0.0
    assert s_rnd["success"] < 0.6 and s_rnd["agree"] < 0.6
    assert s_sim["steps_success"] < s_rnd["steps_success"]
    for conf, memory in [("none", "none"), ("sum", "block"), ("mean", "now")]:  # a perfect model: all the same
        episodes = E.episodes(n, 0, "val")
        orc = plan.plan(episodes, "model", oracle(episodes), conf=conf, memory=memory, trust_win=0.5)
        assert [(r["success"], r["steps"]) for r in orc] == [(r["success"], r["steps"]) for r in sim]
        assert all(a == 1.0 for r in orc for a in r["acc"] + r["cand_exact"])
        assert not any(x for r in orc for x in r["repeat"])


@pytest.mark.parametrize("task,by", [("textgame", "game"), ("webpage", "site")])
def test_tiny_model_planner_runs_deterministically(tmp_path, capsys, task, by):
    model = GPT(GPTConfig(vocab_size=449, block_size=512, n_layer=1, n_head=2, n_embd=32))
    ckpt = tmp_path / "tiny.safetensors"
    save_checkpoint(ckpt, model, args={"tokenizer": str(TOKENIZER)})
    out = tmp_path / "plan.json"
    argv = [f"--task={task}", "--planners=random,sim," + str(ckpt), "--episodes=3", "--max_steps=2",
            "--max_new_tokens=6", "--split=val", "--conf=mean", "--memory=block", f"--json={out}"]
    plan.main(argv)
    first = json.loads(out.read_text())
    plan.main(argv)
    again = json.loads(out.read_text())
    assert first["episodes"] == again["episodes"]
    row = first["summary"][str(ckpt)]
    assert row["episodes"] == 3 and 0 <= row["wm_acc"] <= 1 and row["steps_all"] <= 2
    assert 0 <= row["cand_exact"] <= 1 and 0 <= row["success_ci"][0] <= row["success"] <= row["success_ci"][1]
    for r in first["episodes"][str(ckpt)]:  # per episode: success, and per step the taken prediction's confidence
        assert isinstance(r["success"], bool) and len(r["conf"]) == r["steps"] and all(0 <= p <= 1 for p in r["conf"])
    assert f"success % by {by}" in capsys.readouterr().out


def test_web_policy_scores_by_instruction_words_and_proposals_narrow_every_planner():
    lines = {3: "[3] link 'CATALOG' expanded: False", 8: "[8] textbox 'Email'", 9: "[9] button 'Save'"}
    score = envs.web_policy_score
    assert score("open Products from the CATALOG menu", lines, ("click", 3)) == 1
    assert score("open Products from the CATALOG menu", lines, ("scroll", "down")) == 0
    assert score("open Products from the CATALOG menu", lines, ("click", 99)) == 0       # not on screen
    # typing: the field's words and the typed text's words both count ("the", "with", "a", "and" do not)
    assert score("save a customer with Email ann@x.org and City Oslo", lines, ("type", 8, "ann@x.org")) == 1 + 3
    assert score("save a customer with Email ann@x.org and City Oslo", lines, ("type", 8, "Oslo")) == 1 + 1
    assert score("save a customer with Email ann@x.org and City Oslo", lines, ("click", 9)) == 1
    n = 20
    for e in envs.WebPage.episodes(n, 0, "val"):  # best first, ties in random order, a subset of the candidates
        actions, lines = e.candidates(), {x.id: x.line() for x in e.page.visible()}
        keep = e.propose(actions, 3, random.Random(0))
        scores = [score(e.goal["instruction"], lines, actions[j]) for j in keep]
        assert len(keep) == len(set(keep)) == min(3, len(actions)) and scores == sorted(scores, reverse=True)
        assert scores[0] == max(score(e.goal["instruction"], lines, a) for a in actions)
    pol = plan.plan(envs.WebPage.episodes(n, 0, "val"), "policy")
    sim2 = plan.plan(envs.WebPage.episodes(n, 0, "val"), "sim", propose=2)
    for planner, k in [(pol, 1), (sim2, 2)]:  # replayed: each action taken is among the policy's k best there
        for e, r in zip(envs.WebPage.episodes(n, 0, "val"), planner):
            for taken in r["actions"]:
                actions, lines = e.candidates(), {x.id: x.line() for x in e.page.visible()}
                scores = sorted((score(e.goal["instruction"], lines, a) for a in actions), reverse=True)
                a = next(a for a in actions if web_sim.action_text(a) == taken)
                assert score(e.goal["instruction"], lines, a) >= scores[k - 1]
                e.step(a)
    # agree is measured against every valid action: the sim planner among 2 proposals misses the best sometimes
    assert plan.summarize(pol, 8)["agree"] < plan.summarize(sim2, 8)["agree"] < 1


def test_cli_rejects_unknown_planner(tmp_path):
    with pytest.raises(SystemExit, match="--planners: 'nope' is neither"):
        plan.main(["--planners=random,nope"])
    with pytest.raises(SystemExit, match="--episodes"):
        plan.main(["--episodes=0"])
    with pytest.raises(SystemExit, match="--task=webpage"):
        plan.main(["--task=textgame", "--planners=policy"])
    with pytest.raises(SystemExit, match="--propose must be"):
        plan.main(["--task=webpage", "--propose=-1"])


# ------------------------------------------------------------------ what the model planner does with predictions

class Ladder:
    """A toy environment for the planner's rules: climb from rung 0 to rung 3 with "up"; "stay" does nothing.
    Its value is the rung (a win is worth envs.WIN); a model's answer is the rung it predicts, as text."""
    max_steps, max_new_tokens = 8, 4

    def __init__(self):
        self.rung = 0

    def label(self):
        return "ladder"

    def observe(self):
        return self.rung

    def candidates(self):
        return ["stay", "up"]

    def action_text(self, action):
        return action

    def prompt(self, obs, action):
        return f"{obs}:{action}"

    def simulate(self, action):
        return self.rung + (action == "up")

    def from_text(self, obs, text):
        return int(text)

    def value(self, rung, trust_win=True):
        return envs.WIN if rung >= 3 and trust_win else float(min(rung, 3))

    def step(self, action):
        self.rung = self.simulate(action)

    def won(self):
        return self.rung >= 3

    def lost(self):
        return False

    def accuracy(self, text, obs, next_obs):
        return float(int(text) == next_obs)


def boaster(p_stay):
    """A model right about "up" (certain), but sure, with probability p_stay, that "stay" wins at once."""
    def predict(prompts, max_new_tokens):
        out = []
        for prompt in prompts:
            rung, action = prompt.split(":")
            out.append(("3", [math.log(p_stay)]) if action == "stay" else (str(int(rung) + 1), [0.0]))
        return out
    return predict


def test_memory_blocks_a_contradicted_pair():
    # p = 0.9 for "stay": worth 0.9 * 100 + 0.1 * rung > 1 for "up" at rungs 0 and 1, < 100 for "up" at rung 2
    blind = plan.plan([Ladder()], "model", boaster(0.9), conf="sum", memory="none")[0]
    assert not blind["success"] and blind["repeat"] == [False] + [True] * 7  # "stay" at rung 0, 8 times
    for memory in ("block", "now"):  # rungs 0 and 1: "stay" once (contradicted), then "up"; rung 2: "up"
        r = plan.plan([Ladder()], "model", boaster(0.9), conf="sum", memory=memory)[0]
        assert r["success"] and r["steps"] == 5 and not any(r["repeat"]) and r["acc"] == [0.0, 1.0, 0.0, 1.0, 1.0]


def test_confidence_weighting_math_and_its_use():
    assert plan.confidence([-1.0, -1.0], "sum") == pytest.approx(math.exp(-2))
    assert plan.confidence([-1.0, -3.0], "mean") == pytest.approx(math.exp(-2))
    assert plan.confidence([-9.0], "none") == 1.0 and plan.confidence(None, "sum") == 0.0
    assert plan.weighted_value(0.25, 10.0, 2.0) == pytest.approx(4.0)   # 0.25 * 10 + 0.75 * 2
    assert plan.weighted_value(0.0, -math.inf, 2.0) == 2.0              # no confidence: the state as it is
    assert plan.weighted_value(0.5, -math.inf, 2.0) == -math.inf        # an unreadable answer stays the worst
    # "stay" at p = 0.01 is worth 0.01 * 100 + 0.99 * 0 = 1.0 at rung 0: a tie with a certain "up" (1.0)
    # p = 0.005: 0.5 < 1, so "up" wins at every rung, with no memory needed
    r = plan.plan([Ladder()], "model", boaster(0.005), conf="sum")[0]
    assert r["success"] and r["steps"] == 3 and r["conf"] == [1.0] * 3
    assert not plan.plan([Ladder()], "model", boaster(0.005), conf="none")[0]["success"]  # trusts the boast


def test_an_unconfident_predicted_win_is_not_trusted():
    # "stay" at p = 0.3, a trusted win: 0.3 * 100 + 0.7 * rung > rung + 1 for "up", so "stay" forever. Untrusted
    # (p < trust_win), valued by its rung: 0.3 * 3 + 0.7 * rung < rung + 1 at every rung, so "up" thrice
    assert not plan.plan([Ladder()], "model", boaster(0.3), conf="sum", trust_win=0.2)[0]["success"]
    r = plan.plan([Ladder()], "model", boaster(0.3), conf="sum", trust_win=0.5)[0]
    assert r["success"] and r["steps"] == 3 and r["acc"] == [1.0] * 3
    w = tg_sim.World("chill-milk", ["agent", "fridge", "milk"])
    claimed = dict(w.snapshot(), score={"gameWon": True, "gameOver": True})  # a win claimed, nothing done
    assert envs.textgame_value("chill-milk", claimed) == envs.WIN
    assert envs.textgame_value("chill-milk", claimed, trust_win=False) == envs.textgame_value("chill-milk",
                                                                                               w.snapshot())


def fixed(answers):
    """A model whose answer to an action is answers[action] = (rung change, its probability), at every rung."""
    def predict(prompts, max_new_tokens):
        out = []
        for prompt in prompts:
            rung, action = prompt.split(":")
            change, p = answers[action]
            out.append((str(int(rung) + change), [math.log(p)]))
        return out
    return predict


def test_explore_breaks_ties_toward_the_unconfident_prediction():
    # "up" wrongly predicted to do nothing (p = 0.5), "stay" rightly (p = 1): both worth the rung, a tie
    model = fixed({"up": (0, 0.5), "stay": (0, 1.0)})
    r = plan.plan([Ladder()], "model", model, conf="sum", explore=0.01)[0]
    assert r["success"] and r["steps"] == 3 and r["actions"] == ["up"] * 3
    ties = plan.plan([Ladder() for _ in range(8)], "model", model, conf="sum")
    assert all(r["tie"][0] for r in ties) and {r["actions"][0] for r in ties} == {"up", "stay"}   # a coin


def test_noop_penalty_prefers_a_predicted_change():
    # "up" wrongly predicted to go down (p = 0.2): worth rung - 0.2, below a certain "stay" (rung): stay forever;
    # a predicted no-change costs 0.5: "stay" is worth rung - 0.5 and "up" is taken (then remembered as contradicted)
    model = fixed({"up": (-1, 0.2), "stay": (0, 1.0)})
    assert plan.plan([Ladder()], "model", model, conf="sum", memory="none")[0]["actions"] == ["stay"] * 8
    r = plan.plan([Ladder()], "model", model, conf="sum", memory="none", noop=0.5)[0]
    assert r["success"] and r["actions"] == ["up"] * 3


def test_paired_difference_and_its_interval():
    a, b = [dict(success=x) for x in (1, 1, 0, 1, 1, 0)], [dict(success=x) for x in (0, 1, 0, 0, 1, 0)]
    d, lo, hi = plan.paired(a, b)
    assert d == pytest.approx(2 / 6) and 0 <= lo < d < hi <= 4 / 6 + 1e-9   # a resample's mean is at most 4/6
    assert plan.paired(a, a) == (0, 0, 0)
    # seeds pooled: the mean success per start state first (here (1 + 0) / 2 on every state), then the difference
    c = [dict(success=1 - x["success"]) for x in a]
    assert plan.paired([a, c], b)[0] == pytest.approx(0.5 - 2 / 6) and plan.paired([a], b) == plan.paired(a, b)


def test_graded_web_value_credits_each_goal_line():
    goal = {"conditions": [["[3] link 'A' expanded: True"], ["[9] heading 'B'", "[1] RootWebArea 'B'"]]}
    page = "[1] RootWebArea 'B'\n[2] link 'x'"
    assert envs.web_value(goal, page) == 5.0 and envs.web_value(goal, page, graded=False) == 0.0
    page += "\n  [3] link   'A' expanded: True"  # whitespace does not matter
    assert envs.web_value(goal, page) == 6.0 and envs.web_value(goal, page, graded=False) == 1.0
    page += "\n[9] heading 'B'"
    assert envs.web_value(goal, page) == envs.web_value(goal, page, graded=False) == 11.0
    env = envs.WebPage.episodes(1, 0, "val")[0]
    assert not env.won() and env.value(env.observe()) < 10


def test_predictor_returns_generate_texts_answers_with_their_log_probs(tmp_path):
    torch = pytest.importorskip("torch")
    from tasks import generate_texts, load_lang_model
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=449, block_size=64, n_layer=1, n_head=2, n_embd=32))
    ckpt = tmp_path / "tiny.safetensors"
    save_checkpoint(ckpt, model, args={"tokenizer": str(TOKENIZER)})
    predict = plan.lm_predictor(ckpt, batch_size=2)
    prompts = ["game:cook-egg", "action:wait diff:", "x" * 300, "state:{}"]  # the third does not fit
    preds = predict(prompts, 8)
    m, tok, _ = load_lang_model(ckpt)
    fits = [0, 1, 3]
    assert [preds[i][0] for i in fits] == generate_texts(m, tok, [tok.encode(prompts[i]) for i in fits], 8, 0.0, 2)
    assert preds[2] == ("", None)
    for i in fits:
        assert 1 <= len(preds[i][1]) <= 8 and all(lp <= 0 for lp in preds[i][1])
