#!/usr/bin/env python3
"""Score muse-tiny on the four quality gates of seed 000 (gate_prompts.py, 100 prompts each).

Runs the shipped checkpoint with the PyTorch reference (fp32, greedy, KV cache) the way the
server would: OpenAI-shaped messages rendered by the model's chat template, tokenized without
special tokens, generation stopped at the generation config's stop ids, output parsed into
reasoning / content / tool calls (chat-format.md section 4, schema-aware values). Prompts are
spread over CPU worker processes. With --drafter, also measures the drafter's exact greedy
acceptance on the generated answers (each generated position as an anchor, drafts compared
with the target's own greedy continuation).
"""

import argparse
import json
import multiprocessing
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gate_prompts  # noqa: E402
import muse_chat  # noqa: E402
import tiny_config as tcfg  # noqa: E402
import tools_catalog as tc  # noqa: E402

FRAME = re.compile(r"(?:<\|start\|>assistant)?(?: to=([^<\s]*))?<\|message\|>(.*?)(<\|eom\|>|<\|eot\|>|(?=<\|start\|>)|$)", re.S)
INVOKE = re.compile(r'<atem:invoke name="([^"]*)">(.*?)</atem:invoke>', re.S)
PARAM = re.compile(r'<atem:parameter name="([^"]*)">(.*?)</atem:parameter>', re.S)


def parse_response(text, tools):
    """Generated text (after `<|start|>assistant`) -> reasoning, content, tool_calls, well_formed."""
    schemas = {}
    for t in tools or []:
        fn = t.get("function", t)
        schemas[fn["name"]] = fn.get("parameters", {}).get("properties", {})
    reasoning, content, calls = [], [], []
    pos, well_formed = 0, True
    while pos < len(text):
        m = FRAME.match(text, pos)
        if not m or m.end() == pos:
            well_formed = False
            break
        recipient, body = m.group(1), m.group(2)
        if recipient == "self":
            reasoning.append(body)
        elif recipient in (None, "", "user"):
            content.append(body)
        else:
            invokes = INVOKE.findall(body)
            if not invokes:
                well_formed = False
            for name, inner in invokes:
                args = {}
                props = schemas.get(name, {})
                for key, raw in PARAM.findall(inner):
                    declared = props.get(key, {}).get("type")
                    if declared == "string":
                        args[key] = raw
                    else:
                        try:
                            args[key] = json.loads(raw)
                        except ValueError:
                            args[key] = raw
                calls.append({"name": name, "arguments": args, "recipient": recipient})
        pos = m.end()
    return {"reasoning": "".join(reasoning), "content": "".join(content) if content else None,
            "tool_calls": calls, "well_formed": well_formed}


def args_valid(tool, args):
    """Arguments form an object matching the declared schema (required keys, known keys, types)."""
    params = tool["function"]["parameters"]
    props = params.get("properties", {})
    if not isinstance(args, dict):
        return False
    if any(k not in args for k in params.get("required", [])):
        return False
    for k, v in args.items():
        if k not in props:
            return False
        t = props[k].get("type")
        if t == "string" and not isinstance(v, str):
            return False
        if t == "integer" and (not isinstance(v, int) or isinstance(v, bool)):
            return False
        if t == "number" and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            return False
        if "enum" in props[k] and v not in props[k]["enum"]:
            return False
    return True


def tool_by_name(tools, name):
    for t in tools:
        if t["function"]["name"] == name:
            return t
    return None


# ---- generation (runs in worker processes) -------------------------------------------------

_state = {}


def _init_worker(model_dir, tokenizer_path):
    import torch
    torch.set_num_threads(1)
    import muse_spark_reference as ref
    import fast_reference
    from tokenized_data import load_tokenizer
    fast_reference.enable()  # same maths, ~10x fewer CPU operations per token
    _state["model"] = ref.load_pretrained(model_dir).eval()
    _state["tok"] = load_tokenizer(tokenizer_path)
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        _state["stops"] = set(json.load(f)["eos_token_id"])


def generate(messages, tools, max_new=256):
    import torch
    model, tok = _state["model"], _state["tok"]
    prompt = muse_chat.render(messages, tools=tools, add_generation_prompt=True)
    ids, _ = tok.encode(prompt)
    out = []
    with torch.no_grad():
        cache = model.new_cache()
        logits = model(torch.tensor([ids]), cache).logits[0, -1]
        for _ in range(max_new):
            logits[tcfg.TOKENIZER_SIZE:] = float("-inf")  # rows past the tokenizer are never sampled
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            if nxt in _state["stops"]:
                break
            logits = model(torch.tensor([[nxt]]), cache).logits[0, -1]
    finish = "stop" if out and out[-1] in _state["stops"] else "length"
    return {"prompt_ids": ids, "ids": out, "text": tok.decode(out), "finish": finish}


def assistant_message(parsed):
    """The assistant message an OpenAI client sends back (reasoning dropped, arguments as objects)."""
    if parsed["tool_calls"]:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_%d" % i, "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(parsed["tool_calls"])]}
    return {"role": "assistant", "content": parsed["content"] or ""}


def check_call(parsed, tools, expect_name, expect_args):
    calls = parsed["tool_calls"]
    if len(calls) != 1 or parsed["content"]:
        return False, False
    call = calls[0]
    tool = tool_by_name(tools, call["name"])
    valid = tool is not None and call["name"] == expect_name and args_valid(tool, call["arguments"])
    exact = valid and call["arguments"] == expect_args
    return valid, exact


def run_item(job):
    gate, item = job
    t0 = time.time()
    tools = item.get("tools")
    rec = {"gate": gate, "steps": []}
    if gate == "chat":
        g = generate(item["messages"], tools)
        p = parse_response(g["text"], tools)
        content = (p["content"] or "").lower()
        rec["pass"] = bool(p["well_formed"] and g["finish"] == "stop" and not p["tool_calls"] and content
                           and any(k.lower() in content for k in item["keywords"]))
        rec["steps"].append({"out": g["text"], "prompt": item["messages"][-1]["content"]})
        rec["generations"] = [g]
    elif gate == "tool":
        g = generate(item["messages"], tools)
        p = parse_response(g["text"], tools)
        valid, exact = check_call(p, tools, item["expect_name"], item["expect_args"])
        rec.update({"pass": bool(valid and p["well_formed"] and g["finish"] == "stop"), "exact": exact})
        rec["steps"].append({"out": g["text"], "prompt": item["messages"][-1]["content"],
                             "expect": [item["expect_name"], item["expect_args"]]})
        rec["generations"] = [g]
    elif gate == "four_turn":
        rng = random.Random(item["seed"])
        msgs = list(item["messages"])
        ok, exact, gens = True, True, []

        def step(kind, expect=None):
            nonlocal ok, exact
            g = generate(msgs, tools)
            gens.append(g)
            p = parse_response(g["text"], tools)
            rec["steps"].append({"out": g["text"], "prompt": msgs[-1].get("content")})
            good = p["well_formed"] and g["finish"] == "stop"
            if kind == "call":
                valid, ex = check_call(p, tools, expect["expect_name"], expect["expect_args"])
                good, exact = good and valid, exact and ex
            else:
                good = good and bool(p["content"]) and not p["tool_calls"]
            ok = ok and good
            msgs.append(assistant_message(p))
            return p, good

        def result_for(p, expect):
            fam = expect.get("family", item["family"])
            canonical = expect["canonical_args"]
            if p["tool_calls"] and p["tool_calls"][0]["arguments"] == expect["expect_args"]:
                text, facts = tc.FAMILIES[fam][2](rng, canonical)
            else:  # wrong call: answer with something plausible; the step already failed
                text, facts = json.dumps({"error": "bad arguments"}), {}
            msgs.append({"role": "tool", "tool_call_id": "call_0", "content": text})
            return facts

        p, good = step("call", item)
        if good:
            result_for(p, item)
            p2, good = step("answer")
            if good:
                msgs.append({"role": "user", "content": item["follow_up"]["text"]})
                fu = item["follow_up"]
                p3, good = step(fu["kind"], fu)
                if good and fu["kind"] == "call":
                    result_for(p3, fu)
                    step("answer")
        rec.update({"pass": ok, "exact": ok and exact})
        rec["generations"] = gens
    else:  # repeat
        a = generate(item["messages"], tools)
        b = generate(item["messages"], tools)
        rec["pass"] = a["ids"] == b["ids"]
        rec["steps"].append({"out": a["text"], "prompt": item["messages"][-1]["content"]})
        rec["generations"] = [a]
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


# ---- drafter acceptance ----------------------------------------------------------------------

def drafter_acceptance(model_dir, drafter_dir, records, device):
    """Exact greedy acceptance: for every generated position s of each answer, draft a block from
    context < s with anchor token s and count leading drafts equal to the target's greedy tokens."""
    import torch
    import muse_spark_reference as ref
    import fast_reference
    from dspark_drafter import TapRecorder, draft_greedy, load_drafter
    fast_reference.enable()
    target = ref.load_pretrained(model_dir).to(device).eval()
    drafter = load_drafter(drafter_dir).to(device).eval()
    rec = TapRecorder(target, drafter.cfg.target_layer_ids)
    K = drafter.cfg.block_size
    hist = [0] * (K + 1)
    embed, head = target.model.language_model.embed_tokens.weight, target.lm_head.weight
    with torch.no_grad():
        for r in records:
            for g in r.get("generations", []):
                seq = g["prompt_ids"] + g["ids"]
                n_prompt = len(g["prompt_ids"])
                if len(g["ids"]) < 2:
                    continue
                ids = torch.tensor([seq], device=device)
                target.model.language_model(ids)
                ctx = drafter.context(rec.features()[0])
                anchors = torch.arange(n_prompt, len(seq) - 1, device=device)
                drafts, _ = draft_greedy(drafter, ctx, anchors, ids[0, anchors], embed, head)
                truth = torch.full((len(anchors), K), -1, device=device)
                for i in range(K):
                    pos = anchors + 1 + i
                    ok = pos < len(seq)
                    truth[ok, i] = ids[0, pos[ok]]
                match = (drafts == truth).long().cumprod(1).sum(1)
                for m in match.tolist():
                    hist[m] += 1
    total = sum(hist)
    mean = sum(i * c for i, c in enumerate(hist)) / max(total, 1)
    return {"anchors": total, "accepted_histogram": hist, "mean_accepted_drafts": round(mean, 3),
            "tokens_per_step_greedy": round(mean + 1, 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: <model>/tokenizer.json)")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--n", type=int, default=100, help="prompts per gate")
    ap.add_argument("--out", required=True, help="JSON report")
    ap.add_argument("--device", default="cpu", help="device for the drafter measurement")
    ap.add_argument("--records", default=None, help="with --drafter: measure acceptance on these saved records only")
    ap.add_argument("--deadline", type=float, default=0,
                    help="stop after this many seconds and score the prompts finished by then (0: no limit)")
    args = ap.parse_args()
    if args.records:
        with open(args.records) as f:
            records = json.load(f)
        acc = drafter_acceptance(args.model, args.drafter, records, args.device)
        print("drafter: %s" % json.dumps(acc), flush=True)
        with open(args.out, "w") as f:
            json.dump(acc, f, indent=1)
        return
    tok = args.tokenizer or os.path.join(args.model, "tokenizer.json")
    jobs = [("chat", x) for x in gate_prompts.chat_items(n=args.n)]
    jobs += [("tool", x) for x in gate_prompts.tool_items(n=args.n)]
    jobs += [("four_turn", x) for x in gate_prompts.four_turn_items(n=args.n)]
    jobs += [("repeat", x) for x in gate_prompts.repeat_items(n=args.n)]
    # Gates interleaved, the longest (four_turn) first in each round, so that a deadline leaves
    # every gate with a similar number of finished prompts.
    rank = {"four_turn": 0, "tool": 1, "repeat": 2, "chat": 3}
    seen = {}
    keyed = []
    for i, (gate, _) in enumerate(jobs):
        seen[gate] = seen.get(gate, -1) + 1
        keyed.append((seen[gate], rank[gate], i))
    order = [i for _, _, i in sorted(keyed)]
    t0 = time.time()
    results = []
    pool = multiprocessing.get_context("fork").Pool(args.workers, _init_worker, (args.model, tok))
    try:
        it = pool.imap_unordered(run_item, [jobs[i] for i in order], chunksize=1)
        while len(results) < len(order):
            timeout = None if not args.deadline else max(0.0, args.deadline - (time.time() - t0))
            try:
                results.append(it.next(timeout=timeout))
            except multiprocessing.TimeoutError:
                print("deadline: %d of %d prompts finished" % (len(results), len(order)), flush=True)
                break
    finally:
        pool.terminate()
        pool.join()
    report = {"seconds": round(time.time() - t0, 1), "gates": {}}
    for gate in ("chat", "tool", "four_turn", "repeat"):
        rs = [r for r in results if r["gate"] == gate]
        entry = {"n": len(rs), "pass": sum(r["pass"] for r in rs)}
        if gate in ("tool", "four_turn"):
            entry["exact"] = sum(bool(r.get("exact")) for r in rs)
        entry["failures"] = [r["steps"] for r in rs if not r["pass"]][:8]
        entry["examples"] = [r["steps"] for r in rs if r["pass"]][:3]
        report["gates"][gate] = entry
        print("%-9s pass %3d/%d%s" % (gate, entry["pass"], entry["n"],
                                      ("  exact %d" % entry["exact"]) if "exact" in entry else ""), flush=True)
    with open(os.path.splitext(args.out)[0] + "_records.json", "w") as f:
        json.dump([{"generations": [{"prompt_ids": g["prompt_ids"], "ids": g["ids"]} for g in r["generations"]]}
                   for r in results], f)
    if args.drafter:
        report["drafter"] = drafter_acceptance(args.model, args.drafter, results, args.device)
        print("drafter: %s" % json.dumps(report["drafter"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
