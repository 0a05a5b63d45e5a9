"""Tests of the web-page reward (rewards.py): section parsing, precision / recall / F1 on
hand-made cases, agreement with the official RLVR-World definition, and fuzzing (never raises, in [0, 1])."""
import random

import pytest

from rewards import parse_sections, web_prf


def web_f1(text, target):
    """The F1 alone, the web page's reward."""
    return web_prf(text, target)[2]


TARGET = ("New items:\n[13] link 'Orders'\n[14] link 'Invoices'\n\nDeleted items:\nNone\n\n"
          "Updated items:\n[5] link 'SALES' expanded: True")          # 4 items: 2 new, None, 1 updated
UNCHANGED = "New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\nNone"


def answer(new=(), deleted=(), updated=()):
    return "\n\n".join(f"{title}:\n" + ("\n".join(items) or "None")
                       for title, items in (("New items", new), ("Deleted items", deleted),
                                            ("Updated items", updated)))


def close(got, want):
    return got == pytest.approx(want, abs=1e-12)


def test_parse_sections():
    assert parse_sections(TARGET) == {"new": ["[13] link 'Orders'", "[14] link 'Invoices'"], "deleted": ["None"],
                                      "updated": ["[5] link 'SALES' expanded: True"]}
    messy = ("Sure, here it is:\n  updated  ITEMS :  [5]   link 'SALES'\texpanded: True  \n\n\n"
             "New items\n[13] link 'Orders'\nDELETED items: none\nnew items:\n[14] link 'Invoices'\n")
    assert parse_sections(messy) == {"new": ["[13] link 'Orders'", "[14] link 'Invoices'"], "deleted": ["None"],
                                     "updated": ["[5] link 'SALES' expanded: True"]}
    assert parse_sections("no headers at all\n[1] link 'x'") == {"new": [], "deleted": [], "updated": []}
    assert parse_sections(None) == {"new": [], "deleted": [], "updated": []}


def test_perfect_and_unchanged():
    assert web_prf(TARGET, TARGET) == (1.0, 1.0, 1.0)
    assert web_prf(UNCHANGED, UNCHANGED) == (1.0, 1.0, 1.0)
    assert web_f1("New items:\nnone\nDeleted items:\nNONE\nUpdated items:\n None ", UNCHANGED) == 1.0


def test_partial():
    wrong_one = answer(new=["[13] link 'Orders'", "[15] link 'Shipments'"], updated=["[5] link 'SALES' expanded: True"])
    assert all(close(x, 0.75) for x in web_prf(wrong_one, TARGET))
    missing_one = answer(new=["[13] link 'Orders'"], updated=["[5] link 'SALES' expanded: True"])
    p, r, f = web_prf(missing_one, TARGET)
    assert close(p, 1.0) and close(r, 0.75) and close(f, 6 / 7)
    wrong_section = answer(new=["[13] link 'Orders'", "[14] link 'Invoices'", "[5] link 'SALES' expanded: True"])
    p, r, f = web_prf(wrong_section, TARGET)   # the updated line is not a new item; updated None is wrong too
    assert close(p, 3 / 5) and close(r, 3 / 4)


def test_listing_everything_loses_to_saying_nothing_changed():
    before = [f"[{i}] StaticText 'line {i}'" for i in range(1, 21)]
    after = before[:2] + ["[3] StaticText 'line three'"] + before[3:]
    target = answer(updated=["[3] StaticText 'line three'"])
    everything = answer(new=after, deleted=before, updated=after)
    p, r, f = web_prf(everything, target)
    assert close(p, 1 / 60) and close(r, 1 / 3) and close(f, 2 / 63)
    assert close(web_f1(UNCHANGED, target), 2 / 3)
    assert web_f1(target, target) == 1.0


def test_section_order_whitespace_and_missing_headers():
    swapped = ("Updated items:\n[5] link 'SALES' expanded: True\n\nNew items:\n[14] link 'Invoices'\n"
               "[13] link 'Orders'\n\nDeleted items:\nNone")
    assert web_f1(swapped, TARGET) == 1.0
    spaced = "\n".join("   " + line.replace(" ", "  ") + " \t" for line in TARGET.splitlines())
    assert web_f1(spaced, TARGET) == 1.0
    no_deleted = "New items:\n[13] link 'Orders'\n[14] link 'Invoices'\nUpdated items:\n[5] link 'SALES' expanded: True"
    p, r, f = web_prf(no_deleted, TARGET)
    assert close(p, 1.0) and close(r, 0.75)
    inline = "New items: [13] link 'Orders'\n[14] link 'Invoices'\nDeleted items: None\nUpdated items: " \
             "[5] link 'SALES' expanded: True"
    assert web_f1(inline, TARGET) == 1.0


def test_duplicates_cost_precision_but_repeated_headers_merge():
    p, r, f = web_prf(TARGET + "\n[5] link 'SALES' expanded: True", TARGET)
    assert close(p, 4 / 5) and close(r, 1.0)
    repeated = ("New items:\n[13] link 'Orders'\nDeleted items:\nNone\nNew items:\n[14] link 'Invoices'\n"
                "Updated items:\n[5] link 'SALES' expanded: True")
    assert web_f1(repeated, TARGET) == 1.0


@pytest.mark.parametrize("garbage", ["", "asdf", "New items", "[13] link 'Orders'", "\x00\xff\ufffd" * 50,
                                     "New items:\n\nDeleted items:\n\nUpdated items:\n", "{}" * 1000])
def test_garbage_scores_zero(garbage):
    assert web_prf(garbage, TARGET) == (0.0, 0.0, 0.0)


def test_empty_sides_and_non_strings():
    assert web_prf("", "") == (1.0, 1.0, 1.0)
    assert web_prf("chatter without headers", "New items:\n") == (1.0, 1.0, 1.0)
    assert web_prf(TARGET, "") == (0.0, 0.0, 0.0)
    for bad in (None, 3, b"New items:\nNone", ["New items:"], {"new": []}):
        assert web_prf(bad, TARGET) == (0.0, 0.0, 0.0)
        assert web_prf(TARGET, bad) == (0.0, 0.0, 0.0)
        assert web_f1(bad, TARGET) == 0.0


def official_f1(text: str, target: str) -> float:
    """An independent re-implementation of RLVR-World's web_agent.compute_score (p=0): exact headers at
    the line start, text after them dropped, each section a set, matches pooled over sections."""
    def parse(s):
        sections, current = {"New items": set(), "Deleted items": set(), "Updated items": set()}, None
        for line in s.split("\n"):
            line = line.strip()
            if not line:
                continue
            header = next((h for h in sections if line.startswith(h + ":")), None)
            if header:
                current = header
            elif current:
                sections[current].add(line)
        return sections
    pred, true = parse(text), parse(target)
    acc = sum(len(pred[k] & true[k]) for k in true)
    n_pred, n_true = sum(map(len, pred.values())), sum(map(len, true.values()))
    p, r = (acc / n_pred if n_pred else 0), (acc / n_true if n_true else 0)
    return 2 * p * r / (p + r) if p + r else 0.0


def test_agrees_with_the_official_definition_on_well_formed_answers():
    rng = random.Random(0)
    pool = [f"[{i}] {rng.choice(['link', 'button', 'StaticText'])} 'item {i}'" for i in range(30)]
    for _ in range(300):
        truth = {k: rng.sample(pool, rng.randint(0, 4)) for k in ("new", "deleted", "updated")}
        pred = {k: rng.sample(v, rng.randint(0, len(v))) + rng.sample(pool, rng.randint(0, 2))
                for k, v in truth.items()}
        pred = {k: list(dict.fromkeys(v)) for k, v in pred.items()}   # the official sets drop duplicates
        text, target = answer(**pred), answer(**truth)
        assert close(web_f1(text, target), official_f1(text, target))


def mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 12)):
        op = rng.randrange(5)
        i = rng.randrange(len(chars) + 1)
        if op == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == 1:
            chars.insert(i, rng.choice("\n\t :[]'None\x00é\u2028\r"))
        elif op == 2:
            lines = "".join(chars).split("\n")
            rng.shuffle(lines)
            chars = list("\n".join(lines))
        elif op == 3:
            chars += list("\n" + rng.choice(TARGET.splitlines()))
        else:
            chars = chars[:i]
    return "".join(chars)


def test_fuzz_never_raises_stays_in_range_and_is_symmetric():
    rng = random.Random(1)
    alphabet = "New items:Deleted Updated None[]0123456789 'link\n\t\r\x0b\x1c\u2029é漢\ud800"
    for i in range(1000):
        if i % 3 == 0:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        else:
            text = mutate(rng.choice((TARGET, UNCHANGED)), rng)
        target = rng.choice((TARGET, UNCHANGED, mutate(TARGET, rng)))
        p, r, f = web_prf(text, target)
        assert all(0.0 <= x <= 1.0 for x in (p, r, f))
        assert web_f1(text, target) == f
        assert close(web_f1(target, text), f)   # swapping prediction and truth swaps precision and recall
        assert web_f1(text, text) == 1.0
