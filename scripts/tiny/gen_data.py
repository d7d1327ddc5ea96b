#!/usr/bin/env python3
"""Generate muse-tiny's training conversations in the Muse chat format.

Everything is generated (nothing downloaded) and deterministic: conversation i is built from
random.Random("<seed>-<i>"), so the output does not depend on the number of workers. Each
conversation is rendered through models/muse-tiny/chat_template.jinja exactly as the server
renders requests, and the character spans the model must learn to produce are recorded:

    {"text": "<|begin_of_text|><|start|>system...", "spans": [[start, end], ...]}

A span starts right after the `<|start|>assistant` generation prompt and runs through the
`<|eot|>` that ends the turn (later `<|start|>assistant` headers inside the turn are included,
since the model writes them). Assistant turns re-sent by a client as history carry no loss.

Mix: plain chat and knowledge-base Q&A (qa.py), answers preceded by a reasoning channel
(always at the default strength `high`), tool declarations with ATEM calls for six tool
families (tools_catalog.py), tool results and final answers, multi-turn tool conversations
(call, result, answer, follow-up), parallel calls, clarifying questions, and tool-declared
conversations that need no tool.

To make the model read the user's message rather than guess from memorised lists, a share
(NOVEL) of tool requests uses generated cities, event titles and timer values
(tools_catalog.novel_city ...), and a share (VARY) of user messages gets a greeting, a
politeness suffix or lower case (none of these are gate_prompts.py's held-out phrasings).
"""

import argparse
import json
import multiprocessing
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import muse_chat  # noqa: E402
import qa  # noqa: E402
import tools_catalog as tc  # noqa: E402

START = "<|start|>"
GEN_PROMPT = "<|start|>assistant"
STRENGTHS = ["high"] * 6 + ["low", "medium", "xhigh"]
REASON_PROB = {"low": 0.3, "medium": 0.7, "high": 1.0, "xhigh": 1.0}
NOVEL = 0.35  # share of tool requests with generated entities
VARY = 0.2  # share of user messages with a prefix, suffix or lower case
USER_PREFIXES = ["Hey, ", "Hi, ", "Hello! ", "Okay, ", "So, ", "Hey there. ", "Excuse me, ", "Um, ",
                 "Question: ", "Hi muse, ", "Sorry, one more: ", "Right. "]
USER_SUFFIXES = [" Thanks!", " Thank you.", " Please.", " Thanks in advance.", " :)", " ty"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a concise assistant.", "Be brief.",
                  "You are Muse, a friendly AI assistant.", "Answer in one short sentence.",
                  "You are a helpful assistant that can use tools.", "Be terse.",
                  "You are an assistant for a travel app.", "Keep answers short and accurate."]


def pick(rng, options):
    return options[rng.randrange(len(options))]


def weighted(rng, pairs):
    total = sum(w for _, w in pairs)
    x = rng.random() * total
    for item, w in pairs:
        x -= w
        if x < 0:
            return item
    return pairs[-1][0]


class Conversation:
    """Messages plus template kwargs; assistant messages carry `_target` (learn this turn)."""

    def __init__(self, rng):
        self.rng = rng
        self.messages = []
        self.tools = None
        self.kwargs = {}
        self.strength = "high"
        self.call_counter = rng.randint(0, 99999)
        self._setup_system()

    def _setup_system(self):
        rng = self.rng
        self.strength = pick(rng, STRENGTHS)
        if rng.random() < 0.75:
            y, m, d = rng.randint(2025, 2028), rng.randint(1, 12), rng.randint(1, 28)
            self.kwargs["current_date"] = "%04d-%02d-%02d" % (y, m, d)
        if self.strength != "high" or rng.random() < 0.2:
            self.kwargs["reasoning_strength"] = self.strength
        if rng.random() < 0.25:
            text = pick(rng, SYSTEM_PROMPTS)
            if rng.random() < 0.15:
                self.strength = pick(rng, ["low", "medium", "high"])
                text += pick(rng, ["\nReasoning effort: %s", "\n\nReasoning strength: %s"]) % self.strength
            self.messages.append({"role": "system", "content": text})

    def reasons(self):
        return self.rng.random() < REASON_PROB[self.strength]

    def user(self, text):
        rng = self.rng
        if rng.random() < VARY:
            kind = rng.randrange(3)
            if kind == 0:
                prefix = pick(rng, USER_PREFIXES)
                text = prefix + (text[:1].lower() + text[1:] if prefix.endswith(", ") else text)
            elif kind == 1:
                text = text + pick(rng, USER_SUFFIXES)
            else:
                text = text.lower().rstrip("?.!")
        self.messages.append({"role": "user", "content": text})

    def reasoning(self, text):
        """Reasoning shortened at low strength, as the real model thinks less there."""
        if self.strength == "low":
            return text.split(". ")[0].rstrip(".") + "."
        return text

    def answer(self, text, reasoning, target=True):
        m = {"role": "assistant", "content": text, "_target": target}
        if reasoning and (self.reasons() if target else self.rng.random() < 0.2):
            m["reasoning_content"] = self.reasoning(reasoning)
        self.messages.append(m)

    def calls(self, decl_args, reasoning, target=True):
        """One assistant message with one call per (declaration, canonical args)."""
        tool_calls = []
        for decl, args in decl_args:
            self.call_counter += 1
            tool_calls.append({"id": "call_%d" % self.call_counter, "type": "function",
                               "function": {"name": decl.name, "arguments": decl.arguments(args)}})
        m = {"role": "assistant", "content": None, "tool_calls": tool_calls, "_target": target}
        if reasoning and (self.reasons() if target else self.rng.random() < 0.2):
            m["reasoning_content"] = self.reasoning(reasoning)
        self.messages.append(m)
        return tool_calls

    def tool_result(self, call, content):
        m = {"role": "tool", "tool_call_id": call["id"], "content": content}
        if self.rng.random() < 0.2:
            m["name"] = call["function"]["name"]
        self.messages.append(m)


# ---- conversation builders -----------------------------------------------------------------

def qa_turn(conv, target=True):
    gen = weighted(conv.rng, qa.GENERATORS)
    q, r, a, _ = gen(conv.rng)
    conv.user(q)
    conv.answer(a, r, target)


def build_chat(conv):
    turns = weighted(conv.rng, [(1, 6), (2, 3), (3, 1)])
    for i in range(turns):
        qa_turn(conv, target=(i == turns - 1) or conv.rng.random() < 0.5)


def describe_call(decl, args):
    shown = ", ".join("%s %s" % (k, v if not isinstance(v, str) else v)
                      for k, v in decl.arguments(args).items())
    return "%s with %s" % (decl.name, shown) if shown else decl.name


REASON_CALL = ["The user wants {what}. I should call {call}.", "I need {tool} for this. I'll call {call}.",
               "This needs the {tool} tool. Calling {call}."]
REASON_ANSWER = ["The tool returned {result}. I'll tell the user.", "I have the result: {result}. Now I can answer.",
                 "The result is {result}. I'll summarize it."]
WHAT = {"weather": "the weather in {city}", "calculator": "the result of {expression}",
        "units": "to convert {value} {from_unit} to {to_unit}", "calendar_add": "to add {title} to the calendar",
        "calendar_list": "the events on {date}", "time": "the time in {city}", "timer": "a {minutes} minute timer"}


def declare_tools(conv, needed):
    """Declare the needed families plus distractors, in random order."""
    rng = conv.rng
    families = list(needed)
    for fam in rng.sample(sorted(tc.FAMILIES), rng.randint(0, 3)):
        if fam not in families:
            families.append(fam)
    rng.shuffle(families)
    decls = {}
    for fam in families:
        decls[fam] = tc.FAMILIES[fam][0](rng)
    conv.tools = [d.tool for d in decls.values()]
    return decls


def call_reasoning(conv, decl, args):
    what = WHAT[decl.family].format(**{k: tc.fmt_number(v) if not isinstance(v, str) else v for k, v in args.items()})
    return pick(conv.rng, REASON_CALL).format(what=what, call=describe_call(decl, args),
                                              tool=decl.family.split("_")[0])


def tool_exchange(conv, decl, text, args, target=True, answer_target=True):
    """User asks; assistant calls; tool answers; assistant answers. Returns the answer facts."""
    rng = conv.rng
    fam = tc.family_of(decl)
    _, _, execute, answer = tc.FAMILIES[fam]
    if text is not None:
        conv.user(text)
    call = conv.calls([(decl, args)], call_reasoning(conv, decl, args), target)[0]
    result, facts = execute(rng, args)
    conv.tool_result(call, result)
    conv.answer(answer(rng, facts), pick(rng, REASON_ANSWER).format(result=result), answer_target)
    return facts


def request(conv, decl, **kw):
    fam = tc.family_of(decl)
    return tc.FAMILIES[fam][1](conv.rng, decl, novel=NOVEL, **kw)


FOLLOW_UPS_SAME = {"weather": ["And in {city}?", "What about {city}?", "How about {city}?",
                               "And {city}?", "Now check {city} too.", "Same for {city}, please."],
                   "time": ["And in {city}?", "What about {city}?"]}
THANKS = ["Thanks!", "Thank you.", "Great, thanks!", "Perfect, thank you.", "Cool, thanks."]
THANKS_REPLY = ["You're welcome!", "Happy to help!", "You're welcome! Anything else?", "Glad I could help."]


def build_tool_single(conv):
    fam = weighted(conv.rng, list(tc.FAMILY_WEIGHTS.items()))
    decl = declare_tools(conv, [fam])[fam]
    text, args = request(conv, decl)
    tool_exchange(conv, decl, text, args)


def build_tool_multi(conv):
    """The four-turn gate shape: call, result, answer, follow-up (call or thanks or chat)."""
    rng = conv.rng
    fam = weighted(rng, list(tc.FAMILY_WEIGHTS.items()))
    second = fam if (fam in FOLLOW_UPS_SAME and rng.random() < 0.6) else weighted(rng, list(tc.FAMILY_WEIGHTS.items()))
    decls = declare_tools(conv, [fam, second])
    decl = decls[fam]
    text, args = request(conv, decl)
    tool_exchange(conv, decl, text, args, target=rng.random() < 0.5, answer_target=rng.random() < 0.6)
    kind = rng.random()
    if second == fam and fam in FOLLOW_UPS_SAME and "days" not in decl.keys and kind < 0.6:
        city = args["city"]
        while city == args["city"]:
            city = tc.city_for(rng, NOVEL)
        new_args = dict(args, city=city)
        tool_exchange(conv, decl, pick(rng, FOLLOW_UPS_SAME[fam]).format(city=city), new_args)
    elif kind < 0.8:
        d2 = decls[second]
        t2, a2 = request(conv, d2)
        tool_exchange(conv, d2, t2, a2)
    elif kind < 0.9:
        conv.user(pick(rng, THANKS))
        conv.answer(pick(rng, THANKS_REPLY), "The user is thanking me. I'll reply politely.")
    else:
        qa_turn(conv)
    if rng.random() < 0.15:
        conv.user(pick(rng, THANKS))
        conv.answer(pick(rng, THANKS_REPLY), "The user is thanking me. I'll reply politely.")


def build_tool_parallel(conv):
    rng = conv.rng
    fam = pick(rng, ["weather", "time"])
    decl = declare_tools(conv, [fam])[fam]
    c1 = c2 = tc.city_for(rng, NOVEL)
    while c2 == c1:
        c2 = tc.city_for(rng, NOVEL)
    if fam == "weather" and "days" in decl.keys:
        decl = tc.Declared("weather", "get_weather", "Get the current weather for a city.",
                           {"city": ("city", {"type": "string"})}, ["city"])
        conv.tools = [decl.tool]
    conv.user(pick(rng, ["What's the {w} in {a} and {b}?", "Compare the {w} in {a} and {b}.",
                         "{W} in {a} and in {b}?"]).format(
        w="weather" if fam == "weather" else "time", W="Weather" if fam == "weather" else "Time", a=c1, b=c2))
    pairs = [(decl, {"city": c1}), (decl, {"city": c2})]
    calls = conv.calls(pairs, "The user asks about two cities. I'll call %s twice, for %s and %s." % (decl.name, c1, c2))
    _, _, execute, answer = tc.FAMILIES[fam]
    answers = []
    for call, (_, args) in zip(calls, pairs):
        result, facts = execute(rng, args)
        conv.tool_result(call, result)
        answers.append(answer(rng, facts))
    conv.answer(" ".join(answers), "I have both results. I'll report each city.")


def build_tool_clarify(conv):
    rng = conv.rng
    decl = declare_tools(conv, ["weather"])["weather"]
    if "days" in decl.keys:
        return build_tool_single(conv)
    conv.user(pick(rng, ["What's the weather like?", "Check the weather for me.", "Is it going to rain?",
                         "How's the weather?"]))
    conv.answer(pick(rng, ["Sure! Which city should I check?", "Which city do you want the weather for?"]),
                "The user wants the weather but did not say where. I should ask for the city.")
    city = tc.city_for(rng, NOVEL)
    tool_exchange(conv, decl, pick(rng, ["{c}", "In {c}.", "{c}, please.", "I'm in {c}."]).format(c=city),
                  {"city": city})


def build_tool_unneeded(conv):
    """Tools declared, but the question needs none: answer directly."""
    rng = conv.rng
    declare_tools(conv, [weighted(rng, list(tc.FAMILY_WEIGHTS.items()))])
    gen = weighted(rng, qa.GENERATORS)
    q, r, a, _ = gen(rng)
    conv.user(q)
    conv.answer(a, r + pick(rng, ["", " No tool is needed."]))


BUILDERS = [(build_chat, 46), (build_tool_single, 20), (build_tool_multi, 20), (build_tool_parallel, 3),
            (build_tool_clarify, 3), (build_tool_unneeded, 8)]


# ---- rendering with loss spans -------------------------------------------------------------

def segment_count(message):
    role = message.get("role")
    if role in ("system", "user", "tool"):
        return 1
    if role == "assistant":
        n = 1 if message.get("reasoning_content") else 0
        return n + (len(message["tool_calls"]) if message.get("tool_calls") else 1)
    return 0


def render_with_spans(conv, check=False):
    messages = [{k: v for k, v in m.items() if not k.startswith("_")} for m in conv.messages]
    text = muse_chat.render(messages, tools=conv.tools, **conv.kwargs)
    starts = [i for i in range(len(text)) if text.startswith(START, i)]
    ends = starts[1:] + [len(text)]
    seg = 0 if any(m["role"] == "system" for m in messages) else 1
    spans = []
    for i, (m, clean) in enumerate(zip(conv.messages, messages)):
        n = segment_count(clean)
        if m.get("_target"):
            prev_assistant = i > 0 and messages[i - 1]["role"] == "assistant"
            begin = starts[seg] + (0 if prev_assistant else len(GEN_PROMPT))
            assert text.startswith(GEN_PROMPT, starts[seg])
            spans.append([begin, ends[seg + n - 1]])
            if check and not prev_assistant:
                prompt = muse_chat.render(messages[:i], tools=conv.tools, add_generation_prompt=True, **conv.kwargs)
                assert prompt == text[:begin], "prompt prefix mismatch"
        seg += n
    assert seg == len(starts), "segment count mismatch"
    return text, spans


def make_conversation(seed, index, check=False):
    rng = random.Random("%s-%d" % (seed, index))
    conv = Conversation(rng)
    weighted(rng, BUILDERS)(conv)
    return render_with_spans(conv, check)


def _worker(job):
    seed, lo, hi, path, check = job
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lo, hi):
            text, spans = make_conversation(seed, i, check)
            f.write(json.dumps({"text": text, "spans": spans}, ensure_ascii=False) + "\n")
    return path


def _worker_tokenized(job):
    """Generate conversations [lo, hi) and tokenize them at once (no JSONL in between)."""
    seed, lo, hi, tok_path = job
    from tokenized_data import load_tokenizer, tokenize_rows
    rows = []
    for i in range(lo, hi):
        text, spans = make_conversation(seed, i)
        rows.append({"text": text, "spans": spans})
    return tokenize_rows(load_tokenizer(tok_path), rows)


def make_npz(count, seed, tok_path, out_npz, workers):
    """Generate and tokenize `count` conversations straight into tokenized_data's .npz."""
    from tokenized_data import save_npz
    chunks = max(1, min(count, workers * 8))  # several chunks a worker: even finish times
    bounds = [count * k // chunks for k in range(chunks + 1)]
    jobs = [(seed, bounds[k], bounds[k + 1], tok_path) for k in range(chunks)]
    if workers == 1:
        parts = [_worker_tokenized(j) for j in jobs]
    else:
        with multiprocessing.Pool(workers) as pool:
            parts = pool.map(_worker_tokenized, jobs, chunksize=1)
    return save_npz(parts, out_npz)


def main():
    ap = argparse.ArgumentParser(description="Generate muse-tiny training conversations (JSONL).")
    ap.add_argument("--count", type=int, required=True, help="number of conversations")
    ap.add_argument("--seed", default="muse-tiny-train")
    ap.add_argument("--out", required=True, help="output JSONL path (.npz with --tokenizer)")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer.json ('bytes' for the test stand-in): write tokenized_data's .npz instead")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--check", action="store_true",
                    help="also verify that each target turn's prompt equals the generation-prompt render")
    args = ap.parse_args()
    workers = max(1, min(args.workers, args.count))
    if args.tokenizer:
        print(json.dumps(make_npz(args.count, args.seed, args.tokenizer, args.out, workers)))
        return
    bounds = [args.count * k // workers for k in range(workers + 1)]
    jobs = [(args.seed, bounds[k], bounds[k + 1], "%s.part%03d" % (args.out, k), args.check)
            for k in range(workers)]
    if workers == 1:
        parts = [_worker(jobs[0])]
    else:
        with multiprocessing.Pool(workers) as pool:
            parts = pool.map(_worker, jobs)
    chars = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for p in parts:
            with open(p, encoding="utf-8") as f:
                data = f.read()
            chars += len(data)
            out.write(data)
            os.remove(p)
    print("wrote %d conversations (%.1f MB) to %s" % (args.count, chars / 1e6, args.out))


if __name__ == "__main__":
    main()
