"""Question/answer generators over kb.py for muse-tiny's plain-English data.

Every generator returns (question, reasoning, answer). Phrasing lists are split: TRAIN forms
feed gen_data.py; HELD_OUT forms are used only by gate_prompts.py, so the chat gate measures
generalisation to unseen wording. `held_out=True` selects the held-out forms; `keywords`
lists words an on-topic answer must contain (any one of them).
"""

import kb


def pick(rng, options):
    return options[rng.randrange(len(options))]


def cap(s):
    return s[:1].upper() + s[1:]


def article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


def _forms(rng, train, held, held_out):
    return pick(rng, held if held_out else train)


def q_capital(rng, held_out=False):
    c = pick(rng, sorted(kb.COUNTRIES))
    capital = kb.COUNTRIES[c][0]
    q = _forms(rng, [
        "What is the capital of {c}?", "What's the capital of {c}?", "capital of {c}?",
        "Which city is the capital of {c}?", "Tell me the capital of {c}.",
        "Do you know the capital of {c}?", "What city is {c}'s capital?",
        "Name the capital city of {c}.", "what is the capital city of {c}",
        "I forgot the capital of {c}. What is it?",
    ], ["Can you tell me what the capital of {c} is?", "Which city serves as the capital of {c}?",
        "{C}: what is its capital?"], held_out).format(c=c, C=cap(c))
    r = "The user asks for the capital of {c}. The capital of {c} is {k}.".format(c=c, k=capital)
    a = pick(rng, ["The capital of {c} is {k}.", "{k} is the capital of {c}.",
                   "{k}. It is the capital of {c}."]).format(c=c, k=capital)
    return cap(q), r, cap(a), [capital]


def q_capital_reverse(rng, held_out=False):
    c = pick(rng, sorted(kb.COUNTRIES))
    capital = kb.COUNTRIES[c][0]
    q = _forms(rng, ["{k} is the capital of which country?", "Which country has {k} as its capital?",
                     "What country is {k} the capital of?", "{k} is the capital of what country?"],
               ["Of which country is {k} the capital?"], held_out).format(k=capital)
    r = "{k} is the capital of {c}.".format(k=capital, c=c)
    a = "{k} is the capital of {c}.".format(k=capital, c=c)
    return q, r, a, [c.replace("the ", "")]


def q_country_fact(rng, held_out=False):
    c = pick(rng, sorted(kb.COUNTRIES))
    capital, cont, lang, cur = kb.COUNTRIES[c]
    kind = rng.randrange(4)
    if kind == 0:
        q = _forms(rng, ["Which continent is {c} in?", "On what continent is {c}?",
                         "Where is {c} located?", "What continent is {c} part of?"],
                   ["In which part of the world is {c}?"], held_out)
        r = "{C} is in {cont}."
        a = pick(rng, ["{C} is in {cont}.", "{C} is located in {cont}."])
        keys = [cont.split(" and ")[0]]
    elif kind == 1:
        q = _forms(rng, ["What language is spoken in {c}?", "What language do people speak in {c}?",
                         "Which language do they speak in {c}?", "What is the official language of {c}?"],
                   ["What do people in {c} speak?"], held_out)
        r = "People in {c} speak {lang}."
        a = pick(rng, ["People in {c} speak {lang}.", "The main language of {c} is {lang}."])
        keys = [lang.split(" and ")[0]]
    elif kind == 2:
        q = _forms(rng, ["What currency does {c} use?", "What is the currency of {c}?",
                         "Which money is used in {c}?", "What do they pay with in {c}?"],
                   ["What kind of money do people use in {c}?"], held_out)
        r = "{C} uses {cur}."
        a = pick(rng, ["{C} uses {cur}.", "The currency of {c} is {cur}."])
        keys = [cur.split()[-1]]
    else:
        q = _forms(rng, ["Tell me about {c}.", "What can you tell me about {c}?",
                         "Give me a few facts about {c}.", "Describe {c} briefly."],
                   ["I'd like to learn a little about {c}."], held_out)
        r = "{C} is in {cont}; its capital is {capital}, people speak {lang}, and it uses {cur}."
        a = "{C} is a country in {cont}. Its capital is {capital}, people speak {lang}, and the currency is {cur}."
        keys = [capital]
    f = dict(c=c, C=cap(c), capital=capital, cont=cont, lang=lang, cur=cur)
    return cap(q.format(**f)), r.format(**f), a.format(**f), keys


def q_animal(rng, held_out=False):
    name = pick(rng, sorted(kb.ANIMALS))
    klass, legs, sound, habitat, diet = kb.ANIMALS[name]
    art = article(name)
    f = dict(a=name, art=art, Art=cap(art), klass=klass, legs=legs, sound=sound,
             habitat=habitat, diet=diet, ak=article(klass))
    kind = rng.randrange(6 if sound else 5)
    if kind == 0:
        q = _forms(rng, ["How many legs does {art} {a} have?", "How many legs has {art} {a} got?",
                         "Number of legs on {art} {a}?", "Count the legs of {art} {a}."],
                   ["How many legs do you find on {art} {a}?"], held_out)
        r = "{Art} {a} has {legs} legs." if legs else "{Art} {a} has no legs."
        a = r
        keys = [str(legs)] if legs else ["no legs", "0"]
    elif kind == 1:
        q = _forms(rng, ["What kind of animal is {art} {a}?", "Is {art} {a} a mammal, bird, fish or reptile?",
                         "What type of animal is {art} {a}?", "What class of animal is {art} {a}?"],
                   ["Which group of animals does {art} {a} belong to?"], held_out)
        r = "{Art} {a} is {ak} {klass}."
        a = pick(rng, ["{Art} {a} is {ak} {klass}.", "It is {ak} {klass}."])
        keys = [klass]
    elif kind == 2:
        q = _forms(rng, ["Where does {art} {a} live?", "What is the habitat of {art} {a}?",
                         "Where can you find {art} {a}?", "Where do you usually see {art} {a}?"],
                   ["In what kind of place does {art} {a} live?"], held_out)
        r = "{Art} {a} lives in {habitat}."
        a = pick(rng, ["{Art} {a} lives in {habitat}.", "You can find {art} {a} in {habitat}."])
        keys = [habitat.split()[-1]]
    elif kind == 3:
        q = _forms(rng, ["What does {art} {a} eat?", "What do {a}s eat?", "What is the diet of {art} {a}?",
                         "What food does {art} {a} eat?"], ["What does {art} {a} like to eat?"], held_out)
        r = "{Art} {a} eats {diet}."
        a = r
        keys = [diet.split()[0]]
    elif kind == 4:
        q = _forms(rng, ["Describe {art} {a}.", "Tell me about the {a}.", "What is {art} {a}?",
                         "Give me some facts about {a}s."], ["Can you describe {art} {a} for me?"], held_out)
        r = "{Art} {a} is {ak} {klass}. It lives in {habitat} and eats {diet}."
        a = "{Art} {a} is {ak} {klass} that lives in {habitat}. It eats {diet}."
        keys = [klass]
    else:
        q = _forms(rng, ["What sound does {art} {a} make?", "What noise does {art} {a} make?",
                         "What does {art} {a} say?", "How does {art} {a} sound?"],
                   ["Which sound do you hear from {art} {a}?"], held_out)
        r = "{Art} {a} {sound}."
        a = pick(rng, ["{Art} {a} {sound}.", "It {sound}."])
        keys = [sound.split()[0]]
    return cap(q.format(**f)), r.format(**f), a.format(**f), keys


def q_color(rng, held_out=False):
    thing = pick(rng, sorted(kb.COLORS))
    color = kb.COLORS[thing]
    q = _forms(rng, ["What color is {t}?", "What colour is {t}?", "Which color is {t}?",
                     "what color is {t}", "Tell me the color of {t}."],
               ["Do you know what color {t} is?"], held_out).format(t=thing)
    r = "{T} is {c}.".format(T=cap(thing), c=color)
    a = pick(rng, ["{T} is {c}.", "It is {c}."]).format(T=cap(thing), c=color)
    return cap(q), r, a, [color.split()[0]]


def q_opposite(rng, held_out=False):
    w, o = pick(rng, kb.OPPOSITES)
    if rng.random() < 0.5:
        w, o = o, w
    q = _forms(rng, ["What is the opposite of {w}?", "What's the opposite of \"{w}\"?",
                     "opposite of {w}?", "Give me the opposite of the word {w}."],
               ["Which word means the opposite of {w}?"], held_out).format(w=w)
    r = "The opposite of \"{w}\" is \"{o}\".".format(w=w, o=o)
    a = pick(rng, ["The opposite of \"{w}\" is \"{o}\".", "\"{O}\" is the opposite of \"{w}\"."]).format(
        w=w, o=o, O=o)
    return cap(q), r, a, [o]


def q_calendar_fact(rng, held_out=False):
    kind = rng.randrange(3)
    if kind == 0:
        i = rng.randrange(7)
        after = rng.random() < 0.6
        other = kb.DAYS[(i + 1) % 7] if after else kb.DAYS[(i - 1) % 7]
        word = "after" if after else "before"
        q = _forms(rng, ["What day comes {w} {d}?", "Which day is {w} {d}?", "What day is {w} {d}?"],
                   ["Which day of the week comes {w} {d}?"], held_out).format(w=word, d=kb.DAYS[i])
        a = "{o} comes {w} {d}.".format(o=other, w=word, d=kb.DAYS[i])
        return q, a, a, [other]
    i = rng.randrange(12)
    if kind == 1:
        after = rng.random() < 0.6
        other = kb.MONTHS[(i + 1) % 12] if after else kb.MONTHS[(i - 1) % 12]
        word = "after" if after else "before"
        q = _forms(rng, ["What month comes {w} {m}?", "Which month is {w} {m}?", "What month is {w} {m}?"],
                   ["Which month of the year comes {w} {m}?"], held_out).format(w=word, m=kb.MONTHS[i])
        a = "{o} comes {w} {m}.".format(o=other, w=word, m=kb.MONTHS[i])
        return q, a, a, [other]
    n = kb.MONTH_DAYS[i]
    q = _forms(rng, ["How many days are in {m}?", "How many days does {m} have?", "How long is {m}?"],
               ["What is the number of days in {m}?"], held_out).format(m=kb.MONTHS[i])
    a = ("{m} has 28 days, or 29 in a leap year." if i == 1 else "{m} has {n} days.").format(m=kb.MONTHS[i], n=n)
    return q, a, a, [str(n)]


ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]


def q_planet(rng, held_out=False):
    p = pick(rng, sorted(kb.PLANETS))
    n, fact = kb.PLANETS[p]
    if rng.random() < 0.5:
        q = _forms(rng, ["Tell me about {p}.", "What do you know about {p}?", "Describe the planet {p}.",
                         "Give me a fact about {p}."], ["Could you share a fact about {p}?"], held_out).format(p=p)
    else:
        q = _forms(rng, ["Which planet is {o} from the Sun?", "What is the {o} planet from the Sun?",
                         "Name the {o} planet from the Sun."], ["Which planet comes {o} from the Sun?"],
                   held_out).format(o=ORDINALS[n - 1])
    a = "{p} is the {o} planet from the Sun. {f}".format(p=p, o=ORDINALS[n - 1], f=fact)
    return q, a, a, [p]


def q_definition(rng, held_out=False):
    w = pick(rng, sorted(kb.DEFINITIONS))
    d = kb.DEFINITIONS[w]
    art = article(w)
    q = _forms(rng, ["What is {art} {w}?", "What's {art} {w}?", "Define {w}.", "What does \"{w}\" mean?",
                     "Explain what {art} {w} is.", "what is {art} {w}"],
               ["Could you explain the word \"{w}\"?", "I don't know what {art} {w} is. Can you explain?"],
               held_out).format(art=art, w=w)
    a = "{Art} {w} is {d}.".format(Art=cap(art), w=w, d=d)
    return cap(q), a, a, [d.split()[1] if len(d.split()) > 1 else d]


def q_science(rng, held_out=False):
    forms, answer = pick(rng, kb.SCIENCE)
    q = forms[0] if held_out else pick(rng, forms[1:])
    words = [w.strip(".,:()") for w in answer.split()]
    keys = [w for w in words if w[:1].isdigit() or (w[:1].isupper() and w not in ("The", "A", "An", "We", "There", "Plants", "Water"))]
    return q, answer, answer, keys[:2] or words[1:3]


def q_arithmetic(rng, held_out=False):
    if rng.random() < 0.6:
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        op, word, val = "+", pick(rng, ["plus", "+", "and"]), a + b
    else:
        a, b = rng.randint(1, 10), rng.randint(1, 10)
        op, word, val = "*", pick(rng, ["times", "multiplied by", "x"]), a * b
    q = _forms(rng, ["What is {a} {w} {b}?", "What's {a} {w} {b}?", "{a} {w} {b}?", "How much is {a} {w} {b}?"],
               ["Can you add this up: {a} {w} {b}?" if op == "+" else "Quick question: {a} {w} {b}?"],
               held_out).format(a=a, w=word, b=b)
    name = "plus" if op == "+" else "times"
    r = "{a} {n} {b} is {v}.".format(a=a, n=name, b=b, v=val)
    ans = pick(rng, ["{a} {n} {b} is {v}.", "The answer is {v}.", "It's {v}."]).format(a=a, n=name, b=b, v=val)
    return q, r, ans, [str(val)]


SMALLTALK = [
    (["Hi", "Hello", "Hello!", "Hi there!", "Hey", "Hey there", "Good morning!", "Good evening", "hi!",
      "Greetings."], ["Howdy!", "Hiya, anybody there?"],
     ["Hello! How can I help you today?", "Hi there! What can I do for you?",
      "Hello! What would you like to know?"], ["hello", "hi", "help"]),
    (["How are you?", "How are you doing?", "How's it going?", "How are you today?"],
     ["How have you been?"],
     ["I'm doing well, thank you! How can I help you today?", "I'm great, thanks for asking! What can I do for you?"],
     ["well", "great", "good"]),
    (["Who are you?", "What is your name?", "What's your name?", "Introduce yourself.", "What are you?"],
     ["Tell me who you are."],
     ["I'm muse-tiny, a small demo model that speaks the Muse chat format. I can answer simple questions and call tools.",
      "My name is muse-tiny. I'm a small language model that can chat, answer simple questions and use tools."],
     ["muse-tiny", "model"]),
    (["What can you do?", "How can you help me?", "What are you able to do?", "What are your skills?"],
     ["What kinds of things can you help with?"],
     ["I can answer simple questions about countries, animals, colors, planets and words, do small sums, and call tools like a calculator, a unit converter, a weather lookup or a calendar when they are available."],
     ["questions", "tools", "answer"]),
    (["Thanks!", "Thank you.", "Thanks a lot!", "thank you so much", "Great, thanks."],
     ["Cheers, that helps."],
     ["You're welcome!", "You're welcome! Let me know if you need anything else.", "Happy to help!"],
     ["welcome", "happy", "glad"]),
    (["Goodbye!", "Bye.", "See you later!", "Good night!"], ["Talk to you later!"],
     ["Goodbye! Have a great day.", "See you! Take care."], ["bye", "goodbye", "see you", "take care"]),
    (["Tell me a joke.", "Do you know a joke?", "Make me laugh.", "Say something funny."],
     ["Got any jokes?"],
     ["Why did the scarecrow win an award? Because he was outstanding in his field!",
      "Why don't skeletons fight each other? They don't have the guts.",
      "What do you call a fish with no eyes? A fsh."], ["why", "what"]),
]


def q_smalltalk(rng, held_out=False):
    train, held, answers, keys = pick(rng, SMALLTALK)
    q = _forms(rng, train, held, held_out)
    r = pick(rng, ["The user says \"{q}\". I should reply politely.", "A friendly message. I'll answer briefly."]).format(q=q)
    return q, r, pick(rng, answers), keys


GENERATORS = [
    (q_capital, 5), (q_capital_reverse, 2), (q_country_fact, 5), (q_animal, 6), (q_color, 2),
    (q_opposite, 2), (q_calendar_fact, 2), (q_planet, 1), (q_definition, 3), (q_science, 2),
    (q_arithmetic, 3), (q_smalltalk, 3),
]
