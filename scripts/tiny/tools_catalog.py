"""Tool families for muse-tiny's tool-calling data: declarations, requests, fake executors.

Each family draws a concrete declaration (function name, parameter names, descriptions) from
pools of synonyms, so the model learns to copy names and argument keys from the declared
schema instead of memorising one spelling. Each request yields the user's text and the
canonical arguments; the executor simulates the tool's result deterministically from the
arguments and the conversation's random generator; the answer turns a result into prose.

Requests carry a `held_out` phrasing list used only by gate_prompts.py, never for training.

Training requests pass `novel` > 0: that share of cities, event titles and timer labels is
generated (`novel_city`, `novel_title`) instead of drawn from the fixed lists, so the model
cannot answer from a memorised list and must copy the value from the user's message (several
tokens for an unseen name). With `novel` 0 (gate_prompts.py) no extra random numbers are
drawn, so the gate prompts do not change.
"""

import json

import kb

CITIES = sorted({c[0] for c in kb.COUNTRIES.values()} | {
    "New York", "Los Angeles", "Chicago", "Toronto", "Vancouver", "Sydney", "Melbourne",
    "Barcelona", "Munich", "Hamburg", "Milan", "Naples", "Lyon", "Marseille", "Zurich",
    "Geneva", "Edinburgh", "Manchester", "Osaka", "Kyoto", "Shanghai", "Hong Kong",
    "Singapore", "Mumbai", "Istanbul", "Dubai", "Seattle", "Boston", "Denver", "Miami",
    "San Francisco", "Austin", "Montreal", "Rio de Janeiro", "São Paulo", "Cape Town",
    "Auckland", "Krakow", "Porto", "Seville", "Valencia", "Florence", "Venice", "Bergen",
    "Gothenburg", "Tallinn", "Riga", "Vilnius", "Sofia", "Bucharest", "Belgrade", "Zagreb",
    "Ljubljana", "Bratislava", "Lagos", "Casablanca", "Tunis", "Doha", "Taipei", "Busan",
})

# Pieces of generated place names: "Varnholm", "Port Ibreda", "Lake Tolsby".
_PLACE_PREFIX = ["Port", "San", "Santa", "New", "Lake", "Saint", "Fort", "Mount", "North", "South",
                 "East", "West", "Upper", "Little", "Old", "Bay of"]
_ONSET = ["B", "Br", "C", "Ch", "D", "Dr", "F", "G", "Gr", "H", "K", "Kr", "L", "M", "N", "P", "R",
          "S", "Sh", "St", "T", "Tr", "V", "W", "Z", "", "Al", "El", "Or", "Is", "Am", "Qu"]
_VOWEL = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y", "ar", "en", "il", "or"]
_CODA = ["", "", "n", "r", "l", "s", "m", "rn", "nd", "st", "th", "x", "v", "k"]
_PLACE_SUFFIX = ["ville", "burg", "ton", "holm", "stad", "polis", "field", "bridge", "mouth", "haven",
                 "wick", "dale", "port", "grad", "by", "ford", "ia", "ora", "ano", "esk", "abad", "dorf"]


def novel_word(rng, syllables):
    return "".join(pick(rng, _ONSET) + pick(rng, _VOWEL) + pick(rng, _CODA) for _ in range(syllables)).lower()


def novel_city(rng):
    """A made-up place name (never in CITIES): one to three words of generated syllables."""
    while True:
        name = novel_word(rng, rng.randint(1, 2))
        if rng.random() < 0.6:
            name += pick(rng, _PLACE_SUFFIX)
        name = name[:1].upper() + name[1:]
        if rng.random() < 0.3:
            name = pick(rng, _PLACE_PREFIX) + " " + name
        if len(name) >= 4 and name not in CITIES:
            return name


def city_for(rng, novel=0.0):
    """A city for a request: a known one, or with probability `novel` a generated one."""
    if novel and rng.random() < novel:
        return novel_city(rng)
    return pick(rng, CITIES)


SKIES = ["clear", "sunny", "cloudy", "partly cloudy", "rainy", "light rain", "snowy",
         "windy", "foggy", "stormy", "overcast"]


def pick(rng, options):
    return options[rng.randrange(len(options))]


def fmt_number(x):
    """Numbers as people write them: 12, 3.5, 0.25 (no trailing zeros, no exponent)."""
    if isinstance(x, int) or float(x).is_integer():
        return str(int(x))
    s = ("%.4f" % x).rstrip("0").rstrip(".")
    return s


def fmt_result_number(x):
    if isinstance(x, float):
        x = round(x, 2)
        if x.is_integer():
            return str(int(x))
    return str(x)


class Declared:
    """One concrete tool declaration: the OpenAI envelope plus key mappings."""

    def __init__(self, family, name, description, params, required):
        self.family = family
        self.name = name
        self.keys = {canon: key for canon, (key, _) in params.items()}
        props = {key: schema for _, (key, schema) in params.items()}
        self.tool = {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": props,
                           "required": [self.keys[c] for c in required]}}}

    def arguments(self, canonical):
        """Canonical argument dict -> declared argument dict (declared key order)."""
        out = {}
        for canon, key in self.keys.items():
            if canon in canonical:
                out[key] = canonical[canon]
        return out


# ---- weather ---------------------------------------------------------------------------------

WEATHER_NAMES = ["get_weather", "weather.get_current", "weather.current", "lookup_weather",
                 "current_weather", "get_current_weather", "weather_now", "weather.lookup"]
FORECAST_NAMES = ["get_forecast", "weather.get_forecast", "weather.forecast", "forecast"]
CITY_KEYS = ["city", "location", "place", "city_name"]
WEATHER_DESCRIPTIONS = ["Get the current weather for a city.", "Look up the weather.",
                        "Returns current weather conditions for a location.",
                        "Current temperature and conditions in a city."]


def declare_weather(rng):
    forecast = rng.random() < 0.3
    city_key = pick(rng, CITY_KEYS)
    params = {"city": (city_key, {"type": "string", "description": pick(rng, [
        "The city name", "City, e.g. Paris", "Name of the city", "The location"])})}
    if forecast:
        params["days"] = ("days", {"type": "integer", "description": "Number of days"})
        name = pick(rng, FORECAST_NAMES)
        desc = pick(rng, ["Get a weather forecast.", "Weather forecast for the next days."])
    else:
        name = pick(rng, WEATHER_NAMES)
        desc = pick(rng, WEATHER_DESCRIPTIONS)
    if rng.random() < 0.4:
        params["unit"] = (pick(rng, ["unit", "units"]),
                          {"type": "string", "enum": ["celsius", "fahrenheit"]})
    return Declared("weather", name, desc, params, ["city"])


WEATHER_ASKS = [
    "What's the weather in {city}?", "What is the weather like in {city}?",
    "How is the weather in {city} today?", "Weather in {city}?", "weather {city}",
    "Is it raining in {city}?", "How warm is it in {city} right now?",
    "Can you check the weather in {city}?", "Tell me the weather for {city}.",
    "What's the temperature in {city}?", "Do I need a jacket in {city} today?",
    "Check the current conditions in {city}, please.", "how's the weather over in {city}",
    "I'm heading to {city}. What's the weather there?", "Look up the weather in {city}.",
    "Could you get me the weather for {city}?", "Is it cold in {city}?",
    "Give me the current weather in {city}.", "What are the conditions in {city} now?",
]
WEATHER_HELD_OUT = [
    "Please tell me what the weather is doing in {city}.", "Any idea how the weather is in {city}?",
    "I'd like to know the weather in {city}.", "What's it like outside in {city} at the moment?",
    "Find out the weather in {city} for me.",
]
FORECAST_ASKS = [
    "What's the forecast for {city} for the next {days} days?",
    "Give me a {days}-day forecast for {city}.", "Weather in {city} for {days} days?",
    "How will the weather be in {city} over the next {days} days?",
]


def weather_request(rng, decl, city=None, template=None, novel=0.0):
    city = city or city_for(rng, novel)
    args = {"city": city}
    if "days" in decl.keys:
        days = rng.randint(2, 7)
        args["days"] = days
        text = (template or pick(rng, FORECAST_ASKS)).format(city=city, days=days)
    else:
        text = (template or pick(rng, WEATHER_ASKS)).format(city=city)
    if "unit" in decl.keys and rng.random() < 0.35:
        unit = pick(rng, ["celsius", "fahrenheit"])
        args["unit"] = unit
        text = text.rstrip("?.") + pick(rng, [" in %s?", ", in %s please.", " (%s)"]) % (
            unit.capitalize() if rng.random() < 0.5 else unit)
    return text, args


def weather_execute(rng, args):
    temp_c = rng.randint(-12, 36)
    sky = pick(rng, SKIES)
    unit = args.get("unit", "celsius")
    city = args["city"]
    if "days" in args:
        days = [{"day": i + 1, "high_c": temp_c + rng.randint(-3, 3), "sky": pick(rng, SKIES)}
                for i in range(args["days"])]
        return json.dumps({"city": city, "forecast": days}, ensure_ascii=False), {
            "city": city, "days": days}
    if unit == "fahrenheit":
        temp = round(temp_c * 9 / 5 + 32)
        sym = "°F"
    else:
        temp, sym = temp_c, "°C"
    style = rng.randrange(3)
    if style == 0:
        text = json.dumps({"city": city, "temperature": temp, "unit": unit, "conditions": sky},
                          ensure_ascii=False)
    elif style == 1:
        key = "temp_f" if unit == "fahrenheit" else "temp_c"
        text = json.dumps({key: temp, "sky": sky}, ensure_ascii=False)
    else:
        text = "%d%s, %s" % (temp, sym, sky)
    return text, {"city": city, "temp": temp, "sym": sym, "sky": sky}


def weather_answer(rng, facts):
    if "days" in facts:
        parts = ["day %d: %s, high of %d °C" % (d["day"], d["sky"], d["high_c"]) for d in facts["days"]]
        return pick(rng, ["Here is the forecast for {city}: ", "Forecast for {city}: "]).format(
            city=facts["city"]) + "; ".join(parts) + "."
    return pick(rng, [
        "It's {temp} {sym} and {sky} in {city} right now.",
        "The weather in {city} is {sky} with a temperature of {temp} {sym}.",
        "Right now {city} has {sky} weather and it is {temp} {sym}.",
        "In {city} it is currently {temp} {sym} and {sky}.",
    ]).format(**facts)


# ---- calculator ------------------------------------------------------------------------------

CALC_NAMES = ["calculator", "calculate", "math.evaluate", "calc", "evaluate_expression",
              "math.calculate", "compute"]
EXPR_KEYS = ["expression", "expr", "formula", "input"]


def declare_calculator(rng):
    key = pick(rng, EXPR_KEYS)
    return Declared("calculator", pick(rng, CALC_NAMES), pick(rng, [
        "Evaluate a math expression.", "A simple calculator.",
        "Compute the value of an arithmetic expression.", "Calculator for arithmetic."]),
        {"expression": (key, {"type": "string", "description": pick(rng, [
            "The expression to evaluate, e.g. 2 * (3 + 4)", "Arithmetic expression",
            "Math expression"])})}, ["expression"])


OPS = [("+", ["plus", "+", "added to"]), ("-", ["minus", "-", "take away"]),
       ("*", ["times", "*", "multiplied by", "x"]), ("/", ["divided by", "/", "over"])]
CALC_ASKS = [
    "What is {a} {w} {b}?", "Calculate {a} {w} {b}.", "What's {a} {w} {b}?", "{a} {w} {b} = ?",
    "Can you compute {a} {w} {b}?", "How much is {a} {w} {b}?", "Please work out {a} {w} {b}.",
    "what is {a}{s}{b}", "Compute {a}{s}{b} for me.", "Use the calculator: {a} {w} {b}",
    "I need the result of {a} {w} {b}.", "Solve {a} {w} {b}.",
]
CALC_HELD_OUT = [
    "Could you tell me what {a} {w} {b} equals?", "Quick math: {a} {w} {b}?",
    "Help me figure out {a} {w} {b}.", "What do you get for {a} {w} {b}?",
]


def calc_request(rng, decl, template=None, novel=0.0):
    op, words = pick(rng, OPS)
    if op == "/":
        b = rng.randint(2, 60)
        a = b * rng.randint(2, 400) if rng.random() < 0.7 else rng.randint(10, 9999)
    else:
        a, b = rng.randint(2, 9999), rng.randint(2, 999 if op == "*" else 9999)
    w = pick(rng, words)
    s = " %s " % op if rng.random() < 0.5 else op
    text = (template or pick(rng, CALC_ASKS)).format(a=a, b=b, w=w, s=s)
    return text, {"expression": "%d %s %d" % (a, op, b)}


def calc_execute(rng, args):
    a, op, b = args["expression"].split(" ")
    a, b = int(a), int(b)
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
    value = int(value) if float(value).is_integer() else round(value, 4)
    text = fmt_number(value) if rng.random() < 0.6 else json.dumps({"result": value})
    return text, {"expression": args["expression"], "value": fmt_number(value)}


def calc_answer(rng, facts):
    return pick(rng, ["{expression} = {value}.", "The result is {value}.",
                      "The answer is {value}.", "{expression} equals {value}."]).format(**facts)


# ---- unit conversion -------------------------------------------------------------------------

UNIT_NAMES = ["convert_units", "unit_converter", "units.convert", "convert", "convert_unit"]
# (unit, spoken forms, dimension, factor to the dimension's base unit)
UNITS = [
    ("kilometer", ["kilometers", "km", "kilometres"], "length", 1000.0),
    ("mile", ["miles", "mi"], "length", 1609.344),
    ("meter", ["meters", "m", "metres"], "length", 1.0),
    ("foot", ["feet", "ft"], "length", 0.3048),
    ("inch", ["inches", "in"], "length", 0.0254),
    ("centimeter", ["centimeters", "cm"], "length", 0.01),
    ("kilogram", ["kilograms", "kg", "kilos"], "mass", 1000.0),
    ("pound", ["pounds", "lb", "lbs"], "mass", 453.59237),
    ("gram", ["grams", "g"], "mass", 1.0),
    ("ounce", ["ounces", "oz"], "mass", 28.349523125),
    ("liter", ["liters", "l", "litres"], "volume", 1.0),
    ("gallon", ["gallons", "gal"], "volume", 3.785411784),
    ("milliliter", ["milliliters", "ml"], "volume", 0.001),
    ("celsius", ["degrees Celsius", "Celsius", "°C"], "temperature", None),
    ("fahrenheit", ["degrees Fahrenheit", "Fahrenheit", "°F"], "temperature", None),
]


def declare_units(rng):
    v, f, t = pick(rng, [("value", "from_unit", "to_unit"), ("amount", "from", "to"),
                         ("quantity", "source_unit", "target_unit"), ("value", "from", "to")])
    return Declared("units", pick(rng, UNIT_NAMES), pick(rng, [
        "Convert a value between units.", "Unit conversion.",
        "Convert between units of length, mass, volume and temperature."]),
        {"value": (v, {"type": "number"}), "from_unit": (f, {"type": "string"}),
         "to_unit": (t, {"type": "string"})}, ["value", "from_unit", "to_unit"])


UNIT_ASKS = [
    "How many {to} is {v} {from_}?", "Convert {v} {from_} to {to}.", "What is {v} {from_} in {to}?",
    "{v} {from_} in {to}?", "Please convert {v} {from_} into {to}.",
    "How much is {v} {from_} in {to}?", "convert {v} {from_} to {to}",
    "I have {v} {from_}. How many {to} is that?", "What's {v} {from_} expressed in {to}?",
]
UNIT_HELD_OUT = [
    "Can you turn {v} {from_} into {to} for me?", "Tell me {v} {from_} in {to}.",
    "I need {v} {from_} converted to {to}.",
]


def units_request(rng, decl, template=None, novel=0.0):
    frm = pick(rng, UNITS)
    to = pick(rng, [u for u in UNITS if u[2] == frm[2] and u[0] != frm[0]])
    v = rng.randint(1, 500) if rng.random() < 0.8 else round(rng.uniform(0.5, 99), 1)
    text = (template or pick(rng, UNIT_ASKS)).format(
        v=fmt_number(v), from_=pick(rng, frm[1]), to=pick(rng, to[1]))
    return text, {"value": v, "from_unit": frm[0], "to_unit": to[0]}


def units_execute(rng, args):
    table = {u[0]: u for u in UNITS}
    frm, to, v = table[args["from_unit"]], table[args["to_unit"]], args["value"]
    if frm[2] == "temperature":
        out = v * 9 / 5 + 32 if frm[0] == "celsius" else (v - 32) * 5 / 9
    else:
        out = v * frm[3] / to[3]
    out = round(out, 2)
    plural_to = to[1][0] if to[2] != "temperature" else to[1][0]
    facts = {"v": fmt_number(v), "from": frm[1][0] if v != 1 else frm[0],
             "out": fmt_result_number(out), "to": plural_to}
    if rng.random() < 0.5:
        return json.dumps({"value": out, "unit": to[0]}), facts
    return "%s %s" % (fmt_result_number(out), to[0]), facts


def units_answer(rng, facts):
    return pick(rng, ["{v} {from} is about {out} {to}.", "That's approximately {out} {to}.",
                      "{v} {from} equals {out} {to}.", "It comes to about {out} {to}."]).format(**facts)


# ---- calendar --------------------------------------------------------------------------------

CAL_ADD_NAMES = ["calendar.add_event", "create_event", "add_calendar_event",
                 "calendar.create_event", "schedule_event", "add_event"]
CAL_LIST_NAMES = ["calendar.list_events", "list_events", "get_events", "calendar.get_events"]
EVENT_TITLES = ["Dentist appointment", "Team meeting", "Lunch with Sam", "Yoga class",
                "Project review", "Doctor's visit", "Call with Mom", "Book club", "Haircut",
                "Flight to Berlin", "Piano lesson", "Birthday party", "Budget meeting",
                "Coffee with Alex", "Soccer practice", "Parent-teacher conference", "Gym",
                "Standup", "Job interview", "Car service", "Dinner with Maria", "Study group"]


def declare_calendar(rng):
    if rng.random() < 0.75:
        t, d, h = pick(rng, [("title", "date", "time"), ("name", "date", "start_time"),
                             ("summary", "day", "time"), ("title", "day", "start_time")])
        return Declared("calendar_add", pick(rng, CAL_ADD_NAMES), pick(rng, [
            "Add an event to the user's calendar.", "Create a calendar event.",
            "Schedule a new event."]),
            {"title": (t, {"type": "string"}),
             "date": (d, {"type": "string", "description": "Date as YYYY-MM-DD"}),
             "time": (h, {"type": "string", "description": "Start time as HH:MM (24h)"})},
            ["title", "date"])
    d = pick(rng, ["date", "day"])
    return Declared("calendar_list", pick(rng, CAL_LIST_NAMES), pick(rng, [
        "List the events on a day.", "Get the user's calendar events for a date."]),
        {"date": (d, {"type": "string", "description": "Date as YYYY-MM-DD"})}, ["date"])


def random_date(rng):
    m = rng.randrange(12)
    d = rng.randint(1, kb.MONTH_DAYS[m])
    y = pick(rng, [2026, 2026, 2026, 2027])
    iso = "%04d-%02d-%02d" % (y, m + 1, d)
    spoken = pick(rng, [iso, "%s %d, %d" % (kb.MONTHS[m], d, y), "%d %s %d" % (d, kb.MONTHS[m], y)])
    return iso, spoken


def random_time(rng):
    h = rng.randint(7, 20)
    mins = pick(rng, [0, 0, 0, 15, 30, 45])
    hhmm = "%02d:%02d" % (h, mins)
    h12 = h - 12 if h > 12 else h
    ampm = "pm" if h >= 12 else "am"
    spoken = pick(rng, [hhmm, ("%d %s" % (h12, ampm)) if mins == 0 else "%d:%02d %s" % (h12, mins, ampm)])
    return hhmm, spoken


CAL_ADD_ASKS = [
    "Add {title} to my calendar on {date} at {time}.", "Schedule {title} for {date} at {time}.",
    "Put {title} on {date} at {time} in my calendar.", "Create an event called {title} on {date} at {time}.",
    "Can you book {title} on {date} at {time}?", "Please add an event: {title}, {date}, {time}.",
    "Remind me about {title} on {date} at {time}.", "I have {title} on {date} at {time}, add it.",
    "Make a calendar entry for {title} on {date} at {time}.",
]
CAL_ADD_HELD_OUT = ["Could you put {title} in my calendar for {date} at {time}?",
                    "Set up {title} on {date} at {time}, please.",
                    "New event: {title} on {date}, starting {time}."]
CAL_LIST_ASKS = [
    "What's on my calendar on {date}?", "Do I have any events on {date}?",
    "List my events for {date}.", "What do I have scheduled on {date}?",
    "Show me my calendar for {date}.", "Am I busy on {date}?",
]
CAL_LIST_HELD_OUT = ["Check my schedule for {date}.", "What's planned for {date} in my calendar?"]


FIRST_NAMES = ["Sam", "Alex", "Maria", "Priya", "Tom", "Lena", "Omar", "Yuki", "Chen", "Ana", "Ben",
               "Chloe", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kate", "Liam",
               "Mei", "Nina", "Oscar", "Paula", "Raj", "Sofia", "Theo", "Uma", "Victor", "Wen",
               "Zoe", "Aisha", "Bruno", "Carmen", "Diego", "Emma", "Felix", "Hana", "Ivan", "Jonas",
               "Kofi", "Lucia", "Marco", "Noor", "Olga", "Pedro", "Rosa", "Sven", "Tariq"]
_ACTIVITIES = ["Lunch", "Dinner", "Coffee", "Call", "Meeting", "Drinks", "Walk", "Tennis", "Brunch",
               "Chess", "Study session", "Run", "Video call", "Breakfast", "Movie night"]
_TOPICS = ["Budget", "Design", "Quarterly", "Sprint", "Marketing", "Sales", "Product", "Hiring",
           "Roadmap", "Security", "Launch", "Client", "Board", "Garden", "Wedding", "Vacation"]
_KINDS = ["review", "meeting", "planning", "sync", "demo", "workshop", "check-in", "call", "party",
          "prep", "retro", "interview"]
EXTRA_TIMER_LABELS = ["rice", "cookies", "steak", "coffee", "meditation", "homework", "parking", "oven",
                      "soup", "cake", "break", "stretching", "reading", "dough", "potatoes", "muffins"]


def novel_title(rng):
    """A calendar event title built from parts, so titles must be copied, not recalled."""
    if rng.random() < 0.5:
        return "%s with %s" % (pick(rng, _ACTIVITIES), pick(rng, FIRST_NAMES))
    return "%s %s" % (pick(rng, _TOPICS), pick(rng, _KINDS))


def calendar_request(rng, decl, template=None, novel=0.0):
    iso, spoken = random_date(rng)
    if decl.family == "calendar_list":
        return (template or pick(rng, CAL_LIST_ASKS)).format(date=spoken), {"date": iso}
    title = novel_title(rng) if novel and rng.random() < novel else pick(rng, EVENT_TITLES)
    hhmm, tspoken = random_time(rng)
    text = (template or pick(rng, CAL_ADD_ASKS)).format(title=title, date=spoken, time=tspoken)
    return text, {"title": title, "date": iso, "time": hhmm}


def calendar_execute(rng, args):
    if "title" in args:
        eid = "evt_%d" % rng.randint(1000, 9999)
        return json.dumps({"status": "created", "id": eid}), dict(args, id=eid)
    events = [{"time": random_time(rng)[0], "title": pick(rng, EVENT_TITLES)}
              for _ in range(rng.randint(0, 3))]
    events.sort(key=lambda e: e["time"])
    return json.dumps({"date": args["date"], "events": events}), {"date": args["date"], "events": events}


def calendar_answer(rng, facts):
    if "title" in facts:
        when = facts["date"] + (" at " + facts["time"] if facts.get("time") else "")
        return pick(rng, ["Done! I added \"{title}\" to your calendar on {when}.",
                          "I've scheduled {title} for {when}.",
                          "{title} is now on your calendar for {when}."]).format(
            title=facts["title"], when=when)
    if not facts["events"]:
        return pick(rng, ["You have nothing scheduled on {date}.",
                          "Your calendar is free on {date}."]).format(date=facts["date"])
    items = ", ".join("%s at %s" % (e["title"], e["time"]) for e in facts["events"])
    return pick(rng, ["On {date} you have: {items}.", "Here is your schedule for {date}: {items}."]).format(
        date=facts["date"], items=items)


# ---- small generic tools (teach copying of unseen names) -------------------------------------

def declare_time(rng):
    key = pick(rng, ["city", "location", "timezone_city"])
    return Declared("time", pick(rng, ["get_time", "clock.now", "current_time", "time.lookup"]),
                    "Get the current local time in a city.",
                    {"city": (key, {"type": "string"})}, ["city"])


TIME_ASKS = ["What time is it in {city}?", "Current time in {city}?",
             "Tell me the local time in {city}.", "what's the time in {city} now"]
TIME_HELD_OUT = ["Do you know what time it is in {city}?"]


def time_request(rng, decl, template=None, novel=0.0):
    city = city_for(rng, novel)
    return (template or pick(rng, TIME_ASKS)).format(city=city), {"city": city}


def time_execute(rng, args):
    t = "%02d:%02d" % (rng.randint(0, 23), rng.randint(0, 59))
    return json.dumps({"city": args["city"], "time": t}, ensure_ascii=False), {"city": args["city"], "time": t}


def time_answer(rng, facts):
    return pick(rng, ["It is {time} in {city} right now.", "The local time in {city} is {time}."]).format(**facts)


def declare_timer(rng):
    key = pick(rng, ["minutes", "duration_minutes", "length"])
    return Declared("timer", pick(rng, ["set_timer", "timer.start", "start_timer"]),
                    "Start a countdown timer.",
                    {"minutes": (key, {"type": "integer"}),
                     "label": ("label", {"type": "string"})}, ["minutes"])


TIMER_ASKS = ["Set a timer for {m} minutes.", "Start a {m} minute timer.",
              "Timer for {m} minutes please.", "Can you set a {m}-minute timer for {label}?",
              "Set a timer for {m} minutes for the {label}."]
TIMER_HELD_OUT = ["I need a timer for {m} minutes."]
TIMER_LABELS = ["pasta", "tea", "laundry", "eggs", "bread", "workout", "nap", "pizza"]


def timer_request(rng, decl, template=None, novel=0.0):
    m = pick(rng, [1, 2, 3, 5, 8, 10, 12, 15, 20, 25, 30, 45, 60, 90])
    label = pick(rng, TIMER_LABELS)
    if novel and rng.random() < novel:
        m, label = rng.randint(1, 120), pick(rng, TIMER_LABELS + EXTRA_TIMER_LABELS)
    template = template or pick(rng, TIMER_ASKS)
    args = {"minutes": m}
    if "{label}" in template:
        args["label"] = label
    return template.format(m=m, label=label), args


def timer_execute(rng, args):
    return json.dumps({"status": "started", "minutes": args["minutes"]}), dict(args)


def timer_answer(rng, facts):
    label = (" for the %s" % facts["label"]) if facts.get("label") else ""
    return pick(rng, ["Your {m}-minute timer{label} is running.",
                      "Okay, I started a timer for {m} minutes{label}."]).format(m=facts["minutes"], label=label)


FAMILIES = {
    "weather": (declare_weather, weather_request, weather_execute, weather_answer),
    "calculator": (declare_calculator, calc_request, calc_execute, calc_answer),
    "units": (declare_units, units_request, units_execute, units_answer),
    "calendar": (declare_calendar, calendar_request, calendar_execute, calendar_answer),
    "time": (declare_time, time_request, time_execute, time_answer),
    "timer": (declare_timer, timer_request, timer_execute, timer_answer),
}
FAMILY_WEIGHTS = {"weather": 3, "calculator": 2, "units": 2, "calendar": 2, "time": 1, "timer": 1}

HELD_OUT = {"weather": WEATHER_HELD_OUT, "calculator": CALC_HELD_OUT, "units": UNIT_HELD_OUT,
            "calendar_add": CAL_ADD_HELD_OUT, "calendar_list": CAL_LIST_HELD_OUT,
            "time": TIME_HELD_OUT, "timer": TIMER_HELD_OUT}


def family_of(decl):
    return "calendar" if decl.family.startswith("calendar") else decl.family
