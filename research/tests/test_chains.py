"""k-step imagination (research/chains.py): chains are runs of the simulators' episodes, each
step after the first reads the state its previous answer leads to, and the chain metrics score the
right answer; a tiny --horizon=2 run writes eval.json of the usual shape (slow)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.textgame.simulator import MAX_STEPS as TEXT_STEPS, generate_split as text_split
from data.webpage.simulator import MAX_STEPS as WEB_STEPS, generate_split as web_split
from model import GPT, GPTConfig
from research import chains as chaining
from research.chains import (chain_hooks, chain_reward, episode_chains, evaluate_chains,
                             imagine_chains, judged, rewards_to_go, step_rewards)
from rewards import apply_diff, parse_diff
from tasks import TASKS, PromptPool
from tokenizer_text import Tokenizer

ROOT = Path(__file__).resolve().parents[2]


def text_episode_starts(records):
    """Where the text game's episodes begin: after a game over, or after MAX_STEPS records."""
    starts, length = [0], 0
    for i, r in enumerate(records[:-1]):
        length += 1
        if r["next_state"]["score"]["gameOver"] or length == TEXT_STEPS:
            starts.append(i + 1)
            length = 0
    return starts


def runs(n, starts, horizon):
    """The start indices of every run of `horizon` records inside one episode."""
    ends = starts[1:] + [n]
    return [i for s, e in zip(starts, ends) for i in range(s, e - horizon + 1)]


@pytest.mark.parametrize("horizon", [1, 2, 3])
def test_text_chains_are_runs_inside_the_simulators_episodes(horizon):
    records = text_split("val", 300)
    got = episode_chains("textgame", records, horizon)
    want = runs(len(records), text_episode_starts(records), horizon)
    assert got == [records[i:i + horizon] for i in want]


@pytest.mark.parametrize("horizon", [2, 3])
def test_web_chains_are_runs_inside_the_simulators_episodes(horizon):
    records = web_split("val", 100)   # every episode is WEB_STEPS records long
    got = episode_chains("webpage", records, horizon)
    want = runs(len(records), list(range(0, len(records), WEB_STEPS)), horizon)
    assert got == [records[i:i + horizon] for i in want]


def test_a_task_without_chaining_is_one_clear_error():
    with pytest.raises(ValueError, match="lights task has no k-step imagination"):
        episode_chains("lights", [], 2)


def a_changing_chain(horizon=3):
    """A text-game chain of `horizon` steps whose first step changes the state."""
    T = TASKS["textgame"]
    for c in episode_chains("textgame", text_split("val", 300), horizon):
        if T.data.is_changed(c[0]) and T.data.is_changed(c[-1]):
            return c
    raise AssertionError("no changing chain")


def answers(table):
    """A predict for imagine_chains that answers step k with table[k], whatever the record."""
    calls = []

    def predict(records):
        calls.append(records)
        return [(table[len(calls) - 1], None)] * len(records)
    return predict, calls


def test_each_step_reads_the_state_its_previous_answer_leads_to():
    T, chain = TASKS["textgame"], a_changing_chain()
    truth = [T.data.target_text(r) for r in chain]
    predict, calls = answers(truth)
    steps = imagine_chains("textgame", [chain], predict)[0]
    assert [r for r, _, _ in steps] == [chain[0], chain[1], chain[2]]   # right answers: true states
    assert judged("textgame", chain, steps) == (truth[2], chain[2])
    assert chain_reward("textgame", chain, steps, "binary") == 1.0
    # a wrong first answer ("nothing changes"): step 2 reads the start state with step 2's action
    wrong = [T.no_change] + truth[1:]
    predict, calls = answers(wrong)
    steps = imagine_chains("textgame", [chain], predict)[0]
    assert steps[1][0] == {**chain[1], "state": chain[0]["state"]}
    assert steps[2][0]["state"] == apply_diff(chain[0]["state"], parse_diff(truth[1]))
    assert chain_reward("textgame", chain, steps, "binary") == 0.0   # the first change is lost


def test_step_rewards_score_each_answer_and_rewards_to_go_average_what_follows():
    T = TASKS["textgame"]
    chain = next(c for c in episode_chains("textgame", text_split("val", 300), 3)
                 if all(map(T.data.is_changed, c)))
    truth = [T.data.target_text(r) for r in chain]
    # right, then "nothing changes" (wrong), then the true third answer on a wrong state
    steps = imagine_chains("textgame", [chain], answers([truth[0], T.no_change, truth[2]])[0])[0]
    assert step_rewards("textgame", chain, steps, "binary") == [1.0, 0.0, 0.0]
    assert rewards_to_go([1.0, 0.0, 0.0]) == [1 / 3, 0.0, 0.0]
    assert rewards_to_go([0.0, 1.0, 1.0]) == [2 / 3, 1.0, 1.0]
    # a chain that ended early: its missing steps score 0
    steps = imagine_chains("textgame", [chain], answers(["not json"] * 3)[0])[0]
    assert step_rewards("textgame", chain, steps, "binary") == [0.0, 0.0, 0.0]
    # web: each answer on its recorded step
    W = TASKS["webpage"]
    web = episode_chains("webpage", web_split("val", 16), 2)[0]
    right = [W.data.target_text(r) for r in web]
    steps = imagine_chains("webpage", [web], answers([W.no_change, right[1]])[0])[0]
    assert step_rewards("webpage", web, steps, "f1")[1] == 1.0


def test_an_unreadable_answer_ends_the_chain_as_wrong():
    chain = a_changing_chain()
    predict, calls = answers(["not json"] * 3)
    steps = imagine_chains("textgame", [chain], predict)[0]
    assert len(steps) == 1 and len(calls) == 1
    assert judged("textgame", chain, steps) is None
    assert chain_reward("textgame", chain, steps, "binary") == 0.0


def test_web_scores_the_last_answer_on_the_recorded_step():
    T = TASKS["webpage"]
    chain = episode_chains("webpage", web_split("val", 16), 2)[0]
    truth = [T.data.target_text(r) for r in chain]
    steps = imagine_chains("webpage", [chain], answers(truth)[0])[0]
    # right answers: the imagined page is the true page, line for line
    assert steps[1][0]["observation"].splitlines() == T.data.tree_lines(chain[1]["observation"])
    assert judged("webpage", chain, steps) == (truth[1], chain[1])
    assert chain_reward("webpage", chain, steps, "f1") == 1.0


def tiny_model(records):
    T = TASKS["textgame"]
    tok = Tokenizer.train([T.data.prompt_text(r) + T.data.target_text(r) for r in records], 300)
    torch.manual_seed(0)
    cfg = GPTConfig.llama(vocab_size=tok.n_vocab, block_size=1024, n_layer=1, n_head=2, n_embd=32)
    return GPT(cfg), tok


def test_evaluate_chains_per_record_shape_and_baseline():
    records = text_split("val", 40)
    chains = episode_chains("textgame", records, 2)[16:22]   # consecutive, across an episode's end
    model, tok = tiny_model(records)
    r = evaluate_chains("textgame", model, tok, chains, max_new_tokens=8)
    pr = r["per_record"]
    assert set(pr) == {"accuracy", "task_specific", "accuracy_k", "changed", "episode"}
    assert all(len(v) == 6 for v in pr.values()) and r["n"] == 6 and r["horizon"] == 2
    # the chains' episodes: the simulator's own episode of each chain's first record, renumbered
    first = [records.index(c[0]) for c in chains]
    starts = text_episode_starts(records)
    truth = [sum(s <= i for s in starts) for i in first]
    assert pr["episode"] == [t - truth[0] for t in truth] and len(set(truth)) == 2
    assert r["accuracy_k"] == sum(pr["accuracy_k"]) / 6
    # "nothing changes" at every step is exact on the chains that change nothing, only
    T = TASKS["textgame"]
    unchanged = [not any(map(T.data.is_changed, c)) for c in chains]
    assert r["baseline_no_change"]["accuracy_k"] == sum(unchanged) / 6


@pytest.mark.slow
def test_tiny_horizon_run_writes_chain_results(tmp_path):
    data = tmp_path / "data"
    subprocess.run([sys.executable, "data/textgame/prepare.py", "--n_train=300", "--n_val=30",
                    "--n_test=30", f"--out_dir={data}"], cwd=ROOT, check=True, capture_output=True)
    tiny = ["--n_layer=1", "--n_embd=32", "--batch_size=8", "--max_new_tokens=64"]
    subprocess.run([sys.executable, "train_lang.py", "--stage=mle", "--init=scratch",
                    f"--data_dir={data}", f"--out_dir={tmp_path / 'mle'}", "--mle_steps=20", *tiny],
                   cwd=ROOT, check=True, capture_output=True)
    init = tmp_path / "mle" / "mle.safetensors"
    p = subprocess.run([sys.executable, "research/chains.py", f"--init={init}",
                        f"--data_dir={data}", f"--out_dir={tmp_path / 'out'}", "--horizon=2",
                        "--rl_steps=2", "--batch_size=8", "--test_limit=8", "--val_limit=4",
                        "--max_new_tokens=64", "--group_size=4", "--prompts_per_step=2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for name, n in (("eval.json", 8), ("eval_val.json", 4)):
        result = json.loads((tmp_path / "out" / name).read_text())
        assert set(result) == {"mle", "rlvr", "mle_more"}
        for r in result.values():
            assert r["n"] == n and r["horizon"] == 2
            assert set(r["per_record"]) == {"accuracy", "task_specific", "accuracy_k", "changed",
                                            "episode"}
    assert "chains of 2 steps" in p.stdout and "paired differences in accuracy_k" in p.stdout
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    steps = [row for row in log if row["stage"] == "rlvr" and "reward_mean" in row]
    assert len(steps) == 2
    # the update's log-probs of the sampled answers are the sampler's: the first ratio is 1
    for row in steps:
        assert row["ratio_first"] != row["ratio_first"] or abs(row["ratio_first"] - 1) < 1e-3


def test_prompt_pool_of_chains_draws_whole_chains_by_their_first_prompt():
    T = TASKS["textgame"]
    records = text_split("val", 120)
    model, tok = tiny_model(records)
    pool = PromptPool(episode_chains("textgame", records, 3), lambda c: T.data.prompt_text(c[0]),
                      lambda c: any(map(T.data.is_changed, c)), tok, 10_000, 0.5,
                      torch.Generator().manual_seed(0))
    assert len(pool.changed) + len(pool.unchanged) == len(episode_chains("textgame", records, 3))
    prompts, chains = pool(6)
    assert all(len(c) == 3 for c in chains)
    assert prompts == [tok.encode(T.data.prompt_text(c[0])) for c in chains]
    assert [any(map(T.data.is_changed, c)) for c in chains] == [True] * 3 + [False] * 3


def test_sampled_chains_carry_each_steps_prompt_answer_and_log_probs():
    from research.chains import sample_chains
    T = TASKS["textgame"]
    records = text_split("val", 60)
    chains = episode_chains("textgame", records, 2)[:3]
    model, tok = tiny_model(records)
    with torch.no_grad():
        steps = sample_chains("textgame", model, tok, chains, 12, 1.0, 10_000,
                              torch.Generator().manual_seed(0))
    for s in steps:
        for record, text, (prompt, ids, logp) in s:
            assert prompt == tok.encode(T.data.prompt_text(record))
            assert text == tok.decode([t for t in ids if t != tok.eos_id])
            assert len(logp) == len(ids) and all(lp <= 0 for lp in logp)
    # a step whose prompt exceeds the room ends its chain before it is sampled
    with torch.no_grad():
        none = sample_chains("textgame", model, tok, chains, 12, 1.0, 10,
                             torch.Generator().manual_seed(0))
    assert none == [[], [], []]


@pytest.mark.parametrize("per_step", [False, True])
def test_chain_hooks_lay_out_groups_and_rewards(per_step, monkeypatch):
    """Rows of a start: chain-major with the chain's reward (one group of K x G), or step-major
    with each step's reward to go (K groups of G)."""
    records = text_split("val", 120)
    chains = episode_chains("textgame", records, 2)[:2]
    model, tok = tiny_model(records)
    K, G = 2, 3
    # each sampled chain j's step k answers with token ids [k, j]; its step rewards are given
    step_r = {}

    def fake_sample(task, model, tok, chs, max_new, temperature, room, generator):
        out = []
        for j, c in enumerate(chs):
            prompts = [tok.encode(TASKS["textgame"].data.prompt_text(r)) for r in c]
            out.append([(r, f"{k}{j}", (p, [k + 10, j + 10], [-0.5, -0.5]))
                        for k, (r, p) in enumerate(zip(c, prompts))])
            step_r[j] = [float((j + k) % 2) for k in range(K)]
        return out
    monkeypatch.setattr(chaining, "sample_chains", fake_sample)
    monkeypatch.setattr(chaining, "step_rewards", lambda t, c, s, kind: step_r[int(s[0][1][1:])])
    monkeypatch.setattr(chaining, "chain_reward", lambda t, c, s, kind: step_r[int(s[0][1][1:])][-1])

    def draw(n):
        return [tok.encode(TASKS["textgame"].data.prompt_text(c[0])) for c in chains[:n]], chains[:n]
    draw_groups, sampler, reward_fn = chain_hooks("textgame", tok, draw, 10_000, K, G, "binary",
                                                  per_step)
    prompts, items = draw_groups(2 * K if per_step else 2)
    assert len(prompts) == (2 * K if per_step else 2)
    size = G if per_step else K * G   # train_lang.py's GRPO group size
    reps = [(p, it) for p, it in zip(prompts, items) for _ in range(size)]
    from grpo import GRPOConfig
    cfg = GRPOConfig(group_size=size, max_new_tokens=4)
    tokens, logp, sampled = sampler(model, [p for p, _ in reps], [it for _, it in reps], cfg, None)
    rewards = reward_fn(None, [None] * len(tokens))
    assert len(tokens) == len(rewards) == 2 * K * G
    answer = [tuple(t for t, m in zip(row.tolist(), s.tolist()) if m)
              for row, s in zip(tokens, sampled)]
    for start in range(2):
        for k in range(K):
            for g in range(G):
                j = start * G + g   # the sampled chain
                row = start * K * G + (k * G + g if per_step else g * K + k)
                assert answer[row] == (k + 10, j + 10)
                want = rewards_to_go(step_r[j])[k] if per_step else step_r[j][-1]
                assert rewards[row] == want


def test_imagined_pairs_label_the_imagined_states_with_what_the_chain_metric_counts(monkeypatch):
    """The stronger control's pairs: every step after the first, prompted with the imagined state;
    text game: the answer leads the imagined state to the true next one; web: the recorded one."""
    T = TASKS["textgame"]
    chain = next(c for c in episode_chains("textgame", text_split("val", 300), 2)
                 if all(map(T.data.is_changed, c)))
    model, tok = tiny_model(text_split("val", 60))
    # step 1 answers "nothing changes" (wrong): step 2 reads the start state with action 2
    monkeypatch.setattr(chaining, "text_predictor",
                        lambda *a, **k: answers([T.no_change, T.no_change])[0])
    pairs, cost, ended = chaining.imagined_pairs("textgame", model, tok, [chain], 8)
    assert len(pairs) == 1 and ended == 0 and cost > 0
    imagined = {**chain[1], "state": chain[0]["state"]}
    assert pairs[0][0] == T.data.prompt_text(imagined)
    assert apply_diff(imagined["state"], parse_diff(pairs[0][1])) == chain[1]["next_state"]
    W = TASKS["webpage"]
    web = episode_chains("webpage", web_split("val", 16), 2)[0]
    monkeypatch.setattr(chaining, "text_predictor",
                        lambda *a, **k: answers([W.no_change, W.no_change])[0])
    pairs, _, _ = chaining.imagined_pairs("webpage", model, tok, [web], 8)
    assert pairs == [(W.data.prompt_text({**web[1], "observation": web[0]["observation"]}),
                      W.data.target_text(web[1]))]
