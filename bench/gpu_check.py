"""
GPU check of the scale path: a random model of DeepSeek-R1-Distill-Qwen-1.5B's shape goes through
our loader, against HF transformers, through the sampler, GRPO and the training scripts, and the
run ends with one markdown table (printed, and written to --out with the date and the device).

    python bench/gpu_check.py                          # one GPU, bf16 (sized for < 8 min, H200)
    python bench/gpu_check.py --tiny --device=cpu --dtype=float32   # ~35 s on 1 CPU thread (CI)
    python bench/gpu_check.py --skip=4,7               # leave steps out (they are numbered below)
    python bench/gpu_check.py --skip=3,5,6,7 --sampler_lens=300   # the sampler only (~2 min)
    python bench/gpu_check.py --skip=3,4,5,6,7,8 --profile_sampler  # a decode step's profile
    python bench/gpu_check.py --skip=3,5,6,7 --compile_sampler   # + graphs uncompiled (GPU)
    python bench/gpu_check.py --skip=3,5,6,7,8 --hf_lens=300 --compile_sampler \
        --out=results/gpu_check_sampler/sampler.md   # the sampler's GPU check (docs/engineering.md)

Steps (one table row or more each; a step that fails is recorded FAIL with its one-line reason and
the others still run; the exit status is 1 if any row is FAIL):
1. build: a Qwen2 HF directory of the 1.5B shape with random weights (28 layers x 1536, 12 query
   / 2 KV heads, MLP 8960, vocab 151936, untied; --tiny: 2 x 64, 4 / 2 heads), made on the device
   in --dtype and saved as safetensors, with a byte-level BPE tokenizer (HF `tokenizers`, trained
   on text-game records) whose vocabulary is smaller than the embedding, as Qwen2's is: the rows
   past it are zero, "untrained", so their logit is 0 and a sampler that does not stop at the
   tokenizer's vocabulary draws them.
2. load: checkpoint.load_model on the HF directory, its seconds and memory.
3. parity: logits against transformers on a batch of text prompts, and 64 greedy tokens of
   engine.generate against HF generate(do_sample=False).
4. sampler: engine.generate at T=1 with a CPU torch.Generator (as the training scripts pass it),
   16 prompts x 8 samples of 300 and 3,000 tokens (--sampler_lens), 1,024 new tokens, no EOS:
   the eager path, the static path (graphs=True: on a GPU its decode step compiled by
   torch.compile and captured as CUDA graphs, one per shape; their count and capture time
   shown), the same two with EOS (the tokenizer's: a random model draws it at random, so answers
   of mixed lengths; tokens/s on the tokens emitted), HF generate (static cache where supported;
   --hf_lens: at which lengths). Per row: tokens/s, ms a decode step and the fraction of the
   weights bound (rows x bandwidth / bytes of weights a step reads, the bandwidth a measured
   device-to-device copy) and, for ours, of the weights + cache bound (the keys and values its
   path reads added, the static path's written ones rounded up to engine_static.WIDTH:
   common.decode_traffic, whose parts of a step are shown in ms); every id drawn must be one the
   tokenizer decodes. Then 64 greedy tokens of the static path captured against it uncaptured
   (equal: PASS) and against the eager path (shown). --compile_sampler adds a row per length: the
   graphs row compiled the other way (a GPU: uncompiled; a CPU: compiled), its compile seconds
   and its greedy tokens compiled against uncompiled shown.
5. GRPO: one grpo.grpo_step at micro_batch 8 and 2 on 300- and 3,000-token prompts, float32
   weights under --dtype autocast as train_lang.py runs it; time and peak memory. Then one at
   --recipe=paper's batch a rank (16 prompts x 5, 7,192 + 4,096 tokens, micro_batch 2; --tiny:
   30 + 16) sampled 2 prompts at a time (--rollout_prompts=2) and all at once: each one's peak.
6. stale weights: no optimizer step may run inside autocast (autocast caches the low-precision
   copy of each weight for its whole region: a forward after an in-place step inside it reads the
   old weights); checked on a bf16 grpo_step with a global optimizer step pre-hook, and shown
   directly on one Linear.
7. scripts: a 2-step train_lang.py RLVR run from the HF directory, the same under torchrun
   (1 process), and a 3-step train_video.py RLVR run from the shipped checkpoint.
8. FSDP: the 2-step train_lang.py run under torchrun (1 process) with --fsdp=1: fully_shard over
   NCCL, the weights gathered for the rollouts and for its checkpoints.
9. profile (--profile_sampler only; ~1 min on a GPU): step 4's shape (its first prompt length) on
   the static path uncaptured, a few decode steps under torch.profiler: the top ops by self device
   time a step (on a CPU: self CPU time) as a markdown table, its time by section, and a chrome
   trace (chrome://tracing, ui.perfetto.dev), written beside --out (*_sampler_profile.md, .json.gz).
Memory: the step's peak of all the process holds (the models of earlier steps included):
torch.cuda.max_memory_allocated on a GPU, on a CPU the peak RSS (VmHWM, reset before each step).
Subprocess rows have no memory column; the GRPO rows also give tools.memory.memory_estimate's peak.
"""
import argparse
import contextlib
import copy
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from common import ROOT, bandwidth, cpu_name, decode_traffic, machine, print_table, traffic_text

import engine  # noqa: E402
import engine_static  # noqa: E402
import model  # noqa: E402
import grpo  # noqa: E402
from checkpoint import load_model  # noqa: E402
from tools.memory import memory_estimate, prompts_per_chunk  # noqa: E402
from tokenizer_text import load_tokenizer  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
               help="the weights' dtype in steps 1-4, the autocast dtype in 5 and 7")
p.add_argument("--tiny", action="store_true",
               help="small shapes (2 layers x 64, a few hundred tokens of vocab): ~1 min on a CPU")
p.add_argument("--out", default="out/gpu_check.md", help="the markdown table is written here")
p.add_argument("--work_dir", default=None,
               help="where the HF directory, data and runs go (default: a temporary folder, "
                    "removed at the end)")
p.add_argument("--skip", default="", help="comma list of step numbers (1-8) not to run")
p.add_argument("--threads", type=int, default=0,
               help="torch CPU threads, also given to the scripts of step 7 (0: 1 with --tiny, "
                    "else torch's default)")
p.add_argument("--sampler_lens", default="",
               help="comma list of step 4's prompt lengths (default: 300,3000; --tiny 30,100)")
p.add_argument("--hf_lens", default="",
               help="comma list of the prompt lengths of step 4 HF generate runs at (default: all)")
p.add_argument("--sub_timeout", type=int, default=240, help="seconds allowed each script of step 7")
p.add_argument("--hf_compile", type=int, default=0,
               help="1: let HF generate torch.compile its static-cache forward on a GPU (minutes "
                    "of compilation; 0: eager, as ours runs)")
p.add_argument("--profile_sampler", action="store_true",
               help="also run step 9, a profile of the static sampler's decode steps (~1 min on "
                    "a GPU; with --skip=3,4,5,6,7,8 the profile alone)")
p.add_argument("--compile_sampler", action="store_true",
               help="step 4 also times the graphs path compiled the other way (on a GPU, where it "
                    "is compiled by default: uncompiled; on a CPU: compiled by torch.compile)")
args = p.parse_args()

# bench-only references: imported after the flags, so --help needs neither
import transformers  # noqa: E402
import tokenizers  # noqa: E402

DEVICE, DTYPE = torch.device(args.device), getattr(torch, args.dtype)
CUDA = DEVICE.type == "cuda"
if CUDA and not torch.cuda.is_available():
    raise SystemExit(f"--device {args.device}: this torch ({torch.__version__}) sees no GPU; "
                     f"use --device=cpu (with --tiny)")
SKIP = {int(s) for s in args.skip.split(",") if s.strip()}
THREADS = args.threads or (1 if args.tiny else torch.get_num_threads())
torch.set_num_threads(THREADS)

# the shapes: DeepSeek-R1-Distill-Qwen-1.5B (its config.json, but max_position_embeddings 16384
# instead of 131072: enough for the prompts here), or a tiny model of the same family.
# vocab None: the tokenizer's vocabulary padded by 64 (and up to a multiple of 64)
FULL = dict(n_layer=28, hidden=1536, heads=12, kv_heads=2, mlp=8960, vocab=151936, max_pos=16384,
            tok_vocab=2048, n_train=100,
            parity=(4, 64),                        # prompts x tokens of the logits comparison
            greedy=(2, 64),                        # prompts x greedy tokens
            sampler=(16, 8, (300, 3000), 1024),    # prompts, samples each, prompt lengths, new
            grpo=(2, 8, (300, 3000), 256, (8, 2)),  # prompts, group, prompt lengths, new, micro
            chunked=(16, 5, 7192, 4096, 2),        # --recipe=paper's a rank: the same, 1 length
            sub_new=32)                            # max_new_tokens of step 7's train_lang runs
TINY = dict(n_layer=2, hidden=64, heads=4, kv_heads=2, mlp=128, vocab=None, max_pos=1024,
            tok_vocab=300, n_train=60, parity=(4, 32), greedy=(2, 64),
            sampler=(4, 4, (30, 100), 160),   # 160 new: a few EOS draws, 2 widths of WIDTH
            grpo=(2, 4, (30, 100), 16, (8, 2)), chunked=(16, 5, 30, 16, 2), sub_new=16)
S = TINY if args.tiny else FULL
FP32_ATOL = 1e-4   # float32 logits: as tests/test_model.py (times the logits' scale when above 1)


# -----------------------------------------------------------------------------
# the table: one row per check, a failing check recorded and the run going on

ROWS = []
STATE = {}   # what the steps hand on: the HF dir, the models, the tokenizer, prompts


def sync():
    if CUDA:
        torch.cuda.synchronize(DEVICE)


def reset_peak():
    """Start a step's peak memory: CUDA's allocator peak, or the process's peak RSS (VmHWM, which
    Linux resets when "5" is written to /proc/self/clear_refs)."""
    if CUDA:
        torch.cuda.reset_peak_memory_stats(DEVICE)
    else:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")


def peak():
    if CUDA:
        return f"{torch.cuda.max_memory_allocated(DEVICE) / 2 ** 30:.1f} GiB"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return f"RSS {int(line.split()[1]) / 2 ** 20:.2f} GiB"
    return "?"


def one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200].replace("|", "/")


def check(name, shape, fn, memory=True):
    """Run fn() -> (result text, "PASS" | "FAIL" | "-"), timed, into a table row; an exception is
    a FAIL with its one-line reason (the traceback goes to stderr) and the run goes on."""
    print(f"\n== {name}: {shape}", flush=True)
    reset_peak()
    t0 = time.perf_counter()
    try:
        result, status = fn()
    except Exception as e:   # noqa: BLE001  (any failure is a row, not the end of the run)
        traceback.print_exc()
        result, status = one_line(e), "FAIL"
    sync()
    sec = time.perf_counter() - t0
    row = [name, shape, result, f"{sec:.1f} s" if sec >= 1 else f"{sec:.2f} s",
           peak() if memory else "-", status]
    print("-> " + " | ".join(row), flush=True)
    ROWS.append(row)


def need(*keys):
    """The STATE entries a step needs; a missing one (its step failed or was skipped) fails it."""
    missing = [k for k in keys if k not in STATE]
    if missing:
        raise RuntimeError(f"needs {', '.join(missing)} (an earlier step failed or was skipped)")
    return [STATE[k] for k in keys]


def fmt_rate(n, sec):
    return f"{n / sec:,.0f} tok/s"


# -----------------------------------------------------------------------------
# 1. the HF directory: tokenizer and random weights

def textgame_texts(data_dir):
    """The text-game splits (small, seeded: data/textgame/prepare.py) -> the train records' texts
    (prompt + answer), the tokenizer's training text and the prompts of the later steps."""
    from data.textgame.prepare import ensure_splits
    from data.textgame.task import load_records, prompt_text, target_text
    ensure_splits(data_dir, n_train=S["n_train"], n_val=8, n_test=8, verbose=False)
    return [prompt_text(r) + target_text(r) for r in load_records(data_dir / "train.jsonl")]


def train_tokenizer(texts, path):
    """Byte-level BPE as tests/test_train_lang.py trains it (HF `tokenizers`), with <|endoftext|>
    as its one added token -> (its vocabulary size, the id of <|endoftext|>)."""
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=S["tok_vocab"], special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(path / "tokenizer.json"))
    return tk.get_vocab_size(), tk.token_to_id("<|endoftext|>")


def random_qwen2(n_tok, eos_id):
    """A Qwen2ForCausalLM of the shape S, random, made on the device in DTYPE (no float32 copy of
    the 1.5B model on the CPU). q/k/v biases random (HF starts them at 0: the path would go
    untested); embedding and output rows past the tokenizer's n_tok ids zero."""
    vocab = S["vocab"] or 64 * math.ceil(n_tok / 64) + 64
    cfg = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=S["hidden"], intermediate_size=S["mlp"],
        num_hidden_layers=S["n_layer"], num_attention_heads=S["heads"],
        num_key_value_heads=S["kv_heads"], max_position_embeddings=S["max_pos"], rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
        bos_token_id=eos_id, eos_token_id=eos_id)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        hf = transformers.Qwen2ForCausalLM._from_config(cfg, dtype=DTYPE).eval()
    with torch.no_grad():
        for name, w in hf.named_parameters():
            if name.endswith("bias"):
                w.normal_(0, 0.02)
        hf.model.embed_tokens.weight[n_tok:] = 0
        hf.lm_head.weight[n_tok:] = 0
    return hf


def step_build():
    work = STATE["work"]
    hf_dir, data_dir = work / "hf", work / "textgame"
    hf_dir.mkdir(parents=True, exist_ok=True)
    texts = textgame_texts(data_dir)
    n_tok, eos_id = train_tokenizer(texts, hf_dir)
    hf = random_qwen2(n_tok, eos_id)
    hf.save_pretrained(hf_dir, safe_serialization=True)
    STATE.update(hf=hf, hf_dir=hf_dir, data_dir=data_dir, texts=texts)
    size = sum(f.stat().st_size for f in hf_dir.glob("*.safetensors")) / 2 ** 30
    n = sum(w.numel() for w in hf.parameters())
    return (f"{n / 1e6:,.1f}M params, model vocab {hf.config.vocab_size} > tokenizer {n_tok}; "
            f"{size:.2f} GiB safetensors", "PASS")


# -----------------------------------------------------------------------------
# 2. our loader

def step_load():
    hf_dir, = need("hf_dir")
    t0 = time.perf_counter()
    ours, _ = load_model(hf_dir, device=DEVICE, dtype=DTYPE)
    ours = ours.to(DEVICE).eval()
    sync()
    sec = time.perf_counter() - t0
    tok = load_tokenizer(hf_dir)
    STATE.update(ours=ours, tok=tok)
    # the prompts of steps 3-6: the text game's records, encoded, one stream cut into windows
    stream = [t for text in STATE["texts"] for t in tok.encode(text)]
    STATE["stream"] = stream
    c = ours.config
    return (f"loaded in {sec:.1f} s: {c.n_layer}x{c.n_embd}, vocab {c.vocab_size}, "
            f"{next(ours.parameters()).dtype}; tokenizer {tok.n_vocab} ids", "PASS")


def windows(n, length, seed):
    """n prompts of exactly `length` tokens of text-game text, from seeded offsets of the stream
    (repeated when too short)."""
    stream, = need("stream")
    stream = stream * math.ceil((length + 1) / len(stream) + 1)
    rng = random.Random(seed)
    return [stream[o:o + length] for o in (rng.randrange(len(stream) - length) for _ in range(n))]


# -----------------------------------------------------------------------------
# 3. parity with transformers

def step_logits():
    hf, ours = need("hf", "ours")
    B, T = S["parity"]
    idx = torch.tensor(windows(B, T, seed=1), device=DEVICE)
    with torch.no_grad():
        ref = hf(idx).logits.float()
        got = ours(idx)[0].float()
    diff = (got - ref).abs()
    STATE["logit_noise"] = diff.max().item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    text = f"max abs diff {diff.max().item():.2e}, argmax agrees {agree:.1%}"
    if DTYPE == torch.float32:
        tol = FP32_ATOL * max(1.0, ref.abs().max().item())
        return text + f" (criterion: diff <= {tol:.0e})", "PASS" if diff.max() <= tol else "FAIL"
    # bf16: the two implementations round differently, so near-tied top logits may swap. The
    # criterion counts the positions where HF's top-2 margin is above 4x the mean difference
    # (decisive ones): their argmax must agree at >= 99%; the mean difference must stay < 5% of the
    # logits' spread.
    top2 = ref.topk(2, dim=-1).values
    decisive = (top2[..., 0] - top2[..., 1]) > 4 * diff.mean()
    ok = (got.argmax(-1) == ref.argmax(-1))[decisive].float().mean().item()
    rel = (diff.mean() / ref.std()).item()
    text += (f"; decisive positions {ok:.1%} of {int(decisive.sum())}/{decisive.numel()}, "
             f"mean diff {rel:.1%} of the logits' std (criterion >= 99%, < 5%)")
    return text, "PASS" if ok >= 0.99 and rel < 0.05 else "FAIL"


def hf_gen_config(new, sample):
    return transformers.GenerationConfig(
        do_sample=sample, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
        min_new_tokens=new, pad_token_id=0, eos_token_id=None, bos_token_id=None,
        disable_compile=not args.hf_compile)


def step_greedy():
    """64 greedy tokens: ours (KV cache, temperature 0) against HF's; the first position where a
    row differs. Criterion: the first 16 tokens of every row agree, or the rows part at a near tie
    (HF's logits of the two tokens there closer than twice the largest logit difference of the
    logits check: rounding may swap them). In float32 they agree to the end."""
    hf, ours = need("hf", "ours")
    B, new = S["greedy"]
    prompts = [w[:n] for w, n in zip(windows(B, 64, seed=2), (40, 64))]
    toks, _ = engine.generate(ours, prompts, new, temperature=0.0, eos_id=None)
    firsts, margins = [], []
    for p, row in zip(prompts, toks.tolist()):
        with torch.no_grad():
            out = hf.generate(input_ids=torch.tensor([p], device=DEVICE),
                              attention_mask=torch.ones(1, len(p), dtype=torch.long, device=DEVICE),
                              generation_config=hf_gen_config(new, sample=False))
        ref = out[0, len(p):].tolist()
        first = next((i for i, (a, b) in enumerate(zip(row, ref)) if a != b), None)
        firsts.append(first)
        margin = 0.0
        if first is not None:   # HF's logits at the parting point, on the common prefix
            with torch.no_grad():
                lg = hf(torch.tensor([p + ref[:first]], device=DEVICE)).logits[0, -1].float()
            margin = (lg[ref[first]] - lg[row[first]]).item()
        margins.append(margin)
    noise = 2 * STATE.get("logit_noise", 0.0) + 1e-6
    text = "first divergence: " + ", ".join("none" if f is None else f"token {f}" for f in firsts)
    if any(f is not None for f in firsts):
        text += f"; HF margin there {max(margins):.2e} (a near tie if <= {noise:.1e})"
    # bf16: the first 16 agree or the rows part at a near tie; float32: only at a near tie
    early = 16 if DTYPE != torch.float32 else new
    ok = all(f is None or f >= early or m <= noise for f, m in zip(firsts, margins))
    return f"{B} prompts, {new} tokens; {text}", "PASS" if ok else "FAIL"


# -----------------------------------------------------------------------------
# 4. sampler throughput

def sampled_ids_ok(toks):
    """-> (text, ok): every id drawn is below the tokenizer's vocabulary and every row decodes."""
    tok = STATE["tok"]
    bad = int((toks >= tok.n_vocab).sum())
    try:
        for row in toks.tolist():
            tok.decode([t for t in row if t >= 0])
        dec = "decodes"
    except Exception as e:   # noqa: BLE001  (a KeyError from tiktoken for an unknown id)
        dec = f"decode fails ({one_line(e)})"
    return (f"{bad} of {toks.numel()} ids >= tokenizer vocab {tok.n_vocab}, {dec}",
            bad == 0 and dec == "decodes")


def measured_bandwidth():
    if "bandwidth" not in STATE:   # measured once: a copy on DEVICE
        STATE["bandwidth"] = bandwidth(DEVICE)
    return STATE["bandwidth"]


def step_traffic(L, static):
    """common.decode_traffic at step 4's shape with prompts of L tokens (static: the path)."""
    ours, tok = need("ours", "tok")
    B, G, _, new = S["sampler"]
    return decode_traffic(ours.config, DTYPE.itemsize, B, L, G, new, tok.n_vocab, static,
                          engine_static.WIDTH)


def of_bound(n, sec, L, static=None, steps=None):
    """Tokens/s, ms a decode step (steps: how many; default new) and the tokens/s' fraction of the
    weights bound: B x G tokens a decode step if a step took only the reading of the weights once.
    For ours (static: its path, True or False) also of the weights + cache bound, the keys and
    values its path reads added, and the step's parts in ms."""
    B, G, _, new = S["sampler"]
    bw, parts = measured_bandwidth(), step_traffic(L, bool(static))
    bound = B * G * bw / parts["weights"]
    text = (f"{fmt_rate(n, sec)}, {sec / (steps or new) * 1e3:.3g} ms a step, "
            f"{n / sec / bound:.1%} of the weights bound ({bound:,.0f} tok/s")
    if static is None:
        return text + f" at {bw / 1e9:,.0f} GB/s)"
    both = B * G * bw / (parts["weights"] + parts["cache"])
    return (f"{text}), {n / sec / both:.1%} of the weights + cache bound ({both:,.0f} tok/s): "
            f"{traffic_text(parts, bw)}")


def step_sampler_ours(L, graphs, warm_up=True, eos=False, compile=None):
    """engine.generate's eager path, or (graphs) its static path (compile: None, its default:
    compiled on a GPU), timed at step 4's shape. eos: the tokenizer's EOS ends rows (at random:
    answers of mixed lengths; the static path drops done rows), tokens/s counting the tokens
    emitted, ms a step the decode steps run."""
    ours, tok = need("ours", "tok")
    B, G, _, new = S["sampler"]
    prompts = windows(B, L, seed=3)
    gen = torch.Generator().manual_seed(0)   # a CPU generator, as train_lang.py passes it
    eos_id = tok.eos_id if eos else None

    def run(ps, n, samples):
        with torch.inference_mode():
            if graphs:
                return engine_static.static_generate(ours, ps, n, 1.0, None, None, eos_id, gen,
                                                     samples, tok.n_vocab, compile=compile)
            return engine.generate(ours, ps, n, temperature=1.0, eos_id=eos_id, generator=gen,
                                   num_samples=samples, vocab=tok.n_vocab)
    if warm_up:
        run(prompts[:2], 4, 2)   # warm-up (kernels, allocator; a compiled step's compilation)
    sync()
    t0 = time.perf_counter()
    toks, _ = run(prompts, new, G)
    sync()
    sec = time.perf_counter() - t0
    text, ok = sampled_ids_ok(toks)
    if graphs and CUDA:   # the captures are inside the timed call
        text = (f"{engine_static.CAPTURE['graphs']} CUDA graphs captured in "
                f"{engine_static.CAPTURE['seconds']:.2f} s; {text}")
    emitted = int((toks >= 0).sum())
    if eos:
        lengths = (toks >= 0).sum(1).float()
        text = (f"answers of {int(lengths.min())}-{int(lengths.max())} tokens (mean "
                f"{lengths.mean():.0f}), {int((toks == eos_id).sum())} rows ended; {text}")
    return (f"{of_bound(emitted, sec, L, graphs, toks.size(1) - 1)}; {text}",
            "PASS" if ok else "FAIL")


def step_graphs_greedy():
    """64 greedy tokens of 4 prompts x 2 samples on the static path: captured as a CUDA graph
    (graphs=True) against the same path run eagerly; equal is PASS (on a CPU both run eagerly).
    Shown beside: whether they equal the eager path's (in bf16 a different matmul shape may round
    a near tie the other way)."""
    ours, = need("ours")
    prompts = [w[:n] for w, n in zip(windows(4, 64, seed=7), (40, 64, 52, 64))]
    graph = engine.generate(ours, prompts, 64, temperature=0, num_samples=2, graphs=True)[0]
    with torch.inference_mode():
        plain = engine_static.static_generate(ours, prompts, 64, 0, None, None, None, None, 2,
                                              None, capture=False)[0]
    eager = engine.generate(ours, prompts, 64, temperature=0, num_samples=2)[0]
    differ = (graph != eager).any(0).nonzero()
    first = f"first at token {int(differ[0])}" if len(differ) else "equal"
    same = torch.equal(graph, plain)
    return (f"captured vs uncaptured: {'equal' if same else 'DIFFER'}; vs the eager path: "
            f"{first}", "PASS" if same else "FAIL")


def step_sampler_compiled(L):
    """The graphs row with the other choice of compile than the default (on a GPU uncompiled,
    on a CPU compiled by torch.compile): what the fused kernels gain. The compiled step runs once
    first at the timed shape (its seconds shown); 64 greedy tokens of the static path compiled
    against uncompiled shown (fused kernels may round a near tie the other way)."""
    ours, tok = need("ours", "tok")
    B, G, _, new = S["sampler"]
    greedy = [w[:n] for w, n in zip(windows(2, 64, seed=7), (40, 64))]
    t0 = time.perf_counter()
    with torch.inference_mode():
        engine_static.static_generate(ours, windows(B, L, seed=3), new, 1.0, None, None, None,
                                      torch.Generator().manual_seed(0), G, tok.n_vocab,
                                      compile=True)
        sync()
        compile_s = time.perf_counter() - t0
        both = [engine_static.static_generate(ours, greedy, 64, 0, None, None, None, None, 2,
                                              None, compile=c)[0] for c in (True, False)]
    differ = (both[0] != both[1]).any(0).nonzero()
    same = f"first differ at token {int(differ[0])}" if len(differ) else "equal"
    text, status = step_sampler_ours(L, True, warm_up=False, compile=not CUDA)
    return (f"compiled and run once in {compile_s:.0f} s; greedy vs uncompiled: {same}; {text}",
            status)


def step_sampler_hf(L):
    hf, tok = need("hf", "tok")
    B, G, _, new = S["sampler"]
    ids = torch.tensor(windows(B, L, seed=3), device=DEVICE)
    att = torch.ones_like(ids)
    cfg, cache = hf_gen_config(new, sample=True), "static"
    warm = hf_gen_config(4, sample=True)   # the warm-up: 2 prompts, 4 tokens

    def warm_up():
        with torch.inference_mode():
            hf.generate(input_ids=ids[:2], attention_mask=att[:2], num_return_sequences=2,
                        generation_config=warm)
    try:   # a static KV cache where this transformers has one, else its default
        cfg.cache_implementation = warm.cache_implementation = "static"
        warm_up()
    except Exception as e:   # noqa: BLE001
        print(f"HF static cache unavailable ({one_line(e)}): default cache", flush=True)
        cfg.cache_implementation = warm.cache_implementation = None
        cache = "default"
        warm_up()
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=att, generation_config=cfg,
                          num_return_sequences=G)
    sync()
    sec = time.perf_counter() - t0
    toks = out[:, L:]
    # information: HF samples the padded ids too (its padded rows are ours); the criterion: it ran
    # and drew every token asked for
    padded = (toks >= tok.n_vocab).float().mean().item()
    compiled = "compiled" if args.hf_compile and CUDA and cache == "static" else "eager"
    return (f"{of_bound(toks.numel(), sec, L)} ({cache} cache, {compiled}); "
            f"{padded:.0%} of its ids padded", "PASS" if toks.shape == (B * G, new) else "FAIL")


# -----------------------------------------------------------------------------
# 5-6. GRPO, and the optimizer steps' autocast state

STEPS_SEEN = []   # per optimizer step: (label, whether autocast was on for the device)


def record_step(optimizer, a, kw):
    STEPS_SEEN.append((STATE.get("label"), torch.is_autocast_enabled(DEVICE.type)))


register_optimizer_step_pre_hook(record_step)


def random_rewards(G, seed):
    """reward_fn(items, completions) -> random 0/1 rewards, each group of G with both values (so
    every group has spread and is kept)."""
    rng = random.Random(seed)

    def reward_fn(items, completions):
        r = [float(rng.random() < 0.5) for _ in completions]
        for g in range(0, len(r), G):
            r[g] = 1.0 - r[g + 1]   # the group's first two differ
        return r
    return reward_fn


def policy_and_ref():
    """float32 trainable weights (as train_lang.py trains), made once from the loaded model; the
    reference: the loaded model itself, frozen."""
    ours, = need("ours")
    if "policy" not in STATE:
        STATE["policy"] = copy.deepcopy(ours).float().train().requires_grad_(True)
        STATE["ref"] = ours.eval().requires_grad_(False)
    return STATE["policy"], STATE["ref"]


def run_grpo_step(label, prompts, G, new, micro, dtype, rollout_prompts=0):
    """One grpo_step under `dtype` autocast, as train_lang.py calls it -> (stats, seconds). Its
    forwards run under the autocast context it is given, its optimizer steps outside."""
    policy, ref = policy_and_ref()
    cfg = grpo.GRPOConfig(prompts_per_step=len(prompts), group_size=G, max_new_tokens=new,
                          micro_batch=micro, minibatches=2, max_rounds=1, lr=1e-6, warmup=0,
                          vocab=need("tok")[0].n_vocab, rollout_prompts=rollout_prompts)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=cfg.betas,
                            weight_decay=cfg.weight_decay)   # as train_lang.py's
    ac = torch.autocast(DEVICE.type, dtype=dtype, enabled=dtype != torch.float32)
    gen = torch.Generator().manual_seed(0)   # CPU, as train_lang.py's
    reward_fn, items = random_rewards(G, seed=4), [None] * len(prompts)
    STATE["label"] = label
    sync()
    t0 = time.perf_counter()
    try:
        stats = grpo.grpo_step(policy, ref, opt, prompts, items, grpo.Env(reward_fn), cfg, gen,
                               autocast=ac)
        sync()
    finally:
        STATE["label"] = None
        del opt   # AdamW's state: 2 float32 copies of the weights
    return stats, time.perf_counter() - t0


def step_grpo(L, micro):
    P, G, _, new, _ = S["grpo"]
    STATE.pop("hf", None)   # HF's model is done with (steps 3-4): its memory is not counted here
    label = f"grpo {L} mb{micro}"
    stats, sec = run_grpo_step(label, windows(P, L, seed=5), G, new, micro, DTYPE)
    n_steps = sum(lab == label for lab, _ in STEPS_SEEN)
    ok = math.isfinite(stats["loss"]) and stats["groups_kept"] == P and n_steps > 0
    # what the run would have been told before it started (a micro-batch holds G-row groups)
    ours, = need("ours")
    est = memory_estimate(ours.config, DTYPE != torch.float32, True, False, L, new, P, G, micro,
                          prompts_per_chunk(P, G, 2, micro))["peak"]   # run_grpo_step's cfg
    return (f"rollout {stats['t_rollout']:.1f} s + update {sec - stats['t_rollout']:.1f} s, "
            f"loss {stats['loss']:.4f}, {n_steps} optimizer steps, {stats['groups_kept']} groups "
            f"kept; estimated peak {est / 2**30:.2f} GiB", "PASS" if ok else "FAIL")


def step_chunked():
    """grpo_step at --recipe=paper's batch per rank, sampled 2 prompts at a time
    (--rollout_prompts=2), then all at once: peaks, times."""
    P, G, L, new, micro = S["chunked"]
    parts = []
    for n in (2, 0):
        reset_peak()
        stats, sec = run_grpo_step(f"chunked {n}", windows(P, L, seed=7), G, new, micro, DTYPE, n)
        parts.append(f"{n or 'all'}: rollout {stats['t_rollout']:.1f} s, step {sec:.1f} s, "
                     f"peak {peak()}")
    return "; ".join(parts), "PASS" if stats["groups_kept"] == P else "FAIL"


def step_stale_grpo():
    """A bf16-autocast grpo_step (whatever --dtype: the hazard is autocast's) on short prompts:
    PASS when none of its optimizer steps, nor step 5's, ran with autocast on."""
    P, G, (L, _), new, _ = S["grpo"]
    run_grpo_step("stale", windows(P, min(L, 32), seed=6), G, min(new, 16), 8, torch.bfloat16)
    here = [on for lab, on in STEPS_SEEN if lab == "stale"]
    before = [on for lab, on in STEPS_SEEN if lab not in (None, "stale")]
    return (f"{sum(here)} of {len(here)} optimizer steps inside autocast (step 5, {args.dtype}: "
            f"{sum(before)} of {len(before)})",
            "PASS" if here and not any(here + before) else "FAIL")


def step_stale_direct():
    """One Linear, bf16 autocast: does a forward after an SGD step see the new weights? In the
    same autocast region (the step inside it): no, the region's cached bf16 copy is used; in a new
    region after a step outside autocast: yes. PASS when the latter holds (the pattern a grpo_step
    with its optimizer steps outside autocast relies on)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64).to(DEVICE)
    x = torch.randn(4, 64, device=DEVICE)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    changed = {}
    for where in ("inside", "outside"):
        opt.zero_grad()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            y0 = m(x)
            y0.float().square().sum().backward()
            if where == "inside":
                opt.step()
                y1 = m(x)
        if where == "outside":
            opt.step()
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                y1 = m(x)
        changed[where] = not torch.equal(y0, y1)
    return (f"forward after the step changed: step inside the region {changed['inside']}, "
            f"outside it {changed['outside']}", "PASS" if changed["outside"] else "FAIL")


# -----------------------------------------------------------------------------
# 7. the training scripts, as subprocesses

def script(cmd, out_dir, expect):
    """Run cmd in the repository root (stdout + stderr kept in out_dir/output.txt) -> a row's
    (result, status): exit 0 and the file `expect` written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(THREADS)}
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=args.sub_timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {args.sub_timeout} s", "FAIL"
    sec = time.perf_counter() - t0
    (out_dir / "output.txt").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        print((r.stdout + r.stderr)[-3000:], file=sys.stderr)
        # the reason: the last line naming an error (torchrun ends with its own summary)
        lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ("Error" in ln or "error:" in ln or "Exception" in ln)
                  and "ChildFailedError" not in ln and "elastic" not in ln]
        reason = (errors or lines or [""])[-1][:200].replace("|", "/")
        return f"exit {r.returncode} after {sec:.0f} s: {reason}", "FAIL"
    if not (out_dir / expect).is_file():
        return f"exit 0 but no {expect}", "FAIL"
    return f"exit 0 in {sec:.0f} s, wrote {expect}", "PASS"


def lang_flags(out_dir):
    hf_dir, data_dir = need("hf_dir", "data_dir")
    return ["train_lang.py", "--stage=rlvr", f"--init={hf_dir}", f"--data_dir={data_dir}",
            f"--out_dir={out_dir}", "--rl_steps=2", f"--device={args.device}",
            f"--dtype={args.dtype}", "--prompts_per_step=2", "--group_size=4",
            f"--max_new_tokens={S['sub_new']}", "--micro_batch=8", "--eval_limit=4",
            "--control=0"]


def step_lang(torchrun, fsdp=False):
    out = STATE["work"] / ("lang_fsdp" if fsdp else "lang_torchrun" if torchrun else "lang")
    launcher = ["-m", "torch.distributed.run", "--nproc_per_node=1", "--standalone"]
    return script([sys.executable, *(launcher if torchrun else []), *lang_flags(out),
                   *(["--fsdp=1"] if fsdp else [])], out, "eval_val.json")


def step_video():
    """train_video.py --stage=rlvr from the shipped per-frame model (its tokenizer
    checkpoints/video_vq), 3 steps on a few simulated robot episodes of 8 frames."""
    from data.robot.prepare import generate_split
    from data.robot.task import write_action_stats
    data, out = STATE["work"] / "robot", STATE["work"] / "video"
    for split, n in (("train", 4), ("val", 2), ("test", 2)):
        generate_split(data, split, n, length=8)
    write_action_stats(data)
    cmd = [sys.executable, "train_video.py", f"--data={data}", f"--out_dir={out}", "--stage=rlvr",
           "--init=checkpoints/video_mle_4000.safetensors", "--rl_steps=3", "--prompts_per_step=2",
           "--group_size=2", "--micro_batch=4", "--final_eval=val",
           "--clip_len=8", f"--device={args.device}", f"--dtype={args.dtype}",
           f"--threads={THREADS}"]
    return script(cmd, out, "eval.json")


# -----------------------------------------------------------------------------
# 9. where a decode step's time goes

PROFILE = dict(wait=3, warmup=2, active=5)   # decode steps: run unrecorded, warming, recorded
# the functions timed by section, by the module the static path calls them through
RANGES = {"decode_step": engine_static, "decode_attention": model, "sample_next": engine_static}


def step_profile(L):
    """Step 4's shape, prompts of L tokens, on the static path uncaptured
    (engine_static.static_generate(capture=False): the kernels one at a time) under
    torch.profiler, a schedule recording PROFILE["active"] decode steps; the RANGES are wrapped
    in named ranges for the split by section (put back after). -> the top ops by self time a
    step (device time, on a CPU CPU time) in a markdown table, and a chrome trace, beside --out."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    if "ours" not in STATE:   # dropped for the scripts of steps 7-8: loaded again
        step_load()
    ours, tok = need("ours", "tok")
    B, G, _, new = S["sampler"]
    out = Path(args.out)
    md, trace = (out.with_name(f"{out.stem}_sampler_profile{ext}") for ext in (".md", ".json.gz"))
    out.parent.mkdir(parents=True, exist_ok=True)
    seen = {}

    def ready(prof):   # the recorded steps are over
        prof.export_chrome_trace(str(trace))
        seen.update(avg=prof.key_averages(), events=prof.events())
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    prof = profile(activities=acts, schedule=schedule(**PROFILE, repeat=1), on_trace_ready=ready)
    originals = {name: getattr(module, name) for name, module in RANGES.items()}

    def ranged(name):
        def fn(*a, **kw):
            with record_function(name):
                result = originals[name](*a, **kw)
            if name == "decode_step":   # one profiler step per decode step, its kernels done
                sync()
                prof.step()
            return result
        return fn
    try:
        for name, module in RANGES.items():
            setattr(module, name, ranged(name))
        with prof, torch.inference_mode():
            engine_static.static_generate(ours, windows(B, L, seed=3), new, 1.0, None, None,
                                          None, torch.Generator().manual_seed(0), G, tok.n_vocab,
                                          capture=False, compile=False)
    finally:
        for name, fn in originals.items():
            setattr(RANGES[name], name, fn)
    if "avg" not in seen:
        raise RuntimeError(f"{new} new tokens: fewer decode steps than the profile's schedule")
    return profile_table(seen, md, trace, L), "PASS"


def profile_table(seen, md, trace, L):
    """The recorded steps' events -> md written (the time a step by section, the top ops), and
    the row's text."""
    n, where = PROFILE["active"], "device" if CUDA else "CPU"

    def spent(e):   # a range's time, its children's included (on a GPU: its kernels')
        return (e.device_time_total if CUDA else e.cpu_time_total) / 1e3 / n   # ms a step
    cpu_side = [e for e in seen["events"] if e.device_type == torch.autograd.DeviceType.CPU]
    step = sum(spent(e) for e in cpu_side if e.name.startswith("ProfilerStep"))
    # on a GPU: how many kernels (a CUDA graph replays as many, back to back)
    kernels = f" in {sum(len(e.kernels) for e in cpu_side) / n:,.0f} kernels" if CUDA else ""
    part = {name: sum(spent(e) for e in cpu_side if e.name == name) for name in RANGES}
    sections = (f"decode_step {part['decode_step']:.3g} (of it decode_attention "
                f"{part['decode_attention']:.3g}), sample_next {part['sample_next']:.3g}")
    ops = [e for e in seen["avg"] if e.device_type == torch.autograd.DeviceType.CPU
           and e.key not in RANGES and not e.key.startswith("ProfilerStep")]
    self_ms = {e.key: (e.self_device_time_total if CUDA else e.self_cpu_time_total) / 1e3 / n
               for e in ops}
    top = sorted(ops, key=lambda e: -self_ms[e.key])[:20]
    B, G, _, new = S["sampler"]
    traffic = traffic_text(step_traffic(L, True), measured_bandwidth())
    lines = [f"# sampler profile: {device_name()}", "",
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}; {args.dtype}; {B} x {G} samples, "
             f"prompt {L}, {new} new; the static path uncaptured, {n} decode steps recorded "
             f"(chrome trace: {trace.name})", "",
             f"{where} time a step: {step:.3g} ms{kernels}: {sections}; the traffic model: "
             f"{traffic}", "",
             f"| op | calls a step | self {where} ms a step | share |", "|---|---:|---:|---:|"]
    lines += [f"| {e.key} | {e.count / n:g} | {self_ms[e.key]:.3f} | "
              f"{self_ms[e.key] / step:.1%} |" for e in top]
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]), flush=True)
    heavy = ", ".join(f"{e.key} {self_ms[e.key] / step:.0%}" for e in top[:3])
    return (f"{where} time {step:.3g} ms a step{kernels}: {sections}; top ops {heavy}; wrote {md}, "
            f"{trace}")


# -----------------------------------------------------------------------------

def free_models():
    """Before the scripts load their own copies: drop ours (the GPU's memory goes to them)."""
    for k in ("hf", "ours", "policy", "ref"):
        STATE.pop(k, None)
    if CUDA:
        torch.cuda.empty_cache()


def device_name():
    return torch.cuda.get_device_name(DEVICE) if CUDA else cpu_name()


def main():
    transformers.logging.set_verbosity_error()
    print(f"machine: {machine()}\ndevice: {device_name()}, {args.dtype}, "
          f"{'tiny' if args.tiny else '1.5B'} shapes, {THREADS} threads", flush=True)
    t_start = time.perf_counter()
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="gpu_check_")
    STATE["work"] = Path(args.work_dir or tmp.name)
    c = S
    model = (f"{c['n_layer']}x{c['hidden']}, {c['heads']}/{c['kv_heads']} heads, vocab "
             f"{c['vocab'] or 'tok+64'}")
    B, G, lens, new = S["sampler"]
    lens = [int(x) for x in args.sampler_lens.split(",")] if args.sampler_lens else lens
    hf_lens = [int(x) for x in args.hf_lens.split(",")] if args.hf_lens else lens
    P, Gg, glens, gnew, micros = S["grpo"]
    steps = {
        1: [("1 build HF dir", model, step_build)],
        2: [("2 load (ours)", f"{args.dtype} on {args.device}", step_load)],
        3: [("3a logits vs HF", "%d x %d tokens" % S["parity"], step_logits),
            ("3b greedy vs HF", "%d prompts, %d new, T=0" % S["greedy"], step_greedy)],
        4: [(f"4 sampler {who}", f"{B} x {G} samples, prompt {L}, {new} new",
             (lambda L=L, f=f: f(L)))
            for L in lens for who, f in (
                ("ours eager", lambda L: step_sampler_ours(L, False)),
                ("ours graphs", lambda L: step_sampler_ours(L, True)),
                *([(f"ours graphs {'uncompiled' if CUDA else 'compiled'}",
                    step_sampler_compiled)] if args.compile_sampler else []),
                ("ours eager EOS", lambda L: step_sampler_ours(L, False, eos=True)),
                ("ours graphs EOS", lambda L: step_sampler_ours(L, True, eos=True)),
                *([("HF", step_sampler_hf)] if L in hf_lens else []))]
           + [("4 graphs greedy", "4 x 2 samples, 64 new, T=0", step_graphs_greedy)],
        5: [("5 grpo_step", f"{P} x {Gg}, prompt {L}, {gnew} new, micro_batch {mb}",
             (lambda L=L, mb=mb: step_grpo(L, mb))) for L in glens for mb in micros]
           + [("5 grpo_step rollout_prompts", "%d x %d, prompt %d, %d new, micro_batch %d"
               % S["chunked"], step_chunked)],
        6: [("6a stale weights: grpo_step", "bf16 autocast, optimizer step hook", step_stale_grpo),
            ("6b stale weights: autocast cache", "Linear 64, SGD, bf16 autocast",
             step_stale_direct)],
        7: [("7a train_lang rlvr", "2 steps from the HF dir", lambda: step_lang(False)),
            ("7b train_lang torchrun", "1 process, 2 steps", lambda: step_lang(True)),
            ("7c train_video rlvr", "3 steps from video_mle_4000", step_video)],
        8: [("8 train_lang fsdp", "torchrun, 1 process, 2 steps, --fsdp=1",
             lambda: step_lang(True, fsdp=True))],
        9: [("9 sampler profile", f"{B} x {G} samples, prompt {lens[0]}, {new} new, static, "
             "uncaptured", lambda: step_profile(lens[0]))] if args.profile_sampler else [],
    }
    try:
        for n, checks in steps.items():
            if n >= 7:
                free_models()
            for name, shape, fn in checks if n not in SKIP else ():
                check(name, shape, fn, memory=n not in (7, 8))
    finally:
        if tmp is not None:
            tmp.cleanup()
    total = time.perf_counter() - t_start
    headers = ["check", "shape", "result", "time", "peak memory", "status"]
    print_table(headers, ROWS, "gpu_check")
    n_fail = sum(r[-1] == "FAIL" for r in ROWS)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# gpu_check: {device_name()}", "",
             f"{stamp}; {args.dtype} on {args.device}, {'tiny' if args.tiny else '1.5B'} shapes; "
             f"torch {torch.__version__}, transformers {transformers.__version__}; "
             f"{total:.0f} s in all; {n_fail} FAIL", "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in ROWS]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\n{total:.0f} s in all; {n_fail} FAIL; wrote {out}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
