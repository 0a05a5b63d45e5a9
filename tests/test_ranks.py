"""N ranks take the one-process GRPO step: on 2 gloo DDP ranks with unequal shares of the kept groups (and one rank
holding none), the default token-mean update equals one process's update of their union, the logged stats and the
step's compute are those of the union; the paper recipe's per-rank micro-batch token-mean equals verl's (its formula
on each rank's rows, then DDP's average)."""
import copy
import gc
import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grpo import Env, GRPOConfig, grpo_step
from model import GPT, GPTConfig

torch.set_num_threads(1)
G = 4
# each rank's prompts: unequal shares, and a case where rank 1 keeps no group
SPLITS = {"unequal": ([[1, 2], [4], [6]], [[5, 6, 7]]), "rank1_none": ([[1, 2], [4]], [[3, 3]])}
CFGS = {"token-mean": dict(), "seq-mean": dict(loss_agg="seq-mean"),
        "micro-token-mean": dict(loss_agg="micro-token-mean", micro_batch=3)}


def tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig.llama(vocab_size=8, block_size=32, n_layer=1, n_head=2, n_embd=16))


def fixed_sampler(model, prompts, records, cfg, generator):
    """The same completions of a prompt on any rank and in any batch (seeded by the prompt and the row's place
    in its group), their log-probs by a plain forward: grpo_step's inputs equal however the groups are split."""
    rows, lps = [], []
    for i, p in enumerate(prompts):
        g = torch.Generator().manual_seed(1000 * sum(p) + 10 * len(p) + i % G)
        c = torch.randint(1, 8, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g)
        logits = model(torch.tensor([p + c[:-1].tolist()]))[0][0, len(p) - 1:]
        rows.append(c)
        lps.append(torch.log_softmax(logits.float(), -1).gather(-1, c[:, None]).squeeze(-1))
    pad = torch.nn.utils.rnn.pad_sequence
    return pad(rows, batch_first=True, padding_value=-1), pad(lps, batch_first=True), None


def reward(records, completions):   # threes counted; prompt [3, 3]'s rows all score 0 (rank1_none)
    return [0.0 if r == "flat" else sum(t == 3 for t in c) / 6 for r, c in zip(records, completions)]


def records(prompts):
    return ["flat" if p == [3, 3] else None for p in prompts]


def config(agg):
    # SGD at lr 1: the weights move by minus the gradient; no clipping, which would hide a scale
    return GRPOConfig(**{**dict(prompts_per_step=0, group_size=G, max_rounds=1, minibatches=1, beta=0.1,
                                grad_clip=1e9, entropy_coef=0.01), **CFGS[agg]})


def step(policy, model, prompts, cfg):
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = grpo_step(policy, copy.deepcopy(model).eval(), opt, prompts, records(prompts),
                      Env(reward, sampler=fixed_sampler), cfg, torch.Generator().manual_seed(0))
    return stats, torch.cat([p.detach().flatten() for p in model.parameters()])


def worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    out, stats = {}, {}
    for split, shares in SPLITS.items():
        for agg in CFGS:
            model = tiny_model()
            policy = DistributedDataParallel(model)
            stats[f"{split}/{agg}"], out[f"{split}/{agg}"] = step(policy, model, shares[rank], config(agg))
            del policy
    save_file(out, f"{out_dir}/rank{rank}.safetensors")
    Path(f"{out_dir}/rank{rank}.json").write_text(json.dumps(stats))
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def test_two_ranks_take_the_one_process_step(tmp_path):
    torch.multiprocessing.spawn(worker, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1)]
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    start = torch.cat([p.detach().flatten() for p in tiny_model().parameters()])
    for split, shares in SPLITS.items():
        for agg in CFGS:
            key, cfg = f"{split}/{agg}", config(agg)
            assert torch.equal(ranks[0][key], ranks[1][key])          # the ranks stay in step
            moved = ranks[0][key] - start
            if agg == "micro-token-mean":   # verl's: each rank's own token-means, then DDP's average
                alone = [step(m := tiny_model(), m, p, cfg) for p in shares]
                want = sum(w - start for _, w in alone) / 2
            else:                           # the one-process update of the union of the groups
                one, w = step(m := tiny_model(), m, shares[0] + shares[1], cfg)
                want = w - start
                for k in ("reward_mean", "loss", "kl", "entropy", "groups", "groups_kept", "compute",
                          "tokens_sampled", "tokens_updated", "response_len", "ratio_first"):
                    assert abs(logs[0][key][k] - one[k]) < 1e-6, (key, k, logs[0][key][k], one[k])
                    assert logs[0][key][k] == logs[1][key][k]      # every rank logs the union's stats
            assert moved.abs().max() > 1e-3                           # the step did move the weights
            assert (moved - want).abs().max() < 1e-6, (key, (moved - want).abs().max())
    # the cases are what they say: unequal shares of kept groups on the two ranks; none on rank 1
    kept = {s: [step(m := tiny_model(), m, p, config("token-mean"))[0]["groups_kept"] for p in shares]
            for s, shares in SPLITS.items()}
    assert kept["unequal"][0] > kept["unequal"][1] > 0 and kept["rank1_none"][1] == 0 < kept["rank1_none"][0]
