"""
k-step imagination: the world model predicts K consecutive recorded steps of an episode, each after
the first prompted with the state its own previous answer leads to and the next recorded action
(imagine_chains). RLVR samples G such chains per start state, every step at the sampling
temperature, and trains on every step's answer tokens with the chain's mean step reward from that
step on, grouped by step (--chain_reward=to_go: each step scored as the text game's exact state or
the web page's F1 of the changes), or with --chain_reward=last every answer with the chain's reward
of its last step (chain_hooks). The control is one step, teacher-forced, MLE continued for RLVR's
compute; --control_imagined=N also gives it the states the start imagines on N train chains
(imagined_pairs). The evaluation scores chains (evaluate_chains): per chain start `<headline>_k`
and the first step's metrics. Built on the core: tasks.PromptPool, common.rl_loop, tasks.train_control,
eval.evaluate_checkpoints.

    python research/chains.py --horizon=3 --out_dir=out/textgame_k3
    python research/chains.py --task=webpage --horizon=3 --out_dir=out/webpage_k3
"""
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from engine import generate  # noqa: E402
from eval import evaluate_checkpoints, print_comparison, summarize  # noqa: E402
from grpo import Env, GRPOConfig  # noqa: E402
from rewards import apply_diff, parse_diff, parse_sections  # noqa: E402
from research import common  # noqa: E402
from runtime import ComputeBudget  # noqa: E402
from tasks import (TASKS, PromptPool, crop, encode, encode_pair, generate_texts,  # noqa: E402
                   load_lang_model, train_control)
from data.webpage import task as webpage_task  # noqa: E402


@dataclass(frozen=True)
class Chaining:
    """What k-step imagination needs of a task: a chain is K consecutive recorded transitions of
    one episode, each step after the first prompted with the state the previous answer leads to."""
    state: str        # the record's key of the state a step starts from ("state", "observation")
    next_state: str   # the record's key of the state it leads to; record j+1 continues record j
                      # when its `state` is j's `next_state` and its other context keys are equal
    # imagine(text, record) -> the state the answer `text` leads to from the record's state, or
    # None when the answer cannot be read (the chain ends there, wrong)
    imagine: Callable
    # True: the last answer is scored on its imagined record (the imagined final state must be the
    # true one); False: on the recorded one (the last predicted changes against the true ones)
    judge_imagined: bool



def imagine_textgame(text, record):
    """The state the predicted diff leads to: merged into the record's state; None if unreadable."""
    diff = parse_diff(text)
    return None if diff is None else apply_diff(record["state"], diff)


def imagine_webpage(text, record):
    """The page the predicted changes lead to: merged into the record's page (always readable)."""
    return webpage_task.apply_changes(record["observation"], parse_sections(text))


# the tasks with k-step imagination (--horizon): how a state follows from an answer
CHAINING = {
    "textgame": Chaining("state", "next_state", imagine_textgame, judge_imagined=True),
    "webpage": Chaining("observation", "next_observation", imagine_webpage, judge_imagined=False),
}



# -----------------------------------------------------------------------------
# k-step imagination: chains of recorded steps, each later step prompted with an imagined state

def episode_chains(task, records, horizon):
    """Every run of `horizon` consecutive transitions of one episode in `records`, one per start
    record, in file order -> list of chains (lists of records). Record j+1 continues record j when
    its state is j's next state and its other context (game, site) is j's; the simulators' splits
    hold their episodes one after another, so these are exactly the episodes' runs
    (tests/test_imagination.py)."""
    if task not in CHAINING:
        raise ValueError(f"the {task} task has no k-step imagination (research/chains.py CHAINING)")
    c = CHAINING[task]

    def context(r):   # what must not change along an episode: all but the states and the action
        return {k: v for k, v in r.items() if k not in (c.state, c.next_state, "action")}

    follows = [a[c.next_state] == b[c.state] and context(a) == context(b)
               for a, b in zip(records, records[1:])]
    return [records[i:i + horizon] for i in range(len(records) - horizon + 1)
            if all(follows[i:i + horizon - 1])]


def imagine_chains(task, chains, predict):
    """K-step imagination: step 1 of each chain reads its recorded state, each later step the state
    the chain's previous answer leads to (Chaining.imagine) with the next recorded action.
    predict(step records) -> [(text, payload)], the answers (payload: whatever the caller wants
    back, e.g. sampled tokens; text None: no answer) -> per chain its steps [(record prompted,
    text, payload)]: K of them, fewer when an answer was unreadable or missing (the chain ends)."""
    c = CHAINING[task]
    steps = [[] for _ in chains]
    live = [(i, ch[0]) for i, ch in enumerate(chains)]   # (chain, the record its next step reads)
    for k in range(max(map(len, chains), default=0)):
        answers = predict([r for _, r in live]) if live else []
        following = []
        for (i, r), (text, payload) in zip(live, answers):
            if text is None:
                continue
            steps[i].append((r, text, payload))
            if k + 1 < len(chains[i]) and (state := c.imagine(text, r)) is not None:
                following.append((i, {**chains[i][k + 1], c.state: state}))
        live = following
    return steps


def scored_on(task, chain, k, record):
    """The record step k's answer is scored on, given the record it was prompted with: that
    imagined record, or the recorded step (Chaining.judge_imagined)."""
    return record if CHAINING[task].judge_imagined else chain[k]


def judged(task, chain, steps):
    """The chain's last answer and the record it is scored on (scored_on) -> (text, record), or
    None when the chain ended early."""
    if len(steps) < len(chain):
        return None
    record, text, _ = steps[-1]
    return text, scored_on(task, chain, len(chain) - 1, record)


def chain_reward(task, chain, steps, kind):
    """RLVR's reward of an imagined chain: reward `kind` of its last answer; 0 if it ended early."""
    j = judged(task, chain, steps)
    return 0.0 if j is None else TASKS[task].reward(*j, kind)


def step_rewards(task, chain, steps, kind):
    """Each step's own reward `kind`: step k's answer scored as chain_reward scores the last one
    (on the record scored_on gives) -> K floats, 0 for a step the chain did not reach."""
    rewards = [TASKS[task].reward(text, scored_on(task, chain, k, r), kind)
               for k, (r, text, _) in enumerate(steps)]
    return rewards + [0.0] * (len(chain) - len(steps))


def rewards_to_go(rewards):
    """Per step k the mean of the step rewards from k to the last: what step k's answer can still
    change (the answers before it are already given) -> K floats."""
    K = len(rewards)
    return [sum(rewards[k:]) / (K - k) for k in range(K)]


def text_predictor(model, tok, task, max_new_tokens, temperature=0.0, generator=None,
                   share=None):
    """predict for imagine_chains: generate_texts on the records' prompts (cropped as there;
    share: as there)."""
    data = TASKS[task].data

    def predict(records):
        prompts = [tok.encode(data.prompt_text(r)) for r in records]
        texts = generate_texts(model, tok, prompts, max_new_tokens, temperature,
                               generator=generator, share=share)
        return [(t, None) for t in texts]
    return predict


def imagined_pairs(task, model, tok, chains, max_new_tokens):
    """The stronger control's data (--control_imagined): the start model imagines
    each chain greedily, as the evaluation does, and every step after the first becomes an MLE
    pair: the prompt of the state it imagined, and the answer the chain's metric counts right
    there (scored_on: text game, the diff from the imagined state to the true next state, so
    the imagined chain returns to the truth; web page, the recorded changes) -> (pairs of
    (prompt text, answer text), the imagination's cost in forward-token units (prompt and answer
    tokens of every step, as grpo.step_stats counts a rollout), chains that ended early)."""
    data = TASKS[task].data
    steps = imagine_chains(task, chains, text_predictor(model, tok, task, max_new_tokens))
    pairs, cost = [], 0
    for chain, s in zip(chains, steps):
        for k, (record, text, _) in enumerate(s):
            cost += len(tok.encode(data.prompt_text(record))) + len(tok.encode(text)) + 1
            if k > 0:
                truth = scored_on(task, chain, k, record)
                pairs.append((data.prompt_text(record), data.target_text(truth)))
    return pairs, cost, sum(len(s) < len(ch) for ch, s in zip(chains, steps))


def sample_chains(task, model, tok, chains, max_new_tokens, temperature, room, generator):
    """RLVR's chain rollout: every step of every chain sampled at `temperature` in one batch per
    step; a step whose prompt exceeds `room` tokens ends its chain -> imagine_chains' steps, each
    payload (prompt ids, answer ids with EOS if written, their log-probs)."""
    data = TASKS[task].data

    def predict(records):
        prompts = [tok.encode(data.prompt_text(r)) for r in records]
        fit = [i for i, p in enumerate(prompts) if len(p) <= room]
        out = [(None, None)] * len(records)
        if not fit:
            return out
        tokens, logp = generate(model, [prompts[i] for i in fit], max_new_tokens,
                                temperature=temperature, eos_id=tok.eos_id, generator=generator,
                                vocab=tok.n_vocab)
        for i, row, lp in zip(fit, tokens.tolist(), logp.tolist()):
            ids = [t for t in row if t >= 0]   # -1 pads after EOS
            out[i] = (tok.decode([t for t in ids if t != tok.eos_id]), (prompts[i], ids,
                                                                          lp[:len(ids)]))
        return out
    return imagine_chains(task, chains, predict)


def chain_hooks(task, tok, draw, room, horizon, group_size, kind, per_step=False):
    """grpo_step's hooks for RLVR on chains of K = `horizon` steps (--horizon=K > 1)
    -> (draw, sampler, reward_fn); `draw(n)` is the prompt pool's (first prompts, chains). Each
    chain start's G = `group_size` chains are sampled at the config's temperature (every step:
    sample_chains, no prompt over `room` tokens) and laid out as K x G rows: row = one step, its
    prompt less the first token as input only, then its sampled answer, trained on. A step a chain
    did not reach is an empty row. The group's prompt is the first token, the one every prompt of
    the task begins with. The rows' rewards and groups:
    - per_step False: one GRPO group per start (group size K x G); every row of a chain carries
      the chain's reward `kind` (chain_reward), so the advantages are the chains';
    - per_step True: K groups per start, one per step (group size G); step k's row carries the
      chain's mean reward from step k on (rewards_to_go of step_rewards), so an answer is judged
      by what follows from it, against the other chains' answers at the same step."""
    K, G = horizon, group_size
    scored = []   # the rewards of the sampler's last rows, handed to grpo.py by reward_fn

    def draw_starts(n):   # n groups: the pool's chains, each with its first prompt's first token
        prompts, starts = draw(math.ceil(n / K) if per_step else n)
        reps = K if per_step else 1   # a start's groups
        firsts = [p[:1] for p in prompts for _ in range(reps)]
        return firsts, [c for c in starts for _ in range(reps)]

    def sampler(model, prompts, items, cfg, generator):   # grpo.rollout's hook
        starts, first = items[::K * G], prompts[::K * G]   # each start's K x G rows
        chains = [c for c in starts for _ in range(G)]
        steps = sample_chains(task, model, tok, chains, cfg.max_new_tokens, cfg.temperature, room,
                              generator)
        rows = []   # (token ids, their log-probs, sampled or input only)
        scored.clear()
        for i in range(len(starts)):
            cells = []   # (step k, chain g, its prompt and answer, its reward)
            for g in range(G):
                c, s = chains[i * G + g], steps[i * G + g]
                answers = [x[2] for x in s] + [(first[i], [], [])] * (K - len(s))
                if per_step:
                    rewards = rewards_to_go(step_rewards(task, c, s, kind))
                else:
                    rewards = [chain_reward(task, c, s, kind)] * K
                cells += [(k, g, answers[k], rewards[k]) for k in range(K)]
            if per_step:   # step-major: a group is one step's G answers
                cells.sort(key=lambda cell: cell[:2])
            for _, _, (prompt, ids, lp), reward in cells:
                if prompt[:1] != first[i]:
                    raise ValueError(f"--horizon: a {task} prompt does not begin with the "
                                     f"first token of the others")
                n = len(prompt) - 1
                rows.append((prompt[1:] + ids, [0.0] * n + lp, [False] * n + [True] * len(ids)))
                scored.append(reward)
        T = max(len(ids) for ids, _, _ in rows)
        tokens = torch.full((len(rows), T), -1, dtype=torch.long)
        logp, sampled = torch.zeros(len(rows), T), torch.zeros(len(rows), T, dtype=torch.bool)
        for i, (ids, lp, sm) in enumerate(rows):
            tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            logp[i, :len(ids)] = torch.tensor(lp)
            sampled[i, :len(ids)] = torch.tensor(sm, dtype=torch.bool)
        return tokens, logp, sampled

    def reward_fn(items, completions):   # the rows' rewards, as the sampler scored them
        assert len(scored) == len(completions), "reward_fn: not the sampler's last rows"
        return list(scored)

    return draw_starts, sampler, reward_fn


def probe_chain_rewards(task, model, tok, chains, kind, max_new_tokens, samples=4):
    """probe_rewards for K-step chains: the mean chain_reward, greedy and over `samples` sampled
    chains each at T=1 from a fixed seed -> dict(probe_greedy, probe_reward). Leaves the model in
    training mode."""
    def mean_reward(chs, temperature, generator=None):
        steps = imagine_chains(task, chs, text_predictor(model, tok, task, max_new_tokens,
                                                         temperature, generator))
        return sum(chain_reward(task, c, s, kind) for c, s in zip(chs, steps)) / len(chs)
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        greedy = mean_reward(chains, 0.0)
        sampled = mean_reward(chains * samples, 1.0, g)
    model.train()
    return dict(probe_greedy=greedy, probe_reward=sampled)


def evaluate_chains(task, model, tok, chains, max_new_tokens=256, share=None):
    """Score K-step imagination greedily on chains of K recorded steps (episode_chains), one
    result per chain, shaped as `evaluate`'s: per chain the first step's metrics (its answer from
    the recorded state) and `<headline>_k`, the last answer's headline metric scored as
    judged says (text game: the imagined final state is exact; web page: the F1 of the K-th
    predicted changes against the true ones); 0 for a chain whose answer became unreadable (counted
    in n_ended). A chain is "changed" when any of its steps changes something; the baseline answers
    "nothing changes" at every step. per_record["episode"] numbers the chains' episodes (chains
    of one episode overlap: the next starts at this one's second record), so that a bootstrap can
    resample an episode's chains together. share: as evaluate's."""
    T = TASKS[task]
    h_k = T.headline + "_k"
    changed = [any(map(T.data.is_changed, c)) for c in chains]

    def score(predict):   # the per-chain metrics, the chains' steps
        steps = imagine_chains(task, chains, predict)
        out = []
        for c, s in zip(chains, steps):
            j = judged(task, c, s)
            out.append(T.score(s[0][1], c[0]) | {h_k: T.score(*j)[T.headline] if j else 0.0})
        return out, steps

    scores, steps = score(text_predictor(model, tok, task, max_new_tokens, share=share))
    no_change = score(lambda records: [(T.no_change, None)] * len(records))[0]
    prompts = [tok.encode(T.data.prompt_text(c[0])) for c in chains]
    res = dict(summarize(scores, changed), n=len(chains), n_changed=sum(changed),
               n_cropped=crop(prompts, model.config.block_size, max_new_tokens)[1],
               horizon=len(chains[0]), n_ended=sum(len(s) < len(c) for c, s in zip(chains, steps)),
               baseline_no_change=summarize(no_change, changed))
    res["examples"] = [dict(actions=[r["action"] for r in c], changed=ch,
                            predictions=[text for _, text, _ in s])
                       for c, ch, s in list(zip(chains, changed, steps))[:5]]
    episode = [0]
    for a, b in zip(chains, chains[1:]):   # a new episode where a chain does not continue the last
        episode.append(episode[-1] + (len(a) < 2 or b[0] != a[1]))
    res["per_record"] = ({k: [float(m[k]) for m in scores] for k in scores[0]}
                         | {"changed": changed, "episode": episode})
    return res




# -----------------------------------------------------------------------------
# the study: RLVR on chains from an MLE checkpoint, the one-step control, chains evaluated

def main():
    p = common.parser(__doc__)
    p.add_argument("--horizon", type=int, default=3, help="K: steps per chain")
    p.add_argument("--chain_reward", default="to_go", choices=("last", "to_go"))
    p.add_argument("--control_imagined", type=int, default=0,
                   help="train chains whose imagined states the control also learns")
    args = p.parse_args()
    if args.horizon < 2 or args.task not in CHAINING:
        p.error(f"--horizon must be >= 2 (one step is train_lang.py), --task one of {set(CHAINING)}")
    task, K = TASKS[args.task], args.horizon
    reward = args.reward or task.rewards[0]
    run, (train, val, test), init, model, tok = common.setup(args)
    out_dir = run.out_dir
    cfg = dataclasses.replace(common.rl_config(args), vocab=tok.n_vocab)
    rl = rlvr_on_chains(run, model, tok, args, cfg, train, reward)
    ckpts = {"mle": init, "rlvr": str(rl)}
    if args.control:   # for the compute RLVR's checkpoint records
        budget = ComputeBudget(common.rl_compute(rl))
        ckpts["mle_more"] = str(control(run, init, tok, args, train, val, budget))
    splits = {"val": episode_chains(args.task, val, K)[:args.val_limit or None],
              "test": episode_chains(args.task, test, K)[:args.test_limit or None]}

    def score(model, chains, share):
        return evaluate_chains(args.task, model, tok, chains, cfg.max_new_tokens, share)
    results = evaluate_checkpoints(args.task, ckpts, tok, splits, cfg.max_new_tokens, run.device,
                                   run.autocast, 2 if run.forks else 1, score=score)
    for split, r in results.items():
        write_json(out_dir / ("eval.json" if split == "test" else "eval_val.json"), r)
        print_comparison(args.task, split, r, metrics=(task.headline + "_k", task.headline),
                         what=f"chains of {K} steps")


def rlvr_on_chains(run, model, tok, args, cfg, train, reward):
    """GRPO on chains of --horizon steps (chain_hooks) -> the checkpoint."""
    data, K = TASKS[args.task].data, args.horizon
    parts = common.policy(run, model, cfg, grad_ckpt=args.grad_ckpt)
    gen = torch.Generator().manual_seed(args.seed + 1000)
    room = model.config.block_size - cfg.max_new_tokens
    pool = PromptPool(episode_chains(args.task, train, K), lambda c: data.prompt_text(c[0]),
                      lambda c: any(map(data.is_changed, c)), tok, room, 0.3, gen)
    per_step = args.chain_reward == "to_go"
    draw, sampler, score = chain_hooks(args.task, tok, pool, room, K, cfg.group_size, reward,
                                       per_step)
    if not per_step:   # a group is a start's K x G rows; per step, a step's G rows
        cfg = dataclasses.replace(cfg, group_size=K * cfg.group_size)
    probe_chains = pool(64)[1]

    def probe():
        return probe_chain_rewards(args.task, parts[0], tok, probe_chains, reward,
                                   cfg.max_new_tokens)
    ckpt = run.out_dir / "rlvr.safetensors"
    common.rl_loop(run, parts, Env(score, tok.eos_id, draw, sampler), cfg, gen, ckpt,
                   args.rl_steps, None, probe, 10)
    return ckpt


def control(run, init, tok, args, train, val, budget):
    """train_lang.py's control (tasks.train_control) for RLVR's compute, one step teacher-forced
    (plus, with --control_imagined, the start's imagined states, their cost taken from the
    budget) -> the checkpoint."""
    pairs = [encode(args.task, tok, r) for r in train]
    if args.control_imagined:   # the stronger control: the start's own imagined states as well
        model = load_lang_model(init, run.device)[0]
        g = torch.Generator().manual_seed(args.seed)
        chains = episode_chains(args.task, train, args.horizon)
        chains = [chains[i] for i in torch.randperm(len(chains), generator=g).tolist()]
        with run.autocast:
            more, cost, _ = imagined_pairs(args.task, model, tok, chains[:args.control_imagined],
                                           args.max_new_tokens)
        pairs += [encode_pair(tok, a, b) for a, b in more]
        # the imagination is part of the control's compute (RLVR has finished: the budget is final)
        budget = ComputeBudget(max(budget.rl.value - cost, 0.0))
    return train_control(run, args.task, tok, init, pairs, val, budget, args.max_new_tokens)


if __name__ == "__main__":
    main()
