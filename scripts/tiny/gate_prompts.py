"""The four quality gates of seed 000 as 100 varied prompts each, for muse-tiny.

Prompts use phrasings held out of training (qa.py / tools_catalog.py `held_out` forms) and
OpenAI-shaped messages, as a client sends them through the server:
- chat: one user question; pass = a plain answer (no tool call) containing a keyword;
- tool: tools declared (the needed one plus distractors), one request; pass = a parsed call
  to the expected function with schema-valid arguments (exact values reported separately);
- four_turn: user request -> call -> tool result -> answer -> follow-up -> call or answer
  -> (result -> answer); pass = every step well-formed and of the expected kind;
- repeat: a chat or tool prompt run twice greedily; pass = identical output.
"""

import random

import qa
import tools_catalog as tc

FOLLOW_UP_HELD_OUT = ["What about over in {city}?", "Could you also check {city}?", "Now do {city}.",
                      "Same question for {city}."]
THANKS_HELD_OUT = ["Awesome, thanks a bunch!", "That's all, thank you."]


def pick(rng, options):
    return options[rng.randrange(len(options))]


def chat_items(seed="gate-chat", n=100):
    rng = random.Random(seed)
    items = []
    for i in range(n):
        gen = qa.GENERATORS[i % len(qa.GENERATORS)][0]
        q, _, a, keys = gen(rng, held_out=True)
        items.append({"messages": [{"role": "user", "content": q}], "keywords": keys, "reference": a})
    return items


def declare(rng, family, distractors):
    """Declarations for `family` plus distractor families; returns (needed decl, tools)."""
    fams = [family] + rng.sample([f for f in sorted(tc.FAMILIES) if f != family], distractors)
    rng.shuffle(fams)
    decls = {f: tc.FAMILIES[f][0](rng) for f in fams}
    return decls[family], [d.tool for d in decls.values()]


def held_out_request(rng, decl):
    fam = tc.family_of(decl)
    key = decl.family if decl.family in tc.HELD_OUT else fam
    template = pick(rng, tc.HELD_OUT[key])
    if fam == "weather" and "days" in decl.keys:
        template = None  # forecasts keep their trained phrasing (days must be stated)
    return tc.FAMILIES[fam][1](rng, decl, template=template)


def tool_items(seed="gate-tool", n=100):
    rng = random.Random(seed)
    families = sorted(tc.FAMILIES)
    items = []
    for i in range(n):
        fam = families[i % len(families)]
        decl, tools = declare(rng, fam, rng.randint(0, 2))
        text, args = held_out_request(rng, decl)
        items.append({"messages": [{"role": "user", "content": text}], "tools": tools,
                      "expect_name": decl.name, "expect_args": decl.arguments(args), "family": fam})
    return items


def four_turn_items(seed="gate-four", n=100):
    """Each item: first request + how to continue. The evaluator simulates tool results with the
    catalogue's executors (seeded per item) and follows the script."""
    rng = random.Random(seed)
    families = ["weather", "weather", "calculator", "units", "calendar", "time", "timer"]
    items = []
    for i in range(n):
        fam = families[i % len(families)]
        decl, tools = declare(rng, fam, rng.randint(0, 2))
        if fam == "weather" and "days" in decl.keys:
            decl = tc.Declared("weather", decl.name, "Get the current weather for a city.",
                               {"city": ("city", {"type": "string"})}, ["city"])
            tools = [t if t["function"]["name"] != decl.name else decl.tool for t in tools]
        text, args = held_out_request(rng, decl)
        item = {"messages": [{"role": "user", "content": text}], "tools": tools, "family": fam,
                "expect_name": decl.name, "expect_args": decl.arguments(args), "canonical_args": args,
                "seed": "four-%d" % i}
        kind = rng.random()
        if fam in ("weather", "time") and kind < 0.7:
            city = pick(rng, [c for c in tc.CITIES if c != args["city"]])
            item["follow_up"] = {"text": pick(rng, FOLLOW_UP_HELD_OUT).format(city=city), "kind": "call",
                                 "expect_name": decl.name, "expect_args": decl.arguments(dict(args, city=city)),
                                 "canonical_args": dict(args, city=city)}
        elif kind < 0.85:
            other = pick(rng, [f for f in sorted(tc.FAMILIES) if f != fam])
            d2 = tc.FAMILIES[other][0](rng)
            item["tools"] = tools + [d2.tool] if d2.name not in [t["function"]["name"] for t in tools] else tools
            if d2.name in [t["function"]["name"] for t in tools]:
                item["follow_up"] = {"text": pick(rng, THANKS_HELD_OUT), "kind": "answer"}
            else:
                t2, a2 = held_out_request(rng, d2)
                item["follow_up"] = {"text": t2, "kind": "call", "expect_name": d2.name,
                                     "expect_args": d2.arguments(a2), "canonical_args": a2, "family": tc.family_of(d2)}
        else:
            item["follow_up"] = {"text": pick(rng, THANKS_HELD_OUT), "kind": "answer"}
        items.append(item)
    return items


def repeat_items(seed="gate-repeat", n=100):
    chats = chat_items(seed + "-chat", n // 2)
    tools = tool_items(seed + "-tool", n - n // 2)
    return [{"messages": c["messages"]} for c in chats] + [{"messages": t["messages"], "tools": t["tools"]} for t in tools]
