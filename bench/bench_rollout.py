"""
Rollout speed: our sampler (engine.generate) against HF transformers' `generate` on the same weights, and against the
float32 matmul roofline of this machine.

    python bench/bench_rollout.py                    # the four shapes below, 1 thread, median of 3
    python bench/bench_rollout.py --tiny             # seconds; the smoke test in tests/test_bench.py
    python bench/bench_rollout.py --profile          # the bar shape's time by section and by op (docs/engineering.md)

Shapes (one row each):
- bar: a random GPT-2 of 4 layers x 128, vocab 512; 64 prompts of 8-24 tokens, 64 new tokens (the shape of the speed target);
- GRPO: the same model, 8 prompts x 8 samples (ours shares each prompt's keys and values between its samples, HF's
  `num_return_sequences` copies the prompt);
- text game: the text-game default model's config (checkpoints/textgame/mle.json), 16 prompts x 8 samples (train_lang's
  RL step) of 120-226 tokens (the range of data/textgame/test.jsonl's prompts), 200 new tokens;
- video: the video default model's config (checkpoints/video_mle.json), 64 rows of one frame plus its action (66
  tokens), one frame (64 tokens) each, as video GRPO samples a frame.
A random HF model with the shape's config is saved as safetensors and loaded into ours with `checkpoint.load_model`, so
both sample from the same weights; both sample at T=1, no top-k/top-p, no EOS, so both produce exactly rows x new
tokens. Ours, HF and a large matmul (the peak) run in turn, after a warm-up, and medians are reported.
Roofline: the model FLOPs of the new tokens (2 x the matmul weights incl. the LM head, plus 4 x n_layer x n_head x
head_dim x the keys each new token attends to) over the median time, as a fraction of the median matmul peak measured
in the same rounds. The prefill's other positions are not counted, so the fraction is a lower bound.
Bandwidth bounds (common.decode_traffic, at a large memcpy's bandwidth): the weights bound, the tokens/s if a decode
step took only the reading of the weights once (rows x bandwidth / bytes of weights), and the fraction of it reached;
the weights + cache bound, the keys and values each of our paths reads added (the eager path: those written so far, the
static path: all max_new positions every step). "ours static" is engine.generate(graphs=True): the static-shape path,
run eagerly on a CPU (on a GPU its step is a CUDA graph: bench/gpu_check.py step 4 measures it).
"""
import argparse
import json
import tempfile
import time

import torch

from common import (ROOT, bandwidth, decode_traffic, interleaved, machine, matmul_run, median,  # noqa: E402
                    print_table, thread_list)

import engine  # noqa: E402
import engine_static  # noqa: E402
import model  # noqa: E402
from checkpoint import load_model  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
p.add_argument("--shapes", default="bar,grpo,textgame,video", help="comma list of bar|grpo|textgame|video")
p.add_argument("--threads", default="1", help="torch thread counts to run, comma list")
p.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
p.add_argument("--peak_n", type=int, default=1024, help="side of the square matmul that measures the peak")
p.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
               help="cpu: this process's CPU time (fair on a shared machine; 1 thread only), wall: elapsed time")
p.add_argument("--profile", action="store_true",
               help="instead of the table: where the bar shape's time goes (torch.profiler, by section and by op)")
p.add_argument("--tiny", action="store_true", help="smoke mode: 2 prompts of 4-8 tokens, 4 new tokens, 1 repeat")
args = p.parse_args()

import transformers  # noqa: E402  (bench-only reference: after the flags, so --help needs only requirements.txt)

GPT2 = dict(model_type="gpt2", vocab_size=512, n_embd=128, n_layer=4, n_head=4, n_positions=512)
# name: (HF config, prompts, (shortest, longest) prompt, new tokens, samples per prompt)
SHAPES = {"bar": (GPT2, 64, (8, 24), 64, 1), "grpo": (GPT2, 8, (8, 24), 64, 8),
          "textgame": ("checkpoints/textgame/mle.json", 16, (120, 226), 200, 8),
          "video": ("checkpoints/video_mle.json", 64, (66, 66), 64, 1)}
if args.tiny:
    SHAPES = {k: (cfg, 2, (4, 8), 4, min(S, 2)) for k, (cfg, _, _, _, S) in SHAPES.items()}
    args.repeats, args.threads, args.peak_n = 1, "1", 128


# -----------------------------------------------------------------------------
# the same random weights in both libraries

def hf_config(spec):
    """A GPT2Config, or the LlamaConfig of one of our checkpoints' config (its .json file)."""
    if isinstance(spec, dict):
        return transformers.GPT2Config(**{k: v for k, v in spec.items() if k != "model_type"}, bos_token_id=0,
                                       eos_token_id=0)
    path = ROOT / spec
    if not path.is_file():
        raise SystemExit(f"--shapes: {path} missing (the default checkpoints ship with the repository)")
    c = json.loads(path.read_text())["config"]
    if c["norm"] != "rmsnorm" or c["mlp"] != "swiglu" or c["pos"] != "rope" or c["qkv_bias"]:
        raise SystemExit(f"{path}: expected a Llama-style config")
    return transformers.LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["n_embd"],
                                    intermediate_size=c["mlp_hidden"], num_hidden_layers=c["n_layer"],
                                    num_attention_heads=c["n_head"], num_key_value_heads=c["n_kv_head"],
                                    head_dim=c["head_dim"], max_position_embeddings=c["block_size"],
                                    rope_theta=c["rope_theta"], rms_norm_eps=c["norm_eps"],
                                    tie_word_embeddings=c["tie_embeddings"], bos_token_id=0, eos_token_id=0)


def both_models(spec):
    torch.manual_seed(0)
    cfg = hf_config(spec)
    hf = (transformers.GPT2LMHeadModel if isinstance(spec, dict) else transformers.LlamaForCausalLM)(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        ours = load_model(d)[0].eval()
    return hf, ours


def prompts_for(n, lo, hi, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(1, vocab, (n_,), generator=g).tolist() for n_ in lens]


def hf_inputs(prompts):
    """Left-padded ids and attention mask (B, P), as HF's generate wants a batch of different lengths."""
    P = max(len(x) for x in prompts)
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    att = torch.zeros(len(prompts), P, dtype=torch.long)
    for b, x in enumerate(prompts):
        ids[b, P - len(x):], att[b, P - len(x):] = torch.tensor(x), 1
    return ids, att


def new_token_flops(config, prompt_lens, new, samples):
    """Forward FLOPs of the new tokens: every one passes the matmul weights once (2 FLOPs per weight, the LM head
    included) and attends to the keys before it (q.k and p.v: 4 FLOPs per head dim per key)."""
    c, qkv = config, (config.n_head + 2 * config.n_kv_head) * config.head_dim
    mlp_in = (2 if c.mlp == "swiglu" else 1) * c.mlp_hidden
    per_layer = c.n_embd * qkv + c.n_head * c.head_dim * c.n_embd + c.n_embd * mlp_in + c.mlp_hidden * c.n_embd
    weights = c.n_layer * per_layer + c.n_embd * c.vocab_size  # the LM head's too
    keys = sum(L * new + new * (new + 1) // 2 for L in prompt_lens) * samples  # token i of a row sees L + i + 1 keys
    return 2 * weights * len(prompt_lens) * samples * new + 4 * c.n_layer * c.n_head * c.head_dim * keys


def bench(name, peak_fn, peak_flops):
    spec, B, (lo, hi), new, S = SHAPES[name]
    hf, ours = both_models(spec)
    prompts = prompts_for(B, lo, hi, ours.config.vocab_size, seed=1)
    ids, att = hf_inputs(prompts)
    gen_cfg = transformers.GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                                            min_new_tokens=0, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    g_ours = torch.Generator().manual_seed(0)

    def run_ours():
        toks, _ = engine.generate(ours, prompts, new, temperature=1.0, generator=g_ours, num_samples=S)
        assert toks.shape == (B * S, new)

    def run_static():
        toks, _ = engine.generate(ours, prompts, new, temperature=1.0, generator=g_ours, num_samples=S,
                                  graphs=True)
        assert toks.shape == (B * S, new)

    def run_hf():
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=att, generation_config=gen_cfg, num_return_sequences=S)
        assert out.shape == (B * S, ids.size(1) + new)

    t = interleaved({"ours": run_ours, "static": run_static, "hf": run_hf, "peak": peak_fn}, args.repeats,
                    clock=CLOCK)
    sec, peak = median(t["ours"]), peak_flops / median(t["peak"])
    n_tok, flops = B * S * new, new_token_flops(ours.config, [len(x) for x in prompts], new, S)
    shape = f"{B} prompts of {lo}-{hi}" + (f" x {S} samples" if S > 1 else "") + f", {new} new"
    model = f"{ours.config.n_layer}x{ours.config.n_embd}, vocab {ours.config.vocab_size}"
    # the bytes a decode step moves (prompts padded to the longest), eager and static
    P, itemsize = max(len(x) for x in prompts), next(ours.parameters()).element_size()
    eager, static = (decode_traffic(ours.config, itemsize, B, P, S, new, static=s, width=engine_static.WIDTH)
                     for s in (False, True))
    bound = B * S * BANDWIDTH / eager["weights"]   # tok/s if a step only read the weights once
    rates = [n_tok / median(t[k]) for k in ("ours", "static", "hf")]
    both = [B * S * BANDWIDTH / (p["weights"] + p["cache"]) for p in (eager, static)]   # + the cache
    return [name, shape, model, torch.get_num_threads(), *(f"{r:,.0f}" for r in rates),
            f"**{median(t['hf']) / sec:.2f}x**", f"{flops / n_tok / 1e6:.2f}", f"{peak / 1e9:.1f}",
            f"**{flops / sec / peak:.0%}**", " / ".join(f"{r / bound:.1%}" for r in rates),
            " / ".join(f"{r / b:.1%}" for r, b in zip(rates[:2], both))]


def profile(name):
    """`name` under torch.profiler, the fastest of --repeats runs (CPU time; the others' load moves it): the CPU time
    of engine's sections (prefill, each decode step's attention, the rest of its layers, sampling) and the heaviest
    aten ops of the decode steps."""
    from torch.profiler import profile, record_function
    spec, B, (lo, hi), new, S = SHAPES[name]
    _, ours = both_models(spec)
    prompts = prompts_for(B, lo, hi, ours.config.vocab_size, seed=1)
    sections = {"prefill": "prefill", "decode attention": "decode_attention", "decode step": "decode_step",
                "sampling": "sample_next"}
    for label, fn in sections.items():  # wrap the functions in named ranges where they are called (this process)
        where = model if fn == "decode_attention" else engine   # (model.decode_step calls it)

        def ranged(*a, _fn=getattr(where, fn), _label=label, **kw):
            with record_function(_label):
                return _fn(*a, **kw)
        setattr(where, fn, ranged)
    run = lambda: engine.generate(ours, prompts, new, temperature=1.0, generator=torch.Generator().manual_seed(0),
                                  num_samples=S)
    run()  # warm-up
    best = None
    for _ in range(args.repeats):
        with profile() as prof:
            t0 = time.process_time()
            run()
            total = time.process_time() - t0
        if best is None or total < best[1]:
            best = prof, total
    prof, total = best
    ev = {e.key: e.cpu_time_total / 1e6 for e in prof.key_averages()}
    scale = total / sum(ev[k] for k in ("prefill", "decode step", "sampling"))  # profiler overhead taken out
    parts = {"prefill (prompts, once)": ev["prefill"],
             "decode: attention over the cache (decode_attention)": ev["decode attention"],
             "decode: the rest (embeddings, norms, q/k/v, MLP, LM head)": ev["decode step"] - ev["decode attention"],
             "sampling (sample_next)": ev["sampling"]}
    print(f"\n{name}: {B * S * new} new tokens in {total:.3f} s of CPU time; by section (profiler time, scaled to it):")
    print_table(["section", "ms", "share"], [[k, f"{v * scale * 1e3:.0f}", f"{v / sum(parts.values()):.0%}"]
                                            for k, v in parts.items()])
    print("\nheaviest ops (self CPU time, profiler time)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


# -----------------------------------------------------------------------------
transformers.logging.set_verbosity_error()
print(f"machine: {machine()}")
if args.profile:
    print(f"T=1, no EOS, the fastest of {args.repeats} profiled runs, CPU time")
    torch.set_num_threads(1)
    profile("bar")
    raise SystemExit
print(f"T=1, no EOS, median of {args.repeats} rounds (ours, HF, matmul peak in turn), {args.clock} time")
peak_fn, peak_flops = matmul_run(args.peak_n)
BANDWIDTH = bandwidth("cpu")
print(f"memory bandwidth (a 256 MiB copy): {BANDWIDTH / 1e9:.1f} GB/s")
if args.clock == "cpu" and args.threads != "1":
    raise SystemExit("--clock=cpu: CPU time sums over threads, so it needs --threads=1 (or use --clock=wall)")
CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
rows = []
for threads in thread_list(args.threads):
    torch.set_num_threads(threads)
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {name!r} ({'|'.join(SHAPES)})")
        rows.append(bench(name, peak_fn, peak_flops))
print_table(["shape", "workload", "model", "threads", "ours tok/s", "ours static tok/s", "HF generate tok/s",
             "ours / HF", "MFLOP/token", "matmul peak GFLOP/s", "roofline", "weights bound: ours / static / HF",
             "weights + cache bound: ours / static"],
            rows,
            "rollout throughput (new tokens per second; higher is better); roofline = model FLOPs / (time x peak)")
