"""Property tests of every reward in rewards.py, text and video (hypothesis, derandomized so CI is deterministic):
on >= 10,000 random and mutated inputs per reward (truncated JSON, wrong types, huge numbers, NaN, deep nesting,
unicode, empty text, every prefix of true and mutated answers; NaN/inf/huge pixels in four dtypes), every result is a
finite number in the documented range and nothing raises. Hypothesis costs ~1 ms per drawn example on a busy core, ten
times a reward call, so most examples are a seed from which plain Python builds a batch of inputs (each one checked on
its own). One exception in count: "mae+lpips" costs a VGG16 pass per input (~3.5 ms at 16x16 on one core), so it gets >=
150 inputs; its input handling is the same `video_reward` code that "mae+ssim" runs >= 10,000 times.
Bounded work: answers over MAX_ANSWER_CHARS score 0 unread (checked one character either side of the cap), and the
worst constructions we know of, megabyte-long or at the cap, finish fast (asserted under 5 s; measured <= 0.15 s on
a busy 2-core machine). Video metrics given wrong shapes or dtypes raise one clear ValueError."""
import json
import math
import random
import re
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from data.textgame.simulator import generate_split as textgame_split
from data.textgame.task import make_diff, target_text as textgame_target
from data.webpage.simulator import generate_split as webpage_split
from data.webpage.task import target_text as webpage_target
from rewards import MAX_ANSWER_CHARS, _answer_segment, textgame_metrics, textgame_reward, web_prf
from video_rewards import (LPIPS, WORST_VIDEO_REWARD, VideoReward, mae, mse, psnr, repetition_rate, ssim,
                     video_reward)


def web_f1(text, target):
    """The F1 alone, the web page's reward."""
    return web_prf(text, target)[2]


FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TEXTGAME = [(r["state"], r["next_state"]) for r in textgame_split("val", 40, 0)]
WEBPAGE = [webpage_target(r) for r in webpage_split("val", 40, 0)]
# pieces a model (or a corrupted file) might emit: JSON's odd corners, Python literals, huge and non-finite
# numbers, deep nesting, fences and answer cues, control characters, lone surrogates, right-to-left marks, emoji
JUNK = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, "-0", "1.5e-400", "true", "True", "None",
        "null", '"', "'", "\\", "\\u", "\\ud800", "\ud800", "\x00", "\x1c", "\u2028", "\u202e", "\ufeff", "漢字",
        "🙂",
        ",", ":", "{", "}", "[", "]", "{}", "[]", "```json\n", "```", "The final answer is:", "final state is:",
        "[" * 2000, '{"a":' * 300, "]" * 50, "New items:", "Deleted items:", "Updated items:", "None", "\n", "\t",
        '"uuid": 1', '"uuid": true', '"modified": {}', '"removed": 3', '"score": []', '"contains": [1]']


def mutate(text, rng):
    """1-4 random edits: truncate, delete a span, insert junk, duplicate or move a span."""
    for _ in range(rng.randint(1, 4)):
        i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        op = rng.randrange(5)
        if op == 0:
            text = text[:i]
        elif op == 1:
            text = text[:i] + text[j:]
        elif op == 2:
            text = text[:i] + rng.choice(JUNK) + text[i:]
        elif op == 3:
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + text[j:] + text[i:j]
    return text


def odd_value(rng, depth=0):
    """A JSON-able (or not quite: NaN, inf, huge int) value of a random type."""
    choice = rng.randrange(8 if depth < 3 else 5)
    if choice == 0:
        return rng.choice([0, 1, -1, 10 ** 40, -(10 ** 400), 1.5, float("nan"), float("inf"), -0.0, 1e-320])
    if choice == 1:
        return rng.choice([True, False, None])
    if choice == 2:
        return rng.choice(["", "egg (ID: 2)", "\ud800", "漢字🙂", "x" * 1000, "None"])
    if choice == 3:
        return rng.randrange(10)
    if choice == 4:
        nested = []
        for _ in range(rng.randrange(1, 60)):
            nested = [nested]
        return nested
    if choice == 5:
        return [odd_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["modified", "removed", "score", "uuid", "properties", "contains", "name", "x"]
    return {rng.choice(keys): odd_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def replace_somewhere(value, rng):
    """A copy of a JSON value with one nested value (maybe the whole) replaced by an odd one."""
    if isinstance(value, (dict, list)) and value and rng.random() < 0.85:
        value = dict(value) if isinstance(value, dict) else list(value)
        key = rng.choice(list(value)) if isinstance(value, dict) else rng.randrange(len(value))
        value[key] = replace_somewhere(value[key], rng)
        return value
    return odd_value(rng)


def wrap(text, rng):
    """Sometimes put the answer where the official extraction looks: after a cue, in a fence, amid prose."""
    return rng.choice([text, text, "The final answer is: " + text, f"```json\n{text}\n```", f"I think\n{text}\nok"])


WRONG_TYPES = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=40), st.lists(st.text(max_size=5)),
                        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), st.just(b"{}"),
                        st.just(["{\"modified\": []}"]), st.just(float("nan")))


def textgame_case(seed):
    """A text built from a seed: the true diff mutated, a mutated JSON value in its place, junk, or the truth."""
    rng = random.Random(seed)
    state, nxt = rng.choice(TEXTGAME)
    truth, kind = textgame_target({"state": state, "next_state": nxt}), rng.randrange(4)
    if kind == 0:
        text = wrap(mutate(truth, rng), rng)
    elif kind == 1:
        text = wrap(json.dumps(replace_somewhere(make_diff(state, nxt), rng), ensure_ascii=rng.random() < 0.5), rng)
    elif kind == 2:
        text = "".join(rng.choice(JUNK) for _ in range(rng.randrange(12)))
    else:
        text = wrap(truth, rng)
    return text, state, nxt


def webpage_case(seed):
    rng = random.Random(seed)
    target, kind = rng.choice(WEBPAGE), rng.randrange(3)
    if kind == 0:
        text = mutate(target, rng)
    elif kind == 1:
        text = mutate(rng.choice(WEBPAGE), rng)
    else:
        text = "\n".join(rng.choice(JUNK + target.splitlines()) for _ in range(rng.randrange(15)))
    return text, target


# hypothesis costs ~1 ms per drawn example on a busy core, a reward call a tenth of that: so an example is a batch of
# PER_EXAMPLE inputs: one arbitrary unicode text or value of a wrong type, and the rest built by plain Python from a
# drawn seed.
PER_EXAMPLE = 10
SEEDS = st.integers(0, 2 ** 64)


def batches(cases, case):
    return st.tuples(st.one_of(st.text(max_size=300), WRONG_TYPES), st.sampled_from(cases), SEEDS).map(
        lambda t: [(t[0], *t[1])] + [case(t[2] * PER_EXAMPLE + i) for i in range(PER_EXAMPLE - 1)])


def test_textgame_rewards_are_finite_and_in_range():
    outcomes, n = set(), [0]

    @settings(max_examples=1_000, **FUZZ)
    @given(batches(TEXTGAME, textgame_case))
    def check(cases):
        for text, state, nxt in cases:
            m = textgame_metrics(text, state, nxt)
            assert m["binary"] in (0.0, 1.0) and m["exact"] in (0, 1) and isinstance(m["parsed"], bool)
            assert math.isfinite(m["task_specific"]) and 0.0 <= m["task_specific"] <= 1.3 + 1e-12
            for key in ("object_acc", "score_acc", "changed_acc"):
                assert m[key] is None or 0.0 <= m[key] <= 1.0
            if isinstance(text, str) and "\\u" not in text and ("modified" not in text or "removed" not in text):
                assert m["task_specific"] == 0.0 and not m["parsed"]   # a key not even written: no credit
            kind = ("binary", "task_specific")[n[0] % 2]     # the reward GRPO calls agrees with the metrics
            assert textgame_reward(text, state, nxt, kind) == m[kind]
            outcomes.add((m["parsed"], m["binary"]))
            n[0] += 1

    check()
    assert n[0] >= 10_000
    # the fuzz reached every branch: unreadable, read but wrong, exactly right
    assert outcomes == {(False, 0.0), (True, 0.0), (True, 1.0)}


def test_truncated_answers_earn_nothing_for_a_missing_key():
    """Every prefix of a true, a wrapped or a mutated answer: nothing raises, a prefix without the "removed" key (our
    answers write it after "modified") scores 0, and the binary reward needs all but the closing brackets."""
    n = [0]

    @settings(max_examples=150, **FUZZ)
    @given(SEEDS)
    def check(seed):
        rng = random.Random(seed)
        state, nxt = rng.choice(TEXTGAME)
        truth = textgame_target({"state": state, "next_state": nxt})
        text = wrap(truth, rng) if rng.random() < 0.5 else wrap(mutate(truth, rng), rng)
        for cut in range(len(text) + 1):
            prefix = text[:cut]
            m = textgame_metrics(prefix, state, nxt)
            if '"removed"' not in prefix:
                assert m["binary"] == 0.0 and m["task_specific"] == 0.0, prefix
            if truth in text and m["binary"] == 1.0:   # cut within the truth: only its closing brackets may go
                assert truth.rstrip("}]") in prefix, prefix
            n[0] += 1

    check()
    assert n[0] >= 10_000


def test_web_rewards_are_finite_and_in_range():
    f1s = []

    @settings(max_examples=1_000, **FUZZ)
    @given(batches([(t,) for t in WEBPAGE], webpage_case))
    def check(cases):
        for text, target in cases:
            p, r, f = web_prf(text, target)
            assert all(isinstance(x, float) and math.isfinite(x) and 0.0 <= x <= 1.0 for x in (p, r, f))
            assert web_f1(text, target) == f
            f1s.append(f)

    check()
    assert len(f1s) >= 10_000
    assert min(f1s) == 0.0 and max(f1s) == 1.0 and any(0 < f < 1 for f in f1s)


# -----------------------------------------------------------------------------
# video

def frame_pair(seed, min_side=11, max_n=16):
    """(pred, true), N rows: true in [0, 1]; each row of pred something a decoder might emit (noise, the truth, a
    constant, huge values, NaN / +-inf at some pixels), the batch in float32, float64, float16 or bfloat16."""
    rng = random.Random(seed)
    n, h, w = rng.randint(1, max_n), rng.randint(min_side, min_side + 6), rng.randint(min_side, min_side + 6)
    g = torch.Generator().manual_seed(rng.randrange(2 ** 32))
    true = torch.rand(n, 3, h, w, generator=g)
    if rng.random() < 0.3:
        true = (true * 255).round() / 255                                      # what decoded uint8 frames give
    pred = torch.empty_like(true)
    for i in range(n):
        kind = rng.randrange(5)
        if kind == 0:
            pred[i] = torch.rand(3, h, w, generator=g)
        elif kind == 1:
            pred[i] = (true[i] + 0.1 * torch.randn(3, h, w, generator=g)).clamp(0, 1)
        elif kind == 2:
            pred[i] = true[i]
        elif kind == 3:
            pred[i] = rng.choice([0.0, 1.0, -1.0, 2.0, 1e30, -1e30, 1e-45])
        else:
            pred[i] = torch.randn(3, h, w, generator=g) * float(f"1e{rng.randint(0, 38)}")
        for value in (float("nan"), float("inf"), -float("inf")):
            if rng.random() < 0.2:
                mask = torch.rand(3, h, w, generator=g) < rng.choice([0.001, 0.1, 1.0])
                pred[i] = pred[i].masked_fill(mask, value)
    return pred.to(rng.choice([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16])), true


def test_video_reward_mae_ssim_is_finite_in_range():
    rows = []

    @settings(max_examples=1_200, **FUZZ)
    @given(SEEDS)
    def check(seed):
        pred, true = frame_pair(seed)
        r = video_reward(VideoReward(), pred, true)
        assert r.shape == (len(pred),) and r.dtype == torch.float32
        assert torch.isfinite(r).all() and (r >= -3.0 - 1e-5).all() and (r <= 1e-5).all()
        rows.append(len(r))

    check()
    assert sum(rows) >= 10_000


def test_video_reward_with_moving_and_object_terms_is_finite_in_range():
    """The moving-pixel and erased-object terms on the same fuzzed frames: finite, within [floor, 0], never raising."""
    @settings(max_examples=300, **FUZZ)
    @given(SEEDS)
    def check(seed):
        pred, true = frame_pair(seed)
        g = torch.Generator().manual_seed(seed % 2**31)
        ctx, bg = torch.rand(true.shape, generator=g), torch.rand(true.shape, generator=g).round()
        r = video_reward(VideoReward(moving=2.0, object=0.5), pred, true, context=ctx, background=bg)
        assert torch.isfinite(r).all() and (r >= -5.5 - 1e-5).all() and (r <= 1e-5).all()

    check()


def test_video_reward_with_the_push_term_is_finite_in_range():
    """The push term (the robot's block detector run on fuzzed frames): finite, within [floor, 0], never raising."""
    @settings(max_examples=150, **FUZZ)
    @given(SEEDS)
    def check(seed):
        pred, true = frame_pair(seed)
        r = video_reward(VideoReward(push=0.5), pred, true, context=true)
        assert torch.isfinite(r).all() and (r >= -3.5 - 1e-5).all() and (r <= 1e-5).all()

    check()


def test_video_reward_mae_lpips_is_finite_in_range():
    torch.manual_seed(0)
    net = LPIPS().eval().requires_grad_(False)       # random VGG; lin weights made >= 0 like the learned ones
    for lin in net.lins:
        lin.weight.data.abs_()
    bound = 1.0 + 4 * sum(lin.weight.max().item() for lin in net.lins)   # mae <= 1; per layer sum w (a-b)^2 <= 4 max w
    bound = max(bound, -WORST_VIDEO_REWARD)          # a NaN/inf prediction gets the worst score
    rows = []

    @settings(max_examples=90, **FUZZ)
    @given(SEEDS)
    def check(seed):
        pred, true = frame_pair(seed, min_side=16, max_n=3)
        r = video_reward(VideoReward(name="mae+lpips"), pred, true, net)
        assert r.shape == (len(pred),) and torch.isfinite(r).all() and (r >= -bound).all() and (r <= 1e-5).all()
        rows.append(len(r))

    check()
    assert sum(rows) >= 150


def test_repetition_rate_is_in_unit_range():
    @settings(max_examples=500, **FUZZ)
    @given(st.randoms(use_true_random=False))
    def check(rng):
        n, k, length, side = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 6), 4
        g = torch.Generator().manual_seed(rng.randrange(2 ** 32))
        codes = torch.randint(rng.randint(1, 3), (n, k, length), generator=g)
        ctx_codes = torch.randint(3, (n, length), generator=g)
        frames = torch.rand(n, k, 3, side, side, generator=g)
        if rng.random() < 0.3:
            frames[torch.rand(frames.shape, generator=g) < 0.2] = float("nan")
        ctx = torch.rand(n, 3, side, side, generator=g)
        r = repetition_rate(codes, ctx_codes, frames, ctx)
        assert r.shape == (n,) and torch.isfinite(r).all() and (r >= 0).all() and (r <= 1).all()

    check()


def test_video_metrics_ranges_nan_and_clear_errors():
    g = torch.Generator().manual_seed(0)
    pred, true = torch.rand(3, 3, 16, 16, generator=g), torch.rand(3, 3, 16, 16, generator=g)
    for metric, hi in ((mae, 1), (mse, 1), (psnr, 100), (ssim, 1)):
        assert ((-hi if metric is ssim else 0) <= metric(pred, true)).all() and (metric(pred, true) <= hi).all()
    assert psnr(true, true).eq(100).all()
    bad = pred.clone()
    bad[1, 0, 0, 0] = float("nan")                # metrics show a broken sample as NaN, and only that sample
    for metric in (mae, mse, psnr, ssim):
        out = metric(bad, true)
        assert out[1].isnan() and torch.isfinite(out[[0, 2]]).all()
    assert torch.isfinite(video_reward(VideoReward(), bad, true)).all()
    cases = [(pred, true[:2]), (pred[0], true[0]), (pred, true.permute(0, 2, 3, 1)), (pred.mul(255).byte(), true),
             (pred.numpy(), true), (pred[..., :8, :8], true[..., :8, :8])]
    for p, t in cases:
        with pytest.raises(ValueError, match="video metrics take two float tensors of one shape") as e:
            video_reward(VideoReward(), p, t)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"got \(3, 3, 16, 16\) torch.float32 and \(2, 3, 16, 16\)"):
        mae(pred, true[:2])
    with pytest.raises(ValueError, match="H, W >= 16"):
        LPIPS()(pred[..., :12, :12], true[..., :12, :12])
    with pytest.raises(ValueError, match="non-finite"):
        video_reward(VideoReward(), pred, bad)
    with pytest.raises(ValueError, match="unknown video reward"):
        video_reward(VideoReward(name="psnr"), pred, true)


# -----------------------------------------------------------------------------
# bounded work: the cap, megabyte inputs, and the worst constructions under the cap

def test_answers_over_the_cap_score_zero_unread():
    state, nxt = next((s, n) for s, n in TEXTGAME if s != n)
    truth = textgame_target({"state": state, "next_state": nxt})
    at_cap = truth + " " * (MAX_ANSWER_CHARS - len(truth))
    assert len(at_cap) == MAX_ANSWER_CHARS and textgame_reward(at_cap, state, nxt) == 1.0
    assert textgame_reward(at_cap + " ", state, nxt) == 0.0
    page = WEBPAGE[0]
    assert web_f1(page + " " * (MAX_ANSWER_CHARS - len(page)), page) == 1.0
    assert web_f1(page + " " * (MAX_ANSWER_CHARS - len(page) + 1), page) == 0.0


MEGABYTE = {
    "truth then junk": lambda t: t + "x" * 2 ** 20,
    "open braces": lambda t: "{" * 2 ** 20,
    "unicode": lambda t: "漢🙂\ud800" * 2 ** 18,
    "one long string": lambda t: '{"modified":[{"uuid":1,"name":"' + "a" * 2 ** 20,
}
AT_CAP = {   # each is exactly MAX_ANSWER_CHARS long and aims at one piece of the parser
    "8 nested starts, then many strings": "{" * 8 + '"",' * ((MAX_ANSWER_CHARS - 8) // 3),
    "single quotes (the swap variant)": "{'" * (MAX_ANSWER_CHARS // 2),
    "open brackets": '{"modified":' + "[" * (MAX_ANSWER_CHARS - 12),
    "open objects": '{"a":' * (MAX_ANSWER_CHARS // 5),
    "Python literals": "{" + "True," * ((MAX_ANSWER_CHARS - 1) // 5),
    "trailing commas": "{" + ", " * ((MAX_ANSWER_CHARS - 1) // 2),
    "fences": "```json{" * (MAX_ANSWER_CHARS // 8),
    "answer cues": "The final answer is:{" * (MAX_ANSWER_CHARS // 21),
    "backslashes in a string": '{"a":"' + "\\" * (MAX_ANSWER_CHARS - 6),
    "many objects": '{"modified":[' + '{"uuid":1},' * ((MAX_ANSWER_CHARS - 13) // 11),
    "section headers": "New items:\n" * (MAX_ANSWER_CHARS // 11),
    "many items": "[1] link 'x'\n" * (MAX_ANSWER_CHARS // 13),
}


@pytest.mark.parametrize("name", sorted(MEGABYTE) + sorted(AT_CAP))
def test_pathological_answers_are_handled_fast(name):
    state, nxt = TEXTGAME[0]
    text = MEGABYTE[name](textgame_target({"state": state, "next_state": nxt})) if name in MEGABYTE else AT_CAP[name]
    assert len(text) > MAX_ANSWER_CHARS if name in MEGABYTE else len(text) <= MAX_ANSWER_CHARS
    t0 = time.perf_counter()
    for kind in ("binary", "task_specific"):
        assert 0.0 <= textgame_reward(text, state, nxt, kind) <= 1.3
    assert 0.0 <= web_f1(text, WEBPAGE[0]) <= 1.0
    assert time.perf_counter() - t0 < 5.0, name    # measured <= 0.15 s on a busy 2-core machine (load 6)


def test_every_prefix_and_repeated_filler_at_the_cap_is_fast():
    """A grid of cue/bracket/header prefixes followed by one piece repeated to the cap (whitespace after an unclosed
    fence was quadratic in the official fence regex)."""
    state, nxt = TEXTGAME[0]
    prefixes = ["", "```json", "The final answer is:", "{", '{"a":', ",", "new items", "{'"]
    fillers = [" ", "\n", "x", ", ", "\\", '"', "{", "]", "new items\n", "```json "]
    slowest = 0.0
    for pre in prefixes:
        for fill in fillers:
            text = pre + fill * ((MAX_ANSWER_CHARS - len(pre)) // len(fill))
            t0 = time.perf_counter()
            assert 0.0 <= textgame_reward(text, state, nxt, "task_specific") <= 1.3
            assert 0.0 <= web_f1(text, WEBPAGE[0]) <= 1.0
            slowest = max(slowest, time.perf_counter() - t0)
    assert slowest < 5.0                               # measured <= 0.05 s on a busy 2-core machine


def test_fenced_block_extraction_matches_the_official_regex():
    official = re.compile(r"```json\s*([\s\S]*?)\s*```")       # RLVR-World's; quadratic on long whitespace
    rng = random.Random(0)
    parts = ["```json", "```", " ", "\n", "\t", "\u2003", "\x1c", "x", "{}", "json", "`", "``", "a b", "ab cd ef"]
    for _ in range(20_000):                            # ~600 blocks of >= 10 characters, ~3,500 shorter
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(16)))
        found = official.findall(text)
        # the last block's content when it has >= 10 characters, else the whole text
        assert _answer_segment(text) == (found[-1] if found and len(found[-1]) >= 10 else text), repr(text)


def test_deeply_nested_but_valid_answer_is_scored():
    state, nxt = TEXTGAME[0]
    deep = '{"modified":[],"removed":[],"score":{"score":' + "[" * 20_000 + "]" * 20_000 + "}}"
    assert textgame_reward(deep, state, nxt, "task_specific") == 0.0   # deeper than the decoder's recursion limit
    rng = random.Random(0)
    for _ in range(20):                                 # depth 50-600: parsed, scored, no RecursionError anywhere
        d = make_diff(state, nxt)
        nested = "x"
        for _ in range(rng.randint(50, 600)):
            nested = [nested]
        d["modified"] = [{"uuid": 1, "properties": {"a": nested}, "contains": nested}]
        assert 0.0 <= textgame_reward(json.dumps(d), state, nxt, "task_specific") <= 1.3
