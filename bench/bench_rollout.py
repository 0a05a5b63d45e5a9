"""
Rollout speed: our KV-cache batched sampler (`GPT.generate`) against HF transformers' `generate`, same weights.

    python bench/bench_rollout.py                    # GPT-2 and Qwen2 configs, 1 and 2 threads, 5 repeats
    python bench/bench_rollout.py --tiny             # seconds; the smoke test in tests/test_bench.py

A random HF model (GPT2LMHeadModel or Qwen2ForCausalLM with grouped-query attention) is saved as safetensors and
loaded into ours with `GPT.from_pretrained`, so both sample from the same weights. Both get the same batch of prompts
of mixed length (left-padded with an attention mask for HF), sample at T=1 with no top-k/top-p filtering and no EOS, so
both produce exactly batch x new tokens. The two run in turn (ours, HF, ours, HF, ...) after a warm-up and the median
of the repeats is reported, with the ratio. A second row per config samples G completions of fewer prompts, as GRPO
does: ours prefills each prompt once and shares its KV cache across the G samples (`num_samples=G`); HF's
`num_return_sequences=G` copies the prompts before prefilling them.
"""
import argparse
import tempfile

import torch

from common import interleaved, machine, median, print_table, thread_list

import transformers  # noqa: E402  (bench-only reference)
from model import GPT  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--configs", default="gpt2,qwen2", help="comma list of gpt2|qwen2")
p.add_argument("--threads", default="1,2", help="torch thread counts to run, comma list")
p.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
# workload
p.add_argument("--batch", type=int, default=64, help="prompts per batch")
p.add_argument("--new_tokens", type=int, default=64)
p.add_argument("--min_prompt", type=int, default=8)
p.add_argument("--max_prompt", type=int, default=64)
p.add_argument("--group", type=int, default=8, help="samples per prompt in the GRPO-shaped row (0 = skip the row)")
# model (the project's default language world model is 4 x 128)
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--tiny", action="store_true", help="smoke mode: 2-layer 32-wide model, 8 prompts, 8 tokens, 1 repeat")
args = p.parse_args()
if args.tiny:
    args.n_layer, args.n_embd, args.vocab, args.batch, args.new_tokens, args.max_prompt = 2, 32, 64, 8, 8, 12
    args.group, args.repeats, args.threads = 4, 1, "1"


# -----------------------------------------------------------------------------
# the same random weights in both libraries

def hf_model(kind, path):
    torch.manual_seed(0)
    n_pos = args.max_prompt + args.new_tokens + 8
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=args.vocab, n_positions=n_pos, n_embd=args.n_embd,
                                      n_layer=args.n_layer, n_head=args.n_head, bos_token_id=0, eos_token_id=0)
        m = transformers.GPT2LMHeadModel(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=3 * args.n_embd,
                                       num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
                                       num_key_value_heads=max(1, args.n_head // 2), max_position_embeddings=n_pos,
                                       tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
        m = transformers.Qwen2ForCausalLM(cfg)
    else:
        raise SystemExit(f"--configs: unknown config {kind!r} (gpt2|qwen2)")
    m.eval().save_pretrained(path, safe_serialization=True)
    return m


def prompts_for(n, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(args.min_prompt, args.max_prompt + 1, (n,), generator=g).tolist()
    return [torch.randint(1, args.vocab, (n_,), generator=g).tolist() for n_ in lens]


def hf_inputs(prompts):
    P = max(len(x) for x in prompts)
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    att = torch.zeros(len(prompts), P, dtype=torch.long)
    for b, x in enumerate(prompts):
        ids[b, P - len(x):], att[b, P - len(x):] = torch.tensor(x), 1
    return ids, att


def bench(kind):
    with tempfile.TemporaryDirectory() as d:
        hf = hf_model(kind, d)
        ours = GPT.from_pretrained(d).eval()
    gen_cfg = transformers.GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                            max_new_tokens=args.new_tokens, min_new_tokens=0, pad_token_id=0,
                                            eos_token_id=None, bos_token_id=None)
    shapes = [("%d prompts" % args.batch, prompts_for(args.batch, 1), 1)]
    if args.group:
        shapes.append(("%d prompts x %d samples" % (args.batch // args.group, args.group),
                       prompts_for(args.batch // args.group, 2), args.group))
    rows = []
    for name, prompts, G in shapes:
        ids, att = hf_inputs(prompts)
        g_ours, g_hf = torch.Generator().manual_seed(0), None

        def run_ours():
            toks, _ = ours.generate(prompts, args.new_tokens, temperature=1.0, generator=g_ours, num_samples=G)
            assert toks.shape == (len(prompts) * G, args.new_tokens)

        def run_hf():
            with torch.inference_mode():
                out = hf.generate(input_ids=ids, attention_mask=att, generation_config=gen_cfg, num_return_sequences=G)
            assert out.shape == (len(prompts) * G, ids.size(1) + args.new_tokens)

        t = interleaved({"ours": run_ours, "hf": run_hf}, args.repeats)
        n_tok = len(prompts) * G * args.new_tokens
        ours_tps, hf_tps = n_tok / median(t["ours"]), n_tok / median(t["hf"])
        rows.append([kind, name, torch.get_num_threads(), f"{ours_tps:,.0f}", f"{hf_tps:,.0f}",
                     f"**{ours_tps / hf_tps:.2f}x**"])
    return rows


# -----------------------------------------------------------------------------
transformers.logging.set_verbosity_error()
print(f"machine: {machine()}")
print(f"workload: {args.batch} prompts of {args.min_prompt}-{args.max_prompt} tokens, {args.new_tokens} new tokens, "
      f"T=1, no EOS; model {args.n_layer} layers x {args.n_embd}, vocab {args.vocab}; median of {args.repeats}")
rows = []
for threads in thread_list(args.threads):
    torch.set_num_threads(threads)
    for kind in args.configs.split(","):
        rows += bench(kind)
print_table(["config", "batch", "threads", "ours tok/s", "HF generate tok/s", "ours / HF"], rows,
            "rollout throughput (new tokens per second; higher is better)")
