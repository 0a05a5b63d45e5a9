"""
The memory one step of a run needs on a rank, estimated before it runs, so a run is sized before
GPUs are rented: `train_lang.py --stage=memory` prints it, and on a GPU both training scripts print
it and size their rollout chunks by it (GRPOConfig.rollout_prompts 0). tests/test_memory.py holds it
to measured peaks; docs/engineering.md (Memory) has the numbers.
"""
from dataclasses import replace

import torch

from model import GPT, Block

HELD = ("weights", "grads", "adamw", "reference", "autocast_copy")   # memory a whole step holds



def prompts_per_chunk(prompts, samples, minibatches, micro_batch):
    """The prompts one micro-batch of the GRPO update holds (runtime.plan_update): up to all if a
    minibatch fits one; else (cut in row order) the prompts of its rows and one more."""
    rows = prompts * samples // minibatches   # a minibatch's rows
    return min(prompts, rows if rows <= micro_batch else -(-micro_batch // samples) + 1)


def memory_estimate(config, low_precision, reference, grad_ckpt, prompt_len, new_tokens, prompts,
                    samples, micro_batch, prompts_per_chunk, world=1, fsdp=False):
    """Bytes of one RLVR step's peak on a rank, by part -> dict ("peak": their sum at the worst
    moment). `prompts` x `samples` rows are sampled with a KV cache holding each prompt once; a
    micro-batch of the update holds `micro_batch` rows of `new_tokens`, `prompts_per_chunk`
    prompts. fsdp: 1/world of the weights, gradients, AdamW state and reference, each gathered
    whole in a phase of its own in the forwards' dtype (Run.shard: no autocast casts then)."""
    with torch.device("meta"):   # the GPT's and a block's parameters, without memory or time
        P, block = (sum(p.numel() for p in m.parameters()) for m in (GPT(config), Block(config)))
    c, shard = config, P / world if fsdp else P   # (shard: a rank's)
    unit = P - (c.n_layer - 1) * block   # the root (embeddings, final norm, head) and a block
    act = 2 if low_precision else 4                         # bytes of an activation
    kv = c.n_layer * 2 * c.n_kv_head * c.head_dim * act     # bytes of one token's keys and values
    tokens = prompts_per_chunk * prompt_len + micro_batch * new_tokens   # one update forward's
    scored = micro_batch * new_tokens * c.vocab_size        # logits: at the targets' positions
    # per token and layer, what the backward keeps: the residual and norms (float32, FSDP's bf16),
    # q, k, v, the attention output, the MLP's gate, up and their product (checkpointing: residual)
    res = act if fsdp else 4
    per_layer = (res * 3 * c.n_embd + act * ((c.n_head + 2 * c.n_kv_head) * c.head_dim
                                             + 2 * c.n_embd + 4 * c.mlp_hidden))
    kept = res * c.n_embd if grad_ckpt else per_layer
    parts = dict(
        weights=4 * shard, grads=4 * shard, adamw=8 * shard, reference=act * shard * reference,
        # autocast's bf16 casts: all (cached, or kept for backward); FSDP: none
        autocast_copy=2 * P * low_precision * (not fsdp),
        # gathered by FSDP in turn: the sampler's, the reference's weights, root and block (+ their
        # gradients; bf16's, then in float32 for the reduction)
        sampler_weights=act * P * fsdp, reference_gathered=act * P * reference * fsdp,
        units=8 * unit * fsdp, kv_cache=kv * prompts * (prompt_len + samples * new_tokens),
        # the activations one micro-batch keeps for its backward (+ one block recomputed)
        activations=tokens * (c.n_layer * kept + (per_layer if grad_ckpt else 0)),
        # the logits of its targets: the forward's, a float32 copy, the log-softmax, its exp and
        # their product for the entropy, and the gradient of one of them
        logits=scored * (act + 4 * 5))
    static = sum(parts[k] for k in HELD)
    fixed = scored * (act + 4 * 3)   # a fixed log-prob pass's logits (no copy, no gradient)
    # the largest phase: the rollout (then bf16's old log-probs), the reference's, the update
    parts["peak"] = static + max(
        parts["sampler_weights"] + max(parts["kv_cache"], fixed * low_precision),
        parts["reference_gathered"] + fixed * reference,
        parts["units"] + parts["activations"] + parts["logits"])
    return parts


def rlvr_memory(run, config, cfg, prompts, prompt_len, grad_ckpt):
    """memory_estimate of a GRPO step of `prompts` prompts, the longest `prompt_len` tokens, on a
    rank of `run` -> (its parts, cfg). A GPU's cfg.rollout_prompts 0 becomes the most prompts whose
    rollout fits 80% of its memory: from the flags and its size, not its free memory (PyTorch's
    cached blocks count as taken there: it differs in a resumed process), so a resumed run samples
    the same tokens."""
    G, mb = cfg.group_size, cfg.micro_batch

    def estimate(n):
        return memory_estimate(config, run.args.dtype != "float32", cfg.beta > 0, grad_ckpt,
                               prompt_len, cfg.max_new_tokens, n, G, mb,
                               prompts_per_chunk(prompts, G, cfg.minibatches, mb), run.world,
                               run.fsdp)
    if not cfg.rollout_prompts and run.device != "cpu":   # the rollout: held, sampler, KV cache
        one = estimate(1)
        room = (0.8 * torch.cuda.get_device_properties(run.device).total_memory
                - sum(one[k] for k in (*HELD, "sampler_weights")))
        cfg = replace(cfg, rollout_prompts=int(min(prompts, max(1, room // one["kv_cache"]))))
        run.recorded["rollout_prompts"] = cfg.rollout_prompts
    return estimate(cfg.rollout_prompts or prompts), cfg


def print_memory(stage, parts, print0):
    """memory_estimate's dict as one line, in GB."""
    print0(f"{stage} memory estimate (GB): "
           + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in parts.items() if v))


def print_estimates(config, cfg, pairs, mle_stage, room, low, grad_ckpt, batch_size, run):
    """train_lang.py's memory of an MLE step (its longest pair) and an RLVR step (its longest
    prompt up to `room`; None: no RLVR stage), per rank -> cfg (rollout_prompts: rlvr_memory's)."""
    if mle_stage:
        fit = [(len(p), len(a)) for p, a in pairs if len(p) + len(a) <= config.block_size + 1]
        p_len, a_len = max(fit or [(config.block_size // 2, config.block_size // 2)], key=sum)
        mb = min(cfg.micro_batch, batch_size)
        print_memory("mle", memory_estimate(config, low, False, grad_ckpt, p_len, a_len, 0, 1, mb,
                                            mb, run.world, run.fsdp), run.print0)
    if room is not None:
        longest = max([len(p) for p, _ in pairs if len(p) <= room] or [room])   # RLVR's longest
        parts, cfg = rlvr_memory(run, config, cfg, cfg.prompts_per_step, longest, grad_ckpt)
        n = cfg.rollout_prompts or cfg.prompts_per_step
        print_memory(f"rlvr ({n} prompts sampled at once)", parts, run.print0)
    return cfg
