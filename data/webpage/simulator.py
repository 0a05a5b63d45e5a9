"""A small procedural website in the style of WebArena, to make web-page world-model data.

Why our own website? WebArena accessibility trees run to hundreds of lines, far beyond a GPT of a few
million parameters with a 512-token context (a tree line costs about 10 tokens). These pages keep
WebArena's observation format and action grammar but are short: 10-30 lines, plus a tail of long pages
(up to 38 lines, the viewport) where scrolling matters and where listing everything costs precision.

Observation: one line per visible node, `[id] role 'name' attr: value`, in document order, flat (WebArena
indents with tabs; the diff ignores indentation, so we save the characters). Ids are given in document
order to *every* node, hidden ones included, like a browser's DOM ids: when a menu opens, its links
appear with ids already reserved for them (the menu link's id + 1, + 2, ...), so they are predictable.

Pages (the record's "site"); the admin ones share a header of menus that expand and collapse, whose
links switch the section (title and heading change, the menu closes):
    dashboard  figures, a help link whose tooltip appears on hover, tabs that switch the tab panel's rows
    catalog    product rows, a search box that filters them (type, then click Search or press Enter),
               "N records found", pagination (Previous / Page i of n / Next) that go_back undoes
    form       "New Customer": text fields that fill and take focus, a checkbox, a combobox whose options
               open and select, Save: "This is a required entry." under empty required fields, or success
    forum      Postmill-like posts: Upvote (score +1, pressed: True; again to retract), Reply opens a
               comment box, Post publishes "<you>: <text>" and the comment count goes up
Every page has two sticky lines (the root and the account link) that never scroll away.

Actions: click [id], type [id] [text], hover [id], scroll [down], scroll [up], go_back, press [enter].
  * an id that is not visible (hidden, scrolled away, absent) does nothing;
  * `type` replaces a field's text and focuses it (`focused: True`; the text is its StaticText child);
    a click on a field only focuses it; only text fields take focus;
  * `press [enter]` clicks the focused field's form button (Search, Save; the comment box has none);
  * a visible tooltip disappears on any action except hovering its link again;
  * scrolling moves the viewport 5 lines; at either end, or on a page that fits, it does nothing;
  * go_back undoes the last pagination (the only navigation here); without history it does nothing.
Some new content cannot be known from the page (another tab's rows, the next page of products, lines
that scrolling reveals): a world model can only guess it, and the F1 reward prefers leaving it out.

Episodes: 8 steps on a fresh page by a scripted-ish agent: with probability 0.65 an action meant to do
something, otherwise a random one (clicks on text, hovers, typing into buttons, scrolling short pages,
go_back without history, Enter without focus, hidden ids): the unchanged transitions.

Splits (`generate_split`): each split has its own random stream (seeded by split name and seed), and each
(site, store or forum, user) triple belongs to one split by a stable hash (80/10/10); the triple shows in
the sticky lines, so no observation is shared between splits. Held out: the form fields "Company" and
"Telephone" never occur in train or val; half of the test forms have one.

Statistics (prepare.py defaults: seed 0, 20000 / 500 / 1000 records): unchanged 32.7% / 31.6% / 33.3%;
train: mean prompt 605 characters (max 1117), mean answer 122 (median 106, 95th percentile 270, max 697),
18.0 lines per page (max 38, 4.3% over 30); 56 test records show a held-out field. With 1024 BPE ranks
trained on train (2.9 characters a token), 0.2% of train records (filtering a long product list) exceed
512 tokens of prompt + answer.
"""
import copy
import random
import zlib
from functools import partial

VIEW, SCROLL_STEP, STICKY = 36, 5, 2       # viewport lines below the sticky ones; scroll step
MAX_STEPS, P_USEFUL, P_HELD_OUT_TEST = 8, 0.65, 0.5
SPLIT_BUCKETS = {"train": range(0, 8), "val": range(8, 9), "test": range(9, 10)}
SITES = {"dashboard": 3, "catalog": 3, "form": 2, "forum": 3}   # site -> sampling weight

STORES = ("Luma", "Nova", "Acme", "Orbit", "Zenith", "Maple", "Cobalt", "Harbor", "Summit", "Willow",
          "Ember", "Atlas", "Birch", "Coral")
USERS = ("jdoe", "amy", "raj", "lena", "omar", "kim", "tom", "zoe", "ivan", "mia", "sam", "eli", "noa",
         "ben", "ada", "leo", "ana", "max", "yui", "kai", "eva", "dan", "ola", "tess")
FORUMS = ("books", "gaming", "movies", "science", "cooking", "travel", "music", "history", "space",
          "diy", "pets", "running", "art", "chess")
MENUS = {"SALES": ("Orders", "Invoices", "Shipments"), "CATALOG": ("Products", "Categories"),
         "CUSTOMERS": ("All Customers", "Now Online"), "MARKETING": ("Promotions", "Newsletters"),
         "REPORTS": ("Statistics", "Reviews"), "STORES": ("Settings", "Currency")}
BRANDS = ("Sprite", "Joust", "Quest", "Zing", "Aero", "Nova", "Hero", "Ajax", "Echo", "Mars")
GOODS = ("Yoga Strap", "Duffle Bag", "Water Bottle", "Running Tee", "Stasis Ball", "Backpack", "Hoodie",
         "Watch", "Yoga Mat", "Tank", "Jacket", "Shorts", "Bag")
MISSES = ("lamp", "sofa", "piano", "kayak")           # search words that match no product
PEOPLE = ("Ava Brown", "Matt Baker", "Grace Nguyen", "Lily Potter", "Sarah Miller", "Alex Kim")
FIGURES = ("Lifetime Sales", "Average Order", "Revenue", "Tax", "Shipping")
TABS = ("Bestsellers", "Most Viewed", "New Customers", "Last Orders")
FIELDS = {"First Name": ("Ava", "Matt", "Lily", "Omar"), "Last Name": ("Brown", "Baker", "Potter"),
          "Email": ("ava@mail.com", "matt@shop.org", "lily@web.net"), "City": ("Oslo", "Lima", "Pune"),
          "Zip Code": ("10115", "75001", "94103"), "Street": ("Main St 1", "Elm Rd 7")}
HELD_OUT_FIELDS = {"Company": ("Initech", "Globex"), "Telephone": ("555 0100", "555 0199")}
GROUPS = ("General", "Wholesale", "Retailer")
TITLES = ("Best book this year?", "My first build", "Weekly thread", "Tips for beginners",
          "Hidden gems", "What are you working on?", "Unpopular opinion", "Favourite classics",
          "Need advice", "Show your setup", "News roundup", "Ask me anything")
COMMENTS = ("Great post", "Thanks for sharing", "I agree", "Nice find", "Not sure about this")


class Node:
    """One element. `kind` names its behaviour (a Page method click_<kind>), `data` links related nodes."""

    def __init__(self, nid: int, role: str, name: str, attrs: dict, shown: bool, kind: str | None):
        self.id, self.role, self.name, self.attrs = nid, role, name, attrs
        self.shown, self.kind, self.data = shown, kind, {}

    def line(self) -> str:
        return f"[{self.id}] {self.role} '{self.name}'" + "".join(f" {k}: {v}" for k, v in self.attrs.items())


def set_flag(node: Node, key: str, on: bool) -> None:
    """An attribute shown only when true (`disabled: True`, `focused: True`), put first like WebArena."""
    node.attrs.pop(key, None)
    if on:
        node.attrs = {key: True, **node.attrs}


class Page:
    """A page: every node in document order, which are shown, the viewport, focus and history.
    Each site is a subclass with build() (make the nodes), click_<kind> handlers and useful_actions()."""

    def __init__(self, site: str, owner: str, user: str, rng: random.Random, held_out: bool = False):
        self.site, self.owner, self.user, self.rng, self.held_out = site, owner, user, rng, held_out
        self.nodes, self.top, self.focus, self.tooltip, self.history = [], 0, None, None, []
        self.build()

    def add(self, role: str, name: str = "", kind: str | None = None, shown: bool = True, **attrs) -> Node:
        node = Node(len(self.nodes) + 1, role, name, attrs, shown, kind)
        self.nodes.append(node)
        return node

    def field(self, role: str, label: str, **attrs) -> Node:
        """A text input with its (hidden while empty) text child."""
        node = self.add(role, label, kind="field", **attrs)
        node.data["value"] = self.add("StaticText", "", shown=False)
        return node

    # ------------------------------------------------------------------ what is visible
    def body(self) -> list[Node]:
        return [n for n in self.nodes[STICKY:] if n.shown]

    def visible(self) -> list[Node]:
        return self.nodes[:STICKY] + self.body()[self.top:self.top + VIEW]

    def render(self) -> str:
        return "\n".join(n.line() for n in self.visible())

    # ------------------------------------------------------------------ acting
    def act(self, action: tuple) -> None:
        verb = action[0]
        if self.tooltip is not None and action[:2] != ("hover", self.tooltip.data["anchor"].id):
            self.tooltip.shown, self.tooltip = False, None
        if verb == "scroll":
            step = SCROLL_STEP if action[1] == "down" else -SCROLL_STEP
            self.top = max(0, min(self.top + step, len(self.body()) - VIEW))
        elif verb == "go_back" and self.history:
            self.history.pop()()        # each entry is a function that restores an earlier view
        elif verb == "press" and self.focus is not None and "submit" in self.focus.data:
            self.click(self.focus.data["submit"])   # Enter in a field clicks its form's button
        elif verb in ("click", "hover", "type"):
            node = next((n for n in self.visible() if n.id == action[1]), None)
            if node is None:
                return
            if verb == "click":
                self.click(node)
            elif verb == "hover" and node.kind == "help":
                node.data["tip"].shown, self.tooltip = True, node.data["tip"]
            elif verb == "type" and node.kind == "field":
                self.type_into(node, action[2])
        self.top = max(0, min(self.top, len(self.body()) - VIEW))

    def click(self, node: Node) -> None:
        handler = getattr(self, f"click_{node.kind}", None)
        if handler is not None:
            handler(node)

    def click_field(self, node: Node) -> None:
        if self.focus is not None:
            set_flag(self.focus, "focused", False)
        set_flag(node, "focused", True)
        self.focus = node

    def type_into(self, node: Node, text: str) -> None:
        self.click_field(node)
        value = node.data["value"]
        value.name, value.shown = text, bool(text)
        if "error" in node.data:
            node.data["error"].shown = False

    def unfocus(self, node: Node) -> None:
        if self.focus is node:
            set_flag(node, "focused", False)
            self.focus = None

    # ------------------------------------------------------------------ the agent
    def useful_actions(self) -> list[tuple]:
        """Actions that change something (the scripted half of the agent)."""
        actions = [("scroll", "down")] if self.top + VIEW < len(self.body()) else []
        return actions + ([("scroll", "up")] if self.top > 0 else [])

    def random_action(self) -> tuple:
        """Any action, mostly useless: on a random visible node (or a hidden id), scroll, go_back, enter."""
        rng = self.rng
        verb = rng.choice(("click", "click", "hover", "type", "scroll", "go_back", "press"))
        if verb in ("scroll", "go_back", "press"):
            return {"scroll": ("scroll", rng.choice(("down", "up"))), "go_back": ("go_back",),
                    "press": ("press", "enter")}[verb]
        nid = rng.choice(self.visible()).id if rng.random() < 0.9 else rng.randint(1, len(self.nodes))
        return ("type", nid, rng.choice(COMMENTS + MISSES)) if verb == "type" else (verb, nid)


def action_text(action: tuple) -> str:
    """WebArena's spelling of an action tuple: ("type", 12, "bag") -> "type [12] [bag]"."""
    return " ".join([action[0]] + [f"[{arg}]" for arg in action[1:]])


def product_name(rng: random.Random) -> str:
    return f"{rng.choice(BRANDS)} {rng.choice(GOODS)}"


class AdminPage(Page):
    """The shop admin's shared header: sticky root and account link, menus, the section heading."""

    def header(self, section: str) -> None:
        self.root = self.add("RootWebArea", f"{section} / {self.owner} Admin")
        self.add("link", f"admin {self.user}")
        self.menus = []
        for label in self.rng.sample(sorted(MENUS), self.rng.randint(2, 3)):
            menu = self.add("link", label, kind="menu", expanded=False)
            menu.data["items"] = [self.add("link", sub, kind="section", shown=False) for sub in MENUS[label]]
            self.menus.append(menu)
        self.heading = self.add("heading", section)

    def open_menu(self, menu: Node, is_open: bool) -> None:
        menu.attrs["expanded"] = is_open
        for item in menu.data["items"]:
            item.shown = is_open

    def click_menu(self, node: Node) -> None:
        opening = not node.attrs["expanded"]
        for menu in self.menus:
            self.open_menu(menu, False)
        self.open_menu(node, opening)

    def click_section(self, node: Node) -> None:
        """A stand-in for navigation that keeps pages short: title and heading change, the menu closes."""
        self.root.name, self.heading.name = f"{node.name} / {self.owner} Admin", node.name
        for menu in self.menus:
            self.open_menu(menu, False)

    def useful_actions(self) -> list[tuple]:
        actions = [("click", m.id) for m in self.menus]
        actions += [("click", i.id) for m in self.menus if m.attrs["expanded"] for i in m.data["items"]]
        return super().useful_actions() + actions


class Dashboard(AdminPage):
    def build(self) -> None:
        rng = self.rng
        self.header("Dashboard")
        self.help = self.add("link", "What is this?", kind="help")
        self.help.data["tip"] = self.add("tooltip", "Figures for the selected store view", shown=False)
        self.help.data["tip"].data["anchor"] = self.help
        for label in rng.sample(FIGURES, rng.randint(1, 3)):
            self.add("StaticText", label)
            self.add("StaticText", f"${rng.randint(0, 9999)}.00")
        self.tabs = [self.add("tab", name, kind="tab", selected=i == 0)
                     for i, name in enumerate(rng.sample(TABS, rng.randint(2, 3)))]
        self.panel = self.add("tabpanel", self.tabs[0].name)
        for i, tab in enumerate(self.tabs):
            tab.data["rows"] = [self.add("row", self.row_text(tab.name), shown=i == 0)
                                for _ in range(rng.randint(1, 3))]

    def row_text(self, tab: str) -> str:
        rng = self.rng
        if tab in ("New Customers", "Last Orders"):
            return f"{rng.choice(PEOPLE)} ${rng.randint(5, 300)}.00"
        return f"{product_name(rng)} {rng.randint(1, 40)}"

    def click_tab(self, node: Node) -> None:
        for tab in self.tabs:
            tab.attrs["selected"] = tab is node
            for row in tab.data["rows"]:
                row.shown = tab is node
        self.panel.name = node.name

    def useful_actions(self) -> list[tuple]:
        tabs = [("click", t.id) for t in self.tabs if not t.attrs["selected"]]
        return super().useful_actions() + tabs + [("hover", self.help.id)]


class Catalog(AdminPage):
    def build(self) -> None:
        rng = self.rng
        self.header("Products")
        self.search = self.field("searchbox", "Search by keyword")
        self.button = self.search.data["submit"] = self.add("button", "Search", kind="search")
        self.count = self.add("StaticText")
        self.empty = self.add("StaticText", "No records found.", shown=False)
        long = rng.random() < 0.12
        n = rng.randint(13, 18) if long else rng.randint(2, 12)
        self.page_size = 20 if long else rng.randint(3, 6)
        self.products = [self.add("row", f"{product_name(rng)} ${rng.randint(5, 99)}.00") for _ in range(n)]
        self.pager = None
        if n > self.page_size:
            self.prev = self.add("button", "Previous", kind="turn")
            self.pager = self.add("StaticText")
            self.next = self.add("button", "Next", kind="turn")
            self.prev.data["step"], self.next.data["step"] = -1, 1
        self.goto("", 0)

    def goto(self, query: str, page: int) -> None:
        """Show page `page` (from 0) of the products whose name contains `query` (any case)."""
        self.query, self.page = query, page
        hits = [p for p in self.products if query.lower() in p.name.lower()]
        for p in self.products:
            p.shown = p in hits[self.page * self.page_size:(self.page + 1) * self.page_size]
        self.count.name, self.empty.shown = f"{len(hits)} records found", not hits
        if self.pager is not None:
            pages = max(1, -(-len(hits) // self.page_size))
            self.pager.name = f"Page {self.page + 1} of {pages}"
            set_flag(self.prev, "disabled", self.page == 0)
            set_flag(self.next, "disabled", self.page + 1 >= pages)

    def click_search(self, node: Node) -> None:
        self.goto(self.search.data["value"].name, 0)

    def click_turn(self, node: Node) -> None:
        """Previous / Next: a navigation, so go_back can undo it; the new page starts at the top."""
        if "disabled" not in node.attrs:
            self.history.append(partial(self.goto, self.query, self.page))
            self.top = 0
            self.goto(self.query, self.page + node.data["step"])

    def useful_actions(self) -> list[tuple]:
        rng, actions = self.rng, super().useful_actions()
        word = rng.choice(self.products).name.split()[rng.randint(0, 1)] if rng.random() < 0.8 \
            else rng.choice(MISSES)
        actions += [("type", self.search.id, word.lower() if rng.random() < 0.5 else word)] * 2
        if self.search.data["value"].name != self.query:
            actions += [("click", self.button.id), ("press", "enter")] * 2
        if self.pager is not None:
            actions += [("click", b.id) for b in (self.prev, self.next) if "disabled" not in b.attrs]
        return actions + ([("go_back",)] if self.history else [])


class CustomerForm(AdminPage):
    def build(self) -> None:
        rng = self.rng
        self.header("New Customer")
        self.saved = self.add("StaticText", "You saved the customer.", shown=False)
        labels = rng.sample(sorted(FIELDS), rng.randint(2, 4))
        if self.held_out:
            labels[rng.randrange(len(labels))] = rng.choice(sorted(HELD_OUT_FIELDS))
        self.fields = []
        for i, label in enumerate(labels):   # each field: textbox, its text, its error line
            self.fields.append(self.field("textbox", label, required=i < 2))
            self.fields[-1].data["error"] = self.add("StaticText", "This is a required entry.", shown=False)
        self.checkbox = self.add("checkbox", "Send Welcome Email", kind="checkbox", checked=False)
        self.combo = self.add("combobox", f"Group: {GROUPS[0]}", kind="combo", expanded=False)
        self.options = [self.add("option", g, kind="option", shown=False, selected=i == 0)
                        for i, g in enumerate(GROUPS)]
        self.save = self.add("button", "Save Customer", kind="save")
        for node in self.fields:
            node.data["submit"] = self.save

    def click_checkbox(self, node: Node) -> None:
        node.attrs["checked"] = not node.attrs["checked"]

    def click_combo(self, node: Node) -> None:
        node.attrs["expanded"] = not node.attrs["expanded"]
        for option in self.options:
            option.shown = node.attrs["expanded"]

    def click_option(self, node: Node) -> None:
        for option in self.options:
            option.attrs["selected"] = option is node
        self.combo.name = f"Group: {node.name}"
        self.click_combo(self.combo)

    def click_save(self, node: Node) -> None:
        missing = [f for f in self.fields if f.attrs["required"] and not f.data["value"].name]
        for f in missing:
            f.data["error"].shown = True
        self.saved.shown = self.saved.shown or not missing

    def useful_actions(self) -> list[tuple]:
        values = {**FIELDS, **HELD_OUT_FIELDS}
        actions = [("type", f.id, self.rng.choice(values[f.name])) for f in self.fields]
        actions += [("click", n.id) for n in (self.checkbox, self.combo, self.save)]
        actions += [("click", o.id) for o in self.options if o.shown]
        return super().useful_actions() + actions + ([("press", "enter")] if self.focus else [])


class Forum(Page):
    def build(self) -> None:
        rng = self.rng
        self.add("RootWebArea", f"/f/{self.owner} - Postmill")
        self.add("link", self.user)
        self.add("heading", f"/f/{self.owner}")
        self.posts = []
        for title in rng.sample(TITLES, rng.randint(7, 10) if rng.random() < 0.12 else rng.randint(2, 4)):
            self.add("heading", title)
            self.add("StaticText", f"by {rng.choice(USERS)}")
            up = self.add("button", "Upvote", kind="upvote", pressed=False)
            up.data["score"] = self.add("StaticText", str(rng.randint(0, 60)))
            reply = self.add("button", "Reply", kind="reply")
            reply.data["count"] = self.add("StaticText", f"{rng.randint(0, 20)} comments")
            reply.data["box"] = box = self.field("textbox", "Comment")
            reply.data["post"] = post = self.add("button", "Post", kind="post", shown=False)
            post.data["reply"], box.shown = reply, False
            reply.data["comment"] = self.add("StaticText", shown=False)
            self.posts.append((up, reply))

    def click_upvote(self, node: Node) -> None:
        score, pressed = node.data["score"], not node.attrs["pressed"]
        node.attrs["pressed"], score.name = pressed, str(int(score.name) + (1 if pressed else -1))

    def open_box(self, reply: Node, is_open: bool) -> None:
        box = reply.data["box"]
        box.shown = reply.data["post"].shown = is_open
        box.data["value"].name, box.data["value"].shown = "", False
        self.unfocus(box)

    def click_reply(self, node: Node) -> None:
        self.open_box(node, not node.data["box"].shown)

    def click_post(self, node: Node) -> None:
        reply = node.data["reply"]
        text = reply.data["box"].data["value"].name
        if text:
            comment, count = reply.data["comment"], reply.data["count"]
            comment.name, comment.shown = f"{self.user}: {text}", True
            count.name = f"{int(count.name.split()[0]) + 1} comments"
            self.open_box(reply, False)

    def useful_actions(self) -> list[tuple]:
        actions = []
        for up, reply in self.posts:
            actions += [("click", up.id), ("click", reply.id)]
            if reply.data["box"].shown:
                actions += [("type", reply.data["box"].id, self.rng.choice(COMMENTS))] * 2
                actions += [("click", reply.data["post"].id)] * 2
        return super().useful_actions() + actions


PAGES = {"dashboard": Dashboard, "catalog": Catalog, "form": CustomerForm, "forum": Forum}


# ---------------------------------------------------------------------- episodes and splits
def bucket(site: str, owner: str, user: str) -> int:
    """Stable hash bucket 0-9 of what the two sticky lines show."""
    return zlib.crc32(f"{site}:{owner}:{user}".encode()) % 10


def sample_page(split: str, rng: random.Random) -> Page:
    """A fresh page whose (site, store or forum, user) belongs to `split`."""
    while True:
        site = rng.choices(sorted(SITES), weights=[SITES[s] for s in sorted(SITES)])[0]
        owner, user = rng.choice(FORUMS if site == "forum" else STORES), rng.choice(USERS)
        if bucket(site, owner, user) in SPLIT_BUCKETS[split]:
            break
    held_out = split == "test" and site == "form" and rng.random() < P_HELD_OUT_TEST
    return PAGES[site](site, owner, user, rng, held_out)


def run_episode(page: Page, rng: random.Random, visit=None) -> list[dict]:
    """Act on `page` for MAX_STEPS steps, recording every transition. visit(page, action), if given, sees
    each page and the action about to be taken on it (it must not change the page or draw from rng)."""
    records = []
    for _ in range(MAX_STEPS):
        useful = page.useful_actions()
        action = rng.choice(useful) if useful and rng.random() < P_USEFUL else page.random_action()
        if visit is not None:
            visit(page, action)
        before = page.render()
        page.act(action)
        records.append({"site": page.site, "observation": before, "action": action_text(action),
                        "next_observation": page.render()})
    return records


def generate_split(split: str, n: int, seed: int = 0, visit=None) -> list[dict]:
    """n records of `split` ("train", "val" or "test"); the same arguments give the same records.
    visit: passed to run_episode (it also sees the pages of the last episode's records cut off at n)."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_BUCKETS)}")
    rng = random.Random(f"webpage:{split}:{seed}")
    records = []
    while len(records) < n:
        records.extend(run_episode(sample_page(split, rng), rng, visit))
    return records[:n]


# ---------------------------------------------------------------------- planning (plan.py)
CLICKABLE = ("link", "button", "tab", "checkbox", "combobox", "option", "textbox", "searchbox")


def valid_actions(page: Page, texts=()) -> list[tuple]:
    """What a browser agent can do on the visible page: click any interactive element (by its role), hover
    any link, type each of the goal's `texts` into any text field, scroll either way, go back, press Enter.
    Most do nothing useful; a world model has to tell which do."""
    actions = []
    for node in page.visible():
        if node.role in CLICKABLE:
            actions.append(("click", node.id))
        if node.role == "link":
            actions.append(("hover", node.id))
        if node.role in ("textbox", "searchbox"):
            actions += [("type", node.id, text) for text in texts]
    return actions + [("scroll", "down"), ("scroll", "up"), ("go_back",), ("press", "enter")]


def make_goal(page: Page, instruction: str, solution: list[tuple], marks: list[list[int]], texts=()) -> dict | None:
    """A goal: after step i of a working `solution`, the nodes `marks[i]` (ids) show certain lines; those
    lines are condition i, the last one is the goal itself, the earlier ones are milestones on the way.
    None when the solution leaves a marked node off screen or the goal holds already."""
    sim, conditions = copy.deepcopy(page), []
    for action, ids in zip(solution, marks):
        sim.act(action)
        shown = {n.id: n.line() for n in sim.visible()}
        if any(i not in shown for i in ids):
            return None
        conditions.append([shown[i] for i in ids])
    if set(conditions[-1]) <= set(page.render().splitlines()):
        return None
    return {"instruction": instruction, "texts": list(texts), "conditions": conditions, "solution": solution}


def sample_goal(page: Page, rng: random.Random) -> dict | None:
    """One task for this page, of the kinds its site offers (see make_goal), or None."""
    options = []
    if isinstance(page, AdminPage):   # navigate: open a menu, click one of its sections
        menu = rng.choice(page.menus)
        item = rng.choice([i for i in menu.data["items"] if i.name != page.heading.name])
        options.append((f"open {item.name} from the {menu.name} menu", [("click", menu.id), ("click", item.id)],
                        [[menu.id], [page.heading.id, page.root.id]], ()))
    if isinstance(page, Dashboard):
        tab = rng.choice([t for t in page.tabs if not t.attrs["selected"]])
        options.append((f"show the {tab.name} tab", [("click", tab.id)], [[tab.id, page.panel.id]], ()))
        tip = page.help.data["tip"]
        options.append(("read the help tooltip", [("hover", page.help.id)], [[tip.id]], ()))
    if isinstance(page, Catalog):
        word = rng.choice(rng.choice(page.products).name.split()[:2])
        word = word.lower() if rng.random() < 0.5 else word
        if sum(word.lower() in p.name.lower() for p in page.products) < len(page.products):
            value = page.search.data["value"]
            options.append((f"search the products for {word}", [("type", page.search.id, word),
                            ("click", page.button.id)], [[value.id], [value.id, page.count.id]], (word,)))
        if page.pager is not None:
            options.append(("go to the next page of products", [("click", page.next.id)], [[page.pager.id]], ()))
    if isinstance(page, CustomerForm):   # fill both required fields, then save
        values = {**FIELDS, **HELD_OUT_FIELDS}
        (f0, v0), (f1, v1) = [(f, rng.choice(values[f.name])) for f in page.fields[:2]]
        ids = [f0.data["value"].id, f1.data["value"].id]
        options.append((f"save a customer with {f0.name} {v0} and {f1.name} {v1}",
                        [("type", f0.id, v0), ("type", f1.id, v1), ("click", page.save.id)],
                        [ids[:1], ids[1:], [page.saved.id] + ids], (v0, v1)))
    if isinstance(page, Forum):
        up, reply = rng.choice(page.posts)
        title = page.nodes[up.id - 3].name          # the post's heading, two nodes before its Upvote
        options.append((f"upvote the post '{title}'", [("click", up.id)], [[up.id, up.data["score"].id]], ()))
        text, box = rng.choice(COMMENTS), reply.data["box"]
        options.append((f"comment '{text}' on the post '{title}'",
                        [("click", reply.id), ("type", box.id, text), ("click", reply.data["post"].id)],
                        [[reply.data["post"].id], [box.data["value"].id],
                         [reply.data["comment"].id, reply.data["count"].id]], (text,)))
    return make_goal(page, *rng.choice(options))


def planning_episodes(n: int, seed: int = 0, split: str = "test") -> list[tuple[Page, dict]]:
    """n (fresh page, goal) pairs of `split`'s sites, stores and users, drawn from a random stream of their
    own (the data splits are untouched); pages whose sampled goal cannot be shown on screen are skipped."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_BUCKETS)}")
    rng, episodes = random.Random(f"webpage-plan:{split}:{seed}"), []
    while len(episodes) < n:
        page = sample_page(split, rng)
        goal = sample_goal(page, rng)
        if goal is not None:
            episodes.append((page, goal))
    return episodes


# ---------------------------------------------------------------------- coverage (prepare.py --cover)
def cover_text(page: Page, rng: random.Random) -> tuple[str, ...]:
    """A text to type, of the kind this page's fields take (a product word or a miss, a field's value, a
    comment), as a goal would give one to valid_actions; () on a page without text fields."""
    if isinstance(page, Catalog):
        word = rng.choice(rng.choice(page.products).name.split()[:2]) if rng.random() < 0.8 else rng.choice(MISSES)
        return (word.lower() if rng.random() < 0.5 else word,)
    if isinstance(page, CustomerForm):
        return (rng.choice({**FIELDS, **HELD_OUT_FIELDS}[rng.choice(page.fields).name]),)
    if isinstance(page, Forum):
        return (rng.choice(COMMENTS),)
    return ()


def offscript_records(page: Page, taken: tuple, k: int, rng: random.Random) -> list[dict]:
    """Up to k transitions from `page` by random valid actions other than `taken` (the one the episode
    takes there), each played on a copy of the page; the page itself is left as it is."""
    taken_text = action_text(taken)
    options = [a for a in valid_actions(page, cover_text(page, rng)) if action_text(a) != taken_text]
    records, before = [], page.render()
    for action in rng.sample(options, min(k, len(options))):
        sim = copy.deepcopy(page, {id(page.rng): page.rng})   # acting never draws from rng
        sim.act(action)
        records.append({"site": page.site, "observation": before, "action": action_text(action),
                        "next_observation": sim.render(), "source": "offscript"})
    return records


def generate_cover(split: str, n: int, seed: int = 0, per_state: int = 1) -> tuple[list[dict], list[dict]]:
    """(scripted, offscript): scripted = generate_split(split, n, seed), the very same records, and on the
    page of each of them, in order, `per_state` off-script records. Their choices come from a random stream
    of their own, so the scripted records and the pages are untouched, and the first pages' off-script
    records do not depend on n."""
    rng, at_state = random.Random(f"webpage-cover:{split}:{seed}"), []
    scripted = generate_split(split, n, seed,
                              visit=lambda page, taken: at_state.append(offscript_records(page, taken, per_state, rng)))
    return scripted, [r for records in at_state[:n] for r in records]
