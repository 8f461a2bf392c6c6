"""Regenerate worker/data/corpus.txt: a small self-written English corpus for byte-level training.

No download is possible (or wanted) on the machines meshplan tests on, so the text is composed here
from hand-written sentence templates and word lists about workshops, weather, rivers, machines and
small towns. It is deterministic (seeded), about 300 KB, plain ASCII, and has the statistics a
byte-level model can learn quickly (frequent words, punctuation, capitals after full stops), which
is all the training tests need: a loss that falls on real-looking text.

Run `python tools/make_corpus.py` to rewrite the file; the committed copy is what training reads.
"""

from __future__ import annotations

import random
from pathlib import Path

TARGET_BYTES = 300_000

PEOPLE = [
    "the miller",
    "the old clockmaker",
    "a young engineer",
    "the ferryman",
    "my grandmother",
    "the teacher",
    "the baker",
    "a tired traveller",
    "the mayor",
    "the lighthouse keeper",
    "her brother",
    "the shepherd",
    "a quiet student",
    "the blacksmith",
    "the gardener",
    "the captain",
    "our neighbour",
    "the doctor",
]
PLACES = [
    "the river",
    "the harbour",
    "the workshop",
    "the market square",
    "the hill above the town",
    "the mill",
    "the station",
    "the library",
    "the orchard",
    "the bridge",
    "the narrow lane",
    "the lighthouse",
    "the valley",
    "the kitchen",
    "the forge",
    "the school",
    "the forest road",
    "the old church",
]
THINGS = [
    "a brass lamp",
    "the heavy gears",
    "a basket of apples",
    "the long ladder",
    "a letter",
    "the map",
    "a loaf of bread",
    "the broken wheel",
    "a small engine",
    "the copper kettle",
    "a bundle of wood",
    "the leather book",
    "a box of nails",
    "the clock",
    "a wooden boat",
    "the silver key",
    "a warm coat",
]
VERBS_PAST = [
    "carried",
    "repaired",
    "found",
    "painted",
    "measured",
    "opened",
    "cleaned",
    "sold",
    "built",
    "wrapped",
    "counted",
    "lifted",
    "examined",
    "polished",
    "borrowed",
    "returned",
    "tested",
]
ADJ = [
    "cold",
    "bright",
    "quiet",
    "grey",
    "windy",
    "long",
    "patient",
    "careful",
    "early",
    "late",
    "gentle",
    "busy",
    "dark",
    "golden",
    "steady",
    "narrow",
    "wide",
    "green",
    "heavy",
    "small",
]
TIMES = [
    "In the morning",
    "At noon",
    "Late in the evening",
    "Before sunrise",
    "On the first day of spring",
    "After the storm",
    "Every Sunday",
    "During the long winter",
    "When the bells rang",
    "Just after dinner",
    "Some years ago",
    "On a market day",
]
WEATHER = [
    "the wind came down from the hills",
    "rain fell softly on the roofs",
    "the sky was clear and pale",
    "a thick fog rose from the water",
    "snow covered the fields",
    "the sun warmed the stones",
    "clouds gathered over the sea",
    "the air smelled of smoke and bread",
]
REASONS = [
    "because the work had to be finished",
    "so that nobody would be cold",
    "although no one had asked",
    "while the others were asleep",
    "since the old one had failed",
    "before the ship could leave",
    "as the teacher had explained",
    "because the numbers did not add up",
]
SAYINGS = [
    "A machine is only as good as the care it gets.",
    "Measure twice, cut once.",
    "Slow work is often the fastest work.",
    "Every gear must turn at its own speed.",
    "The river does not hurry, yet it reaches the sea.",
    "Many hands make light work.",
    "A plan is a promise you make to the future.",
    "Rest is part of the journey.",
]


def sentence(rng: random.Random) -> str:
    kind = rng.randrange(8)
    p, q = rng.sample(PEOPLE, 2)
    place, thing, verb, adj = rng.choice(PLACES), rng.choice(THINGS), rng.choice(VERBS_PAST), rng.choice(ADJ)
    if kind == 0:
        s = f"{rng.choice(TIMES)}, {p} {verb} {thing} near {place}."
    elif kind == 1:
        s = f"{p} {verb} {thing} {rng.choice(REASONS)}."
    elif kind == 2:
        s = f"It was a {adj} day, and {rng.choice(WEATHER)}."
    elif kind == 3:
        s = f'"Have you seen {thing}?" asked {p}. "It was by {place} this morning," said {q}.'
    elif kind == 4:
        s = f"{p} walked to {place}, where {q} was waiting with {thing}."
    elif kind == 5:
        n = rng.randint(2, 12)
        s = f"There were {n} {rng.choice(['boats', 'lamps', 'wheels', 'letters', 'baskets', 'windows'])} at {place}, and {p} counted them twice."
    elif kind == 6:
        s = f"As {p} used to say: {rng.choice(SAYINGS)}"
    else:
        s = f"Nobody knew why {p} {verb} {thing}, but {q} thought it was {adj} and wise."
    return s[0].upper() + s[1:]


def paragraph(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(3, 7)))


def build(seed: int = 7, target_bytes: int = TARGET_BYTES) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size, chapter = 0, 1
    while size < target_bytes:
        if rng.random() < 0.08:
            parts.append(f"Chapter {chapter}")
            chapter += 1
        parts.append(paragraph(rng))
        size += len(parts[-1]) + 2
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "worker" / "data" / "corpus.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(build())
    print(f"wrote {out} ({out.stat().st_size} bytes)")
