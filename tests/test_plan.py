"""plan.py (model-predictive control with a world model) and the planning parts of the simulators: valid actions,
held-out start states, web goals, the value functions, and the planner loop with the true simulator, an oracle
text model (the truth written as a model would write it) and a tiny random GPT."""
import copy
import json
import math

import pytest

from experiments import plan
from checkpoint import save_checkpoint
from data.textgame import simulator as tg_sim, task as tg_task
from data.webpage import simulator as web_sim, task as web_task
from model import GPT, GPTConfig
from rewards import apply_diff, parse_sections

TOKENIZER = plan.Path(plan.__file__).parents[1] / "checkpoints" / "textgame" / "tokenizer.tiktoken"


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
    assert plan.steps_to_win("cook-egg", plan.Room(w.snapshot())) == 2 + 2 + 1 + 3  # egg, pot, stove on, 3 ticks
    for action in [("take", "egg"), ("eat", "egg")]:
        w.act(action)
        w.tick()
    assert plan.textgame_value("cook-egg", w.snapshot()) == plan.LOSE
    won = tg_sim.World("chill-milk", ["agent", "fridge", "milk"])
    won.props("fridge")["isOpen"] = True
    for action in [("take", "milk"), ("put", "milk", "fridge"), ("wait",)]:
        won.act(action)
        won.tick()
    assert won.score["gameWon"] and plan.textgame_value("chill-milk", won.snapshot()) == plan.WIN
    assert plan.textgame_value("chill-milk", None) == -math.inf


def test_objects_are_read_by_uuid():
    """A predicted "pot (ID: 2)" carrying the knife's uuid is the knife, as the reward sees it."""
    w = tg_sim.World("cook-egg", ["agent", "pot", "knife", "egg", "stove"])
    kinds = {o["uuid"]: k for k, o in w.by_kind.items()}
    wrong = {"modified": [{"name": "pot (ID: 2)", "uuid": 2, "type": "Pot", "properties": {"temp": 20},
                           "contains": ["egg (ID: 3)"]}], "removed": [], "score": {}}
    right = {"modified": [{"name": "pot (ID: 1)", "uuid": 1, "type": "Pot", "properties": {"temp": 20},
                           "contains": ["egg (ID: 3)"]}], "removed": [], "score": {}}
    base = plan.textgame_value("cook-egg", w.snapshot(), kinds)
    assert plan.textgame_value("cook-egg", apply_diff(w.snapshot(), right), kinds) == base + 2  # egg in pot
    assert plan.textgame_value("cook-egg", apply_diff(w.snapshot(), wrong), kinds) == base  # the egg is in the knife
    assert plan.textgame_value("cook-egg", apply_diff(w.snapshot(), wrong)) == base + 2     # read by name instead


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
        assert isinstance(plan.textgame_value(game, state, {1: "stove", 9: "pot"}), float)


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
        assert plan.web_value(goal, page.render()) < 10
        sim = copy.deepcopy(page)
        for i, action in enumerate(goal["solution"]):
            assert action in web_sim.valid_actions(sim, goal["texts"]), (goal["instruction"], action)
            sim.act(action)
            assert set(goal["conditions"][i]) <= set(sim.render().splitlines())
        assert plan.web_value(goal, sim.render()) >= 10
    with pytest.raises(ValueError, match="split"):
        web_sim.planning_episodes(3, split="dev")


# ----------------------------------------------------------------------------- the planner

def oracle(envs):
    """A perfect text world model: the true answer for every (state, action) prompt of the running episodes."""
    def predict(prompts, max_new_tokens):
        table = {}
        for e in envs:
            obs = e.observe()
            for a in e.candidates():
                nxt = e.simulate(a)
                table[e.prompt(obs, a)] = (tg_task.compact(tg_task.make_diff(obs, nxt)) if isinstance(e, plan.TextGame)
                                           else web_task.diff_text(obs, nxt))
        return [table[p] for p in prompts]
    return predict


@pytest.mark.parametrize("E,n", [(plan.TextGame, 30), (plan.WebPage, 30)])
def test_sim_planner_wins_random_does_not_and_an_oracle_model_equals_sim(E, n):
    sim = plan.plan(E.episodes(n, 0, "val"), "sim")
    rnd = plan.plan(E.episodes(n, 0, "val"), "random")
    s_sim, s_rnd = plan.summarize(sim, E.max_steps), plan.summarize(rnd, E.max_steps)
    assert s_sim["success"] == 1.0 and s_sim["agree"] == 1.0 and s_sim["lost"] == 0.0
    assert s_rnd["success"] < 0.6 and s_rnd["agree"] < 0.6
    assert s_sim["steps_success"] < s_rnd["steps_success"]
    envs = E.episodes(n, 0, "val")
    orc = plan.plan(envs, "model", oracle(envs))
    assert [(r["success"], r["steps"]) for r in orc] == [(r["success"], r["steps"]) for r in sim]
    assert all(a == 1.0 for r in orc for a in r["acc"])


@pytest.mark.parametrize("task,by", [("textgame", "game"), ("webpage", "site")])
def test_tiny_model_planner_runs_deterministically(tmp_path, capsys, task, by):
    model = GPT(GPTConfig(vocab_size=449, block_size=512, n_layer=1, n_head=2, n_embd=32))
    ckpt = tmp_path / "tiny.safetensors"
    save_checkpoint(ckpt, model, args={"tokenizer": str(TOKENIZER)})
    out = tmp_path / "plan.json"
    argv = [f"--task={task}", "--planners=random,sim," + str(ckpt), "--episodes=3", "--max_steps=2",
            "--max_new_tokens=6", "--split=val", f"--json={out}"]
    plan.main(argv)
    first = json.loads(out.read_text())
    plan.main(argv)
    again = json.loads(out.read_text())
    assert first["episodes"] == again["episodes"]
    row = first["summary"][str(ckpt)]
    assert row["episodes"] == 3 and 0 <= row["wm_acc"] <= 1 and row["steps_all"] <= 2
    assert f"success % by {by}" in capsys.readouterr().out


def test_cli_rejects_unknown_planner(tmp_path):
    with pytest.raises(SystemExit, match="--planners: 'nope' is neither"):
        plan.main(["--planners=random,nope"])
    with pytest.raises(SystemExit, match="--episodes"):
        plan.main(["--episodes=0"])
