"""
The sampler the runs use: `generate`, with a KV cache, fast on one CPU thread. model.py's
`GPT.generate` is the plain version (one full forward per new token); this loop draws the same
tokens (tests/test_engine.py) with far less work per token, from model.py's sampler pieces:
- `prefill` runs each prompt once, its keys and values kept once (a `KVCache`) however many
  samples continue it (`num_samples`, GRPO's G);
- each `decode_step` feeds every row its last token: the rows' new keys and values are written in
  place, and the queries sharing a prompt attend to its keys in one matmul (`decode_attention`);
- rows that drew EOS leave the batch once they are a quarter of it (prompts with no row left leave
  too).
A decode step is the weights' matmuls plus one read of the cache (docs/engineering.md, The
sampler's speed). `generate(graphs=True)` runs engine_static.py's static-shape sampler instead: on
a GPU each decode step one CUDA graph.
"""
import copy

import torch

from model import decode_step, is_fsdp, prefill, sample_next


@torch.inference_mode()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
             eos_id=None, generator=None, num_samples=1, vocab=None, graphs=False):
    """Sample continuations of a batch of prompts with a KV cache.
    prompts: B token-id lists (lengths may differ; each >= 1); results do not depend on the batch.
    num_samples S: continuations per prompt (rows b*S .. b*S+S-1 of the output are prompt b's).
    temperature 0 means greedy; top_k / top_p filter the distribution (model.sample_next). vocab:
    draw only ids below it, the ones the tokenizer decodes; None: every id of the model.
    Returns (tokens, logprobs), both (B*S, N), N <= max_new_tokens (it stops once every row is
    done): tokens long, -1 after a row's eos_id (kept); logprobs float32, each sampled token's
    log-prob under the sampling distribution (greedy: the model's at T=1), 0 where tokens == -1.
    graphs: engine_static.py's static-shape path, its decode step a CUDA graph on a GPU."""
    if graphs:
        from engine_static import static_generate   # loaded only for it
        return static_generate(model, prompts, max_new_tokens, temperature, top_k, top_p, eos_id,
                               generator, num_samples, vocab)
    logits, lens, cache = prefill(model, prompts, max_new_tokens, num_samples)
    N, device = len(logits), logits.device
    tokens = torch.full((N, max_new_tokens), -1, dtype=torch.long, device=device)
    logprobs = torch.zeros(N, max_new_tokens, device=device)
    # per decoding row: its prompt length (lens) and whether it has drawn eos_id (done)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        tok, lp = sample_next(logits[:, :vocab].float(), temperature, top_k, top_p, generator)
        # cache.live: the output rows still decoding; a finished row's draws are not kept
        rows = cache.live
        tokens[rows, t], logprobs[rows, t] = tok.masked_fill(done, -1), lp.masked_fill(done, 0.0)
        if eos_id is not None:
            done = done | (tok == eos_id)
        if t == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            break
        # a quarter of the rows finished: they leave the batch
        if eos_id is not None and 4 * int(done.sum()) >= len(done):
            live = (~done).nonzero().squeeze(1)
            lens, tok, done = lens[live], tok[live], done[live]
            cache.keep(live)
        logits = decode_step(model, tok, lens + t, cache)
    return tokens[:, :t + 1], logprobs[:, :t + 1]


def cast_copy(model):
    """Inside a low-precision autocast region, a float32 model -> a copy in that dtype; else it."""
    device = model.wte.weight.device.type
    dtype = torch.get_autocast_dtype(device)
    if (not torch.is_autocast_enabled(device) or dtype == torch.float32
            or model.wte.weight.dtype != torch.float32 or is_fsdp(model)):
        return model   # (FSDP, runtime.unsharded: its gathered weights cannot be deep-copied)
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
            for p in model.parameters()}
    return copy.deepcopy(model, memo)
