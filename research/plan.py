"""
Planning with a language world model: model-predictive control (MPC) in the text game and on the web site.

    python research/plan.py --task=textgame --planners=random,sim,checkpoints/textgame/mle.safetensors,out/textgame/rlvr.safetensors
    python research/plan.py --task=webpage --planners=random,sim,checkpoints/webpage/mle.safetensors,out/webpage/rlvr.safetensors
    python research/plan.py --task=textgame --planners=random,checkpoints/textgame/mle.safetensors --act=sim   (decisions only)
    python research/plan.py --task=textgame --planners=sim --episodes=20 --split=val --json=plan.json      (a quick look)
    python research/plan.py --task=webpage --planners=out/webpage/rlvr.safetensors --device=cuda --batch_size=256
    python research/plan.py --task=webpage --planners=policy,checkpoints/webpage/mle.safetensors --propose=3

At every step the agent predicts the next state of each candidate action with the world model (all
candidates of all running episodes in one batched greedy generate call), values each prediction with
the fixed value function of its environment (research/envs.py), takes the best action in the real
simulator and repeats. A planner is `random` (the floor), `sim` (the true simulator as the model:
the ceiling), `policy` (the web's word-overlap policy) or a world-model checkpoint.
research/README.md explains the flags and the reported columns, with the results.
"""
import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from engine import generate  # noqa: E402
from eval import pct  # noqa: E402
from research.envs import ENVS  # noqa: E402
from stats import paired_bootstrap  # noqa: E402
from tasks import crop, load_lang_model  # noqa: E402

BUILTIN = ("random", "sim", "policy")  # the planners that need no world-model checkpoint
# each task's planner settings, chosen on validation episodes (research/README.md): the defaults of
# --noop, --trust_win and --propose when the flag is left unset
TASK_DEFAULTS = {"textgame": dict(noop=0.5, trust_win=0.5, propose=0),
                 "webpage": dict(noop=0.0, trust_win=0.0, propose=3)}


def task_default(flag):
    """The --help text of a flag's per-task default, e.g. "textgame 0.5, webpage 0"."""
    return ", ".join(f"{task} {d[flag]:g}" for task, d in TASK_DEFAULTS.items())

# -----------------------------------------------------------------------------
# the world model's predictions and how far the planner believes them

def lm_predictor(path, device="cpu", batch_size=64):
    """A world-model checkpoint -> predict(prompts, max_new_tokens) -> one (greedy completion, its
    tokens' log-probs) per prompt. The batching is generate_texts' (sorted by length, cropped
    alike); a prompt longer than the model's context gets ("", None): no prediction. Answers are
    cached by prompt: a planner that stays in a state asks the same questions again (a batch's
    answer room is set by its longest prompt, so a cached answer is the one its first batch
    allowed)."""
    model, tok, _ = load_lang_model(path, device)
    model.eval()
    cache = {}  # (prompt, max_new_tokens) -> (text, log-probs)

    def predict(prompts, max_new_tokens):
        # the prompts not seen yet, once each, in order
        new = list(dict.fromkeys(p for p in prompts if (p, max_new_tokens) not in cache))
        ids = [tok.encode(p) for p in new]
        for i, x in enumerate(ids):
            if len(x) >= model.config.block_size:  # too long: no prediction
                cache[new[i], max_new_tokens] = ("", None)
        fits = [i for i, x in enumerate(ids) if len(x) < model.config.block_size]
        cropped = crop([ids[i] for i in fits], model.config.block_size, max_new_tokens)[0]
        # shortest first: less padding
        order = sorted(range(len(fits)), key=lambda k: len(cropped[k]))
        with torch.no_grad():
            for s in range(0, len(order), batch_size):
                batch = order[s:s + batch_size]
                room = model.config.block_size - max(len(cropped[k]) for k in batch)
                tokens, logps = generate(model, [cropped[k] for k in batch],
                                         min(max_new_tokens, room), temperature=0.0,
                                         eos_id=tok.eos_id)  # (B, N) each; -1 after eos
                for k, row, lp in zip(batch, tokens.tolist(), logps.tolist()):
                    text = tok.decode([t for t in row if t >= 0 and t != tok.eos_id])
                    # the log-probs of the answer's tokens, its eos included
                    logp = [x for t, x in zip(row, lp) if t >= 0]
                    cache[new[fits[k]], max_new_tokens] = (text, logp)
        return [cache[p, max_new_tokens] for p in prompts]
    return predict


def confidence(logps, mode):
    """The world model's probability of its own answer, from its tokens' log-probs. mode "sum":
    exp(sum), the whole answer's probability; "mean": exp(mean), the per-token geometric mean (long
    answers are not punished for their length); "none": 1, every prediction trusted. No prediction
    (logps None) is worth nothing: 0."""
    if mode == "none":
        return 1.0
    if logps is None:
        return 0.0
    total = sum(logps)
    return math.exp(total if mode == "sum" else total / max(1, len(logps)))


def weighted_value(p, v_pred, v_now):
    """V = p * V(predicted) + (1 - p) * V(now): the predicted change counts as far as the model
    believes it."""
    if p == 0 or v_pred == v_now:  # no information, or no change (and 0 * -inf would be nan)
        return v_now
    return p * v_pred + (1 - p) * v_now


def model_values(e, obs, key, cands, preds, wrong, conf, memory, trust_win, explore, noop):
    """The model planner's value of each candidate action of env e in state obs (key: the state,
    hashable), from preds (its (text, log-probs) per candidate) -> (values, confidences).
    See plan for conf, memory, trust_win, explore and noop; wrong: the episode's contradicted
    (state key, action) pairs."""
    v_now, values, ps = e.value(obs), [], []
    for a, (text, logps) in zip(cands, preds):
        p = confidence(logps, conf)
        ps.append(p)
        if memory != "none" and (key, a) in wrong:  # reality contradicted this prediction
            values.append(-math.inf if memory == "block" else v_now)
            continue
        pred = e.from_text(obs, text)
        v_pred = e.value(pred, trust_win=p >= trust_win)
        values.append(weighted_value(p, v_pred, v_now) + explore * (1 - p) - noop * (pred == obs))
    return values, ps


# -----------------------------------------------------------------------------
# the planner

def plan(envs, planner, predict=None, seed=0, max_steps=None, max_new_tokens=None, act="planner",
         conf="none", memory="none", trust_win=0.0, explore=0.0, noop=0.0, propose=0):
    """Run every episode to its end with `planner` ("random", "sim", "model", which uses `predict`,
    or "policy", the web policy's best action; see WebPage.propose).
    propose=k (web page): every planner chooses among the policy's k best actions instead of every
    valid action; agree is still measured against the best of every valid action.
    act="sim": the true-simulator planner acts instead, so a model's decisions are scored on the
    states a perfect planner visits (no compounding of its own mistakes).
    The model planner values candidate k by weighted_value(p_k, V(predicted_k), V(now)),
    p_k = confidence(.., conf); a predicted win counts as won only when p_k >= trust_win (else by
    what its state shows: see envs.textgame_value); explore adds explore * (1 - p_k): of two
    candidates valued alike, the one whose outcome the model is less sure of. noop subtracts noop
    from a candidate predicted to change nothing: it spends a step, and if the model is wrong about
    it, its effect is unknown.
    memory: once the real next state of an executed (state, action) differs from the model's
    prediction, that pair is worth -inf for the rest of the episode ("block": chosen only if every
    candidate is as bad) or V(now) ("now").
    -> list of per-episode dicts: label, success, lost, steps, and per step: actions (the one
    executed), agree (the action is among the true simulator's best), acc (the taken action's
    prediction score), conf (its p), cand_acc and cand_exact (mean score and exact share over every
    candidate), tie (all candidates valued alike), repeat (the pair taken had been contradicted
    before). The per-step lists are empty for random and sim, except agree."""
    E = type(envs[0])
    max_steps, max_new_tokens = max_steps or E.max_steps, max_new_tokens or E.max_new_tokens
    rngs = [random.Random(f"plan:{seed}:{i}") for i in range(len(envs))]
    out = [dict(label=e.label(), success=False, lost=False, steps=0, actions=[], agree=[], acc=[],
                conf=[], cand_acc=[], cand_exact=[], tie=[], repeat=[]) for e in envs]
    # per episode: the (state key, action) pairs whose prediction reality contradicted
    wrong = [set() for _ in envs]
    # candidates narrowed to the policy's k best (0: all of them)
    k = propose or (1 if planner == "policy" else 0)

    def best(values, rng):  # index of the best value, ties broken at random
        top = max(values)
        return rng.choice([j for j, v in enumerate(values) if v == top])

    for _ in range(max_steps):
        live = [i for i, e in enumerate(envs) if not (e.won() or e.lost())]
        if not live:
            break
        # every live episode's state, candidates and their true outcomes and values
        obs = {i: envs[i].observe() for i in live}
        keys = {i: json.dumps(obs[i], sort_keys=True) for i in live}  # the state, hashable
        cands = {i: envs[i].candidates() for i in live}
        truth = {i: [envs[i].simulate(a) for a in cands[i]] for i in live}
        true_values = {i: [envs[i].value(s) for s in truth[i]] for i in live}
        true_best = {i: max(true_values[i]) for i in live}  # over every valid action, for agree
        if k:  # only the policy's k best, best first
            for i in live:
                keep = envs[i].propose(cands[i], k, rngs[i])
                cands[i], truth[i], true_values[i] = (
                    [xs[j] for j in keep] for xs in (cands[i], truth[i], true_values[i]))
        # the model's predictions of every candidate of every live episode, in one call
        if planner == "model":
            pairs = [(i, a) for i in live for a in cands[i]]
            preds = predict([envs[i].prompt(obs[i], a) for i, a in pairs], max_new_tokens)
            by_env = {i: [] for i in live}
            for (i, _), pred in zip(pairs, preds):
                by_env[i].append(pred)  # (text, log-probs) per candidate, in candidate order
        # each episode chooses its action j, then executes x (j, or sim's choice with act="sim")
        for i in live:
            e, rng, r = envs[i], rngs[i], out[i]
            if planner == "policy":
                j = 0
            elif planner == "random":
                j = rng.randrange(len(cands[i]))
            elif planner == "sim":
                j = best(true_values[i], rng)
            else:
                values, ps = model_values(e, obs[i], keys[i], cands[i], by_env[i], wrong[i], conf,
                                          memory, trust_win, explore, noop)
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
            if planner == "model" and acc[x] < 1:  # its prediction was not the real next state
                wrong[i].add((keys[i], cands[i][x]))
            r["actions"].append(e.action_text(cands[i][x]))
            e.step(cands[i][x])
            r["steps"] += 1
    for e, r in zip(envs, out):
        r["success"], r["lost"] = bool(e.won()), bool(e.lost())
    return out


# -----------------------------------------------------------------------------
# statistics and tables

def wilson(k, n, z=1.96):
    """The Wilson 95% interval of a success rate k / n."""
    centre, half = k + z * z / 2, z * math.sqrt(k * (n - k) / n + z * z / 4)
    return (centre - half) / (n + z * z), (centre + half) / (n + z * z)


def paired(a, b):
    """Success of episodes a minus that of episodes b (the same start states, in order) with its
    paired bootstrap 95% interval over the episodes (eval.paired_bootstrap). a may be a list of
    several seeds' episodes: seeds and start states are resampled. -> (difference, low, high)."""
    runs = a if isinstance(a[0], list) else [a]
    success = [[float(r["success"]) for r in run] for run in runs]   # (seeds, episodes)
    return paired_bootstrap(success, [[float(q["success"]) for q in b]])


def summarize(results, max_steps):
    """One planner's episodes -> its row: success with its Wilson interval, steps, lost, the
    per-step shares pooled over all episodes, and success per game or site."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    def steps(key):  # a per-step list pooled over all episodes
        return mean([x for r in results for x in r[key]])
    wins = [r for r in results if r["success"]]
    s = dict(episodes=len(results), success=mean([r["success"] for r in results]),
             success_ci=wilson(len(wins), len(results)),
             steps_success=mean([r["steps"] for r in wins]),
             steps_all=mean([r["steps"] for r in results]),
             lost=mean([r["lost"] for r in results]), agree=steps("agree"), wm_acc=steps("acc"),
             cand_acc=steps("cand_acc"), cand_exact=steps("cand_exact"), tie=steps("tie"),
             repeat=steps("repeat"), max_steps=max_steps)
    labels = sorted({r["label"] for r in results})
    s["success_by"] = {k: mean([r["success"] for r in results if r["label"] == k]) for k in labels}
    return s


def num(x):
    return "    -" if x is None else f"{x:5.2f}"


def print_planners(rows):
    """The planners' table (rows: name -> summarize's row with its minutes), then success per game
    or site."""
    print(f"{'planner':<40} {'success%':>8} {'95% CI':>15} {'steps(won)':>10} {'steps(all)':>10} "
          f"{'lost%':>6} {'agree%':>7} {'wm_acc%':>7} {'cand_acc%':>9} {'cand_exact%':>11} "
          f"{'tie%':>6} {'repeat%':>7} {'min':>5}")
    for name, s in rows.items():
        ci = "[{:.1f}, {:.1f}]".format(*(100 * x for x in s["success_ci"]))
        print(f"{name:<40} {pct(s['success']):>8} {ci:>15} {num(s['steps_success']):>10} "
              f"{num(s['steps_all']):>10} {pct(s['lost']):>6} {pct(s['agree']):>7} "
              f"{pct(s['wm_acc']):>7} {pct(s['cand_acc']):>9} {pct(s['cand_exact']):>11} "
              f"{pct(s['tie']):>6} {pct(s['repeat']):>7} {s['minutes']:5.1f}")
    labels = list(next(iter(rows.values()))["success_by"])
    print(f"\nsuccess % by {'game' if 'cook-egg' in labels else 'site'}:")
    print(f"{'planner':<40} " + " ".join(f"{k:>11}" for k in labels))
    for name, s in rows.items():
        print(f"{name:<40} " + " ".join(f"{pct(s['success_by'][k]):>11}" for k in labels))


# -----------------------------------------------------------------------------
# command line

def main(argv=None):
    p = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    # what to plan
    p.add_argument("--task", default="textgame", choices=sorted(ENVS))
    p.add_argument("--planners", default="random,sim",
                   help="comma-separated: random, sim (the true simulator), policy (web page: the "
                        "word-overlap policy's best action), or world-model checkpoints / HF dirs")
    p.add_argument("--episodes", type=int, default=100,
                   help="held-out episodes (test-split rooms or sites)")
    p.add_argument("--split", default="test", choices=("test", "val"),
                   help="whose room layouts / sites (val: for development)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max_steps", type=int, default=0,
                   help="step cap (0 = task default: textgame 20, webpage 8)")
    p.add_argument("--act", default="planner", choices=("planner", "sim"),
                   help="sim: the true-simulator planner acts; each planner's decisions are scored "
                        "on its states")
    # how the model planner uses its predictions (chosen on --split=val)
    p.add_argument("--conf", default="sum", choices=("none", "sum", "mean"),
                   help="confidence p of a prediction: exp(sum) or exp(mean) of its tokens' "
                        "log-probs; none: p = 1")
    p.add_argument("--memory", default="block", choices=("none", "block", "now"),
                   help="a (state, action) whose prediction reality contradicted: never again "
                        "(block), worth V(now) (now), or forgotten (none)")
    p.add_argument("--trust_win", type=float, default=None,
                   help="text game: a predicted win counts +100 only when p >= this (0: always, "
                        "discounted by --conf alone; > 1: never; default: "
                        + task_default("trust_win") + ")")
    p.add_argument("--explore", type=float, default=0.0,
                   help="bonus explore * (1 - p) per candidate: small values break ties toward "
                        "unconfident predictions")
    p.add_argument("--noop", type=float, default=None,
                   help="penalty on a candidate predicted to change nothing (a wasted step, or an "
                        "unforeseen effect; default: " + task_default("noop") + ")")
    p.add_argument("--propose", type=int, default=None,
                   help="web page: every planner chooses among the word-overlap policy's K best "
                        "actions (0: among every valid action; default: "
                        + task_default("propose") + ")")
    p.add_argument("--web_value", default="graded", choices=("graded", "exact"),
                   help="web page: credit per goal line shown (graded), or per whole condition "
                        "(exact)")
    # world model
    p.add_argument("--max_new_tokens", type=int, default=0,
                   help="0 = task default: textgame 200, webpage 160")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest for tiny models)")
    # output
    p.add_argument("--json", default=None, help="write the summaries and per-episode results here")
    args = p.parse_args(argv)
    for flag, value in TASK_DEFAULTS[args.task].items():   # a flag left unset: the task's choice
        if getattr(args, flag) is None:
            setattr(args, flag, value)
    torch.set_num_threads(args.threads)
    if args.episodes < 1:
        sys.exit(f"error: --episodes must be >= 1 (got {args.episodes})")
    names = [x.strip() for x in args.planners.split(",") if x.strip()]
    for name in names:
        if name not in BUILTIN and not Path(name).exists():
            sys.exit(f"error: --planners: {name!r} is neither random, sim, policy "
                     "nor an existing checkpoint")
    if args.task != "webpage" and ("policy" in names or args.propose):
        sys.exit("error: --planners=policy and --propose are for --task=webpage "
                 "(the text game has no policy)")
    if args.propose < 0:
        sys.exit(f"error: --propose must be >= 0 (got {args.propose})")
    E = ENVS[args.task]
    env_args = {"graded": args.web_value == "graded"} if args.task == "webpage" else {}
    max_steps = args.max_steps or E.max_steps
    # each planner on the same start states (the same seed draws the same episodes)
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
                       name if predict is None else "model", predict, args.seed, max_steps,
                       args.max_new_tokens, args.act, args.conf, args.memory, args.trust_win,
                       args.explore, args.noop, args.propose)
        rows[name] = dict(summarize(results, max_steps), minutes=(time.time() - t0) / 60)
        episodes[name] = results
        print(f"{name}: success {pct(rows[name]['success']).strip()}% "
              f"in {rows[name]['minutes']:.1f} min", flush=True)
    print()
    print_planners(rows)
    for name in names[1:]:  # every other planner against the first, over the same start states
        rows[name]["paired_vs_first"] = paired(episodes[name], episodes[names[0]])
        print(f"{name} - {names[0]}: "
              + "{:+.1f} [{:+.1f}, {:+.1f}] points, paired bootstrap 95%".format(
                  *(100 * x for x in rows[name]["paired_vs_first"])))
    if args.json:
        write_json(args.json, {"args": vars(args), "summary": rows, "episodes": episodes})


if __name__ == "__main__":
    main()
